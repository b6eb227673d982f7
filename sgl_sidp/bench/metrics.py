"""Serving metrics, defined exactly as ``sglang.bench_serving.calculate_metrics`` defines them.

Per successful request: TTFT; TPOT = (latency - TTFT) / (output_len - 1), only when output_len > 1; ITL = the
gaps between streamed chunks, each split evenly over the tokens the chunk brought; E2E latency = latency.
Aggregates: mean, median, std, p90, p95, p99 (``numpy.percentile``, linear) in ms; throughputs over the benchmark
duration; concurrency = sum(E2E) / duration; peak output tokens/s and peak concurrent requests over 1 s buckets.

Goodput (bench_serving 0.5.17 has none; this is vLLM's ``benchmark_serving`` definition): successful requests
that meet every given SLO (TTFT, TPOT, E2E; a request with output_len <= 1 counts TPOT as 0), per second of the
benchmark duration. Also here: the prefix-cache hit rate (bench_serving's ``--cache-report``: sum of cached
tokens / sum of prompt tokens over successful requests) and the dispatch lag of a trace replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sgl_sidp.bench.client import RequestOutput

STATS = ("mean", "median", "std", "p90", "p95", "p99")


@dataclass(frozen=True)
class SLO:
    """Service-level objectives for goodput, in ms; ``None`` means no objective on that metric."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def is_set(self) -> bool:
        """True when at least one objective is given."""
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))

    def met_by(self, ttft_s: float, tpot_s: float, e2e_s: float) -> bool:
        """Whether a request with these timings (s) meets every objective (inclusive: equal is good)."""
        pairs = ((self.ttft_ms, ttft_s), (self.tpot_ms, tpot_s), (self.e2e_ms, e2e_s))
        return all(slo_ms / 1000 >= value for slo_ms, value in pairs if slo_ms is not None)


def request_tpot(out: RequestOutput) -> float | None:
    """TPOT of one request in seconds: ``(latency - ttft) / (output_len - 1)``; ``None`` if it failed or
    generated at most one token."""
    if not out.success or out.output_len <= 1:
        return None
    return (out.latency - out.ttft) / (out.output_len - 1)


def summarize_ms(values_s: Sequence[float], name: str) -> dict[str, float]:
    """``{mean,median,std,p90,p95,p99}_{name}_ms`` of values given in seconds, bench_serving style (an empty input
    gives zeros, as bench_serving's ``np.mean(x or 0)`` does)."""
    x = list(values_s) or 0
    return {
        f"mean_{name}_ms": float(np.mean(x) * 1000),
        f"median_{name}_ms": float(np.median(x) * 1000),
        f"std_{name}_ms": float(np.std(x) * 1000),
        f"p90_{name}_ms": float(np.percentile(x, 90) * 1000),
        f"p95_{name}_ms": float(np.percentile(x, 95) * 1000),
        f"p99_{name}_ms": float(np.percentile(x, 99) * 1000),
    }


def token_times(out: RequestOutput) -> np.ndarray:
    """(output tokens,) float64: when the client received each token of `out` (s, `time.perf_counter()` clock): its
    send time plus TTFT, then the inter-token gaps summed in bench_serving's order."""
    return np.cumsum([out.start_time + out.ttft, *out.itl])


def _peaks(outputs: Sequence[RequestOutput]) -> tuple[float, int]:
    """Peak output tokens/s and peak concurrent requests over 1 s buckets (bench_serving's algorithm)."""
    ok = [o for o in outputs if o.success]
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    n_buckets = int(np.ceil(max(o.start_time + o.latency for o in ok) - t0)) + 1
    tokens = np.zeros(n_buckets)
    running = np.zeros(n_buckets)
    for o in ok:
        buckets = (token_times(o) - t0).astype(np.int64)
        np.add.at(tokens, buckets[(buckets >= 0) & (buckets < n_buckets)], 1)
        first, last = int(o.start_time - t0), int(o.start_time + o.latency - t0)
        running[first : min(last + 1, n_buckets)] += 1
    return float(tokens.max()), int(running.max())


def compute_metrics(outputs: Sequence[RequestOutput], duration_s: float, slo: SLO | None = None) -> dict:
    """All serving metrics of a run, keyed like bench_serving's result JSON.

    Args:
        outputs: one :class:`RequestOutput` per request sent (failed ones included).
        duration_s: benchmark duration in seconds (first dispatch to last completion).
        slo: objectives for goodput; without any, ``request_goodput`` is ``None``.

    Returns:
        A flat dict: ``completed``, ``failed``, token totals, throughputs (req/s, tok/s), TTFT/TPOT/ITL/E2E stats in
        ms, ``max_itl_ms``, ``concurrency``, peaks, goodput and the cache report.

    Raises:
        ValueError: ``duration_s`` <= 0.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    ok = [o for o in outputs if o.success]
    ttfts = [o.ttft for o in ok]
    e2es = [o.latency for o in ok]
    tpots = [t for t in map(request_tpot, ok) if t is not None]
    itls = [x for o in ok for x in o.itl]
    total_input = sum(o.prompt_len for o in ok)
    total_output = sum(o.output_len for o in ok)
    peak_tok_s, peak_running = _peaks(outputs)

    metrics: dict = {
        "completed": len(ok),
        "failed": len(outputs) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration_s,
        "input_throughput": total_input / duration_s,
        "output_throughput": total_output / duration_s,
        "total_throughput": (total_input + total_output) / duration_s,
        **summarize_ms(e2es, "e2e_latency"),
        **summarize_ms(ttfts, "ttft"),
        **summarize_ms(tpots, "tpot"),
        **summarize_ms(itls, "itl"),
        "max_itl_ms": float(np.max(itls or 0) * 1000),
        "concurrency": float(np.sum(e2es) / duration_s),
        "max_output_tokens_per_s": peak_tok_s,
        "max_concurrent_requests": peak_running,
    }

    if slo is not None and slo.is_set():
        good = sum(slo.met_by(o.ttft, request_tpot(o) or 0.0, o.latency) for o in ok)
        metrics.update(good_completed=good, request_goodput=good / duration_s)
    else:
        metrics.update(good_completed=None, request_goodput=None)

    reported = [o for o in ok if o.cached_tokens is not None]
    prompt_tokens = sum(o.prompt_len for o in reported)
    cached = sum(o.cached_tokens for o in reported)
    metrics["cache_report"] = {
        "requests_reporting": len(reported),
        "total_prompt_tokens": prompt_tokens,
        "total_cached_tokens": cached,
        "cache_hit_rate": cached / prompt_tokens if prompt_tokens else None,
    }
    return metrics


def dispatch_lag_stats(lags_s: Sequence[float]) -> dict[str, float]:
    """Dispatch lag (actual send - target send time, s) stats in ms: mean, median, std, p90, p95, p99, max."""
    stats = summarize_ms(lags_s, "dispatch_lag")
    stats["max_dispatch_lag_ms"] = float(np.max(lags_s) * 1000) if len(lags_s) else 0.0
    return stats
