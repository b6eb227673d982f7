"""ZeroDP as a feature of the overlay: its checks before any GPU work, its SGLang defaults, its start-up line.

The hook bodies live in `sgl_sidp.zerodp.runtime` (entries of `sgl_sidp.hooks.HOOKS` tagged "zerodp").
"""

from __future__ import annotations

import argparse

from sgl_sidp.feature import Feature, architecture_problems, flag_given, replica_problems
from sgl_sidp.hooks import FUSED_MOE
from sgl_sidp.model_info import model_is_moe, moe_layer_ids, read_hf_config
from sgl_sidp.zerodp.settings import ZeroDPSettings

#: SGLang MoE all-to-all backends (`--moe-a2a-backend`) other than "none": SGLang builds `DeepEPMoE`
#: layers for them, whose `run_moe_core` is its own, so our slot sync points would never run.
A2A_OK = ("none",)


#: Architecture -> the SGLang classes the ZeroDP hooks act through in it: `FusedMoE` (built by SGLang's
#: `get_moe_impl_class` with `--moe-a2a-backend none`; its `__init__` and `run_moe_core` are hooked) in decoder layers
#: at `model.model.layers` (where the slot ring's forward pre-hook goes). Each entry but DeepSeek-V3's is exact on a
#: distinct-weight checkpoint with `all` and the default policy (`tests/gpu/test_family_matrix.py`).
#:
#: `DeepseekV3ForCausalLM` (DeepSeek-V3/R1, Kimi-K2) is SGLang's `DeepseekV2ForCausalLM` subclassed with nothing
#: changed (`sglang.srt.models.deepseek_v2`): the same `DeepseekV2DecoderLayer` (sparse from `first_k_dense_replace`
#: on, every `moe_layer_freq`-th, as `model_info.moe_layer_ids` counts) and `DeepseekV2MoE`. What V3 changes stays
#: outside the pulled tensors: `noaux_tc` routing (sigmoid scores, grouped top-k over `n_group`/`topk_group`) runs in
#: `TopK` before `FusedMoE`, with `e_score_correction_bias` a parameter of the resident `MoEGate`; with 256 routed
#: experts (384 in a Quark checkpoint) and one shared expert, SGLang fuses the shared expert into `FusedMoE` as one more
#: expert (`DeepseekV2ForCausalLM.determine_num_fused_shared_experts`), so a sink pulls it with the routed ones. Not
#: measured: SGLang's own V3 choices on Blackwell (the flashinfer_trtllm MoE runner, which re-lays out the expert
#: tensors after loading, `_deepseek_moe_quant_resolution`), and FP8 block-quantized experts (their scales travel in
#: the w13/w2 groups); `resolve` refuses what SGLang turns on by itself that ZeroDP cannot run.
ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "Qwen3MoeForCausalLM": (FUSED_MOE,),
    "Qwen2MoeForCausalLM": (FUSED_MOE,),
    "MixtralForCausalLM": (FUSED_MOE,),
    "DeepseekV2ForCausalLM": (FUSED_MOE,),
    "DeepseekV3ForCausalLM": (FUSED_MOE,),
}


def check(cfg, raw: argparse.Namespace) -> list[str]:
    """Every reason ZeroDP cannot run with SGLang's flags `raw` (argparse namespace), one line each."""
    problems = []
    dp = int(getattr(raw, "dp_size", 1) or 1)
    if dp < 2:
        problems.append(
            f"--overlay-mode zerodp shares weights across DP replicas: needs --dp-size >= 2 (a source and at least "
            f"one sink), got {dp}"
        )
    hf = read_hf_config(raw.model_path)
    moe_ids = moe_layer_ids(hf) if hf is not None else None
    if model_is_moe(raw.model_path) is False:
        problems.append(
            f"--overlay-mode zerodp offloads MoE expert weights, but {raw.model_path} has no MoE layers "
            "(use --overlay-mode sidp for dense models)"
        )
    elif moe_ids == [] and hf.get("num_hidden_layers"):
        problems.append(
            f"--overlay-mode zerodp offloads MoE expert weights, but no decoder layer of {raw.model_path} holds "
            f"experts (first_k_dense_replace {hf.get('first_k_dense_replace')}, moe_layer_freq "
            f"{hf.get('moe_layer_freq') or 1}, {hf.get('num_hidden_layers')} layers)"
        )
    if moe_ids:
        problems += architecture_problems("zerodp", hf, ARCHITECTURES, "the expert layers a sink pulls")
        problems += _layer_problems(cfg.zerodp.layers, moe_ids)
    problems += flag_problems(raw)
    problems += _launch_problems(cfg, raw) if dp >= 2 else []
    return problems


