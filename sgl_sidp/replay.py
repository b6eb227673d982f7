"""Replay a production request-arrival trace against an SGLang server and report like ``sglang.bench_serving``.

Example::

    python -m sgl_sidp.replay --trace bench_traces/data/AzureLLMInferenceTrace_code.csv \\
        --start-s 600 --duration-s 900 --base-url http://127.0.0.1:30000 --slo-ttft-ms 2000 --slo-tpot-ms 100

Every request's target send time is fixed up front (replay start + its offset) and the dispatcher sleeps until each
target on that absolute clock, so a slow server or a burst never shifts later arrivals; the difference between the
actual and the target send time (dispatch lag) is recorded per request. Outputs go to ``--out-dir``: per-request
``requests.jsonl``/``requests.csv``, ``summary.json``, and a TTFT/TPOT/E2E-vs-arrival plot.

Failures: the server must answer ``GET /health`` before anything is sent, else the replay stops at once (exit status
2). A failed request is counted and the replay goes on while the server still answers ``GET /health`` (asked after
each failure, one check at a time); once it does not, the server is gone: the replay stops sending, cancels the
requests in flight, writes what it collected and exits with status 1. It also exits 1 when no request succeeded.
The first failure's cause is printed on the console in every case.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import resource
import shlex
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import aiohttp
from tqdm import tqdm

from sgl_sidp.bench.client import (
    BACKENDS,
    DEFAULT_REQUEST_TIMEOUT_S,
    ENDPOINTS,
    RequestOutput,
    make_payload,
    make_session,
    stream_request,
)
from sgl_sidp.bench.metrics import SLO, compute_metrics, dispatch_lag_stats, request_tpot
from sgl_sidp.bench.report import PLOT_PNG, format_report, plot_requests, write_request_files, write_summary
from sgl_sidp.bench.traces import (
    CONTEXT_OVERFLOW_POLICIES,
    DEFAULT_TOKEN_ID_RANGE,
    TRACE_FORMATS,
    PlannedRequest,
    PromptBuilder,
    detect_format,
    file_sha256,
    load_trace,
    plan_replay,
)


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser. Each option's help text states its default where it has one."""
    p = argparse.ArgumentParser(
        prog="python -m sgl_sidp.replay",
        description="Replay a request-arrival trace (Azure CSV, Mooncake or Shift JSONL) against an SGLang server.",
        epilog="Exit status: 0 when the replay ran to the end and at least one request succeeded; 1 when none did "
        "or the server went away during the replay (what was collected is written); 2 on bad input or when no server "
        "answers before the start.",
    )
    t = p.add_argument_group("trace")
    t.add_argument("--trace", required=True, type=Path, help="the trace: Azure CSV, Mooncake or Shift JSONL")
    t.add_argument(
        "--trace-format",
        choices=TRACE_FORMATS,
        help="trace format (default: detected from the file's name and first line)",
    )
    t.add_argument(
        "--start-s",
        type=float,
        default=0.0,
        help="window start, trace seconds from the first row (default: %(default)s)",
    )
    t.add_argument(
        "--duration-s", type=float, default=None, help="window length in trace seconds (default: to the end)"
    )
    t.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiplies inter-arrival times, >1 = slower (default: %(default)s)",
    )
    t.add_argument(
        "--compress-gaps-s",
        type=float,
        default=None,
        help="shorten every gap between consecutive arrivals longer than this (trace seconds) to it, before scaling "
        "(default: gaps kept)",
    )
    t.add_argument(
        "--max-requests", type=int, default=None, help="send at most this many requests of the window (default: all)"
    )
    t.add_argument(
        "--max-context-len",
        type=int,
        default=None,
        help="limit on input + output tokens per request (default: no limit)",
    )
    t.add_argument(
        "--context-overflow",
        choices=CONTEXT_OVERFLOW_POLICIES,
        default="skip",
        help="requests over --max-context-len: skip them, or truncate their prompt from the left "
        "(which removes a Mooncake request's shared prefix) (default: %(default)s)",
    )
    t.add_argument(
        "--token-id-range",
        nargs=2,
        type=int,
        metavar=("LO", "HI"),
        default=list(DEFAULT_TOKEN_ID_RANGE),
        help="prompt token ids are drawn from [LO, HI) (default: %d %d)" % DEFAULT_TOKEN_ID_RANGE,
    )
    t.add_argument("--seed", type=int, default=0, help="seed of the rebuilt prompts (default: %(default)s)")
    s = p.add_argument_group("server")
    s.add_argument("--base-url", default="http://127.0.0.1:30000", help="the server's address (default: %(default)s)")
    s.add_argument(
        "--backend",
        choices=BACKENDS,
        default="sglang",
        help="sglang: native streaming /generate with input_ids; openai: /v1/completions with a token-id prompt "
        "(default: %(default)s)",
    )
    s.add_argument("--model", default=None, help="model name for --backend openai (default: first of /v1/models)")
    s.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: %(default)s, greedy)")
    s.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight (default: no cap)")
    s.add_argument(
        "--request-timeout-s",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        help="time limit of one request in seconds (default: %(default)s = 6 h, as bench_serving)",
    )
    s.add_argument("--flush-cache", action="store_true", help="POST /flush_cache before the replay")
    m = p.add_argument_group("metrics and output")
    m.add_argument("--slo-ttft-ms", type=float, default=None, help="TTFT objective for goodput (default: none)")
    m.add_argument("--slo-tpot-ms", type=float, default=None, help="TPOT objective for goodput (default: none)")
    m.add_argument("--slo-e2e-ms", type=float, default=None, help="E2E latency objective for goodput (default: none)")
    m.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="output folder (default: replay_results/<trace>[-<tag>]-<time>)",
    )
    m.add_argument(
        "--tag", default=None, help="label stored in the summary and the default output folder (default: none)"
    )
    m.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse CLI arguments (``sys.argv[1:]`` when ``argv`` is None); the list is kept as ``args.argv``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return args


