"""What a model is, read from its Hugging Face `config.json` alone (no hub, no GPU, no SGLang).

Used before any GPU memory is taken (launcher checks) and to key start-up calibrations. Also where the embedded
default model lives (`DEFAULT_MODEL_DIR`), which the launcher serves without `--model-path` and the planner's
calibration servers take their tokenizer from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

#: Folder of the embedded default model (config.json + tokenizer files): a small Qwen3-architecture config served with
#: dummy weights, and a byte-level BPE tokenizer.
DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "default_model"

#: Config keys that give an MoE model's routed-expert count, across the architectures SGLang serves.
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def read_hf_config(model_path: str) -> dict | None:
    """`<model_path>/config.json` as a dict (its `text_config` for multimodal wrappers), or None.

    None when the path is not a local folder with a config.json (e.g. a hub id): callers leave
    the check to a later stage instead of guessing.
    """
    cfg_file = Path(model_path) / "config.json"
    if not cfg_file.is_file():
        return None
    cfg = json.loads(cfg_file.read_text())
    return cfg.get("text_config", cfg)


def has_experts(hf_config: Mapping) -> bool:
    """Whether a config (its `text_config` for multimodal wrappers) gives routed experts (`EXPERT_KEYS` > 1)."""
    cfg = hf_config.get("text_config", hf_config)
    return any(int(cfg.get(k) or 0) > 1 for k in EXPERT_KEYS)


def model_is_moe(model_path: str) -> bool | None:
    """Whether the config at `model_path` describes an MoE model; None when it cannot be read locally."""
    cfg = read_hf_config(model_path)
    if cfg is None:
        return None
    if has_experts(cfg):
        return True
    return any("moe" in a.lower() for a in cfg.get("architectures", []))


def moe_layer_ids(hf_config: Mapping) -> list[int] | None:
    """The decoder layers that hold routed experts, by the rules SGLang's model classes build them with; None for a
    dense model.

    - `first_k_dense_replace` and `moe_layer_freq` (DeepSeek-V2/V3 and Kimi-K2: `DeepseekV2DecoderLayer`): i >= k and
      i % freq == 0; DeepSeek-V3's MTP layer (index `num_hidden_layers`, `num_nextn_predict_layers`) is built only by
      the speculative draft model (`DeepseekV3ForCausalLMNextN`), never in the served model's layers;
    - otherwise every layer: Mixtral, and Qwen2-MoE / Qwen3-MoE, whose SGLang decoder layers are all sparse
      (`is_layer_sparse = True`; SGLang 0.5.17 ignores `mlp_only_layers` and `decoder_sparse_step`).
    """
    cfg = hf_config.get("text_config", hf_config)
    if not has_experts(cfg):
        return None
    n = int(cfg.get("num_hidden_layers") or 0)
    first_dense = int(cfg.get("first_k_dense_replace") or 0)
    freq = int(cfg.get("moe_layer_freq") or 1)
    return [i for i in range(n) if i >= first_dense and i % freq == 0]


def model_signature(hf_config: Mapping, tp_size: int) -> str:
    """The shapes that set a forward's bytes and FLOPs, as one string (keys calibration tables).

    Architecture, layers (L), routed experts (E, MoE only), hidden size (H), FFN or expert
    intermediate size (I), query/KV heads (A), and the TP size.

    >>> model_signature({"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 48, "num_experts": 128,
    ...                  "hidden_size": 2048, "moe_intermediate_size": 768, "num_attention_heads": 32,
    ...                  "num_key_value_heads": 4}, 1)
    'Qwen3MoeForCausalLM L48 E128 H2048 I768 A32/4 tp1'
    """
    cfg = hf_config.get("text_config", hf_config)
    arch = (cfg.get("architectures") or ["?"])[0]
    experts = next((cfg[k] for k in EXPERT_KEYS if cfg.get(k)), None)
    inter = cfg.get("moe_intermediate_size") if experts else None
    inter = inter or cfg.get("intermediate_size")
    heads = f"A{cfg.get('num_attention_heads')}/{cfg.get('num_key_value_heads', cfg.get('num_attention_heads'))}"
    parts = [arch, f"L{cfg.get('num_hidden_layers')}"] + ([f"E{experts}"] if experts else [])
    return " ".join(parts + [f"H{cfg.get('hidden_size')}", f"I{inter}", heads, f"tp{tp_size}"])
