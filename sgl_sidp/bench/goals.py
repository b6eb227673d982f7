"""The planner's goals counted over every committed side-by-side run: how many predictions are within each goal, per
node, with the largest misses named.

    python -m sgl_sidp.bench.goals benchmarks/results/multi_gpu --models-dir ../shared/models --trace-dir ../shared/traces

Every `OUT/<model>/` folder under the results folder (`bench.compare`'s) whose model is in `--models-dir` is predicted
as `bench.validate` predicts it (`validate.run_rows`: the planner of this checkout, which never
saw the run) on the GPU kind its results name. Each number is held against issue 36's goal for it (`GOALS`), and the
predicted winner of each burst and replay (`validate.rankings`) against the measured one. Prints one markdown table:
a row per (node, number), the count within the goal, and the `--misses` largest misses. Folders skipped (a model or
trace not here, no GPU kind the planner knows) and servers the planner does not predict (a configuration it does not
plan, e.g. Shift at SP1) are listed under it with the reason.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from sgl_sidp.bench import validate
from sgl_sidp.bench.compare_report import compare_results, is_served_shard
from sgl_sidp.plan.steps import gpu_key

#: (number, goal as a fraction of the measured value), in the order printed: issue 36's goals
GOALS = (("burst throughput", 0.10), ("burst TTFT / TPOT p50", 0.15), ("TTFT of one prompt", 0.15),
         ("KV tokens", 0.02), ("replay goodput", 0.10), ("replay TTFT / TPOT p50", 0.15))


@dataclass(frozen=True)
class Check:
    """One prediction held against its measurement: `run` the results folder's path under the results root,
    `number` a `GOALS` name or "winner", `error` predicted / measured - 1 (None for a winner, or where both are 0),
    `ok` within the goal (a winner: the predicted first is the measured first)."""
    node: str
    run: str
    configuration: str
    number: str
    error: float | None
    ok: bool
    what: str = ""


def number_of(what: str, unit: str) -> str | None:
    """The `GOALS` name of a `validate` table row's number (`what`, `unit`), or None for one without a goal."""
    if unit == "tokens":
        return "KV tokens"
    if unit == "req/s":
        return "replay goodput"
    if unit != "ms":
        return "burst throughput" if what.endswith("total throughput") else None
    if what.startswith("TTFT of one"):
        return "TTFT of one prompt"
    return "burst TTFT / TPOT p50" if what.startswith("burst") else "replay TTFT / TPOT p50"


def checks(node: str, run: str, table: list[tuple], ran: dict[str, str] | None = None) -> list[Check]:
    """Every `Check` of one run's `validate` table (rows of (configuration, what, unit, predicted, measured)); `ran`:
    configuration -> what its server ran where that is another's (a mode that declined: the vanilla configuration it
    started, `compare_report.predicted_as`), so that a winner named either way is the same server's."""
    ran = ran or {}
    goal = dict(GOALS)
    out = []
    for name, what, unit, pred, meas in table:
        number = number_of(what, unit)
        if pred is None or number is None:
            continue
        if meas:
            err = pred / meas - 1
            out.append(Check(node, run, name, number, err, abs(err) <= goal[number] + 1e-12, what))
        else:  # a replay's goodput of 0: right only where the planner says 0 too
            out.append(Check(node, run, name, number, None, not pred, what))
    for title, got in validate.rankings(table).items():
        if len(got) > 1:
            measured, predicted = max(got, key=lambda x: x[2])[0], validate.predicted_first(got)
            same = ran.get(predicted, predicted) == ran.get(measured, measured)
            out.append(Check(node, run, predicted, "winner", None, same, f"{title}: measured {measured}"))
    return out


def gpu_kind(folder: Path) -> str | None:
    """The planner's GPU kind (`steps.gpu_key`) of the GPU the results in `folder` ran on (their "gpu_name"), or
    None."""
    for r in compare_results(folder):
        if r.get("gpu_name"):
            return gpu_key(r["gpu_name"])
    return None


