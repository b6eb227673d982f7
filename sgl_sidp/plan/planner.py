"""The planner as a library: every configuration of a model on N GPUs of one node, predicted from one-GPU calibrations.

Start at `plan` (a `--workload` spec) or `plan_requests` (an explicit request list): for each configuration
(`configs.configurations`) it reads the calibrations of its shards (`steps.find_calibration`), builds its step model
(`steps.StepModel`), sizes its weights and KV cache (`configs.Configuration.kv_tokens`), simulates SGLang's scheduler
on the requests (`sim.simulate`), and ranks the predicted ones (`rank`); the result is the `--json` object of
`python -m sgl_sidp.plan`. `table` and `write_png` render it; `launch_flags` turns a row into the flags that start
it. `PlanError` is any input the planner cannot work with, as one line.

Used by the command (`__main__`: argument parsing and printing only), the launcher's `--overlay-mode auto`
(`sgl_sidp.launch_server.resolve_auto`), the comparison report (`sgl_sidp.bench.compare_report`) and the validation
scripts (`scripts/plan_validate_*.py`). Every number it gives is a prediction.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Sequence

from sgl_sidp.calibration.memory import (GIB, ModelShapes, default_decode_graph_max_bs, default_mem_fraction_static,
                                        dtype_bytes)
from sgl_sidp.model_info import read_hf_config
from sgl_sidp.plan.calibrate import unservable
from sgl_sidp.plan.comm import Interconnect, InterconnectError
from sgl_sidp.plan.configs import configuration_named, configurations, option, shard_of
from sgl_sidp.plan.server_flags import DEFAULTS, ServerFlags
from sgl_sidp.plan.sim import (PrivateBlocks, ReplicaLimits, ReplicaSim, SimRequest, StepTimes, deliver, goodput,
                               no_cycle_collection, simulate, summarize)
from sgl_sidp.plan.steps import (GPUS, ShardClock, StepModel, find_calibration, free_before_load_bytes,
                                 host_time_alone_ms, output_mean_index, request_overhead_ms,
                                 shard_roles, shard_signature, stream_tokens_per_s)
from sgl_sidp.plan.technique import technique_named
from sgl_sidp.plan.what_if import NO_WHAT_IF, WhatIf

DECODE_CONTEXTS, DECODE_BATCHES, PREFILL_TOKENS = (256, 2048), (1, 8, 32, 64, 128, 256), (512, 2048, 4096, 8192)

#: GPU counts of the nodes whose measurements the planner's predictions have been checked against: one H200
#: (`benchmarks/results/plan/`), 2 x H200 and 2 x H100, 4 x H200 and 4 x H100 (`benchmarks/results/plan_multi_gpu/`:
#: Llama-3.1-70B's and Qwen3-32B's bursts and a trace replay on 4 GPUs). A plan for any other count is an
#: extrapolation (`extrapolation`). Not read from the interconnect tables (`comm`): their 8-GPU entries are public
#: figures, and even a measured entry times the collectives alone, not a prediction of a served node.
MEASURED_GPU_COUNTS = (1, 2, 4)


class PlanError(ValueError):
    """Input the planner cannot work with (one line for the user)."""


def extrapolation(n_gpus: int) -> str | None:
    """One line saying that a plan for `n_gpus` GPUs is an extrapolation, no node of that many GPUs having measured
    the planner's predictions (`MEASURED_GPU_COUNTS`); None for a count that one has."""
    if n_gpus in MEASURED_GPU_COUNTS:
        return None
    measured = ", ".join(str(n) for n in MEASURED_GPU_COUNTS[:-1]) + f" and {MEASURED_GPU_COUNTS[-1]}"
    return (f"{n_gpus} GPUs: an extrapolation (no {n_gpus}-GPU node has measured these predictions; nodes of "
            f"{measured} GPUs have)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanRow:
    """One configuration's prediction: a row of the table, an entry of the `--json` object's "configurations"
    (`as_dict`). Every number is a prediction. A field that is None is absent from the JSON: the optional ones say
    when they are set.

    Attributes:
        name: the configuration's name (`configs.configuration_named` reads it back), e.g. "dp2", "sidp_dp2_auto".
        technique: "vanilla", "dp_attention", "zerodp", "sidp" or "shift".
        variant: the technique's variant ("was", "cas", "auto" for SiDP; "" where there is none).
        dp, tp, sp: DP replicas, TP size of one replica, Shift's SP size (1 where it has none).
        mem_fraction_static: SGLang's default `--mem-fraction-static` for the configuration's servers (fraction of
            GPU memory).
        calibrations: shard role ("forward"; Shift's "shift" and "base") -> the calibration file read for it; None
            when none of its shards is calibrated.
        weights_gb_per_gpu: weights on the fullest GPU (GB, 1e9 bytes).
        kv_tokens_total: KV cache tokens over all of the configuration's GPUs (SGLang's `max_total_num_tokens`
            summed over the DP replicas).
        not_predicted: why nothing past the memory is predicted (a shard without calibration, with the command that
            makes one where one can; no room for a KV cache); None when predicted.
        decisions: what the technique decides from this cost model (`steps.StepModel.decisions`: SiDP's "b_th",
            Shift's "shift_threshold", ZeroDP's "offload_layers" and "copy_ms_per_forward" ms); {}
            for vanilla; None when not predicted.
        graphs_past_calibration: where the server's decode graphs run batches larger than a shard's calibration
            timed, priced along its slope (`steps.StepModel.graphs_past_calibration`); None where none does.
        decode_step_ms: context tokens -> batch -> one decode step (ms), keys as strings (`DECODE_CONTEXTS` x
            `DECODE_BATCHES`).
        prefill_ms: prompt tokens -> one fresh prefill of that many tokens (ms), keys as strings (`PREFILL_TOKENS`).
        decode_at: the decode step (ms) at each of `plan`'s `decode_points` (batch, context), in their order; None
            without decode points.
        requests: requests the simulation finished (0: none; then only `rejected` follows).
        makespan_s: first arrival to last finish (s).
        total_tok_s, output_tok_s: prompt plus output tokens, and output tokens, per second of the makespan.
        ttft_ms_p50, ttft_ms_p99: time to first token, median and 99th percentile (ms; with the request overhead).
        tpot_ms_p50, tpot_ms_p99: time per output token after the first, median and 99th percentile (ms).
        e2e_ms_p50, e2e_ms_p99: arrival to last token, median and 99th percentile (ms; with the request overhead).
        retractions: decode retractions the simulated scheduler made (SGLang's, on a full KV cache).
        rejected: requests that can never fit the KV cache.
        ratio_to_best_vanilla: `total_tok_s` over the best vanilla or DP-attention configuration's; None when either
            is not predicted.
        good_requests, request_goodput: with `plan`'s `slo`, the requests that met both objectives (TTFT with the
            request overhead) and their count per second of the makespan (req/s); None without.
        goodput_by_slo: with `plan_requests`' `more_slos`, "TTFT/TPOT" (ms, `slo_key`) -> the goodput (req/s) of the
            same simulated requests under those objectives; None without.
        schedule: with `plan_requests`' `keep_schedule`, each request's (first token, last token) in seconds from
            the first arrival, without the request overhead, in the order of the requests given; None without.
        busy_s: with `keep_schedule`, per DP replica the seconds its forwards ran, {"extend": prefills, "decode":
            decode steps} (`sim.ReplicaSim.busy_s`); None without, and for replicas in lockstep.
        in_phase_tok_s: for replicas in lockstep on an offline burst, `total_tok_s` had every replica taken its
            first requests in the same iteration (tokens/s). The burst's first request reaches one replica alone
            (`BURST_REST_S`), which then runs one iteration ahead of the others for the whole burst; a server's
            replicas may also start in phase (`sim.simulate_lockstep`), and the two schedules differ by up to 20 %
            (Llama-3.1-70B SiDP DP4, 512 x (2,048 in, 16 out), 4 x H100). None otherwise.
    """

    name: str
    technique: str
    variant: str
    dp: int
    tp: int
    sp: int
    mem_fraction_static: float
    calibrations: dict[str, str] | None = None
    weights_gb_per_gpu: float
    kv_tokens_total: int
    not_predicted: str | None = None
    decisions: dict | None = None
    graphs_past_calibration: str | None = None
    decode_step_ms: dict[str, dict[str, float]] | None = None
    prefill_ms: dict[str, float] | None = None
    decode_at: list[float] | None = None
    requests: int | None = None
    makespan_s: float | None = None
    total_tok_s: float | None = None
    output_tok_s: float | None = None
    ttft_ms_p50: float | None = None
    ttft_ms_p99: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p99: float | None = None
    e2e_ms_p50: float | None = None
    e2e_ms_p99: float | None = None
    retractions: int | None = None
    rejected: int | None = None
    ratio_to_best_vanilla: float | None = None
    good_requests: int | None = None
    request_goodput: float | None = None
    goodput_by_slo: dict[str, float] | None = None
    schedule: tuple[tuple[float, float], ...] | None = None
    busy_s: list[dict[str, float]] | None = None
    in_phase_tok_s: float | None = None

    @property
    def predicted(self) -> bool:
        """Whether the simulation predicted the configuration's throughput and latencies (`total_tok_s` is set)."""
        return self.total_tok_s is not None

    def as_dict(self) -> dict:
        """The row as `--json` prints it: every field that is not None, in the order of the fields."""
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}


