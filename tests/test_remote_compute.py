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
    from sgl_sidp.control.lockstep import Lockstep
    from sgl_sidp.control.mode_switch import ModeSwitch

    ls = Lockstep(None, ModeSwitch(b_th=100, hysteresis=0.25))
    return [ls.step(t[rank]).mode.value for t in tokens_by_iter]


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


# --------------------------------------------------------------------------- static shapes (CaS in CUDA graphs)
def bucket_rank(rank, world, steps, owner):
    """One rank's `BucketWire` results for `steps` [(bucket, rows per rank)], and the row counts the owner's layer saw."""
    from sgl_sidp.remote_compute.cas import BucketWire, TorchCollectives

    wire = BucketWire(TorchCollectives(), rank, world)
    calls = []

    def fn(x):
        calls.append(x.shape[0])
        return x @ weight()

    out = [wire.run(owner, rows(rank, n[rank]), bucket, fn if rank == owner else None, OUT).numpy()
           for bucket, n in steps]
    return out, calls


@pytest.mark.parametrize("world, owner", [(2, 1), (3, 0)])
def test_bucket_wire_pads_every_rank_to_the_bucket_and_returns_each_its_rows(world, owner):
    """Every rank sends exactly `bucket` rows (its own, zero-padded; an idle rank all zeros), the owner runs the
    layer once over world * bucket rows, and each rank gets exactly its own rows of x @ W back."""
    steps = [(4, [4] * world), (8, [5 if r % 2 else 1 for r in range(world)]), (2, [0 if r == owner else 2 for r in range(world)]),
             (1, [1 if r == owner else 0 for r in range(world)])]
    got = spawn(bucket_rank, world, steps, owner)
    for r in range(world):
        res, calls = got[r]
        for (bucket, n), y in zip(steps, (torch.from_numpy(a) for a in res)):
            assert torch.equal(y, rows(r, n[r]) @ weight())
        assert calls == ([world * b for b, _ in steps] if r == owner else [])


def test_bucket_wire_refuses_more_rows_than_the_bucket():
    from sgl_sidp.remote_compute.cas import BucketWire

    with pytest.raises(ValueError, match="5 rows do not fit a bucket of 4"):
        BucketWire(None, 0, 2).run(1, torch.zeros(5, H), 4, None, OUT)
    with pytest.raises(ValueError, match="the owner needs the layer"):
        BucketWire(None, 0, 2).run(0, torch.zeros(1, H), 4, None, OUT)


def test_an_iteration_has_a_graph_bucket_only_when_every_busy_rank_decodes_in_cas():
    """`Iteration.bucket`: the captured size of the largest rank's decode batch, the same on every rank (it is a
    function of the gathered lists); None when the iteration is WaS, idle, has a prefill, or exceeds the graphs."""
    from sgl_sidp.control.lockstep import Iteration
    from sgl_sidp.control.mode_switch import ServeMode

    cap = [1, 2, 4, 8, 16, 24, 32]
    cas, was = ServeMode.CAS, ServeMode.WAS
    assert Iteration((3, 9), cas, (3, 9)).bucket(cap) == 16
    assert Iteration((0, 5), cas, (0, 5)).bucket(cap) == 8  # an idle rank serves eagerly with 8 zero rows
    assert Iteration((1, 1), cas, (1, 1)).bucket(cap) == 1
    assert Iteration((3, 9), was, (3, 9)).bucket(cap) is None  # WaS: each rank replays its own size
    assert Iteration((0, 0), cas, (0, 0)).bucket(cap) is None
    assert Iteration((300, 2), cas, (-1, 2)).bucket(cap) is None  # a prefill: eager CaS with exact rows
    assert Iteration((33, 2), cas, (33, 2)).bucket(cap) is None  # larger than every captured size
    assert Iteration((3, 9), cas).bucket(cap) is None  # no decode sizes shared
    assert Iteration((3, 9), cas, (3, 9)).bucket([]) is None


def lockstep_rank(rank, world, plan):
    from sgl_sidp.control.lockstep import Lockstep
    from sgl_sidp.control.mode_switch import ModeSwitch, ServeMode

    ls = Lockstep(None, ModeSwitch(b_th=1.0, hysteresis=0.0, forced=ServeMode.CAS))
    out = []
    for step in plan:
        tokens, decode = step[rank]
        it = ls.step(tokens, decode)
        out.append((it.counts, it.decode_bs, it.bucket([1, 2, 4, 8])))
    return out


def test_lockstep_shares_decode_sizes_and_every_rank_agrees_on_the_bucket():
    """Each rank knows only its own batch; after the all-gather every rank has the same counts, decode sizes and
    bucket. A rank with no tokens reports decode size 0 whatever it passed."""
    plan = [[(3, 3), (5, 5)], [(0, -1), (2, 2)], [(700, -1), (1, 1)], [(0, 7), (0, 0)]]
    got = spawn(lockstep_rank, 2, plan)
    assert got[0] == got[1]
    assert [b for _, _, b in got[0]] == [8, 2, None, None]  # CaS; a prefill or an idle group: no graph
    assert [d for _, d, _ in got[0]] == [(3, 5), (0, 2), (-1, 1), (0, 0)]
