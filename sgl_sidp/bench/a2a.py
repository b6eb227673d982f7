"""How long Shift's two all-to-alls per decoder layer take on P GPUs of one node: NCCL against copies into the
peers' memory.

Shift's base configuration (`sgl_sidp.shift.ulysses`) exchanges per layer [P, n, c] blocks of n = T / P tokens: the
QKV blocks (c = the shift shard's QKV width) and the attention output back (c = its heads' width); block q goes to
GPU q. The server sends them with NCCL by default (SGLang's pynccl `all_to_all_single`), whose kernels move the
data on the SMs, the block a GPU keeps for itself included. The other way timed here is
`sgl_sidp.peer.exchange.SymmetricExchange`'s: every GPU writes each block straight into its owner's
receive buffer of a torch symmetric-memory allocation (a device-to-device `cudaMemcpyAsync`, over NVLink to a peer,
by the copy engines), then a barrier on the symmetric memory's signal pads. On 2 x H100 the
peer copy ran 382 GB/s (`plan measure-comm`) against NCCL's all-to-all at 259 GB/s bus bandwidth, and the profiled
all-to-alls cost 8.0 ms of a 115 ms Qwen3-8B prefill forward of 8,192 tokens (`benchmarks/results/multi_gpu/
q8_shift_blocks_2gpu_h100`). Measured on 2 and 4 x H100 (`a2a_shift_2gpu_h100`): the copies took 0.88-0.94x NCCL's
time at SP2 and 8,192-16,384 tokens, 1.1-1.6x at SP4, so the server keeps NCCL (a server path by copies was built
and removed again; it is in git history at d214cf4).

    python -m sgl_sidp.bench.a2a --model-path DIR [--tokens 2048,8192] [--gpus 2] [--layer]

`--layer` also times one layer's QKV and O GEMMs with their exchanges three ways: the GEMMs alone, NCCL's
all-to-alls after and before them (the server's path), and the copies hidden behind them (the peers' blocks first,
put while the GPU computes its own: `sgl_sidp.shift.ulysses.heads_exchanged`, `tokens_exchanged_gemm`). Launched
eagerly, a layer below about 4,096 tokens is bound by the host's launches (the copies lost at 2,048 tokens on 2 x
H200 where the servers' GPU timings had them win), so the GEMMs alone and the copies are also timed as replays of one
CUDA graph, as SGLang's prefill graphs run them.

Each method's exchange is checked against the blocks sent before it is timed (CUDA events, `--iters` rounds of one
layer's two exchanges after `--warmup`). Without CUDA it runs NCCL's part on gloo over CPU processes (a check of the
exchange, not a timing) and says that the copies need GPUs.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

METHODS = ("nccl", "copy")
#: one layer's QKV and O GEMMs with their exchanges: the GEMMs alone (no exchange: the floor), NCCL's all-to-alls
#: after and before them (the server's default), the copies hidden behind them (`ulysses.heads_exchanged`,
#: `tokens_exchanged_gemm`)
LAYER_METHODS = ("gemms", "nccl", "overlap")


def block_widths(cfg: dict, p: int) -> tuple[int, int]:
    """(QKV block width, attention-output block width) per token of a shift shard, from a dense config.json; KV heads
    fewer than P are replicated as SGLang replicates them.

    Raises:
        ValueError: the query heads do not split over P.
    """
    from sgl_sidp.calibration.memory import ModelShapes

    s = ModelShapes.of(cfg)
    if s.heads % p:
        raise ValueError(f"{s.heads} attention heads do not split over {p} GPUs")
    return s.qkv_width(p), s.heads // p * s.head_dim


def _exchange_nccl(sends, recvs):
    for send, recv in zip(sends, recvs):
        dist.all_to_all_single(recv.view(-1), send.view(-1))


def _layer_rows(rank: int, p: int, tokens: int, widths, hidden: int, device, dtype, warmup: int, iters: int) -> dict:
    """`LAYER_METHODS` timed on one layer of `tokens` (ms per layer), each checked against NCCL's results (the QKV
    bits equal, the O output within bf16 rounding of the blocks' other order)."""
    from sgl_sidp.shift import ulysses

    cq, co = widths
    n, g = tokens // p, torch.Generator(device).manual_seed(0)  # the same weights on every GPU
    w_qkv = torch.randn(p * cq, hidden, generator=g, device=device, dtype=dtype) / hidden ** 0.5
    w_o = torch.randn(hidden, p * co, generator=g, device=device, dtype=dtype) / (p * co) ** 0.5
    x = torch.randn(n, hidden, device=device, dtype=dtype)
    o = torch.randn(tokens, co, device=device, dtype=dtype)
    comm = ulysses.TorchComm()
    runs = {"gemms": lambda: (ulysses.column_blocks(x, w_qkv, None, p),
                              ulysses.row_blocks_gemm(o.view(p, n, co), w_o)),
            "nccl": lambda: (ulysses.heads_all_to_all(ulysses.column_blocks(x, w_qkv, None, p), tokens, comm),
                             ulysses.row_blocks_gemm(ulysses.tokens_all_to_all(o, p, comm), w_o))}
    rows = {}
    if device == "cuda":
        from sgl_sidp.peer.exchange import ExchangeError, SymmetricExchange

        try:
            ex = SymmetricExchange(dist.group.WORLD, rank, p, p * n * max(cq, co), dtype, device)
            runs["overlap"] = lambda: (ulysses.heads_exchanged(x, w_qkv, None, tokens, ex),
                                       ulysses.tokens_exchanged_gemm(o, w_o, ex))
        except ExchangeError as e:
            rows["overlap"] = {"ok": False, "ms": None, "error": str(e)[:200]}
    else:
        rows["overlap"] = None
    want = [t.clone() for t in runs["nccl"]()]
    for m, run in runs.items():
        got = run()
        ok = m == "gemms" or (torch.equal(got[0], want[0]) and torch.allclose(got[1].float(), want[1].float(),
                                                                               rtol=2e-2, atol=2e-2))
        rows[m] = {"ok": ok, "ms": _time(run, warmup, iters, device == "cuda") if ok else None}
        if ok and device == "cuda" and m in GRAPHED:
            rows[m]["graph_ms"], rows[m]["graph_error"] = _graph_ms(run, warmup, iters)
    return rows


