"""The scheduler simulation (`sgl_sidp.plan.sim`) against schedules computed by hand, and against its step-by-step
reference (`sgl_sidp.plan.sim_reference`), float for float."""

import collections
import random
from pathlib import Path

import pytest

from sgl_sidp.plan.sim import (PrivateBlocks, ReplicaLimits, ReplicaSim, SimRequest, StepTimes, deliver, simulate,
                               summarize)
from sgl_sidp.plan.sim_reference import ReferenceRadixBlocks, ReferenceReplicaSim, reference_simulate

#: prefill: 1 us per new token; decode: 1 ms + 0.1 ms per sequence
TIMES = StepTimes(decode_ms=lambda b, ctx: 1.0 + 0.1 * b, prefill_ms=lambda parts: sum(n for n, _ in parts) / 1000)


def replica(kv=100_000, **kw):
    return ReplicaSim(ReplicaLimits(kv_tokens=kv, **kw), TIMES)


def test_one_request_prefill_then_decodes():
    r = SimRequest(0.0, 100, 3)
    simulate([r], [replica()])
    assert r.ttft_s == pytest.approx(0.0001)  # 100 tokens
    assert r.finish_s == pytest.approx(0.0001 + 2 * 0.0011)  # two decode steps of one sequence
    assert r.tpot_s == pytest.approx(0.0011)


def test_chunked_prefill_splits_a_long_prompt_and_decode_waits_for_it():
    a, b = SimRequest(0.0, 6000, 2), SimRequest(0.0, 6000, 2)
    rep = replica()
    simulate([a, b], [rep])
    assert a.first_token_s == pytest.approx(0.008192)  # A whole and 2,192 tokens of B in one 8,192-token chunk
    assert b.first_token_s == pytest.approx(0.008192 + 0.003808)  # B's last 3,808 tokens, before any decode
    assert a.finish_s == b.finish_s == pytest.approx(0.012 + 0.0012)  # one decode step of both
    assert rep.iterations == {"prefill": 2, "decode": 1}


def test_a_request_arriving_during_a_forward_waits_for_the_iteration_chosen_before_it():
    """SGLang's overlap scheduler chooses the batch after a forward when that forward starts. B arrives during A's
    prefill (0-1 ms), after the step that follows it was chosen (A's first decode, 1.1 ms): B is prefilled after that
    decode. C arrives during A's last decode, when nothing else would run: it is prefilled as that decode ends."""
    a, b = SimRequest(0.0, 1000, 3), SimRequest(0.0005, 100, 2)
    simulate([a, b], [replica()])
    assert b.first_token_s == pytest.approx(0.001 + 0.0011 + 0.0001)  # not 0.0011: the decode went first
    a, c = SimRequest(0.0, 1000, 2), SimRequest(0.0015, 100, 2)  # A: prefill to 1 ms, its one decode to 2.1 ms
    simulate([a, c], [replica()])
    assert a.finish_s == pytest.approx(0.0021) and c.first_token_s == pytest.approx(0.0021 + 0.0001)
    d = SimRequest(0.5, 100, 2)  # an idle replica takes it at once
    simulate([d], [replica()])
    assert d.ttft_s == pytest.approx(0.0001)


def test_kv_admission_holds_a_request_that_does_not_fit():
    """250 KV tokens: A (100 + 50 out) is admitted; B needs 100 + 50 + 1 = 151 >= 250 - 100 held - 49 x 0.7
    reserved for A's decode, so it waits until A finished. With 300 tokens B misses A's batch (300 - 150 left) but
    fits at the next iteration (300 - 100 - 34.3), a prefill before A's first decode; with 400 both share a batch."""
    a, b = SimRequest(0.0, 100, 50), SimRequest(0.0, 100, 50)
    simulate([a, b], [replica(kv=250)])
    assert b.first_token_s > a.finish_s
    c, d = SimRequest(0.0, 100, 50), SimRequest(0.0, 100, 50)
    simulate([c, d], [replica(kv=300)])
    assert (c.first_token_s, d.first_token_s) == pytest.approx((0.0001, 0.0002))
    e, f = SimRequest(0.0, 100, 50), SimRequest(0.0, 100, 50)
    simulate([e, f], [replica(kv=400)])
    assert e.first_token_s == f.first_token_s == pytest.approx(0.0002)


def test_max_running_requests_caps_the_batch():
    reqs = [SimRequest(0.0, 10, 5) for _ in range(3)]
    rep = replica(max_running=2)
    simulate(reqs, [rep])
    assert reqs[2].first_token_s >= min(reqs[0].finish_s, reqs[1].finish_s)


def test_radix_cache_hits_skip_the_cached_prefix():
    first, again = SimRequest(0.0, 1024, 1, hash_ids=(7, 8)), SimRequest(1.0, 1024, 1, hash_ids=(7, 8))
    simulate([first, again], [replica()])
    assert again.cached == 1023 and again.ttft_s == pytest.approx(0.000001)  # one token left to compute


