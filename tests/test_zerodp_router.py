"""Capacity-aware DP routing (`sgl_sidp.zerodp.router` and the `ZeroDPRuntime` hooks) on SGLang's real `DPBudget`."""

from types import SimpleNamespace

import pytest

from sgl_sidp.config import SidpConfig
from sgl_sidp.plugin import PluginContext
from sgl_sidp.zerodp.router import SLOWER, decode_step_fit, pick_rank, prefill_seconds_per_token
from sgl_sidp.zerodp.runtime import ZeroDPRuntime

dpc = pytest.importorskip("sglang.srt.managers.data_parallel_controller")
DPBudget, LoadBalanceMethod = dpc.DPBudget, dpc.LoadBalanceMethod


def load(dp_rank, capacity, tokens=0, running=0, waiting=0, timestamp=1.0, busy_us=0, prefilled=0):
    """A scheduler load snapshot with the fields DPBudget.update_budget and our hook read."""
    return SimpleNamespace(dp_rank=dp_rank, timestamp=timestamp, num_running_reqs=running, num_waiting_reqs=waiting,
                           num_total_tokens=tokens, max_total_num_tokens=capacity, total_prefill_busy_us=busy_us,
                           total_prefill_uncached_tokens=prefilled)


def runtime():
    """The DP controller's ZeroDP runtime, as the plugin builds it there."""
    return ZeroDPRuntime(PluginContext(SidpConfig(mode="zerodp"), []))


RT = runtime()


def budget_after(loads, dp_size=2, rt=None):
    """A DPBudget fed `loads` through SGLang's update_budget, then our AFTER hook (on a fresh runtime)."""
    global RT
    RT = rt or runtime()
    b = DPBudget(dp_size)
    RT.after_update_budget(b.update_budget(loads), b, loads)
    return b


def route(b, method, n, estimated_tokens=100):
    counts = [0] * b.dp_size
    for _ in range(n):
        r = RT.around_dispatch(DPBudget.dispatch, b, method, estimated_tokens=estimated_tokens)
        if r is not None:
            counts[r] += 1
    return counts


# --------------------------------------------------------------------------- pick_rank
def test_pick_rank_normalizes_by_capacity():
    """With 8x the capacity, rank 1 takes requests until its fill fraction would pass rank 0's."""
    tokens, reqs, caps = [0, 0], [0, 0], [1000, 8000]
    order = []
    for _ in range(18):
        r = pick_rank(tokens, reqs, caps, 100)
        order.append(r)
        tokens[r] += 100
        reqs[r] += 1
    # 7 requests fill rank 1 to 700/8000; the 8th would bring it to 0.1, tying rank 0's 100/1000,
    # and the tie goes to the rank with fewer requests (rank 0).
    assert order[:8] == [1] * 7 + [0]
    assert order == [1] * 7 + [0] + [1] * 8 + [0] + [1]
    assert tokens == [200, 1600]  # 8x the tokens on the 8x capacity


def test_pick_rank_breaks_ties_on_requests():
    """Equal fractions go to the rank with fewer requests, then to the lower rank."""
    assert pick_rank([0, 0], [3, 1], [1000, 1000], 10) == 1
    assert pick_rank([100, 800], [5, 2], [1000, 8000], 0) == 1
    assert pick_rank([0, 0, 0], [2, 2, 2], [10, 10, 10], 1) == 0


def test_pick_rank_counts_the_new_request():
    """The request's own tokens count: a prompt goes where it leaves the smaller fraction."""
    assert pick_rank([0, 400], [0, 0], [1000, 8000], 0) == 0  # 0.0 vs 0.05
    assert pick_rank([0, 400], [0, 0], [1000, 8000], 100) == 1  # 0.1 vs 0.0625


def test_pick_rank_queues_what_fits_nowhere_where_it_drains_soonest():
    """A prompt no cache can take goes to the rank with the fewest tokens (equal speeds), or the least work in
    seconds (measured speeds); while one cache can still take it, the fraction rule stands."""
    assert pick_rank([900, 7_000], [9, 70], [1_000, 8_000], 200) == 1  # fits only rank 1 (7,200 <= 8,000)
    assert pick_rank([900, 7_900], [9, 79], [1_000, 8_000], 200) == 0  # fits nowhere: 1,100 tokens vs 8,100
    assert pick_rank([900, 7_900], [9, 79], [1_000, 8_000], 200, seconds_per_token=[1.0, 0.1]) == 1  # 1,100 s vs 810 s


