"""Compute-as-a-Service on gloo: the owner's one call over all ranks' rows equals each rank computing locally."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sgl_sidp.remote_compute.cas import RemoteCompute

H, OUT = 8, 6


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weight():
    """The owner's layer weight (what SGLang's MLP would hold); non-owners never see it."""
    return torch.randn(H, OUT, generator=torch.Generator().manual_seed(42), dtype=torch.float64)


def rows(rank, n):
    return torch.randn(n, H, generator=torch.Generator().manual_seed(100 + rank), dtype=torch.float64)


def worker(rank, world, port, counts_list, owner, out_q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rc = RemoteCompute()
        calls = []

        def fn(x):
            calls.append(x.shape[0])
            return x @ weight()

        results = []
        for counts in counts_list:
            y = rc.run(owner, rows(rank, counts[rank]), counts, fn if rank == owner else None, OUT)
            results.append(y)
        # numpy, not tensors: torch shares a tensor through a file descriptor that dies with this process
        out_q.put((rank, [y.numpy() for y in results], calls))
    finally:
        dist.destroy_process_group()


def run(world, counts_list, owner):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, counts_list, owner, q)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict((r, (res, calls)) for r, res, calls in (q.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return got


@pytest.mark.parametrize("world, owner", [(2, 0), (3, 1), (4, 3)])
def test_owner_computes_every_ranks_rows_in_one_call(world, owner):
    """Each rank gets exactly its rows of x @ W back; the owner called the layer once per iteration, on all rows;
    ranks with no rows (idle, IDLE batches) neither send nor receive and add no rows to the owner's call."""
    counts_list = [[3] * world, [0] * world, [5 if r % 2 else 0 for r in range(world)],
                   [1 if r == owner else 0 for r in range(world)], [0 if r == owner else 2 for r in range(world)]]
    got = run(world, counts_list, owner)
    for r in range(world):
        res, calls = got[r]
        for counts, y in zip(counts_list, (torch.from_numpy(a) for a in res)):
            assert y.shape == (counts[r], OUT)
            assert torch.equal(y, rows(r, counts[r]) @ weight())  # float64: bit-exact here
        if r == owner:
            assert calls == [sum(c) for c in counts_list if sum(c) > 0]  # one call per busy iteration, all rows
        else:
            assert calls == []


def test_counts_must_match_the_group():
    """A counts list that disagrees with the group or the local rows is refused before anything is sent."""
    rc = RemoteCompute.__new__(RemoteCompute)
    rc.group, rc.rank, rc.world = None, 0, 2
    with pytest.raises(ValueError, match="do not fit a group of 2"):
        rc.run(0, torch.zeros(3, H), [3], lambda x: x, OUT)
    with pytest.raises(ValueError, match="with 2 rows here"):
        rc.run(0, torch.zeros(2, H), [3, 1], lambda x: x, OUT)


def switch_worker(rank, world, port, tokens_by_iter, out_q):
    from sgl_sidp.control.mode_switch import ModeSwitch, gather_counts

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        sw = ModeSwitch(b_th=100, hysteresis=0.25)
        out_q.put((rank, [sw.decide(gather_counts(t[rank])).value for t in tokens_by_iter]))
    finally:
        dist.destroy_process_group()


def test_ranks_switch_at_the_same_iteration_from_gathered_counts():
    """Each rank knows only its own tokens; after the per-iteration all-gather every rank makes the same
    WaS/CaS decision at every iteration (so no rank waits in WaS for an owner that went to CaS)."""
    import random

    rng = random.Random(1)
    world = 3
    tokens_by_iter = [[rng.choice([0, 10, 60, 120, 250]) for _ in range(world)] for _ in range(60)]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=switch_worker, args=(r, world, port, tokens_by_iter, q)) for r in range(world)]
    for p in procs:
        p.start()
    decisions = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert decisions[0] == decisions[1] == decisions[2]
    assert {"was", "cas"} == set(decisions[0])
