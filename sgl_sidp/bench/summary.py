"""Each technique against the best vanilla configuration, over every side-by-side run under one folder.

    python -m sgl_sidp.bench.summary benchmarks/results/multi_gpu      # writes its summary.json and summary.md

Reads the `summary.json` that `python -m sgl_sidp.bench.compare` wrote in each run folder below ROOT (one row per
configuration, workload and metric, each with the best vanilla configuration of the same run: `compare_report`)
and keeps, per (technique, model, GPUs, GPU name, workload, run), the technique's best configuration on the run's
headline number: total tokens/s of a burst, goodput of a trace replay. Ratios are never formed across runs: a row's
best vanilla configuration ran in the same run (same host, same call or resumed calls of one results folder), and a
run without one on that workload gives no row. The
README's "which mode for which workload" table is written from these rows (issue 35).

A run's best vanilla configuration is the best it measured, not necessarily the best the GPUs can run. With
`--models-dir`, each burst row also names the vanilla configuration the planner ranks first on that workload where
the run did not measure it, with its predicted ratio to the run's best vanilla configuration (both predicted: the
planner for the same model, GPU kind and count), so such a row is never read as a win over every vanilla choice;
and summary.md gains a second table: what `--overlay-mode auto` would start on each burst (the planner's winner over
every configuration) and, where the run measured it, its measured ratio to the run's best (`auto_picks`).

    python -m sgl_sidp.bench.summary benchmarks/results/multi_gpu --models-dir ../shared/models --readme README.md

also rewrites, in the file named, the table between `README_BEGIN` and `README_END` (`readme_table`): one line per
technique, model, node, workload and best vanilla configuration, from the rows alone.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from sgl_sidp.plan.configs import configuration_named

#: the headline number of a workload kind: burst throughput, trace goodput (higher is better for both)
HEADLINE = ("total_tok_s", "request_goodput")


def techniques_reported() -> set[str]:
    """The overlay's techniques (`Technique.vanilla` false) and `auto`: vanilla TP x DP and DP attention are the
    baselines."""
    from sgl_sidp.plan.technique import techniques

    return {name for name, kind in techniques().items() if not kind.vanilla} | {"auto"}


def technique_of(configuration: str) -> str | None:
    """The technique of a compare configuration name ("zerodp_dp2_pf8192" -> "zerodp"; "auto", the launcher's
    `--overlay-mode auto`, is a row of its own), None for an unknown name or a check of a technique's wiring
    (`Technique.wiring_check`, e.g. Shift at SP1: no way to serve)."""
    if configuration == "auto":
        return "auto"
    try:
        c = configuration_named(configuration)
    except ValueError:
        return None
    return None if c.kind.wiring_check(c) else c.technique


def technique_rows(rows: list[dict], run: str) -> list[dict]:
    """The best configuration of each technique per (model, GPUs, GPU name, workload) among one run's `rows`
    (compare's summary.json), on the headline metric, with the run's best vanilla configuration beside it.

    Returns:
        dicts with technique, model, gpus, gpu_name, workload, metric, run, configuration, value, best_vanilla,
        best_vanilla_value, ratio (value / best vanilla value; None where either is missing), sorted by technique,
        model, GPUs and workload.
    """
    best: dict[tuple, dict] = {}
    reported = techniques_reported()
    for r in rows:
        tech = technique_of(r.get("configuration", ""))
        if tech not in reported or r.get("metric") not in HEADLINE or r.get("value") is None or not r.get("ratio"):
            continue  # no ratio: the run measured no vanilla configuration on that workload
        key = (tech, r["model"], r["gpus"], r["gpu_name"], r["workload"], r["metric"])
        if key not in best or r["value"] > best[key]["value"]:
            best[key] = {"technique": tech, "model": r["model"], "gpus": r["gpus"], "gpu_name": r["gpu_name"],
                         "workload": r["workload"], "metric": r["metric"], "run": run,
                         "configuration": r["configuration"] + (f" ({r['flags']})" if r.get("flags") else "")
                         + (f" -> {r['declined_to']} (declined)" if r.get("declined_to") else ""),
                         "value": r["value"],
                         "best_vanilla": r.get("best_vanilla"), "best_vanilla_value": r.get("best_vanilla_value"),
                         "ratio": r.get("ratio")}
    return [best[k] for k in sorted(best, key=lambda k: (k[0], k[1], k[2], k[4]))]


def combine(root: Path, models_dir: Path | None = None) -> list[dict]:
    """`technique_rows` of every run folder below `root` that holds a compare summary.json (the folder's path
    relative to `root` names the run), each row with its run's `when` and a replay's `slo_ms` (`run_facts`) and
    `beaten_elsewhere`; with `models_dir`, each burst row's `unrun_vanilla` (module docstring)."""
    out, vanilla, ours = [], {}, techniques_reported() | {None}
    for run, rows in run_summaries(root):
        found = technique_rows(rows, run)
        when, objectives = run_facts(root / run)
        for row in found:
            row["when"] = when
            if row["workload"].startswith("trace "):
                row["slo_ms"] = objectives.get(row["workload"][6:])
            if models_dir:
                row["unrun_vanilla"] = unrun_vanilla(row, rows, models_dir)
        for r in rows:
            if (r.get("metric") in HEADLINE and r.get("value") and not r.get("flags")
                    and technique_of(r.get("configuration", "")) not in ours):  # a vanilla configuration's number
                slo = objectives.get(r["workload"][6:]) if r["workload"].startswith("trace ") else None
                key = (r["model"], r["gpus"], r["gpu_name"], r["workload"], str(slo))
                vanilla.setdefault(key, {}).setdefault(run, {})[r["configuration"]] = r["value"]
        out += found
    for row in out:
        row["beaten_elsewhere"] = beaten_elsewhere(row, vanilla.get((row["model"], row["gpus"], row["gpu_name"],
                                                                     row["workload"], str(row.get("slo_ms")))) or {})
    return out


def beaten_elsewhere(row: dict, runs: dict[str, dict[str, float]]) -> str | None:
    """A vanilla configuration `row`'s run did not measure that another run of the same model, GPUs and workload
    (a replay: under the same objectives) measured above the row's best vanilla configuration, "tp2 (measured above
    dp2 in RUN)" (the first such, by run name), or None. `runs`: {run: {vanilla configuration: value}}."""
    here, best = runs.get(row["run"], {}), row.get("best_vanilla")
    for run, got in sorted(runs.items()):
        for name, value in sorted(got.items(), key=lambda kv: -kv[1]):
            if name not in here and best in got and value > got[best]:
                return f"{name} (measured above {best} in {run})"
    return None


def run_facts(run_dir: Path) -> tuple[str, dict[str, list[float]]]:
    """(when the run's last compare command started, ISO 8601 or "" where `run_dir`/commands.txt does not say; each
    replay's (TTFT, TPOT) objectives in ms by trace key, `validate.replay_settings`)."""
    from sgl_sidp.bench.validate import replay_settings_of

    commands = run_dir / "commands.txt"
    text = commands.read_text() if commands.is_file() else ""
    stamps = re.findall(r"^(\d{4}-\d\d-\d\dT\S+) commit", text, flags=re.M)
    return max(stamps, default=""), {k: list(v[1]) for k, v in replay_settings_of(commands).items()}


def run_summaries(root: Path):
    """(run, rows) of every run folder below `root` whose compare summary.json reads as a list of rows (the folder's
    path relative to `root` names the run; `root`'s own summary.json is this module's output, not a run)."""
    for path in sorted(root.glob("**/summary.json")):
        if path.parent == root:
            continue
        try:
            rows = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(rows, list):
            yield str(path.parent.relative_to(root)), [r for r in rows if isinstance(r, dict)]


def unrun_vanilla(row: dict, run_rows: list[dict], models_dir: Path) -> str | None:
    """`compare_report.vanilla_gap` of `row`'s burst: the vanilla configuration the planner ranks first where its run
    (`run_rows`, compare's summary.json) measured no such configuration ("dp2 (pred. 1.15x tp2)"); None where the run
    measured it, for a trace row, and where the planner predicts nothing (`compare_report.predicted_vanilla`, for
    `models_dir`/<model>)."""
    from sgl_sidp.bench.compare_report import is_vanilla, predicted_vanilla, vanilla_gap

    if not row["workload"].startswith("burst ") or not row.get("best_vanilla"):
        return None
    predicted = predicted_vanilla(models_dir / row["model"], int(row["gpus"]), row["gpu_name"], row["workload"][6:])
    measured = {r["configuration"] for r in run_rows if r.get("model") == row["model"] and r.get("workload") ==
                row["workload"] and is_vanilla({"technique": technique_of(r.get("configuration", ""))})}
    return vanilla_gap(predicted, measured)


def auto_picks(root: Path, models_dir: Path) -> list[dict]:
    """What `--overlay-mode auto` would start on each burst of the runs below `root`: the configuration the planner
    ranks first over every one it knows (`planner.plan`'s winner, for `models_dir`/<model> on the run's GPU kind and
    count, predicted by this commit's planner), and where the run measured that configuration, its measured ratio
    to the best configuration the run measured (issue 35: auto >= 0.98x the measured best). An `auto` server measures
    the configuration it started (`auto_started`). A model folder named "...-shard" (a TP shard served alone on one
    GPU) is no model `auto` serves, and is left out.

    Returns:
        dicts with run, model, gpus, gpu_name, workload, pick (None where the planner predicts nothing), best (the
        run's best measured configuration), best_value (tok/s) and ratio (None where the run did not measure the
        pick), in run order.
    """
    from sgl_sidp.bench.compare_report import is_served_shard

    out = []
    for run, rows in run_summaries(root):
        measured: dict[tuple, dict[str, float]] = {}
        for r in rows:
            if (r.get("metric") == "total_tok_s" and r.get("value")
                    and str(r.get("workload", "")).startswith("burst ") and not r.get("flags")):
                key = (r["model"], int(r["gpus"]), r["gpu_name"], r["workload"])
                measured.setdefault(key, {})[r["configuration"]] = r["value"]
        for key, got in measured.items():
            if is_served_shard(key[0]):  # timed alone, no model `auto` serves
                continue
            started = auto_started(root / run / key[0]) if "auto" in got else None
            if started is not None and started not in got:  # the auto server measured what it started
                got[started] = got["auto"]
            best = max(got, key=got.get)
            pick = planned_winner(models_dir / key[0], key[1], key[2], key[3][6:])
            out.append({"run": run, "model": key[0], "gpus": key[1],
                        "gpu_name": key[2], "workload": key[3], "pick": pick, "best": best, "best_value": got[best],
                        "ratio": got[pick] / got[best] if pick in got else None})
    return out


def auto_started(folder: Path) -> str | None:
    """The configuration an `--overlay-mode auto` server of a compare run started ("auto_choice" in
    `folder`/auto.json: its planner's winner on the run's GPUs), or None where the folder does not say."""
    try:
        return json.loads((folder / "auto.json").read_text()).get("auto_choice") or None
    except (OSError, ValueError, AttributeError):
        return None


def planned_winner(model_path: Path, n_gpus: int, gpu_name: str, burst: str) -> str | None:
    """The planner's winner over every configuration on the burst "S+IN+OUT" (what `--overlay-mode auto` starts), or
    None where it predicts nothing (`compare_report.burst_plan`, which the other table's predictions share)."""
    from sgl_sidp.bench.compare_report import burst_plan

    return (burst_plan(Path(model_path), n_gpus, gpu_name, burst) or {}).get("winner")


def auto_markdown(picks: list[dict]) -> str:
    """One table line per `auto_picks` row."""
    lines = ["| run | model | GPUs | workload | auto's pick (predicted) | the run's best measured | pick / best, measured |",
             "|---|---|---|---|---|---|---:|"]
    for p in picks:
        ratio = "not measured in the run" if p["ratio"] is None else f"{p['ratio']:.2f}x"
        lines.append(f"| {p['run']} | {p['model']} | {p['gpus']} x {p['gpu_name']} | {p['workload']} | "
                     f"{p['pick'] or '-'} | {p['best']} ({p['best_value']:,.0f} tok/s) | {ratio} |")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict]) -> str:
    """One table line per row: technique, model, GPUs, workload, its best configuration and value, the best
    vanilla configuration and value, the ratio, the run folder."""
    checked = any("unrun_vanilla" in r for r in rows)
    lines = ["| technique | model | GPUs | workload | best configuration | value | best vanilla | value | ratio | run |"
             + (" vanilla the run lacks, predicted first |" if checked else ""),
             "|---|---|---|---|---|---:|---|---:|---:|---|" + ("---|" if checked else "")]
    for r in rows:
        unit = "tok/s" if r["metric"] == "total_tok_s" else "req/s goodput"
        num = (lambda v: "-" if v is None else f"{v:,.0f}" if r["metric"] == "total_tok_s" else f"{v:.2f}")
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        lines.append(f"| {r['technique']} | {r['model']} | {r['gpus']} x {r['gpu_name']} | {r['workload']} | "
                     f"{r['configuration']} | {num(r['value'])} {unit} | {r['best_vanilla'] or '-'} | "
                     f"{num(r['best_vanilla_value'])} | {ratio} | {r['run']} |"
                     + (f" {r.get('unrun_vanilla') or '-'} |" if checked else ""))
    return "\n".join(lines) + "\n"


