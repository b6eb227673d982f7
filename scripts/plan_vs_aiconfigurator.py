"""NVIDIA AIConfigurator's predictions for the planner's cases, and its errors against our one-H200 measurements.

AIConfigurator (PyPI `aiconfigurator`) predicts a serving framework's step times from kernel times it profiled on each
GPU kind. This script asks it, for SGLang, the questions `python -m sgl_sidp.plan` answers, on these cases: Qwen3-8B
TP1, TP2, DP2 and DP-attention 2 on H200; Qwen3-32B TP1, TP2, DP2 on H200; Qwen3-30B-A3B TP1 and DP2 on H200;
Qwen3-8B TP1 on H100. For each it writes:

- decode step time (ms) of one replica holding B sequences, B = 1, 8, 32, 64, 128, 256, each sequence 256 or 2,048
  tokens long (AIConfigurator's `static_gen` mode, one step);
- prefill time (ms) of one request of 512, 2,048, 4,096 and 8,192 tokens (`static_ctx`, batch 1);
- an offline burst of 512 requests x (2,048 in, 256 out), spread evenly over the replicas: AIConfigurator's `agg`
  (continuous batching, 8,192-token chunked prefill) at the largest concurrency per replica, up to 512 / DP, that it
  says fits in memory, and its `static` mode (one static batch of 512 / DP per replica).

It needs AIConfigurator in its own virtual environment (it does not fit SGLang's):

    python3.12 -m venv /work/aic-venv && /work/aic-venv/bin/pip install aiconfigurator==0.12.0
    /work/aic-venv/bin/python scripts/plan_vs_aiconfigurator.py

Made with aiconfigurator 0.12.0 (aiconfigurator-core 0.12.0; its SGLang database 0.5.14 for h200_sxm and h100_sxm).
Output, in benchmarks/results/plan/aiconfigurator/ (README.md there documents every field):

- aic_predictions.json: one object per case (`case`, `model`, `gpu`, `tp`, `dp`, `dp_attention`, `decode_step_ms`,
  `prefill_ms`, `burst_512x2048x256`, `aic_version`, `aic_backend_version`, `notes`);
- aic_vs_measured_qwen3-8b_tp1_h200.json: AIConfigurator against our measured vanilla SGLang TP1 on one H200 and our
  bundled calibration of it (error = predicted / measured - 1); the same rows are printed as a markdown table.

Nothing here runs a GPU: every number AIConfigurator gives is a prediction.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "benchmarks/results/plan/aiconfigurator"
MEASURED = ROOT / "benchmarks/results/shift/prefill_graphs_1gpu/tp.json"
CALIBRATION = ROOT / "sgl_sidp/calibration/bundled/h200_qwen3-8b_tp1.json"
INSTALL = "python3.12 -m venv /work/aic-venv && /work/aic-venv/bin/pip install aiconfigurator==0.12.0"

BACKEND = "sglang"
DECODE_CONTEXTS = (256, 2048)
DECODE_BATCHES = (1, 8, 32, 64, 128, 256)
PREFILL_TOKENS = (512, 2048, 4096, 8192)
BURST = (512, 2048, 256)  # requests, input tokens, output tokens
CHUNKED_PREFILL = 8192  # SGLang's default chunked-prefill size on H100 and H200 (80-160 GB per GPU)

DENSE_DP_ATTENTION = ("not predicted: AIConfigurator has no model of DP attention for a dense model; it accepts "
                      "attention_dp_size=2 but prices exactly TP1's kernels per rank (no token gather, no TP2 MLP), "
                      "i.e. the DP2 case, which SGLang's --enable-dp-attention is not")


def case(name: str, model: str, gpu: str, tp: int, dp: int, dp_attention: bool = False, moe: bool = False) -> dict:
    return {"case": name, "model": model, "gpu": gpu, "tp": tp, "dp": dp, "dp_attention": dp_attention, "moe": moe}


CASES = [
    case("qwen3-8b_tp1_h200", "Qwen/Qwen3-8B", "h200_sxm", 1, 1),
    case("qwen3-8b_tp2_h200", "Qwen/Qwen3-8B", "h200_sxm", 2, 1),
    case("qwen3-8b_dp2_h200", "Qwen/Qwen3-8B", "h200_sxm", 1, 2),
    case("qwen3-8b_dp2_attn_h200", "Qwen/Qwen3-8B", "h200_sxm", 1, 2, dp_attention=True),
    case("qwen3-32b_tp1_h200", "Qwen/Qwen3-32B", "h200_sxm", 1, 1),
    case("qwen3-32b_tp2_h200", "Qwen/Qwen3-32B", "h200_sxm", 2, 1),
    case("qwen3-32b_dp2_h200", "Qwen/Qwen3-32B", "h200_sxm", 1, 2),
    case("qwen3-30b-a3b_tp1_h200", "Qwen/Qwen3-30B-A3B", "h200_sxm", 1, 1, moe=True),
    case("qwen3-30b-a3b_dp2_h200", "Qwen/Qwen3-30B-A3B", "h200_sxm", 1, 2, moe=True),
    case("qwen3-8b_tp1_h100", "Qwen/Qwen3-8B", "h100_sxm", 1, 1),
]


class Aic:
    """AIConfigurator's single-point estimate (`cli_estimate`) for one replica of one case."""

    def __init__(self, c: dict, backend_version: str | None):
        from aiconfigurator.cli.api import cli_estimate

        self._estimate, self.c, self.backend_version = cli_estimate, c, backend_version
        self.used_version: str | None = None
        self.memory_flags: list[str] = []

    def run(self, mode: str, **kw):
        par = {"tp_size": self.c["tp"]}
        if self.c["moe"]:
            par.update(moe_tp_size=self.c["tp"], moe_ep_size=1)
        r = self._estimate(self.c["model"], self.c["gpu"], mode=mode, backend_name=BACKEND,
                           backend_version=self.backend_version, **par, **kw)
        self.used_version = r.backend_version
        return r

    def decode_ms(self, batch: int, context: int) -> float:
        r = self.run("static_gen", isl=context, osl=2, batch_size=batch)  # osl 2: exactly one decode step
        if r.kv_cache_warning:
            self.memory_flags.append(f"decode {batch} x {context}")
        return r.tpot

    def prefill_ms(self, tokens: int, batch: int = 1) -> float:
        r = self.run("static_ctx", isl=tokens, osl=1, batch_size=batch)
        if r.kv_cache_warning:
            self.memory_flags.append(f"prefill {batch} x {tokens}")
        return r.ttft

    def source_shares(self, mode: str, **kw) -> dict[str, float]:
        """Share of the predicted time per data source ('silicon': AIConfigurator's measured kernel tables,
        'empirical': its formulas, 'mixed')."""
        s = self.run(mode, **kw).summary
        lat = s.get_generation_latency_dict() if mode == "static_gen" else s.get_context_latency_dict()
        src = s.get_generation_source_dict() if mode == "static_gen" else s.get_context_source_dict()
        total = sum(lat.values()) or 1.0
        out: dict[str, float] = {}
        for op, ms in lat.items():
            key = src.get(op, "unknown")
            out[key] = out.get(key, 0.0) + ms / total
        return {k: round(v, 3) for k, v in sorted(out.items()) if v > 0}

    def agg_fits(self, batch: int, isl: int, osl: int):
        """The agg estimate at concurrency `batch`, or None where AIConfigurator says it does not fit in memory."""
        try:
            r = self.run("agg", isl=isl, osl=osl, batch_size=batch, ctx_tokens=CHUNKED_PREFILL)
        except RuntimeError as e:
            if "OOM" in str(e):
                return None
            raise
        return None if r.kv_cache_warning else r

    def agg_burst(self, per_replica: int, isl: int, osl: int) -> dict | None:
        """`agg` at the largest concurrency <= per_replica (8-request steps) that fits, or None if none does."""
        best = self.agg_fits(per_replica, isl, osl)
        if best is None:
            lo, hi = 0, per_replica  # lo fits (0 = none found), hi does not
            while hi - lo > 8:
                mid = (lo + hi) // 2
                r = self.agg_fits(mid, isl, osl)
                lo, hi, best = (mid, hi, r) if r is not None else (lo, mid, best)
            if best is None:
                return None
        n, dp = best.batch_size, self.c["dp"]
        seq_s = best.raw["seq/s"] * dp
        return {"concurrency_per_replica": n, "total_tok_s": round(seq_s * (isl + osl), 1),
                "output_tok_s": round(seq_s * osl, 1), "ttft_ms": round(best.ttft, 2), "tpot_ms": round(best.tpot, 3)}

    def static_burst(self, per_replica: int, isl: int, osl: int) -> dict:
        r = self.run("static", isl=isl, osl=osl, batch_size=per_replica)
        seq_s = r.raw["seq/s"] * self.c["dp"]
        return {"batch_per_replica": per_replica, "total_tok_s": round(seq_s * (isl + osl), 1),
                "output_tok_s": round(seq_s * osl, 1), "ttft_ms": round(r.ttft, 2), "tpot_ms": round(r.tpot, 3),
                "fits_memory": not r.kv_cache_warning}