#: ms from an iteration's start to SGLang's choice of the next where no calibration of the GPU kind times the host's
#: preparation of a step (`host_time_alone_ms`: 0.35 ms on H200, 0.56 ms on H100)
DEFAULT_DECIDE_MS = 0.5

#: when an offline burst's requests after the first reach their schedulers (s): the first reaches its scheduler alone
#: and is prefilled alone, the rest by the next iteration's choice (every burst's server logs on H100 and H200: each
#: replica's first prefill held one prompt, or two where the rest came before its first choice, and the next the
#: chunk's worth); at once, every replica's first prefill took a full chunk
BURST_REST_S = 1e-6


def workload(spec: str) -> list[SimRequest]:
    """The requests of a `--workload` spec.

    Raises:
        PlanError: an unknown or malformed spec, or an unreadable trace.
    """
    kind, _, rest = spec.partition(":")
    try:
        if kind in ("offline", "latency"):
            counts = [int(x) for x in rest.split(":")]
            names = ("S", "IN", "OUT") if kind == "offline" else ("IN", "OUT")
            if len(counts) != len(names):
                raise ValueError(f"expected {kind}:{':'.join(names)}")
            low = [f"{name} {x}" for name, x in zip(names, counts) if x < 1]
            if low:  # SGLang serves no request without a prompt token, and TPOT needs an output token
                raise ValueError(f"{', '.join(low)}: each at least 1")
            n, inp, out = counts if kind == "offline" else (1, *counts)
            return [SimRequest(0.0 if i == 0 else BURST_REST_S, inp, out) for i in range(n)]
        if kind == "trace":
            from sgl_sidp.bench.traces import load_trace

            path, _, scale = rest.partition(":")
            k = float(scale or 1.0)
            if not 0 < k < float("inf"):
                raise ValueError(f"SCALE {scale}: the arrival times' factor must be a positive number")
            return [SimRequest(r.arrival_s * k, r.input_len, max(1, r.output_len), r.hash_ids) for r in load_trace(path)]
    except (ValueError, OSError) as e:
        raise PlanError(f"--workload {spec}: {e}") from None
    raise PlanError(f"--workload {spec}: expected offline:S:IN:OUT, latency:IN:OUT or trace:FILE[:SCALE]")


