"""Trace replay end to end against a local fake SGLang server (loopback only): absolute-clock dispatch, request
bodies, streaming timings, failures, output files, plot and cache hit rate."""

from __future__ import annotations

import asyncio
import csv
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from sgl_sidp.bench.client import make_payload, make_session, stream_request
from sgl_sidp.bench.traces import PromptBuilder, TraceRequest, file_sha256
from sgl_sidp.replay import main, parse_args, run_replay

REPO = Path(__file__).resolve().parents[1]
TOLERANCE_S = 0.05

# The fake server picks its behaviour from the prompt length.
SLOW_LEN = 777  # holds the first token back for SLOW_S
SLOW_S = 1.0
HTTP_500_LEN = 666  # answers HTTP 500
DISCONNECT_LEN = 555  # drops the connection after two chunks
ERROR_CHUNK_LEN = 444  # streams SGLang's error chunk, then [DONE]


class FakeSGLangServer:
    """SGLang's streaming ``/generate`` and ``/v1/completions`` (SSE ``data: {...}`` chunks, then ``data: [DONE]``) and
    ``/health`` on 127.0.0.1 in a background thread. Records every request's arrival time (perf_counter) and JSON
    body. Tokens come ``tokens_per_chunk`` at a time, every ``token_interval_s``; ``cached_tokens`` is the longest
    common prefix with any earlier prompt, like a radix cache that never evicts."""

    def __init__(self, token_interval_s: float = 0.005, tokens_per_chunk: int = 1, first_token_s: float = 0.0):
        self.token_interval_s, self.tokens_per_chunk, self.first_token_s = (
            token_interval_s,
            tokens_per_chunk,
            first_token_s,
        )
        self.arrivals: list[tuple[float, dict]] = []
        self.in_flight = self.max_in_flight = 0
        self._prompts: list[list[int]] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> "FakeSGLangServer":
        self._thread.start()
        assert self._ready.wait(10), "fake server did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        async def run():
            self._stop = asyncio.Event()
            app = web.Application(client_max_size=64 * 1024**2)
            app.router.add_post("/generate", self._generate)
            app.router.add_post("/v1/completions", self._completions)
            app.router.add_post("/flush_cache", self._flush)
            app.router.add_get("/health", self._health)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(run())

    def _cached(self, ids: list[int]) -> int:
        best = 0
        for p in self._prompts:
            n = min(len(p), len(ids))
            k = next((i for i in range(n) if p[i] != ids[i]), n)
            best = max(best, k)
        self._prompts.append(ids)
        return best

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _flush(self, request: web.Request) -> web.Response:
        self._prompts.clear()
        return web.Response(text="ok")

    async def _stream(self, request, ids, n_out, chunk_of) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if len(ids) == HTTP_500_LEN:
                return web.Response(status=500, text="injected failure")
            cached = self._cached(ids)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await asyncio.sleep(self.first_token_s + (SLOW_S if len(ids) == SLOW_LEN else 0.0))
            if len(ids) == ERROR_CHUNK_LEN:
                await resp.write(b'data: {"error": {"message": "injected error", "code": 400}}\n\n')
                await resp.write(b"data: [DONE]\n\n")
                return resp
            done, chunks = 0, 0
            while done < n_out:
                if chunks:
                    await asyncio.sleep(self.token_interval_s)
                done = min(n_out, done + self.tokens_per_chunk)
                chunks += 1
                await resp.write(b"data: " + json.dumps(chunk_of(done, len(ids), cached)).encode() + b"\n\n")
                if len(ids) == DISCONNECT_LEN and chunks == 2:
                    request.transport.close()
                    return resp
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            self.in_flight -= 1

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.arrivals.append((time.perf_counter(), body))
        n_out = body["sampling_params"]["max_new_tokens"]

        def chunk(done, n_prompt, cached):
            return {
                "text": "x" * done,
                "output_ids": list(range(done)),
                "meta_info": {
                    "id": "r",
                    "prompt_tokens": n_prompt,
                    "completion_tokens": done,
                    "cached_tokens": cached,
                    "finish_reason": {"type": "length", "length": done} if done == n_out else None,
                },
            }

        return await self._stream(request, body["input_ids"], n_out, chunk)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.arrivals.append((time.perf_counter(), body))
        n_out = body["max_tokens"]

        def chunk(done, n_prompt, cached):
            usage = {"prompt_tokens": n_prompt, "completion_tokens": done, "total_tokens": n_prompt + done}
            if done == n_out:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            return {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "y"}], "usage": usage}

        return await self._stream(request, body["prompt"], n_out, chunk)


