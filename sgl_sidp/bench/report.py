"""Replay outputs: per-request JSONL/CSV, ``summary.json``, the bench_serving-style printout, and the plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Sequence

# Per-request columns, in file order. ``itl_ms`` (a list) goes to the JSONL only.
REQUEST_COLUMNS = (
    "id",
    "arrival_s",
    "target_send_s",
    "actual_send_s",
    "dispatch_lag_ms",
    "input_len",
    "output_len_requested",
    "output_len_received",
    "cached_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "success",
    "error",
)
REQUESTS_JSONL = "requests.jsonl"
REQUESTS_CSV = "requests.csv"
SUMMARY_JSON = "summary.json"
PLOT_PNG = "latency_vs_arrival.png"


def write_request_files(out_dir: Path, rows: Sequence[dict]) -> tuple[Path, Path]:
    """Write ``requests.jsonl`` (all fields, ``itl_ms`` included) and ``requests.csv`` (``REQUEST_COLUMNS``).

    Args:
        rows: one dict per request with the keys of ``REQUEST_COLUMNS`` plus ``itl_ms``.

    Returns:
        The paths of the JSONL and CSV files.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl, csv_path = out_dir / REQUESTS_JSONL, out_dir / REQUESTS_CSV
    with jsonl.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=REQUEST_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return jsonl, csv_path


def read_jsonl(path: Path) -> list[dict] | None:
    """The rows of a JSONL file at `path`, or of its gzipped copy `path` + ".gz" (as `bench.compare` keeps them), in
    file order; None where neither is there."""
    import gzip

    for p, opener in ((path, open), (path.with_name(path.name + ".gz"), gzip.open)):
        if p.is_file():
            with opener(p, "rt") as f:
                return [json.loads(line) for line in f if line.strip()]
    return None


def write_summary(out_dir: Path, summary: dict) -> Path:
    """Write ``summary.json`` (indented, keys in insertion order) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / SUMMARY_JSON
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def _line(label: str, value, fmt: str = "") -> str:
    # bench_serving prints "{:<40} {:<10}" (or {:<10.2f}) rows.
    return "{:<40} {:<10}".format(label, "n/a" if value is None else format(value, fmt))


def format_report(summary: dict) -> str:
    """The run's report in ``sglang.bench_serving``'s layout (its rows, labels and order), with rows for the trace,
    failures, goodput, prefix-cache hits and dispatch lag added. Returns the text (no trailing newline)."""
    s, w, lag = summary, summary["window"], summary["dispatch_lag"]
    cache = s["cache_report"]
    out = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    out += [
        _line("Backend:", s["backend"]),
        _line("Trace:", f"{s['trace']['name']} ({s['trace']['format']})"),
        _line("Trace window (s):", f"[{w['start_s']:g}, {w['end_s']:g})"),
        _line("Time scale:", f"{w['time_scale']:g}"),
        _line("Idle gaps capped at (s):", "not set" if w["compress_gaps_s"] is None else f"{w['compress_gaps_s']:g}"),
        _line("Traffic request rate:", "trace"),
        _line("Max request concurrency:", s["max_concurrency"] or "not set"),
        _line("Requests sent:", w["requests_sent"]),
        _line("Skipped (over max context):", w["skipped_context"]),
        _line("Truncated (over max context):", w["truncated_context"]),
        _line("Successful requests:", s["completed"]),
        _line("Failed requests:", s["failed"]),
        _line("Benchmark duration (s):", s["duration"], ".2f"),
        _line("Total input tokens:", s["total_input_tokens"]),
        _line("Total generated tokens:", s["total_output_tokens"]),
        _line("Request throughput (req/s):", s["request_throughput"], ".2f"),
    ]
    if s["request_goodput"] is not None:
        out.append(_line("Request goodput (req/s):", s["request_goodput"], ".2f"))
    out += [
        _line("Input token throughput (tok/s):", s["input_throughput"], ".2f"),
        _line("Output token throughput (tok/s):", s["output_throughput"], ".2f"),
        _line("Peak output token throughput (tok/s):", s["max_output_tokens_per_s"], ".2f"),
        _line("Peak concurrent requests:", s["max_concurrent_requests"]),
        _line("Total token throughput (tok/s):", s["total_throughput"], ".2f"),
        _line("Concurrency:", s["concurrency"], ".2f"),
    ]
    sections = (
        ("End-to-End Latency", "e2e_latency", "E2E Latency"),
        ("Time to First Token", "ttft", "TTFT"),
        ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"),
        ("Inter-Token Latency", "itl", "ITL"),
    )
    for title, key, label in sections:
        out.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        for stat, name in (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p95", "P95"), ("p99", "P99")):
            out.append(_line(f"{name} {label} (ms):", s[f"{stat}_{key}_ms"], ".2f"))
    out.append(_line("Max ITL (ms):", s["max_itl_ms"], ".2f"))
    out.append("{s:{c}^{n}}".format(s="Cache Hit Details", n=50, c="-"))
    out.append(_line("Total prompt tokens:", cache["total_prompt_tokens"]))
    out.append(_line("Total cached tokens:", cache["total_cached_tokens"]))
    rate = cache["cache_hit_rate"]
    out.append("{:<40} {}".format("Cache hit rate:", "n/a (not reported)" if rate is None else f"{rate * 100:.1f}%"))
    out.append("{s:{c}^{n}}".format(s="Dispatch Lag (actual - target send)", n=50, c="-"))
    for stat, name in (("mean", "Mean"), ("median", "Median"), ("p99", "P99"), ("max", "Max")):
        out.append(_line(f"{name} dispatch lag (ms):", lag[f"{stat}_dispatch_lag_ms"], ".2f"))
    out.append("=" * 50)
    return "\n".join(out)


def plot_requests(path: Path, rows: Sequence[dict], title: str = "") -> Path:
    """Plot TTFT, TPOT and E2E of every successful request against its arrival (target send) time in the replay:
    three stacked panels sharing the x axis, log-scale y where the values are positive (as in the Shift Parallelism
    paper's trace figures). Writes a PNG with matplotlib's Agg backend and returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["success"]]
    panels = (("ttft_ms", "TTFT (s)", 1e-3), ("tpot_ms", "TPOT (ms)", 1.0), ("e2e_ms", "E2E latency (s)", 1e-3))
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True, constrained_layout=True)
    for ax, (key, label, scale) in zip(axes, panels):
        pts = [(r["target_send_s"], r[key] * scale) for r in ok if r[key] is not None]
        if pts:
            x, y = zip(*pts)
            ax.scatter(x, y, s=4, alpha=0.6, linewidths=0)
            if min(y) > 0:
                ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[-1].set_xlabel("arrival time in the replay (s)")
    failed = len(rows) - len(ok)
    axes[0].set_title(f"{title}  ({len(ok)} ok, {failed} failed)" if title else f"{len(ok)} ok, {failed} failed")
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return path


