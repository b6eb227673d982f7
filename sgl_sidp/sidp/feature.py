"""SiDP as a feature of the overlay: its checks before any GPU work, its start-up line.

The hook bodies live in `sgl_sidp.sidp.runtime` (entries of `sgl_sidp.hooks.HOOKS` tagged "sidp").
"""

from __future__ import annotations

import argparse

from sgl_sidp.feature import Feature, dense_model_problems, replica_problems
from sgl_sidp.sidp.settings import SiDPSettings, b_th_measured, cas_graphs_on, ring_slots

QWEN2_MLP, LLAMA_MLP = "sglang.srt.models.qwen2.Qwen2MLP", "sglang.srt.models.llama.LlamaMLP"

#: Architecture -> the SGLang MLP class the SiDP hooks wrap in it (`Qwen2MLP`, which Qwen3 imports as `Qwen3MLP`, and
#: `LlamaMLP`, which SGLang's Mistral inherits; each holds `gate_up_proj.weight` and `down_proj.weight`). Each entry is
#: exact on a distinct-weight checkpoint (`tests/gpu/test_family_matrix.py`).
ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "Qwen3ForCausalLM": (QWEN2_MLP,),
    "Qwen2ForCausalLM": (QWEN2_MLP,),
    "LlamaForCausalLM": (LLAMA_MLP,),
    "MistralForCausalLM": (LLAMA_MLP,),
}

#: Architecture -> (the SGLang MLP class its decoder layers use, why SiDP refuses it) (`Feature.refused`). Gemma's
#: MLPs hold `gate_up_proj` and `down_proj` like `Qwen2MLP`, but their `forward(x)` takes no `forward_batch` (a
#: parameter of the SiDP MLP hooks): accepting them needs hooks on their own classes and a GPU exactness run.
REFUSED: dict[str, tuple[tuple[str, ...], str]] = {
    f"Gemma{v}ForCausalLM": ((f"sglang.srt.models.{module}.Gemma{v}MLP",),
                             f"SGLang builds its FFN layers as Gemma{v}MLP, whose __init__ and forward no sidp hook "
                             "wraps (they wrap {hooked}): no rank would share, stream or serve them")
    for v, module in (("", "gemma"), ("2", "gemma2"), ("3", "gemma3_causal"))
}


def check(cfg, raw: argparse.Namespace) -> list[str]:
    """Every reason SiDP cannot run with SGLang's flags `raw` (argparse namespace), one line each."""
    problems = []
    s = cfg.sidp
    if s.service != "was" and getattr(raw, "speculative_algorithm", None):
        problems.append(f"--sidp-service {s.service} does not work with speculative decoding (a CaS iteration runs "
                        "one forward per rank, in step with the others); use --sidp-service was")
    if s.cas_graphs:  # asked for: refused where it cannot run (the default only falls back, `cas_graphs_on`)
        if _no_graphs(raw):
            problems.append("--sidp-cas-graphs captures decode CUDA graphs: drop --disable-cuda-graph")
        if cfg.fold_gpus:
            problems.append("--sidp-cas-graphs moves CaS rows over NCCL, which refuses two ranks on one GPU: "
                            "drop --overlay-fold-gpus")
    if s.service == "auto" and s.b_th_measure is True and s.b_th:
        problems.append(f"--sidp-b-th {s.b_th:g} and --sidp-b-th-measure both set B_th: pass one")
    if s.service == "auto" and s.b_th_measure is True and not cas_graphs_on(s, _no_graphs(raw), cfg.fold_gpus):
        problems.append("--sidp-b-th-measure times the CaS decode graphs, which this server does not capture "
                        "(--disable-cuda-graph, --overlay-fold-gpus or --no-sidp-cas-graphs): drop it, or pass "
                        "--sidp-b-th TOKENS")
    dp = int(getattr(raw, "dp_size", 1) or 1)
    if dp < 2:
        problems.append(f"--overlay-mode sidp shares FFN layers across DP ranks: needs --dp-size >= 2, got {dp}")
    bad, hf = dense_model_problems("sidp", raw.model_path, ARCHITECTURES, "the FFN layers it shares",
                                   " (use --overlay-mode zerodp)", REFUSED)
    problems += bad
    if hf is not None:  # every problem at once, even with another architecture
        layers = hf.get("num_hidden_layers")
        if dp >= 2 and layers is not None and int(layers) < dp:
            problems.append(f"--overlay-mode sidp: {layers} layers cannot give each of {dp} DP ranks a layer to own")
    problems += replica_problems("sidp", raw, pp_why="each rank runs every layer",
                                 dp_attention_why="runs independent DP ranks")
    if getattr(raw, "enable_two_batch_overlap", False) or getattr(raw, "enable_single_batch_overlap", False):
        problems.append(
            "--overlay-mode sidp does not work with two/single-batch overlap: micro-batches run each MLP twice per "
            "forward, and the WaS slot ring fetches each streamed layer once"
        )
    if dp >= 2:
        from sgl_sidp.peer.topology import peer_access_problems, replica_gpus

        gpus = replica_gpus(dp, int(raw.tp_size or 1), raw.base_gpu_id, raw.gpu_id_step)
        pairs = [(gpus[a][t], gpus[b][t]) for a in range(dp) for b in range(dp) if a != b for t in range(len(gpus[0]))]
        problems += [f"--overlay-mode sidp: a rank cannot read an owner: {p}" for p in peer_access_problems(pairs)]
    return problems


