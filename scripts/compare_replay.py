"""Side-by-side trace replay: vanilla SGLang vs `python -m sgl_sidp.launch_server`, same flags, one run.

Starts `python -m sglang.launch_server SERVER_ARGS` and `python -m sgl_sidp.launch_server
SERVER_ARGS OURS_ARGS`, each on its own GPU of this machine at the same time (or one
after the other on one GPU with `--sequential`), replays the same traces against both
at the same time (`python -m sgl_sidp.replay`, same seeds, so the same prompts at the
same instants), and writes, under `--out`:

- `<job>/<side>/`: each replay's per-request JSONL/CSV, summary.json and plot;
- `server_<side>.log`: each server's log (start time, KV capacity, plugin lines);
- `compare.md` / `compare.json`: every key metric of both sides and the ratio ours/vanilla,
  with the exact commands.

`python -m sgl_sidp.bench.compare` runs the planner's named configurations side by side; this script is for two
launches that differ only in the flags given to ours (e.g. `--overlay-mode off` against vanilla SGLang), one GPU each.

Example (two GPUs, Qwen3-30B-A3B with random weights):
    python scripts/compare_replay.py --out benchmarks/results/replay_off_vs_vanilla --gpus 0,1 \\
      --server-args "--model-path MODEL --load-format dummy --attention-backend triton --sampling-backend pytorch" \\
      --job "azure_code=--trace TRACES/AzureLLMInferenceTrace_code.csv --duration-s 600 --compress-gaps-s 5"
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sgl_sidp.bench.batches import replay
from sgl_sidp.bench.server import ServerProcess

SIDES = ("vanilla", "ours")
LAUNCHERS = {"vanilla": "sglang.launch_server", "ours": "sgl_sidp.launch_server"}
#: (summary key, label, higher is better)
KEYS = [
    ("completed", "completed requests", True),
    ("failed", "failed requests", False),
    ("duration", "duration (s)", False),
    ("request_throughput", "request throughput (req/s)", True),
    ("input_throughput", "input throughput (tok/s)", True),
    ("output_throughput", "output throughput (tok/s)", True),
    ("mean_ttft_ms", "mean TTFT (ms)", False),
    ("median_ttft_ms", "median TTFT (ms)", False),
    ("p90_ttft_ms", "P90 TTFT (ms)", False),
    ("p99_ttft_ms", "P99 TTFT (ms)", False),
    ("mean_tpot_ms", "mean TPOT (ms)", False),
    ("median_tpot_ms", "median TPOT (ms)", False),
    ("p99_tpot_ms", "P99 TPOT (ms)", False),
    ("mean_itl_ms", "mean ITL (ms)", False),
    ("p99_itl_ms", "P99 ITL (ms)", False),
    ("mean_e2e_latency_ms", "mean E2E (ms)", False),
    ("median_e2e_latency_ms", "median E2E (ms)", False),
    ("p99_e2e_latency_ms", "P99 E2E (ms)", False),
    ("request_goodput", "goodput (req/s)", True),
]


def parse_args(argv=None) -> argparse.Namespace:
    """The script's flags (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="results folder")
    p.add_argument("--server-args", required=True, help="flags given to both servers (one shell-quoted string)")
    p.add_argument("--ours-args", default="", help="extra flags for our launcher only (e.g. --overlay-mode ...)")
    p.add_argument("--job", action="append", required=True, metavar="NAME=REPLAY_ARGS",
                   help="a replay: name and the `python -m sgl_sidp.replay` flags (repeatable)")
    p.add_argument("--gpus", default="0,1", help="GPU of vanilla,ours (default 0,1); with --sequential one GPU")
    p.add_argument("--sequential", action="store_true", help="one GPU: run vanilla first, then ours")
    p.add_argument("--port-base", type=int, default=22000,
                   help="port of the vanilla server; ours gets the next one (default: %(default)s)")
    p.add_argument("--ready-timeout-s", type=float, default=420,
                   help="seconds to wait for each server to be ready (default: %(default)s)")
    return p.parse_args(argv)


def start_server(side: str, args, gpu: str, port: int) -> ServerProcess:
    """Start one side's server ("vanilla" or "ours") on `gpu`; returns without waiting for it."""
    flags = shlex.split(args.server_args) + (shlex.split(args.ours_args) if side == "ours" else [])
    return ServerProcess(LAUNCHERS[side], flags, port, args.out / f"server_{side}.log", gpus=gpu).start()


def run_job(name: str, replay_args: str, side: str, srv: ServerProcess, out: Path) -> dict:
    """One replay against one server, as a child process (its own event loop and CPU)."""
    return replay(name, replay_args, srv.base_url, out / name / side, side)


