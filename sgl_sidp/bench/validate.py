"""The planner's predictions for N GPUs next to a multi-GPU measurement of vanilla SGLang and the overlay, side by side.

    python -m sgl_sidp.bench.validate DIR --model-path ../shared/models/Qwen3-8B [--gpu H200] [--trace-dir DIR]
    python -m sgl_sidp.bench.validate --forwards TP2.json [TP2.json ...] --gpus 2 --model-path MODEL

(`python scripts/plan_validate_multi_gpu.py` runs the same.)

DIR holds one model's results of `python -m sgl_sidp.bench.compare` (its `OUT/<model>/`: `<configuration>.json`
with `kv_tokens` per DP rank and a `burst`), or the retired `scripts/shift_compare.py`'s results (`tp.json`,
`dp.json`, `dp_attn.json`, `shift.json`, each run on the same N GPUs; also their TTFT of single prompts). For each
configuration measured, the planner predicts the same numbers from the model's config.json and the calibrations of its
shards (one GPU each, never this measurement): KV tokens, the TTFT of single prompts, the burst's throughput, TTFT
and TPOT, and each trace replay's goodput, TTFT and TPOT p50 (the same requests, window and objectives as compare's
replay, read from OUT/commands.txt; `--trace-dir` where the trace files are now). Prints a markdown table with every
error (predicted / measured - 1), then the measured and predicted ranking of the configurations on the burst and on
each replay's goodput (one table per GPU count measured). Where compare profiled the configurations
(`--profile`), their prefill forwards and decode steps stand beside the planner's steps (`profile_rows`).

With `--per-request [N]`: each replay request by request instead of the table, measured (`requests.jsonl` in
OUT/<model>/traces/) against the planner's simulation of the same requests (`schedule_lines`): when the last prompt's
prefill and the last request end, the first request's TTFT, the TTFT and decode-window medians, the same by 10-s
arrival window (`window_lines`: where in the replay a miss sits), the prompt tokens prefilled by 5-s window of their
first tokens (`prefill_rate_lines`: when the backlog drains), then the first N requests' first and last tokens. A
miss in the medians whose totals agree is then seen to come from where in the schedule
(`benchmarks/results/plan_multi_gpu/h200/validate.md`: the first prefill after the replay's cache flush).
Bursts whose requests compare kept (`OUT/<model>/bursts/`) follow, as quantiles of their first and last tokens.

With `--forwards`: the forwards of TP-N servers (`--overlay-calibrate` cache entries of the whole model served at
`--tp N` on N GPUs, `scripts/gpu_calibrate_model.sh OUT MODEL --tp N`) next to the planner's `tpN` decode steps and
prefills (its TP-N shard's calibration on one GPU plus the modelled all-reduces).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from pathlib import Path

from sgl_sidp.bench.compare_report import (compare_results, predicted_by_flags, server_flags_of, unmodelled,
                                           unmodelled_config_args)
from sgl_sidp.plan.server_flags import DEFAULTS, ServerFlagsError
from sgl_sidp.plan.planner import plan
from sgl_sidp.plan.what_if import NO_WHAT_IF, WhatIf, add_what_if_args, what_if_from_args

#: shift_compare.py configuration -> the planner's configuration name, by GPU count
NAMES = {"tp": "tp{n}", "dp": "dp{n}", "dp_attn": "dp{n}_attn", "shift": "shift_sp{n}_tp1"}


def burst_shape(run: dict) -> tuple[int, int, int]:
    """(requests, prompt tokens, output tokens) of a shift_compare.py burst, from its counts."""
    n, secs = run["requests"], run["seconds"]
    out = round(run["output_tok_s"] * secs / n)
    return n, round((run["total_tok_s"] - run["output_tok_s"]) * secs / n), out


def old_measured(files: list[Path]) -> dict[int, dict[str, dict]]:
    """`measured` of shift_compare.py's `<config>.json` files (N: the most KV pools one of them logged)."""
    res = {p.stem: json.loads(p.read_text()) for p in files}
    n = max(len(m["kv_tokens"]) for m in res.values())  # DP runs log one pool per GPU
    out = {}
    for cfg, m in res.items():
        b = m.get("burst")
        out[NAMES[cfg].format(n=n)] = {
            # SGLang logs one max_total_num_tokens per DP rank (DP attention: one for all)
            "kv": m["kv_tokens"] and ("KV tokens of one rank's pool", n if cfg in ("dp", "dp_attn") else 1,
                                      m["kv_tokens"][0]),
            "ttft_ms": m.get("ttft_ms", {}),
            "burst": b and {"shape": burst_shape(b), "total_tok_s": b["total_tok_s"],
                            "ttft_ms_p50": b["median_ttft_ms"],
                            "tpot_ms_p50": b["median_tpot_ms"]}}
    return {n: out}


def started_as(r: dict) -> dict | None:
    """An `--overlay-mode auto` server's result as a result of the configuration it started ("auto_choice", its
    planner's winner: `summary.auto_started`), its own "config" ("auto") kept under "ran"; None for another result
    or an auto server that does not say what it started."""
    choice = r.get("auto_choice") if r.get("config") == "auto" else None
    if not choice:
        return None
    return {**r, "config": choice, "ran": "auto", "technique": "shift" if choice.startswith("shift") else "auto"}


