"""ZeroDP's per-process runtime (`sgl_sidp.zerodp.runtime.ZeroDPRuntime`): its hook bodies where they need no GPU."""

import logging
import types

import pytest
import torch

from sgl_sidp.config import SidpConfig
from sgl_sidp.control.batch_signal import BatchSignalObserver, IterationSignal
from sgl_sidp.plugin import PluginContext
from sgl_sidp.prefetch.binding import SlotBinding
from sgl_sidp.prefetch.ring import SimulatedStreams
from sgl_sidp.zerodp.policy import OffloadPlan, ZeroDPError
from sgl_sidp.zerodp.runtime import ZeroDPMetrics, ZeroDPRuntime, collect_moe_layers


def runtime():
    ctx = PluginContext(SidpConfig(mode="zerodp"), [])
    return ZeroDPRuntime(ctx), ctx


class Experts(torch.nn.Module):
    """A CPU stand-in for an MoE layer's experts: y = x @ w13 @ w2."""

    def __init__(self, layer_id, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.layer_id = layer_id
        self.w13_weight = torch.nn.Parameter(torch.randn(4, 4, generator=g), requires_grad=False)
        self.w2_weight = torch.nn.Parameter(torch.randn(4, 4, generator=g), requires_grad=False)


def run_moe_core(layer, x):
    return x @ layer.w13_weight @ layer.w2_weight


def test_resident_layers_run_sglangs_code_untouched():
    """Without a slot ring (a source, or a sink that offloads nothing) the AROUND hook only calls SGLang's code."""
    rt, _ = runtime()
    layer = types.SimpleNamespace(layer_id=3)
    assert rt.around_run_moe_core(lambda self, x: ("ran", self.layer_id, x), layer, 7) == ("ran", 3, 7)


@pytest.mark.parametrize("policy", ["earliest", "latest"])
def test_offloaded_layers_compute_on_the_owners_weights(policy):
    """A sink whose layers 1 and 3 are bound to a 2-slot ring gets the owner's (distinct) weights in every layer."""
    layers = {i: Experts(i, seed=i) for i in range(4)}
    owner = {(i, n): getattr(m, n).detach().clone() for i, m in layers.items() for n in ("w13_weight", "w2_weight")}
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(9))
    ref = [run_moe_core(layers[i], x) for i in range(4)]
    rt, _ = runtime()
    ops = SimulatedStreams(policy)
    rt.binding = SlotBinding(layers, ("w13_weight", "w2_weight"), owner, (1, 3), 2, ops)
    for _ in range(2):  # two forwards through the same slots
        rt.binding.start_forward()
        out = [rt.around_run_moe_core(run_moe_core, layers[i], x) for i in range(4)]
        assert all(torch.equal(a, b) for a, b in zip(out, ref))
    ops.finish()


def test_kv_capacity_is_recorded_for_a_role_only(caplog):
    """Before ZeroDP set up a role (or for a draft model) the pool hook does nothing; a sink logs its KV and freed GB."""
    rt, _ = runtime()
    runner = types.SimpleNamespace(max_total_num_tokens=703052, is_draft_worker=False)
    assert rt.on_alloc_memory_pool("r", runner) == "r" and rt.kv_tokens is None and rt.status() == {}
    rt.role, rt.dp_rank = "sink", 1
    with caplog.at_level(logging.INFO, logger="sgl_sidp.zerodp.runtime"):
        rt.on_alloc_memory_pool(None, runner)
    assert rt.kv_tokens == 703052 and rt.status()["kv_tokens"] == 703052
    assert "sgl-sidp zerodp DP1 TP0: sink KV cache 703052 tokens (max_total_num_tokens), 0.00 GB of experts freed" in caplog.text


def test_metrics_follow_the_batch_signal_through_the_shared_context():
    """The runtime subscribes to the plugin context at construction, so the batch-signal observer (built later,
    with the same listener list) feeds its metrics: one forward's planned bytes per busy iteration."""
    from prometheus_client import CollectorRegistry

    rt, ctx = runtime()
    rt.role, rt.kv_tokens = "sink", 162380
    rt.plan = OffloadPlan((11, 23), ("w13", "w2"), 2_400_000_000, 6.1, 14.9, "test")
    reg = CollectorRegistry()
    rt.metrics = ZeroDPMetrics(rt, {"dp_rank": "1"}, registry=reg)
    obs = BatchSignalObserver(log_interval=100, listeners=ctx.listeners)
    sig = IterationSignal("DECODE", 4, 4, 0, 4, 0)
    obs.record(sig)
    obs.record(sig)
    obs.record(IterationSignal("IDLE", 0, 0, 0, 0, 0))  # idle iterations run no forward
    labels = {"dp_rank": "1", "role": "sink"}
    assert reg.get_sample_value("sglang:sidp_zerodp_bytes_pulled_total", labels) == 4.8e9
    assert reg.get_sample_value("sglang:sidp_zerodp_kv_tokens", labels) == 162380
    assert reg.get_sample_value("sglang:sidp_zerodp_offloaded_layers", labels) == 2
    assert reg.get_sample_value("sglang:sidp_zerodp_copy_ms_per_forward_estimate", labels) == 6.1