def predict_case(c: dict, backend_version: str | None, aic_version: str) -> dict:
    out = {k: c[k] for k in ("case", "model", "gpu", "tp", "dp", "dp_attention")}
    out.update(gpus=c["tp"] * c["dp"], decode_step_ms=None, prefill_ms=None, burst_512x2048x256=None,
               aic_version=aic_version, aic_backend_version=None, notes=[])
    if c["dp_attention"] and not c["moe"]:
        out["notes"].append(DENSE_DP_ATTENTION)
        return out
    aic = Aic(c, backend_version)
    out["decode_step_ms"] = {str(ctx): {str(b): round(aic.decode_ms(b, ctx), 3) for b in DECODE_BATCHES}
                             for ctx in DECODE_CONTEXTS}
    out["prefill_ms"] = {str(t): round(aic.prefill_ms(t), 2) for t in PREFILL_TOKENS}
    n, isl, osl = BURST
    per_replica = n // c["dp"]
    agg = aic.agg_burst(per_replica, isl, osl)
    static = aic.static_burst(per_replica, isl, osl)
    if agg is not None:
        out["burst_512x2048x256"] = {**agg, "mode": "agg", "static": static}
        if agg["concurrency_per_replica"] < per_replica:
            out["notes"].append(f"burst: AIConfigurator says {per_replica} sequences of {isl + osl} tokens do not fit "
                                f"one replica's KV cache; agg is at concurrency {agg['concurrency_per_replica']}")
    else:
        out["notes"].append("burst: no agg concurrency fits in memory per AIConfigurator")
    out["aic_backend_version"] = aic.used_version
    if aic.memory_flags:
        out["notes"].append("AIConfigurator flags as not fitting in memory (numbers kept): "
                            + ", ".join(dict.fromkeys(aic.memory_flags)))
    if not static["fits_memory"]:
        out["notes"].append(f"burst static: one batch of {per_replica} x {isl} prefilled at once does not fit in "
                            "memory per AIConfigurator (numbers kept)")
    if c["dp"] > 1:
        out["notes"].append(f"{c['dp']} independent replicas: step and prefill times are one replica's; the burst "
                            "is AIConfigurator's one-replica estimate at 512 / DP requests, throughput x DP")
    dec = aic.source_shares("static_gen", isl=2048, osl=2, batch_size=64)
    pre = aic.source_shares("static_ctx", isl=8192, osl=1, batch_size=1)
    out["notes"].append(f"data sources, share of predicted time: decode 64 x 2048 {dec}; prefill 8192 {pre}")
    return out