def test_a_running_requests_prompt_is_hit_once_its_prefill_is_done():
    """SGLang inserts a prompt into its radix tree once the prefill forward is done (`maybe_cache_unfinished_req`):
    a request arriving while the first still decodes finds the shared blocks (not its own last one); before the first
    prefill ends it finds none; a retracted or finished request's live blocks go (`RadixBlocks.live` empty at the
    end), as in the reference (`sim_reference`)."""
    for make in (replica, lambda: ReferenceReplicaSim(ReplicaLimits(kv_tokens=100_000), TIMES)):
        first = SimRequest(0.0, 1536, 200, hash_ids=(7, 8, 9))  # decodes for about 0.2 s
        during = SimRequest(0.05, 1536, 4, hash_ids=(7, 8, 10))
        early = SimRequest(0.0, 1536, 4, hash_ids=(7, 8, 11))  # in the first's prefill batch
        rep = make()
        (simulate if isinstance(rep, ReplicaSim) else reference_simulate)([first, early, during], [rep])
        assert (early.cached, during.cached) == (0, 1024)
        assert during.finish_s < first.finish_s
        assert not {h: k for h, k in rep.cache.live.items() if k}  # none left live


def test_retraction_when_decode_runs_out_of_kv_and_everything_still_finishes():
    """Admission counts 0.7 of the running requests' outputs: 1,000 tokens admit three requests of 10 + 400 (the
    third once the first two run), whose decodes need 1,230: one is retracted and recomputed later."""
    reqs = [SimRequest(0.0, 10, 400) for _ in range(4)]
    simulate(reqs, [replica(kv=1000)])
    assert all(r.finish_s is not None for r in reqs) and sum(r.retractions for r in reqs) >= 1


def test_a_request_larger_than_the_kv_cache_is_rejected():
    big, small = SimRequest(0.0, 500, 10), SimRequest(0.0, 10, 2)
    out = summarize(simulate([big, small], [replica(kv=200)]))
    assert big.rejected and small.finish_s is not None and out["rejected"] == 1 and out["requests"] == 1


def test_dp_replicas_get_requests_round_robin_and_run_in_parallel():
    reqs = [SimRequest(0.0, 1000, 1) for _ in range(4)]
    reps = [replica(), replica()]
    simulate(reqs, reps)
    assert [r.first_token_s for r in reqs] == pytest.approx([0.002, 0.002, 0.002, 0.002])  # 2 x 1,000 per replica
    s = summarize(reqs)
    assert s["makespan_s"] == pytest.approx(0.002) and s["total_tok_s"] == pytest.approx(4004 / 0.002)


def test_replicas_in_lockstep_start_each_iteration_when_the_slowest_has_ended():
    """SiDP's CaS/auto and DP attention: replica 0 prefills 1,000 tokens (1 ms) and decodes, replica 1 prefills
    5,000 tokens (5 ms) first: replica 0's decode steps start when replica 1's prefill has ended, and its tokens come
    out when its own forward ends. On their own, replica 0 finishes after 1 ms + 2 decode steps."""
    reqs = [SimRequest(0.0, 1000, 3), SimRequest(0.0, 5000, 3)]
    simulate(reqs, [replica(), replica()], lockstep=True)
    fast, slow = reqs
    assert fast.first_token_s == pytest.approx(0.001) and slow.first_token_s == pytest.approx(0.005)
    # iteration 2 starts at 5 ms: both decode (1.1 ms each); iteration 3 at 6.1 ms
    assert fast.finish_s == pytest.approx(0.005 + 2 * 0.0011) and slow.finish_s == fast.finish_s
    alone = [SimRequest(0.0, 1000, 3), SimRequest(0.0, 5000, 3)]
    simulate(alone, [replica(), replica()])
    assert alone[0].finish_s == pytest.approx(0.001 + 2 * 0.0011)


def test_lockstep_waits_for_arrivals_and_routes_round_robin():
    reqs = [SimRequest(0.0, 1000, 1), SimRequest(0.5, 1000, 1), SimRequest(0.5, 2000, 1)]
    reps = [replica(), replica()]
    simulate(reqs, reps, lockstep=True)
    assert [r.first_token_s for r in reqs] == pytest.approx([0.001, 0.501, 0.502])  # the idle gap is skipped
    assert reps[0].iterations == collections.Counter(prefill=2) and reps[1].iterations == collections.Counter(prefill=1)


def test_an_admission_on_the_line_sums_the_reserved_tokens_per_request_as_prefill_adder_does():
    """24 KV tokens, one 1-token prompt per prefill: C (needs 1 + 6 + 1) meets A and B running with 1 and 19 outputs
    left. 0.7 x 1 + 0.7 x 19 = 13.999999999999998 in floats (0.7 x 20 = 14.0), so C's 8 < 24 - 2 - 13.99... fits."""
    a, b, c = SimRequest(0.0, 1, 2), SimRequest(0.0, 1, 20), SimRequest(0.0, 1, 6)
    rep = replica(kv=24, chunked_prefill=1, max_prefill_tokens=1)
    simulate([a, b, c], [rep])
    assert [a.first_token_s, b.first_token_s, c.first_token_s] == pytest.approx([1e-6, 2e-6, 3e-6])