PROG = "sgl-sidp replay"
# SGLang's /health generates one token when the server is idle and gives up after 20 s (SGLANG_HEALTH_CHECK_TIMEOUT).
HEALTH_TIMEOUT_S = 30.0
CANCELLED = "cancelled: the replay stopped"


class ReplayError(Exception):
    """The replay cannot run: bad input (no trace file, an unusable trace or option) or no server answering."""


@dataclass
class ReplayRun:
    """What :func:`replay` collected.

    Attributes:
        outputs: one per request sent, in the order of the items; fewer than the items when the replay stopped.
        t0: perf_counter of the replay start (s).
        duration: t0 to the last completion, or to the stop (s).
        stopped: why the replay stopped before sending everything (the server is gone), else None.
    """

    outputs: list[RequestOutput]
    t0: float
    duration: float
    stopped: str | None = None


def _exception_text(e: BaseException) -> str:
    if isinstance(e, aiohttp.ClientConnectorError):  # "Connection refused" rather than aiohttp's long sentence
        err = e.os_error
        return os.strerror(err.errno) if isinstance(err.errno, int) and err.errno > 0 else err.strerror or str(e)
    if isinstance(e, TimeoutError):
        return f"no answer in {HEALTH_TIMEOUT_S:g} s"
    return str(e) or type(e).__name__


async def server_problem(session: aiohttp.ClientSession, base_url: str, backend: str = "sglang") -> str | None:
    """Why the server at ``base_url`` cannot take requests, or None when it can.

    The server is up when ``GET /health`` answers 200 (SGLang answers 503 while it starts or shuts down); with
    ``backend="openai"`` a server without ``/health`` (404) is up when ``GET /v1/models`` answers 200.

    Returns:
        ``"no server at URL: CAUSE"`` when nothing answers, ``"the server at URL is not ready: GET /health answered
        HTTP 503 ..."`` when it answers otherwise, None when it is up.
    """
    timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
    try:
        for path in ("/health", "/v1/models") if backend == "openai" else ("/health",):
            async with session.get(base_url + path, timeout=timeout) as r:
                if r.status == 200:
                    return None
                if r.status != 404:
                    break
    except (aiohttp.ClientError, OSError) as e:  # TimeoutError is an OSError
        return f"no server at {base_url}: {_exception_text(e)}"
    return f"the server at {base_url} is not ready: GET {path} answered HTTP {r.status} {r.reason}"


async def _check_server(base_url: str, backend: str) -> None:
    async with make_session() as session:
        if problem := await server_problem(session, base_url, backend):
            raise ReplayError(problem)


