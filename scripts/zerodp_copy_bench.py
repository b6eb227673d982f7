"""Fetch side of ZeroDP's fetch-vs-compute table: how fast a sink pulls one MoE layer's experts.

Runs the real transport (`sgl_sidp.peer.vmm`): a source process on GPU `--source-gpu`
re-homes `--layers` layers of Qwen3-30B-A3B-shaped expert tensors (w13 [128, 1536, 2048] and
w2 [128, 2048, 768], bf16, each layer filled with its own value) into VMM memory and serves them;
sink processes on the other GPUs import them, check every layer's contents (so a wrong mapping
shows), and time the pulls:

1. peer-copy peak: `torch` cross-device copy GPU source -> GPU sink in one process (copy engine);
2. one sink alone: pulling one layer (w13 + w2, 1.21 GB) into a slot, eager and inside a CUDA
   graph (side-stream fork/join, the way decode graphs capture it);
3. egress: 1, 2, ... sinks pulling from the one source at the same time (per-sink and total GB/s),
   which says how many sinks a source can feed before its links are the limit.

GB/s are 1e9 bytes per second. Writes `--out` (JSON) and prints a Markdown table.

    python scripts/zerodp_copy_bench.py --source-gpu 0 --sink-gpus 1,2,3 --out copy_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.multiprocessing as mp

W13 = (128, 1536, 2048)
W2 = (128, 2048, 768)


def _fill(layer: int, name: str) -> float:
    return float(layer + 1) + (0.5 if name == "w2_weight" else 0.0)


def source_main(gpu: int, layers: int, address: str, ready, stop) -> None:
    from sgl_sidp.peer.manifest import TensorSpec
    from sgl_sidp.peer.vmm import TensorExporter

    torch.cuda.set_device(gpu)
    params = {}
    for lid in range(layers):
        for name, shape in (("w13_weight", W13), ("w2_weight", W2)):
            p = torch.nn.Parameter(torch.full(shape, _fill(lid, name), dtype=torch.bfloat16, device=f"cuda:{gpu}"), requires_grad=False)
            params[TensorSpec(lid, name, shape, str(p.dtype), p.numel() * 2)] = p
    TensorExporter(params, gpu, address)
    ready.set()
    stop.wait()


def _time_ms(fn, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def sink_main(gpu: int, layers: int, address: str, barrier, results, concurrent_s: float) -> None:
    from sgl_sidp.peer.vmm import TensorImporter

    torch.cuda.set_device(gpu)
    imp = TensorImporter(address, gpu, 120, "bench source")
    remote = imp.map([t.key for t in imp.entries])
    # every layer's contents are what the source wrote (a wrong mapping would show here)
    for (lid, name), t in remote.items():
        v = t.view(-1)[:: 1 << 16].float()
        assert torch.all(v == _fill(lid, name)), f"layer {lid} {name}: wrong contents"
    slot = {n: torch.empty(s, dtype=torch.bfloat16, device=f"cuda:{gpu}") for n, s in (("w13_weight", W13), ("w2_weight", W2))}
    nbytes = sum(x.numel() * 2 for x in slot.values())
    side = torch.cuda.Stream()

    def pull(lid: int):
        with torch.cuda.stream(side):
            for n in slot:
                slot[n].copy_(remote[(lid, n)], non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)

    out = {"gpu": gpu, "layer_bytes": nbytes}
    out["eager_ms"] = _time_ms(lambda: pull(1 % layers), 10)
    # the same pull captured in a CUDA graph (fork/join through events, as in a decode graph)
    g = torch.cuda.CUDAGraph()
    fork, join = torch.cuda.Event(), torch.cuda.Event()
    cap = torch.cuda.Stream()
    with torch.cuda.stream(cap):
        torch.cuda.synchronize()
        g.capture_begin()
        fork.record(cap)
        side.wait_event(fork)
        with torch.cuda.stream(side):
            for n in slot:
                slot[n].copy_(remote[(layers - 1, n)], non_blocking=True)
        join.record(side)
        cap.wait_event(join)
        g.capture_end()
    for n in slot:
        slot[n].zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.all(slot["w13_weight"].view(-1)[::4096] == _fill(layers - 1, "w13_weight")), "graph replay pulled wrong data"
    out["graph_ms"] = _time_ms(g.replay, 10)
    # egress: all sinks pull at once for concurrent_s seconds
    barrier.wait()
    torch.cuda.synchronize()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < concurrent_s:
        pull(n % layers)
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    out["concurrent_gbps"] = n * nbytes / (time.perf_counter() - t0) / 1e9
    results.put(out)


def peak_peer_copy_gbps(src_gpu: int, dst_gpu: int) -> float:
    """torch cross-device copy of 1.21 GB (what SGLang-free code gets from the copy engine)."""
    a = torch.empty(605 * 1024 * 1024, dtype=torch.bfloat16, device=f"cuda:{src_gpu}")
    b = torch.empty_like(a, device=f"cuda:{dst_gpu}")
    with torch.cuda.device(dst_gpu):
        ms = _time_ms(lambda: b.copy_(a, non_blocking=True), 10)
    gbps = a.numel() * 2 / (ms * 1e-3) / 1e9
    del a, b
    torch.cuda.empty_cache()
    return gbps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source-gpu", type=int, default=0, help="GPU of the source process (default: %(default)s)")
    ap.add_argument("--sink-gpus", default="1", help="comma-separated GPUs of the sink processes (default: %(default)s)")
    ap.add_argument("--layers", type=int, default=4, help="MoE layers the source serves (default: %(default)s)")
    ap.add_argument("--concurrent-s", type=float, default=1.0,
                    help="seconds each egress round's sinks pull at the same time (default: %(default)s)")
    ap.add_argument("--out", default="copy_bench.json", help="JSON file of the results (default: %(default)s)")
    args = ap.parse_args()
    sinks = [int(x) for x in args.sink_gpus.split(",")]
    ctx = mp.get_context("spawn")
    address = f"\0sgl-sidp-zerodp-bench.{os.getpid()}"
    ready, stop = ctx.Event(), ctx.Event()
    src = ctx.Process(target=source_main, args=(args.source_gpu, args.layers, address, ready, stop))
    src.start()
    peaks = {g: peak_peer_copy_gbps(args.source_gpu, g) for g in sinks}
    if not ready.wait(180):
        raise SystemExit("source did not start")
    report = {"peer_copy_peak_gbps": peaks, "rounds": []}
    for k in range(1, len(sinks) + 1):
        barrier, results = ctx.Barrier(k), ctx.Queue()
        procs = [ctx.Process(target=sink_main, args=(g, args.layers, address, barrier, results, args.concurrent_s)) for g in sinks[:k]]
        for p in procs:
            p.start()
        rows = [results.get(timeout=300) for _ in procs]
        for p in procs:
            p.join()
        report["rounds"].append({"sinks": k, "per_sink": rows, "total_gbps": sum(r["concurrent_gbps"] for r in rows)})
    stop.set()
    src.join()
    one = report["rounds"][0]["per_sink"][0]
    lines = [
        f"| what | value |",
        f"|---|---|",
        f"| peer-copy peak, torch cross-device copy (GB/s) | " + ", ".join(f"GPU{args.source_gpu}->GPU{g}: {v:.0f}" for g, v in peaks.items()) + " |",
        f"| one layer (w13+w2, {one['layer_bytes'] / 1e9:.2f} GB), eager pull | {one['eager_ms']:.2f} ms = {one['layer_bytes'] / one['eager_ms'] / 1e6:.0f} GB/s |",
        f"| one layer, pull inside a CUDA graph | {one['graph_ms']:.2f} ms = {one['layer_bytes'] / one['graph_ms'] / 1e6:.0f} GB/s |",
    ]
    for r in report["rounds"]:
        per = ", ".join(f"{x['concurrent_gbps']:.0f}" for x in r["per_sink"])
        lines.append(f"| {r['sinks']} sink(s) pulling at once from GPU{args.source_gpu}: per sink / total GB/s | {per} / {r['total_gbps']:.0f} |")
    report["table_md"] = "\n".join(lines)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(report["table_md"], flush=True)


if __name__ == "__main__":
    main()