def flag_problems(args) -> list[str]:
    """SGLang settings ZeroDP refuses, one line each: pipeline parallelism, DP attention, SGLang's weight offloading,
    DWDP, an all-to-all MoE backend, two/single-batch overlap. `args`: SGLang's raw flags (`check`) or its resolved
    `ServerArgs` (`resolve`)."""
    problems = replica_problems("zerodp", args, pp_why="each replica holds all its layers",
                                dp_attention_why="pairs independent DP replicas")
    if int(getattr(args, "dwdp_size", 1) or 1) > 1:
        problems.append("--overlay-mode zerodp and --dwdp-size both move expert weights; use one of them")
    a2a = str(getattr(args, "moe_a2a_backend", "none") or "none")
    if a2a not in A2A_OK:
        problems.append(
            f"--overlay-mode zerodp needs --moe-a2a-backend none, got {a2a}: SGLang's all-to-all MoE layers (DeepEPMoE) "
            "run their experts outside FusedMoE.run_moe_core, where a sink waits for its pulled weights"
        )
    if getattr(args, "enable_two_batch_overlap", False) or getattr(args, "enable_single_batch_overlap", False):
        tbo = getattr(args, "enable_two_batch_overlap", False)
        flag = "--enable-two-batch-overlap" if tbo else "--enable-single-batch-overlap"
        problems.append(
            f"--overlay-mode zerodp does not work with {flag}: micro-batches run each MoE layer twice per forward, "
            "and a sink's slot ring fetches each offloaded layer once (SGLang's DWDP refuses it too)"
        )
    return problems


def resolve(cfg, server_args):
    """Once SGLang resolved its settings (`Feature.resolve`): what `check` refuses in its flags, refused again where
    SGLang turned it on by itself for the model (none passed the raw check): for `DeepseekV3ForCausalLM`,
    `--enable-prefill-cp` brings DP attention and `--moe-a2a-backend deepep` (SGLang's `_deepseek_family_overrides`),
    whose `DeepEPMoE` layers run their experts outside `FusedMoE.run_moe_core`."""
    return cfg, [f"{p} (SGLang chose this for {server_args.model_path} itself)" for p in flag_problems(server_args)]


def _layer_problems(spec: str, moe_ids: list[int]) -> list[str]:
    """`--zerodp-layers` against the model's MoE layers (`model_info.moe_layer_ids`): a listed layer it does not
    have, or an `every:K` that picks none."""
    if spec.startswith("every:") and int(spec[6:]) > len(moe_ids):
        return [f"--zerodp-layers {spec} offloads nothing: the model has {len(moe_ids)} MoE layers"]
    if spec in ("auto", "all") or spec.startswith("every:"):
        return []
    bad = [x for x in (int(v) for v in spec.split(",")) if x not in set(moe_ids)]
    if bad:
        span = f"{moe_ids[0]}-{moe_ids[-1]}" if moe_ids == list(range(moe_ids[0], moe_ids[-1] + 1)) else str(moe_ids)
        return [f"--zerodp-layers names layers the model has no MoE experts in: {bad} (its MoE layers: {span})"]
    return []


def _launch_problems(cfg, raw: argparse.Namespace) -> list[str]:
    """Checks that read the machine (NVML) or files: peer access of each source/sink pair, the calibration file."""
    from sgl_sidp.calibration.table import Calibration
    from sgl_sidp.peer.topology import peer_access_problems
    from sgl_sidp.zerodp.policy import source_sink_pairs

    pairs = source_sink_pairs(raw.dp_size, raw.tp_size, raw.base_gpu_id, raw.gpu_id_step)
    problems = [f"--overlay-mode zerodp: a sink cannot read its source: {p}" for p in peer_access_problems(pairs)]
    path = cfg.zerodp.calibration
    if path is not None:
        try:
            Calibration.load(path)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the same problem for the user
            problems.append(f"--zerodp-calibration {path}: cannot read it ({type(e).__name__}: {e})")
    return problems


def sglang_defaults(argv: list[str]) -> list[str]:
    """SGLang flags ZeroDP changes unless the user set them: capacity-aware routing.

    `--load-balance-method total_tokens` is what `sgl_sidp.zerodp.runtime` makes capacity-aware;
    SGLang's default (round robin) would give the sink the source's share.
    """
    if not flag_given(argv, "--load-balance-method"):
        argv = list(argv) + ["--load-balance-method", "total_tokens"]
    return argv


def ignored(z: ZeroDPSettings) -> dict[str, str]:
    """The settings `z.layers` leaves unused, each with the sub-mode that reads it (`Feature.ignored`): a forced
    layer set needs neither the load it is sized for nor a calibration."""
    if z.layers == "auto":
        return {}
    return {"expected_batch": "with --zerodp-layers auto", "calibration": "with --zerodp-layers auto"}