async def _model_name(session, base_url: str) -> str:
    try:
        async with session.get(base_url + "/v1/models") as r:
            return (await r.json())["data"][0]["id"]
    except Exception:  # noqa: BLE001 - any OpenAI-style server accepts a name; SGLang ignores it
        return "default"


async def _flush_cache(session, base_url: str) -> None:
    try:
        async with session.post(base_url + "/flush_cache") as r:
            if r.status != 200:
                print(f"warning: POST /flush_cache answered {r.status}: {await r.text()}", file=sys.stderr)
    except aiohttp.ClientError as e:
        print(f"warning: POST /flush_cache failed: {e!r}", file=sys.stderr)


def _raise_open_files_limit(target: int = 65535) -> None:
    # One socket per request in flight; bench_serving raises the soft limit the same way (set_ulimit).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < target:
        new = target if hard == resource.RLIM_INFINITY else min(target, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, new), hard))


async def replay(items: Sequence[PlannedRequest], args: argparse.Namespace, builder: PromptBuilder) -> ReplayRun:
    """Send ``items`` at their target times and wait for all of them, or stop once the server is gone.

    Each request's payload is built before sleeping until its target (t0 + ``offset_s``, perf_counter clock), so
    prompt building overlaps the wait, and each request is a task of its own, so a slow response never holds up
    the next dispatch. The clock starts (t0) once the first payload is ready. With ``--max-concurrency`` a request
    waits for a slot after its target; that wait shows as dispatch lag.

    After a failed request the server is checked (:func:`server_problem`, one check at a time). If it does not
    answer, nothing more is sent and the requests in flight are cancelled (their error is ``CANCELLED``). The first
    failure of a server that still answers is printed on stderr, once.

    Raises:
        ValueError: no items.
    """
    if not items:
        raise ValueError("nothing to replay")
    base_url = args.base_url.rstrip("/")
    url = base_url + ENDPOINTS[args.backend]
    slots = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else contextlib.nullcontext()
    pbar = tqdm(total=len(items), desc="requests", unit="req", disable=args.disable_tqdm)
    gone = asyncio.Event()
    stopped: str | None = None
    check: asyncio.Task | None = None
    warned = False

    # The checks get a session of their own: the replay's may have all its connections (--max-concurrency) in use.
    async with make_session(args.max_concurrency) as session, make_session() as check_session:
        model = args.model or (await _model_name(session, base_url) if args.backend == "openai" else "default")
        if args.flush_cache:
            await _flush_cache(session, base_url)

        async def check_server(item: PlannedRequest, error: str) -> None:
            nonlocal stopped, warned
            if problem := await server_problem(check_session, base_url, args.backend):
                stopped = problem
                gone.set()
            elif not warned:
                warned = True
                tqdm.write(
                    f"{PROG}: warning: request {item.request.index} failed: {error} (the server is up: the replay "
                    "goes on; failures are counted)",
                    file=sys.stderr,
                )

        async def send(item: PlannedRequest, payload: bytes) -> RequestOutput:
            nonlocal check
            sent = time.perf_counter()
            try:
                async with slots:
                    out = await stream_request(
                        session, args.backend, url, payload, item.prompt_len, args.request_timeout_s
                    )
            except asyncio.CancelledError:  # only replay() cancels these tasks, when the server is gone
                return RequestOutput(start_time=sent, prompt_len=item.prompt_len, error=CANCELLED)
            pbar.update(1)
            if not out.success and not gone.is_set() and (check is None or check.done()):
                check = asyncio.create_task(check_server(item, out.error))
            return out

        tasks = []
        t0 = None
        for item in items:
            ids = builder.build(item.request)
            ids = ids[len(ids) - item.prompt_len :]
            payload = make_payload(
                args.backend, ids, item.request.output_len, temperature=args.temperature, model=model
            )
            t0 = t0 or time.perf_counter()
            delay = t0 + item.offset_s - time.perf_counter()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(gone.wait(), delay)
            if gone.is_set():
                break
            tasks.append(asyncio.create_task(send(item, payload)))
            await asyncio.sleep(0)  # let the new task start its request now
        waiter = asyncio.create_task(gone.wait())
        await asyncio.wait([asyncio.gather(*tasks), waiter], return_when=asyncio.FIRST_COMPLETED)
        helpers = [waiter] + ([check] if check else [])
        for task in tasks + helpers:
            task.cancel()
        outputs = list(await asyncio.gather(*tasks))
        await asyncio.gather(*helpers, return_exceptions=True)
        duration = time.perf_counter() - t0
    pbar.close()
    return ReplayRun(outputs, t0, duration, stopped)


