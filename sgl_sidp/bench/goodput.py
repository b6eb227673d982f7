"""Goodput of measured trace replays under other objectives: where a technique wins depends on the SLO, and every
replay `bench.compare` ran kept each request's TTFT and TPOT, so any objective can be applied afterwards.

    python -m sgl_sidp.bench.goodput OUT/<model> --slo 1000/10 --slo 1000/50 [--model-path DIR --gpu H100]

For each replay (`traces/<configuration>/<trace>_<rate>x/`: its requests, `request_rows`, and the replay's
`summary.json`) and each objective (TTFT ms / TPOT ms), every configuration's goodput in requests per second with its
ratio to the best vanilla configuration of the same replay (`compare_report.cell`) and, in brackets, how many of
the replay's requests met the objective (a ratio of a few dozen requests is a ratio of small counts). Goodput counts
what `bench.metrics.compute_metrics` counts: completed requests meeting every objective (`SLO.met_by`, TPOT 0 for a
one-token answer), over the replay's duration. With `--model-path`, the planner's prediction for the same requests,
window and objectives stands beside each number, labelled pred. (`bench.validate.replay_settings`, `plan_requests`).

    python -m sgl_sidp.bench.goodput --predict "REPLAY ARGS" --model-path DIR --gpus N --gpu H100 --slo 1000/10 ...

Before a replay is run (`--predict`, nothing measured): every configuration the planner knows on N GPUs, its predicted
goodput under each objective for the requests `python -m sgl_sidp.replay REPLAY ARGS` would send (one simulation per
configuration for all objectives), and each one's ratio to the best vanilla configuration: where a technique can win.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from sgl_sidp.bench.compare_report import best_vanilla, cell
from sgl_sidp.bench.metrics import SLO
from sgl_sidp.bench.report import REQUESTS_CSV, REQUESTS_JSONL, read_jsonl
from sgl_sidp.plan.server_flags import DEFAULTS, ServerFlags


def parse_slo(text: str) -> SLO:
    """SLO of "TTFT_MS/TPOT_MS" (e.g. "1000/10").

    Raises:
        argparse.ArgumentTypeError: not two positive numbers.
    """
    try:
        ttft, tpot = (float(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give TTFT_MS/TPOT_MS, e.g. 1000/10") from None
    if ttft <= 0 or tpot <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: objectives are positive milliseconds")
    return SLO(ttft_ms=ttft, tpot_ms=tpot)


def replays(folder: Path) -> dict[str, dict[str, tuple[list[dict], float]]]:
    """{replay key ("<trace>@<rate>x", as in compare's JSON): {configuration: (its requests as `REQUESTS_CSV` rows,
    the replay's duration in s)}} of every replay under `folder` (OUT/<model>) that kept its per-request file."""
    out: dict[str, dict[str, tuple[list[dict], float]]] = {}
    for summary in sorted(folder.glob("traces/*/*/summary.json")):
        rows = request_rows(summary.parent)
        if rows is None:
            continue
        config, stem_rate = summary.parent.parent.name, summary.parent.name
        stem, _, rate = stem_rate.rpartition("_")
        out.setdefault(f"{stem}@{rate}", {})[config] = (rows, float(json.loads(summary.read_text())["duration"]))
    return out


def request_rows(folder: Path) -> list[dict] | None:
    """A replay's requests from its folder: `REQUESTS_CSV` where the replay left it, else `REQUESTS_JSONL` (gzipped
    as compare keeps it: the same fields; compare drops the CSV, 2.4 MB of the committed results); None without
    either."""
    if (folder / REQUESTS_CSV).is_file():
        with (folder / REQUESTS_CSV).open() as f:
            return list(csv.DictReader(f))
    return read_jsonl(folder / REQUESTS_JSONL)


def met(rows: list[dict], slo: SLO) -> int:
    """Requests that completed and met `slo` (`SLO.met_by` on each row's ttft_ms, tpot_ms, e2e_ms; an empty TPOT, a
    one-token answer, counts as 0)."""
    return sum(slo.met_by(float(r["ttft_ms"]) / 1000, float(r["tpot_ms"] or 0) / 1000, float(r["e2e_ms"]) / 1000)
               for r in rows if str(r["success"]) == "True")  # "True" in the CSV, true in the JSONL


def goodput(rows: list[dict], duration_s: float, slo: SLO) -> float:
    """Requests per second that completed and met `slo` (`met`) over the replay's `duration_s`."""
    return met(rows, slo) / duration_s


def table(folder: Path, slos: list[SLO], model_path: str | None = None, gpu: str = "H100",
          trace_dir: Path | None = None) -> list[str]:
    """Markdown: one row per (replay, objectives), one column per configuration (module docstring); [] without
    replays. Configurations are read from `folder`'s compare JSONs (their technique says which are vanilla)."""
    found = replays(folder)
    if not found:
        return []
    from sgl_sidp.bench.compare_report import compare_results

    results = {r["config"]: r for r in compare_results(folder)}
    names = sorted({c for by in found.values() for c in by})
    settings = None
    if model_path:
        from sgl_sidp.bench.validate import replay_settings

        settings = replay_settings(folder)
    lines = ["| replay | TTFT / TPOT objectives | " + " | ".join(names) + " |", "|---|---|" + "---:|" * len(names)]
    for key, by in sorted(found.items()):
        predicted = (predict(model_path, gpu, settings[key][0], list(by), slos, trace_dir, results, folder)
                     if settings and key in settings else [{} for _ in slos])
        for slo, pred in zip(slos, predicted):
            count = {c: met(rows, slo) for c, (rows, _) in by.items()}
            got = {c: count[c] / d for c, (_, d) in by.items()}  # `goodput`
            group = {c: {**results.get(c, {}), "_goodput": g} for c, g in got.items()}
            best = best_vanilla(group, lambda r: r.get("_goodput"), True)
            cells = [f"{cell(got[c], best, pred.get(c))} [{count[c]} of {len(by[c][0])}]" if c in got else "-"
                     for c in names]
            lines.append(f"| {key} | {slo.ttft_ms:g} / {slo.tpot_ms:g} ms | " + " | ".join(cells) + " |")
    return lines


def predict(model_path: str, gpu: str, replay_args: str, names: list[str], slos: list[SLO], trace_dir: Path | None,
            results: dict[str, dict], folder: Path | None = None) -> list[dict[str, float]]:
    """Per objective of `slos`, in order: {configuration: the planner's goodput (req/s)} for the replay compare sent
    with `replay_args`, on as many GPUs as the configurations used, from one simulation of each configuration
    (`plan_requests`' `more_slos`), each predicted as its server ran (`compare_report.predicted_as`: a mode that
    declined as what it started; `ran_as`: a Shift server at the
    threshold it calibrated, read from its result or its log under `folder`, as `bench.validate` predicts it);
    none for one run with flags the planner does not model (`compare_report.unmodelled_config_args`, `unmodelled`, as
    `bench.validate` leaves them out), each with the SGLang flags its server started with
    (`compare_report.server_flags_of`)."""
    from sgl_sidp.bench.compare_report import (predicted_as, predicted_by_flags, server_flags_of, unmodelled,
                                               unmodelled_config_args)

    names = [c for c in names if not unmodelled_config_args(results.get(c, {})) and not unmodelled(results.get(c, {}))]
    if not names:
        return [{} for _ in slos]
    n = max(int(results.get(c, {}).get("gpu_count") or 0) for c in names) or 2
    ran = {c: predicted_as(results[c], folder) if c in results else c for c in names}
    flags = {ran[c]: server_flags_of(results[c], folder) for c in names if c in results}
    rows = predicted_by_flags([ran[c] for c in names], flags, lambda group, server: replay_rows(
        model_path, gpu, n, replay_args, slos, trace_dir, group, server))
    return [{c: rows[ran[c]].goodput_by_slo[slo_key(slo)] for c in names if ran[c] in rows} for slo in slos]


def replay_rows(model_path: str, gpu: str, n_gpus: int, replay_args: str, slos: list[SLO], trace_dir: Path | None,
                names: list[str] = (), server: ServerFlags = DEFAULTS) -> list:
    """The planner's predicted `PlanRow`s for the requests `python -m sgl_sidp.replay REPLAY_ARGS` sends, on `n_gpus`
    GPUs of kind `gpu`, `names` besides its own configurations, each with its goodput under every objective of `slos`
    (`goodput_by_slo`, keys `slo_key`; one simulation per configuration, `plan_requests`' `more_slos`), with the
    SGLang flags `server` (default: SGLang's).

    Raises:
        PlanError: as `plan_requests`.
    """
    from sgl_sidp.bench.traces import sim_requests
    from sgl_sidp.plan.planner import plan_requests

    plan = plan_requests(model_path, n_gpus, gpu, f"replay {replay_args}", sim_requests(replay_args, trace_dir),
                         names=names, more_slos=[(slo.ttft_ms, slo.tpot_ms) for slo in slos], server=server)
    return [r for r in plan["configurations"] if r.predicted]


def slo_key(slo: SLO) -> str:
    """`PlanRow.goodput_by_slo`'s key of `slo` (`planner.slo_key`)."""
    from sgl_sidp.plan.planner import slo_key as key

    return key(slo.ttft_ms, slo.tpot_ms)


def predicted_table(model_path: str, gpu: str, n_gpus: int, replay_args: str, slos: list[SLO],
                    trace_dir: Path | None = None) -> list[str]:
    """Markdown, every number predicted: one row per objective of `slos`, one column per configuration the planner
    predicts on `n_gpus` GPUs of kind `gpu`, each its goodput (req/s) for the requests `python -m sgl_sidp.replay
    REPLAY_ARGS` would send and its ratio to the best vanilla configuration under that objective (`plan_requests`'
    `more_slos`: one simulation per configuration).

    Raises:
        PlanError: as `plan_requests` (no tables for the GPU kind, a model that does not shard, ...).
        SystemExit: replay arguments `python -m sgl_sidp.replay` refuses.
    """
    from sgl_sidp.plan.technique import technique_named

    rows = replay_rows(model_path, gpu, n_gpus, replay_args, slos, trace_dir)
    lines = [f"Predicted by the planner ({n_gpus} x {gpu}, replay {replay_args}); nothing here is measured.", "",
             "| TTFT / TPOT objectives | " + " | ".join(r.name for r in rows) + " |", "|---|" + "---:|" * len(rows)]
    for slo in slos:
        key = slo_key(slo)
        best = max((r.goodput_by_slo[key] for r in rows if technique_named(r.technique).vanilla), default=0.0)
        cells = [f"{r.goodput_by_slo[key]:.3g}" + (f" ({r.goodput_by_slo[key] / best:.2f}x)" if best else "")
                 for r in rows]
        lines.append(f"| {slo.ttft_ms:g} / {slo.tpot_ms:g} ms | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.bench.goodput", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, nargs="?", help="one model's folder of bench.compare results (OUT/<model>)")
    ap.add_argument("--predict", default=None, metavar="REPLAY_ARGS",
                    help="instead of DIR: predict every configuration's goodput for the requests `python -m "
                         "sgl_sidp.replay REPLAY_ARGS` would send (needs --model-path and --gpus)")
    ap.add_argument("--gpus", type=int, default=None, help="with --predict: the GPUs to plan for")
    ap.add_argument("--slo", type=parse_slo, action="append", required=True, metavar="TTFT_MS/TPOT_MS",
                    help="objectives to count goodput under (repeat for several)")
    ap.add_argument("--model-path", default=None, help="with it, the planner's prediction beside each number")
    ap.add_argument("--gpu", default="H100", help="GPU kind of the measurement, for the prediction (default: H100)")
    ap.add_argument("--trace-dir", type=Path, default=None,
                    help="where the replayed traces are, for the prediction (default: the paths compare was given)")
    a = ap.parse_args(argv)
    if (a.dir is None) == (a.predict is None):
        ap.error("give DIR (measured replays) or --predict REPLAY_ARGS, not both or neither")
    if a.predict is not None:
        if not a.model_path or not a.gpus:
            ap.error("--predict needs --model-path and --gpus")
        from sgl_sidp.bench.traces import replay_trace_path
        from sgl_sidp.plan.planner import PlanError

        try:
            trace = replay_trace_path(a.predict, a.trace_dir)
        except ValueError as e:
            ap.error(f"--predict: {e}")
        if not trace.is_file():
            ap.error(f"{trace}: no such trace (--predict's --trace, in --trace-dir where given)")
        try:
            print("\n".join(predicted_table(a.model_path, a.gpu, a.gpus, a.predict, a.slo, a.trace_dir)))
        except PlanError as e:
            ap.error(str(e))
        return
    if a.model_path:  # the predictions beside each number replay the traces
        from sgl_sidp.bench.validate import missing_trace

        missing = missing_trace(a.dir, a.trace_dir)
        if missing:
            ap.error(missing)
    lines = table(a.dir, a.slo, a.model_path, a.gpu, a.trace_dir)
    if not lines:
        ap.error(f"{a.dir}: no trace replay with its per-request file ({REQUESTS_CSV} or {REQUESTS_JSONL}.gz) under "
                 "traces/")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
