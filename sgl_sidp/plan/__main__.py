"""`python -m sgl_sidp.plan`: every configuration of a model on N GPUs, predicted (issue 21; a first version).

    python -m sgl_sidp.plan --model-path DIR --gpus N [--gpu H200] [--workload offline:512:2048:256] [--json]

Prints one row per configuration: weights and KV tokens per GPU (SGLang's own memory accounting), and, for the
configurations the planner models and has a one-GPU calibration of, throughput and TTFT/TPOT p50/p99 from a
simulation of SGLang's scheduler on the workload. Every number is a prediction. Workloads: `offline:S:IN:OUT` (S
requests of IN prompt and OUT output tokens, all at once), `latency:IN:OUT` (one request), `trace:FILE[:SCALE]` (an
Azure CSV or Mooncake JSONL trace; SCALE > 1 spreads arrivals out). Bad input: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sgl_sidp.calibration.memory import GIB, ModelShapes, default_mem_fraction_static, dtype_bytes
from sgl_sidp.model_info import read_hf_config
from sgl_sidp.plan.comm import Interconnect, InterconnectError
from sgl_sidp.plan.configs import configurations
from sgl_sidp.plan.sim import ReplicaLimits, ReplicaSim, SimRequest, simulate, summarize
from sgl_sidp.plan.steps import GPUS, MODELLED, StepModel, find_calibration, shard_signature

DECODE_CONTEXTS, DECODE_BATCHES, PREFILL_TOKENS = (256, 2048), (1, 8, 32, 64, 128, 256), (512, 2048, 4096, 8192)


class PlanError(ValueError):
    """Input the planner cannot work with (one line for the user)."""


def workload(spec: str) -> list[SimRequest]:
    """The requests of a `--workload` spec.

    Raises:
        PlanError: an unknown or malformed spec, or an unreadable trace.
    """
    kind, _, rest = spec.partition(":")
    try:
        if kind == "offline":
            n, inp, out = (int(x) for x in rest.split(":"))
            return [SimRequest(0.0, inp, out) for _ in range(n)]
        if kind == "latency":
            inp, out = (int(x) for x in rest.split(":"))
            return [SimRequest(0.0, inp, out)]
        if kind == "trace":
            from sgl_sidp.bench.traces import load_trace

            path, _, scale = rest.partition(":")
            k = float(scale or 1.0)
            return [SimRequest(r.arrival_s * k, r.input_len, max(1, r.output_len), r.hash_ids) for r in load_trace(path)]
    except (ValueError, OSError) as e:
        raise PlanError(f"--workload {spec}: {e}") from None
    raise PlanError(f"--workload {spec}: expected offline:S:IN:OUT, latency:IN:OUT or trace:FILE[:SCALE]")


def plan(model_path: str, n_gpus: int, gpu: str, spec: str, calibration_dirs: list[Path] | None = None) -> dict:
    """The planner's result as the `--json` object (`winner`, `configurations`, what is predicted and from what)."""
    hf = read_hf_config(model_path)
    if hf is None:
        raise PlanError(f"--model-path {model_path}: no config.json there")
    if gpu not in GPUS:
        raise PlanError(f"--gpu {gpu}: known kinds are {', '.join(GPUS)}")
    shapes, elt = ModelShapes.of(hf), dtype_bytes(hf)
    configs = configurations(shapes, n_gpus)
    if not configs:
        raise PlanError(f"{model_path} does not shard over {n_gpus} GPUs in any configuration")
    try:
        ic = Interconnect.load(GPUS[gpu]["name"])
    except InterconnectError as e:
        raise PlanError(str(e)) from None
    requests = workload(spec)
    kind, free = GPUS[gpu], GPUS[gpu]["free_before_load_gib"] * GIB
    rows = []
    for c in configs:
        attn_tp = c.tp * (c.sp if c.technique == "shift" else 1)
        frac = default_mem_fraction_static(kind["mib"], c.gpus if c.technique == "dp_attention" else attn_tp,
                                           prefill_graph_buckets=0 if shapes.mla else 58, mla=shapes.mla,
                                           dp_attention_dp=c.dp if c.technique == "dp_attention" else 0)
        memory = {"sink_offload": shapes.moe_layers} if c.technique == "zerodp" else {}
        weights = c.weight_bytes_per_gpu(shapes, elt, **memory)
        kv = c.kv_tokens(shapes, free, frac, elt, **memory)
        row = {"name": c.name, "technique": c.technique, "dp": c.dp, "tp": c.tp, "sp": c.sp,
               "weights_gb_per_gpu": round(max(weights.values()) / 1e9, 2), "kv_tokens_total": kv["total"],
               "mem_fraction_static": frac}
        rows.append(row)
        if c.technique not in MODELLED:
            row["not_predicted"] = f"{c.technique}: step times not modelled yet"
            continue
        shard = c.shards(shapes)["forward"]
        sig = shard_signature(hf, shard)
        found = find_calibration(sig, kind["name"], calibration_dirs)
        if found is None:
            row["not_predicted"] = (f"no calibration of the shard '{sig}' on {kind['name']}: run the shard on one GPU "
                                    f"with --json-model-override-args '{json.dumps(shard.override_args(shapes))}' "
                                    "--sidp-calibrate")
            continue
        if kv["gpu"] <= 0:
            row["not_predicted"] = "the weights leave no KV cache"
            continue
        model = StepModel(c, shapes, found[0], ic, elt)
        row["calibration"] = str(found[1])
        row["decode_step_ms"] = {str(ctx): {str(b): round(model.decode_ms(b, ctx), 3) for b in DECODE_BATCHES}
                                 for ctx in DECODE_CONTEXTS}
        row["prefill_ms"] = {str(t): round(model.prefill_ms([(t, 0)]), 2) for t in PREFILL_TOKENS}
        reqs = [SimRequest(r.arrival_s, r.input_len, r.output_len, r.hash_ids) for r in requests]
        replicas = [ReplicaSim(ReplicaLimits(kv_tokens=kv["gpu"]), model.step_times()) for _ in range(c.dp)]
        row.update({k: round(v, 2) if isinstance(v, float) else v for k, v in summarize(simulate(reqs, replicas)).items()})
    vanilla = [r for r in rows if r["technique"] in ("vanilla", "dp_attention") and "total_tok_s" in r]
    best_vanilla = max(vanilla, key=lambda r: r["total_tok_s"], default=None)
    for r in rows:
        if best_vanilla and "total_tok_s" in r:
            r["ratio_to_best_vanilla"] = round(r["total_tok_s"] / best_vanilla["total_tok_s"], 3)
    ranked = sorted((r for r in rows if "total_tok_s" in r), key=lambda r: -r["total_tok_s"])
    if not ranked and not any(r.get("calibration") for r in rows):
        first = next((r["not_predicted"] for r in rows if "no calibration" in r.get("not_predicted", "")), "")
        raise PlanError(f"nothing to predict from: {first or 'no configuration is modelled'}")
    winner = ranked[0]["name"] if ranked else None
    reason = (f"{winner}: the highest predicted throughput on {spec} ({ranked[0]['total_tok_s']:.0f} tokens/s)"
              if ranked else "no configuration could be predicted (see not_predicted)")
    return {"predicted": True, "model": model_path, "gpus": n_gpus, "gpu": kind["name"], "workload": spec,
            "winner": winner, "reason": reason, "configurations": rows,
            "memory_source": f"free memory before load: {kind['source']}; mem_fraction_static: SGLang's default"}