def declines(cfg, raw: argparse.Namespace) -> str:
    """Why ZeroDP would gain nothing over vanilla DP of the same layout here (`Feature.declines`), or "".

    With `--zerodp-layers` left at its default (auto), the planner predicts for these GPUs (`plan.verdict.planned`: the runtime's policy
    function, from the bundled or cached calibrations and the measured interconnect) that the policy offloads no MoE
    layer, and that ZeroDP's router (`zerodp.router.pick_rank`) serves `--overlay-plan-workload` less than
    `planner.NEAR_TIE` better than SGLang's round robin. Each sink would then hold every expert, copied from its
    source, with a smaller KV pool (measured on 2 x H100, Qwen3-30B-A3B, 128 x (8,192 in, 16 out): 0.94x vanilla DP2,
    the sink's pool 4.6 % under its source's and 68 of 128 prompts sent to the source). The line names the vanilla
    configuration the planner predicts best where it is not that DP. "" where the planner cannot predict (another GPU
    kind, a model without tables), and where `--zerodp-layers auto` is given: the runtime's policy decides then, on
    what the sinks measure at start-up."""
    z = cfg.zerodp
    if z.layers != "auto" or "layers" in z.model_fields_set:  # `--zerodp-layers auto` given: the sinks decide
        return ""
    from sgl_sidp.peer.topology import gpu_name
    from sgl_sidp.plan.planner import NEAR_TIE, rank
    from sgl_sidp.plan.technique import technique_named
    from sgl_sidp.plan.verdict import OBJECTIVE_WORDS, objective_ratio, planned

    dp, tp = int(raw.dp_size), int(raw.tp_size)
    gpu = gpu_name(int(getattr(raw, "base_gpu_id", 0) or 0))
    result, name, _ = planned(raw.model_path, dp, tp, gpu, "zerodp", z, cfg.plan_workload, cfg.plan_slo, raw)
    rows = [r for r in (result or {}).get("configurations", []) if r.predicted]
    ours = next((r for r in rows if r.name == name), None)
    plain = next((r for r in rows if r.technique == "vanilla" and (r.dp, r.tp) == (dp, tp)), None)
    if ours is None or plain is None or (ours.decisions or {}).get("offload_layers") != 0:
        return ""
    objective = result["objective"]
    router = objective_ratio(objective, ours, plain)
    if router >= 1 + NEAR_TIE:
        return ""
    best = next(r for r in rank(rows, objective) if technique_named(r.technique).vanilla)
    why = ("the KV cache that offloading frees would not raise decode throughput enough to pay for the pulls"
           if z.expected_batch.startswith("kv:") else "no layer's experts can be pulled within that forward")
    line = (f"--overlay-mode zerodp declines: on {dp * tp} x {gpu} its policy is predicted to offload no MoE layer at "
            f"--zerodp-expected-batch {z.expected_batch} ({why}), and its router at {router:.2f}x "
            f"{OBJECTIVE_WORDS[objective]} of SGLang's round robin on {result['workload']}, so every sink would be a "
            f"vanilla DP replica with less KV; starting vanilla SGLang ({plain.name}: --dp-size {dp} --tp-size {tp}, "
            f"SGLang's own routing) instead")
    if best is not plain:
        line += (f", predicted at {objective_ratio(objective, plain, best):.2f}x {OBJECTIVE_WORDS[objective]} of the "
                 f"best vanilla configuration, {best.name}")
    return (line + " (predicted by the planner from one-GPU calibrations, not measured). To run ZeroDP anyway: "
            "--zerodp-layers auto (the sinks' own measurements decide), all or LAYERS, or --zerodp-expected-batch "
            "kv:TOKENS|prefill:TOKENS")


def describe(cfg, server_args) -> str:
    """ZeroDP's part of the launcher's start-up line."""
    z = cfg.zerodp
    return (
        f"zerodp: source DP0, sinks DP1..DP{server_args.dp_size - 1}, tensors={z.tensors}, layers={z.layers}, "
        f"expected batch={z.expected_batch}, routing={server_args.load_balance_method}"
    )


FEATURE = Feature(
    name="zerodp",
    summary="MoE experts pulled just in time from a source DP replica over NVLink",
    settings=ZeroDPSettings,
    architectures=ARCHITECTURES,
    check=check,
    sglang_defaults=sglang_defaults,
    describe=describe,
    ignored=ignored,
    resolve=resolve,
    planner="sgl_sidp.zerodp.planner:TECHNIQUE",
    declines=declines,
)
