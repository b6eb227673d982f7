"""Memory as SGLang accounts it, from a model's config.json alone: the parameters a GPU holds in a shard layout, the KV
bytes per token, SGLang's default `--mem-fraction-static` and the KV tokens its pool gets (no GPU, no SGLang).

SGLang sizes its KV pool after loading the weights (`KVCacheConfigurator._profile_available_bytes`): the free memory
then, less `pre_model_load_memory * (1 - mem_fraction_static)`, where `pre_model_load_memory` is what was free just
before the model loaded (the GPU less the CUDA context and the communicators). So the pool holds
`free_before_load * mem_fraction_static - weights` bytes (`kv_tokens`), in cells of `kv_bytes_per_token`. The default
`mem_fraction_static` is `ServerArgs._handle_gpu_memory_settings`' (`default_mem_fraction_static`). Shift's SP choice
uses it before any GPU work; the planner (`sgl_sidp.plan`) builds every configuration's memory on it.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from sgl_sidp.model_info import EXPERT_KEYS, moe_layer_ids

GIB = 1 << 30


def dtype_bytes(hf_config: Mapping, dtype_flag: str = "auto") -> int:
    """Bytes per weight element: SGLang's `--dtype` when set, else the config's (bf16/fp16: 2, float32: 4)."""
    name = dtype_flag if dtype_flag not in (None, "auto") else (hf_config.get("torch_dtype") or hf_config.get("dtype"))
    return 4 if str(name).replace("torch.", "") in ("float32", "float") else 2


@dataclasses.dataclass(frozen=True)
class ModelShapes:
    """The shapes that set a decoder-only model's parameters and KV cache (dense, MoE, MLA), from its config.json.

    Attributes:
        layers, hidden, heads, kv_heads, head_dim, vocab: the usual; `tied`: lm_head shares the embedding.
        intermediate: the dense MLP's intermediate size (dense layers; 0 when every layer is MoE).
        moe_layers: the layers with routed experts (`model_info.moe_layer_ids`; empty when dense).
        experts, expert_intermediate: routed experts per MoE layer and each one's intermediate size.
        experts_per_token: routed experts each token runs through (`num_experts_per_tok`; 0: not given).
        shared_intermediate: the shared expert(s)' total intermediate size in an MoE layer (0: none).
        kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, q_lora_rank: MLA (kv_lora_rank 0: not MLA).
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    intermediate: int
    moe_layers: tuple[int, ...] = ()
    experts: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    experts_per_token: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0

    @classmethod
    def of(cls, hf_config: Mapping) -> "ModelShapes":
        cfg = hf_config.get("text_config", hf_config)
        h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        experts = next((int(cfg[k]) for k in EXPERT_KEYS if cfg.get(k)), 0)
        moe = tuple(moe_layer_ids(cfg) or ())
        inter = int(cfg.get("intermediate_size") or 0)
        expert_inter = int(cfg.get("moe_intermediate_size") or inter) if experts else 0
        shared = int(cfg.get("shared_expert_intermediate_size") or 0) or int(cfg.get("n_shared_experts") or 0) * expert_inter
        return cls(layers=int(cfg["num_hidden_layers"]), hidden=h, heads=heads,
                   kv_heads=int(cfg.get("num_key_value_heads") or heads),
                   head_dim=int(cfg.get("head_dim") or h // heads), vocab=int(cfg["vocab_size"]),
                   tied=bool(cfg.get("tie_word_embeddings")), intermediate=inter, moe_layers=moe, experts=experts,
                   expert_intermediate=expert_inter, shared_intermediate=shared,
                   experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
                   kv_lora_rank=int(cfg.get("kv_lora_rank") or 0), qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
                   qk_nope_head_dim=int(cfg.get("qk_nope_head_dim") or 0), v_head_dim=int(cfg.get("v_head_dim") or 0),
                   q_lora_rank=int(cfg.get("q_lora_rank") or 0))

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads on one GPU of attention TP `tp`, replicated where TP exceeds them (`ModelConfig.get_num_kv_heads`)."""
        return max(1, self.kv_heads // tp)

    def qkv_width(self, tp: int) -> int:
        """Columns of one GPU's QKV projection at attention TP `tp`: its query heads and the KV heads it stores
        (`kv_heads_per_gpu`), times the head dim (e.g. the width of one block of Shift's first all-to-all,
        `shift.ulysses.heads_all_to_all`)."""
        return (self.heads // tp + 2 * self.kv_heads_per_gpu(tp)) * self.head_dim

    def attention_params(self, tp: int) -> int:
        """Attention parameters of one layer on one GPU of attention TP `tp` (QKV and O; MLA's projections)."""
        h = self.hidden
        if self.mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * self.heads * qk) if self.q_lora_rank else h * self.heads * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)  # replicated on every TP rank
            kv_b = self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
            return (q + kv_b + self.heads * self.v_head_dim * h) // tp + kv_a
        q_o = 2 * h * self.heads * self.head_dim // tp
        return q_o + 2 * h * self.kv_heads_per_gpu(tp) * self.head_dim

    def dense_mlp_params(self) -> int:
        """Gate, up and down parameters of one dense layer (unsharded)."""
        return 3 * self.hidden * self.intermediate

    def expert_params(self) -> int:
        """Routed experts' parameters of one MoE layer (unsharded)."""
        return self.experts * 3 * self.hidden * self.expert_intermediate

    def moe_other_params(self) -> int:
        """An MoE layer's parameters besides its routed experts: shared expert(s) and router (unsharded)."""
        return 3 * self.hidden * self.shared_intermediate + self.hidden * self.experts

    def mlp_params(self, layer: int, tp: int, experts_held: bool = True) -> int:
        """One layer's FFN parameters on one GPU of MLP TP `tp` (`experts_held` False: its routed experts are not)."""
        if layer in self.moe_layers:
            return (self.expert_params() * experts_held + self.moe_other_params()) // tp
        return self.dense_mlp_params() // tp

    def vocab_params(self, tp: int, head_tp: int | None = None) -> int:
        """Embedding parameters on one GPU of vocabulary TP `tp`, plus the lm_head's at TP `head_tp` (default `tp`;
        none when tied)."""
        head = 0 if self.tied else self.vocab * self.hidden // (head_tp or tp)
        return self.vocab * self.hidden // tp + head

    def weight_bytes(self, attn_tp: int = 1, mlp_tp: int = 1, vocab_tp: int = 1, elt: int = 2,
                     mlp_layers: tuple[int, ...] | None = None, expertless: tuple[int, ...] = (),
                     head_tp: int | None = None) -> int:
        """Weights on one GPU: every layer's attention at TP `attn_tp`, the FFN of `mlp_layers` (default all) at TP
        `mlp_tp` (the routed experts of `expertless` layers left out), the vocabulary at TP `vocab_tp` (lm_head at
        `head_tp`, default the same); norms ignored."""
        mlp = range(self.layers) if mlp_layers is None else mlp_layers
        params = self.layers * self.attention_params(attn_tp) + self.vocab_params(vocab_tp, head_tp)
        params += sum(self.mlp_params(i, mlp_tp, i not in expertless) for i in mlp)
        return elt * params

    def kv_bytes_per_token(self, tp: int, elt: int = 2) -> int:
        """KV bytes of one token over all layers on one GPU of attention TP `tp` (MLA: the latent, on every rank)."""
        if self.mla:
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * elt
        return 2 * self.layers * self.kv_heads_per_gpu(tp) * self.head_dim * elt