def test_a_burst_bigger_than_every_cache_splits_by_work_not_by_kv():
    """Issue 35's prefill-heavy burst: 128 prompts of 8,192 tokens at once on ZeroDP's 89,915-token source and
    647,013-token sink. Fractions alone sent 106 to the sink (the source then idled); now each cache fills in
    proportion and the overflow evens out the tokens."""
    tokens, reqs, caps = [0, 0], [0, 0], [89_915, 647_013]
    for _ in range(128):
        r = pick_rank(tokens, reqs, caps, 8_192)
        tokens[r] += 8_192
        reqs[r] += 1
    assert reqs[0] + reqs[1] == 128 and reqs[0] >= 40, reqs
    assert abs(tokens[1] - tokens[0]) <= caps[1] - caps[0] + 8_192


def test_prefill_seconds_per_token_from_sglangs_snapshot_counters():
    assert prefill_seconds_per_token(load(0, 10, busy_us=2_000_000, prefilled=40_000)) == pytest.approx(5e-5)
    assert prefill_seconds_per_token(load(0, 10)) is None
    assert prefill_seconds_per_token(SimpleNamespace()) is None
    # since an earlier snapshot's counters, and only once two chunks' worth of tokens were prefilled since
    assert prefill_seconds_per_token(load(0, 10, busy_us=2_100_000, prefilled=40_300),
                                     since=(100_000, 300)) == pytest.approx(5e-5)
    assert prefill_seconds_per_token(load(0, 10, busy_us=200_000, prefilled=8_492), since=(100_000, 300)) is None


def test_warm_up_prefills_do_not_set_the_speeds_a_burst_is_split_by():
    """On 2 x H100 (Qwen3-30B-A3B, nothing offloaded) a burst of 128 prompts of 8,192 tokens went 68 / 60, likely
    because the overflow rule weighed each replica by a prefill rate its scheduler had measured only on SGLang's
    warm-up prefills (a few of 1-300 tokens). The router now counts a rate from its first snapshot of each replica on, once two
    chunks were prefilled since: two replicas of equal capacity, whose warm-ups gave rates 1.3x apart, split a burst
    that overflows both caches evenly."""
    warm = [load(0, 90_000, busy_us=40_000, prefilled=312), load(1, 90_000, busy_us=52_000, prefilled=311)]
    b = budget_after(warm)
    assert RT.router.prefill_spt == [None, None]
    assert route(b, LoadBalanceMethod.TOTAL_TOKENS, 128, estimated_tokens=8192) == [64, 64]


# --------------------------------------------------------------------------- hooks on DPBudget
def test_after_update_budget_records_capacity():
    """Capacities come from the snapshots; zero or missing values leave the rank unknown."""
    b = budget_after([load(0, 10_000, tokens=500, running=2, waiting=1), load(1, 0)])
    assert b.total_tokens == [500, 0] and b.total_requests == [3, 0]  # SGLang's own update still ran
    assert RT.router.capacity == [10_000, 0]
    RT.after_update_budget(None, b, [SimpleNamespace(dp_rank=1, max_total_num_tokens=None)])
    assert RT.router.capacity == [10_000, 0]
    RT.after_update_budget(None, b, [load(1, 80_000, timestamp=2.0)])
    assert RT.router.capacity == [10_000, 80_000]
    assert RT.after_update_budget("result", b, []) == "result"
    assert not any("sidp" in k for k in vars(b))  # nothing pinned on SGLang's DPBudget


def test_dispatch_follows_capacity_ratio():
    """100 equal requests to a source (10k tokens) and a sink (80k): about 1/9 and 8/9."""
    b = budget_after([load(0, 10_000), load(1, 80_000)])
    counts = route(b, LoadBalanceMethod.TOTAL_TOKENS, 100)
    assert sum(counts) == 100
    assert abs(counts[0] - 100 / 9) <= 1, counts
    assert b.total_requests == counts and b.total_tokens == [100 * c for c in counts]


def test_dispatch_uses_fresh_loads():
    """A snapshot showing the sink busy moves requests to the source."""
    b = budget_after([load(0, 10_000, tokens=0), load(1, 80_000, tokens=79_000, timestamp=2.0)])
    assert route(b, LoadBalanceMethod.TOTAL_TOKENS, 3) == [3, 0]


