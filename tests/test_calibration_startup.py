"""What a reader adds to the start-up calibration cache (`sgl_sidp.calibration.startup.record_copy_rates`)."""

from sgl_sidp.calibration.cache import CalibrationCache, CalibrationKey
from sgl_sidp.calibration.startup import record_copy_rates
from sgl_sidp.calibration.table import Calibration

KEY = CalibrationKey("NVIDIA H200", "MixtralForCausalLM L32 E8 H4096 I14336 A32/8 tp1", "torch.bfloat16", "", "triton", "0.5.17")
PROBE = {"copy_gbps_idle": 392.04, "copy_gbps_in_forward": 312.0, "forward_ms": 24.24,
         "forward_ms_with_copies": 26.40, "slowdown_ms_per_gb": 0.2312}


def test_copy_rates_complete_the_sources_entry_once(tmp_path):
    """A reader's first clean measurement fills the entry the source measured; a later one does not overwrite it."""
    cache = CalibrationCache(tmp_path)
    assert not record_copy_rates(KEY, PROBE, cache)  # nothing measured by the source yet: nothing to complete
    cache.put(KEY, Calibration(KEY.model, KEY.gpu, {1: 8.13}, {512: 37.9}, None, "measured at start-up"))
    assert record_copy_rates(KEY, PROBE, cache)
    got = cache.get(KEY)
    assert (got.copy_gbps, got.copy_rate_in_forward, got.copy_slowdown_ms_per_gb) == (392.0, 0.796, 0.231)
    assert got.decode_ms == {1: 8.13} and got.prefill_ms == {512: 37.9}  # the source's numbers stay
    assert not record_copy_rates(KEY, {**PROBE, "copy_gbps_idle": 100.0}, cache)
    assert cache.get(KEY).copy_gbps == 392.0


def test_calibrate_runtime_measures_on_dp_rank_0_only(monkeypatch):
    """`--sidp-calibrate`: DP rank 0's scheduler measures (through `ensure_forward_times`), other replicas do not."""
    from types import SimpleNamespace

    from sgl_sidp.calibration import startup

    calls = []
    monkeypatch.setattr(startup, "ensure_forward_times", lambda sched, who: calls.append(who))
    rt = startup.StartupCalibration(ctx=None)
    for dp, tp in [(0, 0), (0, 1), (1, 0), (None, 0)]:
        sched = SimpleNamespace(ps=SimpleNamespace(dp_rank=dp, tp_rank=tp))
        assert rt.on_scheduler_init("result", sched) == "result"
    assert calls == ["DP0 TP0", "DP0 TP1", "DP0 TP0"]
