"""The planner's configurations: names, per-GPU shard shapes (heads, replicated KV heads, intermediate, vocabulary),
weights and KV tokens per GPU, for every technique."""

import json
from pathlib import Path

import pytest

from sgl_sidp.calibration.memory import GIB, ModelShapes
from sgl_sidp.plan.configs import configuration_named, configurations, shard_of
from sgl_sidp.shift.planner import RESERVE_GIB as SHIFT_RESERVE_GIB
from sgl_sidp.sidp.planner import RANK_RESERVE_GIB

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


def shapes(name):
    path = MODELS / name / "config.json"
    if not path.is_file():
        pytest.skip(f"{path} missing (../shared/models)")
    return ModelShapes.of(json.loads(path.read_text()))


def names(model, n):
    return [c.name for c in configurations(shapes(model), n)]


def test_configuration_names_per_technique():
    assert names("Qwen3-32B", 1) == ["tp1"]
    assert names("Qwen3-32B", 2) == ["dp2", "sidp_dp2_was", "sidp_dp2_cas", "sidp_dp2_auto", "tp2",
                                     "dp2_attn", "shift_sp2_tp1"]
    assert set(names("Qwen3-32B", 4)) == {"dp4", "sidp_dp4_was", "sidp_dp4_cas", "sidp_dp4_auto", "tp2_dp2",
                                          "sidp_dp2_tp2_was", "sidp_dp2_tp2_cas", "sidp_dp2_tp2_auto", "tp4", "dp4_attn",
                                          "shift_sp2_tp2", "shift_sp4_tp1"}
    assert names("Qwen3-30B-A3B", 2) == ["dp2", "zerodp_dp2", "tp2", "dp2_attn"]


def test_shards_split_heads_replicate_kv_heads_and_split_ffn_and_vocabulary():
    s = shapes("Qwen3-32B")  # 64 heads, 8 KV heads, intermediate 25,600, vocab 151,936
    tp2 = shard_of(s, 2, 2, 2)
    assert (tp2.heads, tp2.kv_heads, tp2.intermediate, tp2.vocab) == (32, 4, 12800, 75968)
    assert shard_of(s, 16, 16, 16).kv_heads == 1  # 8 KV heads over 16 GPUs: replicated
    assert tp2.override_args(s) == {"num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                                    "vocab_size": 75968, "intermediate_size": 12800}
    m = shapes("Qwen3-30B-A3B")  # 32 heads, 4 KV heads, 128 experts of 768
    tp8 = shard_of(m, 8, 8, 8)
    assert (tp8.heads, tp8.kv_heads, tp8.expert_intermediate) == (4, 1, 96)
    assert tp8.override_args(m)["moe_intermediate_size"] == 96
    with pytest.raises(ValueError, match="attention heads 64 over 3"):
        shard_of(s, 3, 3, 3)
    assert "tp3" not in names("Qwen3-32B", 3) and "dp3" in names("Qwen3-32B", 3)


def test_shift_and_dp_attention_shards():
    s = shapes("Llama-3.1-70B")  # 64 heads, 8 KV heads
    shift = {c.name: c for c in configurations(s, 4)}["shift_sp2_tp2"].shards(s)
    assert (shift["shift"].heads, shift["shift"].kv_heads, shift["shift"].tokens_share) == (16, 2, 1.0)
    assert (shift["base"].heads, shift["base"].intermediate, shift["base"].tokens_share) == (32, 14336, 0.5)
    attn = {c.name: c for c in configurations(s, 4)}["dp4_attn"].shards(s)["forward"]
    assert (attn.heads, attn.kv_heads, attn.intermediate) == (64, 8, 7168)


def test_weights_and_kv_per_gpu_by_technique():
    free, frac = 139.13 * GIB, 0.903  # an H200 at TP1 (SGLang's log)
    s = shapes("Qwen3-32B")
    by = {c.name: c for c in configurations(s, 2)}
    tp1 = {c.name: c for c in configurations(s, 1)}["tp1"]
    assert by["dp2"].kv_tokens(s, free, frac)["total"] == 2 * tp1.kv_tokens(s, free, frac)["gpu"]
    sidp = by["sidp_dp2_was"].weight_bytes_per_gpu(s)["gpu"]
    ffn_layer = 2 * s.dense_mlp_params()
    reserve = int(RANK_RESERVE_GIB[2] * GIB)  # measured beside the weights on 2 x H100
    assert sidp == tp1.weight_bytes_per_gpu(s)["gpu"] - 32 * ffn_layer + 2 * ffn_layer + reserve  # half, 2 slots
    assert by["sidp_dp2_was"].kv_tokens(s, free, frac)["gpu"] > 1.3 * tp1.kv_tokens(s, free, frac)["gpu"]
    shift = by["shift_sp2_tp1"].weight_bytes_per_gpu(s)["gpu"]
    assert shift > by["tp2"].weight_bytes_per_gpu(s)["gpu"] * 1.9  # base weights: every linear on every GPU
    base = s.weight_bytes(attn_tp=1, mlp_tp=1, vocab_tp=2, elt=2)  # the shift configuration's shards are views
    exchange = 2 * 8192 * s.qkv_width(2) * 2  # the overlapped exchanges' two slots of a chunk's QKV blocks, bf16
    assert shift == base + int(SHIFT_RESERVE_GIB * GIB) + exchange  # the reserve: measured on 2 x H100 and 2 x H200
    assert configuration_named("shift_sp2_tp1_nccl").weight_bytes_per_gpu(s)["gpu"] == shift - exchange
    m = shapes("Qwen3-30B-A3B")
    z = {c.name: c for c in configurations(m, 2)}["zerodp_dp2"]
    w = z.weight_bytes_per_gpu(m, sink_offload=m.moe_layers)
    assert w["sink"] < 0.1 * w["source"]
    kv = z.kv_tokens(m, 139.11 * GIB, frac, sink_offload=m.moe_layers)
    assert kv["total"] == kv["source"] + kv["sink"]
    # measured on 4 x H200 (benchmarks/results/zerodp/README.md, `all` at SGLang's default budget): 750,511 and 1,315,759
    assert abs(kv["source"] - 750_511) < 0.02 * 750_511 and abs(kv["sink"] - 1_315_759) < 0.02 * 1_315_759


def test_sidp_ranks_hold_the_slots_their_ring_holds():
    """The planner's SiDP memory takes the runtime's slot count (`settings.ring_slots`: d - 1, at least 2): with 2
    slots at DP4 it predicted Llama-3.1-70B's ranks on 4 x H100 23 % more KV than SGLang gave them (3 slots there)."""
    from sgl_sidp.sidp.planner import TECHNIQUE
    from sgl_sidp.sidp.settings import ring_slots

    assert [ring_slots(0, d) for d in (2, 3, 4, 8)] == [2, 2, 3, 7] and ring_slots(5, 4) == 5
    s = shapes("Qwen3-32B")
    for d in (2, 4):
        c = {c.name: c for c in configurations(s, d)}[f"sidp_dp{d}_auto"]
        assert TECHNIQUE.memory(c, None, s, 0, 0.0, 2) == {"slots": ring_slots(0, d)}
