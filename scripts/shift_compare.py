"""Shift Parallelism against vanilla SGLang on the same GPUs, one configuration after another: KV capacity, TTFT,
burst throughput, low-traffic TPOT and trace replays, as JSON files and one markdown table.

Configurations (`--configs`, each started once on `--gpus`, measured, stopped):

  tp        python -m sglang.launch_server  --tp-size P
  dp        python -m sglang.launch_server  --dp-size P
  dp_attn   python -m sglang.launch_server  --tp-size P --dp-size P --enable-dp-attention
  shift     python -m sgl_sidp.launch_server --tp-size P --overlay-mode shift [--shift-threshold T]
  shift_sp1 python -m sgl_sidp.launch_server --tp-size P --overlay-mode shift --shift-sp 1 (the wiring; any P)
  tp_eager_prefill, shift_eager_prefill: tp and shift with --disable-prefill-cuda-graph (what SGLang's breakable
            prefill graphs are worth, in either)

with P = the number of `--gpus`, all with --model-path M --load-format dummy --attention-backend triton
--sampling-backend pytorch --enable-metrics --tokenizer-path sgl_sidp/default_model. For each:

1. KV capacity (SGLang's max_total_num_tokens lines).
2. `--ttft L,...`: TTFT of single prompts of L random tokens (4 output tokens), each alone, `--repeats` prompts per
   length (distinct, so no radix-cache hit), median; a short warm-up request first.
3. `--burst N+P+O`: N requests of P prompt and O forced output tokens all at once: input+output tokens/s, output
   tokens/s, duration (size N so that it fits the smallest KV cache compared, and state it).
4. `--low-traffic C+P+O`: C requests at once, P + O tokens: median TPOT (low traffic: the shift configuration).
5. `--trace NAME=REPLAY_ARGS` (repeatable): `python -m sgl_sidp.replay REPLAY_ARGS` against the server (e.g. the
   Azure code trace and the Mooncake conversation trace): its summary (TTFT/TPOT percentiles) and per-request files.
For the shift configurations each item also records the forwards per configuration (base/shift) from SGLang's
/metrics (`sglang:sidp_shift_forwards_total`).

Writes `<out-dir>/<config>.json` (rewritten after each item) and the server log; `--report` merges the JSON files
of `--out-dir` into one markdown table with ratios against `tp` and `dp` (so configurations can run in separate
device calls).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import time
from pathlib import Path

import numpy as np

from sgl_sidp.bench.batches import metrics_text, prompts, replay, run_batch

CONFIGS = {
    "tp": ("sglang.launch_server", lambda p: ["--tp-size", str(p)]),
    "dp": ("sglang.launch_server", lambda p: ["--dp-size", str(p)]),
    "shift": ("sgl_sidp.launch_server", lambda p: ["--tp-size", str(p), "--overlay-mode", "shift"]),
    "shift_sp1": ("sgl_sidp.launch_server", lambda p: ["--tp-size", str(p), "--overlay-mode", "shift", "--shift-sp", "1"]),
    "dp_attn": ("sglang.launch_server", lambda p: ["--tp-size", str(p), "--dp-size", str(p), "--enable-dp-attention"]),
    "tp_eager_prefill": ("sglang.launch_server", lambda p: ["--tp-size", str(p), "--disable-prefill-cuda-graph"]),
    "shift_eager_prefill": ("sgl_sidp.launch_server",
                            lambda p: ["--tp-size", str(p), "--overlay-mode", "shift", "--disable-prefill-cuda-graph"]),
}
FORWARDS = "sglang:sidp_shift_forwards_total"


def triple(text: str) -> tuple[int, int, int]:
    """"N+P+O" -> (N, P, O)."""
    n, p, o = (int(x) for x in text.split("+"))
    return n, p, o


def forwards_by_config(before: str, after: str) -> dict[str, float]:
    """Forwards per Shift configuration ("base", "shift") between two /metrics bodies (summed over TP ranks / P)."""
    from sgl_sidp.bench.server_stats import counters_by_rank

    def total(text):
        out = {}
        for (_, cfg), v in counters_by_rank(text, FORWARDS, "config").items():
            out[cfg] = out.get(cfg, 0.0) + v
        return out

    a, b = total(before), total(after)
    return {k: b.get(k, 0.0) - a.get(k, 0.0) for k in sorted(b)}


def command(name: str, a) -> tuple[str, list[str]]:
    """(launcher module, flags) of configuration `name` under the script's arguments."""
    launcher, extra = CONFIGS[name]
    p = len(a.gpus.split(","))
    flags = ["--model-path", a.model, "--load-format", "dummy", "--attention-backend", "triton",
             "--sampling-backend", "pytorch", "--enable-metrics", "--tokenizer-path", "sgl_sidp/default_model",
             *extra(p)]
    if name.startswith("shift") and a.threshold is not None:
        flags += ["--shift-threshold", str(a.threshold)]
    if a.mem_fraction_static:
        flags += ["--mem-fraction-static", str(a.mem_fraction_static)]
    return launcher, flags + shlex.split(a.extra_args)


