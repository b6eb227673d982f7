"""SiDP's ownership map, peak-shifting fetch order, the WaS/CaS switch and B_th (CPU, pure logic)."""

import pytest

from sgl_sidp.calibration.cost import crossover_batch
from sgl_sidp.calibration.table import Calibration
from sgl_sidp.control.mode_switch import ModeSwitch, ServeMode
from sgl_sidp.prefetch.schedules import owner_of, peak_shift_order


@pytest.mark.parametrize("d", range(2, 9))
@pytest.mark.parametrize("n_layers", [64, 80, 61])
def test_every_rank_fetches_each_non_owned_layer_once_per_cycle(d, n_layers):
    """Over the model, rank r fetches exactly the layers it does not own, once each, inside their own cycle."""
    for r in range(d):
        cycles = peak_shift_order(n_layers, d, r)
        assert len(cycles) == -(-n_layers // d)
        flat = [layer for cyc in cycles for layer in cyc]
        assert sorted(flat) == [l for l in range(n_layers) if owner_of(l, d) != r]
        for k, cyc in enumerate(cycles):
            assert all(k * d <= layer < (k + 1) * d for layer in cyc)
            assert len(cyc) <= d - 1  # fits the d - 1 slots


@pytest.mark.parametrize("d", range(2, 9))
def test_ranks_read_distinct_owners_at_every_step(d):
    """At fetch step j of a full cycle every rank reads a different owner (owner r + j); unshifted, all ranks read
    every rank but rank 0 first reads owner 0 (the peak the paper removes)."""
    orders = [peak_shift_order(4 * d, d, r) for r in range(d)]
    for cycle in range(4):
        for j in range(d - 1):
            owners = [owner_of(orders[r][cycle][j], d) for r in range(d)]
            assert sorted(owners) == sorted(set(owners)) and len(set(owners)) == d
            assert owners == [(r + j + 1) % d for r in range(d)]
    plain = [peak_shift_order(4 * d, d, r, shift=False) for r in range(d)]
    assert [owner_of(plain[r][0][0], d) for r in range(d)] == [1] + [0] * (d - 1)


def test_schedule_rejects_what_cannot_be_shared():
    """d < 2, a rank out of range, or fewer layers than ranks (a rank would own nothing)."""
    for args in ((64, 1, 0), (64, 4, 4), (3, 4, 0)):
        with pytest.raises(ValueError):
            peak_shift_order(*args)


def test_switch_has_hysteresis_and_counts_switches():
    """WaS from b_th tokens per rank up; back to CaS only below b_th * (1 - h); idle ranks count as 0."""
    sw = ModeSwitch(b_th=100, hysteresis=0.25)
    seq = [[10, 10], [100, 100], [90, 80], [76, 74], [70, 80], [74, 74], [0, 300], [0, 0]]
    got = [sw.decide(s) for s in seq]
    W, C = ServeMode.WAS, ServeMode.CAS
    assert got == [C, W, W, W, W, C, W, C]
    assert sw.switches == 4


def test_all_ranks_reach_the_same_decisions_from_the_same_signal():
    """Ranks see the same all-gathered counts each iteration, so their switches agree at every iteration."""
    import random

    rng = random.Random(0)
    signals = [[rng.choice([0, 5, 40, 90, 150, 400]) for _ in range(4)] for _ in range(500)]
    ranks = [ModeSwitch(b_th=120, hysteresis=0.3) for _ in range(4)]
    for s in signals:
        decisions = {sw.decide(list(s)) for sw in ranks}
        assert len(decisions) == 1
    assert ranks[0].switches > 10


def test_forced_mode_never_switches():
    """--sidp-... force WaS or CaS for measurement runs."""
    sw = ModeSwitch(b_th=10, forced=ServeMode.CAS)
    assert [sw.decide([1000, 1000]) for _ in range(3)] == [ServeMode.CAS] * 3 and sw.switches == 0
    with pytest.raises(ValueError):
        ModeSwitch(b_th=0)
    with pytest.raises(ValueError):
        ModeSwitch(b_th=10, hysteresis=1.0)


def test_b_th_is_the_first_batch_whose_step_hides_the_copies():
    """Qwen3-32B-like steps (20 ms at batch 1 up to 40 ms at 256): 25 ms of copies hide (85 %) from a 29.4 ms step,
    between batches 128 (26.2) and 256 (40.0): 26.2 + (b - 128) x 13.8 / 128 >= 25 / 0.85 first at b = 158
    (29.43 ms; 157 gives 29.33); 80 ms of copies never hide."""
    cal = Calibration("m", "g", {1: 20.0, 16: 20.3, 64: 22.4, 128: 26.2, 256: 40.0}, {}, None, "test")
    b = crossover_batch(cal, 25.0)
    assert b == 158
    assert crossover_batch(cal, 1.0) == 1
    assert crossover_batch(cal, 80.0) is None
