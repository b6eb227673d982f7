"""Which configuration of a model serves a workload best on N GPUs of one node: every one predicted from one-GPU calibrations.

    python -m sgl_sidp.plan --model-path DIR --gpus N [--gpu H200] [--workload offline:512:2048:256] [--json]
    python -m sgl_sidp.plan calibrate --model-path DIR --gpus N      # on one GPU: time the shards it needs
    python -m sgl_sidp.plan measure-comm --gpus N [--model-path DIR] # on the node: measure the interconnect table

Prints one row per configuration (vanilla TP x DP, DP attention, ZeroDP, SiDP, Shift): weights and KV tokens per GPU
(SGLang's own memory accounting), and, where its shards are calibrated, throughput and TTFT/TPOT p50/p99 from a
simulation of SGLang's scheduler on the workload, then the winner, why, and the command that starts it. Every
number is a prediction. Workloads: `offline:S:IN:OUT` (S
requests of IN prompt and OUT output tokens, all at once), `latency:IN:OUT` (one request), `trace:FILE[:SCALE]` (an
Azure CSV or Mooncake JSONL trace; SCALE > 1 spreads arrivals out). Bad input: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sgl_sidp.calibration.memory import (GIB, ModelShapes, default_decode_graph_max_bs, default_mem_fraction_static,
                                        dtype_bytes)
from sgl_sidp.model_info import read_hf_config
from sgl_sidp.plan.calibrate import unservable
from sgl_sidp.plan.comm import Interconnect, InterconnectError
from sgl_sidp.plan.configs import configuration_named, configurations, shard_of
from sgl_sidp.plan.sim import (PrivateBlocks, ReplicaLimits, ReplicaSim, SimRequest, deliver, no_cycle_collection,
                               simulate, summarize)
from sgl_sidp.plan.steps import (GPUS, ShardClock, StepModel, find_calibration, host_time_alone_ms, request_overhead_ms,
                                 shard_roles, shard_signature, stream_tokens_per_s)

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
        if kind in ("offline", "latency"):
            counts = [int(x) for x in rest.split(":")]
            names = ("S", "IN", "OUT") if kind == "offline" else ("IN", "OUT")
            if len(counts) != len(names):
                raise ValueError(f"expected {kind}:{':'.join(names)}")
            low = [f"{name} {x}" for name, x in zip(names, counts) if x < 1]
            if low:  # SGLang serves no request without a prompt token, and TPOT needs an output token
                raise ValueError(f"{', '.join(low)}: each at least 1")
            n, inp, out = counts if kind == "offline" else (1, *counts)
            return [SimRequest(0.0, inp, out) for _ in range(n)]
        if kind == "trace":
            from sgl_sidp.bench.traces import load_trace

            path, _, scale = rest.partition(":")
            k = float(scale or 1.0)
            if not 0 < k < float("inf"):
                raise ValueError(f"SCALE {scale}: the arrival times' factor must be a positive number")
            return [SimRequest(r.arrival_s * k, r.input_len, max(1, r.output_len), r.hash_ids) for r in load_trace(path)]
    except (ValueError, OSError) as e:
        raise PlanError(f"--workload {spec}: {e}") from None
    raise PlanError(f"--workload {spec}: expected offline:S:IN:OUT, latency:IN:OUT or trace:FILE[:SCALE]")


def launch_flags(row: dict) -> list[str]:
    """The `python -m sgl_sidp.launch_server` flags (besides the model's) that start configuration `row`, with the
    decisions this cost model made for it (SiDP's B_th, Shift's threshold, ZeroDP's capacity-bound policy at the
    workload's context): `Configuration.launch_flags`."""
    d = row.get("decisions", {})
    return configuration_named(row["name"]).launch_flags(b_th=d.get("b_th"), shift_threshold=d.get("shift_threshold"),
                                                         expected_batch=d.get("expected_batch"))


@no_cycle_collection()  # (`plan_requests`; the trace's parse too)
def plan(model_path: str, n_gpus: int, gpu: str, spec: str, calibration_dirs: list[Path] | None = None,
         decode_points: list[tuple[int, int]] | None = None) -> dict:
    """The planner's result as the `--json` object (`winner`, `configurations`, what is predicted and from what) for
    the `--workload` spec; `decode_points` adds each configuration's predicted decode step at those (batch, context)
    points as `decode_at` (ms)."""
    objective = "throughput" if spec.startswith("offline:") else "latency"
    return plan_requests(model_path, n_gpus, gpu, spec, workload(spec), calibration_dirs, decode_points, objective)


#: a configuration "keeps up" with a trace when its predicted throughput is within this of the best one's
KEEPS_UP = 0.02


def rank(rows: list[dict], objective: str) -> list[dict]:
    """The predicted configurations, best first: by throughput ("throughput", offline work), or ("latency", traces and
    single requests) by median E2E latency among those within `KEEPS_UP` of the best throughput (a trace's throughput
    is its arrival rate wherever the configuration keeps up), then the rest by throughput."""
    done = sorted((r for r in rows if "total_tok_s" in r), key=lambda r: -r["total_tok_s"])
    if objective == "throughput" or not done:
        return done
    floor = (1 - KEEPS_UP) * done[0]["total_tok_s"]
    keep = sorted((r for r in done if r["total_tok_s"] >= floor), key=lambda r: r["e2e_ms_p50"])
    return keep + [r for r in done if r["total_tok_s"] < floor]


@no_cycle_collection()  # one pass of the cyclic garbage collector after all the schedules, not one after each
def plan_requests(model_path: str, n_gpus: int, gpu: str, label: str, requests: list[SimRequest],
                  calibration_dirs: list[Path] | None = None, decode_points: list[tuple[int, int]] | None = None,
                  objective: str = "latency") -> dict:
    """`plan` of an explicit request list (`label` names it in the result; `objective` as `rank`)."""
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
        for n in sorted({c.gpus for c in configs if c.gpus > 1}):
            ic.time_us("all_reduce", n, 1)
    except InterconnectError as e:
        raise PlanError(str(e)) from None
    kind, free = GPUS[gpu], GPUS[gpu]["free_before_load_gib"] * GIB
    whole = shard_signature(hf, shard_of(shapes, 1, 1, 1))  # the model's TP1 signature: its shards' model part
    overhead, overhead_source = request_overhead_ms(kind["name"], calibration_dirs, model=whole)
    host_ms = host_time_alone_ms(kind["name"], calibration_dirs)
    stream = stream_tokens_per_s(kind["name"], calibration_dirs, model=whole)
    context = (sum(r.input_len + r.output_len / 2 for r in requests) / len(requests)) if requests else 1024
    rows, simulated = [], {}  # simulated: schedules by what determines them (below)
    private = PrivateBlocks(requests)  # each request's blocks that the simulation need not look up, by DP replicas
    for c in configs:
        server_tp = c.gpus if c.technique == "dp_attention" else c.attn_tp  # SGLang's --tp-size of one replica
        frac = default_mem_fraction_static(kind["mib"], server_tp,
                                           prefill_graph_buckets=0 if shapes.mla else 58, mla=shapes.mla,
                                           dp_attention_dp=c.dp if c.technique == "dp_attention" else 0)
        row = {"name": c.name, "technique": c.technique, "variant": c.variant, "dp": c.dp, "tp": c.tp, "sp": c.sp,
               "mem_fraction_static": frac}
        rows.append(row)
        clocks, missing, calibratable = {}, [], False
        for role, shard in shard_roles(c, shapes).items():
            sig = shard_signature(hf, shard)
            found = find_calibration(sig, kind["name"], calibration_dirs)
            if found is None:
                why = unservable(hf, shard)
                calibratable |= why is None
                missing.append(f"'{sig}' ({why})" if why else
                               f"'{sig}' (--json-model-override-args '{json.dumps(shard.override_args(shapes))}')")
                continue
            clocks[role] = ShardClock(found[0].pipelined(host_ms), shapes.kv_bytes_per_token(shard_attn_tp(c, role), elt))
            row.setdefault("calibrations", {})[role] = str(found[1])
        model = (StepModel(c, shapes, clocks, ic, elt, int(context), default_decode_graph_max_bs(kind["mib"], server_tp))
                 if not missing else None)
        memory = {}
        if c.technique == "zerodp":
            none = c.kv_tokens(shapes, free, frac, elt, sink_offload=())["sink"]
            layers = model.choose_offload(none * shapes.kv_bytes_per_token(c.tp, elt)) if model else ()
            memory = {"sink_offload": layers}
        weights = c.weight_bytes_per_gpu(shapes, elt, **memory)
        kv = c.kv_tokens(shapes, free, frac, elt, **memory)
        row.update({"weights_gb_per_gpu": round(max(weights.values()) / 1e9, 2), "kv_tokens_total": kv["total"]})
        if missing:
            row["not_predicted"] = f"no calibration of the shard {' or '.join(missing)} on {kind['name']}" + (
                f": run python -m sgl_sidp.plan calibrate --model-path {model_path} --gpus {n_gpus}" if calibratable else "")
            continue
        if min(v for k, v in kv.items() if k != "total") <= 0:
            row["not_predicted"] = "the weights leave no KV cache"
            continue
        row["decisions"] = model.decisions()
        row["decode_step_ms"] = {str(ctx): {str(b): round(model.decode_ms(b, ctx), 3) for b in DECODE_BATCHES}
                                 for ctx in DECODE_CONTEXTS}
        row["prefill_ms"] = {str(t): round(model.prefill_ms([(t, 0)]), 2) for t in PREFILL_TOKENS}
        if decode_points:
            row["decode_at"] = [model.decode_ms(b, ctx) for b, ctx in decode_points]
        # a configuration whose replicas step as another's, with the same KV, has its schedule: simulated once
        twin = (c.technique, c.dp, c.tp, c.sp, model.steps_variant(), tuple(sorted(kv.items())))
        if twin not in simulated:
            replicas = [ReplicaSim(ReplicaLimits(kv_tokens=r.kv_tokens), r.times, log_tokens=bool(stream))
                        for r in model.replicas(kv)]
            reqs = [SimRequest(r.arrival_s, r.input_len, r.output_len, r.hash_ids, private_blocks=k)
                    for r, k in zip(requests, private(len(replicas)))]
            simulate(reqs, replicas)
            if stream:  # the replicas' tokens reach the clients through one tokenizer manager
                deliver(reqs, [rep.tokens_log for rep in replicas], stream)
            simulated[twin] = summarize(reqs)
        summary = dict(simulated[twin])
        for k in ("ttft_ms_p50", "ttft_ms_p99", "e2e_ms_p50", "e2e_ms_p99"):
            if k in summary:
                summary[k] += overhead
        row.update({k: round(v, 2) if isinstance(v, float) else v for k, v in summary.items()})
    vanilla = [r for r in rows if r["technique"] in ("vanilla", "dp_attention") and "total_tok_s" in r]
    best_vanilla = max(vanilla, key=lambda r: r["total_tok_s"], default=None)
    for r in rows:
        if best_vanilla and "total_tok_s" in r:
            r["ratio_to_best_vanilla"] = round(r["total_tok_s"] / best_vanilla["total_tok_s"], 3)
    ranked = rank(rows, objective)
    if not ranked:
        first = next((r["not_predicted"] for r in rows if "not_predicted" in r), "")
        raise PlanError(f"nothing to predict from: {first or 'no configuration is modelled'}")
    win = ranked[0]
    runner_up = next((r for r in ranked[1:]), None)
    if objective == "throughput":
        reason = (f"{win['name']}: the highest predicted throughput on {label} ({win['total_tok_s']:,.0f} tokens/s"
                  + (f", {win['total_tok_s'] / runner_up['total_tok_s']:.2f}x the next, {runner_up['name']}"
                     if runner_up else "") + ")")
    else:
        reason = (f"{win['name']}: the lowest predicted median E2E latency on {label} ({win['e2e_ms_p50']:,.1f} ms"
                  + (f", against {runner_up['e2e_ms_p50']:,.1f} ms for the next, {runner_up['name']}" if runner_up else "")
                  + f") among the configurations within {KEEPS_UP:.0%} of the best throughput")
    if best_vanilla and win is not best_vanilla:
        reason += f"; {win['ratio_to_best_vanilla']:.2f}x the throughput of the best vanilla configuration, {best_vanilla['name']}"
    return {"predicted": True, "model": model_path, "gpus": n_gpus, "gpu": kind["name"], "workload": label,
            "winner": win["name"], "reason": reason, "objective": objective,
            "launch": ["python", "-m", "sgl_sidp.launch_server", "--model-path", model_path, *launch_flags(win)],
            "configurations": rows,
            "memory_source": f"free memory before load: {kind['source']}; mem_fraction_static: SGLang's default",
            "request_overhead_ms": round(overhead, 2), "request_overhead_source": overhead_source,
            "stream_tokens_per_s": stream}


def shard_attn_tp(c, role: str) -> int:
    """The attention TP of the GPU that runs `role` of configuration `c` (its KV heads per token): the
    configuration's KV layout (`Configuration.attn_tp`), but TP_b for Shift's base shard, which is timed with
    TP_b's heads."""
    return c.tp if role == "base" else c.attn_tp


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
    lines += ["", f"Winner (predicted): {result['reason']}.", "Launch: " + " ".join(result["launch"])]
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
    """`python -m sgl_sidp.plan calibrate --model-path DIR --gpus N`: time every missing shard on this process's first
    visible GPU."""
    from sgl_sidp.peer.topology import gpu_capability, gpu_memory_bytes, gpu_name
    from sgl_sidp.plan.calibrate import calibrate

    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.plan calibrate",
                                 description="Time, on the first visible GPU (CUDA_VISIBLE_DEVICES), every shard the model's configurations on N "
                                 "GPUs need (SGLang with the shard's sizes and --overlay-calibrate), caching each in "
                                 "$SIDP_CALIBRATION_DIR.")
    ap.add_argument("--model-path", required=True, help="a folder with the model's config.json")
    ap.add_argument("--gpus", type=int, required=True, help="GPUs of the node to plan for")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="seconds one shard may take (default: 600)")
    ap.add_argument("--port", type=int, default=26500,
                    help="HTTP port of the shards' servers, and the --servers-ahead ports after it (default: 26500; "
                         "other ports for another calibration run side by side)")
    ap.add_argument("--timed-graphs-only", action=argparse.BooleanOptionalAction, default=True,
                    help="capture only the CUDA graphs the calibration times, 7 decode and 6 prefill sizes where SGLang "
                         "captures about 36 and 58 (default; a timed batch runs in a graph of its own size either way). "
                         "--no-timed-graphs-only: SGLang's default graphs, a slower start, and servers whose KV pool "
                         "is a default server's")
    ap.add_argument("--servers-ahead", type=int, default=2, metavar="N",
                    help="servers started while the current shard is measured, one after another, each waiting for the "
                         "GPU after its CPU start-up (default: 2; 0: each server starts after the one before it "
                         "stopped); they use --port, --port + 1, ... --port + N")
    a = ap.parse_args(argv)
    for flag, value, least in (("--gpus", a.gpus, 1), ("--servers-ahead", a.servers_ahead, 0)):
        if value < least:
            print(f"sgl-sidp plan calibrate: error: {flag} {value}: at least {least}", file=sys.stderr)
            raise SystemExit(2)
    name = gpu_name(0)
    if read_hf_config(a.model_path) is None or name is None:
        print(f"sgl-sidp plan calibrate: error: {'no CUDA GPU visible' if name is None else 'no config.json in ' + a.model_path}",
              file=sys.stderr)
        raise SystemExit(2)
    import signal

    # a SIGTERM (`timeout`, a job scheduler) must stop the shard's server too: as an exception, `calibrate`'s
    # clean-up runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = calibrate(a.model_path, a.gpus, name, port=a.port, timeout_s=a.timeout_s, gpu_bytes=gpu_memory_bytes(0),
                        timed_graphs_only=a.timed_graphs_only, ahead=a.servers_ahead, jit_capability=gpu_capability(0))
    for sig, what in results.items():
        print(f"{sig}: {what}")
    raise SystemExit(0 if all(not w.startswith("failed") for w in results.values()) else 1)