def test_dispatch_overflow_weighs_measured_prefill_speed():
    """Both caches full: the overflow follows each rank's measured prefill time per token (since the router's first
    snapshot of it) once every rank has one."""
    b = budget_after([load(0, 10_000, tokens=10_000), load(1, 80_000, tokens=80_000)])  # counters from here on
    rt = RT
    b = budget_after([load(0, 10_000, tokens=10_000, timestamp=2.0),
                      load(1, 80_000, tokens=80_000, busy_us=2_000_000, prefilled=20_000, timestamp=2.0)], rt=rt)
    assert RT.router.prefill_spt == [None, pytest.approx(1e-4)]
    assert route(b, LoadBalanceMethod.TOTAL_TOKENS, 1) == [1, 0]  # a speed missing: equal speeds, fewest tokens (rank 0)
    b = budget_after([load(0, 10_000, tokens=10_000, busy_us=200_000, prefilled=20_000, timestamp=3.0),
                      load(1, 80_000, tokens=80_000, busy_us=2_000_000, prefilled=20_000, timestamp=3.0)], rt=rt)
    assert RT.router.prefill_spt == [pytest.approx(1e-5), pytest.approx(1e-4)]
    assert route(b, LoadBalanceMethod.TOTAL_TOKENS, 3) == [3, 0]


def test_dispatch_falls_back_until_every_capacity_is_known():
    """Without capacities (or with one missing), SGLang's raw-token choice stands: an even split."""
    global RT
    RT = runtime()
    b = DPBudget(2)
    b.update_budget([load(0, 10_000), load(1, 80_000)])  # SGLang's update only, no AFTER hook
    assert route(b, LoadBalanceMethod.TOTAL_TOKENS, 100) == [50, 50]
    b = budget_after([load(0, 10_000)])
    assert route(b, LoadBalanceMethod.TOTAL_TOKENS, 100) == [50, 50]


@pytest.mark.parametrize("method", [LoadBalanceMethod.ROUND_ROBIN, LoadBalanceMethod.TOTAL_REQUESTS,
                                    LoadBalanceMethod.FOLLOW_BOOTSTRAP_ROOM])
def test_dispatch_other_methods_untouched(method):
    """For every method but total_tokens, the original dispatch runs with the same arguments and its result is returned."""
    b = budget_after([load(0, 10_000), load(1, 80_000)])
    rt = RT
    calls = []

    def original(budget, m, estimated_tokens=0, *args, **kwargs):
        calls.append((budget, m, estimated_tokens))
        return DPBudget.dispatch(budget, m, estimated_tokens)

    ref = budget_after([load(0, 10_000), load(1, 80_000)])
    for _ in range(5):
        assert rt.around_dispatch(original, b, method, estimated_tokens=7) == DPBudget.dispatch(ref, method, 7)
    assert calls == [(b, method, 7)] * 5
    assert b.total_requests == ref.total_requests and b.total_tokens == ref.total_tokens


def test_hooks_through_sglangs_wrappers():
    """Wrapped by SGLang's own hook machinery (AFTER / AROUND), as the plugin installs them, on a DPBudget subclass."""
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn

    rt = runtime()

    class Hooked(DPBudget):
        update_budget = _wrap_fn(DPBudget.update_budget, rt.after_update_budget, HookType.AFTER)
        dispatch = _wrap_fn(DPBudget.dispatch, rt.around_dispatch, HookType.AROUND)

    b = Hooked(2)
    b.update_budget([load(0, 10_000), load(1, 80_000)])
    counts = [0, 0]
    for _ in range(90):  # as DataParallelController.total_tokens_scheduler calls it
        counts[b.dispatch(LoadBalanceMethod.TOTAL_TOKENS, estimated_tokens=100)] += 1
    assert counts == [10, 80]
    assert b.dispatch(LoadBalanceMethod.TOTAL_REQUESTS) == 0  # fewest requests, SGLang's rule