def test_moe_layers_whose_experts_run_elsewhere_are_refused():
    """A FusedMoE subclass with its own run_moe_core (SGLang's DeepEPMoE) would bypass a sink's sync points."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    class OwnCore(FusedMoE):
        def run_moe_core(self, dispatch_output):
            return dispatch_output

    def bare(cls, layer_id):
        m = cls.__new__(cls)
        torch.nn.Module.__init__(m)
        m.layer_id = layer_id
        return m

    model = torch.nn.ModuleList([bare(FusedMoE, 1), bare(FusedMoE, 0)])
    assert [lid for lid, _ in collect_moe_layers(model)] == [0, 1]
    with pytest.raises(ZeroDPError, match="class OwnCore, whose run_moe_core is not FusedMoE's"):
        collect_moe_layers(torch.nn.ModuleList([bare(FusedMoE, 0), bare(OwnCore, 1)]))


def test_kv_bytes_per_token_matches_sglang_for_qwen3_moe(tmp_path, monkeypatch):
    """GQA: 2 (K, V) x 48 layers x 4 KV heads x 128 x 2 bytes (bf16) = 98,304, the cell size SGLang logs for
    Qwen3-30B-A3B; an fp8 KV cache halves it; TP=2 splits the 4 KV heads."""
    import json

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import parallel_state

    from sgl_sidp.calibration.measure import kv_bytes_per_token

    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "torch_dtype": "bfloat16",
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    mc = ModelConfig(model_path=str(tmp_path))
    def runner(kv, tp):  # the TP size comes from SGLang's TP group
        monkeypatch.setattr(parallel_state, "get_tp_group", lambda: types.SimpleNamespace(rank_in_group=0, world_size=tp))
        return types.SimpleNamespace(model_config=mc, server_args=types.SimpleNamespace(kv_cache_dtype=kv))

    assert kv_bytes_per_token(runner("auto", 1)) == 98_304
    assert kv_bytes_per_token(runner("fp8_e4m3", 1)) == 49_152
    assert kv_bytes_per_token(runner("auto", 2)) == 49_152


class ScaledExperts(Experts):
    """Experts with a scale in the w13 group and a resident tensor in none (as SGLang's quantized FusedMoE)."""

    def __init__(self, layer_id, seed):
        super().__init__(layer_id, seed)
        self.w13_weight_scale = torch.nn.Parameter(torch.ones(4), requires_grad=False)
        self.e_score_correction_bias = torch.nn.Parameter(torch.zeros(4), requires_grad=False)


@pytest.mark.parametrize("tensors, taken", [("w13,w2", ["w13_weight", "w2_weight", "w13_weight_scale"]),
                                            ("w13", ["w13_weight", "w13_weight_scale"])])
def test_a_sinks_experts_take_no_memory_while_its_model_loads(tensors, taken):
    """AFTER FusedMoE.__init__, while a sink loads (`placeholders.loading`, set by around_load_model for DP rank > 0), the
    layer's tensors of the offloadable groups point at shared placeholders; resident tensors and a source's (or a
    finished load's) layers are left alone."""
    rt, _ = runtime()
    rt.settings = rt.settings.model_copy(update={"tensors": tensors})
    a, b = ScaledExperts(0, seed=1), ScaledExperts(1, seed=2)
    with rt.placeholders.placing():
        for m in (a, b):
            assert rt.after_moe_init("result", m) == "result"
    c = ScaledExperts(2, seed=3)
    rt.after_moe_init(None, c)
    assert rt.placeholders.taken == {0: tuple(taken), 1: tuple(taken)}
    for n in taken:
        assert getattr(a, n).untyped_storage().data_ptr() == getattr(b, n).untyped_storage().data_ptr()
        assert not rt.placeholders.holds(getattr(c, n))
    assert a.e_score_correction_bias.untyped_storage().data_ptr() != b.e_score_correction_bias.untyped_storage().data_ptr()


def test_load_model_places_only_a_sinks_experts():
    """AROUND ModelRunner.load_model: `placeholders.loading` is on while a sink (DP rank > 0) builds its model, off for the
    source and afterwards, even when loading fails."""
    rt, _ = runtime()
    seen = []
    rt.on_loaded = lambda runner: seen.append(("loaded", runner.ps.dp_rank))

    def load(runner):
        seen.append(("placing", rt.placeholders.loading))
        return "model"

    for dp in (0, 1):
        runner = types.SimpleNamespace(ps=types.SimpleNamespace(dp_rank=dp))
        assert rt.around_load_model(load, runner) == "model"
    assert seen == [("placing", False), ("loaded", 0), ("placing", True), ("loaded", 1)]

    def boom(runner):
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        rt.around_load_model(boom, types.SimpleNamespace(ps=types.SimpleNamespace(dp_rank=1)))
    assert rt.placeholders.loading is False


def test_a_sink_waiting_for_its_sources_calibration_logs_progress(monkeypatch, tmp_path, caplog):
    """`auto` on a first start: while the sink waits for the source to measure, it logs (every `PROGRESS_EVERY_S`,
    10 s in a server) for whom it waits, where, how long so far and the limit; then it takes the source's result."""
    import os
    import threading

    from sgl_sidp import process
    from sgl_sidp.calibration import startup
    from sgl_sidp.calibration.cache import CalibrationCache, CalibrationKey
    from sgl_sidp.calibration.table import Calibration

    monkeypatch.setattr(process, "PROGRESS_EVERY_S", 0.05)
    monkeypatch.setenv("SIDP_CALIBRATION_DIR", str(tmp_path))
    key = CalibrationKey("NVIDIA H200", "tiny-moe tp1", "torch.bfloat16", "", "triton", "0.5.17")
    monkeypatch.setattr(startup, "calibration_key", lambda runner: key)
    rt, _ = runtime()
    rt.settings = rt.settings.model_copy(update={"source_timeout_s": 5.0})
    rt.dp_rank, rt.tp_rank = 1, 0
    measured = Calibration(key.model, key.gpu, {1: 8.0}, {512: 30.0}, None, "measured at start-up", measure_s=1.5)
    source = threading.Timer(0.2, lambda: CalibrationCache().put(key, measured))
    source.start()
    with caplog.at_level(logging.INFO, logger="sgl_sidp.zerodp.runtime"):
        cal, origin = rt._calibration(None, types.SimpleNamespace(owner_pid=os.getpid()))
    source.join()
    assert cal.decode_ms == {1: 8.0} and origin.startswith("measured by the source at start-up (1.5 s; waited ")
    waits = [r.getMessage() for r in caplog.records if "waits for" in r.getMessage()]
    expected = (f"sgl-sidp zerodp DP1 TP0 waits for the start-up calibration of zerodp source DP0 TP0 (pid {os.getpid()}) "
                f"in {CalibrationCache().path(key)}: ")
    assert waits and all(m.startswith(expected) and m.endswith(" s so far, limit 5 s") for m in waits)


def test_a_copy_bound_sink_says_so_with_the_predicted_slowdown(caplog):
    """Issue 35's case (all 48 layers of Qwen3-30B-A3B on 2 x H100: 146 ms of copies per forward against 4.6-28 ms
    decode forwards) gets one warning with the predicted decode step and the prefills that hide it; a plan whose
    copies the slowest decode forward hides gets none."""
    from sgl_sidp.calibration.table import Calibration

    rt, _ = runtime()
    rt.role, rt.dp_rank = "sink", 1
    cal = Calibration("m", "NVIDIA H100 80GB HBM3", {1: 4.6, 256: 27.9}, {2048: 50.6, 8192: 238.8}, None, "test")
    with caplog.at_level(logging.WARNING, logger="sgl_sidp.zerodp.runtime"):
        rt._warn_if_copy_bound(OffloadPlan(tuple(range(48)), ("w13", "w2"), 57_980_000_000, 146.1, 238.8, "t"), cal)
        rt._warn_if_copy_bound(OffloadPlan((47,), ("w13", "w2"), 1_200_000_000, 3.0, 4.6, "t"), cal)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("sgl-sidp zerodp DP1 TP0: this sink's decode steps are copy-bound: 146.1 ms of copies "
                                  "per forward")
    assert "a decode step takes at least 146 ms, 5.2-32x a vanilla replica's (predicted)" in warnings[0]
    assert "Only prefill forwards of 8192 tokens or more hide them" in warnings[0]