PNG_COLORS = 64  # a palette this size keeps these plots' lines and markers, at about a third of the RGBA file


def save_png(fig, path: Path, dpi: int) -> None:
    """Write matplotlib figure `fig` to `path` as a palette PNG of `PNG_COLORS` colours (Pillow, matplotlib's own
    dependency): the committed results carry dozens of these plots, and a device call carries the whole tree."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    buf.seek(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.open(buf).convert("RGB").quantize(colors=PNG_COLORS).save(path, optimize=True)


def plot_configs(path: Path, metrics: dict[str, dict[str, float]], title: str = "") -> Path | None:
    """One horizontal bar panel per metric (`metrics`: metric label -> configuration -> value, the unit in the
    label), the configurations in the same order in every panel and each bar labelled with its value: the
    comparison scripts' side-by-side picture. Writes a PNG (matplotlib, Agg) and returns its path; None when no
    metric has a value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = {m: {c: v for c, v in by.items() if v is not None} for m, by in metrics.items()}
    metrics = {m: by for m, by in metrics.items() if by}
    if not metrics:
        return None
    configs = list(dict.fromkeys(c for by in metrics.values() for c in by))
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.6 * len(metrics) + 1, 0.45 * len(configs) + 1.6),
                             sharey=True, squeeze=False, constrained_layout=True)
    for ax, (label, by) in zip(axes[0], metrics.items()):
        vals = [by.get(c, 0.0) for c in configs]
        bars = ax.barh(configs, vals, color="tab:blue")
        ax.bar_label(bars, labels=[(f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}") if c in by else "-"
                                   for c, v in zip(configs, vals)], fontsize=8)
        ax.set_title(label, fontsize=9)
        ax.invert_yaxis()
        ax.margins(x=0.25)
    if title:
        fig.suptitle(title)
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path
