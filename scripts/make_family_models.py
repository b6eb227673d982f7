"""Small random-weight checkpoints of the model families the overlay's modes accept or refuse (the family matrix).

Each family is built with Hugging Face's own config and model classes, then every parameter gets its own random
values (a different tensor in every layer; biases and norm weights too, which Hugging Face's init leaves at 0 and 1,
and DeepSeek-V3's router correction bias, a buffer it leaves at 0, so a mode that drops a bias or mixes up two layers
changes the answers). Vocabulary: the bundled 4,096-id tokenizer
(`sgl_sidp/default_model`). `tests/gpu/test_family_matrix.py` serves them with vanilla SGLang and with each mode.

usage: python scripts/make_family_models.py OUT_DIR [--family NAME ...] [--config-only]
  --config-only: write config.json alone (what the launch-time checks read; no torch work)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

TOKENIZER = Path(__file__).resolve().parents[1] / "sgl_sidp" / "default_model"
COMMON = dict(vocab_size=4096, max_position_embeddings=8192, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=2,
              pad_token_id=0, torch_dtype="bfloat16")
DENSE = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4)

#: family -> (Hugging Face config class, model class, config arguments, what it covers)
FAMILIES: dict[str, tuple[str, str, dict, str]] = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(DENSE, head_dim=64, tie_word_embeddings=True),
              "dense, no attention bias, QK norm"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(DENSE, tie_word_embeddings=False),
              "dense, attention (QKV) biases"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(DENSE, tie_word_embeddings=False, attention_bias=False),
              "dense, Llama layers (o_proj reduces itself)"),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(DENSE, tie_word_embeddings=False, sliding_window=None),
                "dense, SGLang's MistralForCausalLM (a LlamaForCausalLM)"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(DENSE, head_dim=64, tie_word_embeddings=True),
              "dense, an MLP class no hook knows (GemmaMLP)"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(DENSE, head_dim=64, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256,
                       norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=True),
                  "MoE, no shared expert"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(DENSE, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256,
                       shared_expert_intermediate_size=512, norm_topk_prob=False, decoder_sparse_step=1,
                       mlp_only_layers=[], tie_word_embeddings=False),
                  "MoE with a gated shared expert (SGLang runs the experts on a second CUDA stream while capturing)"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(DENSE, num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False),
                "MoE, 8 experts top-2, no shared expert"),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                    dict(DENSE, num_key_value_heads=8, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
                         qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=16, num_experts_per_tok=4,
                         n_shared_experts=1, moe_intermediate_size=256, first_k_dense_replace=1, moe_layer_freq=1,
                         topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0,
                         scoring_func="softmax",  # DeepSeek-V2's own config has it; SGLang reads it
                         norm_topk_prob=False, tie_word_embeddings=False, rope_scaling=None),
                    "MoE with shared experts, MLA attention (DeepSeek-V2-Lite's head sizes, which SGLang's Triton MLA "
                    "kernels need), a dense first layer"),
    # new families go last: a family's seed is its index here, so the
    # checkpoints above stay the ones measured
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(DENSE, head_dim=64, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                    query_pre_attn_scalar=64, sliding_window=256, attn_logit_softcapping=50.0,
                    final_logit_softcapping=30.0, tie_word_embeddings=True),  # SGLang's Gemma2MLP reads hidden_act too
               "dense, SGLang's own MLP class (Gemma2MLP), attention logit soft-capping, a sliding window on even "
               "layers, pre/post feed-forward norms"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(DENSE, head_dim=64, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=64,
                    sliding_window=256, layer_types=["sliding_attention"] * 3 + ["full_attention"],
                    tie_word_embeddings=True),
               "dense, text-only Gemma 3: SGLang's own MLP and embedding classes (Gemma3MLP, "
               "Gemma3TextScaledWordEmbedding), QK norms, sliding and global layers with their own RoPE bases"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(DENSE, num_key_value_heads=8, q_lora_rank=256, kv_lora_rank=512, qk_nope_head_dim=128,
                         qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, num_experts_per_tok=8,
                         n_shared_experts=1, moe_intermediate_size=128, first_k_dense_replace=1, moe_layer_freq=1,
                         topk_method="noaux_tc", scoring_func="sigmoid", n_group=8, topk_group=4,
                         routed_scaling_factor=2.5, norm_topk_prob=True, tie_word_embeddings=False),
                    # moe_layer_freq, topk_method and scoring_func are not DeepseekV3Config's own fields: DeepSeek-V3's
                    # config.json has them and SGLang's DeepseekV2DecoderLayer / MoEGate / TopK read them
                    "MoE with DeepSeek-V3's routing (noaux_tc: sigmoid scores, e_score_correction_bias, 8 groups, "
                    "top 4 groups, top-8 of 256 routed experts) and one shared expert, which SGLang fuses into "
                    "FusedMoE for 256 routed experts; MLA with a q LoRA (q_lora_rank), the V2 family's head sizes, a "
                    "dense first layer"),
}

#: Tensors the checkpoint stores that are buffers, not parameters, in Hugging Face's model (DeepSeek-V3's router
#: `e_score_correction_bias`, which it leaves at 0): `randomize` gives them N(0, 0.05), half the spread of the sigmoid
#: router scores they shift (0.11). On 2,000 random hidden states, in each MoE layer of the deepseek_v3 family, that
#: changes 44-46% of the experts picked, and 250-252 of the 256 experts are still picked (N(0, 0.1): 72 never are).
SAVED_BUFFERS = ("e_score_correction_bias",)


def hf_config(family: str):
    """The Hugging Face config object of `family`."""
    import transformers

    cfg_cls, _, kwargs, _ = FAMILIES[family]
    return getattr(transformers, cfg_cls)(**COMMON, **kwargs)


def randomize(model, seed: int) -> None:
    """Give every parameter its own random values: weights N(0, 0.02), biases N(0, 0.02), norm weights 1 + N(0, 0.1);
    then the saved buffers of `SAVED_BUFFERS` (DeepSeek-V3's router correction bias) N(0, 0.05)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_((1 + 0.1 * noise) if "norm" in name.split(".")[-2] else 0.02 * noise)
        for name, b in model.named_buffers():
            if name.rsplit(".", 1)[-1] in SAVED_BUFFERS:
                b.copy_(0.05 * torch.randn(b.shape, generator=gen, dtype=torch.float32))


def make(family: str, out: Path, config_only: bool = False, seed: int | None = None) -> Path:
    """Write `family`'s checkpoint (or its config.json alone) to `out/family`; returns that folder. The weights' seed
    is `seed`, else the family's index in FAMILIES, so a family is the same checkpoint whichever others are built."""
    seed = list(FAMILIES).index(family) if seed is None else seed
    d = out / family
    d.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(family)
    cfg.architectures = [FAMILIES[family][1]]
    if config_only:
        cfg.to_json_file(d / "config.json")
        return d
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, FAMILIES[family][1])(cfg)
    randomize(model, seed)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TOKENIZER / f, d)
    return d


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="folder to write one sub-folder per family into")
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES), help="only these families (repeatable)")
    ap.add_argument("--config-only", action="store_true", help="write config.json alone")
    a = ap.parse_args(argv)
    for family in a.family or FAMILIES:
        d = make(family, a.out, a.config_only)
        print(f"{d}: {FAMILIES[family][1]} ({FAMILIES[family][3]})", file=sys.stderr)


if __name__ == "__main__":
    main()
