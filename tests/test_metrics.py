"""Metric formulas (sgl_sidp.bench.metrics) on hand-made timings, checked by hand and against bench_serving."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sgl_sidp.bench.client import RequestOutput
from sgl_sidp.bench.metrics import SLO, compute_metrics, dispatch_lag_stats, request_tpot

DURATION_S = 2.0


def hand_outputs() -> list[RequestOutput]:
    """Four requests: three succeeded (one with a single token), one failed."""
    return [
        RequestOutput(
            True,
            start_time=0.0,
            ttft=0.1,
            latency=0.2,
            itl=[0.02, 0.03, 0.05],
            output_len=4,
            prompt_len=100,
            cached_tokens=0,
        ),
        RequestOutput(
            True, start_time=0.5, ttft=0.3, latency=0.45, itl=[0.15], output_len=2, prompt_len=300, cached_tokens=200
        ),
        RequestOutput(False, start_time=0.7, prompt_len=1000, error="HTTP 500"),
        RequestOutput(True, start_time=1.2, ttft=0.05, latency=0.06, output_len=1, prompt_len=50, cached_tokens=None),
    ]


def test_per_request_tpot():
    a, b, failed, single = hand_outputs()
    assert request_tpot(a) == pytest.approx((0.2 - 0.1) / 3)
    assert request_tpot(b) == pytest.approx(0.15)
    assert request_tpot(failed) is None and request_tpot(single) is None


def test_metrics_by_hand():
    m = compute_metrics(hand_outputs(), DURATION_S)
    assert (m["completed"], m["failed"]) == (3, 1)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (450, 7)
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["input_throughput"] == pytest.approx(225.0)
    assert m["output_throughput"] == pytest.approx(3.5)
    assert m["total_throughput"] == pytest.approx(228.5)
    # TTFT over successful requests [0.1, 0.3, 0.05] s
    assert m["mean_ttft_ms"] == pytest.approx(150.0)
    assert m["median_ttft_ms"] == pytest.approx(100.0)
    assert m["p90_ttft_ms"] == pytest.approx(260.0)  # linear interpolation: 100 + 0.8 * (300 - 100)
    assert m["std_ttft_ms"] == pytest.approx(np.std([100, 300, 50]))
    # TPOT only for output_len > 1: [33.33, 150] ms
    assert m["mean_tpot_ms"] == pytest.approx((100 / 3 + 150) / 2)
    # ITL is every streamed gap: [20, 30, 50, 150] ms
    assert m["mean_itl_ms"] == pytest.approx(62.5)
    assert m["median_itl_ms"] == pytest.approx(40.0)
    assert m["max_itl_ms"] == pytest.approx(150.0)
    # E2E [200, 450, 60] ms; concurrency = sum(E2E) / duration
    assert m["mean_e2e_latency_ms"] == pytest.approx(236.666666, rel=1e-6)
    assert m["p99_e2e_latency_ms"] == pytest.approx(450 - 0.02 * 250)
    assert m["concurrency"] == pytest.approx(0.71 / 2.0)
    # 1 s buckets from the first start: tokens at .1 .12 .15 .2 (a), .8 .95 (b) -> 6 in second 0; 1.25 (single)
    assert m["max_output_tokens_per_s"] == 6.0
    assert m["max_concurrent_requests"] == 2
    assert m["request_goodput"] is None
    # cache: only requests reporting cached_tokens count (a, b): 200 / 400
    assert m["cache_report"] == {
        "requests_reporting": 2,
        "total_prompt_tokens": 400,
        "total_cached_tokens": 200,
        "cache_hit_rate": 0.5,
    }


@pytest.mark.parametrize(
    "slo, good",
    [
        (SLO(ttft_ms=200), 2),  # b's TTFT 300 ms misses
        (SLO(ttft_ms=200, tpot_ms=30), 1),  # a's TPOT 33 ms misses; the single-token request counts TPOT as 0
        (SLO(e2e_ms=200), 2),  # inclusive: a's E2E of exactly 200 ms is good
        (SLO(ttft_ms=1000, tpot_ms=1000, e2e_ms=1000), 3),
        (SLO(tpot_ms=0.0), 1),
    ],
)
def test_goodput(slo, good):
    m = compute_metrics(hand_outputs(), DURATION_S, slo)
    assert m["good_completed"] == good
    assert m["request_goodput"] == pytest.approx(good / DURATION_S)


def test_all_failed_and_empty():
    m = compute_metrics([RequestOutput(False, error="boom")], 1.0, SLO(ttft_ms=1))
    assert (m["completed"], m["failed"], m["request_goodput"]) == (0, 1, 0.0)
    assert m["mean_ttft_ms"] == 0.0 and m["mean_e2e_latency_ms"] == 0.0
    assert m["cache_report"]["cache_hit_rate"] is None
    with pytest.raises(ValueError):
        compute_metrics([], 0.0)


def test_dispatch_lag_stats():
    s = dispatch_lag_stats([0.001, 0.002, 0.003, 0.010])
    assert s["mean_dispatch_lag_ms"] == pytest.approx(4.0)
    assert s["median_dispatch_lag_ms"] == pytest.approx(2.5)
    assert s["max_dispatch_lag_ms"] == pytest.approx(10.0)


def test_matches_bench_serving_calculate_metrics():
    """Same inputs through sglang.bench_serving's own calculate_metrics: every shared key agrees."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        serving = pytest.importorskip("sglang.benchmark.serving", reason="SGLang's bench_serving is not importable")
    from sglang.benchmark.datasets.common import DatasetRow

    class NoTokenizer:  # retokenized counts are not compared
        def encode(self, text, add_special_tokens=False):
            return []

    ours = hand_outputs()
    theirs = [
        serving.RequestFuncOutput(
            success=o.success,
            latency=o.latency,
            ttft=o.ttft,
            itl=list(o.itl),
            prompt_len=o.prompt_len,
            output_len=o.output_len,
            start_time=o.start_time,
            error=o.error,
        )
        for o in ours
    ]
    rows = [DatasetRow(prompt=[1], prompt_len=o.prompt_len, output_len=o.output_len) for o in ours]
    ref, _ = serving.calculate_metrics(rows, theirs, DURATION_S, NoTokenizer(), "sglang")
    m = compute_metrics(ours, DURATION_S)
    renamed = {"total_input": "total_input_tokens", "total_output": "total_output_tokens"}
    compared = 0
    for field, value in vars(ref).items():
        key = renamed.get(field, field)
        if key in m and not isinstance(m[key], dict):
            assert m[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
            compared += 1
    assert compared >= 30
