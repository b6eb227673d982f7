"""Building blocks of the side-by-side comparisons (`sgl_sidp.bench.compare`, `scripts/compare_replay.py`) and the
planner's serving probes (`sgl_sidp.plan.calibrate`): random prompts, a batch of requests sent at once, one trace
replay as a child process, a server's /metrics. No GPU code."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np


def free_port() -> int:
    """A TCP port of 127.0.0.1 free when asked (the OS's pick), for a process this one starts to listen on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    """`n` random token-id prompts (ids 3..4000: the bundled tokenizer's range) of `length` tokens."""
    rng = np.random.default_rng(seed)
    return rng.integers(3, 4000, size=(n, length)).tolist()


async def _send(base_url: str, bodies: list[tuple[list[int], int, int | None]]):
    from sgl_sidp.bench.client import ENDPOINTS, make_payload, make_session, stream_request

    url = base_url + ENDPOINTS["sglang"]
    async with make_session() as session:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*[
            stream_request(session, "sglang", url,
                           make_payload("sglang", ids, o, extra={"routed_dp_rank": r} if r is not None else None),
                           len(ids))
            for ids, o, r in bodies])
    return outs, time.perf_counter() - t0


def run_batch(base_url: str, bodies: list[tuple[list[int], int, int | None]]):
    """Send every (input ids, forced output tokens, DP rank or None) at once, streaming; returns
    (`RequestOutput`s in order, seconds from the first dispatch to the last completion)."""
    return asyncio.run(_send(base_url, bodies))


def run_batch_apart(base_url: str, bodies: list[tuple[list[int], int, int | None]]):
    """`run_batch` in a spawned process of its own: bursts sent to several servers at once (`compare --parallel`)
    then share no interpreter (each its own GIL and event loop, as each replay runs in a process of its own,
    `replay`). The process starts before the first request is sent, outside the seconds `run_batch` returns."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_batch, base_url, bodies).result()


def replay(name: str, replay_args: str, base_url: str, out_dir: Path, tag: str) -> dict:
    """One `python -m sgl_sidp.replay REPLAY_ARGS` against `base_url` as a child process (its own event loop and CPU),
    writing under `out_dir`; returns its summary.json.

    Raises:
        RuntimeError: the replay failed (its log is `out_dir/replay.log`).
    """
    cmd = [sys.executable, "-m", "sgl_sidp.replay", *shlex.split(replay_args), "--base-url", base_url,
           "--out-dir", str(out_dir), "--tag", tag, "--disable-tqdm"]
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "replay.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    summary_file = out_dir / "summary.json"
    if rc != 0 or not summary_file.exists():
        raise RuntimeError(f"replay {name}/{tag} failed (rc {rc}); see {out_dir / 'replay.log'}")
    return json.loads(summary_file.read_text())


def metrics_text(base_url: str) -> str:
    """The server's /metrics body (started with --enable-metrics)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        return r.read().decode()
