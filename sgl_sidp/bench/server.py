"""Start, wait for and stop an SGLang server process (ours or vanilla) for tests and benchmarks.

The server runs in its own session (process group), so stopping it ends SGLang's
scheduler and detokenizer children too. Output goes to a log file that callers
grep (plugin lines, metrics lines) and keep as evidence.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional, Sequence

#: Environment every GPU run needs on the lent H200 hosts (NVLink multicast stays off).
GPU_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def group_running(pgid: int) -> bool:
    """Whether a process of process group `pgid` still runs: any of its threads not exited (a process that exited
    and waits to be reaped holds no memory and does not count). Reads /proc (Linux); elsewhere, whether the group has
    any member at all.

    Every thread counts, not the process's state alone: when a multi-threaded process is killed, its main thread can
    show as exited (Z) while another thread is still tearing the process down, and a CUDA process frees its GPU
    memory only when its last thread is gone. Taking the main thread's state for the process's opened `plan
    calibrate`'s gate while the killed server still held its GPU memory; the next server then read a nearly full GPU
    as its `pre_model_load_memory`, sized its KV pool with almost no slack, and ran out of memory.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) != pgid:  # after "(comm)": state, ppid, pgrp
                continue
            if any(_thread_state(task) not in "ZX" for task in (stat.parent / "task").iterdir()):
                return True
        except (OSError, IndexError, ValueError):
            continue
    return False


def _thread_state(task: Path) -> str:
    """One letter: the state of the thread whose /proc/PID/task/TID folder is `task` ("X" when it is gone)."""
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def visible_gpus(gpus: str) -> str:
    """CUDA_VISIBLE_DEVICES for a child that should see `gpus` ("0,1"), numbered as this process sees its GPUs, as
    CUDA numbers them: this process's CUDA_VISIBLE_DEVICES entries (ids or UUIDs, `peer.topology.visible_gpu_ids`) at
    those positions, or `gpus` itself where it is unset or empty. So a pytest-xdist worker of `tests/gpu` given GPUs
    2 and 3 (`scripts/gpu_tests.sh` with SHARDS=2) starts a test's "0,1" server on them.

    Raises:
        ValueError: an index that is not a number or beyond this process's visible GPUs.
    """
    from sgl_sidp.peer.topology import visible_gpu_ids

    ids = visible_gpu_ids()
    if not ids:
        return gpus
    try:
        return ",".join(ids[int(i)] for i in gpus.split(","))
    except (IndexError, ValueError):
        raise ValueError(f"GPUs {gpus!r}: this process sees {len(ids)} ({','.join(ids)})") from None


class ServerProcess:
    """An SGLang HTTP server started as a child process.

    Args:
        launcher: Python module run with `-m`: "sgl_sidp.launch_server" (ours) or
            "sglang.launch_server" (vanilla).
        args: server flags (without --host/--port, which this class sets).
        port: HTTP port on 127.0.0.1.
        log_path: file that receives the server's stdout and stderr.
        gpus: the GPUs it sees (e.g. "0" or "0,1"), numbered as this process sees its GPUs (`visible_gpus`: under
            CUDA_VISIBLE_DEVICES=2,3, "0" is GPU 2); None keeps the caller's.
        env: extra environment variables.
        kill_on_stop: `stop()` SIGKILLs the process group at once and returns when none of its processes runs any
            more (their GPU memory is then free), instead of letting SGLang shut down (which takes 6 s or more): for
            servers whose state nothing needs (`plan calibrate`'s).

    Use as a context manager, or call `start()`, `wait_ready()`, `stop()`.
    """

    def __init__(
        self,
        launcher: str,
        args: Sequence[str],
        port: int,
        log_path: Path,
        gpus: Optional[str] = None,
        env: Optional[dict] = None,
        kill_on_stop: bool = False,
    ):
        self.kill_on_stop = kill_on_stop
        self.launcher, self.args, self.port = launcher, list(args), port
        self.log_path = Path(log_path)
        self.base_url = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, **GPU_SAFE_ENV, **(env or {})}
        if gpus is not None:
            self.env["CUDA_VISIBLE_DEVICES"] = visible_gpus(gpus)
        self.proc: Optional[subprocess.Popen] = None

    @property
    def command(self) -> list[str]:
        """The exact command line (for reports)."""
        return [sys.executable, "-m", self.launcher, *self.args, "--host", "127.0.0.1", "--port", str(self.port)]

    def start(self) -> "ServerProcess":
        """Spawn the server in a new session, its output to `log_path`; returns at once."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        self.t_start = time.time()
        return self

    def wait_ready(self, timeout_s: float = 360.0) -> float:
        """Block until GET /health answers 200; returns the seconds it took.

        Raises:
            RuntimeError: the process exited, or `timeout_s` passed (the log's tail is included).
        """
        while time.time() - self.t_start < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return time.time() - self.t_start
            except Exception:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"server not healthy after {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_text(self) -> str:
        """The server log so far ("" before the server wrote anything)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 60) -> str:
        """The last `n` lines of the server log."""
        return "\n".join(self.log_text().splitlines()[-n:])

    def get(self, path: str, timeout: float = 30.0) -> str:
        """GET `path` from the server and return the body as text."""
        with urllib.request.urlopen(self.base_url + path, timeout=timeout) as r:
            return r.read().decode()

    def stop(self) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left after 15 s (`kill_on_stop`: SIGKILL at once,
        and wait up to 30 s until no process of the group runs)."""
        if self.proc is None:
            return
        if self.kill_on_stop:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            deadline = time.time() + 30
            while group_running(self.proc.pid) and time.time() < deadline:
                time.sleep(0.1)
            return
        if self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> "ServerProcess":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