def _request_row(item: PlannedRequest, out: RequestOutput, t0: float) -> dict:
    req, ok = item.request, out.success
    tpot = request_tpot(out)
    actual = out.start_time - t0
    return {
        "id": req.index,
        "arrival_s": round(req.arrival_s, 6),
        "target_send_s": round(item.offset_s, 6),
        "actual_send_s": round(actual, 6),
        "dispatch_lag_ms": round((actual - item.offset_s) * 1000, 3),
        "input_len": item.prompt_len,
        "output_len_requested": req.output_len,
        "output_len_received": out.output_len,
        "cached_tokens": out.cached_tokens,
        "ttft_ms": round(out.ttft * 1000, 3) if ok else None,
        "tpot_ms": round(tpot * 1000, 3) if tpot is not None else None,
        "e2e_ms": round(out.latency * 1000, 3) if ok else None,
        "success": ok,
        "error": out.error,
        "dp_rank": out.dp_rank,
        "itl_ms": [round(x * 1000, 1) for x in out.itl],  # 0.1 ms: decode steps take 5 ms and more
    }


def _input_error(e: Exception) -> str:
    if isinstance(e, OSError) and e.filename is not None:
        return f"trace {e.filename}: {e.strerror}"
    return str(e)


def failure_message(summary: dict) -> str | None:
    """The console line about a run's failures (see :func:`run_replay`'s summary), None when every request
    succeeded: why it stopped, or that no request succeeded, or how many failed; with the first failure's cause."""
    w, first = summary["window"], summary["first_failure"]
    cause = f"; first failure: request {first['id']}: {first['error']}" if first else ""
    if summary["stopped"]:
        finished = w["requests_sent"] - w["requests_cancelled"]
        return (
            f"{PROG}: error: the replay stopped: {summary['stopped']}; {w['requests_sent']} of "
            f"{w['requests_planned']} requests sent, {finished} finished ({summary['completed']} succeeded), "
            f"{w['requests_cancelled']} cancelled{cause}"
        )
    if summary["completed"] == 0:
        return f"{PROG}: error: no request succeeded ({summary['failed']} failed){cause}"
    if summary["failed"]:
        return f"{PROG}: warning: {summary['failed']} of {w['requests_sent']} requests failed{cause}"
    return None