def run_config(name: str, a) -> dict:
    from sgl_sidp.bench.metrics import compute_metrics
    from sgl_sidp.bench.server import ServerProcess

    out_dir = Path(a.out_dir)
    launcher, flags = command(name, a)
    result = {"config": name, "command": None, "kv_tokens": [], "ttft_ms": {}, "burst": {}, "low_traffic": {},
              "traces": {}, "forwards": {}}
    path = out_dir / f"{name}.json"
    srv = ServerProcess(launcher, flags, port=a.port, log_path=out_dir / f"server_{name}.log", gpus=a.gpus)
    result["command"] = " ".join(srv.command)
    shift = name.startswith("shift")

    def save():
        path.write_text(json.dumps(result, indent=1))

    def measured(key, fn):
        before = metrics_text(srv.base_url) if shift else ""
        result[key] = fn()
        if shift:
            result["forwards"][key] = forwards_by_config(before, metrics_text(srv.base_url))
        save()

    with srv:
        deadline = time.time() + 240
        while "The server is fired up" not in srv.log_text() and time.time() < deadline:
            time.sleep(1)
        result["kv_tokens"] = [int(x) for x in re.findall(r"max_total_num_tokens=(\d+)", srv.log_text())]
        save()
        run_batch(srv.base_url, [(prompts(1, 64, 0)[0], 4, None)])  # warm-up

        def ttft():
            out = {}
            for length in a.ttft:
                vals = []
                for ids in prompts(a.repeats, length, length):
                    o = run_batch(srv.base_url, [(ids, 4, None)])[0][0]
                    if o.success:
                        vals.append(o.ttft * 1e3)
                out[str(length)] = float(np.median(vals)) if vals else None
            return out

        def batch(spec, seed):
            n, p, o = triple(spec)
            outs, seconds = run_batch(srv.base_url, [(ids, o, None) for ids in prompts(n, p, seed)])
            m = compute_metrics(outs, seconds)
            return {"requests": n, "seconds": seconds, "total_tok_s": m["total_throughput"], "output_tok_s": m["output_throughput"],
                    "median_ttft_ms": m["median_ttft_ms"], "median_tpot_ms": m["median_tpot_ms"], "failed": m["failed"]}

        if a.ttft:
            measured("ttft_ms", ttft)
        if a.burst:
            measured("burst", lambda: batch(a.burst, 7))
        if a.low_traffic:
            measured("low_traffic", lambda: batch(a.low_traffic, 8))
        for job in a.trace:
            tname, args = job.split("=", 1)
            before = metrics_text(srv.base_url) if shift else ""
            summary = replay(tname, args, srv.base_url, out_dir / tname / name, name)
            keep = {k: summary.get(k) for k in ("completed", "failed", "duration", "output_throughput", "median_ttft_ms",
                                                 "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")}
            if shift:
                result["forwards"][tname] = forwards_by_config(before, metrics_text(srv.base_url))
            result["traces"][tname] = keep
            save()
    return result


