"""The planner's interconnect table (`sgl_sidp.plan.comm`): times, the bundled tables, and `measure-comm`'s measuring
and fitting path on gloo."""

import json

import pytest

from sgl_sidp.plan.comm import OPS, Interconnect, InterconnectError, bus_factor, fit
from tests.gloo_procs import spawn


def test_times_follow_latency_plus_bytes_over_algorithm_bandwidth():
    ic = Interconnect.load("NVIDIA H200")
    link = ic.links["all_reduce"][2]
    assert ic.time_us("all_reduce", 2, 1e6) == pytest.approx(link.latency_us + 1e6 / (link.busbw_gbps * 1e3))  # 2(n-1)/n = 1
    assert ic.time_us("all_gather", 8, 7e6) == pytest.approx(ic.links["all_gather"][8].latency_us
                                                             + 7e6 / (ic.links["all_gather"][8].busbw_gbps / (7 / 8) * 1e3))
    assert ic.time_us("all_reduce", 1, 1e9) == 0.0
    with pytest.raises(InterconnectError, match="no all_reduce over 16 GPUs"):
        ic.time_us("all_reduce", 16, 1.0)


def test_bundled_tables_say_where_each_number_comes_from():
    for gpu in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "H100"):
        ic = Interconnect.load(gpu)
        assert set(ic.links) == set(OPS)
        for by_n in ic.links.values():
            for link in by_n.values():
                # measured on a node, or taken from public figures and saying what was assumed
                assert "measured" in link.source or ("public" in link.source and "assumed" in link.source), link
    with pytest.raises(InterconnectError, match="no interconnect table for GPU 'NVIDIA A10'"):
        Interconnect.load("NVIDIA A10")
    assert Interconnect.from_json(Interconnect.load("H200").to_json()) == Interconnect.load("H200")


def test_fit_recovers_latency_and_bus_bandwidth():
    lat, busbw = 9.0, 400.0
    pts = [(b, lat + b / (busbw / bus_factor("all_reduce", 4) * 1e3)) for b in (1e3, 1e5, 1e6, 1e7)]
    got = fit(pts, "all_reduce", 4)
    assert got == pytest.approx((lat, busbw), rel=1e-6)


def _measure(rank, world):
    import torch

    from sgl_sidp.plan.comm import measure

    out = {}
    for op in ("all_reduce", "broadcast", "all_to_all"):
        pts = measure(op, None, [4096, 65536], lambda nbytes: torch.ones(nbytes // 4), iters=3)
        out[op] = fit(pts, op, world)
    return out


def test_measure_comm_times_collectives_on_a_process_group():
    """The measuring path `plan measure-comm` runs on GPUs (NCCL), here on 2 CPU processes (gloo): every rank gets
    a fit per collective; the numbers themselves mean nothing on CPU."""
    res = spawn(_measure, 2)
    for rank in (0, 1):
        assert set(res[rank]) == {"all_reduce", "broadcast", "all_to_all"}
        assert all(lat >= 0 and bw > 0 for lat, bw in res[rank].values())


def test_measure_comm_writes_a_table_plan_can_load(tmp_path):
    """`plan measure-comm` end to end on 2 CPU processes (gloo): a table with every collective over 2 ranks that
    `Interconnect` loads (no peer copy without GPUs)."""
    import subprocess
    import sys

    out = tmp_path / "cpu.json"
    r = subprocess.run([sys.executable, "-m", "sgl_sidp.plan", "measure-comm", "--gpus", "2", "--backend", "gloo",
                        "--iters", "2", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    table = Interconnect.from_json(json.loads(out.read_text()))
    assert set(table.links) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"}
    assert all(set(by_n) == {2} for by_n in table.links.values()) and table.time_us("all_reduce", 2, 1 << 20) > 0
    bad = subprocess.run([sys.executable, "-m", "sgl_sidp.plan", "measure-comm", "--gpus", "1"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == ["sgl-sidp plan measure-comm: error: --gpus must be at least 2"]


def test_the_all_reduce_inside_tp_forwards_is_the_server_less_its_shard_per_all_reduce():
    """`forward_all_reduce_points`: a TP2 forward is its shard's plus 2L all-reduces of the tokens' hidden states,
    so (real - shard) / 2L at each point both have, and `fit` of those gives back the all-reduce; prefills under
    2,048 tokens (host-bound) are left out."""
    from sgl_sidp.calibration.table import Calibration
    from sgl_sidp.plan.comm import forward_all_reduce_points

    layers, hidden, lat, busbw = 4, 1024, 3.0, 250.0
    ar_ms = lambda tokens: 2 * layers * (lat + tokens * hidden * 2 / (busbw * 1e3)) / 1e3  # noqa: E731
    shard = Calibration(model="m", gpu="NVIDIA H200", decode_ms={1: 2.0, 64: 3.0, 256: 5.0},
                        prefill_ms={512: 9.0, 2048: 20.0, 8192: 70.0}, copy_gbps=None, source="test",
                        decode_ms_long={64: 6.0, 256: 12.0}, decode_context_long=2048)
    real = Calibration(model="m tp2", gpu="NVIDIA H200", decode_ms={b: ms + ar_ms(b) for b, ms in shard.decode_ms.items()},
                       prefill_ms={t: ms + ar_ms(t) + (5.0 if t < 2048 else 0.0) for t, ms in shard.prefill_ms.items()},
                       copy_gbps=None, source="test", decode_ms_long={b: ms + ar_ms(b) for b, ms in shard.decode_ms_long.items()},
                       decode_context_long=2048)
    pts = forward_all_reduce_points(real, shard, layers, hidden)
    assert len(pts) == 3 + 2 + 2
    assert fit(pts, "all_reduce", 2) == pytest.approx((lat, busbw), rel=1e-6)
