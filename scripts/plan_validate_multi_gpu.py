"""The planner's predictions for N GPUs next to a multi-GPU measurement of vanilla SGLang and the overlay, side by side.

    python scripts/plan_validate_multi_gpu.py DIR --model-path ../shared/models/Qwen3-8B [--gpu H200]
    python scripts/plan_validate_multi_gpu.py --forwards TP2.json [TP2.json ...] --gpus 2 --model-path MODEL

DIR holds `scripts/shift_compare.py` results (`tp.json`, `dp.json`, `dp_attn.json`, `shift.json`, each run on the same
N GPUs). For each configuration measured, the planner predicts the same numbers from the model's config.json and the
calibrations of its shards (one GPU each, never this measurement): KV tokens, the TTFT of single prompts and the
burst's throughput, TTFT and TPOT. Prints a markdown table with every error (predicted / measured - 1), then the
measured and predicted ranking of the configurations on the burst.

With `--forwards`: the forwards of TP-N servers (`--overlay-calibrate` cache entries of the whole model served at
`--tp N` on N GPUs, `scripts/gpu_calibrate_model.sh OUT MODEL --tp N`) next to the planner's `tpN` decode steps and
prefills (its TP-N shard's calibration on one GPU plus the modelled all-reduces).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sgl_sidp.plan.__main__ import plan
from sgl_sidp.plan.what_if import add_what_if_args, apply_what_if

#: shift_compare.py configuration -> the planner's configuration name, by GPU count
NAMES = {"tp": "tp{n}", "dp": "dp{n}", "dp_attn": "dp{n}_attn", "shift": "shift_sp{n}_tp1"}


def burst_shape(run: dict) -> tuple[int, int, int]:
    """(requests, prompt tokens, output tokens) of a shift_compare.py burst, from its counts."""
    n, secs = run["requests"], run["seconds"]
    out = round(run["output_tok_s"] * secs / n)
    return n, round((run["total_tok_s"] - run["output_tok_s"]) * secs / n), out


def rows(measured: dict[str, dict], model_path: str, gpu: str, n: int) -> list[tuple]:
    """(configuration, what, unit, predicted, measured) for every measured number the planner predicts."""
    out = []
    lat = {}
    burst = next((m["burst"] for m in measured.values() if m.get("burst")), None)
    shape = burst_shape(burst) if burst else None
    pred_burst = {r["name"]: r for r in plan(model_path, n, gpu, "offline:%d:%d:%d" % shape)["configurations"]} if shape else {}
    for cfg, m in measured.items():
        name = NAMES[cfg].format(n=n)
        if name not in pred_burst or "total_tok_s" not in pred_burst[name]:
            out.append((name, "not predicted", "", None, None))
            continue
        p = pred_burst[name]
        if m.get("kv_tokens"):
            # SGLang logs one max_total_num_tokens per DP rank (DP attention: one for all)
            per_gpu = p["kv_tokens_total"] / (n if cfg in ("dp", "dp_attn") else 1)
            out.append((name, "KV tokens of one rank's pool", "tokens", per_gpu, m["kv_tokens"][0]))
        for tokens, ms in sorted(m.get("ttft_ms", {}).items(), key=lambda kv: int(kv[0])):
            key = (tokens,)
            if key not in lat:
                lat[key] = {r["name"]: r for r in plan(model_path, n, gpu, f"latency:{tokens}:4")["configurations"]}
            out.append((name, f"TTFT of one {int(tokens):,}-token prompt", "ms", lat[key][name]["ttft_ms_p50"], ms))
        if m.get("burst"):
            b = m["burst"]
            what = "burst of %d x (%d in, %d out)" % shape
            out += [(name, f"{what}: total throughput", "tok/s", p["total_tok_s"], b["total_tok_s"]),
                    (name, f"{what}: TTFT p50", "ms", p["ttft_ms_p50"], b["median_ttft_ms"]),
                    (name, f"{what}: TPOT p50", "ms", p["tpot_ms_p50"], b["median_tpot_ms"])]
    return out


def forwards_table(files: list[Path], model_path: str, gpu: str, n: int) -> list[str]:
    """Markdown rows: the planner's `tp{n}` decode steps (contexts 256 and 2,048) and prefills of 512 tokens or more
    next to the same points of the TP-`n` servers' calibrations in `files` (their mean; each listed)."""
    from sgl_sidp.calibration.table import Calibration

    reals = [Calibration.from_entry(json.loads(Path(f).read_text())) for f in files]
    row = next(c for c in plan(model_path, n, gpu, "latency:2048:4")["configurations"] if c["name"] == f"tp{n}")
    out = ["| number | predicted | measured (each server) | error |", "|---|---:|---:|---:|"]
    points = [(f"decode step, batch {b}, context {ctx}", p, [r.decode_ms.get(int(b)) if ctx == "256" else
                                                           r.decode_ms_long.get(int(b)) for r in reals])
              for ctx in ("256", "2048") for b, p in row["decode_step_ms"][ctx].items()]
    points += [(f"prefill of {int(t):,} tokens", p, [r.prefill_ms.get(int(t)) for r in reals])
               for t, p in row["prefill_ms"].items() if int(t) >= 512]
    for what, pred, ms in points:
        if None in ms:
            continue
        mean = sum(ms) / len(ms)
        out.append(f"| {what} | {pred:.2f} ms | {' / '.join(f'{v:.2f}' for v in ms)} ms | {pred / mean - 1:+.1%} |")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, nargs="?", help="a folder of shift_compare.py results run on N GPUs")
    ap.add_argument("--model-path", required=True, help="the model's config folder the measurement served")
    ap.add_argument("--gpu", default="H200", help="GPU kind the measurement ran on (default: H200)")
    ap.add_argument("--forwards", type=Path, nargs="+", default=None,
                    help="calibrations of TP-N servers of the model (instead of DIR): their forwards against tpN's")
    ap.add_argument("--gpus", type=int, default=2, help="N, with --forwards (default: 2)")
    add_what_if_args(ap)
    a = ap.parse_args(argv)
    apply_what_if(a)
    if a.forwards:
        print("\n".join(forwards_table(a.forwards, a.model_path, a.gpu, a.gpus)))
        return
    if a.dir is None:
        ap.error("give DIR (shift_compare.py results) or --forwards")
    measured = {p.stem: json.loads(p.read_text()) for p in sorted(a.dir.glob("*.json")) if p.stem in NAMES}
    n = max(len(m["kv_tokens"]) for m in measured.values())  # DP runs log one pool per GPU
    print("| configuration | number | unit | predicted | measured | error |\n|---|---|---|---:|---:|---:|")
    table = rows(measured, a.model_path, a.gpu, n)
    for name, what, unit, pred, meas in table:
        if pred is None:
            print(f"| {name} | {what} | | | | |")
            continue
        print(f"| {name} | {what} | {unit} | {pred:,.1f} | {meas:,.1f} | {pred / meas - 1:+.1%} |")
    thr = [(name, pred, meas) for name, what, _, pred, meas in table if what.endswith("total throughput")]
    print("\nBurst throughput ranking, measured: " + " > ".join(f"{x[0]} ({x[2]:,.0f})" for x in sorted(thr, key=lambda x: -x[2])))
    print("Burst throughput ranking, predicted: " + " > ".join(f"{x[0]} ({x[1]:,.0f})" for x in sorted(thr, key=lambda x: -x[1])))


if __name__ == "__main__":
    main()