def compare_measured(results: list[dict], folder: Path | None = None) -> dict[int, dict[str, dict]]:
    """`measured` of bench.compare's results (those that did not start left out; an `auto` server as the
    configuration it started, `started_as`, unless the run also ran that configuration alone; configurations with
    options are predicted by name, where the planner models the option; a Shift server as it ran,
    `compare_report.ran_as`), each with its "config" as run (its folders' name) and "predict_as", the planner's name
    to predict it with (`compare_report.predicted_as`: a mode that declined as what it started), beside."""
    from sgl_sidp.bench.compare_report import predicted_as, ran_as

    # each result's name once: `ran_as` may read a Shift server's log
    named = [(r, None if r.get("config") == "auto" else ran_as(r, folder)) for r in results]
    alone = {name for _, name in named if name is not None}
    out: dict[int, dict[str, dict]] = {}
    for r, name in sorted(named, key=lambda rn: bool(rn[0].get("config_args"))):  # a configuration's own flags last
        if name is None:
            r = started_as(r)
            if r is None or (name := ran_as(r, folder)) in alone:
                continue
        if not r.get("kv_tokens"):
            continue
        b = r.get("burst")
        group = out.setdefault(int(r["gpu_count"]), {})
        if unmodelled_config_args(r) or (r.get("config_args") and name in group):
            # flags the planner does not model, or a second server of the same name: listed, not predicted
            group[f"{r['config']} ({r['config_args']})"] = {"unmodeled": True}
            continue
        group[name] = {"config": r.get("ran", r["config"]), "predict_as": predicted_as(r, ran=name),
            "kv": ("KV tokens, all ranks", 1, sum(r["kv_tokens"].values())), "ttft_ms": {},
            "burst": b and b.get("total_tok_s") and {
                "shape": tuple(int(x) for x in b["spec"].split("+")),
                **{k: b[k] for k in ("total_tok_s", "ttft_ms_p50", "tpot_ms_p50")}},
            "traces": {k: t for k, t in (r.get("traces") or {}).items() if t.get("median_ttft_ms") is not None},
            "server": server_flags_of(r, folder)}
    return out


def predicted_by_server(measured: dict[str, dict], names, predict) -> dict:
    """{name: the planner's `PlanRow`} of `names` of `measured`, one call of `predict(group, server)` per group of them
    whose servers started with the same SGLang flags (`compare_report.predicted_by_flags`), each predicted as its
    "predict_as" (a mode that declined: what it started)."""
    return predicted_by_flags(names, {name: measured[name].get("server") for name in names}, predict,
                              {name: measured[name].get("predict_as", name) for name in names})


def replay_settings(folder: Path) -> dict:
    """{trace key ("<stem>@<rate>x"): (the replay's arguments, (TTFT, TPOT) objectives in ms)} of the compare runs
    whose results are in `folder` (OUT/<model>), read from their `commands.txt` (OUT/commands.txt)."""
    return replay_settings_of(folder.parent / "commands.txt")


def replay_settings_of(commands: Path) -> dict:
    """`replay_settings` of the compare commands in the file `commands` (a run's commands.txt; {} where there is none)."""
    from sgl_sidp.bench.compare import parse_args, trace_key

    out = {}
    for line in commands.read_text().splitlines() if commands.is_file() else []:
        if "sgl_sidp.bench.compare" not in line:
            continue
        a = parse_args(shlex.split(line.split("sgl_sidp.bench.compare", 1)[1]))
        for trace in a.trace:
            for rate in a.rates:
                out[trace_key(trace, rate)] = (f"--trace={trace} --time-scale={1 / rate:g} {a.trace_args}",
                                               (a.slo_ttft_ms, a.slo_tpot_ms))
    return out


def missing_trace(folder: Path, trace_dir: Path | None = None) -> str | None:
    """One error line naming the first trace a replay of `folder` (OUT/<model>) sent that is not readable here (looked
    up in `trace_dir` where given, as `sim_requests` looks), or None when every one is: checked before a prediction,
    which would otherwise stop inside `load_trace` with a traceback."""
    from sgl_sidp.bench.traces import replay_trace_path

    for args, _ in replay_settings(folder).values():
        path = replay_trace_path(args, trace_dir)
        if not path.is_file():
            return f"{path}: the trace a replay here sent is not there; --trace-dir names the folder that holds it"
    return None


def load(folder: Path) -> dict[int, dict[str, dict]]:
    """{GPU count: {the planner's configuration name: measured}} of a results folder, either kind (module docstring).
    Measured: "kv" (label, DP ranks the prediction's total is split over, tokens), "ttft_ms" ({prompt tokens: ms}),
    "burst" ({"shape": (requests, prompt, output), "total_tok_s", "ttft_ms_p50", "tpot_ms_p50"} or None)."""
    old = [p for p in sorted(folder.glob("*.json")) if p.stem in NAMES]
    if old:
        return old_measured(old)
    return compare_measured([r for r in compare_results(folder) if not unmodelled(r)], folder)


