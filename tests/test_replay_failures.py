"""The replay when things go wrong (loopback only): no server, a server that is not ready, a server killed or shutting
down during the replay, a server that fails every request, bad input, and the ``--help`` text."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time

from aiohttp import web

from sgl_sidp.replay import CANCELLED, build_parser, main
from tests.test_replay import HTTP_500_LEN, REPO, SLOW_LEN, SLOW_S, FakeSGLangServer, write_shift_trace

# A streaming SGLang /generate (one token per 20 ms) and a /health answering argv[1], in a process of its own so that
# a test can kill it. Prints its port, then one line per request received.
SERVER = r"""
import asyncio, json, sys
from aiohttp import web

async def health(request):
    return web.Response(status=int(sys.argv[1]))

async def generate(request):
    n = (await request.json())["sampling_params"]["max_new_tokens"]
    print("request", flush=True)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for done in range(1, n + 1):
        await asyncio.sleep(0.02)
        chunk = {"text": "x", "meta_info": {"completion_tokens": done}}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp

async def serve():
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()

asyncio.run(serve())
"""


def cli_args(trace, base_url: str, out_dir) -> list[str]:
    return ["--trace", str(trace), "--base-url", base_url, "--out-dir", str(out_dir)]


@contextlib.contextmanager
def server_process(health_status: int = 200, kill_after_requests: int | None = None):
    """Run SERVER; yields ``(base_url, killed)``: ``killed`` is set (holding the kill time in ``killed.at``) once
    the process was killed (SIGKILL) on receiving its ``kill_after_requests``-th request."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(health_status)], stdout=subprocess.PIPE, text=True)
    killed = threading.Event()

    def watch() -> None:
        seen = 0
        for _ in proc.stdout:
            seen += 1
            if seen == kill_after_requests:
                proc.kill()
                killed.at = time.perf_counter()
                killed.set()
                return

    try:
        port = int(proc.stdout.readline())
        threading.Thread(target=watch, daemon=True).start()
        yield f"http://127.0.0.1:{port}", killed
    finally:
        proc.kill()
        proc.wait(10)