def test_requests_sent_since_the_previous_snapshot_are_added_back():
    """A burst of 128 prompts of 8,192 tokens on issue 35's source (89,915 KV tokens) and sink (647,013). Each
    scheduler publishes after every 8 requests sent, counting what it read when its iteration began: what was sent
    before its previous snapshot. Added back, the split is the simulated 50/78; SGLang's overwrite alone gives the
    big cache 85 (94 of 128 on the GPUs)."""
    from sgl_sidp.zerodp.router import Router

    def burst(add_back: bool):
        now = [0.0]
        router = Router(clock=lambda: now[0])
        b = DPBudget(2)
        sent = []  # (time, rank)
        last = [0.0]  # the previous snapshot's time: when each scheduler last read its socket

        def snapshot():
            seen = [k for when, k in sent if when <= last[0]]
            loads = [load(r, cap, tokens=8_192 * seen.count(r), waiting=seen.count(r), timestamp=now[0])
                     for r, cap in ((0, 89_915), (1, 647_013))]
            last[0] = now[0]
            b.update_budget(loads)
            if add_back:
                router.observe(b, loads)
            else:  # capacities only: SGLang's counts as its update left them
                router.capacity, router.prefill_spt, router.routed = [89_915, 647_013], [None, None], [0, 0]

        snapshot()
        for i in range(128):
            now[0] += 0.001
            if i and i % 8 == 0:
                snapshot()
            now[0] += 0.001
            sent.append((now[0], router.dispatch(b, 8_192)))
        return [sum(1 for _, k in sent if k == r) for r in (0, 1)]

    assert burst(add_back=True) == [50, 78]
    assert burst(add_back=False) == [43, 85]


def test_router_forgets_what_every_snapshot_counts():
    from sgl_sidp.zerodp.router import Router

    now = [10.0]
    router = Router(clock=lambda: now[0])
    b = DPBudget(2)
    loads = [load(0, 1_000, timestamp=10.0), load(1, 8_000, timestamp=10.0)]
    b.update_budget(loads)
    router.observe(b, loads)
    now[0] = 11.0
    router.dispatch(b, 100)
    assert b.total_tokens == [0, 100] and len(router._sent) == 1
    loads = [load(0, 1_000, timestamp=12.0), load(1, 8_000, tokens=100, running=1, timestamp=12.0)]
    b.update_budget(loads)
    router.observe(b, loads)
    assert b.total_tokens == [0, 200] and b.total_requests == [0, 2]  # read at 12.0 or still on the wire: both
    loads = [load(0, 1_000, timestamp=13.0), load(1, 8_000, tokens=100, running=1, timestamp=13.0)]
    b.update_budget(loads)
    router.observe(b, loads)
    assert b.total_tokens == [0, 100] and b.total_requests == [0, 1] and router._sent == []


# --------------------------------------------------------------------------- decode speed
def moments(steps):
    """SGLang's `decode_moments` sums of (batch, step microseconds) pairs."""
    return [len(steps), sum(b for b, _ in steps), sum(t for _, t in steps), sum(b * b for b, _ in steps),
            sum(b * t for b, t in steps), sum(b for b, _ in steps)]


def test_decode_step_fit_is_the_least_squares_line_of_the_timed_steps():
    a, c = decode_step_fit(SimpleNamespace(decode_moments=moments([(1, 5000), (64, 12000), (256, 28000)])))
    assert a * 1e6 == pytest.approx(5520.8, abs=0.1) and c * 1e6 == pytest.approx(88.59, abs=0.01)  # numpy.polyfit
    flat = decode_step_fit(SimpleNamespace(decode_moments=moments([(1, 4000), (1, 6000)])))  # one batch size
    assert flat == pytest.approx((0.005, 0.0))
    assert decode_step_fit(SimpleNamespace(decode_moments=moments([(1, 4000)]))) is None  # one step
    assert decode_step_fit(SimpleNamespace(decode_moments=None)) is None
    assert decode_step_fit(SimpleNamespace()) is None  # an older SGLang's snapshot


def test_a_copy_bound_sink_takes_no_request_while_its_source_has_room():
    """Issue 35: the sink (7.2x the KV) decoded batch 226 at 157 ms a step while its source ran batch 30."""
    caps, fit = [180_000, 1_300_000], [(0.0046, 0.00009), (0.146, 0.00005)]
    tokens, reqs = [0, 0], [0, 0]
    for _ in range(256):
        r = pick_rank(tokens, reqs, caps, 2304, step_fit=fit)
        tokens[r] += 2304
        reqs[r] += 1
    assert reqs[0] == 180_000 // 2304 and reqs[1] == 256 - reqs[0]  # the source until its cache is full
    assert pick_rank([0, 0], [0, 0], caps, 2304) == 1  # without fits: by capacity, as before