# ---------------------------------------------------------------------------------------------------------------------
# The simulation against its reference (`sgl_sidp.plan.sim_reference`, after sgl_sidp.plan.sim's first implementation
# at 68b72c1: every decode step goes over every running request): the same schedules, float for float, on workloads
# that exercise every branch.

#: step times with a context term, as the planner's are (the decode step depends on the mean context)
CTX_TIMES = StepTimes(decode_ms=lambda b, ctx: 4.0 + 0.03 * b + 2.5e-5 * b * ctx,
                      prefill_ms=lambda parts: 1.5 + sum(n for n, _ in parts) * 0.06
                      + 1e-6 * sum(n * (n + 2 * p) for n, p in parts))


#: the same with SGLang's choice of the next iteration 1 ms after an iteration starts (every step here takes longer)
DECIDE_TIMES = StepTimes(decode_ms=CTX_TIMES.decode_ms, prefill_ms=CTX_TIMES.prefill_ms, decide_ms=1.0)

#: the same with a back-to-back prefill's first tokens released 0.7 of the way through the next where it takes over
#: 40 ms (`release_share`, `release_min_ms`): late into forwards of 2,048-token chunks (~124 ms here), at once after
#: shorter ones (512 tokens: ~32 ms)
RELEASE_TIMES = StepTimes(decode_ms=CTX_TIMES.decode_ms, prefill_ms=CTX_TIMES.prefill_ms, decide_ms=1.0,
                          release_share=0.7, release_min_ms=40.0)