def phase_note(win: PlanRow, others: Sequence[PlanRow]) -> str:
    """The reason's clause where the winner's lead over one of `others` (predicted configurations besides it) depends
    on whether a lockstep configuration's replicas start an offline burst in phase (`PlanRow.in_phase_tok_s`): the
    other whose faster schedule is the fastest, where that beats the winner's slower one; "" where none does."""
    def span(r: PlanRow) -> tuple[float, float]:
        alt = r.in_phase_tok_s if r.in_phase_tok_s is not None else r.total_tok_s
        return min(r.total_tok_s, alt), max(r.total_tok_s, alt)

    w_lo = span(win)[0]
    rival = max((r for r in others if r.name != win.name), key=lambda r: span(r)[1], default=None)
    if rival is None or span(rival)[1] <= w_lo:
        return ""
    lock = rival if rival.in_phase_tok_s is not None else win
    lo, hi = span(lock)
    return (f"; {rival.name} may serve it better: {lock.name}'s replicas step together, and its burst runs "
            f"{lo:,.0f}-{hi:,.0f} tokens/s by whether they start it in phase")


def launch_flags(row: PlanRow) -> list[str]:
    """The `python -m sgl_sidp.launch_server` flags (besides the model's) that start configuration `row`, with the
    decisions this cost model made for it (SiDP's B_th, Shift's threshold; ZeroDP's policy is in its name):
    `Configuration.launch_flags`."""
    d = row.decisions or {}
    return configuration_named(row.name).launch_flags(b_th=d.get("b_th"), shift_threshold=d.get("shift_threshold"))


@no_cycle_collection()  # (`plan_requests`; the trace's parse too)
def plan(model_path: str, n_gpus: int, gpu: str, spec: str, calibration_dirs: list[Path] | None = None,
         decode_points: list[tuple[int, int]] | None = None, what_if: WhatIf = NO_WHAT_IF,
         names: Sequence[str] = (), slo: tuple[float, float] | None = None, server: ServerFlags = DEFAULTS) -> dict:
    """The planner's result for the `--workload` spec: the `--json` object (`winner`, `reason`, `launch`, what is
    predicted and from what; `extrapolation`, the line of `extrapolation`, for a GPU count no measured node has),
    its "configurations" a `PlanRow` each (`PlanRow.as_dict` gives the JSON's);
    `decode_points` adds each configuration's predicted decode step at those (batch, context) points as `decode_at`
    (ms). `what_if` sets numbers by hand in place of the calibrated ones (`what_if.WhatIf`, validation scripts'
    sensitivity checks; the result does not say so: the caller does). `names`: configurations to predict besides the
    planner's own (`configs.configuration_named`, with options: "zerodp_dp2_all"), on the same GPUs. `slo`: (TTFT ms,
    TPOT ms) objectives; each row then has its goodput (`PlanRow.request_goodput`), and the configurations are ranked
    by it (`rank`'s "goodput"). `server`: the SGLang flags every configuration's servers are started with
    (`server_flags.ServerFlags`: the prefill chunk and budget, the memory fraction, the largest decode graph; SGLang's
    defaults where not given).

    Raises:
        PlanError: a bad spec, model folder or GPU kind, a model that does not shard over `n_gpus`, no interconnect
            entry it needs, or no configuration predicted.
    """
    objective = "goodput" if slo is not None else "throughput" if spec.startswith("offline:") else "latency"
    return plan_requests(model_path, n_gpus, gpu, spec, workload(spec), calibration_dirs, decode_points, objective,
                         what_if, names, slo, server=server)


#: a configuration "keeps up" with a trace when its predicted throughput is within this of the best one's
KEEPS_UP = 0.02

#: a winner whose predicted throughput is within this of the runner-up's is a near tie: the planner's burst errors on
#: 2 x H100 spread over more than that (TP2 +3.4 % and DP attention -3.0 % on one burst, whose measured order was
#: the other way round: `benchmarks/results/plan_multi_gpu/h100_2gpu/validate.md`), so the reason says so; and a
#: technique that leads the best vanilla configuration by less yields to it (`prefer_vanilla`)
NEAR_TIE = 0.05


