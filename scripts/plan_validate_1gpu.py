"""Predicted next to measured for one GPU: the planner's vanilla TP1 prediction against a committed
`scripts/shift_compare.py` measurement of vanilla SGLang TP1 (TTFT of single prompts, a burst, low traffic).

The prediction reads only the model's config.json and a calibration of its forwards (bundled or cached), never the
measurement it is compared with. Prints a markdown table with the error of every number (predicted / measured - 1).

usage: python scripts/plan_validate_1gpu.py MEASURED.json --model-path DIR [--gpu H200]
  MEASURED.json: a `shift_compare.py` result of config `tp` (e.g. benchmarks/results/shift/prefill_graphs_1gpu/tp.json)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sgl_sidp.plan.__main__ import plan


def shape_of(run: dict) -> tuple[int, int, int]:
    """(requests, prompt tokens, output tokens) of a burst or low-traffic run of `shift_compare.py`, from its counts."""
    n, secs = run["requests"], run["seconds"]
    out = round(run["output_tok_s"] * secs / n)
    return n, round((run["total_tok_s"] * secs - run["output_tok_s"] * secs) / n), out


def rows(measured: dict, model_path: str, gpu: str) -> list[tuple[str, str, float, float]]:
    """(what, unit, predicted, measured) for every measured number the planner predicts."""
    out = []
    for tokens, ms in sorted(measured["ttft_ms"].items(), key=lambda kv: int(kv[0])):
        pred = plan(model_path, 1, gpu, f"latency:{tokens}:1")["configurations"][0]
        out.append((f"TTFT of one {tokens}-token prompt", "ms", pred["ttft_ms_p50"], ms))
    for name in ("burst", "low_traffic"):
        run = measured.get(name)
        if not run:
            continue
        n, inp, outp = shape_of(run)
        pred = plan(model_path, 1, gpu, f"offline:{n}:{inp}:{outp}")["configurations"][0]
        what = f"{name.replace('_', ' ')} of {n} x ({inp} in, {outp} out)"
        out += [(f"{what}: total throughput", "tok/s", pred["total_tok_s"], run["total_tok_s"]),
                (f"{what}: TTFT p50", "ms", pred["ttft_ms_p50"], run["median_ttft_ms"]),
                (f"{what}: TPOT p50", "ms", pred["tpot_ms_p50"], run["median_tpot_ms"])]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("measured", type=Path, help="a shift_compare.py result of vanilla TP1 (config 'tp')")
    ap.add_argument("--model-path", required=True, help="the model's config folder the measurement served")
    ap.add_argument("--gpu", default="H200", help="GPU kind the measurement ran on (default: H200)")
    a = ap.parse_args(argv)
    measured = json.loads(a.measured.read_text())
    print("| number | unit | predicted | measured | error |\n|---|---|---:|---:|---:|")
    for what, unit, pred, meas in rows(measured, a.model_path, a.gpu):
        print(f"| {what} | {unit} | {pred:,.1f} | {meas:,.1f} | {pred / meas - 1:+.1%} |")


if __name__ == "__main__":
    main()
