"""Memory as SGLang accounts it, from a dense model's config.json alone: weights per GPU of a shard layout, KV bytes
per token, and the KV tokens that fit (no GPU, no SGLang).

SGLang sizes its KV pool after loading the weights (`ModelRunner.profile_max_num_token`): the free memory less
`total * (1 - --mem-fraction-static)`, so the pool holds about `total * mem_fraction_static - weights` bytes
(`kv_tokens`; SGLang's own overheads, CUDA graphs and activations, come out of the `1 - mem_fraction_static` part).
Features use it before any GPU work (Shift's SP that fits); the planner builds on the same functions.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping


def dtype_bytes(hf_config: Mapping, dtype_flag: str = "auto") -> int:
    """Bytes per weight element: SGLang's `--dtype` when set, else the config's (bf16/fp16: 2, float32: 4)."""
    name = dtype_flag if dtype_flag not in (None, "auto") else (hf_config.get("torch_dtype") or hf_config.get("dtype"))
    return 4 if str(name).replace("torch.", "") in ("float32", "float") else 2


@dataclasses.dataclass(frozen=True)
class DenseShapes:
    """The parameter counts of a dense decoder-only model (Qwen2/Qwen3/Llama shapes: fused QKV, O, gate|up, down).

    Attributes:
        layers: decoder layers.
        attn: QKV and O parameters of one layer.
        mlp: gate, up and down parameters of one layer.
        embed: input embedding parameters (vocab x hidden).
        lm_head: output projection parameters (0 when tied to the embedding).
        kv_heads, head_dim: of the attention.
    """

    layers: int
    attn: int
    mlp: int
    embed: int
    lm_head: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, hf_config: Mapping) -> "DenseShapes":
        cfg = hf_config.get("text_config", hf_config)
        h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        kv = int(cfg.get("num_key_value_heads") or heads)
        hd = int(cfg.get("head_dim") or h // heads)
        vocab = int(cfg["vocab_size"])
        return cls(layers=int(cfg["num_hidden_layers"]), attn=h * (heads + 2 * kv) * hd + heads * hd * h,
                   mlp=3 * h * int(cfg["intermediate_size"]), embed=vocab * h,
                   lm_head=0 if cfg.get("tie_word_embeddings") else vocab * h, kv_heads=kv, head_dim=hd)

    def weight_bytes(self, tp_linear: int, tp_vocab: int, elt: int = 2) -> int:
        """Weights on one GPU when the layers' linears are split `tp_linear` ways and the vocabulary `tp_vocab` ways."""
        return elt * (self.layers * (self.attn + self.mlp) // tp_linear + (self.embed + self.lm_head) // tp_vocab)

    def kv_bytes_per_token(self, tp: int, elt: int = 2) -> int:
        """K and V of one token over all layers on one GPU of TP `tp` (KV heads replicated where TP exceeds them, as
        SGLang's `ModelConfig.get_num_kv_heads` does)."""
        return 2 * self.layers * max(1, self.kv_heads // tp) * self.head_dim * elt


def kv_tokens(gpu_bytes: int, mem_fraction_static: float, weight_bytes: int, per_token: int) -> int:
    """KV tokens SGLang's pool holds on a GPU of `gpu_bytes` (0 when the weights leave no room)."""
    return max(0, int(gpu_bytes * mem_fraction_static - weight_bytes) // max(1, per_token))
