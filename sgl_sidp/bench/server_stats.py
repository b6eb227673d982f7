"""What a running SGLang server says about itself, per DP rank: KV capacity, Prometheus counters.

Pure functions over text/JSON already fetched (no HTTP here, so they are unit-tested on samples). The sources, as
SGLang 0.5.17 writes them:

* ``GET /v1/loads``: ``{"loads": [{"dp_rank": 0, "max_total_num_tokens": N, ...}, ...]}``, one entry per DP rank
  (the schedulers' load snapshots); the most direct per-rank KV capacity.
* ``GET /server_info``: ``max_total_num_tokens`` at the top level is DP0's only (the DP controller keeps the first
  scheduler's); ``internal_states[i]["memory_usage"]["token_capacity"]`` is one per DP rank, in the order the DP
  controller gathered them (not labelled, so taken as rank order).
* The server log: every scheduler (TP rank 0 of each DP rank) logs
  ``[<time> DP<d>( TP<t>)...] max_total_num_tokens=<N>, chunked_prefill_size=...`` once at start-up; our ZeroDP
  engine logs ``sgl-sidp zerodp DP<d> TP<t>: <source|sink> KV cache <N> tokens (max_total_num_tokens)...``.
* Our launcher's and runtimes' lines in the server log: a refusal (``sgl-sidp: error:``), what ``--overlay-mode auto``
  started, the vanilla configuration a declining mode started, the threshold a Shift server ran at.
* ``GET /metrics`` (server started with ``--enable-metrics``): scheduler counters carry a ``dp_rank`` label, e.g.
  ``sglang:realtime_tokens_total{dp_rank="1",mode="decode",...}`` (tokens computed per mode, bumped every decode
  iteration by the batch size and every prefill log by the prompt tokens),
  ``sglang:forward_execution_seconds_total{category=...}`` (GPU-busy seconds) and
  ``sglang:num_retracted_requests_total`` (requests pushed back for lack of KV cache). The tokenizer-side counters
  (``sglang:generation_tokens_total``, TTFT histograms) have no ``dp_rank``.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

#: Scheduler counters read before and after a workload: (sample name, label that splits it besides dp_rank).
RANK_COUNTERS = (
    ("sglang:realtime_tokens_total", "mode"),
    ("sglang:forward_execution_seconds_total", "category"),  # from every TP rank: the mean is the replica's (below)
    ("sglang:num_retracted_requests_total", None),
    ("sglang:sidp_shift_forwards_total", "config"),  # Shift: forwards and tokens by configuration (base, shift)
    ("sglang:sidp_shift_tokens_total", "config"),
)

# "[2025-11-21 10:00:00 DP1 TP0] max_total_num_tokens=123456, chunked_prefill_size=..." (the prefix is SGLang's
# scheduler logger prefix: " DP<d>" then optional " PP<p>", " TP<t>", ...).
_SGLANG_CAPACITY = re.compile(r"^\[[^\]]*?\bDP(\d+)\b[^\]]*\]\s*max_total_num_tokens=(\d+)", re.M)
_ANY_CAPACITY = re.compile(r"max_total_num_tokens=(\d+)")
_ZERODP_CAPACITY = re.compile(r"sgl-sidp zerodp DP(\d+) TP(\d+): (source|sink) KV cache (\d+) tokens")


def capacity_from_log(log_text: str) -> dict[int, int]:
    """KV capacity (tokens) per DP rank from SGLang's start-up line ``max_total_num_tokens=N``.

    Returns:
        ``{dp_rank: tokens}``; a server without DP (no ``DP<d>`` in the prefix) gives ``{0: tokens}`` from the
        first such line; ``{}`` when the log has none yet. When a rank logged twice (a restart in the same log),
        the last line wins.
    """
    found = {int(dp): int(n) for dp, n in _SGLANG_CAPACITY.findall(log_text)}
    if not found:
        m = _ANY_CAPACITY.search(log_text)
        if m:
            found = {0: int(m.group(1))}
    return found


def zerodp_capacity_from_log(log_text: str) -> dict[int, dict]:
    """Our ZeroDP engine's KV-capacity lines, TP rank 0 only.

    Returns:
        ``{dp_rank: {"role": "source"|"sink", "kv_tokens": N}}``.
    """
    out: dict[int, dict] = {}
    for dp, tp, role, n in _ZERODP_CAPACITY.findall(log_text):
        if int(tp) == 0:
            out[int(dp)] = {"role": role, "kv_tokens": int(n)}
    return out


def capacity_from_loads(loads_json: Mapping | None) -> dict[int, int]:
    """KV capacity (tokens) per DP rank from ``GET /v1/loads`` JSON (``{}`` when absent or malformed)."""
    out: dict[int, int] = {}
    for load in (loads_json or {}).get("loads") or []:
        if isinstance(load, Mapping) and load.get("max_total_num_tokens"):
            out[int(load.get("dp_rank", 0))] = int(load["max_total_num_tokens"])
    return out


def capacity_from_server_info(info: Mapping | None) -> dict[int, int]:
    """KV capacity (tokens) per DP rank from ``GET /server_info`` JSON: ``internal_states[i].memory_usage.
    token_capacity`` taken in list order as DP ranks, else the top-level ``max_total_num_tokens`` as DP0."""
    info = info or {}
    out: dict[int, int] = {}
    for i, state in enumerate(info.get("internal_states") or []):
        cap = ((state or {}).get("memory_usage") or {}).get("token_capacity")
        if cap:
            out[i] = int(cap)
    if not out and info.get("max_total_num_tokens"):
        out[0] = int(info["max_total_num_tokens"])
    return out


def merge_capacity(sources: Mapping[str, Mapping[int, int]], order: Iterable[str]) -> dict[int, int]:
    """One KV capacity per DP rank: for each rank, the value of the first source in ``order`` that has it."""
    ranks = sorted({r for src in sources.values() for r in src})
    out: dict[int, int] = {}
    for r in ranks:
        for name in order:
            if r in (sources.get(name) or {}):
                out[r] = int(sources[name][r])
                break
    return out


#: counters every TP rank of a replica reports for itself (SGLang's device timer runs in each scheduler, and Shift's
#: runtime counts its forwards on every GPU, where SGLang's token counters come from the first TP rank alone): a
#: replica's value is their mean over its TP ranks
PER_TP_RANK = ("sglang:forward_execution_seconds_total", "sglang:sidp_shift_forwards_total",
               "sglang:sidp_shift_tokens_total")


def counters_by_rank(metrics_text: str, name: str, split: str | None = None) -> dict[tuple[int, str], float]:
    """Sum a Prometheus counter's samples per ``(dp_rank, <split label>)``.

    Args:
        metrics_text: a ``/metrics`` body (Prometheus text exposition).
        name: the sample name, ``_total`` included (``sglang:realtime_tokens_total``).
        split: a second label to keep apart (``"mode"``), or ``None`` (the key's second part is then ``""``).

    Returns:
        ``{(dp_rank, label value): value}``; samples without ``dp_rank`` count as rank 0 (a server without DP).
        Samples of other labels (model_name...) are summed; so are those of several ``tp_rank`` values, except for
        the counters in :data:`PER_TP_RANK`, whose value is the mean over the TP ranks that reported it (GPU
        seconds of the replica, not of its GPUs together).
    """
    by_tp: dict[tuple[int, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name != name:
                continue
            key = (int(s.labels.get("dp_rank", 0) or 0), s.labels.get(split, "") if split else "")
            tp = s.labels.get("tp_rank", "0") if name in PER_TP_RANK else "0"
            ranks = by_tp.setdefault(key, {})
            ranks[tp] = ranks.get(tp, 0.0) + float(s.value)
    return {key: sum(v.values()) / len(v) for key, v in by_tp.items()}


def rank_counter_snapshot(metrics_text: str) -> dict[str, dict[str, float]]:
    """All :data:`RANK_COUNTERS` of a ``/metrics`` body, JSON-friendly: ``{name: {"<dp_rank>/<label>": value}}``."""
    snap: dict[str, dict[str, float]] = {}
    for name, split in RANK_COUNTERS:
        snap[name] = {f"{dp}/{lab}": v for (dp, lab), v in sorted(counters_by_rank(metrics_text, name, split).items())}
    return snap


def counter_deltas(before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]]) -> dict:
    """``after - before`` of two :func:`rank_counter_snapshot` results, per counter and key (a key missing before
    counts as 0: Prometheus creates a labelled child on its first increment)."""
    out: dict[str, dict[str, float]] = {}
    for name, vals in after.items():
        prev = before.get(name) or {}
        out[name] = {k: v - prev.get(k, 0.0) for k, v in vals.items() if v - prev.get(k, 0.0) != 0}
    return out


def per_rank_from_deltas(deltas: Mapping[str, Mapping[str, float]]) -> dict[int, dict[str, float]]:
    """Condense :func:`counter_deltas` per DP rank.

    Returns:
        ``{dp_rank: {"decode_tokens", "prefill_compute_tokens", "prefill_cache_tokens", "busy_s", "busy_s_by",
        "retracted"}}``: tokens computed in decode iterations (= output tokens after each request's first), prompt
        tokens computed and served from the prefix cache, GPU-busy seconds over all forward categories and by
        category (SGLang's: "decode", "extend", ...; {} where the server ran no device timer), retracted requests.
    """
    out: dict[int, dict[str, float]] = {}

    def bump(rank: int, key: str, v: float) -> None:
        row = out.setdefault(
            rank,
            {"decode_tokens": 0.0, "prefill_compute_tokens": 0.0, "prefill_cache_tokens": 0.0, "busy_s": 0.0,
             "busy_s_by": {}, "retracted": 0.0},
        )
        row[key] += v

    for key, v in (deltas.get("sglang:realtime_tokens_total") or {}).items():
        rank, mode = key.split("/", 1)
        if mode in ("decode", "prefill_compute", "prefill_cache"):
            bump(int(rank), "decode_tokens" if mode == "decode" else f"{mode}_tokens", v)
    for key, v in (deltas.get("sglang:forward_execution_seconds_total") or {}).items():
        rank, category = key.split("/", 1)
        bump(int(rank), "busy_s", v)
        by = out[int(rank)]["busy_s_by"]
        by[category] = by.get(category, 0.0) + v
    for key, v in (deltas.get("sglang:num_retracted_requests_total") or {}).items():
        bump(int(key.split("/", 1)[0]), "retracted", v)
    for row in out.values():  # counts are whole numbers (Prometheus keeps floats)
        for key in ("decode_tokens", "prefill_compute_tokens", "prefill_cache_tokens", "retracted"):
            row[key] = int(round(row[key]))
    return dict(sorted(out.items()))


# ------------------------------------------------------------------ what the launcher's and our runtimes' log lines say

def launch_problem(log_text: str) -> str | None:
    """The launcher's refusal (its `sgl-sidp: error:` lines, joined), or None when it did not refuse."""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.startswith("sgl-sidp: error:")]
    return " | ".join(lines) if lines else None


def failure_lines(log_text: str, n: int = 5) -> list[str]:
    """What a failed server's log says went wrong: its sgl-sidp and error lines, else its last lines."""
    def telling(ln: str) -> bool:
        ours = "sgl-sidp" in ln and ("error" in ln.lower() or "fail" in ln.lower())
        return ours or "Error:" in ln or ln.startswith(("Error", "RuntimeError"))

    keep = [ln for ln in log_text.splitlines() if telling(ln)]
    return (keep or log_text.splitlines())[-n:]


def auto_choice(log_text: str) -> str | None:
    """The configuration `--overlay-mode auto` started (its launcher line "... auto starts NAME (predicted; why)")."""
    for ln in log_text.splitlines():
        if "--overlay-mode auto starts " in ln:
            return ln.split("--overlay-mode auto starts ", 1)[1].split()[0]
    return None


def declined_to(log_text: str) -> str | None:
    """The vanilla configuration a declining mode started instead (its launcher line "... declines: ... starting vanilla
    SGLang (NAME: ...", `Feature.declines`), or None."""
    for ln in log_text.splitlines():
        if " declines: " in ln and "starting vanilla SGLang (" in ln:
            return ln.split("starting vanilla SGLang (", 1)[1].split(":", 1)[0]
    return None


def shift_exchange_logged(log_text: str) -> str | None:
    """How a Shift server's base configuration exchanged its blocks ("overlap" or "nccl"), from the end of its TP0
    ready line ("...; exchanges by overlap"), or None: no such line (not Shift; a server before 2026-11-28, which
    always exchanged by NCCL)."""
    m = re.search(r"shift TP0: ready; .*; exchanges by (\w+)", log_text)
    return m.group(1) if m else None


def shift_threshold_logged(log_text: str) -> float | None:
    """The threshold a Shift server ran at (tokens per forward above which it runs the base configuration; inf: never),
    from its TP0 line "sgl-sidp shift TP0: ready; P=.., base SP=.. TP=.. above N tokens per forward" (`ShiftRuntime`),
    or None: no such line (not Shift, or an older server)."""
    m = re.search(r"shift TP0: ready; P=\d+, base SP=\d+ TP=\d+ above (\S+) tokens per forward", log_text)
    return float(m.group(1)) if m else None
