"""Shift Parallelism as a feature of the overlay: its checks before any GPU work and its start-up line. It changes
no SGLang default (decode and prefill CUDA graphs run in both configurations). The hook bodies live in
`sgl_sidp.shift.runtime` (entries of `sgl_sidp.hooks.HOOKS` tagged "shift")."""

from __future__ import annotations

import argparse

from sgl_sidp.feature import Feature, dense_model_problems
from sgl_sidp.shift.heads import HeadLayoutError, check_layout
from sgl_sidp.shift.settings import ShiftSettings

#: Architecture -> the SGLang classes the base configuration's hooks act through in it: the attention (a
#: `QKVParallelLinear` qkv_proj and a `RowParallelLinear` o_proj: Qwen3/Qwen2 unreduced, the all-reduce in
#: `LayerCommunicator.prepare_mlp`; Llama reduced in o_proj) and the MLP (`Qwen2MLP` / `LlamaMLP`), besides the model's
#: `embed_tokens` and `logits_processor`. Each entry is exact at SP = 1 on a distinct-weight checkpoint
#: (`tests/gpu/test_family_matrix.py`); SGLang's Mistral is a Llama.
_QWEN2_MLP, _LLAMA = "sglang.srt.models.qwen2.Qwen2MLP", ("sglang.srt.models.llama.LlamaAttention",
                                                           "sglang.srt.models.llama.LlamaMLP")
ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "Qwen3ForCausalLM": ("sglang.srt.models.qwen3.Qwen3Attention", _QWEN2_MLP),
    "Qwen2ForCausalLM": ("sglang.srt.models.qwen2.Qwen2Attention", _QWEN2_MLP),
    "LlamaForCausalLM": _LLAMA,
    "MistralForCausalLM": _LLAMA,
}


def sp_of(settings, tp_size: int) -> int:
    """The base configuration's SP: `--sidp-shift-sp` (`settings.sp`), or P when 0."""
    return settings.sp or tp_size


def check(cfg, raw: argparse.Namespace) -> list[str]:
    """Every reason Shift Parallelism cannot run with SGLang's flags `raw` (argparse namespace), one line each."""
    problems = []
    p = int(getattr(raw, "tp_size", 1) or 1)
    sp = sp_of(cfg.shift, p)
    if p % sp:
        problems.append(f"--sidp-shift-sp {sp} does not divide --tp-size {p}")
    from sgl_sidp.peer.topology import visible_gpu_count

    gpus = visible_gpu_count()
    last = int(getattr(raw, "base_gpu_id", 0) or 0) + (p - 1) * int(getattr(raw, "gpu_id_step", 1) or 1)
    if gpus is not None and last >= gpus:
        problems.append(f"--sidp-mode shift with --tp-size {p} needs GPU {last}, but {gpus} GPU(s) are visible")
    bad, hf = dense_model_problems("shift", raw.model_path, ARCHITECTURES, "the layers its base configuration runs")
    problems += bad
    if hf is not None:  # every problem at once, even with another architecture
        heads, kv = hf.get("num_attention_heads"), hf.get("num_key_value_heads") or hf.get("num_attention_heads")
        if heads and not p % sp:
            try:
                check_layout(sp, p // sp, int(heads), int(kv))
            except HeadLayoutError as e:
                problems.append(f"--sidp-mode shift: {e}")
        if hf.get("quantization_config"):
            problems.append("--sidp-mode shift runs bf16/fp16 weights only so far (the base GEMMs call F.linear); "
                            f"{raw.model_path} is quantized")
    for flag, attr, why in (
        ("--dp-size", "dp_size", "DP replicas"), ("--pp-size", "pp_size", "pipeline stages"),
    ):
        if int(getattr(raw, attr, 1) or 1) > 1:
            problems.append(f"--sidp-mode shift does not combine with {flag} > 1 ({why}) yet")
    for attr, flag in (("enable_dp_attention", "--enable-dp-attention"), ("speculative_algorithm", "--speculative-algorithm"),
                       ("quantization", "--quantization"), ("enable_torch_compile", "--enable-torch-compile"),
                       ("flashinfer_allreduce_fusion_backend", "--flashinfer-allreduce-fusion-backend"),
                       ("enable_two_batch_overlap", "--enable-two-batch-overlap"),
                       ("enable_quant_communications", "--enable-quant-communications"),
                       ("is_embedding", "--is-embedding")):
        if getattr(raw, attr, None):
            problems.append(f"--sidp-mode shift does not work with {flag} yet (the base configuration replaces the "
                            "layers' GEMMs and TP all-reduces, and gathers the tokens only for the logits, where that "
                            "flag changes them)")
    backend = prefill_graph_backend(raw)
    if backend in UNSUPPORTED_PREFILL_GRAPHS:
        problems.append(f"--sidp-mode shift runs SGLang's breakable prefill CUDA graphs (the default) or none, not "
                        f"'{backend}' ({UNSUPPORTED_PREFILL_GRAPHS[backend]})")
    return problems


#: prefill CUDA-graph backends of SGLang 0.5.17 the base configuration cannot run in, and why
UNSUPPORTED_PREFILL_GRAPHS = {
    "full": "it slices the captured body's rows to the batch's tokens, which in the base configuration are this SP "
            "rank's share",
    "tc_piecewise": "it compiles the forward with torch.compile, which would trace the per-forward choice of "
                    "configuration",
}


def prefill_graph_backend(raw: argparse.Namespace) -> str | None:
    """The prefill CUDA-graph backend the user asked for (`--cuda-graph-config` JSON over
    `--cuda-graph-backend-prefill` and its legacy aliases, as SGLang's `ServerArgs._parse_cuda_graph_config` ranks
    them), or None when left to SGLang."""
    cfg = getattr(raw, "cuda_graph_config", None)
    prefill = cfg.get("prefill") if isinstance(cfg, dict) else getattr(cfg, "prefill", None)
    backend = prefill.get("backend") if isinstance(prefill, dict) else getattr(prefill, "backend", None)
    return str(backend or getattr(raw, "cuda_graph_backend_prefill", None) or "") or None


def describe(cfg, server_args) -> str:
    """Shift's part of the launcher's start-up line."""
    p = server_args.tp_size
    sp = sp_of(cfg.shift, p)
    where = f"{cfg.shift.threshold} tokens per forward" if cfg.shift.threshold else "the calibrated threshold"
    return (f"shift: base (SP={sp}, TP={p // sp}) above {where}, shift (TP={p}) at or below; one KV cache; base "
            "weights gathered from the TP shards, shift shards are views of them")


FEATURE = Feature(
    name="shift",
    summary="Ulysses sequence parallelism for big forwards, TP for small ones, on one KV cache (Shift Parallelism)",
    settings=ShiftSettings,
    architectures=ARCHITECTURES,
    check=check,
    describe=describe,
)
