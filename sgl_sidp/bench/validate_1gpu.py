"""The planner's one-GPU predictions next to measurements of vanilla SGLang TP1 on the same GPU kind.

Two steps, on two machines:

    # on the GPU host (vanilla `sglang.launch_server`, dummy weights, CUDA graphs): measure
    python -m sgl_sidp.bench.validate_1gpu measure --model-path .gpu/models/Qwen3-8B --out-dir OUT \\
        --trace azure_ok='--trace .gpu/traces/AzureLLMInferenceTrace_code.csv --start-s 600 --duration-s 120'
    # anywhere (no GPU): predict exactly what was measured, from the model's config.json and a calibration only
    python -m sgl_sidp.bench.validate_1gpu report OUT --model-path ../shared/models/Qwen3-8B

`measure` writes OUT/measured.json: KV tokens (SGLang's `max_total_num_tokens`), the TTFT of single prompts (median
of 3, distinct prompts, no radix hit), decode steps (B requests of C prompt tokens started at once; the median gap
between consecutive output tokens once every request is decoding; a mixed batch's rows of several prompt lengths in
turn; with `--decode-after-traces` again after the replays, on the KV pool they filled and freed; where the server
logs every decode step, `--decode-log-interval 1`, also the step by its log, which the stream's lag does not reach),
stream probes (`--stream-probes`: the tokens a second the output stream delivered while a burst's requests all
decoded, against the planner's stream rate), an offline burst (N x (IN, OUT) at once), and trace replays
(`python -m sgl_sidp.replay`, its per-request files kept under OUT/<name>/). `report` rebuilds each measured
workload's requests (the same trace window, scale and context limit as the replay) and prints a markdown table:
predicted (with the measured server's SGLang flags), measured, error (predicted / measured - 1). No measured number
enters a prediction. A shard served alone (its sizes by `--json-model-override-args` in --extra-args) is reported
against a folder holding its config.json: the planner then prices it by that shard's calibration.
`scripts/plan_validate_1gpu.py` calls this module.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
import time
from pathlib import Path
from typing import Callable

import numpy as np

from sgl_sidp.plan.what_if import NO_WHAT_IF, WhatIf, add_what_if_args, what_if_from_args

DECODE_BATCHES = (1, 8, 32, 64, 128, 256)


def _triple(spec: str) -> tuple[int, int, int]:
    n, p, o = (int(x) for x in spec.split("+"))
    return n, p, o


def measure(a) -> None:
    """Serve vanilla SGLang TP1 on GPU 0 and measure every item into `a.out_dir/measured.json`."""
    from sgl_sidp.bench.batches import prompts, replay, run_batch
    from sgl_sidp.bench.metrics import compute_metrics
    from sgl_sidp.bench.server import ServerProcess
    from sgl_sidp.peer.topology import gpu_name

    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    flags = ["--model-path", a.model_path, "--load-format", "dummy", "--attention-backend", "triton",
             "--sampling-backend", "pytorch", "--tokenizer-path", "sgl_sidp/default_model", *shlex.split(a.extra_args)]
    srv = ServerProcess("sglang.launch_server", flags, port=a.port, log_path=out / "server.log", gpus="0")
    result = {"command": None, "gpu": gpu_name(0), "kv_tokens": [], "ttft_ms": {}, "decode": [], "stream": [],
              "burst": None, "traces": {}}
    result["command"] = " ".join(srv.command)
    save = lambda: (out / "measured.json").write_text(json.dumps(result, indent=1))  # noqa: E731
    with srv:
        deadline = time.time() + 300
        while "The server is fired up" not in srv.log_text() and time.time() < deadline:
            time.sleep(1)
        result["kv_tokens"] = [int(x) for x in re.findall(r"max_total_num_tokens=(\d+)", srv.log_text())]
        run_batch(srv.base_url, [(prompts(1, 64, 0)[0], 4, None)])  # warm-up
        for length in a.ttft:
            vals = [o.ttft * 1e3 for ids in prompts(3, length, length)
                    for o in run_batch(srv.base_url, [(ids, 1, None)])[0] if o.success]
            result["ttft_ms"][str(length)] = float(np.median(vals)) if vals else None
        save()
        decode_points(srv.base_url, a, result["decode"], save, log_text=srv.log_text)
        for i, spec in enumerate(a.stream_probes):
            result["stream"].append(stream_point(srv, *_triple(spec), seed=3_000_000 + 1_000 * i))
            save()
        if a.burst:
            n, p, o = _triple(a.burst)
            outs, seconds = run_batch(srv.base_url, [(ids, o, None) for ids in prompts(n, p, 7)])
            m = compute_metrics(outs, seconds)
            result["burst"] = {"requests": n, "prompt": p, "output": o, "seconds": seconds,
                               **{k: m[k] for k in ("total_throughput", "output_throughput", "median_ttft_ms",
                                                    "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "failed")}}
            save()
        for job in a.trace:
            name, args = job.split("=", 1)
            summary = replay(name, args, srv.base_url, out / name, "tp1")
            result["traces"][name] = {"args": args, **{k: summary.get(k) for k in (
                "completed", "failed", "duration", "total_throughput", "output_throughput", "median_ttft_ms",
                "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")}}
            save()
        if a.decode_after_traces:
            decode_points(srv.base_url, a, result["decode"], save, after="the replays", log_text=srv.log_text)
    save()
    print(json.dumps(result, indent=1))


def decode_lengths(spec: str) -> list[int]:
    """The prompt lengths of one `--decode-contexts` item: "11264" -> [11264]; "2048/20480" -> [2048, 20480], a
    mixed batch whose rows take the lengths in turn.

    Raises:
        ValueError: a length that is not a positive integer."""
    lengths = [int(x) for x in spec.split("/")]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"decode context {spec!r}: each prompt length at least 1")
    return lengths


#: SGLang 0.5.17's decode log line (`SchedulerMetricsReporter.report_decode_stats`): its running requests and the
#: tokens a second generated since the previous such line, which `--decode-log-interval 1` writes after every step
DECODE_LOG = re.compile(r"Decode batch, #running-req: (\d+),.*gen throughput \(token/s\): ([\d.]+)")


def server_step_ms(log: str, batch: int) -> float | None:
    """The median decode step (ms) of `batch` rows in a stretch of SGLang's log written with `--decode-log-interval 1`:
    rows / (tokens a second) of each line at 95-100 % of `batch` running requests (a request taken in first can
    finish alone before the rest decode: 511 of 512), over the second half of those lines (the first one's interval
    holds the prefills before it). None where the log has no such line (another interval)."""
    steps = [int(n) / float(rate) * 1e3 for n, rate in DECODE_LOG.findall(log)
             if 0.95 * batch <= int(n) <= batch and float(rate) > 0]
    return float(np.median(steps[len(steps) // 2:])) if steps else None


def decode_points(base_url: str, a, into: list, save, after: str | None = None,
                  log_text: Callable[[], str] | None = None) -> None:
    """Time a decode step at each (`a.decode_contexts` item, `a.decode_batches` batch): B requests of `a.decode_output`
    tokens sent at once, the prompts of a mixed item's lengths in turn; the step is the median gap between output
    tokens over the second half of each request's gaps (SGLang prefills every waiting prompt before it decodes, so
    by then all B decode together). With `log_text` (the server log so far) also the server's own step,
    `server_step_ms` of what the log gained during the point (None unless the server logs every decode step):
    the client's gaps are the output stream's, which can lag the steps and catch up (Qwen3-8B TP1 on one H200, 256
    rows: 10.6 ms between tokens at the client, 22.2 in the server's log). Appends one dict per point to `into` and
    calls `save()` after each. `after` names what ran before on this server (new prompts, so nothing hits the radix
    cache): the points then measure a KV pool that work filled and freed, against the same points on a fresh one."""
    from sgl_sidp.bench.batches import prompts, run_batch

    # one seed a prompt, none another prompt of this server had (the same seed at another length is the same prefix)
    seeds = itertools.count(1_000_000 if after is None else 2_000_000)
    for spec in a.decode_contexts:
        lengths = decode_lengths(spec)
        for b in a.decode_batches:
            ids = [prompts(1, lengths[i % len(lengths)], next(seeds))[0] for i in range(b)]
            start = len(log_text()) if log_text else 0
            outs, _ = run_batch(base_url, [(x, a.decode_output, None) for x in ids])
            gaps = [g for o in outs if o.success for g in o.itl[len(o.itl) // 2:]]
            mean = round(sum(len(x) for x in ids) / b)
            into.append({"batch": b, "prompt": mean, "output": a.decode_output,
                         "context_mean": mean + 3 * a.decode_output // 4,
                         **({"prompts": lengths} if len(lengths) > 1 else {}), **({"after": after} if after else {}),
                         "step_ms": float(np.median(gaps)) * 1e3 if gaps else None,
                         **({"server_step_ms": server_step_ms(log_text()[start:], b)} if log_text else {})})
            save()


def stream_point(srv, requests: int, prompt: int, output: int, seed: int) -> dict:
    """The tokens a second the server's output stream delivered to the client while all of `requests` requests of
    `prompt` random tokens and `output` output tokens, sent at once, decoded: `plan calibrate`'s stream probe
    (`calibrate.delivered_rate`; its `STREAM_PROBE` is 256 x (16, 128)) at other sizes, to see whether its rate holds
    for a burst's. Returns {"requests", "prompt", "output" (of the burst counted: a second one decodes more when the
    first never streamed long enough), "bursts", "window_s", "delivered_tokens_per_s"}, or with "error" instead of
    the last four where nothing was counted."""
    from sgl_sidp.plan.calibrate import delivered_rate

    point = {"requests": requests, "prompt": prompt, "output": output}
    got = delivered_rate(srv, requests, prompt, output, seed)
    if isinstance(got, str):
        return {**point, "error": got}
    return {**point, "output": got["probe"][2], "bursts": got["bursts"], "window_s": got["window_s"],
            "delivered_tokens_per_s": got["delivered_tokens_per_s"]}


def rows(measured: dict, model_path: str, gpu: str, trace_dir: Path | None = None,
         what_if: WhatIf = NO_WHAT_IF) -> list[tuple]:
    """(what, unit, predicted, measured) for every measured number (predicted with `what_if`'s numbers set by hand,
    and with the SGLang flags of the measured server's command: its decode graphs' size, its chunk, its memory
    fraction, `server_flags.ServerFlags`)."""
    from sgl_sidp.bench.traces import sim_requests
    from sgl_sidp.plan.planner import plan, plan_requests, stream_rate
    from sgl_sidp.plan.server_flags import ServerFlags

    server = ServerFlags.from_words(shlex.split(measured.get("command") or ""))
    out = []
    if measured.get("kv_tokens"):
        pred = plan(model_path, 1, gpu, "latency:16:1", what_if=what_if, server=server)["configurations"][0]
        out.append(("KV tokens (max_total_num_tokens)", "tokens", pred.kv_tokens_total, measured["kv_tokens"][0]))
    for tokens, ms in sorted(measured["ttft_ms"].items(), key=lambda kv: int(kv[0])):
        pred = plan(model_path, 1, gpu, f"latency:{tokens}:1", what_if=what_if, server=server)["configurations"][0]
        out.append((f"TTFT of one {int(tokens):,}-token prompt", "ms", pred.ttft_ms_p50, ms))
    for d in measured.get("decode", []):
        if d["step_ms"] is None:
            continue
        pred = plan(model_path, 1, gpu, "latency:16:1", decode_points=[(d["batch"], d["context_mean"])],
                    what_if=what_if, server=server)
        mix = f" (prompts {'/'.join(f'{x:,}' for x in d['prompts'])})" if d.get("prompts") else ""
        after = f", after {d['after']}" if d.get("after") else ""
        out.append((f"decode step, batch {d['batch']}, context {d['context_mean']:,}{mix}{after}", "ms",
                    pred["configurations"][0].decode_at[0], d["step_ms"]))
        if d.get("server_step_ms"):
            out.append(("the same step by the server's log", "ms", pred["configurations"][0].decode_at[0],
                        d["server_step_ms"]))
    for st in measured.get("stream", []):
        rate = stream_rate(model_path, gpu, st["output"])
        if st.get("delivered_tokens_per_s") and rate:
            out.append((f"stream of {st['requests']} x ({st['prompt']:,} in, {st['output']} out) while all decode "
                        "(the planner's stream rate)", "tok/s", rate, st["delivered_tokens_per_s"]))
    b = measured.get("burst")
    if b:
        pred = plan(model_path, 1, gpu, f"offline:{b['requests']}:{b['prompt']}:{b['output']}",
                    what_if=what_if, server=server)["configurations"][0]
        what = f"burst of {b['requests']} x ({b['prompt']:,} in, {b['output']} out)"
        out += [(f"{what}: total throughput", "tok/s", pred.total_tok_s, b["total_throughput"]),
                (f"{what}: TTFT p50", "ms", pred.ttft_ms_p50, b["median_ttft_ms"]),
                (f"{what}: TPOT p50", "ms", pred.tpot_ms_p50, b["median_tpot_ms"])]
    for name, t in measured.get("traces", {}).items():
        pred = plan_requests(model_path, 1, gpu, f"replay {t['args']}", sim_requests(t["args"], trace_dir),
                             what_if=what_if, server=server)
        pred = pred["configurations"][0]
        out += [(f"{name}: total throughput", "tok/s", pred.total_tok_s, t["total_throughput"]),
                (f"{name}: TTFT p50", "ms", pred.ttft_ms_p50, t["median_ttft_ms"]),
                (f"{name}: TPOT p50", "ms", pred.tpot_ms_p50, t["median_tpot_ms"]),
                (f"{name}: TTFT p99", "ms", pred.ttft_ms_p99, t["p99_ttft_ms"]),
                (f"{name}: TPOT p99", "ms", pred.tpot_ms_p99, t["p99_tpot_ms"])]
    return out


def report(a) -> None:
    """Print `rows` of `a.out_dir`'s measured.json as a markdown table (predicted, measured, error), under `a`'s
    what-if numbers if any."""
    measured = json.loads((Path(a.out_dir) / "measured.json").read_text())
    what_if = what_if_from_args(a)
    table = rows(measured, a.model_path, a.gpu, a.trace_dir, what_if)
    print("| number | unit | predicted | measured | error |\n|---|---|---:|---:|---:|")
    for what, unit, pred, meas in table:
        err = f"{pred / meas - 1:+.1%}" if meas else "-"
        print(f"| {what} | {unit} | {pred:,.1f} | {meas:,.1f} | {err} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.bench.validate_1gpu", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="on a GPU host: serve vanilla SGLang TP1 on GPU 0 and measure")
    m.add_argument("--model-path", required=True, help="the model's folder (config.json; weights are dummy)")
    m.add_argument("--out-dir", required=True, help="where measured.json, the server log and replay files go")
    m.add_argument("--port", type=int, default=26100, help="the server's port (default: 26100)")
    m.add_argument("--ttft", type=lambda s: [int(x) for x in s.split(",") if x], default=[16, 512, 2048, 4096, 8192],
                   help="prompt lengths whose single-request TTFT is measured (default: 16,512,2048,4096,8192)")
    m.add_argument("--decode-contexts", type=lambda s: [x for x in s.split(",") if x and decode_lengths(x)],
                   default=["256", "2048"], help="prompt lengths of the decode-step runs; A/B/... a mixed batch, its "
                   "rows' prompts A, B, ... tokens in turn (default: 256,2048)")
    m.add_argument("--decode-batches", type=lambda s: [int(x) for x in s.split(",") if x], default=list(DECODE_BATCHES),
                   help=f"batch sizes of the decode-step runs at each context (default: {','.join(map(str, DECODE_BATCHES))})")
    m.add_argument("--decode-output", type=int, default=64, help="output tokens of each decode-step request (default: 64)")
    m.add_argument("--stream-probes", type=lambda s: [x for x in s.split(",") if x and _triple(x)], default=[],
                   metavar="N+IN+OUT,...", help="stream probes: N requests of IN prompt and OUT output tokens at once, "
                   "the tokens a second delivered while all decode (plan calibrate's is 256+16+128; default: none)")
    m.add_argument("--burst", default="512+2048+256", metavar="N+IN+OUT",
                   help="offline burst: N requests of IN prompt and OUT output tokens at once (default: 512+2048+256)")
    m.add_argument("--trace", action="append", default=[], metavar="NAME=REPLAY_ARGS",
                   help="a trace replay: NAME and the arguments of python -m sgl_sidp.replay (repeatable)")
    m.add_argument("--decode-after-traces", action="store_true",
                   help="time the decode points again after the replays, on the KV pool they filled and freed")
    m.add_argument("--extra-args", default="", help="more server flags, one shell-quoted string")
    r = sub.add_parser("report", help="anywhere: predict what OUT_DIR measured and print the errors")
    r.add_argument("out_dir", help="a folder written by measure")
    r.add_argument("--model-path", required=True, help="the model's config folder the measurement served")
    r.add_argument("--gpu", default="H200", help="GPU kind the measurement ran on (default: H200)")
    r.add_argument("--trace-dir", type=Path, default=None,
                   help="read the replays' trace files from this folder (default: the paths the replays used)")
    add_what_if_args(r)
    a = ap.parse_args(argv)
    if a.cmd == "measure":
        measure(a)
        return
    from sgl_sidp.plan.planner import PlanError
    from sgl_sidp.plan.server_flags import ServerFlagsError

    try:
        report(a)
    except (PlanError, ServerFlagsError, FileNotFoundError) as e:  # bad input: one line, no traceback
        raise SystemExit(f"validate_1gpu report: {e}") from None


if __name__ == "__main__":
    main()
