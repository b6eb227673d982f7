"""Shift Parallelism as a feature of the overlay: its checks before any GPU work, its SGLang default and its start-up
line. Decode and prefill CUDA graphs run in both configurations; Shift raises SGLang's largest decode graph to
`DECODE_GRAPH_MAX_BS` (`sglang_defaults`). The hook bodies live in `sgl_sidp.shift.runtime` (entries of
`sgl_sidp.hooks.HOOKS` tagged "shift")."""

from __future__ import annotations

import argparse

from sgl_sidp.feature import Feature, dense_model_problems, flag_given
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

_GEMMA_MLP = ("SGLang builds its FFN layers as {mlp}, whose forward no shift hook replaces (they replace Qwen2MLP's "
              "and LlamaMLP's): in the base configuration it would multiply this SP rank's tokens by the TP shards and "
              "all-reduce them with SP ranks that hold other tokens")
#: Architecture -> (the SGLang classes of its layers the shift hooks do not act on, why Shift refuses it)
#: (`Feature.refused`). Gemma 3's `Gemma3TextScaledWordEmbedding` is a torch `nn.Embedding`, so the embedding hook
#: (`VocabParallelEmbedding.forward`), where every forward chooses its configuration, would never run.
REFUSED: dict[str, tuple[tuple[str, ...], str]] = {
    "GemmaForCausalLM": (("sglang.srt.models.gemma.GemmaMLP",), _GEMMA_MLP.format(mlp="GemmaMLP")),
    "Gemma2ForCausalLM": (("sglang.srt.models.gemma2.Gemma2MLP",), _GEMMA_MLP.format(mlp="Gemma2MLP")),
    "Gemma3ForCausalLM": (("sglang.srt.models.gemma3_causal.Gemma3MLP",
                           "sglang.srt.models.gemma3_causal.Gemma3TextScaledWordEmbedding"),
                          _GEMMA_MLP.format(mlp="Gemma3MLP") + "; and it embeds tokens with "
                          "Gemma3TextScaledWordEmbedding (an nn.Embedding), not VocabParallelEmbedding, whose forward "
                          "is where the shift hooks choose each forward's configuration"),
}


#: the largest decode batch Shift's server runs in a CUDA graph unless the user sets one (`sglang_defaults`). SGLang
#: 0.5.17 captures up to 256 below TP4 on H100 and H200 and runs larger batches eagerly; Shift decodes in its shift
#: configuration (TP = P) below its threshold, so a high load's batches of 257-512 rows ran eagerly, where DP's
#: replicas stay in graphs. On 2 x H200, Qwen3-8B, 512 x (1,024 in, 256 out) (`q8_graphs512_shift_2gpu_h200` and
#: `_on_`): 512-row steps 73.9 ms eagerly against 458-row steps of 21.7 ms in graphs; 38,632 against 21,503 tok/s
#: (1.80x), TPOT p50 46.6 against 102 ms; 0.4 % fewer KV tokens (2 MiB reserved a captured batch size).
DECODE_GRAPH_MAX_BS = 512

#: the flags by which the user sets the decode graphs' sizes or turns them off: Shift's default then stays out
_DECODE_GRAPH_FLAGS = ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs", "--cuda-graph-bs-decode", "--cuda-graph-bs",
                       "--disable-cuda-graph", "--disable-decode-cuda-graph", "--cuda-graph-backend-decode",
                       "--cuda-graph-config")


def sglang_defaults(argv: list[str]) -> list[str]:
    """SGLang flags Shift changes unless the user set them: decode graphs up to `DECODE_GRAPH_MAX_BS` rows."""
    if not flag_given(argv, *_DECODE_GRAPH_FLAGS):
        argv = list(argv) + ["--cuda-graph-max-bs-decode", str(DECODE_GRAPH_MAX_BS)]
    return argv


def sp_of(settings, tp_size: int) -> int:
    """The base configuration's SP: `--shift-sp` (`settings.sp`), or P when 0 (the launcher replaces 0 by the
    largest SP whose base weights fit, `resolve`, before SGLang's processes read the settings)."""
    return settings.sp or tp_size