def measure_comm_main(argv: list[str]) -> None:
    """`python -m sgl_sidp.plan measure-comm --gpus N [--model-path DIR]`: time the collectives on this node's GPUs
    and write the interconnect table `plan` then reads for this GPU kind (in place of the bundled one)."""
    from sgl_sidp.peer.topology import gpu_name, visible_gpu_count
    from sgl_sidp.plan.calibrate import forward_all_reduce, tp_shard_calibrations
    from sgl_sidp.plan.comm import InterconnectError, gpu_kind, measure_table, measured_dir

    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.plan measure-comm",
                                 description="Time all-reduce, all-gather, reduce-scatter, all-to-all and broadcast "
                                 "over 2, 4, 8... of this node's GPUs (NCCL in a CUDA graph) and one GPU pair's peer "
                                 "copy, fit each as latency + bytes / bus bandwidth, and write the table the planner "
                                 "reads for this GPU kind. With --model-path, the all-reduce is measured inside "
                                 "SGLang's own TP forwards instead (its custom all-reduce is faster than NCCL at "
                                 "decode sizes).")
    ap.add_argument("--gpus", type=int, required=True, help="GPUs to use, from GPU 0 (at least 2)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the table's file (default: <kind>.json in the calibration cache's interconnect folder, "
                    "where plan looks first)")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                    help="nccl: the GPUs (default); gloo: CPU processes, to check the code path without GPUs")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per size (default: 20)")
    ap.add_argument("--model-path", default=None,
                    help="a model whose TP shards are calibrated (python -m sgl_sidp.plan calibrate): serve it at TP "
                    "2, 4, ... on these GPUs and take the all-reduce from its forwards less its shards' (a server "
                    "start per TP size)")
    a = ap.parse_args(argv)
    name = gpu_name(0) if a.backend == "nccl" else "CPU (gloo)"
    visible = visible_gpu_count() or 0
    problem = ("--gpus must be at least 2" if a.gpus < 2 else
               f"--gpus {a.gpus}: {visible} CUDA GPU(s) visible" if a.backend == "nccl" and a.gpus > visible else
               "--model-path needs --backend nccl" if a.model_path and a.backend != "nccl" else
               f"--model-path {a.model_path}: no config.json there" if a.model_path and read_hf_config(a.model_path) is None
               else "")
    shards = {}
    try:
        if not problem and a.model_path:
            shards = tp_shard_calibrations(a.model_path, a.gpus, name)
    except InterconnectError as e:
        problem = str(e)
    if problem:
        print(f"sgl-sidp plan measure-comm: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    try:
        table = measure_table(a.gpus, name, a.backend, iters=a.iters)
    except InterconnectError as e:
        print(f"sgl-sidp plan measure-comm: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    if shards:
        for n, link in forward_all_reduce(a.model_path, shards, name).items():
            table["links"]["all_reduce"][n] = link
    out = a.out or measured_dir() / f"{gpu_kind(name)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1))
    print(json.dumps(table["links"], indent=1))
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["calibrate"]:
        return calibrate_main(argv[1:])
    if argv[:1] == ["measure-comm"]:
        return measure_comm_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.plan", description=__doc__.split("\n\n")[0],
                                 epilog="python -m sgl_sidp.plan calibrate --model-path DIR --gpus N: time the shards "
                                 "on this host's GPU first. python -m sgl_sidp.plan measure-comm --gpus N: measure "
                                 "the interconnect table on a node of N GPUs.")
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
