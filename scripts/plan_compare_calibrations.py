"""Two calibrations of the same shard side by side: every timed point both have, and what the HTTP probes found.

    python scripts/plan_compare_calibrations.py A.json B.json [--names default,timed]

A and B are `plan calibrate` cache entries, bundled files or plain tables of one shard, for instance one served with SGLang's
default CUDA graphs and one with `--timed-graphs-only`. Prints a markdown table: decode steps at both contexts
(graph, eager and alone), prefills, prefills over a cached prefix, each with B's difference from A in per cent, then
the probes' numbers (request overhead, host time per request, stream rate, the prefix factor k the planner derives).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sgl_sidp.calibration.table import Calibration
from sgl_sidp.plan.steps import ShardClock

#: (Calibration field, what its keys are) of the point tables compared
TABLES = (("decode_ms", "decode step, batch {}, short context"), ("decode_ms_long", "decode step, batch {}, long context"),
          ("decode_ms_alone", "decode step alone, batch {}"), ("decode_ms_eager", "eager decode step, batch {}"),
          ("prefill_ms", "prefill of {} tokens"))


def rows(a: dict, b: dict) -> list[tuple[str, float | None, float | None, str]]:
    """(what, A's value, B's value, unit) for every point and probe number of the cache entries `a` and `b`."""
    ca, cb = Calibration.from_entry(a), Calibration.from_entry(b)
    out = []
    for field, label in TABLES:
        ta, tb = getattr(ca, field), getattr(cb, field)
        out += [(label.format(f"{x:,}"), ta[x], tb[x], "ms") for x in sorted(set(ta) & set(tb))]
    pa = {(n, p): ms for n, p, ms in ca.prefill_prefix_ms}
    pb = {(n, p): ms for n, p, ms in cb.prefill_prefix_ms}
    out += [(f"prefill of {n:,} tokens over {p:,} cached", pa[n, p], pb[n, p], "ms") for n, p in sorted(set(pa) & set(pb))]

    def get(d: dict, *path):
        for k in path:
            d = d.get(k) if isinstance(d, dict) else None
        return d

    out += [("request overhead", get(a, "request_overhead_ms", "median_ms"), get(b, "request_overhead_ms", "median_ms"), "ms"),
            ("host time per running request", ca.host_ms_per_request, cb.host_ms_per_request, "ms"),
            ("streamed tokens delivered", get(a, "stream", "delivered_tokens_per_s"),
             get(b, "stream", "delivered_tokens_per_s"), "tok/s"),
            ("prefix factor k", ShardClock(ca, 0).prefix_factor, ShardClock(cb, 0).prefix_factor, ""),
            ("seconds timing forwards", ca.measure_s, cb.measure_s, "s")]
    return out


def table(a: dict, b: dict, names: tuple[str, str]) -> str:
    """The markdown table of `rows`."""
    lines = [f"| number | unit | {names[0]} | {names[1]} | difference |", "|---|---|---:|---:|---:|"]
    for what, x, y, unit in rows(a, b):
        diff = f"{100 * (y / x - 1):+.1f}%" if x and y is not None else ""
        fmt = (lambda v: "" if v is None else f"{v:.4f}" if abs(v) < 0.1 else f"{v:,.2f}" if abs(v) < 100
               else f"{v:,.1f}")
        lines.append(f"| {what} | {unit} | {fmt(x)} | {fmt(y)} | {diff} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="Prints a markdown table; each difference is B against A.")
    ap.add_argument("a", type=Path, help="the first calibration (a plan calibrate cache entry or bundled file)")
    ap.add_argument("b", type=Path, help="the second calibration, of the same shard")
    ap.add_argument("--names", default="A,B", help="the two columns' names, comma-separated (default: A,B)")
    args = ap.parse_args(argv)
    entries = []
    for p in (args.a, args.b):
        try:
            entries.append(json.loads(p.read_text()))
        except (OSError, ValueError) as e:
            ap.exit(2, f"plan_compare_calibrations: cannot read {p}: {e}\n")
    (a, b), (ca, cb) = entries, [Calibration.from_entry(e) for e in entries]
    if ca.model != cb.model:
        ap.exit(2, f"plan_compare_calibrations: not the same shard: {ca.model!r} and {cb.model!r}\n")
    names = tuple(args.names.split(",", 1)) if "," in args.names else ("A", "B")
    print(f"{ca.model} on {ca.gpu}\n")
    print(table(a, b, names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