def test_replicas_of_equal_speed_share_by_capacity_while_their_steps_stay_within_slower():
    caps, fit = [100_000, 700_000], [(0.0046, 0.00009), (0.0050, 0.00009)]  # the sink offloads what hides: as fast
    tokens, reqs = [0, 0], [0, 0]
    for n in range(1, 81):
        r = pick_rank(tokens, reqs, caps, 1000, step_fit=fit)
        tokens[r] += 1000
        reqs[r] += 1
        if n == 5:
            assert reqs == [0, 5]  # by capacity first: the bigger cache
    step = [a + c * b for (a, c), b in zip(fit, reqs)]
    assert reqs[0] > 10 and max(step) <= (1 + SLOWER) * min(step) + fit[1][1]  # the batches grew apart no further


def test_the_router_reads_each_snapshots_decode_steps():
    b = budget_after([load(0, 180_000), load(1, 1_300_000)])
    assert RT.router.step_fit == [None, None]
    fast = SimpleNamespace(**vars(load(0, 180_000, timestamp=2.0)), decode_moments=moments([(1, 4600), (32, 7300)]))
    slow = SimpleNamespace(**vars(load(1, 1_300_000, timestamp=2.0)), decode_moments=moments([(1, 146000), (2, 146100)]))
    RT.after_update_budget(b.update_budget([fast, slow]), b, [fast, slow])
    assert None not in RT.router.step_fit
    assert route(b, LoadBalanceMethod.TOTAL_TOKENS, 20, estimated_tokens=2048) == [20, 0]


def test_the_fit_reads_sglangs_own_moment_sums_in_their_order():
    """The pinned SGLang's `_accumulate_decode_moment` fills the sums `decode_step_fit` reads, in its order, and its
    `LoadSnapshot` carries them with the other fields the router reads."""
    from sglang.srt.managers.load_snapshot import LoadSnapshot
    from sglang.srt.managers.scheduler import _accumulate_decode_moment

    totals = [0.0] * 6
    for b, us in ((1, 5000), (64, 12000), (256, 28000)):
        _accumulate_decode_moment(totals, b, us, b)
    snap = LoadSnapshot(decode_moments=totals, max_total_num_tokens=1000, total_prefill_busy_us=16384,
                        total_prefill_uncached_tokens=16384)
    a, c = decode_step_fit(snap)
    assert a * 1e6 == pytest.approx(5520.8, abs=0.1) and c * 1e6 == pytest.approx(88.59, abs=0.01)
    assert prefill_seconds_per_token(snap) == pytest.approx(1e-6)


def test_the_router_logs_its_split_after_requests_were_sent(caplog):
    """With a load snapshot at least `LOG_EVERY_S` after the last line, and requests sent since: one line of the
    requests sent per DP rank, the capacities and the prefill rates, so that a burst's split (all sent within a
    second) can be read off the server log."""
    import logging

    t = [100.0]
    rt = runtime()
    rt.router.clock = lambda: t[0]
    loads = [load(0, 90_000), load(1, 90_000)]
    with caplog.at_level(logging.INFO, logger="sgl_sidp.zerodp.router"):
        b = budget_after(loads, rt=rt)  # nothing sent yet: no line
        route(b, LoadBalanceMethod.TOTAL_TOKENS, 4, estimated_tokens=8192)
        rt.after_update_budget(b.update_budget(loads), b, loads)  # the burst is sent: its line
        t[0] += 5.0
        route(b, LoadBalanceMethod.TOTAL_TOKENS, 1, estimated_tokens=8192)
        rt.after_update_budget(b.update_budget(loads), b, loads)  # within LOG_EVERY_S: none
        t[0] += 10.0
        rt.after_update_budget(b.update_budget(loads), b, loads)  # later, with a request sent since: one more
        rt.after_update_budget(b.update_budget(loads), b, loads)  # nothing sent since: none
    lines = [r.getMessage() for r in caplog.records if "zerodp router" in r.getMessage()]
    assert lines == ["sgl-sidp zerodp router: requests sent per DP rank so far [2, 2]; KV capacity [90000, 90000] "
                     "tokens; prefill us per token -, - (-: not yet 16384 tokens)",
                     "sgl-sidp zerodp router: requests sent per DP rank so far [3, 2]; KV capacity [90000, 90000] "
                     "tokens; prefill us per token -, - (-: not yet 16384 tokens)"]