def _workload(kind: str, seed: int, n: int) -> list[tuple]:
    """(arrival s, prompt, output, hash_ids) rows: bursts at t = 0 (`burst1`: the first alone, the rest 1 us later,
    as the planner's offline jobs), Poisson arrivals, shared prompt prefixes in 512-token blocks (Mooncake-like), or
    outputs past the 4,096-token clip."""
    rnd = random.Random(seed)
    rows, t = [], 0.0
    for i in range(n):
        t += (0.0 if kind == "burst" or (kind == "burst1" and i != 1) else 1e-6 if kind == "burst1"
              else rnd.expovariate(20.0 if kind != "slow" else 0.5))
        inp = rnd.randint(1, 20_000 if kind == "long" else 6000)
        out = rnd.randint(4000, 6000) if kind == "long" else rnd.randint(1, 400)
        ids = None
        if kind == "prefix":
            shared = rnd.randint(0, (inp + 511) // 512)
            ids = tuple(rnd.randint(0, 3) * 1000 + k if k < shared else 10 ** 6 + i * 100 + k
                        for k in range((inp + 511) // 512))
        rows.append((t, inp, out, ids))
    return rows


def _least_loaded(req, replicas):
    return min(range(len(replicas)), key=lambda i: (len(replicas[i].running) + len(replicas[i].waiting), i))


def _cached_ids(cache):
    """The radix cache's block ids, least recently used first (the simulation's: its private runs spelled out)."""
    if isinstance(cache, ReferenceRadixBlocks):
        return list(cache.blocks)
    assert cache.size == len(cache.ids())
    return cache.ids()


def _outcome(requests, replicas):
    return ([(r.first_token_s, r.finish_s, r.prefilled, r.cached, r.decoded, r.held, r.retractions, r.rejected)
             for r in requests],
            [(p.clock, dict(p.iterations), p.used, p.ratio, _cached_ids(p.cache)) for p in replicas])


@pytest.mark.parametrize("kind, seed, n, dp, limits, route", [
    ("burst", 1, 120, 1, dict(kv_tokens=60_000), None),  # retracts
    ("burst", 2, 120, 2, dict(kv_tokens=30_000, chunked_prefill=2048, max_prefill_tokens=4096), None),
    ("burst", 3, 60, 1, dict(kv_tokens=5_000, max_running=8), None),  # rejects prompts past the KV cache
    ("poisson", 4, 200, 1, dict(kv_tokens=100_000), None),
    ("poisson", 5, 200, 3, dict(kv_tokens=40_000, chunked_prefill=512), None),
    ("slow", 6, 80, 1, dict(kv_tokens=300_000), None),  # mostly idle
    ("prefix", 7, 200, 1, dict(kv_tokens=50_000), None),  # radix hits, LRU eviction
    ("prefix", 8, 200, 2, dict(kv_tokens=20_000, chunked_prefill=2048), None),
    ("prefix", 9, 150, 2, dict(kv_tokens=40_000, max_running=16), _least_loaded),  # routes by the replicas' state
    ("long", 10, 40, 1, dict(kv_tokens=200_000), None),  # reserved outputs clipped at 4,096
    ("long", 11, 40, 2, dict(kv_tokens=60_000, max_running=4), None),
    # the next iteration chosen 1 ms after an iteration's start (`StepTimes.decide_ms`)
    ("burst1", 12, 120, 2, dict(kv_tokens=30_000, chunked_prefill=2048, max_prefill_tokens=4096), None),
    ("poisson", 13, 200, 3, dict(kv_tokens=40_000, chunked_prefill=512), None),
    ("prefix", 14, 150, 2, dict(kv_tokens=40_000, max_running=16), _least_loaded),
    # and a prefill's first tokens released into the next prefill (`StepTimes.release_share`)
    ("burst", 15, 120, 1, dict(kv_tokens=60_000), None),  # retracts
    ("burst1", 16, 120, 2, dict(kv_tokens=30_000, chunked_prefill=2048, max_prefill_tokens=4096), None),
    ("poisson", 17, 200, 3, dict(kv_tokens=40_000, chunked_prefill=512), None),
    ("prefix", 18, 200, 2, dict(kv_tokens=20_000, chunked_prefill=2048), None),
    ("long", 19, 40, 2, dict(kv_tokens=60_000, chunked_prefill=512, max_running=4), None),  # chunks alone
])
def test_the_schedule_is_the_first_implementations_float_for_float(kind, seed, n, dp, limits, route):
    times = RELEASE_TIMES if seed >= 15 else DECIDE_TIMES if seed >= 12 else CTX_TIMES
    rows = _workload(kind, seed, n)
    ref_reqs = [SimRequest(*r) for r in rows]
    ref_reps = [ReferenceReplicaSim(ReplicaLimits(**limits), times) for _ in range(dp)]
    reference_simulate(ref_reqs, ref_reps, route)
    reqs, reps = [SimRequest(*r) for r in rows], [ReplicaSim(ReplicaLimits(**limits), times) for _ in range(dp)]
    simulate(reqs, reps, route)
    assert _outcome(reqs, reps) == _outcome(ref_reqs, ref_reps)
    assert summarize(reqs) == summarize(ref_reqs)


TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


@pytest.mark.parametrize("name, n, dp, kv", [("AzureLLMInferenceTrace_code.csv", 2500, 1, 120_000),
                                             ("AzureLLMInferenceTrace_code.csv", 2500, 2, 60_000),
                                             ("conversation_trace.jsonl", 600, 1, 400_000),
                                             ("conversation_trace.jsonl", 600, 2, 150_000)])
def test_the_first_implementations_schedule_of_real_traces(name, n, dp, kv):
    """The first `n` requests of the Azure code and Mooncake conversation traces (../shared/traces), whose bursts,
    queues, retractions and prefix hits the synthetic workloads may miss."""
    if not (TRACES / name).is_file():
        pytest.skip(f"{TRACES / name} missing")
    from sgl_sidp.bench.traces import load_trace

    rows = [(r.arrival_s, r.input_len, max(1, r.output_len), r.hash_ids) for r in load_trace(TRACES / name)[:n]]
    ref_reqs = [SimRequest(*r) for r in rows]
    ref_reps = [ReferenceReplicaSim(ReplicaLimits(kv), CTX_TIMES) for _ in range(dp)]
    reference_simulate(ref_reqs, ref_reps)
    reqs, reps = [SimRequest(*r) for r in rows], [ReplicaSim(ReplicaLimits(kv), CTX_TIMES) for _ in range(dp)]
    simulate(reqs, reps)
    assert _outcome(reqs, reps) == _outcome(ref_reqs, ref_reps)


# ---------------------------------------------------------------------------------------------------------------------
# The same, with the planner's step times (`steps.StepModel`): decode times that round the context to CONTEXT_STEP
# tokens, which the simulation asks once per run of equal times (`StepTimes.decode_run`, `ReplicaSim._decodes`); the
# reference asks `decode_ms` for every step.

def _planner_times(technique: str = "vanilla", variant: str = "") -> StepTimes:
    """A StepModel's step times, from a made-up calibration whose decode step grows with the context."""
    from sgl_sidp.calibration.memory import ModelShapes
    from sgl_sidp.calibration.table import Calibration
    from sgl_sidp.plan.comm import Interconnect, Link
    from sgl_sidp.plan.configs import Configuration
    from sgl_sidp.plan.steps import ShardClock, StepModel

    shapes = ModelShapes(layers=4, hidden=1024, heads=16, kv_heads=4, head_dim=64, vocab=1000, tied=False,
                         intermediate=4096)
    link = Link(latency_us=10.0, busbw_gbps=100.0, source="test")
    ic = Interconnect("NVIDIA H200", {op: {2: link} for op in ("all_reduce", "all_gather", "reduce_scatter")}
                      | {"peer_copy": {2: Link(0.0, 100.0, "test")}})
    cal = Calibration(model="m", gpu="NVIDIA H200", decode_ms={1: 4.0, 32: 5.0, 256: 9.0},
                      prefill_ms={512: 10.0, 2048: 30.0, 8192: 125.0}, copy_gbps=None, source="test",
                      decode_ms_long={1: 4.5, 32: 7.0, 256: 21.0}, decode_context_long=4096)
    dp = 2 if technique == "sidp" else 1
    model = StepModel(Configuration("t", technique, dp, 1, variant=variant), shapes,
                      {"forward": ShardClock(cal, shapes.kv_bytes_per_token(1))}, ic)
    return model.step_times()


@pytest.mark.parametrize("kind, seed, n, dp, limits, route, technique", [
    ("burst", 1, 120, 1, dict(kv_tokens=60_000), None, "vanilla"),  # retracts
    ("burst", 3, 60, 1, dict(kv_tokens=5_000, max_running=8), None, "vanilla"),  # rejects prompts past the KV cache
    ("poisson", 4, 200, 1, dict(kv_tokens=100_000), None, "sidp"),
    ("poisson", 5, 200, 3, dict(kv_tokens=40_000, chunked_prefill=512), None, "vanilla"),
    ("slow", 6, 80, 1, dict(kv_tokens=300_000), None, "vanilla"),  # mostly idle: arrivals cut the runs of steps
    ("prefix", 7, 200, 1, dict(kv_tokens=50_000), None, "vanilla"),  # radix hits, evictions between decode steps
    ("prefix", 8, 200, 2, dict(kv_tokens=20_000, chunked_prefill=2048), None, "sidp"),  # the queue's head waits
    ("prefix", 9, 150, 2, dict(kv_tokens=40_000, max_running=16), _least_loaded, "vanilla"),
    ("long", 10, 40, 1, dict(kv_tokens=200_000), None, "vanilla"),  # reserved outputs clipped at 4,096
    ("long", 11, 40, 2, dict(kv_tokens=60_000, max_running=4), None, "sidp"),
])
def test_runs_of_equal_step_times_give_the_first_implementations_schedule(kind, seed, n, dp, limits, route, technique):
    times = _planner_times(technique, "auto" if technique == "sidp" else "")
    assert times.decode_run is not None
    rows = _workload(kind, seed, n)
    ref_reqs = [SimRequest(*r) for r in rows]
    ref_times = StepTimes(times.decode_ms, times.prefill_ms, longest_row=times.longest_row)
    ref_reps = [ReferenceReplicaSim(ReplicaLimits(**limits), ref_times) for _ in range(dp)]
    reference_simulate(ref_reqs, ref_reps, route)
    reqs, reps = [SimRequest(*r) for r in rows], [ReplicaSim(ReplicaLimits(**limits), times) for _ in range(dp)]
    simulate(reqs, reps, route)
    assert _outcome(reqs, reps) == _outcome(ref_reqs, ref_reps)
    assert summarize(reqs) == summarize(ref_reqs)


@pytest.mark.parametrize("name, n, dp, kv", [("AzureLLMInferenceTrace_code.csv", 2500, 2, 60_000),
                                             ("conversation_trace.jsonl", 600, 1, 400_000),
                                             ("conversation_trace.jsonl", 600, 2, 150_000)])
def test_runs_of_equal_step_times_on_real_traces(name, n, dp, kv):
    if not (TRACES / name).is_file():
        pytest.skip(f"{TRACES / name} missing")
    from sgl_sidp.bench.traces import load_trace

    times = _planner_times()
    rows = [(r.arrival_s, r.input_len, max(1, r.output_len), r.hash_ids) for r in load_trace(TRACES / name)[:n]]
    ref_reqs = [SimRequest(*r) for r in rows]
    ref_times = StepTimes(times.decode_ms, times.prefill_ms, longest_row=times.longest_row)
    ref_reps = [ReferenceReplicaSim(ReplicaLimits(kv), ref_times) for _ in range(dp)]
    reference_simulate(ref_reqs, ref_reps)
    reqs, reps = [SimRequest(*r) for r in rows], [ReplicaSim(ReplicaLimits(kv), times) for _ in range(dp)]
    simulate(reqs, reps)
    assert _outcome(reqs, reps) == _outcome(ref_reqs, ref_reps)


def test_simulating_again_on_the_same_replicas_goes_on_from_where_they_are():
    """A second `simulate` on replicas that ran before (round robin runs each replica through its own requests)."""
    rows = _workload("prefix", 12, 120)
    ref_reqs = [SimRequest(*r) for r in rows]
    ref_reps = [ReferenceReplicaSim(ReplicaLimits(30_000), CTX_TIMES) for _ in range(2)]
    reference_simulate(ref_reqs[:60], ref_reps)
    later = [SimRequest(r.arrival_s + 1000.0, r.input_len, r.output_len, r.hash_ids) for r in ref_reqs[60:]]
    reference_simulate(later, ref_reps)
    reqs = [SimRequest(*r) for r in rows]
    reps = [ReplicaSim(ReplicaLimits(30_000), CTX_TIMES) for _ in range(2)]
    simulate(reqs[:60], reps)
    later_new = [SimRequest(r.arrival_s + 1000.0, r.input_len, r.output_len, r.hash_ids) for r in reqs[60:]]
    simulate(later_new, reps)
    assert _outcome(reqs[:60] + later_new, reps) == _outcome(ref_reqs[:60] + later, ref_reps)


def _aging_prefixes(seed: int) -> list[tuple]:
    """Long requests on prefixes that short ones cached before them, among short requests with blocks of their own:
    in a full radix cache a long request's prefix grows old, and the step that finishes it may have to evict it
    just before the request inserts it again."""
    rnd = random.Random(seed)
    rows, now = [], 0.0
    for i in range(60):
        now += rnd.expovariate(30.0)
        if i % 6 == 0:
            p = rnd.randint(0, 3)
            rows.append((now, 2 * 512 + 1, rnd.randint(100, 300), (1000 + 10 * p, 1001 + 10 * p, 5000 + i)))
            rows.append((now, 2 * 512, 1, (1000 + 10 * p, 1001 + 10 * p)))
        else:
            k = rnd.randint(1, 3)
            rows.append((now, k * 512, rnd.randint(1, 20), tuple(10 ** 6 + 10 * i + j for j in range(k))))
    return sorted(rows, key=lambda r: r[0])


@pytest.mark.parametrize("seed, kv", [(175, 5000), (1, 3000), (2, 4000)])
def test_the_step_that_finishes_a_request_evicts_before_the_request_inserts_its_blocks(seed, kv):
    rows = _aging_prefixes(seed)
    ref_reqs = [SimRequest(*r) for r in rows]
    ref_reps = [ReferenceReplicaSim(ReplicaLimits(kv), CTX_TIMES)]
    reference_simulate(ref_reqs, ref_reps)
    reqs, reps = [SimRequest(*r) for r in rows], [ReplicaSim(ReplicaLimits(kv), CTX_TIMES)]
    simulate(reqs, reps)
    assert _outcome(reqs, reps) == _outcome(ref_reqs, ref_reps)


def test_tokens_reach_the_clients_no_faster_than_the_tokenizer_manager_streams_them():
    """`deliver`: a fluid queue served at the tokenizer manager's rate, hand-computed. One replica samples 100 tokens
    evenly over [0, 1) s; at 50 tokens/s the backlog at 1 s is 50 tokens, so what is sampled then reaches the client
    1 s later; at 200 tokens/s nothing waits."""
    def run(rate):
        reqs = [SimRequest(0.0, 10, 100), SimRequest(0.0, 10, 2)]
        reqs[0].first_token_s, reqs[0].finish_s = 0.0, 0.995
        reqs[1].first_token_s, reqs[1].finish_s = 0.5, 0.6
        log = [(0.0, 0.999, 100)]
        return deliver(reqs, [log], rate, bin_s=0.01)

    slow, fast = run(50.0), run(200.0)
    assert [(r.first_token_s, r.finish_s) for r in fast] == [(0.0, 0.995), (0.5, 0.6)]
    assert slow[0].finish_s == pytest.approx(0.995 + 1.0, abs=0.02)
    assert slow[1].first_token_s == pytest.approx(0.5 + 25.5 / 50, abs=0.03)  # 51 sampled by 0.51 s, 25.5 served
    with pytest.raises(ValueError, match="positive rate"):
        deliver([], [], 0.0)


@pytest.mark.parametrize("times", [CTX_TIMES, RELEASE_TIMES, "planner"])
def test_the_tokens_log_holds_every_sampled_token_once(times):
    """`ReplicaSim(log_tokens=True)`: every first token at its prefill's end and every decode step's tokens within
    its run, once each (no retraction here, so the log's tokens are the outputs), and the schedule unchanged."""
    times = _planner_times() if times == "planner" else times
    rows = _workload("poisson", 4, 200)
    plain = [ReplicaSim(ReplicaLimits(kv_tokens=400_000), times) for _ in range(2)]
    logged = [ReplicaSim(ReplicaLimits(kv_tokens=400_000), times, log_tokens=True) for _ in range(2)]
    a, b = [SimRequest(*r) for r in rows], [SimRequest(*r) for r in rows]
    simulate(a, plain)
    simulate(b, logged)
    assert _outcome(a, plain) == _outcome(b, logged) and plain[0].tokens_log is None
    assert sum(t for rep in logged for _, _, t in rep.tokens_log) == sum(r.output_len for r in b)
    assert all(s <= e for rep in logged for s, e, _ in rep.tokens_log)


# ---------------------------------------------------------------------------------------------------------------------
# Private blocks (`PrivateBlocks`, `SimRequest.private_blocks`): a request's last blocks that no other request of its
# replica has go in and out of the radix cache as one entry; the schedule and the cache's blocks are the reference's.

def _private_by_hand(requests, replicas):
    """`PrivateBlocks(requests)(replicas)`, one request at a time."""
    pending = sorted(requests, key=lambda r: r.arrival_s)
    private = {}
    for i in range(replicas):
        share = pending[i::replicas]
        uses = collections.Counter(h for r in share for h in r.hash_ids or ())
        for r in share:
            ids = list(r.hash_ids or ())
            k = 0
            while k < len(ids) and uses[ids[-1 - k]] == 1:
                k += 1
            private[id(r)] = k
    return [private[id(r)] for r in requests]


def test_private_blocks_are_the_last_blocks_no_other_request_of_the_replica_has():
    reqs = [SimRequest(0.0, 10, 1, (1, 2, 3)), SimRequest(0.5, 10, 1, None), SimRequest(0.2, 10, 1, (3, 4, 4, 5)),
            SimRequest(0.3, 10, 1, (7, "a", 8)), SimRequest(0.1, 10, 1, ()), SimRequest(0.4, 10, 1, (2, 9, 2 ** 70))]
    private = PrivateBlocks(reqs)
    # arrival order: 0, 4, 2, 3, 5, 1; one replica: 3 is shared (0, 2), 2 (0, 5), 4 twice in one prompt
    assert private(1) == [0, 0, 1, 3, 0, 2]
    assert [private(n) for n in (1, 2, 3, 4)] == [_private_by_hand(reqs, n) for n in (1, 2, 3, 4)]
    rows = _workload("prefix", 7, 200)
    many = [SimRequest(*r) for r in rows]
    assert [PrivateBlocks(many)(n) for n in (1, 2, 3)] == [_private_by_hand(many, n) for n in (1, 2, 3)]


@pytest.mark.parametrize("kind, seed, n, dp, kv", [("prefix", 7, 200, 1, 50_000), ("prefix", 8, 200, 2, 20_000),
                                                   ("prefix", 12, 120, 3, 15_000)])
def test_private_blocks_leave_the_first_implementations_schedule_as_it_is(kind, seed, n, dp, kv):
    rows = _workload(kind, seed, n)
    ref_reqs = [SimRequest(*r) for r in rows]
    ref_reps = [ReferenceReplicaSim(ReplicaLimits(kv), CTX_TIMES) for _ in range(dp)]
    reference_simulate(ref_reqs, ref_reps)
    plain = [SimRequest(*r) for r in rows]
    reqs = [SimRequest(*r, private_blocks=k) for r, k in zip(rows, PrivateBlocks(plain)(dp))]
    assert sum(r.private_blocks for r in reqs) > 0
    reps = [ReplicaSim(ReplicaLimits(kv), CTX_TIMES) for _ in range(dp)]
    simulate(reqs, reps)
    assert _outcome(reqs, reps) == _outcome(ref_reqs, ref_reps)
    assert any(run is not None for p in reps for run in p.cache.blocks.values())  # (runs were left in the cache)


@pytest.mark.parametrize("dp, kv", [(1, 400_000), (2, 150_000)])
def test_private_blocks_on_the_mooncake_trace(dp, kv):
    if not (TRACES / "conversation_trace.jsonl").is_file():
        pytest.skip(f"{TRACES / 'conversation_trace.jsonl'} missing")
    from sgl_sidp.bench.traces import load_trace

    times = _planner_times()
    rows = [(r.arrival_s, r.input_len, max(1, r.output_len), r.hash_ids)
            for r in load_trace(TRACES / "conversation_trace.jsonl")[:600]]
    ref_reqs = [SimRequest(*r) for r in rows]
    ref_reps = [ReferenceReplicaSim(ReplicaLimits(kv), StepTimes(times.decode_ms, times.prefill_ms,
                                                            longest_row=times.longest_row)) for _ in range(dp)]
    reference_simulate(ref_reqs, ref_reps)
    reqs = [SimRequest(*r, private_blocks=k) for r, k in zip(rows, PrivateBlocks(ref_reqs)(dp))]
    reps = [ReplicaSim(ReplicaLimits(kv), times) for _ in range(dp)]
    simulate(reqs, reps)
    assert _outcome(reqs, reps) == _outcome(ref_reqs, ref_reps)


@pytest.mark.parametrize("technique, dp, tp, sp, variant", [("vanilla", 1, 2, 1, ""), ("sidp", 2, 1, 1, "auto"),
                                                            ("dp_attention", 2, 1, 1, ""), ("shift", 1, 1, 2, "")])
def test_the_step_models_memos_give_its_forwards_as_computed_one_by_one(technique, dp, tp, sp, variant):
    """`StepModel`'s closures over its memos (`decode_run`, `prefill_ms`), whose misses compute a forward from the
    terms of its size computed once, against the forward computed from scratch (`_decode_uncached`, `_terms`)."""
    from sgl_sidp.plan.steps import CONTEXT_STEP

    model = _planner_model(technique, dp, tp, sp, variant)
    times = model.step_times()
    for b in (1, 2, 7, 31, 32, 33, 100, 300):
        for ctx in (0.0, 15.5, 16.0, 1000.25, 5000.0, 40_000.0):
            rounded = CONTEXT_STEP * round(ctx / CONTEXT_STEP)
            assert times.decode_run(b, ctx)[0] == model._decode_uncached(b, rounded, "")
    for parts in ([(512, 0)], [(7, 3000)], [(8192, 0)], [(300, 0), (200, 512)], [(20, 0)] * 5, [(4000, 100), (1, 0)]):
        for _ in range(2):  # (the second from the memo of one-request prefills)
            new = sum(n for n, _ in parts)
            assert times.prefill_ms(parts) == model._prefill_with(model._terms(new, prefill=True), parts)


def _planner_model(technique: str, dp: int, tp: int, sp: int = 1, variant: str = ""):
    """A StepModel of `technique` with `_planner_times`' made-up calibration (Shift: its shards a little apart)."""
    import dataclasses

    from sgl_sidp.calibration.memory import ModelShapes
    from sgl_sidp.calibration.table import Calibration
    from sgl_sidp.plan.comm import Interconnect, Link
    from sgl_sidp.plan.configs import Configuration
    from sgl_sidp.plan.steps import ShardClock, StepModel

    shapes = ModelShapes(layers=4, hidden=1024, heads=16, kv_heads=4, head_dim=64, vocab=1000, tied=False,
                         intermediate=4096)
    link = Link(latency_us=10.0, busbw_gbps=100.0, source="test")
    ops = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    ic = Interconnect("NVIDIA H200", {op: {2: link} for op in ops} | {"peer_copy": {2: Link(0.0, 100.0, "test")}})
    cal = Calibration(model="m", gpu="NVIDIA H200", decode_ms={1: 4.0, 32: 5.0, 256: 9.0},
                      prefill_ms={512: 10.0, 2048: 30.0, 8192: 125.0}, copy_gbps=None, source="test",
                      decode_ms_long={1: 4.5, 32: 7.0, 256: 21.0}, decode_context_long=4096)
    clock = ShardClock(cal, shapes.kv_bytes_per_token(1))
    clocks = ({"shift": clock, "base": ShardClock(dataclasses.replace(cal, decode_ms={1: 3.0, 32: 4.5, 256: 7.0}),
                                                  shapes.kv_bytes_per_token(1))}
              if technique == "shift" else {"forward": clock})
    return StepModel(Configuration("t", technique, dp, tp, sp, variant=variant), shapes, clocks, ic,
                     graph_max_bs=256)


def test_a_burst_after_a_lone_first_prompt_joins_the_next_iteration_chosen_once_the_first_is_launched():
    """An offline burst on the GPUs: the first prompt reaches the scheduler alone and is prefilled alone, the rest
    arrive during that forward, before SGLang's overlap scheduler chooses the next batch (it does so once it has
    launched the first). With that choice at the first forward's start instead, the lone request got a decode step of
    its own there, finished a step before the three that joined it, and every later cycle on the replica started with a
    lone prefill again: vanilla DP2's TPOT p50 on Qwen3-32B came out +51 % against the measured (2 x H100)."""
    times = StepTimes(decode_ms=lambda b, ctx: 30.0, prefill_ms=lambda parts: 0.06 * sum(n for n, _ in parts))
    decided = StepTimes(decode_ms=times.decode_ms, prefill_ms=times.prefill_ms, decide_ms=0.5)
    out = {}
    for name, t in (("at the start", times), ("once launched", decided)):
        reqs = [SimRequest(0.0 if i == 0 else 1e-6, 4096, 16) for i in range(12)]
        simulate(reqs, [ReplicaSim(ReplicaLimits(kv_tokens=4 * 4112 + 100), t)])
        out[name] = sorted({r.finish_s for r in reqs})
    assert len(out["once launched"]) == 3  # three cycles of four requests that finish together
    assert len(out["at the start"]) > 3


def test_a_prefills_first_tokens_leave_into_the_next_prefill_and_on_time_before_a_decode_step():
    """`StepTimes.release_share`: SGLang's overlap scheduler processes a prefill's results once it has launched the
    next batch, so with a prefill next they leave 0.7 of the way through it; the last prefill's leave as it ends (a
    decode step comes next); a one-token output finishes with its first token; a next forward no longer than
    `release_min_ms` releases them on time; the schedule is unchanged."""
    plain = StepTimes(decode_ms=lambda b, ctx: 10.0, prefill_ms=lambda parts: 0.1 * sum(n for n, _ in parts))
    rows = [(0.0, 1000, 4), (0.0, 1000, 1), (0.0, 1000, 4)]  # one prompt a batch (max_prefill_tokens 1,000)
    runs = {}
    for name, share, min_ms in (("release", 0.7, 99.0), ("short", 0.7, 100.0), ("plain", 0.0, 0.0)):
        t = StepTimes(decode_ms=plain.decode_ms, prefill_ms=plain.prefill_ms, release_share=share,
                      release_min_ms=min_ms)
        reqs, reps = [SimRequest(*r) for r in rows], [ReplicaSim(ReplicaLimits(100_000, max_prefill_tokens=1000), t)]
        simulate(reqs, reps)
        runs[name] = reqs, reps
    (late, reps), (plain_reqs, plain_reps) = runs["release"], runs["plain"]
    assert [r.first_token_s for r in plain_reqs] == pytest.approx([0.1, 0.2, 0.3])
    assert [r.first_token_s for r in late] == pytest.approx([0.17, 0.27, 0.3])  # 0.7 x 100 ms into the next
    assert [r.first_token_s for r in runs["short"][0]] == pytest.approx([0.1, 0.2, 0.3])
    assert late[1].finish_s == late[1].first_token_s  # its only token
    assert [r.finish_s for r in late[::2]] == [r.finish_s for r in plain_reqs[::2]]
    assert reps[0].clock == plain_reps[0].clock
