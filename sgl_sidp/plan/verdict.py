"""The launcher's one line for an explicit `--overlay-mode`: the planner's predicted ratio of the configuration the
server runs to the best vanilla configuration of the same GPUs, on `--overlay-plan-workload`, so that a mode predicted
to lose says so at start-up instead of losing silently (it still starts: the user asked for it).

Every number in the line is a prediction (`sgl_sidp.plan.planner.plan`, from the bundled or cached one-GPU
calibrations of this GPU kind) and is labelled so; where the planner cannot predict (another GPU kind, a shard
without calibration), the line says why and names no number.
"""

from __future__ import annotations

#: below this ratio to the best vanilla configuration the mode is predicted to lose (the planner's error on the
#: measured multi-GPU runs is larger than this, so a ratio just under 1 is a tie, not a loss)
LOSES_BELOW = 0.98


def planned(model_path: str, dp: int, tp_size: int, gpu_name: str | None, mode: str, settings,
            workload: str, slo: tuple[float, float] | None = None, sglang_args=None
            ) -> tuple[dict | None, str | None, str]:
    """The planner's result on the server's GPUs with the configuration the server runs among its rows: (`plan`'s
    result or None, the configuration's name or None, why there is no result: "" when there is one).

    Args:
        model_path: the model folder (its config.json).
        dp, tp_size: SGLang's resolved `--dp-size` and `--tp-size`.
        gpu_name: NVML's name of the server's first GPU (None when unknown).
        mode: the technique ("zerodp", "sidp", "shift").
        settings: the technique's resolved settings (`SidpConfig.<mode>`), which name its configuration
            (`Technique.launched_name`).
        workload: the planner's workload spec (`--overlay-plan-workload`).
        slo: (TTFT ms, TPOT ms) to rank by goodput (`--overlay-plan-slo-ttft-ms`, `--overlay-plan-slo-tpot-ms`).
        sglang_args: SGLang's parsed flags, whose chunk, memory fraction and decode graphs every planned
            configuration runs with (`ServerFlags.from_namespace`): the user's, unresolved, to compare configurations
            (the launcher's verdict, ZeroDP's decline); a resolved `ServerArgs` plans every configuration with this
            server's own values, right for this server's row alone (SiDP's launch-time B_th); None: SGLang's
            defaults.

    Never raises: what the planner cannot predict is the reason.
    """
    from sgl_sidp.plan.planner import PlanError, plan
    from sgl_sidp.plan.server_flags import DEFAULTS, ServerFlags, ServerFlagsError
    from sgl_sidp.plan.steps import GPUS, gpu_key
    from sgl_sidp.plan.technique import technique_named

    name = technique_named(mode).launched_name(dp, tp_size, settings)
    kind = gpu_key(gpu_name)
    if name is None:
        return None, None, "the planner has no configuration of this layout"
    if kind is None:
        return None, name, f"the planner knows GPU kinds {', '.join(GPUS)}, not {gpu_name or 'this one'}"
    try:
        server = DEFAULTS if sglang_args is None else ServerFlags.from_namespace(sglang_args)
        return plan(model_path, dp * tp_size, kind, workload, names=[name], slo=slo, server=server), name, ""
    except (PlanError, ServerFlagsError) as e:
        return None, name, str(e)


def planned_row(model_path: str, dp: int, tp_size: int, gpu_name: str | None, mode: str, settings,
                workload: str, sglang_args=None):
    """(the `PlanRow` of the configuration the server runs, predicted, or None; why not: "" when predicted), as
    `planned`'s arguments (e.g. SiDP's B_th at launch, `sidp.feature.resolve`). Never raises."""
    result, name, why = planned(model_path, dp, tp_size, gpu_name, mode, settings, workload, sglang_args=sglang_args)
    if result is None:
        return None, why
    row, why = _predicted_row(result, name)
    return row, why or ("" if row else f"{name} is not among its configurations")


def _predicted_row(result: dict, name: str):
    """(the row of `name` in `plan`'s result where it is predicted, else None; the planner's reason it is not: "" when
    it gave none)."""
    row = next((r for r in result["configurations"] if r.name == name), None)
    if row is None or not row.predicted:
        return None, (row.not_predicted or "") if row is not None else ""
    return row, ""