def default_decode_graph_max_bs(gpu_mib: float, tp: int = 1) -> int:
    """SGLang 0.5.17's largest decode batch captured in a CUDA graph on a GPU of `gpu_mib` MiB at TP size `tp`
    (`ServerArgs._handle_gpu_memory_settings`, `cuda_graph_config.decode.max_bs`): 24/80 under 35 GiB, 32/160 under
    60 GiB, 256/512 under 160 GiB (TP below 4 / from 4), else 512. A larger batch runs eagerly."""
    if gpu_mib < 35 * 1024:
        return 24 if tp < 4 else 80
    if gpu_mib < 60 * 1024:
        return 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 256 if tp < 4 else 512
    return 512


def prefill_graph_bucket_count(chunk: int) -> int:
    """How many token counts SGLang 0.5.17 captures breakable prefill graphs for when its largest is `chunk` (the
    chunked prefill size; `ServerArgs._generate_prefill_cuda_graph_batch_sizes`): 4-32 by 4, 48-256 by 16, 288-512 by
    32, 576-1,024 by 64, 1,280-4,096 by 256, then by 512: 42 at 2,048, 58 at 8,192, 74 at 16,384."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
             + list(range(1280, 4097, 256)) + list(range(4608, chunk + 1, 512)))
    return sum(1 for t in sizes if t <= chunk)


def default_mem_fraction_static(gpu_mib: float, tp: int = 1, chunked_prefill: int | None = None,
                                decode_graph_max_bs: int | None = None, prefill_graph_buckets: int | None = None,
                                mla: bool = False, dp_attention_dp: int = 0, decode_graphs: bool = True) -> float:
    """SGLang 0.5.17's default `--mem-fraction-static` for a GPU of `gpu_mib` MiB, as
    `ServerArgs._handle_gpu_memory_settings` and `reserve_for_graph_mb` compute it (no PP, no disaggregation, no
    speculative decoding): reserve 512 MiB + 1.5 MiB per activation token (the chunked prefill size, at least 2,048) +
    TP/8 GiB + 2 MiB per captured decode batch size (none with `decode_graphs` False, decode graphs off) + the prefill
    graphs' share (8 MiB per bucket, `prefill_graph_buckets`, by default one per captured size up to the chunk,
    `prefill_graph_bucket_count(chunk)`; MLA: 1.5 GiB; 0: prefill graphs off, as SGLang has them for DeepSeek's MLA), at
    least 10 GiB on GPUs of more than 60 GiB. `chunked_prefill` and `decode_graph_max_bs` default to SGLang's for that
    GPU size; `dp_attention_dp` > 0 adds DP attention's padding reserve (by the largest decode batch, graphs on or
    off)."""
    if chunked_prefill is None:
        chunked_prefill = 2048 if gpu_mib < 35 * 1024 else 4096 if gpu_mib < 60 * 1024 else 8192 if gpu_mib < 160 * 1024 else 16384
    if decode_graph_max_bs is None:
        decode_graph_max_bs = default_decode_graph_max_bs(gpu_mib, tp)
    if prefill_graph_buckets is None:
        prefill_graph_buckets = prefill_graph_bucket_count(chunked_prefill)
    reserved = 512 + max(chunked_prefill, 2048) * 1.5 + tp / 8 * 1024 + (decode_graph_max_bs * 2 if decode_graphs else 0)
    if dp_attention_dp:
        reserved += decode_graph_max_bs * dp_attention_dp * (3 + (1.5 if decode_graph_max_bs > 300 else 0))
    if prefill_graph_buckets:
        reserved += 1.5 * 1024 if mla else prefill_graph_buckets * 8
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


#: GiB the CUDA context and the communicators take before SGLang loads a model, measured at TP1 (SGLang's "Load weight
#: begin. avail mem" against NVML's total): H200 143,771 MiB -> 139.13 GiB free (1.27 GiB), H100 81,559 MiB -> 78.50
#: GiB free (1.15 GiB). Used where that free memory was not measured on the GPU itself.
CONTEXT_GIB = 1.3


def free_before_load(gpu_total_bytes: int) -> int:
    """An estimate of the free memory before SGLang loads a model on a GPU of `gpu_total_bytes` (`CONTEXT_GIB`)."""
    return int(gpu_total_bytes - CONTEXT_GIB * GIB)


def kv_tokens(free_before_load: float, mem_fraction_static: float, weight_bytes: int, per_token: int) -> int:
    """KV tokens SGLang's pool gets: (`free_before_load` bytes * `mem_fraction_static` - `weight_bytes`) // `per_token`
    (0 when the weights leave no room). `free_before_load` is the GPU's free memory just before the model loads (on an
    H200, 139.13 GiB at TP1: the CUDA context takes the rest)."""
    return max(0, int(free_before_load * mem_fraction_static - weight_bytes) // max(1, per_token))