def run_replay(args: argparse.Namespace) -> dict:
    """Run one replay as configured by ``args`` (from :func:`parse_args`): check the trace file, check the server,
    load and plan the trace, replay it, write the output files and the plot, print the report and, on failures,
    :func:`failure_message` on stderr.

    Returns:
        The summary (also written to ``summary.json``): bench_serving's metric keys at the top level, plus
        ``failed``, ``request_goodput``, ``cache_report``, ``dispatch_lag``, ``trace`` (name, path, sha256,
        format, rows), ``window`` (with ``requests_planned``, ``requests_sent`` and ``requests_cancelled``),
        ``stopped`` (why the replay stopped early, else None), ``first_failure`` (``{"id", "error"}`` of the first
        failed request, else None), ``slo``, ``argv`` (the arguments as given), ``command``, ``args`` and ``out_dir``.

    Raises:
        ReplayError: no trace file, an unusable trace or option (nothing to send, bad time scale, ...), or no
            server answering ``GET /health``; nothing was sent or written.
    """
    try:
        fmt = args.trace_format or detect_format(args.trace)
    except (OSError, ValueError) as e:
        raise ReplayError(_input_error(e)) from e
    if not args.base_url.startswith(("http://", "https://")):
        raise ReplayError(f"--base-url {args.base_url}: expected http://HOST:PORT")
    asyncio.run(_check_server(args.base_url.rstrip("/"), args.backend))
    try:
        trace = load_trace(args.trace, fmt)
        plan = plan_replay(
            trace,
            start_s=args.start_s,
            duration_s=args.duration_s,
            max_requests=args.max_requests,
            time_scale=args.time_scale,
            compress_gaps_s=args.compress_gaps_s,
            max_context_len=args.max_context_len,
            context_overflow=args.context_overflow,
        )
        if not plan.items:
            raise ValueError(
                f"nothing to replay: {plan.in_window} requests in the window, {plan.skipped_context} skipped"
            )
        builder = PromptBuilder(args.seed, tuple(args.token_id_range))
    except (OSError, ValueError) as e:
        raise ReplayError(_input_error(e)) from e
    _raise_open_files_limit()
    started_at = datetime.now(timezone.utc)

    run = asyncio.run(replay(plan.items, args, builder))
    outputs, t0, duration = run.outputs, run.t0, run.duration
    failures = ({"id": i.request.index, "error": o.error} for i, o in zip(plan.items, outputs) if not o.success)
    first_failure = next((f for f in failures if f["error"] != CANCELLED), None)

    slo = SLO(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms)
    rows = [_request_row(item, out, t0) for item, out in zip(plan.items, outputs)]
    out_dir = args.out_dir or Path("replay_results") / "-".join(
        filter(None, [args.trace.stem, args.tag, started_at.strftime("%Y%m%d-%H%M%S")])
    )
    arrivals = [item.request.arrival_s for item in plan.items]
    argv = getattr(args, "argv", sys.argv[1:])
    summary = {
        "tag": args.tag,
        "backend": args.backend,
        "base_url": args.base_url,
        "max_concurrency": args.max_concurrency,
        "started_at": started_at.isoformat(),
        "duration": duration,
        **compute_metrics(outputs, duration, slo),
        "stopped": run.stopped,
        "first_failure": first_failure,
        "dispatch_lag": dispatch_lag_stats([r["dispatch_lag_ms"] / 1000 for r in rows]),
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms},
        "trace": {
            "name": args.trace.name,
            "path": str(args.trace.resolve()),
            "sha256": file_sha256(args.trace),
            "format": fmt,
            "rows": len(trace),
        },
        "window": {
            "start_s": args.start_s,
            "duration_s": args.duration_s,
            "end_s": args.start_s + args.duration_s if args.duration_s is not None else max(r.arrival_s for r in trace),
            "max_requests": args.max_requests,
            "time_scale": args.time_scale,
            "compress_gaps_s": args.compress_gaps_s,
            "max_context_len": args.max_context_len,
            "context_overflow": args.context_overflow,
            "requests_in_window": plan.in_window,
            "requests_planned": len(plan.items),
            "requests_sent": len(outputs),
            "requests_cancelled": sum(o.error == CANCELLED for o in outputs),
            "skipped_context": plan.skipped_context,
            "truncated_context": plan.truncated_context,
            "first_arrival_s": min(arrivals),
            "last_arrival_s": max(arrivals),
            "replay_span_s": plan.items[-1].offset_s,
        },
        "short_outputs": sum(o.success and o.output_len < i.request.output_len for i, o in zip(plan.items, outputs)),
        "argv": argv,
        "command": shlex.join([sys.executable, "-m", "sgl_sidp.replay", *argv]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "argv"},
        "python": platform.python_version(),
        "out_dir": str(out_dir),
    }
    write_request_files(out_dir, rows)
    write_summary(out_dir, summary)
    w = summary["window"]
    title = f"{args.trace.name} [{w['start_s']:g} s, {w['end_s']:g} s) x{args.time_scale:g} {args.tag or ''}"
    plot_requests(out_dir / PLOT_PNG, rows, title.strip())
    print(format_report(summary))
    print(f"Results: {out_dir}", flush=True)
    if message := failure_message(summary):
        print(message, file=sys.stderr)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (``python -m sgl_sidp.replay``, ``sgl-sidp-replay``). Returns the exit status: 0 when at
    least one request succeeded and the replay ran to the end; 1 when none succeeded or the server went away during
    the replay; 2 on bad input or no server at the start (one line on stderr, nothing written)."""
    args = parse_args(argv)
    try:
        summary = run_replay(args)
    except ReplayError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return 0 if summary["completed"] > 0 and not summary["stopped"] else 1


if __name__ == "__main__":
    sys.exit(main())