#: the lines between which `--readme` writes `readme_table`
README_BEGIN, README_END = "<!-- bench.summary --readme: begin -->", "<!-- bench.summary --readme: end -->"

#: how the README names a trace file's stem
TRACE_NAMES = {"AzureLLMInferenceTrace_code": "Azure code", "mooncake_head400": "Mooncake conversation (first 400 lines)"}


def workload_label(row: dict) -> str:
    """A row's workload in words: "burst 256+2048+32" -> "256 x (2,048 in, 32 out) at once"; "trace T@3x" with its
    objectives -> "T at 3x; goodput under TTFT 1 s, TPOT 8 ms"."""
    kind, spec = row["workload"].split(" ", 1)
    if kind == "burst":
        s, i, o = (int(x) for x in spec.split("+"))
        return f"{s} x ({i:,} in, {o:,} out) at once"
    stem, _, rate = spec.rpartition("@")
    slo = row.get("slo_ms")
    return (f"{TRACE_NAMES.get(stem, stem)} at {rate}" +
            (f"; goodput under TTFT {slo[0] / 1000:g} s, TPOT {slo[1]:g} ms" if slo and None not in slo else "; goodput"))


def readme_table(rows: list[dict]) -> str:
    """The README's "which mode for which workload" table from `combine`'s rows alone (issue 35): one line per
    technique, model, node (GPU count and kind), workload (a replay with its objectives) and the run's best vanilla
    configuration, with the ratio of the run measured last (`when`), the range over every run of that line and their
    count, and a vanilla configuration the last run lacked: one another run measured above its best
    (`beaten_elsewhere`), else the one the planner ranks first (`unrun_vanilla`, predicted).
    A ratio against another best vanilla configuration is a line of its own, never a range with this one."""
    from sgl_sidp.calibration.table import gpu_kind

    lines: dict[tuple, list[dict]] = {}
    for r in rows:
        node = f"{r['gpus']} x {gpu_kind(r['gpu_name']).upper()}"
        key = (r["technique"], r["model"], node, workload_label(r), r["best_vanilla"])
        lines.setdefault(key, []).append(r)
    out = ["| technique | model | GPUs | workload | best vanilla in the run | ours / it, last run | all runs | a better "
           "vanilla the run lacks | last run |", "|---|---|---|---|---|---:|---|---|---|"]
    for key in sorted(lines):
        runs = sorted(lines[key], key=lambda r: (r.get("when") or "", r["run"]))
        last, ratios = runs[-1], [r["ratio"] for r in runs]
        spread = (f"{min(ratios):.2f}-{max(ratios):.2f}x, median {statistics.median(ratios):.2f}x ({len(runs)} runs)"
                  if len(runs) > 1 else "-")
        lacks = last.get("beaten_elsewhere") or last.get("unrun_vanilla") or "-"
        out.append(f"| {' | '.join(key)} | {last['ratio']:.2f}x | {spread} | {lacks} | {last['run']} |")
    return "\n".join(out) + "\n"


