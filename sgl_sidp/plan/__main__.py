"""Which configuration of a model serves a workload best on N GPUs of one node: every one predicted from one-GPU calibrations.

    python -m sgl_sidp.plan --model-path DIR --gpus N [--gpu H200] [--workload offline:512:2048:256] [--json]
                            [--chunked-prefill-size T] [--mem-fraction-static F] [--cuda-graph-max-bs-decode BS] ...
    python -m sgl_sidp.plan calibrate --model-path DIR --gpus N      # on this host's GPUs: time the shards it needs
    python -m sgl_sidp.plan measure-comm --gpus N [--model-path DIR] # on the node: measure the interconnect table

Prints one row per configuration (vanilla TP x DP, DP attention, ZeroDP, SiDP, Shift): weights and KV tokens per GPU
(SGLang's own memory accounting), and, where its shards are calibrated, throughput and TTFT/TPOT p50/p99 from a
simulation of SGLang's scheduler on the workload, then the winner, why, and the command that starts it. Every
number is a prediction; for a number of GPUs no measured node has (`planner.MEASURED_GPU_COUNTS`), a line under the
title (and `extrapolation` in `--json`) says the plan is an extrapolation. Workloads: `offline:S:IN:OUT` (S
requests of IN prompt and OUT output tokens, all at once), `latency:IN:OUT` (one request), `trace:FILE[:SCALE]` (an
Azure CSV or Mooncake JSONL trace; SCALE > 1 spreads arrivals out). Bad input: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sgl_sidp.model_info import read_hf_config
from sgl_sidp.plan.planner import PlanError, plan, table, write_png
from sgl_sidp.plan.server_flags import ServerFlags, ServerFlagsError
from sgl_sidp.plan.steps import GPUS


def calibrate_main(argv: list[str]) -> None:
    """`python -m sgl_sidp.plan calibrate --model-path DIR --gpus N`: time every missing shard on this host's visible
    GPUs, each GPU its share of the shards at the same time."""
    from sgl_sidp.peer.topology import gpu_capability, gpu_memory_bytes, gpu_name, visible_gpu_count
    from sgl_sidp.plan.calibrate import calibrate

    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.plan calibrate",
                                 description="Time every shard the model's configurations on N GPUs need (SGLang with "
                                 "the shard's sizes and --overlay-calibrate), one shard per GPU at a time on each of "
                                 "this host's visible GPUs at once, caching each in $SIDP_CALIBRATION_DIR.")
    ap.add_argument("--model-path", required=True, help="a folder with the model's config.json")
    ap.add_argument("--gpus", required=True, metavar="N[,N...]",
                    help="GPUs of the node to plan for, or several node sizes (2,4: the shards of both)")
    ap.add_argument("--on-gpus", type=int, default=None, metavar="K",
                    help="time shards on the first K visible GPUs of this host, one shard per GPU at a time (default: "
                         "every visible GPU; they must be of one kind)")
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

    def refuse(why: str):
        print(f"sgl-sidp plan calibrate: error: {why}", file=sys.stderr)
        raise SystemExit(2)

    try:
        sizes = [int(n) for n in a.gpus.split(",")]
    except ValueError:
        refuse(f"--gpus {a.gpus}: expected N or N,N,... (whole numbers)")
    for flag, value, least in (("--gpus", min(sizes), 1), ("--servers-ahead", a.servers_ahead, 0),
                               ("--on-gpus", 1 if a.on_gpus is None else a.on_gpus, 1)):
        if value < least:
            refuse(f"{flag} {value}: at least {least}")
    name = gpu_name(0)
    if name is None:
        refuse("no CUDA GPU visible")
    if read_hf_config(a.model_path) is None:
        refuse(f"no config.json in {a.model_path}")
    visible = visible_gpu_count() or 1
    if a.on_gpus is not None and a.on_gpus > visible:
        refuse(f"--on-gpus {a.on_gpus}: {visible} GPU(s) visible")
    on = a.on_gpus or visible
    kinds = {gpu_name(i) for i in range(on)}
    if len(kinds) > 1:
        refuse(f"the visible GPUs are of several kinds ({', '.join(sorted(map(str, kinds)))}): set CUDA_VISIBLE_DEVICES "
               "or --on-gpus to GPUs of one kind")
    ids = [str(i) for i in range(on)]  # as this process numbers them (`bench.server.visible_gpus`)
    import signal

    # a SIGTERM (`timeout`, a job scheduler) must stop the shard's server too: as an exception, `calibrate`'s
    # clean-up runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = calibrate(a.model_path, sizes, name, port=a.port, timeout_s=a.timeout_s, gpu_bytes=gpu_memory_bytes(0),
                        timed_graphs_only=a.timed_graphs_only, ahead=a.servers_ahead, jit_capability=gpu_capability(0),
                        gpus=ids)
    for sig, what in results.items():
        print(f"{sig}: {what}")
    raise SystemExit(0 if all(not w.startswith("failed") for w in results.values()) else 1)


def measure_comm_main(argv: list[str]) -> None:
    """`python -m sgl_sidp.plan measure-comm --gpus N [--model-path DIR]`: time the collectives on this node's GPUs
    and write the interconnect table `plan` then reads for this GPU kind (in place of the bundled one)."""
    from sgl_sidp.peer.topology import gpu_name, visible_gpu_count
    from sgl_sidp.plan.calibrate import forward_all_reduce, tp_shard_calibrations
    from sgl_sidp.calibration.table import gpu_kind
    from sgl_sidp.plan.comm import InterconnectError, measure_table, measured_dir

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
    """`python -m sgl_sidp.plan` (`argv`: its arguments, default `sys.argv[1:]`): the table, or `--json`, of `plan` on
    stdout; `calibrate` and `measure-comm` go to `calibrate_main` and `measure_comm_main`. Bad input: one line on
    stderr and `SystemExit(2)`."""
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
    ap.add_argument("--slo-ttft-ms", type=float, default=None, metavar="MS",
                    help="with --slo-tpot-ms: rank by goodput, the requests per second that meet both SLOs")
    ap.add_argument("--slo-tpot-ms", type=float, default=None, metavar="MS", help="see --slo-ttft-ms")
    ap.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    ap.add_argument("--png", type=Path, default=None, help="also write a PNG of the predicted configurations here")
    sglang = ap.add_argument_group("SGLang flags the servers will be started with (default: SGLang's, per "
                                   "configuration)")
    sglang.add_argument("--chunked-prefill-size", type=int, default=None, metavar="TOKENS")
    sglang.add_argument("--max-prefill-tokens", type=int, default=None, metavar="TOKENS")
    sglang.add_argument("--mem-fraction-static", type=float, default=None, metavar="F")
    sglang.add_argument("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs", dest="cuda_graph_max_bs_decode", type=int,
                        default=None, metavar="BS", help="the largest decode batch in a CUDA graph; larger run eagerly")
    sglang.add_argument("--disable-cuda-graph", action="store_true", help="no CUDA graphs: every decode step eager")
    sglang.add_argument("--disable-decode-cuda-graph", action="store_true", help="every decode step eager")
    sglang.add_argument("--disable-prefill-cuda-graph", action="store_true", help="no prefill graphs")
    a = ap.parse_args(argv)
    try:
        if a.gpus < 1:
            raise PlanError(f"--gpus {a.gpus}: at least 1")
        if (a.slo_ttft_ms is None) != (a.slo_tpot_ms is None):
            raise PlanError("--slo-ttft-ms and --slo-tpot-ms go together: give both or neither")
        slo = (a.slo_ttft_ms, a.slo_tpot_ms) if a.slo_ttft_ms is not None else None
        try:
            server = ServerFlags.from_namespace(a)
        except ServerFlagsError as e:
            raise PlanError(str(e)) from None
        result = plan(a.model_path, a.gpus, a.gpu, a.workload, slo=slo, server=server)
    except PlanError as e:
        print(f"sgl-sidp plan: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if a.png:
        write_png(result, a.png)
    if a.json:  # the rows as JSON objects (`PlanRow.as_dict`)
        print(json.dumps({**result, "configurations": [r.as_dict() for r in result["configurations"]]}, indent=1))
    else:
        print(table(result), end="")


if __name__ == "__main__":
    main()