#: the methods also timed as one CUDA graph's replay (as SGLang's breakable prefill graphs replay a layer: no host
#: launch between kernels); NCCL's all-to-alls here are torch.distributed's, which the server does not capture (it
#: captures SGLang's pynccl), so they are timed eagerly alone
GRAPHED = ("gemms", "overlap")


def _graph_ms(run, warmup: int, iters: int) -> tuple[float | None, str | None]:
    """(ms per replay of `run` captured once in a CUDA graph on a side stream, None) or (None, why) where the capture
    failed on any GPU of the group (then none replays: a replayed barrier would wait for the others)."""
    graph, failed = torch.cuda.CUDAGraph(), None
    try:
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            run()
    except Exception as e:  # noqa: BLE001 - whatever the capture raises, named in the table
        failed = f"{type(e).__name__}: {e}"[:160]
    flag = torch.tensor([0.0 if failed is None else 1.0], device="cuda")
    dist.all_reduce(flag)
    if flag.item():
        return None, failed or "the capture failed on another GPU"
    return _time(graph.replay, warmup, iters, True), None


def _rank(rank: int, p: int, port: int, shapes, warmup: int, iters: int, out: dict) -> None:
    cuda = torch.cuda.is_available()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=p)
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    try:
        for tokens, widths, hidden in shapes:
            n = tokens // p
            sends = [torch.randn(p, n, c, dtype=dtype, device=device) + rank for c in widths]
            rows = {}
            for method in METHODS:
                if method == "copy" and not cuda:
                    rows[method] = None
                    continue
                if method == "nccl":
                    recvs = [torch.empty_like(s) for s in sends]
                    run = lambda: _exchange_nccl(sends, recvs)  # noqa: E731
                else:
                    from sgl_sidp.peer.exchange import ExchangeError, SymmetricExchange

                    try:
                        ex = SymmetricExchange(dist.group.WORLD, rank, p, max(s.numel() for s in sends), dtype, device)
                    except ExchangeError as e:  # a host without P2P symmetric memory: say so, time NCCL
                        rows[method] = {"ok": False, "ms": None, "error": str(e)[:200]}
                        continue
                    recvs = [None] * len(sends)

                    def run(ex=ex, recvs=recvs):  # the server's path: slot 0 the QKV blocks, slot 1 the output
                        recvs[:] = [ex.exchange(s, i % 2) for i, s in enumerate(sends)]
                run()
                # every block q of recv came from GPU q's send[rank] (sends are randn + sender's rank)
                gathered = [torch.empty_like(s) for s in sends for _ in range(p)]
                for i, s in enumerate(sends):
                    dist.all_gather(gathered[i * p:(i + 1) * p], s)
                ok = all(torch.equal(recvs[i][q], gathered[i * p + q][rank]) for i in range(len(sends)) for q in range(p))
                rows[method] = {"ok": ok, "ms": _time(run, warmup, iters, cuda) if ok else None}
            out_row = {"tokens": tokens, "widths": list(widths), "peer_bytes": sum(
                (p - 1) * n * c * sends[0].element_size() for c in widths), **{m: rows[m] for m in METHODS}}
            if hidden:
                out_row["layer"] = _layer_rows(rank, p, tokens, widths, hidden, device, dtype, warmup, iters)
            if rank == 0:
                out[tokens] = out_row
    finally:
        dist.barrier()
        dist.destroy_process_group()


def _time(run, warmup: int, iters: int, cuda: bool) -> float:
    """ms per `run()` (`bench.gemm.time_ms`), the GPUs of the group lined up by a barrier after the warmup."""
    from sgl_sidp.bench.gemm import time_ms

    for _ in range(warmup):
        run()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    return time_ms([run], 0, iters, cuda)


def _spawned(rank, p, port, shapes, warmup, iters, queue):
    out: dict = {}
    _rank(rank, p, port, shapes, warmup, iters, out)
    if rank == 0:
        queue.put(out)


