"""`calibration.memory` against what SGLang 0.5.17 logged on the GPU hosts (committed logs): its default
`--mem-fraction-static`, the weights it loaded and the KV tokens it allocated (`max_total_num_tokens`)."""

import json
from pathlib import Path

import pytest

from sgl_sidp.calibration.memory import GIB, ModelShapes, default_mem_fraction_static, kv_tokens

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
H200_MIB, H100_MIB = 143_771, 81_559


def shapes(name):
    path = MODELS / name / "config.json"
    if not path.is_file():
        pytest.skip(f"{path} missing (../shared/models)")
    return ModelShapes.of(json.loads(path.read_text()))


def test_default_mem_fraction_static_matches_sglangs_logs():
    assert default_mem_fraction_static(H200_MIB) == 0.903  # benchmarks/results/sidp/calibration_1gpu/Qwen3-8B.log.gz
    assert default_mem_fraction_static(H100_MIB) == 0.83   # benchmarks/results/fail_closed (H100, dense, TP1)
    assert default_mem_fraction_static(H100_MIB, prefill_graph_buckets=0, mla=True) == 0.835  # DeepSeek-V2, H100


# (model, free GiB before the load, mem_fraction_static, GiB SGLang loaded, max_total_num_tokens), all at TP1 on one
# H200: benchmarks/results/sidp/calibration_1gpu/{Qwen3-8B,Qwen3-32B,Qwen3-32B___mem_fraction_static_0.5}.log.gz and
# benchmarks/results/zerodp/r80_auto/server_vanilla.log.gz
LOGGED = [("Qwen3-8B", 139.13, 0.903, 15.28, 803_502), ("Qwen3-32B", 139.13, 0.903, 61.04, 264_513),
          ("Qwen3-32B", 139.13, 0.5, 61.04, 34_748), ("Qwen3-30B-A3B", 139.11, 0.5, 56.89, 137_804)]


@pytest.mark.parametrize("name, free, frac, loaded, logged", LOGGED)
def test_weights_and_kv_tokens_match_sglangs_logs(name, free, frac, loaded, logged):
    s = shapes(name)
    weights = s.weight_bytes()
    assert abs(weights / GIB - loaded) < 0.02 * loaded, (weights / GIB, loaded)
    got = kv_tokens(free * GIB, frac, weights, s.kv_bytes_per_token(1))
    assert abs(got - logged) <= 0.02 * logged, (got, logged)


def test_shard_shapes():
    s = shapes("Qwen3-32B")  # 64 heads, 8 KV heads, head_dim 128
    assert s.kv_heads_per_gpu(8) == 1 and s.kv_heads_per_gpu(16) == 1 and s.kv_heads_per_gpu(2) == 4
    assert s.kv_bytes_per_token(2) * 2 == s.kv_bytes_per_token(1)
    assert abs(s.weight_bytes(2, 2, 2) - s.weight_bytes() / 2) <= 8  # 8 KV heads split 2 ways: exactly half
    assert s.attention_params(16) > s.attention_params(1) / 16  # 8 KV heads cannot split 16 ways: replicated
    m = shapes("Qwen3-30B-A3B")
    assert m.moe_layers == tuple(range(48)) and m.experts == 128 and m.expert_intermediate == 768
    assert m.weight_bytes(expertless=m.moe_layers) < 0.06 * m.weight_bytes()  # the routed experts are 95 % of it


# `plan calibrate`'s shard servers on one H200 (SGLang's default mem fraction 0.903, 139.13 GiB free before load):
# (model, --json-model-override-args, max_total_num_tokens logged), benchmarks/results/plan/calibrate_h200_eager_2026-11-24/
SHARDS = [("Qwen3-8B", {"num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 1536, "vocab_size": 18992},
           7_205_574),
          ("Qwen3-32B", {"num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 6400,
                         "vocab_size": 37984}, 416_769),
          ("Qwen3-30B-A3B", {"num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 768,
                             "moe_intermediate_size": 96, "vocab_size": 18992}, 1_277_658)]


@pytest.mark.parametrize("name, overrides, logged", SHARDS)
def test_kv_tokens_of_shard_servers_match_sglangs_logs(name, overrides, logged):
    """A TP or DP-attention shard served alone on one GPU (heads, KV heads, FFN and vocabulary cut down): the memory
    model's KV tokens within 0.2 % of SGLang's (`scripts/plan_validate_shard_kv.py` over every such log)."""
    path = MODELS / name / "config.json"
    if not path.is_file():
        pytest.skip(f"{path} missing (../shared/models)")
    s = ModelShapes.of({**json.loads(path.read_text()), **overrides})
    got = kv_tokens(139.13 * GIB, default_mem_fraction_static(H200_MIB), s.weight_bytes(), s.kv_bytes_per_token(1))
    assert abs(got / logged - 1) < 0.002, (got, logged)