def probed_stream_rate(folder: Path) -> float | None:
    """The median of the delivered rates (tokens/s) the servers of `folder` measured with `compare --stream-probe`
    (`calibrate.delivered_rate` after the warm-up), or None where none did: the run's host's stream, which varies
    1.5x between hosts (benchmarks/results/plan/validate_1gpu_h200_stream_probes_2026-11-29/)."""
    rates = [r["stream_probe"]["delivered_tokens_per_s"] for r in compare_results(folder)
             if (r.get("stream_probe") or {}).get("delivered_tokens_per_s")]
    return float(statistics.median(rates)) if rates else None


def unmodelled_results(folder: Path) -> list[str]:
    """"<configuration>: <why>" for each of `folder`'s results that `load` leaves out (`unmodelled`)."""
    return [f"{r['config']}: {why}" for r in compare_results(folder) if (why := unmodelled(r))]


def trace_rows(measured: dict[str, dict], replays: dict, model_path: str, gpu: str, n: int,
               trace_dir: Path | None = None, what_if: WhatIf = NO_WHAT_IF) -> list[tuple]:
    """(configuration, what, unit, predicted, measured) of every trace replay measured (`replay_settings` says how it
    was sent): goodput under its objectives (where it was sent with them), TTFT and TPOT p50, each configuration
    predicted on the same requests (under `what_if`'s hand-set numbers, if any)."""
    from sgl_sidp.bench.traces import sim_requests
    from sgl_sidp.plan.planner import plan_requests

    out = []
    keys = sorted({k for m in measured.values() for k in m.get("traces", {})})
    for key in keys:
        if key not in replays:
            continue
        args, slo = replays[key]
        slo = None if None in slo else slo  # a replay sent without objectives
        names = [k for k, m in measured.items() if key in m.get("traces", {})]
        pred = predicted_by_server(measured, names, lambda group, server: plan_requests(
            model_path, n, gpu, f"replay {args}", sim_requests(args, trace_dir), names=group, slo=slo,
            what_if=what_if, server=server)["configurations"])
        for name in names:
            t, p = measured[name]["traces"][key], pred.get(name)
            if p is None or not p.predicted:
                out.append((name, f"{key}: not predicted", "", None, None))
                continue
            if slo and t.get("request_goodput") is not None:
                out.append((name, f"{key}: goodput (TTFT {slo[0]:g} ms, TPOT {slo[1]:g} ms)", "req/s",
                            p.request_goodput, t["request_goodput"]))
            out += [(name, f"{key}: TTFT p50", "ms", p.ttft_ms_p50, t["median_ttft_ms"]),
                    (name, f"{key}: TPOT p50", "ms", p.tpot_ms_p50, t["median_tpot_ms"])]
    return out


def measured_requests(folder: Path, config: str, key: str) -> list[dict] | None:
    """The replay `key`'s requests as `bench.compare` kept them for `config` (OUT/<model>/traces/<config>/<key with _
    for @>/requests.jsonl, or .gz as committed), in the replay's order; None where there is no such file."""
    from sgl_sidp.bench.report import REQUESTS_JSONL, read_jsonl

    rows = read_jsonl(folder / "traces" / config / key.replace("@", "_") / REQUESTS_JSONL)
    return None if rows is None else sorted(rows, key=lambda r: r["id"])


def schedule_lines(measured: list[dict], schedule: tuple[tuple[float, float], ...], first: int = 12,
                   busy: tuple[dict[str, float], dict[str, float]] | None = None) -> list[str]:
    """Markdown: one replay of one configuration, measured against simulated.

    Args:
        measured: `measured_requests`' rows (`actual_send_s` s; `ttft_ms`, `e2e_ms` ms; `input_len` tokens).
        schedule: `PlanRow.schedule` of the same requests, same order ((first token, last token) s from the first
            arrival, no request overhead).
        first: how many requests to list one by one.
        busy: (measured, simulated) seconds of forwards by SGLang's category ("extend", "decode"), summed over the
            DP replicas, where the server ran SGLang's device timer; None: no such rows.

    Raises:
        ValueError: the two hold different numbers of requests.
    """
    if len(measured) != len(schedule):
        raise ValueError(f"{len(measured)} requests measured, {len(schedule)} simulated: not the same replay")
    first_tok = [r["actual_send_s"] + r["ttft_ms"] / 1e3 for r in measured]
    last_tok = [r["actual_send_s"] + r["e2e_ms"] / 1e3 for r in measured]
    arrivals = [r.get("target_send_s", r["actual_send_s"]) for r in measured]  # the simulation's arrivals

    def med(v):
        return statistics.median(v) * 1e3

    sim_ttft = [f - a for (f, _), a in zip(schedule, arrivals)]
    lines = [
        "| | measured | simulated |", "|---|---:|---:|",
        f"| last prompt's first token (s) | {max(first_tok):.2f} | {max(f for f, _ in schedule):.2f} |",
        f"| last token (s) | {max(last_tok):.2f} | {max(end for _, end in schedule):.2f} |",
        f"| first request's TTFT (ms) | {measured[0]['ttft_ms']:,.0f} | {sim_ttft[0] * 1e3:,.0f} |",
        f"| TTFT p50 (ms) | {med([r['ttft_ms'] / 1e3 for r in measured]):,.0f} | {med(sim_ttft):,.0f} |",
        f"| decode window p50, first to last token (ms) | {med([b - a for a, b in zip(first_tok, last_tok)]):,.0f} "
        f"| {med([end - start for start, end in schedule]):,.0f} |",
        *([f"| GPU time of the {what} forwards, all replicas (s) | {busy[0].get(cat, 0.0):.2f} | "
           f"{busy[1].get(cat, 0.0):.2f} |" for cat, what in (("extend", "prefill"), ("decode", "decode"))]
          if busy else []),
        "", *window_lines(arrivals, first_tok, last_tok, schedule),
        "", *prefill_rate_lines([r["input_len"] for r in measured], first_tok, [f for f, _ in schedule]),
    ]
    if first > 0:
        lines += ["", "| request | sent (s) | prompt tokens | first token, measured | simulated | last token, measured "
                  "| simulated |", "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['id']} | {r['actual_send_s']:.2f} | {r['input_len']:,} | {ft:.2f} | {start:.2f} | {lt:.2f} | {end:.2f} |"
              for r, ft, lt, (start, end) in list(zip(measured, first_tok, last_tok, schedule))[:first]]
    return lines


