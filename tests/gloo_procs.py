"""Run a function in several CPU processes joined by a gloo process group (multi-process tests)."""

import os

import torch.distributed as dist
import torch.multiprocessing as mp

from sgl_sidp.bench.batches import free_port


def spawn(fn, world: int, *args, timeout: float = 120) -> dict:
    """`fn(rank, world, *args)` in `world` spawned processes of one gloo group; returns {rank: result}.

    Results travel through a queue: return plain Python or numpy values (a tensor is shared by a file descriptor
    that dies with its process). Raises AssertionError naming the ranks that raised.
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, q, args)) for r in range(world)]
    for p in procs:
        p.start()
    out = dict(q.get(timeout=timeout) for _ in procs)
    for p in procs:
        p.join(30)
    errors = {r: v for r, v in out.items() if isinstance(v, str) and v.startswith("raised ")}
    assert not errors, errors
    return out


def _entry(fn, rank, world, port, q, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        q.put((rank, fn(rank, world, *args)))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        q.put((rank, f"raised {type(e).__name__}: {e}"))
    finally:
        dist.destroy_process_group()