def check(cfg, raw: argparse.Namespace) -> list[str]:
    """Every reason Shift Parallelism cannot run with SGLang's flags `raw` (argparse namespace), one line each."""
    problems = []
    p = int(getattr(raw, "tp_size", 1) or 1)
    sp = sp_of(cfg.shift, p)
    if p % sp:
        problems.append(f"--shift-sp {sp} does not divide --tp-size {p}")
    from sgl_sidp.peer.topology import visible_gpu_count

    gpus = visible_gpu_count()
    last = int(getattr(raw, "base_gpu_id", 0) or 0) + (p - 1) * int(getattr(raw, "gpu_id_step", 1) or 1)
    if gpus is not None and last >= gpus:
        problems.append(f"--overlay-mode shift with --tp-size {p} needs GPU {last}, but {gpus} GPU(s) are visible")
    bad, hf = dense_model_problems("shift", raw.model_path, ARCHITECTURES, "the layers its base configuration runs",
                                   refused=REFUSED)
    problems += bad
    if hf is not None:  # every problem at once, even with another architecture
        heads, kv = hf.get("num_attention_heads"), hf.get("num_key_value_heads") or hf.get("num_attention_heads")
        if heads and not p % sp:
            try:
                check_layout(sp, p // sp, int(heads), int(kv))
            except HeadLayoutError as e:
                problems.append(f"--overlay-mode shift: {e}")
        if hf.get("quantization_config"):
            problems.append("--overlay-mode shift runs bf16/fp16 weights only so far (the base GEMMs call F.linear); "
                            f"{raw.model_path} is quantized")
    for flag, attr, why in (
        ("--dp-size", "dp_size", "DP replicas"), ("--pp-size", "pp_size", "pipeline stages"),
    ):
        if int(getattr(raw, attr, 1) or 1) > 1:
            problems.append(f"--overlay-mode shift does not combine with {flag} > 1 ({why}) yet")
    for attr, flag in (("enable_dp_attention", "--enable-dp-attention"), ("speculative_algorithm", "--speculative-algorithm"),
                       ("quantization", "--quantization"), ("enable_torch_compile", "--enable-torch-compile"),
                       ("flashinfer_allreduce_fusion_backend", "--flashinfer-allreduce-fusion-backend"),
                       ("enable_two_batch_overlap", "--enable-two-batch-overlap"),
                       ("enable_quant_communications", "--enable-quant-communications"),
                       ("is_embedding", "--is-embedding")):
        if getattr(raw, attr, None):
            problems.append(f"--overlay-mode shift does not work with {flag} yet (the base configuration replaces the "
                            "layers' GEMMs and TP all-reduces, and gathers the tokens only for the logits, where that "
                            "flag changes them)")
    if cfg.shift.exact and "all_to_all" in cfg.shift.model_fields_set and cfg.shift.all_to_all == "overlap":
        problems.append("--shift-all-to-all overlap does not combine with --shift-exact (whose row-parallel layers "
                        "sum every TP rank's partial in rank order after NCCL's all-to-all); drop one of them")
    backend = prefill_graph_backend(raw)
    if backend in UNSUPPORTED_PREFILL_GRAPHS:
        problems.append(f"--overlay-mode shift runs SGLang's breakable prefill CUDA graphs (the default) or none, not "
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


def fused_all_reduce_problems(server_args) -> list[str]:
    """SGLang's resolved settings that fuse the TP all-reduce into another kernel (FlashInfer's all-reduce + RMSNorm
    fusion, also reached through the deprecated --enable-flashinfer-allreduce-fusion or SGLang's own per-model
    auto-enabling; AITER's): that path bypasses the hooked all-reduce, and the base configuration's SP ranks would
    have their different tokens summed."""
    problems = []
    backend = getattr(server_args, "flashinfer_allreduce_fusion_backend", None)
    if backend is not None:
        problems.append(f"--overlay-mode shift cannot run with SGLang's FlashInfer all-reduce fusion (resolved backend "
                        f"'{backend}'): the fused kernel bypasses the all-reduce the base configuration limits to its "
                        "TP group; drop --enable-flashinfer-allreduce-fusion / --flashinfer-allreduce-fusion-backend, "
                        "or add --enforce-disable-flashinfer-allreduce-fusion")
    if getattr(server_args, "enable_aiter_allreduce_fusion", False):
        problems.append("--overlay-mode shift cannot run with --enable-aiter-allreduce-fusion (the fused kernel bypasses "
                        "the all-reduce the base configuration limits to its TP group)")
    return problems


def base_kv_tokens(hf: dict, p: int, sp: int, gpu_bytes: int, mem_fraction_static: float, dtype_flag: str = "auto") -> int:
    """KV tokens per GPU with the base configuration (SP, TP = P / SP) holding its weights: every layer's linears
    split P / SP ways, the vocabulary P ways (the shift configuration's shards are views of them), and what a Shift GPU
    holds besides (`shift.planner.RESERVE_GIB`) and what its TP group of P takes before the model loads
    (`plan.steps.group_reserve_gib`, as the planner counts it), the KV cache laid out as in TP = P
    (`calibration.memory`)."""
    from sgl_sidp.calibration.memory import GIB, ModelShapes, dtype_bytes, free_before_load, kv_tokens
    from sgl_sidp.plan.steps import group_reserve_gib
    from sgl_sidp.shift.planner import RESERVE_GIB

    shapes, elt = ModelShapes.of(hf), dtype_bytes(hf, dtype_flag)
    weights = shapes.weight_bytes(attn_tp=p // sp, mlp_tp=p // sp, vocab_tp=p, elt=elt) + int(RESERVE_GIB * GIB)
    free = free_before_load(gpu_bytes) - int(group_reserve_gib(p) * GIB)
    return kv_tokens(free, mem_fraction_static, weights, shapes.kv_bytes_per_token(p, elt))


def resolve(cfg, server_args):
    """After SGLang resolved its settings, before any GPU memory is taken: refuse a fused all-reduce
    (`fused_all_reduce_problems`), and choose SP by memory. At SP = P the base configuration holds every linear
    weight on every GPU; the SP whose base weights leave room for at least one chunked prefill of KV tokens
    (`--chunked-prefill-size`, SGLang's resolved value) fits. `--shift-sp 0` becomes the largest SP that fits
    (and whose heads lay out, `check_layout`); a given SP that does not fit is refused, naming the one that would.
    Needs the GPU's size (NVML) and the model's config.json; without them SP stays as given."""
    from sgl_sidp.model_info import read_hf_config
    from sgl_sidp.peer.topology import gpu_memory_bytes

    problems = fused_all_reduce_problems(server_args)
    p, s = int(server_args.tp_size), cfg.shift
    hf, gpu = read_hf_config(server_args.model_path), gpu_memory_bytes(int(server_args.base_gpu_id or 0))
    if hf is None or gpu is None or problems:
        return cfg, problems
    need = max(1, int(server_args.chunked_prefill_size or 0))
    heads, kv = int(hf["num_attention_heads"]), int(hf.get("num_key_value_heads") or hf["num_attention_heads"])
    fits = {}
    for sp in (d for d in range(p, 0, -1) if p % d == 0):
        try:
            check_layout(sp, p // sp, heads, kv)
        except HeadLayoutError:
            continue
        fits[sp] = base_kv_tokens(hf, p, sp, gpu, float(server_args.mem_fraction_static), server_args.dtype)
    ok = [sp for sp, tokens in fits.items() if tokens >= need]
    where = (f"{gpu / 2**30:.0f} GiB GPUs at --mem-fraction-static {float(server_args.mem_fraction_static):g}, "
             f"room for one chunked prefill of {need} KV tokens")
    if s.sp and s.sp not in ok:
        problems.append(f"--shift-sp {s.sp}: the base configuration's weights (linears split {p // s.sp} ways) "
                        f"leave {fits.get(s.sp, 0)} KV tokens per GPU on {where} needed; "
                        + (f"--shift-sp {max(ok)} fits" if ok else "no SP of --tp-size " + str(p) + " fits"))
    elif not s.sp and not ok:
        problems.append(f"--overlay-mode shift: no SP of --tp-size {p} leaves KV room on {where} (SP 1, the linears split "
                        f"{p} ways, leaves {fits.get(1, 0)} tokens); use more GPUs")
    elif not s.sp:
        cfg = cfg.model_copy(update={"shift": s.model_copy(update={"sp": max(ok)})})
    return cfg, problems


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
    refused=REFUSED,
    check=check,
    sglang_defaults=sglang_defaults,
    describe=describe,
    resolve=resolve,
    planner="sgl_sidp.shift.planner:TECHNIQUE",
)
