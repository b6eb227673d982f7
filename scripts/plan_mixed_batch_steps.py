"""Served decode steps of a replay against the planner's step model: the batch's mean context, or its longest row.

    .venv/bin/python scripts/plan_mixed_batch_steps.py \\
        benchmarks/results/plan/validate_1gpu_h200_long_context_2026-11-24/mooncake_ok/requests.jsonl.gz \\
        --calibration sgl_sidp/calibration/bundled/h200_qwen3-8b_tp1.json --model-path ../shared/models/Qwen3-8B

Reads a replay's per-request token times (`python -m sgl_sidp.replay`'s requests.jsonl[.gz], with the itl_ms.jsonl[.gz]
beside it where the replay wrote one) of a one-GPU server. Every
0.5 s where at least two requests decode and their median gap between tokens is under 60 ms (no prefill in it), it
compares that gap with `Calibration.decode_step_ms` at the running batch's mean context, and with the larger of that
and the longest row's step plus what the other rows add (`sim.StepTimes.longest_row`). Prints the median and p10/p90
of both errors (model / measured - 1).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("requests", type=Path, help="the replay's requests.jsonl or requests.jsonl.gz")
    ap.add_argument("--calibration", type=Path, required=True, help="the served shard's calibration (a bundled file)")
    ap.add_argument("--model-path", required=True, help="the model's config folder (for its KV bytes per token)")
    a = ap.parse_args()
    from sgl_sidp.bench.compare import ITL_FILE
    from sgl_sidp.bench.report import read_jsonl
    from sgl_sidp.calibration.memory import ModelShapes
    from sgl_sidp.calibration.table import Calibration
    from sgl_sidp.model_info import read_hf_config

    cal = Calibration.load(a.calibration)
    kv = ModelShapes.of(read_hf_config(a.model_path)).kv_bytes_per_token(1)
    path = a.requests.with_suffix("") if a.requests.suffix == ".gz" else a.requests  # read_jsonl finds the .gz
    rows = read_jsonl(path)
    if rows is None:
        ap.error(f"{a.requests}: no such file")
    # bench.compare keeps the gaps between tokens apart (`compare.ITL_FILE`, git-ignored) where it ran the replay
    gaps = {d["id"]: d["itl_ms"] for d in read_jsonl(path.with_name(ITL_FILE.removesuffix(".gz"))) or ()}
    rows = [{**r, "itl_ms": gaps.get(r["id"], r.get("itl_ms"))} for r in rows]
    tokens = [(r, r["actual_send_s"] + r["ttft_ms"] / 1e3 + np.cumsum([0.0] + r["itl_ms"]) / 1e3)
              for r in rows if r.get("success") and r.get("itl_ms")]
    mean_err, longest_err = [], []
    for t in np.arange(0.5, max(ts[-1] for _, ts in tokens), 0.5):
        run = [(r, ts) for r, ts in tokens if ts[0] <= t < ts[-1]]
        if len(run) < 2:
            continue
        ctx = [r["input_len"] + int(np.searchsorted(ts, t)) for r, ts in run]
        gaps = [(ts[i] - ts[i - 1]) * 1e3 for _, ts in run for i in [int(np.searchsorted(ts, t))] if 0 < i < len(ts)]
        gap = statistics.median(gaps)
        if gap > 60:  # a prefill ran in it
            continue
        b = len(run)
        at_mean = cal.decode_step_ms(b, sum(ctx) / b, kv)
        at_longest = max(at_mean, cal.decode_step_ms(1, max(ctx), kv) + cal.decode_step_ms(b, 0, kv)
                         - cal.decode_step_ms(1, 0, kv))
        mean_err.append(at_mean / gap - 1)
        longest_err.append(at_longest / gap - 1)
    for name, errs in (("mean context", mean_err), ("longest row", longest_err)):
        p10, p90 = np.percentile(errs, [10, 90]) * 100
        print(f"{name:13s}: {len(errs)} moments, median {statistics.median(errs) * 100:+.1f} %, "
              f"p10 {p10:+.1f} %, p90 {p90:+.1f} %")


if __name__ == "__main__":
    main()
