"""The scheduler simulation (`sgl_sidp.plan.sim`) against schedules computed by hand."""

import pytest

from sgl_sidp.plan.sim import ReplicaLimits, ReplicaSim, SimRequest, StepTimes, simulate, summarize

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