def run_checks(root: Path, models_dir: Path, trace_dir: Path | None
               ) -> tuple[list[Check], list[str], list[tuple[str, str, list[tuple]]]]:
    """(every `Check` of every model folder under `root`, one line per folder or server skipped and why, and every
    run's `validate.run_rows` table as (node, run, rows), in the order of the runs). A model folder is predicted from
    `models_dir`'s config of its name; one named "...-shard" that `models_dir` lacks (a TP shard served alone on one
    GPU, `scripts/gpu_runs.sh tp2_shard`) from the config.json `bench.compare` kept beside its results."""
    out, skipped, tables = [], [], []
    for config in sorted(root.rglob("config.json")):
        folder = config.parent
        run = str(folder.relative_to(root))
        model = models_dir / folder.name
        if not (model / "config.json").is_file() and is_served_shard(folder.name):
            model = folder  # a TP shard served alone as a model of its own: its config.json is only here
        kind = gpu_kind(folder)
        why = (f"no {model}/config.json" if not (model / "config.json").is_file() else
               "no GPU kind the planner knows in its results" if kind is None else
               validate.missing_trace(folder, trace_dir))
        groups = validate.load(folder) if why is None else {}
        switched = [f"{run} {line}" for line in (validate.unmodelled_results(folder) if why is None else [])]
        skipped += switched
        if why is None and not groups and not switched:
            why = "no bench.compare results"
        if why:
            skipped.append(f"{run}: {why}")
            continue
        for n, measured in sorted(groups.items()):
            rows = validate.run_rows(folder, measured, str(model), kind, n, trace_dir)
            ran = {k: m["predict_as"] for k, m in measured.items() if "predict_as" in m}
            out += checks(f"{n} x {kind}", run, rows, ran)
            tables.append((f"{n} x {kind}", run, rows))
            skipped += [f"{run} {name}: {what}" for name, what, _, pred, _ in rows  # those with flags: listed above
                        if pred is None and what.startswith("not predicted: ") and not measured[name].get("unmodeled")]
    return out, skipped, tables


def table(found: list[Check], misses: int = 3) -> list[str]:
    """The markdown table of `run_checks`' checks: per node and number, how many are within the goal, and the
    `misses` largest misses (run, configuration, error)."""
    goal = dict(GOALS)
    lines = ["| node | number | goal | within the goal | largest misses |", "|---|---|---|---:|---|"]
    nodes = sorted({c.node for c in found}, key=lambda s: (s.split(" x ")[1], int(s.split(" x ")[0])))
    for node in nodes:
        for number in [g for g, _ in GOALS] + ["winner"]:
            got = [c for c in found if c.node == node and c.number == number]
            if not got:
                continue
            bad = sorted((c for c in got if not c.ok), key=lambda c: -abs(c.error or 0))
            named = "; ".join(f"`{c.run.split('/')[0]}` {c.configuration} "
                              + (f"{c.error:+.1%}" if c.error is not None else c.what) for c in bad[:misses])
            more = f" (and {len(bad) - misses} more)" if len(bad) > misses else ""
            lines.append(f"| {node} | {number} | "
                         + ("the measured first" if number == "winner" else f"{goal[number]:.0%}")
                         + f" | {sum(c.ok for c in got)} of {len(got)} | {named}{more} |")
    return lines


def write_per_run(out_dir: Path, tables: list[tuple[str, str, list[tuple]]], command: str) -> list[Path]:
    """Write `run_checks`' tables, one markdown file per node (`out_dir`/2xH100.md, ...), a section per run in the
    order given: every number predicted by this checkout's planner next to its measurement (`validate.table_lines`).
    Returns the files written."""
    by_node: dict[str, list[tuple[str, list[tuple]]]] = {}
    for node, run, rows in tables:
        by_node.setdefault(node, []).append((run, rows))
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for node, runs in sorted(by_node.items()):
        lines = [f"# Every committed run on {node}, predicted next to measured", "",
                 f"Made by `{command}` (with `goals.md`): the planner of the commit that last wrote this file, which "
                 "never saw these runs but for the constants `goals.md` names. `python -m sgl_sidp.bench.validate "
                 "RUN/MODEL --model-path ... --gpu ...` prints one run's, with its profiled forwards; "
                 "`--per-request` holds each replay's requests against the simulation's."]
        for run, rows in runs:
            lines += ["", f"## {run}", "", *validate.table_lines(rows)]
        path = out_dir / f"{node.replace(' ', '')}.md"
        path.write_text("\n".join(lines) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.bench.goals", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="the results folder (benchmarks/results/multi_gpu)")
    ap.add_argument("--models-dir", type=Path, required=True, help="the models' config folders (../shared/models)")
    ap.add_argument("--trace-dir", type=Path, default=None, help="where the replayed traces are (../shared/traces)")
    ap.add_argument("--misses", type=int, default=3, help="largest misses named per row (default 3)")
    ap.add_argument("--per-run", type=Path, default=None, metavar="DIR",
                    help="also write every run's table, predicted next to measured, as DIR/<node>.md per node "
                         "(e.g. 2xH100.md)")
    a = ap.parse_args(argv)
    if not a.root.is_dir():
        ap.error(f"{a.root}: not a folder")
    found, skipped, tables = run_checks(a.root, a.models_dir, a.trace_dir)
    print("\n".join(table(found, a.misses)))
    if skipped:
        print("\nNot counted:\n\n" + "\n".join(f"- {s}" for s in skipped))
    if a.per_run:
        command = " ".join(["python -m sgl_sidp.bench.goals", *(sys.argv[1:] if argv is None else argv)])
        for path in write_per_run(a.per_run, tables, command):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
