"""`python -m sgl_sidp.bench.prefix_probes REQUESTS --model-path M --gpu H200 [--gpus N --config NAME]`: the replay of
the prefix-probe trace (`bench.traces.prefix_probe_rows`) request by request, each (new tokens, cached tokens) beside
the planner's TTFT.

REQUESTS is the replay's `requests.jsonl` (or `.gz`): `bench.compare` keeps it under OUT/<model>/traces/<config>/,
`python -m sgl_sidp.bench.validate_1gpu measure` under OUT/<name>/. M is the config folder of what the server ran: the
model for TP1, or a shard's own config.json (its sizes on one GPU, as `--json-model-override-args` served them), which
the planner then prices by that shard's calibration (`model_info.model_signature` names the shard, not the model).
The prediction is `plan.planner.plan_requests` of the same trace on the configuration NAME of N GPUs (default: `tp1`
on one), no measured number entering it.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from sgl_sidp.bench.traces import PREFIX_PROBE_PAIRS


def probe_lines(measured: list[dict], model_path: str, gpu: str, trace: Path,
                pairs=PREFIX_PROBE_PAIRS, n_gpus: int = 1, config: str = "tp1") -> list[str]:
    """Markdown: one row per (new, cached) of `pairs` and the bases' fresh prompts, the median over the bases of the
    measured TTFT (ms) beside the simulated one (the first token's time from the request's arrival, request overhead
    included) and the error.

    Args:
        measured: the replay's request rows (`id`, `ttft_ms`, `cached_tokens`), in any order.
        model_path: config folder of what the server ran (module docstring).
        gpu: GPU kind the replay ran on (`plan.GPUS` key).
        trace: the prefix-probe trace that was replayed (`python -m sgl_sidp.bench.traces prefix-probes`).
        n_gpus, config: the planner's configuration the server ran (`plan.configs` name) and its GPUs.

    Raises:
        ValueError: the replay and the trace hold different numbers of requests, or `config` cannot run on `n_gpus`
            (`plan.planner.PlanError`).
    """
    from sgl_sidp.bench.traces import sim_requests
    from sgl_sidp.plan.planner import plan_requests

    args = f"--trace {trace.name}"
    reqs = sim_requests(args, trace.parent)
    if len(measured) != len(reqs):
        raise ValueError(f"{len(measured)} requests measured, {len(reqs)} in {trace}: not this trace's replay")
    row = plan_requests(model_path, n_gpus, gpu, f"replay {args}", reqs, keep_schedule=True, names=[config])
    planned = next(c for c in row["configurations"] if c.name == config)  # `names` adds it to what the planner ranks
    simulated = [(first - r.arrival_s) * 1e3 for (first, _), r in zip(planned.schedule, reqs)]
    measured = sorted(measured, key=lambda r: r["id"])
    kinds = ((max(p for _, p in pairs), 0), *pairs)  # each base's fresh prompt, then its probes
    bases = len(reqs) // len(kinds)
    out = ["| new tokens | cached (measured) | TTFT measured (ms, median) | predicted | error |",
           "|---:|---:|---:|---:|---:|"]
    for j, (new, cached) in enumerate(kinds):
        at = [b * len(kinds) + j for b in range(bases)]
        meas = statistics.median(measured[i]["ttft_ms"] for i in at)
        pred = statistics.median(simulated[i] for i in at)
        hit = ", ".join(f"{measured[i].get('cached_tokens', 0):,}" for i in at)
        out.append(f"| {new:,} | {cached:,} ({hit}) | {meas:,.0f} | {pred:,.0f} | {pred / meas - 1:+.1%} |")
    return out


def main(argv: list[str] | None = None) -> None:
    from sgl_sidp.bench.report import read_jsonl

    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.bench.prefix_probes", description=__doc__.split("\n\n")[0])
    ap.add_argument("requests", type=Path, help="the replay's requests.jsonl (or the .gz beside where it is)")
    ap.add_argument("--model-path", required=True, help="config folder of what the server ran (TP1 or a shard)")
    ap.add_argument("--gpu", default="H200", help="GPU kind the replay ran on (default: H200)")
    ap.add_argument("--trace", type=Path, default=Path(".gpu/traces/prefix_probes.jsonl"),
                    help="the trace replayed (default: %(default)s)")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs the server ran on (default: %(default)s)")
    ap.add_argument("--config", default="tp1", help="the planner's name of what the server ran (default: %(default)s)")
    a = ap.parse_args(argv)
    path = a.requests.with_suffix("") if a.requests.suffix == ".gz" else a.requests
    rows = read_jsonl(path)
    if rows is None:
        ap.error(f"{a.requests}: no such file")
    if not a.trace.is_file():
        ap.error(f"--trace {a.trace}: no such file (python -m sgl_sidp.bench.traces prefix-probes {a.trace} writes it)")
    print("\n".join(probe_lines(rows, a.model_path, a.gpu, a.trace, n_gpus=a.gpus, config=a.config)))


if __name__ == "__main__":
    main()
