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

    python -m sgl_sidp.bench.a2a --model-path DIR [--tokens 2048,8192] [--gpus 2]

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


def _rank(rank: int, p: int, port: int, shapes, warmup: int, iters: int, out: dict) -> None:
    cuda = torch.cuda.is_available()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=p)
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    try:
        for tokens, widths in shapes:
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


def measure(cfg: dict, tokens_list, p: int, warmup: int = 3, iters: int = 20) -> list[dict]:
    """One row per forward size: each method's check ("ok") and ms per layer (its two exchanges), None where it did
    not run, and the bytes each GPU sends to its peers per layer."""
    import torch.multiprocessing as mp

    from sgl_sidp.bench.batches import free_port

    widths = block_widths(cfg, p)
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_spawned, args=(p, free_port(), [(t, widths) for t in tokens_list], warmup, iters, queue),
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


def main(argv=None) -> int:
    from sgl_sidp.bench.gemm import layer_case, layer_cli

    a = layer_cli("python -m sgl_sidp.bench.a2a", __doc__, "2048,4096,8192", "P, the GPUs of the SP group").parse_args(argv)
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
    print(table(measure(cfg, tokens, a.gpus, a.warmup, a.iters), int(cfg["num_hidden_layers"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