def report(out_dir: Path) -> str:
    """One markdown table from every `<config>.json` in `out_dir`, ratios against `tp` and `dp` where they ran
    (TTFT and TPOT: lower is better, so a ratio below 1 is a gain)."""
    res = {p.stem: json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json")) if p.stem in CONFIGS}
    rows = [("KV tokens", lambda r: sum(r["kv_tokens"]) if r["kv_tokens"] else None, "{:,.0f}")]
    for length in sorted({k for r in res.values() for k in r["ttft_ms"]}, key=int):
        rows.append((f"TTFT ms, {int(length):,}-token prompt", lambda r, k=length: r["ttft_ms"].get(k), "{:.0f}"))
    rows += [("burst tok/s (in+out)", lambda r: r["burst"].get("total_tok_s"), "{:,.0f}"),
             ("low-traffic median TPOT ms", lambda r: r["low_traffic"].get("median_tpot_ms"), "{:.2f}")]
    for t in sorted({k for r in res.values() for k in r["traces"]}):
        rows += [(f"{t}: median TTFT ms", lambda r, t=t: r["traces"].get(t, {}).get("median_ttft_ms"), "{:.0f}"),
                 (f"{t}: median TPOT ms", lambda r, t=t: r["traces"].get(t, {}).get("median_tpot_ms"), "{:.2f}")]
    names = list(res)
    for item in sorted({k for r in res.values() for k in r.get("forwards", {})}):
        rows.append((f"{item}: forwards base / shift", lambda r, i=item: r.get("forwards", {}).get(i), None))
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, get, fmt in rows:
        cells = []
        for n in names:
            v = get(res[n])
            if fmt is None:  # forwards per configuration
                cells.append("-" if not v else f"{v.get('base', 0):.0f} / {v.get('shift', 0):.0f}")
                continue
            ratios = [f"{v / get(res[ref]):.2f}x {ref}" for ref in ("tp", "dp")
                      if ref in res and ref != n and v and get(res[ref])]
            cells.append("-" if v is None else fmt.format(v) + (f" ({', '.join(ratios)})" if ratios else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(out_dir: Path) -> None:
    """`compare.png` beside `compare.md`: burst throughput, TTFT per prompt length, low-traffic and trace TPOT."""
    from sgl_sidp.bench.report import plot_configs

    res = {p.stem: json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json")) if p.stem in CONFIGS}
    metrics = {"burst tok/s (in+out)": {n: r["burst"].get("total_tok_s") for n, r in res.items()}}
    for length in sorted({k for r in res.values() for k in r["ttft_ms"]}, key=int):
        metrics[f"TTFT ms, {int(length):,}-token prompt"] = {n: r["ttft_ms"].get(length) for n, r in res.items()}
    metrics["low-traffic TPOT ms"] = {n: r["low_traffic"].get("median_tpot_ms") for n, r in res.items()}
    for t in sorted({k for r in res.values() for k in r["traces"]}):
        metrics[f"{t}: median TPOT ms"] = {n: r["traces"].get(t, {}).get("median_tpot_ms") for n, r in res.items()}
    plot_configs(out_dir / "compare.png", metrics, f"measured side by side ({out_dir.name})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=".gpu/models/Qwen3-32B",
                    help="--model-path of every server (default: %(default)s)")
    ap.add_argument("--configs", default="tp,dp,shift",
                    help=f"comma-separated configurations to run, of {', '.join(CONFIGS)} (default: %(default)s)")
    ap.add_argument("--out-dir", required=True, help="folder of the <config>.json files, server logs and compare.md")
    ap.add_argument("--gpus", default="0,1",
                    help="GPUs every configuration runs on; P = their number (default: %(default)s)")
    ap.add_argument("--port", type=int, default=26000, help="the server's port (default: %(default)s)")
    ap.add_argument("--mem-fraction-static", type=float, default=None,
                    help="SGLang's --mem-fraction-static (default: SGLang's)")
    ap.add_argument("--threshold", type=int, default=None, help="--shift-threshold of the shift configurations")
    ap.add_argument("--extra-args", default="", help="more flags for every configuration (one shell-quoted string)")
    ap.add_argument("--ttft", type=lambda s: [int(x) for x in s.split(",") if x], default=[], metavar="L,...",
                    help="prompt lengths whose single-request TTFT is measured (default: none)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="prompts per --ttft length; the median is kept (default: %(default)s)")
    ap.add_argument("--burst", default=None, metavar="N+P+O",
                    help="N requests of P prompt and O forced output tokens, all at once: tokens/s and duration")
    ap.add_argument("--low-traffic", default=None, metavar="C+P+O",
                    help="C requests at once of P prompt and O output tokens: median TPOT")
    ap.add_argument("--trace", action="append", default=[], metavar="NAME=REPLAY_ARGS",
                    help="a trace replay: NAME and the arguments of `python -m sgl_sidp.replay` (repeatable)")
    ap.add_argument("--report", action="store_true", help="only merge the JSON files in --out-dir into a table")
    a = ap.parse_args(argv)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not a.report:
        bad = [n for n in a.configs.split(",") if n not in CONFIGS]
        if bad:
            raise SystemExit(f"unknown configuration {bad[0]!r}; choose from {', '.join(CONFIGS)}")
        for spec in filter(None, (a.burst, a.low_traffic)):
            try:
                triple(spec)
            except ValueError:
                raise SystemExit(f"{spec!r} is not N+P+O (three integers)") from None
        bad = [t for t in a.trace if "=" not in t]
        if bad:
            raise SystemExit(f"--trace {bad[0]!r} is not NAME=REPLAY_ARGS")
        for name in a.configs.split(","):
            run_config(name, a)
    table = report(out)
    (out / "compare.md").write_text(table + "\n")
    plot(out)
    print(table)


if __name__ == "__main__":
    main()