def window_lines(arrivals: list[float], first_tok: list[float], last_tok: list[float],
                 schedule: tuple[tuple[float, float], ...], width_s: float = 10.0) -> list[str]:
    """Markdown: the requests by arrival window of `width_s` seconds, where a replay's miss sits in time: per window,
    the requests, how late their first tokens come (measured - simulated, median, s) and their median decode window
    (first to last token) measured and simulated (s). All lists in the replay's order; times in s from its start. On
    `q8_shift_busy_2gpu_h100` Shift's median decode windows run 0.7 s and 2.1 s over the simulation's for the
    requests that arrive 20-30 and 30-40 s in, the window's densest, and within 0.1 s elsewhere (TP2's within 0.2 s
    everywhere)."""
    by: dict[int, list[int]] = {}
    for i, a in enumerate(arrivals):
        by.setdefault(int(a // width_s), []).append(i)
    lines = ["| arrived (s) | requests | first token, measured - simulated (s, p50) | decode window, measured (s, p50) "
             "| simulated |", "|---|---:|---:|---:|---:|"]
    for w, idx in sorted(by.items()):
        late = statistics.median(first_tok[i] - schedule[i][0] for i in idx)
        meas = statistics.median(last_tok[i] - first_tok[i] for i in idx)
        sim = statistics.median(schedule[i][1] - schedule[i][0] for i in idx)
        lines.append(f"| {w * width_s:g}-{(w + 1) * width_s:g} | {len(idx)} | {late:+.2f} | {meas:.2f} | {sim:.2f} |")
    return lines


def prefill_rate_lines(input_lens: list[int], first_tok: list[float], sim_first: list[float],
                       width_s: float = 5.0) -> list[str]:
    """Markdown: how fast the prompts were prefilled, measured against simulated: per window of `width_s` seconds
    (by when the first tokens came), the prompt tokens of the requests whose first token came in it, and their
    cumulative difference (simulated - measured: how far the simulation's prefills run ahead). A prompt counts whole
    when its last chunk ends, on both sides alike. All lists in the replay's order (tokens; s from its start).

    Why: on a saturated replay, how long the backlog of prompts takes to drain sets the decode windows (SGLang runs a
    waiting prefill before the running requests' decode steps). On `q8_shift_stats_2gpu_h200` Shift's server was at
    most 11K prompt tokens behind the simulation by 5-s window (23K by 1-s window, about 0.4 s of prefill), so its
    requests' 1.0 s later last tokens came mostly after the drain (their eager decode steps)."""
    by: dict[int, list[int]] = {}
    for tokens, measured, simulated in zip(input_lens, first_tok, sim_first):
        by.setdefault(int(measured // width_s), [0, 0])[0] += tokens
        by.setdefault(int(simulated // width_s), [0, 0])[1] += tokens
    lines = ["| first tokens in (s) | prompt tokens, measured | simulated | simulated ahead by (tokens, cumulative) |",
             "|---|---:|---:|---:|"]
    ahead = 0
    for w, (meas, sim) in sorted(by.items()):
        ahead += sim - meas
        lines.append(f"| {w * width_s:g}-{(w + 1) * width_s:g} | {meas:,} | {sim:,} | {ahead:+,} |")
    return lines


def per_request(folder: Path, measured: dict[str, dict], model_path: str, gpu: str, n: int,
                trace_dir: Path | None = None, first: int = 12, what_if: WhatIf = NO_WHAT_IF) -> list[str]:
    """`schedule_lines` of every replay measured in `folder` (OUT/<model>) on `n` GPUs (`measured`: `load`'s group of
    `n`), each configuration under a heading; times in seconds from the replay's start (measured: when each request
    was sent; simulated: its arrival, the replay's target send time), simulated under `what_if`'s numbers if any."""
    from sgl_sidp.bench.traces import sim_requests
    from sgl_sidp.plan.planner import plan_requests

    out = []
    for key, (args, _) in sorted(replay_settings(folder).items()):
        names = [k for k, m in measured.items() if key in m.get("traces", {})]
        if not names:
            continue
        rows = predicted_by_server(measured, names, lambda group, server: plan_requests(
            model_path, n, gpu, f"replay {args}", sim_requests(args, trace_dir), names=group, keep_schedule=True,
            what_if=what_if, server=server)["configurations"])
        for name in names:
            reqs, row = measured_requests(folder, measured[name].get("config", name), key), rows.get(name)
            out += ["", f"### {name}, {key}", ""]
            if reqs is None or row is None or row.schedule is None:
                out.append("not compared: " + ("no requests.jsonl kept" if reqs is None else "not predicted"))
                continue
            out += schedule_lines(reqs, row.schedule, first, busy_pair(measured[name]["traces"][key], row.busy_s))
    return out


#: the quantiles `burst_lines` sets side by side
BURST_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def burst_lines(measured: list[dict], schedule: tuple[tuple[float, float], ...]) -> list[str]:
    """Markdown: one burst of one configuration, measured against simulated: the quantiles of the requests' first
    and last tokens (s from the first request's send; the simulation's from its first arrival). Quantiles, not
    request by request: the server's router and the simulation's round robin give the requests their replicas in
    different orders.

    Args:
        measured: `compare.write_burst_requests`' rows (`send_ms`, `ttft_ms`, `e2e_ms` ms).
        schedule: `PlanRow.schedule` of the same burst.

    Raises:
        ValueError: the two hold different numbers of requests.
    """
    import numpy as np

    if len(measured) != len(schedule):
        raise ValueError(f"{len(measured)} requests measured, {len(schedule)} simulated: not the same burst")
    first = np.array([(r["send_ms"] + r["ttft_ms"]) / 1e3 for r in measured])
    last = np.array([(r["send_ms"] + r["e2e_ms"]) / 1e3 for r in measured])
    sim_first, sim_last = np.array([f for f, _ in schedule]), np.array([e for _, e in schedule])
    out = ["| quantile of the requests | first token, measured (s) | simulated | last token, measured (s) | simulated |",
           "|---:|---:|---:|---:|---:|"]
    for q in BURST_QUANTILES:
        out.append(f"| {q:.0%} | {np.quantile(first, q):.2f} | {np.quantile(sim_first, q):.2f} | "
                   f"{np.quantile(last, q):.2f} | {np.quantile(sim_last, q):.2f} |")
    out.append(f"\nThe client sent them within {max(r['send_ms'] for r in measured):.0f} ms (the simulation: at once, "
               "the first alone).")
    return out


def burst_requests(folder: Path, measured: dict[str, dict], model_path: str, gpu: str, n: int,
                   what_if: WhatIf = NO_WHAT_IF) -> list[str]:
    """`burst_lines` of every burst whose requests compare kept in `folder` (OUT/<model>/bursts/), each configuration
    under a heading, simulated under `what_if`'s numbers if any; [] where none was kept."""
    from sgl_sidp.bench.report import read_jsonl
    from sgl_sidp.plan.planner import plan_requests, workload

    out, by_spec = [], {}
    for name, m in measured.items():
        reqs = read_jsonl(folder / "bursts" / f"{m.get('config', name)}.jsonl") if m.get("burst") else None
        if reqs is not None:
            by_spec.setdefault("offline:%d:%d:%d" % m["burst"]["shape"], []).append((name, reqs))
    for spec, named in sorted(by_spec.items()):
        rows = predicted_by_server(measured, [k for k, _ in named], lambda group, server: plan_requests(
            model_path, n, gpu, spec, workload(spec), names=group, keep_schedule=True, what_if=what_if,
            server=server)["configurations"])
        for name, reqs in named:
            s_, in_, out_ = spec.split(":")[1:]
            out += ["", f"### {name}, burst {s_} x ({in_} in, {out_} out)", ""]
            row = rows.get(name)
            out += (burst_lines(reqs, row.schedule) if row is not None and row.schedule is not None
                    else ["not compared: not predicted"])
    return out


def busy_pair(trace: dict, simulated: list[dict[str, float]] | None) -> tuple[dict, dict] | None:
    """(measured, simulated) GPU seconds by forward category of one replay, each summed over the DP replicas: the
    measured from the replay's `per_rank` counters (`compare`, where the server ran SGLang's device timer), the
    simulated from `PlanRow.busy_s`; None where either is missing."""
    def summed(by_replica) -> dict[str, float]:
        out: dict[str, float] = {}
        for by in by_replica:
            for cat, sec in by.items():
                out[cat] = out.get(cat, 0.0) + sec
        return out

    measured = summed(rank.get("busy_s_by") or {} for rank in (trace.get("per_rank") or {}).values())
    if not measured or not simulated:
        return None
    return measured, summed(simulated)


def traced_span_ms(stage: dict, skip_first: bool = False) -> float:
    """A GPU's ms per traced forward of one stage (`profile` of `compare --profile`: first to last kernel). With
    `skip_first` (a burst traced from its start, `--profile-at-start`), the mean of its forwards after the first
    (`forwards`), which held the burst's first prompt alone (SGLang takes it in before the rest); the stage's mean
    where the trace does not give its forwards one by one."""
    forwards = stage.get("forwards") or []
    if skip_first and len(forwards) > 1:
        return sum(f["span_ms"] for f in forwards[1:]) / (len(forwards) - 1)
    return stage["span_ms"]


def profile_rows(folder: Path, model_path: str, gpu: str, what_if: WhatIf = NO_WHAT_IF) -> list[tuple]:
    """(configuration, what, unit, predicted, measured) of every forward `compare --profile S+IN+OUT` traced in
    `folder` (OUT/<model>): the planner's step (`planner.step_model`) next to the slowest of the DP replicas' first
    GPUs' profiled ms per forward (first to last kernel, `traced_span_ms`; a replica whose traced forwards held
    fewer prompts, as a first one alone, is faster). A prefill forward holds the prompts of IN tokens that
    SGLang's chunk takes at once from a replica's share of the S requests; prompts longer than the chunk are traced
    chunk by chunk, each after the prompt's earlier chunks in the KV, so the row is the mean of the traced forwards
    (`profile.steps` of them) in that order; a decode step, that share at IN tokens of
    context. Decode steps of replicas in lockstep are left out: a rank's profiled step includes its waits for the
    others (SiDP's CaS, DP attention), which the planner's step does not; so are those traced with the host
    (`compare --profile-host`): the tracer slows the host, and an eager step's kernels follow its launches."""
    import math

    from sgl_sidp.bench.compare_report import ran_as, replica_leaders
    from sgl_sidp.model_info import read_hf_config
    from sgl_sidp.plan.comm import Interconnect
    from sgl_sidp.plan.configs import configuration_named
    from sgl_sidp.plan.planner import step_model
    from sgl_sidp.plan.steps import GPUS, host_time_alone_ms

    hf, out = read_hf_config(model_path), []
    ic, host = Interconnect.load(GPUS[gpu]["name"]), host_time_alone_ms(GPUS[gpu]["name"])
    for r in compare_results(folder):
        prof = r.get("profile")
        if not prof or unmodelled_config_args(r) or r.get("config") == "auto":
            continue
        name = ran_as(r, folder)  # a Shift server as it ran (its threshold, its exchanges), as `load` names it
        c = configuration_named(name)
        s, inp, outp = (int(x) for x in prof["spec"].split("+"))
        try:  # a profile's spans are as measured whatever else the planner does not model
            server = server_flags_of(r, folder)
        except ServerFlagsError:
            server = DEFAULTS
        model = step_model(c, hf, gpu, ic, inp + outp / 2, host, what_if=what_if, server=server)[0]
        if model is None:
            continue
        share = math.ceil(s / max(1, int(r.get("dp") or 1)))  # requests a replica gets (round robin)
        chunk = int(prof.get("chunked_prefill_size") or inp)
        k = max(1, min(share, chunk // inp)) if inp <= chunk else 1
        leaders = replica_leaders(prof["ranks"])

        at_start = str(prof.get("at_start")).lower() == "true"
        prefill, decode = (max((traced_span_ms(prof["ranks"][g][stage], at_start and stage == "prefill")
                                for g in leaders if prof["ranks"][g].get(stage, {}).get("counted")), default=None)
                           for stage in ("prefill", "decode"))
        if prefill is not None:
            if inp <= chunk:
                what, ms = f"{k} x {inp:,} tokens", model.prefill_ms([(inp, 0)] * k)
            else:  # the traced forwards are the first prompt's chunks in order, then the next prompt's
                one = [(min(chunk, inp - p), p) for p in range(0, inp, chunk)]
                traced = (one * share)[:max(1, int(prof.get("steps") or 1))]
                what = (f"mean of {len(traced)}: chunks of {chunk:,} tokens after "
                        + ", ".join(f"{p:,}" for _, p in traced) + " in the KV")
                ms = sum(model.prefill_ms([part]) for part in traced) / len(traced)
            out.append((name, f"profiled prefill forward, {what}"
                        + (f" (the slowest of {len(leaders)} replicas)" if len(leaders) > 1 else ""), "ms",
                        ms, prefill))
        if decode is not None and not c.kind.lockstep(c) and not prof.get("host"):
            out.append((name, f"profiled decode step, {share} rows at {inp:,} tokens", "ms",
                        model.decode_ms(share, inp), decode))
    return out


def rows(measured: dict[str, dict], model_path: str, gpu: str, n: int, what_if: WhatIf = NO_WHAT_IF) -> list[tuple]:
    """(configuration, what, unit, predicted, measured) for every measured number the planner predicts (with
    `what_if`'s numbers set by hand)."""
    out = []
    lat = {}
    shape = next((m["burst"]["shape"] for m in measured.values() if m.get("burst")), None)
    workload = "offline:%d:%d:%d" % shape if shape else "latency:2048:4"  # without a burst, for the KV tokens
    pred_burst = predicted_by_server(
        measured, [k for k, m in measured.items() if not m.get("unmodeled")],
        lambda group, server: plan(model_path, n, gpu, workload, what_if=what_if, names=group,
                                   server=server)["configurations"])
    for name, m in measured.items():
        if m.get("unmodeled"):
            out.append((name, "not predicted: run with flags the planner does not model", "", None, None))
            continue
        if name not in pred_burst or not pred_burst[name].predicted:
            why = pred_burst[name].not_predicted if name in pred_burst else ""
            out.append((name, f"not predicted{': ' + why if why else ''}", "", None, None))
            continue
        p = pred_burst[name]
        if m.get("kv"):
            label, ranks, tokens = m["kv"]
            out.append((name, label, "tokens", p.kv_tokens_total / ranks, tokens))
        for tokens, ms in sorted(m.get("ttft_ms", {}).items(), key=lambda kv: int(kv[0])):
            key = (tokens, m.get("server") or DEFAULTS)
            if key not in lat:
                lat[key] = {r.name: r for r in plan(model_path, n, gpu, f"latency:{tokens}:4", what_if=what_if,
                                                    server=key[1])["configurations"]}
            out.append((name, f"TTFT of one {int(tokens):,}-token prompt", "ms", lat[key][name].ttft_ms_p50, ms))
        if m.get("burst"):
            b = m["burst"]
            what = "burst of %d x (%d in, %d out)" % b["shape"]
            out += [(name, f"{what}: total throughput", "tok/s", p.total_tok_s, b["total_tok_s"]),
                    (name, f"{what}: TTFT p50", "ms", p.ttft_ms_p50, b["ttft_ms_p50"])]
            if b["shape"][2] > 1:  # one output token: no TPOT to compare
                out.append((name, f"{what}: TPOT p50", "ms", p.tpot_ms_p50, b["tpot_ms_p50"]))
    return out


def forwards_table(files: list[Path], model_path: str, gpu: str, n: int, what_if: WhatIf = NO_WHAT_IF) -> list[str]:
    """Markdown rows: the planner's `tp{n}` decode steps (contexts 256 and 2,048) and prefills of 512 tokens or more
    (with `what_if`'s numbers set by hand) next to the same points of the TP-`n` servers' calibrations in `files`
    (their mean; each listed)."""
    from sgl_sidp.calibration.table import Calibration

    reals = [Calibration.from_entry(json.loads(Path(f).read_text())) for f in files]
    row = next(c for c in plan(model_path, n, gpu, "latency:2048:4", what_if=what_if)["configurations"]
               if c.name == f"tp{n}")
    out = ["| number | predicted | measured (each server) | error |", "|---|---:|---:|---:|"]
    points = [(f"decode step, batch {b}, context {ctx}", p, [r.decode_ms.get(int(b)) if ctx == "256" else
                                                           r.decode_ms_long.get(int(b)) for r in reals])
              for ctx in ("256", "2048") for b, p in row.decode_step_ms[ctx].items()]
    points += [(f"prefill of {int(t):,} tokens", p, [r.prefill_ms.get(int(t)) for r in reals])
               for t, p in row.prefill_ms.items() if int(t) >= 512]
    for what, pred, ms in points:
        if None in ms:
            continue
        mean = sum(ms) / len(ms)
        out.append(f"| {what} | {pred:.2f} ms | {' / '.join(f'{v:.2f}' for v in ms)} ms | {pred / mean - 1:+.1%} |")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.bench.validate", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, nargs="?",
                    help="one model's folder of bench.compare results (OUT/<model>), or of shift_compare.py's")
    ap.add_argument("--model-path", required=True, help="the model's config folder the measurement served")
    ap.add_argument("--gpu", default="H200", help="GPU kind the measurement ran on (default: H200)")
    ap.add_argument("--forwards", type=Path, nargs="+", default=None,
                    help="calibrations of TP-N servers of the model (instead of DIR): their forwards against tpN's")
    ap.add_argument("--gpus", type=int, default=2, help="N, with --forwards (default: 2)")
    ap.add_argument("--trace-dir", type=Path, default=None,
                    help="where the replayed traces are (default: the paths compare was given)")
    ap.add_argument("--per-request", type=int, nargs="?", const=12, default=None, metavar="N",
                    help="each replay request by request against the simulation, the first N listed (default 12)")
    ap.add_argument("--stream-from-probes", action="store_true",
                    help="what-if: stream at the median rate of the servers' own stream probes (compare "
                         "--stream-probe), the run's host's, instead of the calibrated rate")
    add_what_if_args(ap)
    a = ap.parse_args(argv)
    if a.stream_from_probes:
        if a.dir is None or a.stream_tokens_per_s is not None:
            ap.error("--stream-from-probes: give DIR, and not --stream-tokens-per-s too")
        a.stream_tokens_per_s = probed_stream_rate(a.dir)
        if a.stream_tokens_per_s is None:
            ap.error(f"--stream-from-probes: no server in {a.dir} measured its stream (compare --stream-probe)")
        print(f"The servers' own stream probes in {a.dir}: {a.stream_tokens_per_s:,.0f} tokens/s (median), in place "
              "of the calibrated rate below\n")
    what_if = what_if_from_args(a)
    if a.forwards:
        print("\n".join(forwards_table(a.forwards, a.model_path, a.gpu, a.gpus, what_if)))
        return
    if a.dir is None:
        ap.error("give DIR (bench.compare's or shift_compare.py's results) or --forwards")
    groups = load(a.dir)
    switched = [] if groups else unmodelled_results(a.dir)
    if switched:
        ap.error(f"{a.dir}: nothing to predict: " + "; ".join(switched))
    if not groups:
        ap.error(f"{a.dir}: no results of bench.compare or shift_compare.py there "
                 "(bench.compare's are in OUT/<model>/)")
    missing = missing_trace(a.dir, a.trace_dir)
    if missing:
        ap.error(missing)
    if a.per_request is not None:
        if a.per_request < 0:
            ap.error(f"--per-request {a.per_request}: how many requests to list, 0 or more")
        for n, measured in sorted(groups.items()):
            print("\n".join(per_request(a.dir, measured, a.model_path, a.gpu, n, a.trace_dir, a.per_request, what_if)
                            + burst_requests(a.dir, measured, a.model_path, a.gpu, n, what_if)))
        return
    profiled = profile_rows(a.dir, a.model_path, a.gpu, what_if)  # every GPU count's: each row names its configuration
    for n, measured in sorted(groups.items()):
        if len(groups) > 1:
            print(f"\n## {n} GPU{'s' if n > 1 else ''}\n")
        table = run_rows(a.dir, measured, a.model_path, a.gpu, n, a.trace_dir, what_if)
        print("\n".join(table_lines(table + [row for row in profiled if row[0] in measured])))


def table_lines(table: list[tuple]) -> list[str]:
    """A `run_rows` table (rows of (configuration, what, unit, predicted, measured)) as markdown: one row per number
    with its error, then, per burst and replay, the configurations ranked as measured and as predicted."""
    out = ["| configuration | number | unit | predicted | measured | error |", "|---|---|---|---:|---:|---:|"]
    for name, what, unit, pred, meas in table:
        if pred is None:
            out.append(f"| {name} | {what} | | | | |")
            continue
        digits = 2 if unit == "req/s" else 1
        out.append(f"| {name} | {what} | {unit} | {pred:,.{digits}f} | {meas:,.{digits}f} | {error_text(pred, meas)} |")
    for title, got in rankings(table).items():
        fmt = "{:,.0f}" if title == "Burst throughput" else "{:.2f}"
        out += ["", f"{title} ranking, measured: "
                + " > ".join(f"{n} ({fmt.format(m)})" for n, _, m in sorted(got, key=lambda x: -x[2])),
                f"{title} ranking, predicted: "
                + " > ".join(f"{n} ({fmt.format(p)})" for n, p, _ in sorted(got, key=lambda x: -x[1]))]
    return out


def run_rows(folder: Path, measured: dict[str, dict], model_path: str, gpu: str, n: int,
             trace_dir: Path | None = None, what_if: WhatIf = NO_WHAT_IF) -> list[tuple]:
    """`rows` and `trace_rows` of the results in `folder` (OUT/<model>) measured on `n` GPUs: every burst, KV and
    replay number predicted beside its measurement (the profiled forwards apart, `profile_rows`)."""
    return (rows(measured, model_path, gpu, n, what_if)
            + trace_rows(measured, replay_settings(folder), model_path, gpu, n, trace_dir, what_if))


def rankings(table: list[tuple]) -> dict[str, list[tuple[str, float, float]]]:
    """{title: [(configuration, predicted, measured)]} of a `rows` + `trace_rows` table, in its order: the burst's
    total throughput ("Burst throughput") and each replay's goodput ("<trace key> goodput"), each configuration that
    has a prediction."""
    out: dict[str, list[tuple]] = {}
    for name, what, unit, pred, meas in table:
        title = ("Burst throughput" if what.endswith("total throughput") else
                 what.split(": goodput")[0] + " goodput" if unit == "req/s" else None)
        if title and pred is not None:
            out.setdefault(title, []).append((name, pred, meas))
    return out


def predicted_first(got: list[tuple[str, float, float]]) -> str:
    """The configuration the planner names first among `rankings`' (configuration, predicted, measured) of one
    number: the highest predicted, unless a technique leads the best vanilla configuration there by less than the
    planner's error, which then yields to it (`planner.prefer_vanilla`, what `--overlay-mode auto` starts)."""
    from sgl_sidp.bench.compare_report import is_vanilla
    from sgl_sidp.plan.configs import configuration_named
    from sgl_sidp.plan.planner import yields

    def vanilla(name: str) -> bool:
        try:
            return is_vanilla({"technique": configuration_named(name).technique})
        except ValueError:  # not a configuration's name ("auto")
            return False

    first = max(got, key=lambda x: x[1])
    van = max((g for g in got if vanilla(g[0])), key=lambda x: x[1], default=None)
    return van[0] if van and not vanilla(first[0]) and yields(first[1], van[1]) else first[0]


def error_text(pred: float, meas: float) -> str:
    """The error column: predicted / measured - 1, or what stands for it where nothing was measured (a replay's
    goodput of 0: no request met the objective)."""
    if meas:
        return f"{pred / meas - 1:+.1%}"
    return "both 0" if not pred else "measured 0"


if __name__ == "__main__":
    main()
