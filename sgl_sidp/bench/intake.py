"""When a burst's requests reached SGLang's schedulers and when their prefill started, from SGLang's own per-request
time stats.

A server started with `--enable-request-time-stats-logging` logs one line per finished request from its scheduler
(SGLang 0.5.17 `Req.log_time_stats`, `ReqTimeStats.convert_to_duration`):

    [2026-11-28 06:53:05 DP1] ReqTimeStats(rid=..., input_len=2048, cached_input_len=0, output_len=32, attempts=0,
    type=unified): queue_duration=2.10ms, forward_duration=4210.33ms, entry_time=1795848784.606

`entry_time` is when the scheduler put the request in its waiting queue (wall clock, s; `wait_queue_entry_time`),
`queue_duration` from there to the start of its first prefill forward (`forward_entry_time`, the first chunk's).
The prefix names the scheduler: `TP0` without DP, `DP<d>` (or `DP<d> TP0`) with it; only each DP rank's first TP
rank logs.

Why: on 4 x H200 a TP group's first token of a burst came 0.2-0.4 s after the simulation's, in a second burst as in
the first (`burst_twice_4gpu_h200`). These lines tell a late intake (the scheduler took the requests in late) from
a late forward (taken in on time, run late). Usage, on a `bench.compare` model folder whose servers ran with the
flag (`scripts/gpu_runs.sh burst_intake`):

    python -m sgl_sidp.bench.intake benchmarks/results/multi_gpu/burst_intake_4gpu_h200/Qwen3-32B
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections import Counter
from pathlib import Path

_LINE = re.compile(
    r"^\[[^\]]*?\d\d:\d\d:\d\d(?P<who>[^\]]*)\] ReqTimeStats\(rid=(?P<rid>[^,]+), input_len=(?P<inp>\d+),"
    r".*?output_len=(?P<out>\d+).*?\): queue_duration=(?P<queue>[\d.]+)ms, forward_duration=(?P<fwd>[\d.]+)ms, "
    r"entry_time=(?P<entry>[\d.]+)", re.M)


@dataclasses.dataclass(frozen=True)
class RequestTimes:
    """One request's `ReqTimeStats` line.

    scheduler: "DP<d>" with DP, else "TP<t>" (the log prefix); entry_s: when the scheduler queued it (wall clock,
    s); queue_ms: from there to its first prefill forward; forward_ms: from that forward to its completion."""

    scheduler: str
    rid: str
    input_len: int
    output_len: int
    entry_s: float
    queue_ms: float
    forward_ms: float

    @property
    def forward_entry_s(self) -> float:
        """When its first prefill forward started (wall clock, s)."""
        return self.entry_s + self.queue_ms / 1e3


def request_times(log_text: str) -> list[RequestTimes]:
    """Every `ReqTimeStats` line of a server log (`--enable-request-time-stats-logging`), in log order; [] where the
    server ran without the flag."""
    out = []
    for m in _LINE.finditer(log_text):
        who = m["who"].split()
        sched = next((w for w in who if w.startswith("DP")), who[0] if who else "TP0")
        out.append(RequestTimes(sched, m["rid"], int(m["inp"]), int(m["out"]), float(m["entry"]),
                                float(m["queue"]), float(m["fwd"])))
    return out


def bursts(times: list[RequestTimes], size: int, input_len: int, output_len: int) -> list[list[RequestTimes]]:
    """The bursts of `size` requests of (`input_len`, `output_len`) tokens in `times`, in the order the schedulers
    took them in: consecutive groups of `size` by entry time (the warm-up's requests have other output lengths);
    a last group smaller than `size` (a burst cut short) is dropped."""
    mine = sorted((t for t in times if t.input_len == input_len and t.output_len == output_len),
                  key=lambda t: t.entry_s)
    return [mine[i:i + size] for i in range(0, len(mine) - size + 1, size)]


def _moments(values_ms: list[float]) -> str:
    """"0 ms: 1, 59 ms: 37, ..." for times rounded to the ms."""
    return ", ".join(f"{ms:,} ms: {n}" for ms, n in sorted(Counter(round(v) for v in values_ms).items()))


def intake_lines(burst: list[RequestTimes]) -> list[str]:
    """Markdown table: per scheduler, when it took the burst's requests in and when their first prefill forwards
    started (ms after the burst's first entry on any scheduler: how many at each moment).

    Raises:
        ValueError: an empty burst.
    """
    if not burst:
        raise ValueError("an empty burst")
    t0 = min(t.entry_s for t in burst)
    out = ["| scheduler | requests | taken in (ms: requests) | first prefill forward started (ms: requests) |",
           "|---|---:|---|---|"]
    for sched in sorted({t.scheduler for t in burst}):
        own = [t for t in burst if t.scheduler == sched]
        out.append(f"| {sched} | {len(own)} | {_moments([(t.entry_s - t0) * 1e3 for t in own])} | "
                   f"{_moments([(t.forward_entry_s - t0) * 1e3 for t in own])} |")
    return out


def folder_lines(folder: Path) -> list[str]:
    """`intake_lines` of every burst of every configuration in a `bench.compare` model folder (OUT/<model>: each
    configuration's JSON with its "burst" or else "profile" spec, its server log in logs/<configuration>.log.gz); a
    configuration whose log has no `ReqTimeStats` line says so."""
    from sgl_sidp.bench.compare import triple
    from sgl_sidp.bench.compare_report import compare_results, server_log

    out = []
    for res in compare_results(folder):
        spec = (res.get("burst") or {}).get("spec") or (res.get("profile") or {}).get("spec")
        if not spec:
            continue
        name = res["config"]
        s, i, o = triple(spec)
        found = bursts(request_times(server_log(folder, name) or ""), s, i, o)
        out += ["", f"### {name}, burst {s} x ({i} in, {o} out)", ""]
        if not found:
            out.append("no ReqTimeStats lines of that burst (a server run without --enable-request-time-stats-logging)")
        for k, b in enumerate(found):
            label = "the measured burst" if k == len(found) - 1 else f"burst {k + 1} of {len(found)} (before it)"
            out += [f"{label}, {max(t.entry_s for t in b) - min(t.entry_s for t in b):.3f} s from the first request "
                    "taken in to the last:", ""] + intake_lines(b) + [""]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sgl_sidp.bench.intake", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="a bench.compare model folder (OUT/<model>)")
    a = p.parse_args(argv)
    if not a.folder.is_dir():
        print(f"bench.intake: {a.folder}: not a folder", file=sys.stderr)
        return 2
    print("\n".join(folder_lines(a.folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