def with_readme_table(text: str, rows: list[dict]) -> str:
    """`text` with `readme_table(rows)` between its `README_BEGIN` and `README_END` lines.

    Raises:
        ValueError: `text` lacks either line, or has them out of order.
    """
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise ValueError(f"no {README_BEGIN!r} line followed by a {README_END!r} line")
    return text[:begin + len(README_BEGIN)] + "\n" + readme_table(rows) + text[end:]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.bench.summary", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="folder whose run folders hold compare's summary.json files")
    ap.add_argument("--models-dir", type=Path, default=None,
                    help="the models' config folders (DIR/<model>): name the vanilla configuration the planner ranks "
                         "first on a burst where the run did not measure it")
    ap.add_argument("--readme", type=Path, default=None,
                    help=f"rewrite the table between {README_BEGIN!r} and {README_END!r} in this file (`readme_table`)")
    a = ap.parse_args(argv)
    if not a.root.is_dir():
        sys.exit(f"summary: {a.root} is not a folder")
    if a.readme is not None:
        try:
            with_readme_table(a.readme.read_text(), [])
        except (OSError, ValueError) as e:
            sys.exit(f"summary: --readme {a.readme}: {e}")
    if a.models_dir is not None and not a.models_dir.is_dir():
        sys.exit(f"summary: --models-dir {a.models_dir} is not a folder")
    rows = combine(a.root, a.models_dir)
    text = markdown(rows)
    if a.models_dir is not None:
        text += ("\nWhat `--overlay-mode auto` would start on each burst (the planner's winner over every configuration, "
                 "predicted by this commit), and its measured ratio to the run's best where the run measured it:\n\n"
                 + auto_markdown(auto_picks(a.root, a.models_dir)))
    (a.root / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    (a.root / "summary.md").write_text(text)
    print(text, end="")
    if a.readme is not None:
        a.readme.write_text(with_readme_table(a.readme.read_text(), rows))


if __name__ == "__main__":
    main()