def _no_graphs(args) -> bool:
    """SGLang's `--disable-cuda-graph` of `args` (its parsed flags or `ServerArgs`)."""
    return bool(getattr(args, "disable_cuda_graph", False))


def ignored(s: SiDPSettings) -> dict[str, str]:
    """The settings `s.service` leaves unused, each with the sub-mode that reads it (`Feature.ignored`)."""
    out = {}
    if s.service != "auto":
        out |= {"b_th": "with --sidp-service auto", "hysteresis": "with --sidp-service auto",
                "b_th_measure": "with --sidp-service auto"}
    if s.service == "was":
        out["cas_graphs"] = "with --sidp-service cas or auto (it captures CaS decodes)"
    return out


def resolve(cfg, server_args):
    """After SGLang resolved its settings, before any GPU memory is taken: auto without `--sidp-b-th` gets the
    planner's B_th for this model, GPU kind and DP x TP on `--overlay-plan-workload` (`SiDPTechnique.b_th`: the
    smallest decode batch from which WaS is predicted no slower than CaS, from the bundled or `plan calibrate`d
    one-GPU tables of this GPU kind; a prediction, the same one `python -m sgl_sidp.plan` launches with), so every
    rank runs the rule the planner predicted. Where the planner cannot predict it, one line says what to pass or run."""
    s = cfg.sidp
    if s.service != "auto" or s.b_th or b_th_measured(s, _no_graphs(server_args), cfg.fold_gpus):  # measured later
        return cfg, []
    from sgl_sidp.peer.topology import gpu_name
    from sgl_sidp.plan.verdict import planned_row

    dp, tp = int(server_args.dp_size), int(server_args.tp_size)
    row, why = planned_row(server_args.model_path, dp, tp, gpu_name(int(server_args.base_gpu_id or 0)), "sidp", s,
                           cfg.plan_workload, server_args)
    b_th = (row.decisions or {}).get("b_th") if row is not None else None
    if b_th is None:
        return cfg, [f"--sidp-service auto (the default) needs B_th, which this server cannot measure at start-up "
                     f"(no CaS decode graphs) and the planner cannot predict here ({why}): pass --sidp-b-th TOKENS or "
                     f"--sidp-service was, or make this model's tables on this GPU kind first: python -m "
                     f"sgl_sidp.plan calibrate --model-path {server_args.model_path} --gpus {dp * tp}"]
    b_th = 1e9 if b_th == float("inf") else max(1.0, float(b_th))  # inf: CaS at every batch the planner tried
    return cfg.model_copy(update={"sidp": s.model_copy(update={"b_th": b_th})}), []


def describe(cfg, server_args) -> str:
    """SiDP's part of the launcher's start-up line."""
    s = cfg.sidp
    d = server_args.dp_size
    slots = ring_slots(s.slots, d)
    how = {"was": "WaS", "cas": "CaS (DP ranks in lockstep)",
           "auto": "WaS at >= B_th tokens per rank, else CaS (B_th "
           + ("measured at start-up" if b_th_measured(s, _no_graphs(server_args), cfg.fold_gpus) else f"{s.b_th:g}")
           + f", hysteresis {s.hysteresis:g}; DP ranks in lockstep)"}[s.service]
    graphs = ""
    if s.service != "was":
        on = cas_graphs_on(s, _no_graphs(server_args), cfg.fold_gpus)
        why = "" if s.cas_graphs is not None or on else " (no decode graphs here: --disable-cuda-graph or " \
                                                           "--overlay-fold-gpus)"
        graphs = "; CaS decodes in CUDA graphs" if on else f"; CaS decodes eager{why}"
    return (f"sidp: FFN layer l owned by DP rank l mod {d}; non-owned layers {how}{graphs}; {slots} WaS slots, "
            f"{s.fetch_order} fetch order")


FEATURE = Feature(
    name="sidp",
    summary="dense FFN layers owned per DP rank; the others stream them from the owner (WaS) or send it their rows (CaS)",
    settings=SiDPSettings,
    architectures=ARCHITECTURES,
    refused=REFUSED,
    check=check,
    describe=describe,
    ignored=ignored,
    resolve=resolve,
    planner="sgl_sidp.sidp.planner:TECHNIQUE",
)
