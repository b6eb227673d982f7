"""The interconnect: how long a collective or a peer copy takes, latency + bytes / bandwidth, by GPU count.

A table per GPU kind (`interconnect/<kind>.json`, bundled) gives, for each operation and GPU count, a latency (us), a
bus bandwidth (GB/s, nccl-tests' `busbw`) and where the numbers come from; every entry says whether it was measured
(where) or assumed. `plan measure-comm` on a multi-GPU node times SGLang-sized collectives with `torch.distributed`
(NCCL there; gloo in the CPU tests) and writes such a table (`measure`, `fit`).

Bus bandwidth is converted to what one call moves (algorithm bandwidth) with nccl-tests' factors (`BUS_FACTOR`, see
NVIDIA/nccl-tests doc/PERFORMANCE.md): all-reduce 2(n-1)/n, all-gather, reduce-scatter and all-to-all (n-1)/n,
broadcast and a peer copy 1.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

from sgl_sidp.calibration.table import gpu_kind

TABLE_DIR = Path(__file__).resolve().parent / "interconnect"
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "peer_copy")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor of `op` over `n` GPUs."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


class InterconnectError(ValueError):
    """The table lacks an operation or GPU count, or cannot be read."""


@dataclasses.dataclass(frozen=True)
class Link:
    """One operation over one GPU count: `latency_us` + bytes / algorithm bandwidth; `source` says where from."""

    latency_us: float
    busbw_gbps: float
    source: str


@dataclasses.dataclass(frozen=True)
class Interconnect:
    """The interconnect table of one GPU kind.

    Attributes:
        gpu: the GPU kind, as NVML names it (e.g. "NVIDIA H200").
        links: operation -> GPU count -> `Link`.
    """

    gpu: str
    links: dict[str, dict[int, Link]]

    def time_us(self, op: str, n: int, nbytes: float) -> float:
        """Microseconds one call of `op` over `n` GPUs takes for a buffer of `nbytes` per GPU (0 on one GPU).

        Raises:
            InterconnectError: the table has no `op` over `n` GPUs.
        """
        if n <= 1 and op != "peer_copy":
            return 0.0
        link = self.links.get(op, {}).get(n)
        if link is None:
            raise InterconnectError(f"the {self.gpu} interconnect table has no {op} over {n} GPUs "
                                    f"(has {sorted(self.links.get(op, {}))}); run `python -m sgl_sidp.plan measure-comm`")
        return link.latency_us + nbytes / (link.busbw_gbps / bus_factor(op, n) * 1e3)

    @classmethod
    def from_json(cls, data: dict) -> "Interconnect":
        return cls(data["gpu"], {op: {int(n): Link(**v) for n, v in by_n.items()} for op, by_n in data["links"].items()})

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "links": {op: {str(n): dataclasses.asdict(v) for n, v in sorted(by_n.items())}
                                           for op, by_n in self.links.items()}}

    @classmethod
    def load(cls, gpu: str, directory: Path | None = None) -> "Interconnect":
        """The table of GPU kind `gpu` ("NVIDIA H200", "H100"...): `<h200>.json` in `directory`, else the one
        `measure-comm` wrote (`measured_dir()`), else the bundled one (`TABLE_DIR`).

        Raises:
            InterconnectError: no table for that GPU kind.
        """
        kind = gpu_kind(gpu)
        dirs = [directory] if directory is not None else [measured_dir(), TABLE_DIR]
        path = next((d / f"{kind}.json" for d in dirs if (d / f"{kind}.json").is_file()), dirs[-1] / f"{kind}.json")
        directory = path.parent
        if not kind or not path.is_file():
            have = sorted(p.stem for p in directory.glob("*.json"))
            raise InterconnectError(f"no interconnect table for GPU '{gpu}' (have: {', '.join(have)}); run "
                                    "`python -m sgl_sidp.plan measure-comm` on a node of that kind")
        return cls.from_json(json.loads(path.read_text()))


def measured_dir() -> Path:
    """Where `python -m sgl_sidp.plan measure-comm` writes its tables (beside the calibration cache)."""
    from sgl_sidp.calibration.cache import default_cache_dir

    return default_cache_dir() / "interconnect"


#: buffer sizes (bytes per rank) `measure_table` times each collective at: small ones fit the latency, big ones the
#: bandwidth
TABLE_SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 27)
TABLE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def _table_worker(rank: int, world: int, backend: str, init: str, sizes, iters: int, q) -> None:
    """One rank of `measure_table`: every collective over the first n ranks (n = 2, 4, 8 ... up to `world`), then
    (CUDA) a peer copy from GPU 1 into GPU 0 (`measure_peer_copy`); rank 0 puts the fits on `q`."""
    import torch
    import torch.distributed as dist

    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    make = (lambda nbytes: torch.ones(max(1, nbytes // 2), dtype=torch.bfloat16, device=f"cuda:{rank}")) if cuda \
        else (lambda nbytes: torch.ones(max(1, nbytes // 4)))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    how = "calls replayed back to back in a CUDA graph" if cuda else "calls back to back"
    links: dict[str, dict[int, dict]] = {}
    n = 2
    while n <= world:
        group = dist.new_group(list(range(n)))  # every rank creates every group, in the same order
        if rank < n:
            for op in TABLE_OPS:
                pts = measure(op, group, [s - s % (2 * n * 4) for s in sizes], make, iters, sync, graph=cuda)
                lat, bw = fit(pts, op, n)
                links.setdefault(op, {})[n] = {"latency_us": round(lat, 2), "busbw_gbps": round(bw, 1),
                                               "source": f"measured by measure-comm ({backend}, {len(pts)} sizes, {how})"}
        dist.barrier()
        n *= 2
    if cuda and world >= 2 and rank == 0:
        lat, gbps = measure_peer_copy(1, 0)
        links["peer_copy"] = {2: {"latency_us": round(lat, 2), "busbw_gbps": round(gbps, 1),
                                  "source": "measured by measure-comm: copies GPU 1 -> GPU 0 of 4 KiB (latency) and "
                                            "256 MiB (bandwidth), back to back"}}
    dist.barrier()
    if rank == 0:
        q.put(links)
    dist.destroy_process_group()


def measure_peer_copy(src: int, dst: int, small: int = 1 << 12, big: int = 1 << 28, iters: int = 20) -> tuple[float, float]:
    """Latency (us, per copy of `small` bytes) and bandwidth (GB/s, copies of `big` bytes) of copies from GPU `src`'s
    memory into GPU `dst`'s, issued back to back on `dst`'s current stream (CUDA only)."""
    import torch

    def per_copy_us(nbytes: int, k: int) -> float:
        a = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=f"cuda:{src}")
        b = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=f"cuda:{dst}")
        with torch.cuda.device(dst):
            b.copy_(a)
            torch.cuda.synchronize(dst)
            t0 = time.perf_counter()
            for _ in range(k):
                b.copy_(a)
            torch.cuda.synchronize(dst)
            return (time.perf_counter() - t0) / k * 1e6

    big_us = per_copy_us(big, 5)
    return per_copy_us(small, iters), big / (big_us * 1e3)


def measure_table(world: int, gpu: str, backend: str = "nccl", sizes=TABLE_SIZES, iters: int = 20,
                  timeout_s: float = 600.0) -> dict:
    """An interconnect table (`Interconnect.from_json`'s form) measured on `world` local GPUs (`backend` "nccl"; "gloo"
    runs the same code on CPU processes, for tests): each collective over 2, 4, 8... of them, fitted as latency +
    bytes / bus bandwidth (`fit`), and one GPU pair's peer copy.

    Raises:
        InterconnectError: a rank failed or the measurement timed out.
    """
    import tempfile

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/rendezvous"
        procs = [ctx.Process(target=_table_worker, args=(r, world, backend, init, tuple(sizes), iters, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        try:
            links = q.get(timeout=timeout_s)
        except Exception as e:  # queue.Empty, or a rank died and nothing came
            raise InterconnectError(f"measure-comm: no result within {timeout_s:.0f} s ({type(e).__name__}); "
                                    f"exit codes {[p.exitcode for p in procs]}") from None
        finally:
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()
    return {"gpu": gpu, "note": f"measured by python -m sgl_sidp.plan measure-comm on {world} GPUs", "links": links}


def forward_all_reduce_points(real, shard, layers: int, hidden: int, elt: int = 2,
                              prefill_from: int = 2048) -> list[tuple[float, float]]:
    """(bytes per rank, us) of one all-reduce inside SGLang's TP forwards: a TP-n server's forward is its TP-n shard's
    forward on one GPU plus 2 x `layers` all-reduces of the tokens' hidden states (`hidden` x `elt` bytes a token),
    so each point both calibrations (`Calibration`s) have gives (real - shard) / (2 x layers): decode steps at both
    contexts, prefills of `prefill_from` tokens or more (smaller ones are host-bound).

    On 2 x H200, Qwen3-8B: 0.7-3.4 us at 8 KiB-2 MiB (SGLang's custom all-reduce in CUDA graphs), 62-249 us at 16-64
    MiB; NCCL replayed in a CUDA graph (`measure`) takes 14 us at the smallest sizes.
    """
    out = []
    for table in ("decode_ms", "decode_ms_long"):
        a, b = getattr(real, table), getattr(shard, table)
        out += [(float(n * hidden * elt), (a[n] - b[n]) / (2 * layers) * 1e3) for n in sorted(set(a) & set(b))]
    out += [(float(t * hidden * elt), (real.prefill_ms[t] - shard.prefill_ms[t]) / (2 * layers) * 1e3)
            for t in sorted(set(real.prefill_ms) & set(shard.prefill_ms)) if t >= prefill_from]
    return out


def fit(points: Sequence[tuple[float, float]], op: str, n: int) -> tuple[float, float]:
    """Least-squares latency (us) and bus bandwidth (GB/s) of `op` over `n` GPUs from (bytes, us) points."""
    xs, ys = [b for b, _ in points], [t for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(1e-30, sum((x - mx) ** 2 for x in xs))
    slope = max(slope, 1e-12)
    latency = max(0.0, my - slope * mx)
    return latency, bus_factor(op, n) / slope / 1e3


def measure(op: str, group, sizes: Sequence[int], make: Callable[[int], object], iters: int = 20,
            sync: Callable[[], None] = lambda: None, graph: bool = False, rounds: int = 3) -> list[tuple[float, float]]:
    """(bytes, us per call) of `op` on `group` (a `torch.distributed` group of every rank calling this) for each buffer
    size in `sizes` (bytes per rank): `iters` calls issued back to back between two waits for the device, as a
    forward issues its collectives (no host wait between them), the median over `rounds`. `graph` (CUDA): the calls are
    captured once in a CUDA graph and the graph is replayed, as SGLang replays its decode graphs, so the host's launch
    cost is left out. `make(nbytes)` gives a tensor of that size on the right device, `sync` waits for the device. All
    ranks must call it with the same arguments.

    A host wait after every call (the earlier way) adds the launch and the wait to each call: on 2 x H200 it gave 38-52
    us of latency where SGLang's decode graphs pay about 3 us per all-reduce.
    """
    import torch
    import torch.distributed as dist

    n = dist.get_world_size(group)
    out = []
    for size in sizes:
        x = make(size)
        if op == "all_reduce":
            def call(): dist.all_reduce(x, group=group)
        elif op == "all_gather":
            y = x.new_empty((n * x.numel(),))
            def call(): dist.all_gather_into_tensor(y, x, group=group)
        elif op == "reduce_scatter":
            y = x.new_empty((x.numel() // n,))
            def call(): dist.reduce_scatter_tensor(y, x, group=group)
        elif op == "all_to_all":
            y = torch.empty_like(x)
            def call(): dist.all_to_all_single(y, x, group=group)
        elif op == "broadcast":
            def call(): dist.broadcast(x, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        else:
            raise InterconnectError(f"measure: unknown collective {op}")

        def calls():
            for _ in range(iters):
                call()

        for _ in range(3):
            call()
        sync()
        run = calls
        if graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside the default stream, as torch.cuda.graph wants
                call()
            torch.cuda.current_stream().wait_stream(side)
            sync()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                calls()
            run = g.replay
        times = []
        for _ in range(rounds):
            dist.barrier(group=group)
            sync()
            t0 = time.perf_counter()
            run()
            sync()
            times.append((time.perf_counter() - t0) * 1e6 / iters)
        out.append((float(size), statistics.median(times)))
    return out
