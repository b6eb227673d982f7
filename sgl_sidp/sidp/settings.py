"""SiDP's flags (`--sidp-*`), as the `sidp` part of `sgl_sidp.config.SidpConfig`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SiDPSettings(BaseModel):
    """SiDP's settings; each field is the flag `--sidp-<field>`."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # inf/nan: refused

    service: Literal["was", "cas", "auto"] = Field(
        "auto",
        description="How a rank runs the FFN layers it does not own: 'was' (Weight-as-a-Service: stream the owner's "
        "weights into a slot ring, a few layers ahead; the ranks run independently), 'cas' (Compute-as-a-Service: "
        "send the layer's input rows to the owner, which runs the layer once over every rank's rows) or 'auto' "
        "(WaS at or above B_th tokens per rank, CaS below; B_th measured at start-up, --sidp-b-th-measure). 'cas' "
        "and 'auto' run the DP ranks in lockstep (one all-gather of token counts per scheduler iteration); their CaS "
        "decodes replay CUDA graphs (--sidp-cas-graphs). Default auto: on 2 x H100, Qwen3-32B, a prefill-heavy burst "
        "ran as fast in auto as in WaS's prefills, and WaS decodes are copy-bound (75-87 ms a step against CaS's "
        "26-64 ms at 1-256 rows).",
    )
    cas_graphs: bool | None = Field(
        None,
        description="[cas, auto] Decode iterations in CaS replay CUDA graphs: after SGLang captured its decode graphs, "
        "every rank captures a second set with the CaS exchange inside (NCCL all-gather of every rank's rows padded "
        "to the graph size, the owner's one GEMM, a broadcast back) and all ranks replay the size of the largest "
        "rank's batch. Prefill and mixed iterations stay eager. Default: on wherever SGLang captures decode graphs "
        "and each rank has its own GPU (off with --disable-cuda-graph or --overlay-fold-gpus, said in the start-up "
        "line); --no-sidp-cas-graphs: eager CaS decodes (on Qwen3-32B, 2 x H100: 0.40x vanilla TP2's burst "
        "throughput against 0.64x in graphs).",
    )
    b_th: float = Field(
        0.0, ge=0,
        description="[auto] B_th, tokens per rank per forward (mean over the DP ranks) at or above which an iteration "
        "runs WaS. 0: the planner's, chosen at launch for this model, GPU kind, DP x TP and --overlay-plan-workload "
        "(the smallest decode batch from which WaS is predicted no slower than CaS, from the bundled or `python -m "
        "sgl_sidp.plan calibrate`d one-GPU tables of this GPU kind; where there are none, launch stops and says so).",
    )
    b_th_measure: bool | None = Field(
        None,
        description="[auto] Measure B_th at start-up on this group's GPUs instead of taking the planner's: once the "
        "CaS decode graphs are captured, every rank times decode steps of 1 to 256 rows replayed in CaS, and in WaS "
        "where the answer needs it (at 256 rows, then a bisection, or at 192 too), the ranks keep the slowest rank's "
        "time of each, and B_th is the smallest batch from which WaS is no slower (the planner's rule, on measured "
        "steps), or where the two curves' lines through their two largest sizes meet when WaS is still slower at "
        "256. Default: measured wherever the CaS "
        "decode graphs run and --sidp-b-th is not given, else the planner's at launch (said in the start-up line); "
        "--sidp-b-th-measure: refused where it cannot run; --no-sidp-b-th-measure: the planner's.",
    )
    hysteresis: float = Field(
        0.25, ge=0, lt=1,
        description="[auto] Back to CaS only below B_th * (1 - hysteresis), so a batch near B_th does not flip the "
        "mode every iteration.",
    )
    slots: int = Field(
        0, ge=0, le=16,
        description="WaS slots per rank: layers' weights in flight or in use at once (each slot holds one FFN "
        "layer's gate_up and down weights of this TP rank). 0: d - 1 with d DP ranks, at least 2 (peak shifting "
        "needs d - 1).",
    )
    fetch_order: Literal["shifted", "forward"] = Field(
        "shifted",
        description="Order a rank fetches a cycle of d layers in: 'shifted' (peak shifting: rank r starts after its "
        "own layer and wraps, so ranks read different owners at once; needs d - 1 slots, else forward) or "
        "'forward' (every rank in layer order, for comparison). The same for d = 2.",
    )
    owner_timeout_s: float = Field(
        900.0, gt=0,
        description="Seconds a rank waits for the other ranks to publish the FFN layers they own (they may still "
        "be loading weights).",
    )


def ring_slots(slots: int, d: int) -> int:
    """WaS slots a rank of `d` DP ranks holds: `--sidp-slots`, or d - 1 (at least 2) when 0 (peak shifting needs
    d - 1). One rule for the runtime's ring, the start-up line and the planner's memory."""
    return slots or max(2, d - 1)


def cas_graphs_on(s: SiDPSettings, disable_cuda_graph: bool, fold_gpus: bool) -> bool:
    """Whether CaS decodes replay CUDA graphs: `--sidp-cas-graphs` as given, else on where they can run (SGLang
    captures decode graphs and each DP rank has its own GPU, as NCCL needs); never with WaS alone."""
    if s.service == "was":
        return False
    return s.cas_graphs if s.cas_graphs is not None else not (disable_cuda_graph or fold_gpus)


def b_th_measured(s: SiDPSettings, disable_cuda_graph: bool, fold_gpus: bool) -> bool:
    """Whether the ranks measure auto's B_th at start-up (`SiDPRuntime.measure_b_th`): `--sidp-b-th-measure` as
    given, else wherever the CaS decode graphs it times run (`cas_graphs_on`) and `--sidp-b-th` is not given."""
    if s.service != "auto" or s.b_th:
        return False
    return s.b_th_measure if s.b_th_measure is not None else cas_graphs_on(s, disable_cuda_graph, fold_gpus)
