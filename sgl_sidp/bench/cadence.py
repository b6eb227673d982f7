"""How long a busy server's prefill forwards take, from its log, next to the planner's simulation of the same replay.

While prompts queue, SGLang schedules one prefill chunk after another, and the log line of each ("Prefill batch",
`SchedulerMetricsReporter.report_prefill_stats`) gives its new tokens over the time since the line before as "input
throughput": so a chunk's tokens / that rate is the time between two chunks, a served forward's cadence with
everything between forwards in it. This tool takes the chunks that fill the prefill chunk (`--chunked-prefill-size`
tokens) and follow one that did with prompts still queued, per server and replay of a `bench.compare` run, and puts
the median next to the median of the full chunks the planner simulates for that replay (`planner.plan_requests`'
`on_prefill`), each server predicted as it ran (`compare_report.ran_as`). Of a server of several DP replicas, the
first replica's lines are read ("DP0]" or "DP0 TP0]"), against every simulated replica's chunks.

    python -m sgl_sidp.bench.cadence benchmarks/results/multi_gpu/q8_shift_stats_2gpu_h200/Qwen3-8B \\
        --model-path ../shared/models/Qwen3-8B --gpu H200 --trace-dir .gpu/traces

What it found: `shift.planner.SERVED_BASE_PREFILL` and `benchmarks/results/plan_multi_gpu/shift_served_prefill.md`.
"""

from __future__ import annotations

import argparse
import gzip
import re
import statistics
from pathlib import Path

#: the log prefix of the first rank of the first replica: "TP0]", or "DP0]" / "DP0 TP0]" on a server of DP replicas
FIRST_RANK = r"\d\d:\d\d:\d\d (?:TP0|DP0|DP0 TP0)\]"
#: one "Prefill batch" line of that rank: its new tokens, queued requests and "input throughput" (the line's new
#: tokens over the seconds since the line before)
PREFILL_LINE = re.compile(FIRST_RANK + r" Prefill batch, #new-seq: \d+, #new-token: (\d+),.*#queue-req: (\d+),"
                          r".*input throughput \(token/s\): ([\d.]+)")
#: a decode step's line of that rank: the chunks either side of it are not back to back
DECODE_LINE = re.compile(FIRST_RANK + r" Decode batch")
#: what the server logs (each DP replica once) as `bench.compare` flushes its radix cache before each replay
SEGMENT = "Cache flushed"


def full_chunk_gaps(log: str, chunk: int) -> list[list[float]]:
    """Per segment of a server's log (what follows a `SEGMENT`: a replay, in order; a segment without a prefill line of
    the first rank, between two replicas' flushes, is dropped), the time (ms) between two back-to-back prefill chunks
    of `chunk` new tokens each, the first with prompts still queued: the second's tokens / its "input throughput".
    Only the first rank of the first replica is read (`FIRST_RANK`); its decode lines between two chunks drop that
    pair."""
    out = []
    for segment in log.split(SEGMENT)[1:]:
        if not PREFILL_LINE.search(segment):
            continue
        gaps, last = [], None  # last: (new tokens, queued) of the line before, None after a decode line
        for line in segment.splitlines():
            if DECODE_LINE.search(line):
                last = None
                continue
            m = PREFILL_LINE.search(line)
            if not m:
                continue
            new, queued, rate = int(m[1]), int(m[2]), float(m[3])
            if last is not None and last == (chunk, True) and new == chunk and rate > 0:
                gaps.append(1000.0 * new / rate)
            last = (new, queued > 0)
        out.append(gaps)
    return out