def server_facts(srv: ServerProcess, ready_s: float) -> dict:
    """What the server's log says about its start: ready time, KV capacity, overlay line."""
    log = srv.log_text()
    tokens = re.findall(r"max_total_num_tokens=(\d+)", log)
    overlay = re.findall(r"^sgl-sidp: overlay .*$", log, re.M)
    return {"command": shlex.join(srv.command), "ready_s": round(ready_s, 1),
            "max_total_num_tokens": int(tokens[0]) if tokens else None, "overlay_line": overlay[0] if overlay else None}


def compare_table(results: dict) -> tuple[str, dict]:
    """Markdown table and JSON of both sides' metrics and ours/vanilla ratios, per job."""
    lines, ratios = [], {}
    for name, sides in results.items():
        v, o = sides["vanilla"], sides["ours"]
        lines += [f"### {name}", "", f"`{o['command']}` (ours; vanilla the same with `--tag vanilla`)", "",
                  f"requests sent: {o['window']['requests_sent']}, replay span {o['window']['replay_span_s']:.0f} s, "
                  f"prefix-cache hit rate vanilla {_pct(v)} / ours {_pct(o)}", "",
                  "| metric | vanilla | ours | ours / vanilla |", "|---|---:|---:|---:|"]
        ratios[name] = {}
        for key, label, _ in KEYS:
            a, b = v.get(key), o.get(key)
            if a is None or b is None:
                continue
            r = b / a if a else None
            ratios[name][key] = {"vanilla": a, "ours": b, "ratio": r}
            lines.append(f"| {label} | {a:.2f} | {b:.2f} | {'' if r is None else f'{r:.3f}'} |")
        lines.append("")
    return "\n".join(lines), ratios


def _pct(summary: dict) -> str:
    """The replay's prefix-cache hit rate as a percentage, or "n/a"."""
    rate = summary["cache_report"]["cache_hit_rate"]
    return "n/a" if rate is None else f"{rate:.1%}"


def main(argv=None) -> None:
    """Start both servers, replay every job against both at once, write compare.md/json."""
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [j.split("=", 1) for j in args.job]
    gpus = args.gpus.split(",")
    results: dict = {name: {} for name, _ in jobs}
    servers: dict = {}

    def serve_and_replay(sides):
        procs = {s: start_server(s, args, gpus[i % len(gpus)], args.port_base + i) for i, s in enumerate(sides)}
        try:
            for s, p in procs.items():
                servers[s] = server_facts(p, p.wait_ready(args.ready_timeout_s))
                print(f"[compare] {s} ready in {servers[s]['ready_s']} s: {servers[s]}", flush=True)
            for name, replay_args in jobs:
                with ThreadPoolExecutor(len(procs)) as pool:
                    futs = {s: pool.submit(run_job, name, replay_args, s, p, args.out) for s, p in procs.items()}
                    for s, f in futs.items():
                        results[name][s] = f.result()
                print(f"[compare] {name} done: " + ", ".join(
                    f"{s} {results[name][s]['output_throughput']:.0f} out tok/s" for s in procs), flush=True)
        finally:
            for p in procs.values():
                p.stop()

    t0 = time.time()
    if args.sequential:
        for side in SIDES:
            serve_and_replay([side])
    else:
        serve_and_replay(list(SIDES))
    table, ratios = compare_table(results)
    header = [
        "# Trace replay: sgl-sidp launcher vs vanilla SGLang, side by side", "",
        f"Command: `{shlex.join([sys.executable, 'scripts/compare_replay.py', *(argv or sys.argv[1:])])}`", "",
        f"Placement: {'one GPU, vanilla then ours' if args.sequential else f'vanilla on GPU {gpus[0]}, ours on GPU {gpus[1]}, concurrently'}; "
        f"wall time {time.time() - t0:.0f} s.", "",
        "| server | ready (s) | max_total_num_tokens | overlay line |", "|---|---:|---:|---|",
        *[f"| {s} | {f['ready_s']} | {f['max_total_num_tokens']} | {f['overlay_line'] or '-'} |" for s, f in servers.items()],
        "", *[f"- {s}: `{f['command']}`" for s, f in servers.items()], "",
    ]
    (args.out / "compare.md").write_text("\n".join(header) + "\n" + table)
    (args.out / "compare.json").write_text(json.dumps({"servers": servers, "ratios": ratios}, indent=2) + "\n")
    print("\n".join(header) + "\n" + table)


if __name__ == "__main__":
    main()
