"""Compute-as-a-Service on gloo: the owner's one call over all ranks' rows equals each rank computing locally."""

import pytest
import torch

from sgl_sidp.remote_compute.cas import RemoteCompute
from tests.gloo_procs import spawn

H, OUT = 8, 6


def weight():
    """The owner's layer weight (what SGLang's MLP would hold); non-owners never see it."""
    return torch.randn(H, OUT, generator=torch.Generator().manual_seed(42), dtype=torch.float64)


def rows(rank, n):
    return torch.randn(n, H, generator=torch.Generator().manual_seed(100 + rank), dtype=torch.float64)


def cas_rank(rank, world, counts_list, owner, collective=False):
    """One rank's results of every iteration (numpy) and the row counts its layer was called with."""
    rc = RemoteCompute(collective=collective)
    calls = []

    def fn(x):
        calls.append(x.shape[0])
        return x @ weight()

    results = [rc.run(owner, rows(rank, counts[rank]), counts, fn if rank == owner else None, OUT).numpy()
               for counts in counts_list]
    return results, calls


@pytest.mark.parametrize("collective", [False, True], ids=["p2p", "collective"])
@pytest.mark.parametrize("world, owner", [(2, 0), (3, 1), (4, 3)])
def test_owner_computes_every_ranks_rows_in_one_call(world, owner, collective):
    """Each rank gets exactly its rows of x @ W back; the owner called the layer once per iteration, on all rows;
    ranks with no rows (idle, IDLE batches) neither send nor receive and add no rows to the owner's call."""
    counts_list = [[3] * world, [0] * world, [5 if r % 2 else 0 for r in range(world)],
                   [1 if r == owner else 0 for r in range(world)], [0 if r == owner else 2 for r in range(world)]]
    got = spawn(cas_rank, world, counts_list, owner, collective)
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


def switch_rank(rank, world, tokens_by_iter):
    from sgl_sidp.control.mode_switch import ModeSwitch, gather_counts

    sw = ModeSwitch(b_th=100, hysteresis=0.25)
    return [sw.decide(gather_counts(t[rank])).value for t in tokens_by_iter]


def test_ranks_switch_at_the_same_iteration_from_gathered_counts():
    """Each rank knows only its own tokens; after the per-iteration all-gather every rank makes the same
    WaS/CaS decision at every iteration (so no rank waits in WaS for an owner that went to CaS)."""
    import random

    rng = random.Random(1)
    world = 3
    tokens_by_iter = [[rng.choice([0, 10, 60, 120, 250]) for _ in range(world)] for _ in range(60)]
    decisions = spawn(switch_rank, world, tokens_by_iter)
    assert decisions[0] == decisions[1] == decisions[2]
    assert {"was", "cas"} == set(decisions[0])