def simulated_full_chunks(model_path: str, gpu: str, n_gpus: int, replay_args: str, names: list[str], server,
                          trace_dir: Path | None, chunk: int) -> dict[str, list[float]]:
    """{configuration: ms of every simulated prefill forward of `chunk` new tokens} for the requests `python -m
    sgl_sidp.replay REPLAY_ARGS` sends, `names` predicted with the SGLang flags `server` (`planner.plan_requests`'
    `on_prefill`). A configuration the planner simulated as another (the same steps, decisions and KV: one schedule)
    gets that one's forwards."""
    from sgl_sidp.bench.traces import sim_requests
    from sgl_sidp.plan.planner import plan_requests

    out: dict[str, list[float]] = {}

    def seen(name, parts, ms):
        if sum(t for t, _ in parts) == chunk:
            out.setdefault(name, []).append(ms)

    result = plan_requests(model_path, n_gpus, gpu, f"replay {replay_args}", sim_requests(replay_args, trace_dir),
                           names=names, server=server, on_prefill=seen)

    def schedule(r):  # what a shared schedule leaves alike
        return (r.technique, r.dp, r.tp, r.sp, repr(r.decisions), r.kv_tokens_total, r.total_tok_s, r.ttft_ms_p50)

    rows = [r for r in result["configurations"] if r.predicted]
    for r in rows:
        if r.name not in out:
            twin = next((o.name for o in rows if o.name in out and schedule(o) == schedule(r)), None)
            if twin is not None:
                out[r.name] = out[twin]
    return out


def rows(folder: Path, model_path: str, gpu: str, trace_dir: Path | None) -> list[tuple]:
    """(configuration as it ran, replay, measured median ms, chunks, simulated median ms, chunks) per server of the
    `bench.compare` results in `folder` (OUT/<model>) and replay it ran, for those with full chunks in both. Each
    replay is simulated once per group of servers on as many GPUs with the same SGLang flags
    (`compare_report.by_flags`), a mode that declined as what it started (`compare_report.predicted_as`)."""
    from sgl_sidp.bench.compare_report import by_flags, compare_results, predicted_as, ran_as, server_flags_of
    from sgl_sidp.bench.validate import replay_settings
    from sgl_sidp.plan.sim import ReplicaLimits

    results = {r["config"]: r for r in compare_results(folder) if r.get("config") != "auto"}
    settings = replay_settings(folder)
    # by server as it ran: {replay: gaps}, its SGLang flags, its GPU count, the planner's name to predict it with
    measured, flags, gpus, as_ = {}, {}, {}, {}
    for c, r in results.items():
        log = folder / "logs" / f"{c}.log.gz"
        replays = [k for k in r.get("traces") or [] if k in settings]  # in the order the server ran them
        if not log.is_file() or not replays:
            continue
        name = ran_as(r, folder)
        flags[name], gpus[name] = server_flags_of(r, folder), int(r.get("gpu_count") or 2)
        as_[name] = predicted_as(r, ran=name)
        chunk = flags[name].chunked_prefill_size or ReplicaLimits.chunked_prefill  # SGLang's on H100 and H200
        measured[name] = dict(zip(replays, full_chunk_gaps(gzip.open(log, "rt").read(), chunk)[-len(replays):]))
    simulated = {}  # (server, replay) -> its simulated full chunks
    for key, (args, _) in settings.items():
        ran = [name for name, got in measured.items() if key in got]
        for n in sorted({gpus[name] for name in ran}):
            for server, group in by_flags([name for name in ran if gpus[name] == n], flags).items():
                chunk = server.chunked_prefill_size or ReplicaLimits.chunked_prefill
                sim = simulated_full_chunks(model_path, gpu, n, args, list(dict.fromkeys(as_[x] for x in group)),
                                            server, trace_dir, chunk)
                simulated.update({(name, key): sim.get(as_[name], []) for name in group})
    return [(name, key, statistics.median(gaps), len(gaps), statistics.median(sim), len(sim))
            for name, got in measured.items() for key, gaps in got.items()
            if gaps and (sim := simulated[(name, key)])]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sgl_sidp.bench.cadence", description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path, help="one model's folder of bench.compare results (OUT/<model>), with logs/")
    p.add_argument("--model-path", required=True, help="the model's config folder the run served")
    p.add_argument("--gpu", default="H200", help="GPU kind the run used (default: %(default)s)")
    p.add_argument("--trace-dir", type=Path, help="where the replayed traces are (default: the paths compare was given)")
    a = p.parse_args(argv)
    print("| configuration | replay | measured between full chunks, median ms (chunks) | simulated (chunks) | "
          "simulated / measured |")
    print("|---|---|---:|---:|---:|")
    for name, key, meas, n_meas, sim, n_sim in rows(a.dir, a.model_path, a.gpu, a.trace_dir):
        print(f"| {name} | {key} | {meas:.1f} ({n_meas}) | {sim:.1f} ({n_sim}) | {sim / meas:.3f} |")


if __name__ == "__main__":
    main()
