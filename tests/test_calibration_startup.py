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
    """`--overlay-calibrate`: DP rank 0's scheduler measures (through `ensure_forward_times`), other replicas do not."""
    from types import SimpleNamespace

    from sglang.srt.distributed import parallel_state

    from sgl_sidp.calibration import startup

    calls = []
    monkeypatch.setattr(startup, "ensure_forward_times", lambda sched, who: calls.append(who))
    rt = startup.StartupCalibration(ctx=None)
    for dp, tp in [(0, 0), (0, 1), (1, 0), (None, 0)]:
        # the DP rank from the scheduler's `ps`, the TP rank from SGLang's TP group
        monkeypatch.setattr(parallel_state, "get_tp_group", lambda tp=tp: SimpleNamespace(rank_in_group=tp, world_size=2))
        sched = SimpleNamespace(ps=SimpleNamespace(dp_rank=dp))
        assert rt.on_scheduler_init("result", sched) == "result"
    assert calls == ["DP0 TP0", "DP0 TP1", "DP0 TP0"]


def test_forward_time_measurement_logs_its_phase(monkeypatch, caplog):
    """While the start-up calibration measures, it logs (every `PROGRESS_EVERY_S`, 10 s in a server) which point it
    measures: decode batch x of y at a context, an eager decode batch, or a prefill of T tokens; with its budget. The
    eager batches run with SGLang's decode graphs unset, at the short context only, and the graphs are back
    afterwards. A long-context point whose rows would share one row's KV is not timed."""
    import logging
    import re
    import time
    from types import SimpleNamespace

    from sgl_sidp import process
    from sgl_sidp.calibration import measure

    class Probe:  # a decode batch on CPU: SGLang's forward stands in as a sleep (`pipelined_ms`, `median_ms` below)
        used_graph, shared_kv = True, False

        def __init__(self, runner, bs, ctx):
            assert not self.shares_kv(runner, bs, ctx) or ctx == 256, "a point whose rows would share KV was timed"
            self.run = lambda: None

        @staticmethod
        def shares_kv(runner, bs, ctx):
            return bs * ctx > 4096  # batch 4 at 2,048 tokens has no room of its own

        def close(self):
            pass

    def slow(ms):
        def f(*args, **kwargs):
            time.sleep(0.06)
            return ms
        return f

    monkeypatch.setattr(process, "PROGRESS_EVERY_S", 0.02)
    monkeypatch.setattr(measure, "feasible_points", lambda scheduler: ([1, 4], [256, 2048], [512], [(2, 256)]))
    monkeypatch.setattr(measure, "kv_bytes_per_token", lambda runner: 1000)
    monkeypatch.setattr(measure, "DecodeProbe", Probe)
    monkeypatch.setattr(measure, "pipelined_ms", slow(4.0))
    monkeypatch.setattr(measure, "median_ms", slow(5.0))
    monkeypatch.setattr(measure, "time_prefill", slow(30.0))
    runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(size=600), decode_cuda_graph_runner="graphs")
    graphs_seen = []
    monkeypatch.setattr(measure, "pipelined_ms", lambda fn, iters: (graphs_seen.append(runner.decode_cuda_graph_runner),
                                                                    slow(4.0)())[1])
    scheduler = SimpleNamespace(tp_worker=SimpleNamespace(model_runner=runner))
    with caplog.at_level(logging.INFO, logger=measure.__name__):
        m = measure.measure_forwards(scheduler, who="DP0 TP0")
    assert m["decode_ms"] == {1: 4.0, 4: 4.0} and m["decode_ms_alone"] == {1: 5.0, 4: 5.0}
    assert m["decode_ms_eager"] == {256: 4.0, 512: 4.0} and m["decode_eager_context"] == 256
    assert graphs_seen == ["graphs"] * 3 + [None] * 2 and runner.decode_cuda_graph_runner == "graphs"
    assert m["decode_ms_long"] == {1: 4.0} and m["prefill_ms"] == {512: 30.0} and m["prefill_multi_ms"] == [(2, 256, 30.0)]
    lines = [r.getMessage() for r in caplog.records]
    head = r"sgl-sidp DP0 TP0: start-up calibration of the forward times: \d+ s so far, limit 60 s; now "
    assert all(re.fullmatch(head + r"(decode batch (1 \(1|4 \(2) of 2\) at (256|2048) tokens of context|"
                                   r"eager decode batch (256|512) at 256 tokens of context|prefill of 512 tokens \(1 of 1\)|"
                                   r"prefill of 2 prompts of 256 tokens \(1 of 1\))", m)
               for m in lines), lines
    assert any("decode batch 4 (2 of 2)" in m for m in lines) and any("prefill of 512" in m for m in lines)
    assert m["skipped"] == [] and "time budget" not in measure.describe_measurement(m)
    spent = measure.measure_forwards(scheduler, budget_s=0.0)  # every point past its budget: named, not measured
    assert spent["skipped"] == ["decode batches [1, 4]", "eager decode batches [256, 512]", "prefills of [512] tokens",
                                "prefills of several prompts [(2, 256)]"]
    assert spent["decode_ms"] == spent["prefill_ms"] == {}
    assert measure.describe_measurement(spent).endswith("not measured (past the time budget): decode batches [1, 4], "
                                                        "eager decode batches [256, 512], prefills of [512] tokens, "
                                                        "prefills of several prompts [(2, 256)]")