def stream_rate(model_path: str, gpu: str, output: int, calibration_dirs: list[Path] | None = None) -> float | None:
    """The rate (tokens/s) at which the planner streams requests of `output` output tokens of the model in
    `model_path` on GPU kind `gpu` (a `GPUS` key) to their clients, as `plan_requests` takes it
    (`steps.stream_tokens_per_s` at their tokens' mean place); None where no calibration measured a bound stream or
    `model_path` has no config.json."""
    hf = read_hf_config(model_path)
    if hf is None or gpu not in GPUS:
        return None
    whole = shard_signature(hf, shard_of(ModelShapes.of(hf), 1, 1, 1))
    return stream_tokens_per_s(GPUS[gpu]["name"], calibration_dirs, model=whole, mean_index=output_mean_index([output]))


def rank(rows: list[PlanRow], objective: str) -> list[PlanRow]:
    """The predicted configurations, best first: by throughput ("throughput", offline work), by goodput ("goodput",
    with SLOs: the requests per second that meet both, then throughput), or ("latency", traces and single requests)
    by median E2E latency among those within `KEEPS_UP` of the best throughput (a trace's throughput is its arrival
    rate wherever the configuration keeps up), then the rest by throughput."""
    done = sorted((r for r in rows if r.predicted), key=lambda r: -r.total_tok_s)
    if objective == "goodput":
        return sorted(done, key=lambda r: -(r.request_goodput or 0.0))  # stable: equal goodput by throughput
    if objective == "throughput" or not done:
        return done
    floor = (1 - KEEPS_UP) * done[0].total_tok_s
    keep = sorted((r for r in done if r.total_tok_s >= floor), key=lambda r: r.e2e_ms_p50)
    return keep + [r for r in done if r.total_tok_s < floor]


def prefer_vanilla(ranked: list[PlanRow], objective: str) -> tuple[list[PlanRow], PlanRow | None]:
    """`ranked` (`rank`'s order) with the best vanilla configuration first where a technique leads it by less than
    `NEAR_TIE` on the objective (throughput or goodput), and that technique (None where nothing moved). Within the
    planner's error a technique's predicted gain is no gain: vanilla SGLang is the known quantity, and on the three
    bursts where the planner had picked a technique predicted within 2 % of vanilla, that technique measured
    0.98-0.99x the best vanilla configuration (`l70_auto512_4gpu_h200`, started by auto; `q32_prefill_2gpu_h100`,
    `q32_shift_1.5x_4gpu_h200`)."""
    if objective not in ("throughput", "goodput") or not ranked or technique_named(ranked[0].technique).vanilla:
        return ranked, None
    van = next((r for r in ranked if technique_named(r.technique).vanilla), None)
    value = (lambda r: r.request_goodput or 0.0) if objective == "goodput" else (lambda r: r.total_tok_s)
    if van is None or not yields(value(ranked[0]), value(van)):
        return ranked, None
    return [van] + [r for r in ranked if r is not van], ranked[0]


def yields(technique: float, vanilla: float) -> bool:
    """Whether a technique predicted at `technique` yields to the best vanilla configuration predicted at `vanilla`
    (the same objective, higher better): it leads by less than `NEAR_TIE` (`prefer_vanilla`)."""
    return technique < (1 + NEAR_TIE) * vanilla


def slo_key(ttft_ms: float, tpot_ms: float) -> str:
    """`PlanRow.goodput_by_slo`'s key of the objectives (TTFT ms, TPOT ms): "1000/10"."""
    return f"{ttft_ms:g}/{tpot_ms:g}"


def observed(times: StepTimes, name: str, on_prefill: Callable | None) -> StepTimes:
    """`times` whose prefill forwards are also reported to `on_prefill(name, parts, ms)` (`plan_requests`); `times`
    itself without one."""
    if on_prefill is None:
        return times

    def prefill_ms(parts) -> float:
        ms = times.prefill_ms(parts)
        on_prefill(name, list(parts), ms)
        return ms

    return StepTimes(times.decode_ms, prefill_ms, times.decode_run, times.longest_row, times.decide_ms,
                     times.release_share, times.release_min_ms)