def write_shift_trace(path: Path, rows: list[tuple[int, int, int]]) -> Path:
    """(timestamp ms, input_length, output_length) rows as a Shift-artifact JSONL."""
    path.write_text(
        "".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o}) + "\n" for t, i, o in rows)
    )
    return path


# Arrivals (ms), prompt lengths, output lengths. The second request is slow; later ones must still go out on time.
SCHEDULE = [
    (0, 120, 4),
    (100, SLOW_LEN, 3),
    (200, 130, 5),
    (200, 140, 5),
    (350, 150, 2),
    (500, 160, 1),
    (700, 170, 6),
    (900, 180, 4),
]


def test_replay_dispatches_on_absolute_clock_and_writes_outputs(tmp_path, capsys):
    trace = write_shift_trace(tmp_path / "shift_15min.jsonl", SCHEDULE)
    out_dir = tmp_path / "out"
    with FakeSGLangServer() as server:
        code = main(
            [
                "--trace",
                str(trace),
                "--base-url",
                server.base_url,
                "--out-dir",
                str(out_dir),
                "--disable-tqdm",
                "--token-id-range",
                "100",
                "200",
                "--tag",
                "unit",
                "--slo-ttft-ms",
                "500",
            ]
        )
    assert code == 0

    # Requests reached the server at their target offsets, the slow one notwithstanding.
    assert len(server.arrivals) == len(SCHEDULE)
    t_first = server.arrivals[0][0]
    for (t_ms, _, _), (arrived, _) in zip(SCHEDULE, server.arrivals):
        assert arrived - t_first == pytest.approx(t_ms / 1000, abs=TOLERANCE_S)

    # Request bodies: token ids of the right length and range, forced output length, streaming, greedy.
    for (_, n_in, n_out), (_, body) in zip(SCHEDULE, server.arrivals):
        ids = np.asarray(body["input_ids"])
        assert len(ids) == n_in and ids.min() >= 100 and ids.max() < 200
        assert body["sampling_params"] == {"temperature": 0.0, "max_new_tokens": n_out, "ignore_eos": True}
        assert body["stream"] is True

    summary = json.loads((out_dir / "summary.json").read_text())
    assert (summary["completed"], summary["failed"]) == (len(SCHEDULE), 0)
    assert summary["total_output_tokens"] == sum(o for _, _, o in SCHEDULE)
    assert summary["trace"]["name"] == trace.name and summary["trace"]["sha256"] == file_sha256(trace)
    assert summary["trace"]["format"] == "shift"
    assert summary["argv"][:2] == ["--trace", str(trace)]
    assert summary["window"]["requests_sent"] == len(SCHEDULE)
    assert summary["good_completed"] == len(SCHEDULE) - 1  # the slow request misses the 500 ms TTFT objective
    assert summary["dispatch_lag"]["max_dispatch_lag_ms"] < TOLERANCE_S * 1000
    assert summary["cache_report"]["cache_hit_rate"] == 0.0  # random prompts share (almost) nothing

    rows = [json.loads(line) for line in (out_dir / "requests.jsonl").read_text().splitlines()]
    assert [r["target_send_s"] for r in rows] == pytest.approx([t / 1000 for t, _, _ in SCHEDULE])
    assert all(abs(r["dispatch_lag_ms"]) < TOLERANCE_S * 1000 for r in rows)
    assert [r["output_len_received"] for r in rows] == [o for _, _, o in SCHEDULE]
    slow = rows[1]
    assert slow["ttft_ms"] > SLOW_S * 1000 and slow["e2e_ms"] > SLOW_S * 1000
    assert all(len(r["itl_ms"]) == r["output_len_received"] - 1 for r in rows)
    assert rows[5]["tpot_ms"] is None  # one output token: no TPOT
    with (out_dir / "requests.csv").open() as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == len(SCHEDULE) and "itl_ms" not in csv_rows[0] and "ttft_ms" in csv_rows[0]
    assert (out_dir / "latency_vs_arrival.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    report = capsys.readouterr().out
    assert "=========== Serving Benchmark Result ============" in report
    for label in (
        "Successful requests:",
        "Request goodput (req/s):",
        "Mean TTFT (ms):",
        "P99 TPOT (ms):",
        "Max ITL (ms):",
        "Mean E2E Latency (ms):",
        "Cache hit rate:",
        "Max dispatch lag (ms):",
    ):
        assert label in report


def test_failed_requests_are_counted_not_fatal(tmp_path, capsys):
    schedule = [(0, 100, 3), (50, HTTP_500_LEN, 3), (100, DISCONNECT_LEN, 8), (150, ERROR_CHUNK_LEN, 3), (200, 101, 3)]
    trace = write_shift_trace(tmp_path / "t.jsonl", schedule)
    with FakeSGLangServer() as server:
        summary = run_replay(
            parse_args(
                [
                    "--trace",
                    str(trace),
                    "--base-url",
                    server.base_url,
                    "--out-dir",
                    str(tmp_path / "o"),
                    "--disable-tqdm",
                ]
            )
        )
    assert (summary["completed"], summary["failed"]) == (2, 3)
    rows = [json.loads(line) for line in (tmp_path / "o" / "requests.jsonl").read_text().splitlines()]
    errors = [r["error"] for r in rows]
    assert [r["success"] for r in rows] == [True, False, False, False, True]
    assert "HTTP 500" in errors[1] and "injected failure" in errors[1]
    assert errors[2] and errors[3] == "server error: injected error"
    assert summary["stopped"] is None and summary["first_failure"] == {"id": 1, "error": errors[1]}
    # The first failure is printed when it happens (the server still answers /health) and again at the end.
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("sgl-sidp replay: warning: request 1 failed: HTTP 500")
    assert err[0].endswith("(the server is up: the replay goes on; failures are counted)")
    assert err[-1] == f"sgl-sidp replay: warning: 3 of 5 requests failed; first failure: request 1: {errors[1]}"


def test_unreachable_server_stops_before_sending(tmp_path, capsys):
    trace = write_shift_trace(tmp_path / "t.jsonl", [(0, 10, 2), (10, 10, 2)])
    with FakeSGLangServer() as server:
        url = server.base_url  # the port is free again once the server stops
    code = main(["--trace", str(trace), "--base-url", url, "--out-dir", str(tmp_path / "o"), "--disable-tqdm"])
    assert code == 2
    err = capsys.readouterr().err
    assert err == f"sgl-sidp replay: error: no server at {url}: Connection refused\n"
    assert not (tmp_path / "o").exists()


def test_mooncake_replay_cache_hit_rate_and_gap_compression(tmp_path):
    B = 512
    rows = [
        {"timestamp": 0, "input_length": 3 * B, "output_length": 2, "hash_ids": [0, 1, 2]},
        {"timestamp": 100, "input_length": 2 * B + 7, "output_length": 2, "hash_ids": [0, 1, 3]},
        {"timestamp": 60_000, "input_length": B + 100, "output_length": 2, "hash_ids": [0, 4]},  # after a 60 s gap
        {"timestamp": 60_100, "input_length": 300, "output_length": 2, "hash_ids": [5]},
    ]
    trace = tmp_path / "conversation_trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with FakeSGLangServer() as server:
        t = time.perf_counter()
        summary = run_replay(
            parse_args(
                [
                    "--trace",
                    str(trace),
                    "--base-url",
                    server.base_url,
                    "--out-dir",
                    str(tmp_path / "o"),
                    "--disable-tqdm",
                    "--compress-gaps-s",
                    "0.2",
                    "--seed",
                    "3",
                    "--flush-cache",
                ]
            )
        )
        elapsed = time.perf_counter() - t
    assert summary["trace"]["format"] == "mooncake"
    assert elapsed < 5  # the 60 s idle gap was compressed to 0.2 s
    t0 = server.arrivals[0][0]
    assert [a - t0 for a, _ in server.arrivals] == pytest.approx([0, 0.1, 0.3, 0.4], abs=TOLERANCE_S)
    # The server saw exactly the rebuilt prompts; they share the hash_ids' blocks: 2 blocks, then 1 block.
    builder = PromptBuilder(seed=3)
    for r, (_, body) in zip(rows, server.arrivals):
        req = TraceRequest(0, 0.0, r["input_length"], r["output_length"], tuple(r["hash_ids"]))
        assert body["input_ids"] == builder.build(req).tolist()
    cache = summary["cache_report"]
    assert cache["total_cached_tokens"] == 2 * B + B
    assert cache["cache_hit_rate"] == pytest.approx(3 * B / sum(r["input_length"] for r in rows))


def test_openai_backend_and_max_concurrency(tmp_path):
    schedule = [(0, 50, 3), (0, 60, 3), (0, 70, 3), (10, 80, 3)]
    trace = write_shift_trace(tmp_path / "t.jsonl", schedule)
    with FakeSGLangServer(token_interval_s=0.02) as server:
        summary = run_replay(
            parse_args(
                [
                    "--trace",
                    str(trace),
                    "--base-url",
                    server.base_url,
                    "--backend",
                    "openai",
                    "--model",
                    "m",
                    "--max-concurrency",
                    "1",
                    "--out-dir",
                    str(tmp_path / "o"),
                    "--disable-tqdm",
                ]
            )
        )
    assert (summary["completed"], summary["total_output_tokens"]) == (4, 12)
    assert server.max_in_flight == 1
    assert summary["dispatch_lag"]["max_dispatch_lag_ms"] > 50  # queued behind the cap: shows as lag
    for (_, n_in, n_out), (_, body) in zip(schedule, server.arrivals):
        assert len(body["prompt"]) == n_in and body["max_tokens"] == n_out
        assert body["ignore_eos"] is True and body["stream"] is True and body["model"] == "m"
    assert summary["cache_report"]["requests_reporting"] == 4


def test_stream_timing_follows_bench_serving():
    """TTFT to the first token chunk; a chunk of k tokens after a gap g adds k ITLs of g / k; E2E to [DONE]."""

    async def one(base_url: str):
        async with make_session() as session:
            payload = make_payload("sglang", np.arange(10, 20), 6)
            return await stream_request(session, "sglang", base_url + "/generate", payload, prompt_len=10)

    with FakeSGLangServer(first_token_s=0.15, token_interval_s=0.1, tokens_per_chunk=2) as server:
        out = asyncio.run(one(server.base_url))
    assert out.success and out.output_len == 6 and out.prompt_len == 10 and out.cached_tokens == 0
    assert out.ttft == pytest.approx(0.15, abs=0.04)
    assert out.itl == pytest.approx([0.05] * 4, abs=0.02)  # chunks of 2 tokens 100 ms apart (first chunk: 2 tokens)
    assert out.latency == pytest.approx(0.35, abs=0.06)


def test_client_drops_idle_connections_before_sglang_does():
    """A trace gap as long as SGLang's keep-alive (uvicorn closes idle connections after SGLANG_TIMEOUT_KEEP_ALIVE)
    must not send the next request on a connection the server is closing (ServerDisconnectedError)."""
    from sglang.srt.environ import envs

    from sgl_sidp.bench.client import KEEPALIVE_TIMEOUT_S

    async def keepalive():
        async with make_session() as session:
            return session.connector._keepalive_timeout

    assert asyncio.run(keepalive()) == KEEPALIVE_TIMEOUT_S < envs.SGLANG_TIMEOUT_KEEP_ALIVE.get()


def test_cli_help_runs_as_module():
    res = subprocess.run(
        [sys.executable, "-m", "sgl_sidp.replay", "--help"], capture_output=True, text=True, cwd=REPO, check=True
    )
    for flag in ("--trace-format", "--compress-gaps-s", "--max-context-len", "--slo-tpot-ms", "--token-id-range"):
        assert flag in res.stdout


def test_plots_are_written_as_small_palette_pngs(tmp_path):
    """`report.save_png`: the committed plots are palette PNGs of at most `PNG_COLORS` colours (a device call carries
    the whole tree), the picture kept."""
    from PIL import Image

    from sgl_sidp.bench import report

    rows = [{"success": True, "target_send_s": i * 0.1, "ttft_ms": 50.0 + i, "tpot_ms": 8.0 + i % 3, "e2e_ms": 300.0 + i}
            for i in range(200)]
    path = report.plot_requests(tmp_path / "p.png", rows, "t")
    im = Image.open(path)
    assert im.mode == "P" and len(im.getcolors()) <= report.PNG_COLORS and im.size == (1200, 960)
