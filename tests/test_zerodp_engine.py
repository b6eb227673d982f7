"""ZeroDP's SGLang hook bodies (`sgl_sidp.zerodp.engine`) where they need no GPU."""

import types

from sgl_sidp.zerodp import engine


def test_lazy_imports_resolve():
    """The names engine imports inside its GPU-only functions exist (a rename would only show on GPU)."""
    from sgl_sidp.peer import vmm
    from sgl_sidp.prefetch import ring

    for name in ("TensorExporter", "TensorImporter", "socket_address", "measure_copy_gbps", "vmm_tensor", "PeerError"):
        assert hasattr(vmm, name), name
    for name in ("PrefetchSchedule", "SlotPrefetcher", "StreamOps", "sync_points"):
        assert hasattr(ring, name), name
    assert vmm.socket_address("zerodp", 30000, 1) == "\0sgl-sidp-zerodp.30000.tp1"


def test_around_run_moe_core_passes_through_resident_layers():
    """A layer without the ZeroDP marker runs SGLang's run_moe_core untouched."""
    layer = types.SimpleNamespace(layer_id=3)
    assert engine.around_run_moe_core(lambda self, x: ("ran", self.layer_id, x), layer, 7) == ("ran", 3, 7)


def test_around_run_moe_core_brackets_offloaded_layers():
    """On an offloaded layer: wait for the slot, run the experts, then release and prefetch, in that order."""
    calls = []
    layer = types.SimpleNamespace(layer_id=5, _sidp_zerodp=(lambda lid: calls.append(("before", lid)), lambda lid: calls.append(("after", lid))))
    out = engine.around_run_moe_core(lambda self, dispatch_output=None: calls.append(("experts", dispatch_output)) or "y", layer, dispatch_output="x")
    assert out == "y" and calls == [("before", 5), ("experts", "x"), ("after", 5)]


def test_alloc_memory_pool_hook_records_kv_tokens(monkeypatch):
    """The KV-capacity hook is a no-op outside ZeroDP and records max_total_num_tokens inside it."""
    runner = types.SimpleNamespace(max_total_num_tokens=703052, is_draft_worker=False)
    monkeypatch.setattr(engine, "STATE", None)
    assert engine.on_alloc_memory_pool("r", runner) == "r" and engine.status() == {}
    monkeypatch.setattr(engine, "STATE", engine.ZeroDPState("sink", 1, 0, freed_bytes=int(58e9)))
    engine.on_alloc_memory_pool(None, runner)
    assert engine.status() == {"role": "sink", "dp_rank": 1, "tp_rank": 0, "kv_tokens": 703052}


def test_metrics_count_bytes_pulled_per_busy_iteration():
    """ZeroDPMetrics exports the plan and adds one forward's bytes per recorded iteration."""
    from prometheus_client import CollectorRegistry

    from sgl_sidp.control.batch_signal import BatchSignalObserver, IterationSignal
    from sgl_sidp.zerodp.plan import OffloadPlan

    plan = OffloadPlan((11, 23), ("w13", "w2"), 2_400_000_000, 6.1, 14.9, "test")
    state = engine.ZeroDPState("sink", 1, 0, plan=plan, kv_tokens=162380)
    reg = CollectorRegistry()
    metrics = engine.ZeroDPMetrics(state, {"dp_rank": "1"}, registry=reg)
    obs = BatchSignalObserver(log_interval=100)
    obs.listeners.append(metrics.observe)
    sig = IterationSignal(forward_mode="DECODE", batch_size=4, computed_tokens=4, prefix_hit_tokens=0, running_batch_size=4, waiting=0)
    obs.record(sig)
    obs.record(sig)
    labels = {"dp_rank": "1", "role": "sink"}
    assert reg.get_sample_value("sglang:sidp_zerodp_bytes_pulled_total", labels) == 4.8e9
    assert reg.get_sample_value("sglang:sidp_zerodp_kv_tokens", labels) == 162380
    assert reg.get_sample_value("sglang:sidp_zerodp_offloaded_layers", labels) == 2


def test_kv_bytes_per_token_matches_sglang_for_qwen3_moe(tmp_path):
    """GQA: 2 (K, V) x 48 layers x 4 KV heads x 128 x 2 bytes (bf16) = 98,304, the cell size SGLang logs for
    Qwen3-30B-A3B; an fp8 KV cache halves it; TP=2 splits the 4 KV heads."""
    import json

    from sglang.srt.configs.model_config import ModelConfig

    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "torch_dtype": "bfloat16",
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    mc = ModelConfig(model_path=str(tmp_path))
    runner = lambda kv, tp: types.SimpleNamespace(model_config=mc, server_args=types.SimpleNamespace(kv_cache_dtype=kv), ps=types.SimpleNamespace(tp_size=tp))
    assert engine._kv_bytes_per_token(runner("auto", 1)) == 98_304
    assert engine._kv_bytes_per_token(runner("fp8_e4m3", 1)) == 49_152
    assert engine._kv_bytes_per_token(runner("auto", 2)) == 49_152