def replica_limits(c, kv_tokens: int, server: ServerFlags = DEFAULTS) -> ReplicaLimits:
    """SGLang's limits of one replica of configuration `c` (`configs.Configuration`) with `kv_tokens` KV tokens:
    `server`'s `--chunked-prefill-size` and `--max-prefill-tokens` where given, else SGLang's defaults on H100 and H200
    (8,192 from `ServerArgs._handle_gpu_memory_settings`, and `ServerArgs.max_prefill_tokens`' 16,384), the chunk
    divided by `--dp-size` under DP attention
    (`ServerArgs`: "DP attention is enabled. chunked prefill size is adjusted"; 4,096-token chunks in its log on
    2 x H100)."""
    chunk = server.chunked_prefill_size or ReplicaLimits.chunked_prefill
    return ReplicaLimits(kv_tokens=kv_tokens, chunked_prefill=max(1, chunk // max(1, c.kind.dp_attention_dp(c))),
                         max_prefill_tokens=server.max_prefill_tokens or ReplicaLimits.max_prefill_tokens)


@no_cycle_collection()  # one pass of the cyclic garbage collector after all the schedules, not one after each
def plan_requests(model_path: str, n_gpus: int, gpu: str, label: str, requests: list[SimRequest],
                  calibration_dirs: list[Path] | None = None, decode_points: list[tuple[int, int]] | None = None,
                  objective: str = "latency", what_if: WhatIf = NO_WHAT_IF, names: Sequence[str] = (),
                  slo: tuple[float, float] | None = None, more_slos: Sequence[tuple[float, float]] = (),
                  keep_schedule: bool = False, server: ServerFlags = DEFAULTS,
                  on_prefill: Callable[[str, list[tuple[int, int]], float], None] | None = None) -> dict:
    """`plan` of an explicit request list (`label` names it in the result; `objective` as `rank`; `what_if`, `names`,
    `slo` and `server` as `plan`'s). `more_slos`: other (TTFT ms, TPOT ms) objectives, each counted on the same simulated
    requests (`PlanRow.goodput_by_slo`; one simulation for them all, `bench.goodput`). `keep_schedule`: each
    predicted row keeps every request's simulated times (`PlanRow.schedule`; `bench.validate --per-request`).
    `on_prefill(name, parts, ms)`: called for every simulated prefill forward, `parts` its (new tokens, tokens already
    in the KV) per request, under the name of the configuration simulated (one of configurations that step alike and
    share a schedule; `bench.cadence`).

    Raises:
        PlanError: as `plan`, but for the spec.
    """
    if objective == "goodput" and slo is None:
        raise PlanError("ranking by goodput needs the SLOs (TTFT ms, TPOT ms)")
    for objectives in ([slo] if slo is not None else []) + list(more_slos):
        if not (objectives[0] > 0 and objectives[1] > 0):
            raise PlanError(f"SLOs of TTFT {objectives[0]:g} ms and TPOT {objectives[1]:g} ms: both must be above 0")
    from sgl_sidp.bench.metrics import SLO
    hf = read_hf_config(model_path)
    if hf is None:
        raise PlanError(f"--model-path {model_path}: no config.json there")
    if gpu not in GPUS:
        raise PlanError(f"--gpu {gpu}: known kinds are {', '.join(GPUS)}")
    shapes, elt = ModelShapes.of(hf), dtype_bytes(hf)
    configs = configurations(shapes, n_gpus)
    if not configs:
        raise PlanError(f"{model_path} does not shard over {n_gpus} GPUs in any configuration")
    try:
        ic = Interconnect.load(GPUS[gpu]["name"])
        for n in sorted({c.gpus for c in configs if c.gpus > 1}):
            ic.time_us("all_reduce", n, 1)
    except InterconnectError as e:
        raise PlanError(str(e)) from None
    kind = GPUS[gpu]
    whole = shard_signature(hf, shard_of(shapes, 1, 1, 1))  # the model's TP1 signature: its shards' model part
    overhead, overhead_source = request_overhead_ms(kind["name"], calibration_dirs, model=whole)
    host_ms = host_time_alone_ms(kind["name"], calibration_dirs)
    stream = (what_if.stream_tokens_per_s if what_if.stream_tokens_per_s is not None else
              stream_tokens_per_s(kind["name"], calibration_dirs, model=whole,
                                  mean_index=output_mean_index(r.output_len for r in requests)))
    context = (sum(r.input_len + r.output_len / 2 for r in requests) / len(requests)) if requests else 1024
    planned = {c.base_name for c in configs}  # what the model runs on these GPUs (a named one outside: not predicted)
    configs += [configuration_named(v) for c in list(configs) for v in c.kind.variants(c, context)]
    known = {c.name for c in configs}
    for name in names:  # asked for by name (compare's configurations, the launcher's verdict)
        if name not in known:
            try:
                c = configuration_named(name)
            except ValueError as e:
                raise PlanError(str(e)) from None
            if c.gpus != n_gpus:
                raise PlanError(f"configuration {name} runs on {c.gpus} GPUs, not {n_gpus}")
            configs.append(c)
            known.add(name)
    rows, simulated = [], {}  # simulated: schedules by what determines them (below)
    private = PrivateBlocks(requests)  # each request's blocks that the simulation need not look up, by DP replicas
    for c in configs:
        server_tp = c.server_tp  # SGLang's --tp-size of one replica
        free = free_before_load_bytes(gpu, server_tp)
        frac = server.mem_fraction_static or default_mem_fraction_static(
            kind["mib"], server_tp, chunked_prefill=server.chunked_prefill_size,
            decode_graph_max_bs=server.decode_graph_size(decode_graph_default(c, kind["mib"])),
            decode_graphs=server.decode_graphs,
            prefill_graph_buckets=0 if shapes.mla or not server.prefill_graphs else None, mla=shapes.mla,
            dp_attention_dp=c.kind.dp_attention_dp(c))
        row = {"name": c.name, "technique": c.technique, "variant": c.variant, "dp": c.dp, "tp": c.tp, "sp": c.sp,
               "mem_fraction_static": frac}  # the `PlanRow`'s fields so far
        unmodeled = [o for o in c.options if option(o)[0] not in c.kind.modeled_options]
        skip = (f"not a configuration of this model on {n_gpus} GPUs" if c.base_name not in planned
                else f"the planner does not model option {unmodeled[0]!r} of {c.technique}" if unmodeled
                else c.kind.known_failure(c, hf))
        if skip:
            rows.append(PlanRow(**row, weights_gb_per_gpu=0.0, kv_tokens_total=0, not_predicted=skip))
            continue
        model, found, missing, calibratable = step_model(c, hf, gpu, ic, context, host_ms, calibration_dirs, what_if,
                                                         server)
        if found:
            row["calibrations"] = found
        memory = c.kind.memory(c, model, shapes, free, frac, elt)  # what the technique's decisions fix (ZeroDP's set)
        memory["chunk"] = replica_limits(c, 0, server).chunked_prefill  # Shift's exchange buffer holds a chunk's QKV
        weights = c.weight_bytes_per_gpu(shapes, elt, **memory)
        kv = c.kv_tokens(shapes, free, frac, elt, **memory)
        row.update({"weights_gb_per_gpu": round(max(weights.values()) / 1e9, 2), "kv_tokens_total": kv["total"]})
        if missing:
            row["not_predicted"] = f"no calibration of the shard {' or '.join(missing)} on {kind['name']}" + (
                f": run python -m sgl_sidp.plan calibrate --model-path {model_path} --gpus {n_gpus}" if calibratable else "")
            rows.append(PlanRow(**row))
            continue
        if min(v for k, v in kv.items() if k != "total") <= 0:
            row["not_predicted"] = "the weights leave no KV cache"
            rows.append(PlanRow(**row))
            continue
        row["decisions"] = model.decisions()
        row["graphs_past_calibration"] = model.graphs_past_calibration()
        row["decode_step_ms"] = {str(ctx): {str(b): round(model.decode_ms(b, ctx), 3) for b in DECODE_BATCHES}
                                 for ctx in DECODE_CONTEXTS}
        row["prefill_ms"] = {str(t): round(model.prefill_ms([(t, 0)]), 2) for t in PREFILL_TOKENS}
        if decode_points:
            row["decode_at"] = [model.decode_ms(b, ctx) for b, ctx in decode_points]
        # a configuration whose replicas step as another's, with the same KV, has its schedule: simulated once; the
        # technique's decisions are part of that (a `_thN` or `_bthN` named sets them apart from the planner's own)
        lockstep = c.kind.lockstep(c)
        twin = (c.technique, c.dp, c.tp, c.sp, model.steps_variant(), repr(sorted(row["decisions"].items())),
                lockstep, tuple(sorted(kv.items())))
        if twin not in simulated:
            def fresh_replicas(log_tokens: bool = False) -> list[ReplicaSim]:
                return [ReplicaSim(replica_limits(c, r.kv_tokens, server), observed(r.times, c.name, on_prefill),
                                   log_tokens=log_tokens)
                        for r in model.replicas(kv)]

            replicas = fresh_replicas(bool(stream))
            route = route_of(c)  # private blocks assume round robin: none precomputed for another routing
            reqs = [SimRequest(r.arrival_s, r.input_len, r.output_len, r.hash_ids,
                               private_blocks=k if route is None else 0)
                    for r, k in zip(requests, private(len(replicas)))]
            simulate(reqs, replicas, route, lockstep=lockstep)
            in_phase = None
            if lockstep and objective == "throughput" and any(r.arrival_s == BURST_REST_S for r in requests):
                at_once = [SimRequest(0.0, r.input_len, r.output_len, r.hash_ids) for r in requests]
                in_phase = summarize(simulate(at_once, fresh_replicas(), route, lockstep=True))["total_tok_s"]
            if stream:  # the replicas' tokens reach the clients through one tokenizer manager
                deliver(reqs, [rep.tokens_log for rep in replicas], stream)
            simulated[twin] = summarize(reqs) | ({"in_phase_tok_s": in_phase} if in_phase else {})
            if slo is not None:  # the TTFT objective less the request overhead every TTFT gets below
                simulated[twin].update(goodput(reqs, SLO(ttft_ms=slo[0] - overhead, tpot_ms=slo[1])))
            if keep_schedule:
                simulated[twin]["schedule"] = tuple((r.first_token_s, r.finish_s) for r in reqs)
                if not lockstep:
                    simulated[twin]["busy_s"] = [rep.busy_s() for rep in replicas]
            if more_slos:
                simulated[twin]["goodput_by_slo"] = {
                    slo_key(t, p): goodput(reqs, SLO(ttft_ms=t - overhead, tpot_ms=p))["request_goodput"]
                    for t, p in more_slos}
        summary = dict(simulated[twin])
        for k in ("ttft_ms_p50", "ttft_ms_p99", "e2e_ms_p50", "e2e_ms_p99"):
            if k in summary:
                summary[k] += overhead
        row.update({k: round(v, 2) if isinstance(v, float) else v for k, v in summary.items()})
        rows.append(PlanRow(**row))
    vanilla = [r for r in rows if technique_named(r.technique).vanilla and r.predicted]
    best_vanilla = max(vanilla, key=lambda r: r.total_tok_s, default=None)
    if best_vanilla:
        best_tok_s = best_vanilla.total_tok_s
        rows = [dataclasses.replace(r, ratio_to_best_vanilla=round(r.total_tok_s / best_tok_s, 3)) if r.predicted else r
                for r in rows]
        best_vanilla = next(r for r in rows if r.name == best_vanilla.name)
    ranked = rank(rows, objective)
    if not ranked:
        first = next((r.not_predicted for r in rows if r.not_predicted is not None), "")
        raise PlanError(f"nothing to predict from: {first or 'no configuration is modelled'}")
    ranked, yielded = prefer_vanilla(ranked, objective)
    win = ranked[0]
    runner_up = next((r for r in ranked[1:]), None)
    if yielded is not None:  # the winner is vanilla SGLang without the highest prediction: the reason says why
        # (it is the best vanilla configuration, so no ratio to that follows below)
        if objective == "goodput":
            what, got = (f"goodput ({win.request_goodput:.3g} req/s under TTFT {slo[0]:g} ms and TPOT {slo[1]:g} ms)",
                         (yielded.request_goodput or 0.0) / win.request_goodput)
        else:
            what, got = f"throughput ({win.total_tok_s:,.0f} tokens/s)", yielded.total_tok_s / win.total_tok_s
        reason = (f"{win.name}: the highest predicted {what} of vanilla SGLang on {label}; {yielded.name} is predicted "
                  f"{got:.2f}x it, under the {NEAR_TIE:.0%} a technique must gain to be started (the planner's error)")
    elif objective == "throughput":
        # the first configuration predicted to run differently (ZeroDP offloading nothing runs as DP)
        other = next((r for r in ranked[1:] if r.total_tok_s != win.total_tok_s), None)
        reason = (f"{win.name}: the highest predicted throughput on {label} ({win.total_tok_s:,.0f} tokens/s"
                  + (f", {win.total_tok_s / runner_up.total_tok_s:.2f}x the next, {runner_up.name}"
                     if runner_up else "") + ")"
                  + (f"; a near tie, within the planner's error: {other.name} may serve it as well or better"
                     if other and win.total_tok_s < (1 + NEAR_TIE) * other.total_tok_s else "")
                  + phase_note(win, [r for r in ranked[1:] if r.total_tok_s != win.total_tok_s]))
    elif objective == "goodput":
        reason = (f"{win.name}: the highest predicted goodput on {label} under TTFT {slo[0]:g} ms and TPOT "
                  f"{slo[1]:g} ms ({win.request_goodput:.3g} req/s"
                  + (f", against {runner_up.request_goodput:.3g} for the next, {runner_up.name}" if runner_up else "")
                  + ")")
    else:
        reason = (f"{win.name}: the lowest predicted median E2E latency on {label} ({win.e2e_ms_p50:,.1f} ms"
                  + (f", against {runner_up.e2e_ms_p50:,.1f} ms for the next, {runner_up.name}" if runner_up else "")
                  + f") among the configurations within {KEEPS_UP:.0%} of the best throughput")
    if objective == "goodput":
        best_vanilla = next((r for r in ranked if technique_named(r.technique).vanilla), None)
        if best_vanilla and win is not best_vanilla and best_vanilla.request_goodput:
            reason += (f"; {win.request_goodput / best_vanilla.request_goodput:.2f}x the goodput of the best vanilla "
                       f"configuration, {best_vanilla.name}")
    elif best_vanilla and win is not best_vanilla:
        reason += f"; {win.ratio_to_best_vanilla:.2f}x the throughput of the best vanilla configuration, {best_vanilla.name}"
    beyond = extrapolation(n_gpus)
    return {"predicted": True, "model": model_path, "gpus": n_gpus, "gpu": kind["name"],
            **({"extrapolation": beyond} if beyond else {}), "workload": label,
            "winner": win.name, "reason": reason, "objective": objective,
            "launch": ["python", "-m", "sgl_sidp.launch_server", "--model-path", model_path, *launch_flags(win)],
            "configurations": rows, "server_flags": server.describe(),
            "memory_source": f"free memory before load: {kind['source']}, less a TP group's reserve "
                             "(plan.steps.GROUP_RESERVE_GIB); mem_fraction_static: "
                             + ("--mem-fraction-static" if server.mem_fraction_static else "SGLang's default"),
            "request_overhead_ms": round(overhead, 2), "request_overhead_source": overhead_source,
            "stream_tokens_per_s": stream}


def decode_graph_default(c, gpu_mib: float) -> int:
    """The largest decode batch configuration `c`'s server captures in a graph where the user sets none: SGLang's for
    a GPU of `gpu_mib` MiB at its TP size, as the technique's feature may raise it (`Technique.decode_graph_max_bs`)."""
    return c.kind.decode_graph_max_bs(c, default_decode_graph_max_bs(gpu_mib, c.server_tp))


def step_model(c, hf: dict, gpu: str, ic: Interconnect, context: float, host_ms: float | None,
               calibration_dirs: list[Path] | None = None, what_if: WhatIf = NO_WHAT_IF, server: ServerFlags = DEFAULTS
               ) -> tuple[StepModel | None, dict[str, str], list[str], bool]:
    """The step model of configuration `c` of the model whose config.json is `hf` on GPU kind `gpu` (a `GPUS` key):
    its shards' calibrations (`find_calibration`) as `ShardClock`s, `ic` its interconnect, `context` (tokens) the
    workload's mean context, `host_ms` the host time a forward alone takes (`host_time_alone_ms`), its largest decode
    graph `server`'s where given (`ServerFlags.decode_graph_limit`), else SGLang's default.

    Returns (model, or None where a shard has no calibration; the calibration file of each role found; each missing
    shard's signature with how to calibrate it or why it cannot be; whether `plan calibrate` can time the missing)."""
    kind, shapes, elt = GPUS[gpu], ModelShapes.of(hf), dtype_bytes(hf)
    clocks, found, missing, calibratable = {}, {}, [], False
    for role, shard in shard_roles(c, shapes).items():
        sig = shard_signature(hf, shard)
        hit = find_calibration(sig, kind["name"], calibration_dirs)
        if hit is None:
            why = unservable(hf, shard)
            calibratable |= why is None
            missing.append(f"'{sig}' ({why})" if why else
                           f"'{sig}' (--json-model-override-args '{json.dumps(shard.override_args(shapes))}')")
            continue
        clocks[role] = ShardClock(hit[0].pipelined(host_ms), shapes.kv_bytes_per_token(shard_attn_tp(c, role), elt),
                                  what_if, c.kind.served_prefill_factor(c, role, gpu))
        found[role] = str(hit[1])
    decide = host_ms if host_ms is not None else DEFAULT_DECIDE_MS
    graphs = server.decode_graph_limit(decode_graph_default(c, kind["mib"]))
    model = StepModel(c, shapes, clocks, ic, elt, int(context), graphs, decide) if not missing else None
    return model, found, missing, calibratable


def route_of(c) -> Callable | None:
    """How the DP controller of configuration `c` sends each request to a replica, for `sim.simulate` (its technique's
    `Technique.route`): None for SGLang's default round robin; ZeroDP's its router's rule (`zerodp.router.pick_rank`,
    on each simulated replica's load and decode step line: `ZeroDPTechnique.route`)."""
    return c.kind.route(c)


def shard_attn_tp(c, role: str) -> int:
    """The attention TP of the GPU that runs `role` of configuration `c` (its KV heads per token): the
    configuration's KV layout (`Configuration.attn_tp`) unless its technique times a shard with other heads
    (`Technique.shard_attn_tp`: TP_b for Shift's base shard)."""
    return c.kind.shard_attn_tp(c, role)


def table(result: dict) -> str:
    """`plan`'s result as a markdown table (one row per `PlanRow`), every number labelled predicted, and under the
    title the line saying that it is an extrapolation where it is (`extrapolation`)."""
    flags = f", SGLang flags {result['server_flags']}" if result.get("server_flags") else ""
    lines = [f"Predicted for {result['model']} on {result['gpus']} x {result['gpu']}, workload {result['workload']}"
             f"{flags} (every number below is a prediction):", ""]
    if result.get("extrapolation"):
        lines += [result["extrapolation"] + ".", ""]
    good = result.get("objective") == "goodput"
    lines += ["| configuration | weights GB/GPU | KV tokens (all GPUs) | total tok/s | TTFT p50 ms | TPOT p50 ms | "
              "TTFT p99 ms | TPOT p99 ms | vs best vanilla |" + (" goodput req/s |" if good else ""),
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if good else "")]
    for r in result["configurations"]:
        if r.predicted:
            cells = [f"{r.total_tok_s:.0f}", f"{r.ttft_ms_p50:.1f}", f"{r.tpot_ms_p50:.2f}",
                     f"{r.ttft_ms_p99:.1f}", f"{r.tpot_ms_p99:.2f}", f"{r.ratio_to_best_vanilla or 0:.2f}x"]
            cells += [f"{r.request_goodput or 0:.3g}"] if good else []
        else:
            cells = ["not predicted"] + [""] * (6 if good else 5)
        lines.append(f"| {r.name} | {r.weights_gb_per_gpu:.1f} | {r.kv_tokens_total:,} | " + " | ".join(cells) + " |")
    lines += ["", f"Winner (predicted): {result['reason']}.",
              "Launch: " + " ".join(result["launch"]) + (f" {result['server_flags']}" if flags else "")]
    missing = [f"- {r.name}: {r.not_predicted}" for r in result["configurations"] if r.not_predicted is not None]
    sloped = [f"- {r.name}: {r.graphs_past_calibration}" for r in result["configurations"]
              if r.graphs_past_calibration is not None]
    return "\n".join(lines + (["", "Not predicted:"] + missing if missing else [])
                     + (["", f"Past the calibrations (python -m sgl_sidp.plan calibrate --model-path {result['model']} "
                             f"--gpus {result['gpus']} times them):"] + sloped if sloped else [])) + "\n"


def write_png(result: dict, path: Path) -> None:
    """Predicted throughput of every predicted configuration of `plan`'s result, and its decode step against the
    batch (2,048-token context), as a PNG at `path`, titled as a prediction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["configurations"] if r.predicted]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.barh([r.name for r in rows], [r.total_tok_s for r in rows], color="tab:blue")
    left.set_xlabel("total tokens/s (predicted)")
    left.set_title(f"{result['workload']}")
    for r in rows:
        steps = r.decode_step_ms["2048"]
        right.plot([int(b) for b in steps], list(steps.values()), marker="o", label=r.name)
    right.set_xlabel("decode batch (sequences of 2,048 tokens)")
    right.set_ylabel("decode step ms (predicted)")
    right.legend(fontsize=8)
    fig.suptitle(f"PREDICTED: {Path(result['model']).name} on {result['gpus']} x {result['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