#: what `objective_ratio` compares, per objective of `planner.rank`
OBJECTIVE_WORDS = {"throughput": "the throughput", "goodput": "the goodput", "latency": "the median E2E speed"}


def objective_ratio(objective: str, ours, other) -> float:
    """`ours` against `other` (two predicted `PlanRow`s of one plan) on the plan's `objective`, > 1 where `ours` is
    predicted better: the ratio of total tokens/s ("throughput"), of requests/s within the SLOs ("goodput"; inf
    where only `ours` has any), or the inverse ratio of median E2E latency ("latency")."""
    if objective == "throughput":
        return ours.total_tok_s / other.total_tok_s
    if objective == "goodput":
        return (ours.request_goodput or 0.0) / other.request_goodput if other.request_goodput else float("inf")
    return other.e2e_ms_p50 / ours.e2e_ms_p50


def verdict(model_path: str, dp: int, tp_size: int, gpu_name: str | None, mode: str, settings,
            workload: str, slo: tuple[float, float] | None = None, sglang_args=None) -> tuple[str, bool]:
    """(the line, whether the mode is predicted to lose) for a server of `mode` on `dp` x `tp_size` GPUs, as
    `planned`'s arguments; with `slo` every workload is ranked by goodput, else offline work by throughput and the
    rest by median E2E latency among the configurations that keep up (`planner.rank`).

    Never raises: what the planner cannot predict gives a line that says why, and False.
    """
    from sgl_sidp.plan.configs import configuration_named
    from sgl_sidp.plan.planner import rank
    from sgl_sidp.plan.steps import gpu_key
    from sgl_sidp.plan.technique import technique_named

    n = dp * tp_size
    result, name, why = planned(model_path, dp, tp_size, gpu_name, mode, settings, workload, slo, sglang_args)
    head = f"sgl-sidp: --overlay-mode {mode}" + (f" ({name})" if name else "")
    no = f"{head}: no prediction against vanilla SGLang on {n} GPU{'s' if n > 1 else ''}: "
    if result is None:
        return no + why, False
    kind = gpu_key(result["gpu"]) or result["gpu"]
    ours, why = _predicted_row(result, name)
    ranked = rank(result["configurations"], result["objective"])
    best = next((r for r in ranked if technique_named(r.technique).vanilla), None)
    if ours is None or best is None:
        return no + (why or ("no vanilla configuration predicted" if best is None else
                             f"{name} is not among its configurations")), False
    where = f"on {result['workload']} ({n} x {kind}"
    where += f"; {result['extrapolation']}" if result.get("extrapolation") else ""
    where += "; predicted by the planner from one-GPU calibrations, not measured)"
    ratio = objective_ratio(result["objective"], ours, best)
    if result["objective"] == "throughput":
        what = (f"{ratio:.2f}x the throughput of the best vanilla configuration, {best.name} "
                f"({ours.total_tok_s:,.0f} against {best.total_tok_s:,.0f} tokens/s)")
        loses = ratio < LOSES_BELOW
    elif result["objective"] == "goodput":
        what = (f"{ratio:.2f}x the goodput of the best vanilla configuration, {best.name} "
                f"({ours.request_goodput or 0:.3g} against {best.request_goodput or 0:.3g} req/s under TTFT "
                f"{slo[0]:g} ms and TPOT {slo[1]:g} ms)")
        loses = ratio < LOSES_BELOW
    else:
        what = (f"a median E2E latency of {ours.e2e_ms_p50:,.1f} ms against {best.e2e_ms_p50:,.1f} ms for the best "
                f"vanilla configuration, {best.name} ({ratio:.2f}x as fast)")
        loses = ranked.index(ours) > ranked.index(best)
    line = f"{head} is predicted at {what} {where}"
    if loses:
        flags = " ".join(configuration_named(best.name).launch_flags()) or "(one GPU)"
        line = (f"{head}: warning: predicted to lose: {what} {where}; vanilla `python -m sglang.launch_server "
                f"{flags}` is predicted to serve this workload better")
    return line, loses