def table(result: dict) -> str:
    """The result as a markdown table, every number labelled predicted."""
    lines = [f"Predicted for {result['model']} on {result['gpus']} x {result['gpu']}, workload {result['workload']} "
             "(every number below is a prediction):", "",
             "| configuration | weights GB/GPU | KV tokens (all GPUs) | total tok/s | TTFT p50 ms | TPOT p50 ms | "
             "TTFT p99 ms | TPOT p99 ms | vs best vanilla |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["configurations"]:
        if "total_tok_s" in r:
            cells = [f"{r['total_tok_s']:.0f}", f"{r['ttft_ms_p50']:.1f}", f"{r['tpot_ms_p50']:.2f}",
                     f"{r['ttft_ms_p99']:.1f}", f"{r['tpot_ms_p99']:.2f}", f"{r.get('ratio_to_best_vanilla', 0):.2f}x"]
        else:
            cells = ["not predicted"] + [""] * 5
        lines.append(f"| {r['name']} | {r['weights_gb_per_gpu']:.1f} | {r['kv_tokens_total']:,} | " + " | ".join(cells) + " |")
    lines += ["", f"Winner (predicted): {result['reason']}."]
    if result["winner"]:
        w = next(r for r in result["configurations"] if r["name"] == result["winner"])
        lines.append(f"Launch: python -m sgl_sidp.launch_server --model-path {result['model']} --tp-size {w['tp']} "
                     f"--dp-size {w['dp']}")
    missing = [f"- {r['name']}: {r['not_predicted']}" for r in result["configurations"] if "not_predicted" in r]
    return "\n".join(lines + (["", "Not predicted:"] + missing if missing else [])) + "\n"


def write_png(result: dict, path: Path) -> None:
    """Predicted throughput of every predicted configuration, and its decode step against the batch (2,048-token
    context), as a PNG titled as a prediction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["configurations"] if "total_tok_s" in r]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.barh([r["name"] for r in rows], [r["total_tok_s"] for r in rows], color="tab:blue")
    left.set_xlabel("total tokens/s (predicted)")
    left.set_title(f"{result['workload']}")
    for r in rows:
        steps = r["decode_step_ms"]["2048"]
        right.plot([int(b) for b in steps], list(steps.values()), marker="o", label=r["name"])
    right.set_xlabel("decode batch (sequences of 2,048 tokens)")
    right.set_ylabel("decode step ms (predicted)")
    right.legend(fontsize=8)
    fig.suptitle(f"PREDICTED: {Path(result['model']).name} on {result['gpus']} x {result['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def calibrate_main(argv: list[str]) -> None:
    """`python -m sgl_sidp.plan calibrate --model-path DIR --gpus N`: time every missing shard on this host's GPU."""
    from sgl_sidp.peer.topology import gpu_name
    from sgl_sidp.plan.calibrate import calibrate

    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.plan calibrate",
                                 description="Time, on this host's GPU 0, every shard the model's configurations on N "
                                 "GPUs need (SGLang with the shard's sizes and --sidp-calibrate), caching each in "
                                 "$SIDP_CALIBRATION_DIR.")
    ap.add_argument("--model-path", required=True, help="a folder with the model's config.json")
    ap.add_argument("--gpus", type=int, required=True, help="GPUs of the node to plan for")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="seconds one shard may take (default: 600)")
    a = ap.parse_args(argv)
    name = gpu_name(0)
    if read_hf_config(a.model_path) is None or name is None:
        print(f"sgl-sidp plan calibrate: error: {'no CUDA GPU visible' if name is None else 'no config.json in ' + a.model_path}",
              file=sys.stderr)
        raise SystemExit(2)
    results = calibrate(a.model_path, a.gpus, name, timeout_s=a.timeout_s)
    for sig, what in results.items():
        print(f"{sig}: {what}")
    raise SystemExit(0 if all(not w.startswith("failed") for w in results.values()) else 1)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["calibrate"]:
        return calibrate_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.plan", description=__doc__.split("\n\n")[0],
                                 epilog="python -m sgl_sidp.plan calibrate --model-path DIR --gpus N: time the shards "
                                 "on this host's GPU first.")
    ap.add_argument("--model-path", required=True, help="a folder with the model's config.json")
    ap.add_argument("--gpus", type=int, required=True, help="GPUs of the node to plan for")
    ap.add_argument("--gpu", default="H200", help=f"GPU kind: {', '.join(GPUS)} (default: H200)")
    ap.add_argument("--workload", default="offline:512:2048:256",
                    help="offline:S:IN:OUT, latency:IN:OUT or trace:FILE[:SCALE] (default: offline:512:2048:256)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    ap.add_argument("--png", type=Path, default=None, help="also write a PNG of the predicted configurations here")
    a = ap.parse_args(argv)
    try:
        if a.gpus < 1:
            raise PlanError(f"--gpus {a.gpus}: at least 1")
        result = plan(a.model_path, a.gpus, a.gpu, a.workload)
    except PlanError as e:
        print(f"sgl-sidp plan: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if a.png:
        write_png(result, a.png)
    print(json.dumps(result, indent=1) if a.json else table(result), end="" if not a.json else "\n")


if __name__ == "__main__":
    main()
