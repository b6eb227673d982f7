"""The report of `python -m sgl_sidp.bench.compare`: from the results folder alone (`OUT/<model>/<config>.json`,
`OUT/<model>/config.json`), so a run spread over several device calls, or re-read later, gives the same tables.

Configurations are grouped by model, GPU name and GPU count (one group = one side-by-side comparison). In each group
every measured number is shown with its ratio to the best vanilla configuration (plain SGLang: TP, DP, TP x DP, DP
attention with or without EP) of that group on the same number: the highest KV, throughput and goodput, the lowest
latencies. Beside the burst's numbers stands the planner's prediction for the same GPU kind, labelled predicted,
where the shards are calibrated for it (`sgl_sidp.plan`); else the reason there is none. Exactness is each overlay
configuration's answers against its reference's (`sgl_sidp.bench.exact`).

Writes `OUT/compare.md`, `OUT/compare.png` (when a speed number exists) and `OUT/summary.json`: one row per
(model, GPUs, GPU name, configuration, workload) with the best vanilla configuration, both values and their ratio
(and "flags": the configuration's `--config-args`, where it had some; "declined_to": the vanilla configuration a
mode that declined at launch started instead).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import re
import shlex
from pathlib import Path
from typing import Callable, Sequence

from sgl_sidp.bench import exact, profile
from sgl_sidp.plan.server_flags import DEFAULTS, ServerFlags, ServerFlagsError, only_server_flags

#: SGLang's environment switches whose effect the planner does not model: a configuration whose server started with
#: one (`bench.compare` records them as "sglang_env") is left out of the predictions (`unmodelled`: `validate.load`
#: and this report's predictions)
UNMODELLED_ENV = ("SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP",)

#: SGLang's flags shared by a run's servers (`compare --extra-args`, in each result's "command") whose effect the
#: planner does not model, with the value it assumes (None: any value): the same treatment as `UNMODELLED_ENV`. The
#: chunk, the prefill budget, the memory fraction and the decode graphs it models (`server_flags_of`: each result
#: predicted with its server's). `--incremental-streaming-output` sends each stream only its new tokens, where the
#: planner's stream rate was measured with SGLang's default chunks of the whole output so far (on 2 x H200 Qwen3-8B DP2's
#: 512 x (1,024 in, 256 out) ran 43,300 tok/s with it, its last token with its server's, and 34,933 without it on
#: another host, its last token about 4 s after: `q8_graphs512_incr_2gpu_h200`, `q8_graphs512_pair_2gpu_h200`).
UNMODELLED_FLAGS = {"--enable-mixed-chunk": None, "--stream-interval": "1", "--incremental-streaming-output": None}

#: the end of a model folder's name that marks a TP shard served alone on one GPU as a model of its own
#: (`scripts/gpu_runs.sh tp_shard`: "Qwen3-32B-tp4-shard"), its config.json kept beside its results
SHARD_SUFFIX = "-shard"


def is_served_shard(model: str) -> bool:
    """Whether the model folder named `model` holds a TP shard served alone (`SHARD_SUFFIX`), no model a user serves."""
    return model.endswith(SHARD_SUFFIX)


#: (key, label, higher is better, read from a result)
FACTS: list[tuple[str, str, bool, Callable[[dict], float | None]]] = [
    ("kv_tokens", "KV tokens (all ranks)", True, lambda r: sum((r.get("kv_tokens") or {}).values()) or None),
    ("startup_s", "start-up s", False, lambda r: r.get("startup_s")),
]
BURST: list[tuple[str, str, bool]] = [
    ("total_tok_s", "tok/s (in+out)", True), ("ttft_ms_p50", "TTFT p50 ms", False), ("ttft_ms_p99", "TTFT p99 ms", False),
    ("tpot_ms_p50", "TPOT p50 ms", False), ("tpot_ms_p99", "TPOT p99 ms", False)]
ALONE: list[tuple[str, str, bool]] = [
    ("ttft_ms_p50", "TTFT p50 ms", False), ("tpot_ms_p50", "TPOT p50 ms", False), ("e2e_ms_p50", "E2E p50 ms", False)]
TRACE: list[tuple[str, str, bool]] = [
    ("request_goodput", "goodput req/s", True), ("output_throughput", "output tok/s", True),
    ("median_ttft_ms", "TTFT p50 ms", False), ("median_tpot_ms", "TPOT p50 ms", False)]
#: the planner's `PlanRow` fields of the burst's numbers
PREDICTED = {"total_tok_s": "total_tok_s", "ttft_ms_p50": "ttft_ms_p50", "ttft_ms_p99": "ttft_ms_p99",
             "tpot_ms_p50": "tpot_ms_p50", "tpot_ms_p99": "tpot_ms_p99", "kv_tokens": "kv_tokens_total"}


def load(out_dir: Path) -> dict[str, dict[str, dict]]:
    """{model: {configuration: result}} of every result file under `out_dir` (files without a "config" skipped)."""
    out: dict[str, dict[str, dict]] = {}
    for path in sorted(out_dir.glob("*/*.json")):
        if path.name == "config.json":
            continue
        try:
            res = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(res, dict) and res.get("config"):
            out.setdefault(path.parent.name, {})[res["config"]] = res
    return out


def groups(results: dict[str, dict[str, dict]]) -> dict[tuple[str, str, int], dict[str, dict]]:
    """{(model, GPU name, GPU count): {configuration: result}}, configurations in the order they were first run."""
    out: dict[tuple[str, str, int], dict[str, dict]] = {}
    for model, by in results.items():
        for name, r in sorted(by.items(), key=lambda kv: kv[1].get("started") or ""):
            out.setdefault((model, r.get("gpu_name") or "unknown GPU", int(r.get("gpu_count") or 0)), {})[name] = r
    return out


def is_vanilla(r: dict) -> bool:
    """Plain SGLang (`Technique.vanilla`; the `auto` pick counts as ours even when it picks vanilla)."""
    from sgl_sidp.plan.technique import techniques

    kind = techniques().get(r.get("technique") or "")
    return kind is not None and kind.vanilla


@functools.lru_cache(maxsize=64)
def burst_plan(model_path: Path, n_gpus: int, gpu_name: str, burst: str) -> dict | None:
    """`planner.plan`'s result on the burst "S+IN+OUT" for `model_path` on `n_gpus` GPUs named `gpu_name` (NVML's
    name; its kind picks the tables), computed once per arguments (a summary asks for each run's burst twice); None
    where the planner predicts nothing (no config.json, no tables for the kind, a workload it refuses). Read only."""
    from sgl_sidp.calibration.table import gpu_kind
    from sgl_sidp.plan.planner import plan

    if not (Path(model_path) / "config.json").is_file():
        return None
    try:
        return plan(str(model_path), n_gpus, gpu_kind(gpu_name).upper(), "offline:" + burst.replace("+", ":"))
    except (ValueError, KeyError):  # PlanError is a ValueError
        return None


def predicted_vanilla(model_path: Path, n_gpus: int, gpu_name: str, burst: str) -> dict[str, float]:
    """{vanilla configuration: the planner's total tokens/s} on the burst (`burst_plan`'s arguments); {} where the
    planner predicts none."""
    result = burst_plan(Path(model_path), n_gpus, gpu_name, burst) or {}
    return {r.name: r.total_tok_s for r in result.get("configurations", [])
            if r.predicted and r.total_tok_s and is_vanilla({"technique": r.technique})}


def vanilla_gap(predicted: dict[str, float], measured: Sequence[str]) -> str | None:
    """"dp2 (pred. 1.15x tp2)": the vanilla configuration first in `predicted` (`predicted_vanilla`) where none of
    `measured` (the vanilla configurations a run measures) is it, with its predicted ratio to the best of them that
    the planner predicts ("not run" where it predicts none); None where the run measures the planner's first."""
    if not predicted:
        return None
    first = max(predicted, key=predicted.get)
    if first in measured:
        return None
    known = [m for m in measured if m in predicted]
    if not known:
        return f"{first} (no vanilla configuration of the run predicted)"
    best = max(known, key=predicted.get)
    return f"{first} (pred. {predicted[first] / predicted[best]:.2f}x {best})"


def best_vanilla(group: dict[str, dict], get: Callable[[dict], float | None], higher: bool) -> tuple[str, float] | None:
    """(name, value) of the best vanilla configuration of `group` on one number, None when none has it."""
    vals = [(n, v) for n, r in group.items() if is_vanilla(r) and (v := get(r)) is not None]
    if not vals:
        return None
    return (max if higher else min)(vals, key=lambda nv: nv[1])


def start_failure(error: dict) -> str:
    """Why a server did not start, in one line: the exception's first line and, where that ends in ':' (the server's
    exit), the first line of its log that names a failure (`error` as `bench.compare` records it: "what", "log")."""
    what, log = error.get("what", ""), error.get("log") or []
    return f"{what} {log[0]}" if what.endswith(":") and log else what


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def cell(v: float | None, best: tuple[str, float] | None, predicted: float | None = None) -> str:
    """"12,345 (1.07x)" with the ratio to the best vanilla value, and "pred. 11,000 (+12 %)" where predicted."""
    if v is None:
        return "-"
    text = fmt(v) + (f" ({v / best[1]:.2f}x)" if best and best[1] else "")
    if predicted is not None:
        text += f"; pred. {fmt(predicted)} ({predicted / v - 1:+.0%})" if v else f"; pred. {fmt(predicted)}"
    return text


def ratio_row(value: float | None, best: tuple[str, float] | None) -> dict:
    """A summary row's numbers: `value`, the best vanilla configuration's name and value, and their ratio (None
    where either is missing or the best is 0)."""
    return {"value": value, "best_vanilla": best and best[0], "best_vanilla_value": best and best[1],
            "ratio": value / best[1] if value is not None and best and best[1] else None}


def compare_results(folder: Path) -> list[dict]:
    """`bench.compare`'s result of each configuration in `folder` (OUT/<model>: its `<configuration>.json` files, each
    with a "config"; the model's config.json and other JSON left out), in file-name order."""
    results = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json")) if p.name != "config.json"]
    return [r for r in results if isinstance(r, dict) and r.get("config")]


@functools.lru_cache(maxsize=16)
def server_log(folder: Path | None, config: str) -> str | None:
    """The text of configuration `config`'s server log, which `bench.compare` keeps gzipped in `folder`/logs; None
    where there is none (or no folder). Cached for the few results of one folder: validation reads a result's log for
    its Shift threshold (`ran_as`) and its decode graphs (`server_flags_of`)."""
    import gzip

    log = folder / "logs" / f"{config}.log.gz" if folder is not None else None
    if log is None or not log.is_file():
        return None
    with gzip.open(log, "rt", errors="replace") as f:
        return f.read()


def ran_as(r: dict, folder: Path | None = None) -> str:
    """The planner's name for what the server of result `r` ran: its configuration, a Shift server's with `_nccl`
    where its base configuration exchanged by NCCL (its result's "shift_exchange"; every Shift server before that
    field did, but those named `_overlap`) and with the threshold it ran at (`_thN`; its result's
    "shift_threshold", or for results kept before that field its log in `folder`/logs), where the name does not set
    one and the threshold is finite. A server's start-up calibration may differ from the planner's own threshold
    (2,048 tokens measured where the planner put 512-1,024)."""
    from sgl_sidp.bench.server_stats import shift_threshold_logged

    config = name = r.get("config") or ""
    if r.get("technique") != "shift":
        return name
    exchange = r.get("shift_exchange") or ("overlap" if "_overlap" in name else "nccl")
    if exchange == "nccl" and "_nccl" not in name:
        name += "_nccl"
    if "_th" in name:
        return name
    th = r.get("shift_threshold")
    if th is None and (text := server_log(folder, config)) is not None:
        th = shift_threshold_logged(text)
    return name if th is None or float(th) == float("inf") else f"{name}_th{int(float(th))}"  # "inf": JSON's word


def predicted_as(r: dict, folder: Path | None = None, ran: str | None = None) -> str:
    """The planner's name to predict the server of result `r` with: the vanilla configuration a mode that declined at
    launch started instead (its result's "declined_to": a ZeroDP server predicted to gain nothing runs SGLang's DP,
    with SGLang's round robin, not ZeroDP's router), else `ran_as` (`ran`, where the caller has it already: it may
    read a Shift server's log)."""
    return r.get("declined_to") or (ran if ran is not None else ran_as(r, folder))


#: SGLang's log line of the decode graphs a server captured (`CudaGraphRunner`), their batch sizes in brackets
DECODE_CAPTURE = re.compile(r"Capture target decode CUDA graph begin\..*?bs=\[([0-9, ]+)\]")


def server_flags_of(result: dict, folder: Path | None = None) -> ServerFlags:
    """The SGLang flags the planner models that `bench.compare`'s result of one configuration started its server with
    (its "command": the chunk, the prefill budget, the memory fraction, the decode graphs), to predict it with; the
    largest decode graph, where the command does not set it, as the server's log in `folder`/logs shows it captured
    (a feature's own default, `Feature.sglang_defaults`, is not in the command: Shift's servers before it raised the
    limit captured SGLang's 256).

    Raises:
        ServerFlagsError: a value the planner cannot use (`unmodelled` names it).
    """
    flags = ServerFlags.from_words(shlex.split(result.get("command") or ""))
    if flags.decode_graph_max_bs is None and flags.decode_graphs:
        found = DECODE_CAPTURE.search(server_log(folder, result.get("config") or "") or "")
        if found:
            flags = dataclasses.replace(flags, decode_graph_max_bs=max(int(b) for b in found.group(1).split(",")))
    return flags


def by_flags(names, flags: dict) -> dict[ServerFlags, list[str]]:
    """`names` grouped by their SGLang flags (`flags`: name -> `ServerFlags`, SGLang's defaults where missing or
    None), in order: each group is predicted by one call of the planner with its flags."""
    out: dict[ServerFlags, list[str]] = {}
    for name in names:
        out.setdefault(flags.get(name) or DEFAULTS, []).append(name)
    return out


def predicted_by_flags(names, flags: dict, predict, predict_as: dict | None = None) -> dict:
    """{name: the planner's `PlanRow`} of `names`, one call of `predict(group, server)` (a plan's "configurations")
    per group of them with the same SGLang flags (`by_flags`; `flags`: name -> `ServerFlags` or None); a name of
    `predict_as` (name -> the planner's name to predict it with, `predicted_as`) gets that configuration's row."""
    want = {name: (predict_as or {}).get(name, name) for name in names}
    out = {}
    for server, group in by_flags(names, flags).items():
        asked = list(dict.fromkeys(want[name] for name in group))
        rows = {r.name: r for r in predict(asked, server) if r.name in asked}
        out.update({name: rows[want[name]] for name in group if want[name] in rows})
    return out


def unmodelled_config_args(result: dict) -> bool:
    """Whether the flags `bench.compare --config-args` gave this one configuration hold any the planner does not model
    (`server_flags.only_server_flags`; those it models are in the server's command, `server_flags_of`)."""
    args = result.get("config_args")
    return bool(args) and not only_server_flags(shlex.split(args))


def unmodelled(result: dict) -> str | None:
    """Why `bench.compare`'s result of one configuration is not predicted: the switches of `UNMODELLED_ENV` its
    server started with (its "sglang_env"), its flags of `UNMODELLED_FLAGS` at other than the planner's value and
    a modelled flag's value the planner cannot use (its "command"), as one phrase; None when there are none."""
    env = result.get("sglang_env") or {}
    found = [f"{k}={env[k]}" for k in UNMODELLED_ENV if k in env]
    try:
        server_flags_of(result)
    except ServerFlagsError as e:
        found.append(str(e))
    words = shlex.split(result.get("command") or "")  # as `bench.compare` wrote it (`shlex.join`)
    for i, word in enumerate(words):
        flag, _, value = word.partition("=")
        if flag in UNMODELLED_FLAGS:
            value = value or (words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else "")
            if UNMODELLED_FLAGS[flag] is None or value != UNMODELLED_FLAGS[flag]:
                found.append(f"{flag} {value}".strip())
    return f"started with {', '.join(found)}, which the planner does not model" if found else None


def predictions(out_dir: Path, model: str, gpu_name: str, gpus: int, burst: str | None,
                names: Sequence[str] = (), ran: dict[str, str] | None = None,
                servers: dict[str, ServerFlags] | None = None) -> tuple[dict, str]:
    """The planner's rows ({configuration: `PlanRow`}) for the burst of a group, and a note naming each of the group's
    configurations that the planner did not predict, and why ("" when it predicted them all);
    `names`: the group's configurations, predicted too where the planner does not list them (`plan`'s `names`), each
    as it ran where `ran` says (`ran_as`: a Shift server at its own threshold), under its own name.

    Never raises: a GPU kind or model the planner cannot predict gives ({}, the reason)."""
    if not burst:
        return {}, ""
    from sgl_sidp.plan.configs import configuration_named
    from sgl_sidp.plan.planner import PlanError, plan
    from sgl_sidp.plan.steps import GPUS, gpu_key

    def on_these_gpus(name: str) -> bool:
        try:
            return configuration_named(name).gpus == gpus
        except ValueError:  # "auto"
            return False

    kind = gpu_key(gpu_name)
    if kind is None:
        return {}, f"no prediction: the planner knows {', '.join(GPUS)}, not {gpu_name}"
    ran = {n: (ran or {}).get(n, n) for n in names}
    s, i, o = (int(x) for x in burst.split("+"))
    rows: dict = {}
    for flags, group in by_flags(names, servers or {}).items():  # the planner's own rows from SGLang's defaults
        try:
            result = plan(str(out_dir / model), gpus, kind, f"offline:{s}:{i}:{o}",
                          names=[ran[n] for n in group if on_these_gpus(n)], server=flags)
        except PlanError as e:
            return {}, f"no prediction: {e}"
        got = {r.name: r for r in result["configurations"]}
        if flags == DEFAULTS:
            rows.update({k: v for k, v in got.items() if k not in rows})
        rows.update({n: got[ran[n]] for n in group if ran[n] in got})
    missing = [f"{n}: {rows[n].not_predicted}" for n in names if n in rows and rows[n].not_predicted is not None]
    return rows, "; ".join(missing)


def exactness(group: dict[str, dict], everything: dict[str, dict]) -> dict[str, dict | None]:
    """{configuration: `exact.verdict` against its reference, or None} for the group's overlay configurations with
    answers (the reference looked up among all of the model's results on the same GPU kind)."""
    out: dict[str, dict | None] = {}
    for name, r in group.items():
        if "exact" not in r or r.get("technique") in (None, "auto") or is_vanilla(r):
            continue
        ref_name = exact.reference_name(r["technique"], r["dp"], r["tp"], r.get("sp") or 1)
        ref = everything.get(ref_name)
        if ref is None or "exact" not in ref or ref.get("gpu_name") != r.get("gpu_name"):
            out[name] = {"answers": 0, "no_reference": ref_name}
            continue
        out[name] = {**exact.verdict(ref["exact"], r["exact"]), "reference": ref_name}
    return out


def describe_exact(v: dict | None) -> str:
    if v and v.get("no_reference"):
        return f"no answers of {v['no_reference']} to compare with"
    return exact.describe(v) + (f" vs {v['reference']}" if v and v.get("reference") else "")


def render(out_dir: Path, predict: bool = True) -> tuple[str, list[dict], dict]:
    """(markdown, summary rows, plot metrics) of a results folder."""
    results = load(out_dir)
    lines = [f"# Configurations side by side ({out_dir.name})", "",
             "Every number is measured on the GPUs named, in one run, unless it says pred. (the planner's prediction "
             "for the same GPU kind, its error against the measurement in brackets). (Nx): the ratio to the best "
             "vanilla configuration of the same table on that number (for latencies, below 1 is better).", ""]
    commands = out_dir / "commands.txt"
    if commands.is_file():
        lines += ["Commands:", "", *[f"    {ln}" for ln in commands.read_text().splitlines()], ""]
    summary, plot = [], {}
    for (model, gpu, count), group in groups(results).items():
        burst_spec = next((r["burst"]["spec"] for r in group.values() if r.get("burst")), None)
        servers = {n: server_flags_of(r, out_dir / model) for n, r in group.items() if not unmodelled(r)}
        pred, pred_note = (predictions(out_dir, model, gpu, count, burst_spec, list(group),
                                       {n: ran_as(r, out_dir / model) for n, r in group.items()}, servers)
                           if predict else ({}, ""))
        ex = exactness(group, results[model])
        lines += [f"## {model} on {count} x {gpu}", ""]
        switched = {n: why for n, why in ((n, unmodelled(r)) for n, r in group.items()) if why}
        if pred and switched:  # a server started with a switch the planner does not model: no prediction
            pred = {n: row for n, row in pred.items() if n not in switched}
            pred_note = "; ".join([pred_note] * bool(pred_note) + [f"{n}: {why}" for n, why in switched.items()])
        if pred_note:
            lines += [f"Planner: {pred_note}", ""]
        lines += ["| configuration | commit | start-up s | KV tokens per rank | KV tokens (all ranks) | exactness |",
                  "|---|---|---:|---|---:|---|"]
        kv_best = best_vanilla(group, FACTS[0][3], True)
        for name, r in group.items():
            if r.get("refused") or (r.get("error") and not r.get("kv_tokens")):
                why = r.get("refused") or f"did not start: {start_failure(r['error'])}"
                lines.append(f"| {name} | {(r.get('commit') or '')[:7]} | - | - | - | {'refused: ' if r.get('refused') else ''}{why} |")
                continue
            kv = FACTS[0][3](r)
            row = None if unmodelled_config_args(r) else pred.get(name)  # flags the planner does not model: none
            p = (row.kv_tokens_total or None) if row else None  # 0: no memory sized (an option it does not model)
            per_rank = ", ".join(f"{v:,}" for _, v in sorted((r.get("kv_tokens") or {}).items(), key=lambda kv: int(kv[0])))
            launched = (f" -> {r['auto_choice']}" if r.get("auto_choice") else
                        f" -> {r['declined_to']} (declined)" if r.get("declined_to") else "")
            lines.append(f"| {name}{launched} | "
                         f"{(r.get('commit') or '')[:7]} | {fmt(r.get('startup_s'))} | {per_rank or '-'} | "
                         f"{cell(kv, kv_best, p)} | {describe_exact(ex.get(name)) if name in ex else '-'} |")
            if name in ex and ex[name].get("answers"):
                summary.append({"model": model, "gpus": count, "gpu_name": gpu, "configuration": name,
                                "workload": "exactness", "reference": ex[name]["reference"],
                                "bit_identical": ex[name]["bit_identical"], "tokens_equal": ex[name]["tokens_equal"],
                                "max_logprob_gap": ex[name]["max_logprob_gap"],
                                "first_difference": ex[name]["first_difference"]})
        lines.append("")
        lines += stream_probe_lines(group, out_dir / model, gpu)
        with_alone = {n: r for n, r in group.items() if r.get("alone")}
        if with_alone:
            spec = next(iter(with_alone.values()))["alone"]["spec"]
            lines += [f"Alone {spec} (N+IN+OUT, each request after the last finished):", "",
                      "| configuration | " + " | ".join(label for _, label, _ in ALONE) + " |",
                      "|---|" + "---:|" * len(ALONE)]
            bests = {k: best_vanilla(with_alone, lambda r, k=k: r["alone"].get(k), hi) for k, _, hi in ALONE}
            for name, r in with_alone.items():
                lines.append(f"| {name} | " + " | ".join(cell(r["alone"].get(k), bests[k]) for k, _, _ in ALONE) + " |")
                for k in ("ttft_ms_p50", "tpot_ms_p50"):
                    summary.append({"model": model, "gpus": count, "gpu_name": gpu, "configuration": name,
                                    "workload": f"alone {spec}", "metric": k,
                                    **ratio_row(r["alone"].get(k), bests[k])})
            lines.append("")
        with_burst = {n: r for n, r in group.items() if r.get("burst")}
        if with_burst:
            lines += [f"Burst {burst_spec} (S+IN+OUT, all at once):", "",
                      "| configuration | " + " | ".join(label for _, label, _ in BURST) + " | decode tokens per rank |",
                      "|---|" + "---:|" * len(BURST) + "---|"]
            bests = {k: best_vanilla(with_burst, lambda r, k=k: r["burst"].get(k), hi) for k, _, hi in BURST}
            for name, r in with_burst.items():
                row = None if unmodelled_config_args(r) else pred.get(name)  # flags the planner does not model: none
                cells = [cell(r["burst"].get(k), bests[k], getattr(row, PREDICTED[k]) if row else None) for k, _, _ in BURST]
                ranks = ", ".join(f"{int(v.get('decode_tokens', 0)):,}" for _, v in sorted(r["burst"].get("per_rank", {}).items()))
                lines.append(f"| {name} | " + " | ".join(cells) + f" | {ranks or '-'} |")
                summary.append({"model": model, "gpus": count, "gpu_name": gpu, "configuration": name,
                                "workload": f"burst {burst_spec}", "metric": "total_tok_s",
                                **ratio_row(r["burst"].get("total_tok_s"), bests["total_tok_s"]),
                                "predicted": row.total_tok_s if row else None})
                label = f"{model} {count}x{gpu.split()[-1] if gpu else ''}: {name}"
                plot.setdefault("burst tok/s", {})[label] = r["burst"].get("total_tok_s")
                plot.setdefault("burst TPOT p50 ms", {})[label] = r["burst"].get("tpot_ms_p50")
            lines.append("")
        keys = list(dict.fromkeys(k for r in group.values() for k in (r.get("traces") or {})))
        for key in keys:
            with_trace = {n: r for n, r in group.items() if key in (r.get("traces") or {})}
            lines += [f"Trace replay {key}:", "", "| configuration | " + " | ".join(l for _, l, _ in TRACE) + " |",
                      "|---|" + "---:|" * len(TRACE)]
            bests = {k: best_vanilla(with_trace, lambda r, k=k: r["traces"][key].get(k), hi) for k, _, hi in TRACE}
            for name, r in with_trace.items():
                t = r["traces"][key]
                lines.append(f"| {name} | " + " | ".join(cell(t.get(k), bests[k]) for k, _, _ in TRACE) + " |")
                summary.append({"model": model, "gpus": count, "gpu_name": gpu, "configuration": name,
                                "workload": f"trace {key}", "metric": "request_goodput",
                                **ratio_row(t.get("request_goodput"), bests["request_goodput"])})
                plot.setdefault(f"{key} goodput req/s", {})[f"{model}: {name}"] = t.get("request_goodput")
            lines.append("")
        lines += profile_table(group)
        errs = [(n, r["step_errors"]) for n, r in group.items() if r.get("step_errors")]
        if errs:
            lines += ["Steps that failed:", "", *[f"- {n}: {e}" for n, e in errs], ""]
    for row in summary:  # a configuration run with --config-args flags, or one that declined, says so in every row
        r = results[row["model"]][row["configuration"]]
        if r.get("config_args"):
            row["flags"] = r["config_args"]
        if r.get("declined_to"):
            row["declined_to"] = r["declined_to"]
        if unmodelled(r):  # by a switch or by a flag (its "command"): a result without switches has no "sglang_env"
            row["sglang_env"] = r.get("sglang_env") or {}
    return "\n".join(lines), summary, plot


def stream_probe_lines(group: dict[str, dict], model_path: Path, gpu_name: str) -> list[str]:
    """The line of the group's stream probes (`compare --stream-probe`), with the stream rate the planner applies to
    the probe's requests on this GPU kind (`planner.stream_rate`); none without probes."""
    probes = {n: r["stream_probe"] for n, r in group.items() if r.get("stream_probe")}
    if not probes:
        return []
    from sgl_sidp.plan.calibrate import STREAM_PROBE
    from sgl_sidp.plan.planner import stream_rate
    from sgl_sidp.plan.steps import gpu_key

    kind = gpu_key(gpu_name)
    planned = stream_rate(str(model_path), kind, STREAM_PROBE[2]) if kind else None
    each = "; ".join(f"{n} {fmt(p.get('delivered_tokens_per_s'))}" if p.get("delivered_tokens_per_s") else
                     f"{n}: not measured ({p.get('error')})" for n, p in probes.items())
    n, i, o = STREAM_PROBE
    return [f"Stream probe ({n} x ({i} in, {o} out) after the warm-up, tokens a second the client received while "
            f"every request decoded; the planner's stream rate {fmt(planned) if planned else 'unknown'}): {each}", ""]


def profile_table(group: dict[str, dict]) -> list[str]:
    """Markdown lines of the group's `--profile` results: per configuration, DP replica and stage, the replica's first
    GPU's milliseconds per forward by kernel class (`sgl_sidp.bench.profile.summarize_trace`); [] when none was
    profiled. Every DP replica is shown: in lockstep (SiDP's CaS and auto, DP attention) one replica's collectives
    wait for another's forward, which shows only beside it (SiDP on 2 x H100: 233 of DP1's 288 ms of CaS decodes)."""
    with_prof = {n: r["profile"] for n, r in group.items() if (r.get("profile") or {}).get("ranks")}
    if not with_prof:
        return []
    first = next(iter(with_prof.values()))
    classes = ["gemm", "attention", "comm", "norm", "moe", "copy", "other"]
    after = first.get("after_s") or profile.AFTER_S  # None: from the burst's start, or kept before the option
    late = f", from {after:g} s into the burst" if after != profile.AFTER_S else ""
    lines = [f"Profile {first['spec']} (S+IN+OUT; ms per forward on each DP replica's first GPU, {first['steps']} "
             f"forwards a stage{late} "
             f"traced by SGLang's torch profiler; SGLang's chunked prefill size "
             f"{first.get('chunked_prefill_size')}): span = first to last kernel, busy = time any kernel ran", "",
             "| configuration | GPU | stage | span | busy | " + " | ".join(classes) + " | heaviest kernel (ms) |",
             "|---|---|---|---:|---:|" + "---:|" * len(classes) + "---|"]
    for name, prof in with_prof.items():
        for rank, stage in itertools.product(replica_leaders(prof["ranks"]), ("prefill", "decode")):
            sm = prof["ranks"][rank].get(stage)
            if not sm:
                continue
            if "error" in sm:
                lines.append(f"| {name} | {rank} | {stage} | {sm['error']} |")
                continue
            top = sm["top"][0] if sm.get("top") else None
            lines.append(f"| {name} | {rank} | {stage} | {fmt(sm['span_ms'])} | {fmt(sm['busy_ms'])} | "
                         + " | ".join(fmt(sm["by_class_ms"].get(c)) for c in classes)
                         + f" | {top[0][:60] + ' (' + fmt(top[1]) + ')' if top else '-'} |")
    return lines + [""] + forwards_table(with_prof) + host_table(with_prof)


def host_table(with_prof: dict[str, dict]) -> list[str]:
    """Markdown lines of each replica's first GPU's host timeline (`profile.host_timeline`, `--profile-host`), per
    stage: every forward's launches, GPU span, the GPU's lag behind the last launch and the host's gap before the
    next forward, then the host's heaviest functions in those gaps and in the launch windows; [] where none was
    traced."""
    rows, heavy = [], []
    for name, prof in with_prof.items():
        for rank, stage in itertools.product(replica_leaders(prof["ranks"]), ("prefill", "decode")):
            tl = (prof["ranks"][rank].get(stage) or {}).get("host")
            if not tl:
                continue
            rows.append(f"| {name} | {rank} | {stage} | " + "; ".join(
                f"{fmt(f['launch_ms'])} / {fmt(f['gpu_ms'])} / {fmt(f['lag_ms'])} / {fmt(f['gap_ms'])}"
                for f in tl["forwards"]) + " |")
            for where in ("in_gaps", "in_launches"):
                heavy.append(f"| {name} | {rank} | {stage} | {where[3:]} | "
                             + "; ".join(f"{fn} {fmt(ms)}" for fn, ms in tl[where]) + " |")
    if not rows:
        return []
    return (["Host timeline, each replica's first GPU, per forward: launches / GPU span / the GPU's lag behind the "
             "last launch / the host's gap before the next forward's first launch (ms; `profile.host_timeline`)", "",
             "| configuration | GPU | stage | forwards |", "|---|---|---|---|"] + rows + [""]
            + ["The host's own time by function (ms per gap or launch window)", "",
               "| configuration | GPU | stage | window | functions |", "|---|---|---|---|---|"] + heavy + [""])


def forwards_table(with_prof: dict[str, dict]) -> list[str]:
    """Markdown lines: every GPU's traced prefill forwards one by one (`profile.each_forward`), each "start+span
    (busy, comm)" in ms, the starts from the configuration's earliest traced kernel on any GPU (one host's clock);
    [] where no trace counted its forwards. `--profile-at-start` makes the first the burst's first forward."""
    rows, n = [], 0
    for name, prof in with_prof.items():
        ranks = {r: st["prefill"] for r, st in sorted(prof["ranks"].items()) if (st.get("prefill") or {}).get("forwards")}
        if not ranks:
            continue
        n = max([n] + [len(sm["forwards"]) for sm in ranks.values()])
        t0 = min(sm["first_us"] for sm in ranks.values())
        for rank, sm in ranks.items():
            off = (sm["first_us"] - t0) / 1e3
            rows.append(f"| {name} | {rank} | " + " | ".join(
                f"{fmt(off + f['start_ms'])}+{fmt(f['span_ms'])} ({fmt(f['busy_ms'])}, {fmt(f['comm_ms'])})"
                for f in sm["forwards"]) + " |")
    if not rows:
        return []
    out = (["Prefill forwards one by one, every GPU: start+span ms (busy, communication ms); starts from the "
            "configuration's first traced kernel", "",
            "| configuration | GPU | " + " | ".join(f"forward {k + 1}" for k in range(n)) + " |",
            "|---|---|" + "---|" * n] + rows + [""])
    waits = [(name, rank, sm["host_waits"]) for name, prof in with_prof.items()
             for rank in replica_leaders(prof["ranks"])
             if (sm := prof["ranks"][rank].get("prefill") or {}).get("host_waits") is not None]
    if waits:
        out += ["Host CUDA calls of 1 ms or more while the prefill forwards were traced, each replica's first GPU: "
                "start+ms (from that GPU's first kernel) and the call", "", "| configuration | GPU | calls |",
                "|---|---|---|"]
        out += [f"| {name} | {rank} | " + ("; ".join(f"{fmt(t)}+{fmt(d)} {call}" for t, d, call in w) or "none")
                + " |" for name, rank, w in waits] + [""]
    return out


def replica_leaders(ranks) -> list[str]:
    """The first GPU of each DP replica among a profile's rank names (SGLang's "TP-0", "TP-0-DP-1", ...): those of
    TP rank 0, or the first name where none is."""
    names = sorted(ranks)
    return [r for r in names if r == "TP-0" or r.startswith("TP-0-")] or names[:1]


def write_report(out_dir: Path, predict: bool = True) -> str:
    """Write `compare.md`, `summary.json` and (with a speed number) `compare.png` into `out_dir`; returns the
    markdown."""
    from sgl_sidp.bench.report import plot_configs

    md, summary, plot = render(out_dir, predict)
    (out_dir / "compare.md").write_text(md + "\n")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if plot:
        plot_configs(out_dir / "compare.png", plot, f"measured side by side ({out_dir.name})")
    return md
