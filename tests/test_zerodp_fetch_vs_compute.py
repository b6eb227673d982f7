"""The fetch-vs-compute table builder (`scripts/zerodp_fetch_vs_compute.py`) on log snippets."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("fvc", Path(__file__).resolve().parents[1] / "scripts" / "zerodp_fetch_vs_compute.py")
fvc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fvc)

LOG = """Warmup ...
Prefill. latency: 1.17282 s, throughput:  27939.57 token/s
Decode 0. Batch size: 128, latency: 0.04088 s, throughput:   3131.40 token/s
Decode.  median latency: 0.01991 s, median throughput:   6428.98 token/s
Benchmark ...
Prefill. latency: 0.04440 s, throughput:  46126.85 token/s
Decode 0. Batch size: 1, latency: 0.00600 s, throughput:   166.59 token/s
Decode.  median latency: 0.00591 s, median throughput:    169.11 token/s
Prefill. latency: 0.13650 s, throughput:  60012.70 token/s
Decode 0. Batch size: 4, latency: 0.00871 s, throughput:   459.07 token/s
Decode.  median latency: 0.00871 s, median throughput:    459.07 token/s
"""


def test_parse_skips_warmup_and_recovers_tokens():
    """Runs after the warm-up only; prefill tokens = latency x throughput; decode = median step."""
    runs = fvc.parse_bench_one_batch(LOG)
    assert [(r["bs"], r["prefill_tokens"]) for r in runs] == [(1, 2048), (4, 8192)]
    assert runs[0]["decode_ms"] == 5.91 and round(runs[1]["prefill_ms"], 1) == 136.5


def test_build_table_and_calibration():
    """Copy rate from the one-layer pull; layers that fit = 85% of the forward over one layer's pull time."""
    copy = {"peer_copy_peak_gbps": {"1": 394.0}, "rounds": [{"per_sink": [{"layer_bytes": 1_208_000_000, "eager_ms": 3.53, "graph_ms": 3.52}]}]}
    cal, md = fvc.build(copy, fvc.parse_bench_one_batch(LOG))
    assert cal["decode_ms"] == {1: 5.91, 4: 8.71} and cal["prefill_ms"] == {2048: 44.4, 8192: 136.5}
    assert cal["copy_gbps"] == round(1_208_000_000 / 3.53 / 1e6, 1)
    assert "| prefill, 8192 tokens | 136.50 | 32 |" in "\n".join(md)