def _err(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or not meas else round(pred / meas - 1, 4)


def compare_qwen3_8b_tp1(backend_version: str | None) -> list[dict]:
    """AIConfigurator against our measurement (tp.json) and bundled calibration of Qwen3-8B TP1 on one H200."""
    meas, cal = json.loads(MEASURED.read_text()), json.loads(CALIBRATION.read_text())
    aic = Aic(CASES[0], backend_version)
    rows = []

    def row(what: str, unit: str, pred: float, measured: float, source: str) -> None:
        rows.append({"number": what, "unit": unit, "aic_predicted": round(pred, 3), "measured": round(measured, 3),
                     "error": _err(pred, measured), "measured_in": source})

    src_cal = str(CALIBRATION.relative_to(ROOT))
    for b, ms in sorted(cal["decode_ms"].items(), key=lambda kv: int(kv[0])):
        ctx = int(cal["decode_context"][b])
        row(f"decode step, batch {b}, {ctx}-token context", "ms", aic.decode_ms(int(b), ctx), ms, src_cal)
    for b, ms in sorted(cal.get("decode_ms_long", {}).items(), key=lambda kv: int(kv[0])):
        ctx = int(cal["decode_context_long"])
        row(f"decode step, batch {b}, {ctx}-token context", "ms", aic.decode_ms(int(b), ctx), ms, src_cal)
    for t, ms in sorted(cal["prefill_ms"].items(), key=lambda kv: int(kv[0])):
        row(f"prefill forward of one {t}-token prompt", "ms", aic.prefill_ms(int(t)), ms, src_cal)
    src_meas = str(MEASURED.relative_to(ROOT))
    for t, ms in sorted(meas["ttft_ms"].items(), key=lambda kv: int(kv[0])):
        row(f"TTFT of one {t}-token prompt (client, HTTP included)", "ms", aic.prefill_ms(int(t)), ms, src_meas)
    for key, (n, isl, osl) in (("burst", (64, 2048, 16)), ("low_traffic", (4, 1024, 64))):
        m = meas[key]
        label = f"{'burst' if key == 'burst' else 'low traffic'} of {n} x ({isl} in, {osl} out)"
        st = aic.static_burst(n, isl, osl)
        ag = aic.agg_burst(n, isl, osl)
        row(f"{label}: total tok/s, AIC static", "tok/s", st["total_tok_s"], m["total_tok_s"], src_meas)
        if ag is not None:
            row(f"{label}: total tok/s, AIC agg", "tok/s", ag["total_tok_s"], m["total_tok_s"], src_meas)
        row(f"{label}: TTFT p50 vs AIC static TTFT (whole batch)", "ms", st["ttft_ms"], m["median_ttft_ms"], src_meas)
        if ag is not None:
            row(f"{label}: TTFT p50 vs AIC agg TTFT", "ms", ag["ttft_ms"], m["median_ttft_ms"], src_meas)
        row(f"{label}: TPOT p50 vs AIC static TPOT", "ms", st["tpot_ms"], m["median_tpot_ms"], src_meas)
        if ag is not None:
            row(f"{label}: TPOT p50 vs AIC agg TPOT", "ms", ag["tpot_ms"], m["median_tpot_ms"], src_meas)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| number | unit | AIConfigurator predicted | our measured | error |", "|---|---|---:|---:|---:|"]
    for r in rows:
        err = "" if r["error"] is None else f"{r['error'] * 100:+.1f}%"
        lines.append(f"| {r['number']} | {r['unit']} | {r['aic_predicted']:,.2f} | {r['measured']:,.2f} | {err} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Ask NVIDIA AIConfigurator (PyPI aiconfigurator) for SGLang decode step times, prefill times and "
                    "the throughput of an offline burst of 512 x (2,048 in, 256 out) on the planner's cases, write "
                    "them as JSON, and compare its Qwen3-8B TP1 H200 numbers with our measurement and calibration. "
                    f"Needs AIConfigurator installed: {INSTALL}")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR, help=f"where to write the JSON files (default: {OUT_DIR})")
    ap.add_argument("--backend-version", default=None,
                    help="AIConfigurator's SGLang database version (default: its current one, 0.5.14 in 0.12.0)")
    ap.add_argument("--cases", default=None,
                    help="comma-separated case names to run (default: all): " + ", ".join(c["case"] for c in CASES))
    ap.add_argument("--no-compare", action="store_true", help="skip the comparison with our measurement")
    a = ap.parse_args(argv)
    try:
        from importlib.metadata import version

        import aiconfigurator.cli.api  # noqa: F401
    except ImportError:
        print(f"aiconfigurator is not installed for {sys.executable}: {INSTALL}, then run this script with "
              "/work/aic-venv/bin/python", file=sys.stderr)
        return 2
    logging.disable(logging.WARNING)  # its per-query fallback notices
    aic_version = f"aiconfigurator {version('aiconfigurator')} (aiconfigurator-core {version('aiconfigurator-core')})"
    wanted = set(a.cases.split(",")) if a.cases else None
    unknown = (wanted or set()) - {c["case"] for c in CASES}
    if unknown:
        print(f"--cases: unknown {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    a.out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for c in CASES:
        if wanted and c["case"] not in wanted:
            continue
        t0 = time.time()
        try:
            results.append(predict_case(c, a.backend_version, aic_version))
        except Exception as e:  # one case AIConfigurator cannot answer must not lose the others
            results.append({**{k: c[k] for k in ("case", "model", "gpu", "tp", "dp", "dp_attention")},
                            "gpus": c["tp"] * c["dp"], "decode_step_ms": None, "prefill_ms": None,
                            "burst_512x2048x256": None, "aic_version": aic_version, "aic_backend_version": None,
                            "notes": [f"not predicted: {type(e).__name__}: {str(e).splitlines()[0][:300]}"]})
        print(f"{c['case']}: {time.time() - t0:.1f} s", file=sys.stderr)
    path = a.out_dir / "aic_predictions.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    if not a.no_compare:
        rows = compare_qwen3_8b_tp1(a.backend_version)
        cmp_path = a.out_dir / "aic_vs_measured_qwen3-8b_tp1_h200.json"
        cmp_path.write_text(json.dumps({"aic_version": aic_version, "measured": str(MEASURED.relative_to(ROOT)),
                                        "calibration": str(CALIBRATION.relative_to(ROOT)),
                                        "error": "AIConfigurator predicted / our measured - 1", "rows": rows},
                                       indent=1) + "\n")
        print(f"wrote {cmp_path}", file=sys.stderr)
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
