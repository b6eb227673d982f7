"""Shift's checks on SGLang's resolved settings (`shift.feature.resolve`): a fused all-reduce is refused, and SP is
chosen by memory (`calibration.memory`) before any GPU work."""

import json
from types import SimpleNamespace

import pytest

from sgl_sidp.calibration.memory import ModelShapes, kv_tokens
from sgl_sidp.config import SidpConfig
from sgl_sidp.shift import feature

LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
             "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
H200 = 143_771 * 2**20  # NVML's total of an H200 (141 GB)


def server_args(model, tp, **kw):
    return SimpleNamespace(**{"model_path": str(model), "tp_size": tp, "base_gpu_id": 0, "chunked_prefill_size": 8192,
                              "mem_fraction_static": 0.85, "dtype": "auto",
                              "flashinfer_allreduce_fusion_backend": None, "enable_aiter_allreduce_fusion": False, **kw})


@pytest.fixture
def llama70b(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B))
    monkeypatch.setattr("sgl_sidp.peer.topology.gpu_memory_bytes", lambda index: H200)
    return tmp_path


def test_dense_shapes_count_llama_70b_parameters():
    s = ModelShapes.of(LLAMA_70B)
    assert round(s.weight_bytes(1, 1) / 1e9, 1) == 141.1  # 70.55 B parameters in bf16
    assert s.kv_bytes_per_token(4) == 2 * 80 * 2 * 128 * 2 and s.kv_bytes_per_token(16) == 2 * 80 * 1 * 128 * 2
    assert kv_tokens(100, 0.5, 60, 1) == 0 and kv_tokens(100, 0.9, 60, 2) == 15


def test_default_sp_is_the_largest_that_leaves_kv_room(llama70b):
    """70B at TP4 on H200: SP 4 would hold all 141 GB of linears on every GPU; SP 2 (linears split 2 ways) fits."""
    cfg, problems = feature.resolve(SidpConfig(mode="shift"), server_args(llama70b, 4))
    assert problems == [] and cfg.shift.sp == 2
    small = dict(LLAMA_70B, num_hidden_layers=8)
    (llama70b / "config.json").write_text(json.dumps(small))
    assert feature.resolve(SidpConfig(mode="shift"), server_args(llama70b, 4))[0].shift.sp == 4


def test_a_given_sp_that_does_not_fit_is_refused_with_the_one_that_would(llama70b):
    cfg = SidpConfig(mode="shift", shift={"sp": 4})
    _, problems = feature.resolve(cfg, server_args(llama70b, 4))
    assert len(problems) == 1 and problems[0].startswith("--shift-sp 4: the base configuration's weights (linears "
                                                         "split 1 ways) leave 0 KV tokens per GPU")
    assert problems[0].endswith("--shift-sp 2 fits")
    _, problems = feature.resolve(SidpConfig(mode="shift"), server_args(llama70b, 1))
    assert len(problems) == 1 and "no SP of --tp-size 1 leaves KV room" in problems[0]


@pytest.mark.parametrize("kw", [{"flashinfer_allreduce_fusion_backend": "auto"}, {"enable_aiter_allreduce_fusion": True}])
def test_a_fused_all_reduce_in_the_resolved_settings_is_refused(llama70b, kw):
    """SGLang maps the deprecated --enable-flashinfer-allreduce-fusion to backend 'auto' while resolving its
    settings, past the raw-flag check: the resolved value is what counts."""
    _, problems = feature.resolve(SidpConfig(mode="shift"), server_args(llama70b, 4, **kw))
    assert len(problems) == 1 and "bypasses the all-reduce" in problems[0]


def test_the_launcher_s_base_kv_counts_the_tp_group_s_reserve_as_the_planner_does():
    """The SP choice's KV estimate (`base_kv_tokens`) subtracts what a TP group of P takes before the model loads
    (`plan.steps.group_reserve_gib`) as the planner does: Qwen3-8B at SP2 on 2 x H100 (81,559 MiB) then comes within
    0.5 % of the 722,182 tokens the server held (`benchmarks/results/multi_gpu/q8_shift_exact_cost_2gpu_h100`; about
    13,000 tokens over it without the reserve)."""
    from pathlib import Path

    from sgl_sidp.model_info import read_hf_config
    from sgl_sidp.shift.feature import base_kv_tokens

    hf = read_hf_config(Path(__file__).resolve().parents[2] / "shared" / "models" / "Qwen3-8B")
    if hf is None:
        pytest.skip("../shared/models/Qwen3-8B missing")
    assert base_kv_tokens(hf, 2, 2, 81_559 * 2**20, 0.828) == pytest.approx(722_182, rel=0.005)  # its --mem-fraction-static