def measure(cfg: dict, tokens_list, p: int, warmup: int = 3, iters: int = 20, layer: bool = False) -> list[dict]:
    """One row per forward size: each method's check ("ok") and ms per layer (its two exchanges), None where it did
    not run, and the bytes each GPU sends to its peers per layer; with `layer`, also "layer": `LAYER_METHODS`' rows
    (the QKV and O GEMMs of a layer with their exchanges)."""
    import torch.multiprocessing as mp

    from sgl_sidp.bench.batches import free_port

    widths, hidden = block_widths(cfg, p), int(cfg["hidden_size"]) if layer else 0  # hidden 0: no layer rows
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_spawned, args=(p, free_port(), [(t, widths, hidden) for t in tokens_list], warmup, iters, queue),
                       nprocs=p, start_method="spawn")
    got = queue.get()
    return [got[t] for t in tokens_list]


def table(rows: list[dict], layers: int) -> str:
    """Markdown of `measure`'s rows: ms per layer and per forward of `layers` layers, GB/s to the peers."""
    lines = ["| forward tokens | method | exchange checked | ms per layer (2 all-to-alls) | ms per forward | GB/s to "
             "the peers, per GPU |", "|---:|---|---|---:|---:|---:|"]
    for r in rows:
        for m in METHODS:
            v = r[m]
            if v is None:
                lines.append(f"| {r['tokens']:,} | {m} | not run (needs CUDA) | - | - | - |")
                continue
            ms = v["ms"]
            if v.get("error"):
                lines.append(f"| {r['tokens']:,} | {m} | not run: {v['error']} | - | - | - |")
                continue
            lines.append(f"| {r['tokens']:,} | {m} | {'yes' if v['ok'] else 'WRONG'} | "
                         + ("- | - | - |" if ms is None else
                            f"{ms:.3f} | {ms * layers:.2f} | {r['peer_bytes'] / ms / 1e6:.0f} |"))
    return "\n".join(lines)


def layer_table(rows: list[dict], layers: int) -> str:
    """Markdown of `measure(layer=True)`'s "layer" rows: ms per layer and per forward, and what the exchanges add
    over the GEMMs alone."""
    lines = ["| forward tokens | method | checked against nccl | ms per layer (QKV and O GEMMs, 2 exchanges) | ms per "
             "forward | over the GEMMs alone, ms per forward | the same replayed from a CUDA graph: ms per forward, "
             "over the GEMMs alone |", "|---:|---|---|---:|---:|---:|---|"]
    for r in rows:
        floor = (r["layer"].get("gemms") or {}).get("ms")
        graph_floor = (r["layer"].get("gemms") or {}).get("graph_ms")
        for m in LAYER_METHODS:
            v = r["layer"].get(m)
            if v is None or v.get("error"):
                why = "needs CUDA" if v is None else v["error"]
                lines.append(f"| {r['tokens']:,} | {m} | not run ({why}) | - | - | - | - |")
                continue
            ms, gms = v["ms"], v.get("graph_ms")
            over = "-" if ms is None or floor is None else f"{(ms - floor) * layers:+.2f}"
            graphed = (f"{gms * layers:.2f}, " + ("-" if graph_floor is None else f"{(gms - graph_floor) * layers:+.2f}")
                       if gms is not None else f"not captured ({v['graph_error']})" if v.get("graph_error") else "-")
            lines.append(f"| {r['tokens']:,} | {m} | {'yes' if v['ok'] else 'WRONG'} | "
                         + ("- | - |" if ms is None else f"{ms:.3f} | {ms * layers:.2f} |") + f" {over} | {graphed} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from sgl_sidp.bench.gemm import layer_case, layer_cli

    ap = layer_cli("python -m sgl_sidp.bench.a2a", __doc__, "2048,4096,8192", "P, the GPUs of the SP group")
    ap.add_argument("--layer", action="store_true", help="also time one layer's QKV and O GEMMs with their exchanges: "
                    "alone, after and before NCCL's all-to-alls, and with the copies hidden behind them")
    a = ap.parse_args(argv)
    try:
        cfg, tokens = layer_case(a, 2)
        block_widths(cfg, a.gpus)
        if torch.cuda.is_available() and torch.cuda.device_count() < a.gpus:
            raise ValueError(f"--gpus {a.gpus}: this host has {torch.cuda.device_count()} GPUs")
    except (OSError, KeyError, ValueError) as e:
        print(f"bench.a2a: error: {e}")
        return 2
    gpu = (f"{a.gpus} x {torch.cuda.get_device_name()}" if torch.cuda.is_available()
           else f"{a.gpus} CPU processes on gloo (a check, not a timing)")
    print(f"{Path(a.model_path).name}: Shift's two all-to-alls per layer on {gpu}\n")
    rows = measure(cfg, tokens, a.gpus, a.warmup, a.iters, a.layer)
    print(table(rows, int(cfg["num_hidden_layers"])))
    if a.layer:
        print(f"\nThe QKV and O GEMMs of one layer with their exchanges (ms per forward: {cfg['num_hidden_layers']} "
              "layers)\n")
        print(layer_table(rows, int(cfg["num_hidden_layers"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