def test_no_server_exits_at_once_with_one_line(tmp_path):
    trace = write_shift_trace(tmp_path / "t.jsonl", [(0, 10, 2), (10, 10, 2)])
    with server_process() as (url, _):
        pass  # the port is free again
    t = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "sgl_sidp.replay", *cli_args(trace, url, tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert time.perf_counter() - t < 5
    assert res.returncode == 2
    assert res.stderr == f"sgl-sidp replay: error: no server at {url}: Connection refused\n"
    assert res.stdout == "" and not (tmp_path / "o").exists()


def test_server_not_ready_exits_with_its_answer(tmp_path, capsys):
    trace = write_shift_trace(tmp_path / "t.jsonl", [(0, 10, 2)])
    with server_process(health_status=503) as (url, _):
        code = main([*cli_args(trace, url, tmp_path / "o"), "--disable-tqdm"])
    assert code == 2
    err = capsys.readouterr().err
    assert err == (
        f"sgl-sidp replay: error: the server at {url} is not ready: GET /health answered HTTP 503 Service Unavailable\n"
    )


def test_server_killed_mid_run_stops_the_replay_and_writes_what_it_got(tmp_path, capsys):
    n, kill_at = 100, 5
    # One request every 50 ms (5 s in all), 20 tokens each (0.4 s): several are in flight when the server dies.
    trace = write_shift_trace(tmp_path / "t.jsonl", [(50 * i, 16, 20) for i in range(n)])
    out_dir = tmp_path / "o"
    with server_process(kill_after_requests=kill_at) as (url, killed):
        code = main([*cli_args(trace, url, out_dir), "--disable-tqdm"])
        returned = time.perf_counter()
    assert killed.is_set() and code == 1
    summary = json.loads((out_dir / "summary.json").read_text())
    w = summary["window"]
    # Stopped promptly: a few requests after the kill, not the 5 s of the whole trace.
    assert summary["duration"] < 2 and kill_at <= w["requests_sent"] < kill_at + 10
    assert returned - killed.at < 5  # the plot and files included
    assert w["requests_planned"] == n
    # The probe after the first failure meets a dead port (refused) or, racing the kill, a dying socket (reset).
    cause = summary["stopped"].removeprefix(f"no server at {url}: ")
    assert cause in ("Connection refused", "Connection reset by peer"), summary["stopped"]
    assert summary["first_failure"]["id"] < w["requests_sent"]
    rows = [json.loads(line) for line in (out_dir / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == w["requests_sent"] and not rows[-1]["success"]
    assert summary["completed"] == sum(r["success"] for r in rows)

    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    first = summary["first_failure"]
    finished = w["requests_sent"] - w["requests_cancelled"]
    assert err[0] == (
        f"sgl-sidp replay: error: the replay stopped: no server at {url}: {cause}; {w['requests_sent']} "
        f"of {n} requests sent, {finished} finished ({summary['completed']} succeeded), {w['requests_cancelled']} "
        f"cancelled; first failure: request {first['id']}: {first['error']}"
    )


class ShuttingDownServer(FakeSGLangServer):
    """Answers /health with 503 (as SGLang does while it shuts down) once it has failed a request."""

    async def _health(self, request: web.Request) -> web.Response:
        failed = any(len(body["input_ids"]) == HTTP_500_LEN for _, body in self.arrivals)
        return web.Response(status=503 if failed else 200)


def test_requests_in_flight_are_cancelled_when_the_server_stops_answering(tmp_path, capsys):
    # The first request waits SLOW_S for its first token; the second fails, after which /health answers 503.
    schedule = [(0, SLOW_LEN, 3), (50, HTTP_500_LEN, 2)] + [(100 + 50 * i, 100, 2) for i in range(20)]
    trace = write_shift_trace(tmp_path / "t.jsonl", schedule)
    with ShuttingDownServer() as server:
        code = main([*cli_args(trace, server.base_url, tmp_path / "o"), "--disable-tqdm"])
    assert code == 1
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    w = summary["window"]
    assert (w["requests_planned"], w["requests_sent"], w["requests_cancelled"]) == (len(schedule), 2, 1)
    assert summary["duration"] < SLOW_S  # the slow request was not waited for
    rows = [json.loads(line) for line in (tmp_path / "o" / "requests.jsonl").read_text().splitlines()]
    assert [r["error"] for r in rows] == [CANCELLED, summary["first_failure"]["error"]]
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"sgl-sidp replay: error: the replay stopped: the server at {server.base_url} is not ready: GET /health "
        f"answered HTTP 503 Service Unavailable; 2 of {len(schedule)} requests sent, 1 finished (0 succeeded), "
        "1 cancelled; first failure: request 1: HTTP 500 Internal Server Error: injected failure"
    )


def test_no_request_succeeded_is_an_error_not_a_report_of_zeros(tmp_path, capsys):
    trace = write_shift_trace(tmp_path / "t.jsonl", [(20 * i, HTTP_500_LEN, 2) for i in range(3)])
    with FakeSGLangServer() as server:
        code = main([*cli_args(trace, server.base_url, tmp_path / "o"), "--disable-tqdm"])
    assert code == 1
    assert (tmp_path / "o" / "requests.jsonl").exists() and (tmp_path / "o" / "latency_vs_arrival.png").exists()
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        "sgl-sidp replay: error: no request succeeded (3 failed); "
        "first failure: request 0: HTTP 500 Internal Server Error: injected failure"
    )


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    garbled = tmp_path / "garbled.txt"
    garbled.write_text("not a trace\n")
    for trace, message in (
        (missing, f"trace {missing}: No such file or directory"),
        (garbled, f"{garbled}: not a CSV and first line is not JSON"),
    ):
        assert main(["--trace", str(trace), "--base-url", "http://127.0.0.1:9"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"sgl-sidp replay: error: {message}") and err.count("\n") == 1


def test_help_states_each_default_once_and_every_option_has_text():
    parser = build_parser()
    for action in parser._actions:
        assert action.help, action.option_strings
    text = subprocess.run(
        [sys.executable, "-m", "sgl_sidp.replay", "--help"], capture_output=True, text=True, cwd=REPO, check=True
    ).stdout
    assert "(default: None)" not in text and "default: False" not in text
    # One block per option: its line and the indented help lines under it.
    blocks = re.split(r"\n(?=  -)", text.split("options:\n", 1)[1])
    assert len(blocks) == len(parser._actions)
    for block in blocks:
        assert block.count("(default:") <= 1, block
    for group in ("trace:", "server:", "metrics and output:"):
        assert f"\n{group}\n" in text
