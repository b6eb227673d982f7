"""SiDP against vanilla SGLang on the same GPUs, one configuration after another: KV capacity, decode step time
against batch size, and offline-job throughput, as JSON files and one markdown table.

Configurations (`--configs`, each started once on GPUs `--gpus`, run, stopped), for D = `--dp` replicas of T = `--tp`
GPUs (default D = 2, T = 1):

  dp                 python -m sglang.launch_server  --dp-size D --tp-size T
  dp_attn            python -m sglang.launch_server  --tp-size D*T --dp-size D --enable-dp-attention
  tp                 python -m sglang.launch_server  --tp-size D*T
  sidp_was           python -m sgl_sidp.launch_server --dp-size D --tp-size T --overlay-mode sidp --sidp-service was
  sidp_was_unshifted the same with --sidp-fetch-order forward (peak shifting off, paper Fig. 10)
  sidp_cas           python -m sgl_sidp.launch_server --dp-size D --tp-size T --overlay-mode sidp --sidp-service cas
  sidp_auto          ... --sidp-service auto --sidp-b-th B_th
  tp1                python -m sglang.launch_server  (one GPU: a baseline, or a dry run of this script with --gpus 0)

all with --model-path M --load-format dummy --attention-backend triton --sampling-backend pytorch --enable-metrics
--tokenizer-path sgl_sidp/default_model [--mem-fraction-static X]. For each:

1. KV capacity per DP rank (SGLang's max_total_num_tokens lines).
2. `--step-batches B,...` (iteration time vs batch, paper Fig. 11): B requests per DP rank (DP configurations:
   B pinned to each DP rank with routed_dp_rank; tp: D x B), 256-token random prompts, 64 forced output tokens, all at
   once; the step is the median inter-token latency over every request.
3. `--jobs P+O,...` (offline jobs, paper §5): N requests of P random prompt tokens and O forced output tokens, all
   submitted at once and run to completion, N = min(--max-requests, ceil(1.2 x the configuration's KV tokens /
   (P + O))) so that the KV cache is the limit (`--requests N` fixes N for every configuration instead): output
   tokens/s, job completion time, TTFT/TPOT.

B_th of sidp_auto: `--b-th`, else the crossover of this out-dir's sidp_was and sidp_cas step sweeps (the smallest
batch at which a WaS step is no slower than a CaS step; `crossover_batch`), so run those two first. For the SiDP
configurations each job also records the share of forwards per mode (SiDP's `sglang:sidp_sidp_forwards` counter,
paper Fig. 15).

Writes `<out-dir>/<config>.json` (rewritten after each step) and the server log; `--report` merges every
`<config>.json` in `--out-dir` into one markdown table with ratios against dp and tp (so the configurations can be
run in separate commands, each within a device call's limit).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from sgl_sidp.bench.batches import metrics_text, prompts, run_batch, spread

SIDP = "sgl_sidp.launch_server"
CONFIGS = {  # name -> (launcher, flags for D replicas of T GPUs)
    "dp": ("sglang.launch_server", lambda d, t: ["--dp-size", str(d), "--tp-size", str(t)]),
    "dp_attn": ("sglang.launch_server", lambda d, t: ["--tp-size", str(d * t), "--dp-size", str(d), "--enable-dp-attention"]),
    "tp": ("sglang.launch_server", lambda d, t: ["--tp-size", str(d * t)]),
    "sidp_was": (SIDP, lambda d, t: ["--dp-size", str(d), "--tp-size", str(t), "--overlay-mode", "sidp", "--sidp-service", "was"]),
    "sidp_was_unshifted": (SIDP, lambda d, t: ["--dp-size", str(d), "--tp-size", str(t), "--overlay-mode", "sidp",
                                               "--sidp-service", "was", "--sidp-fetch-order", "forward"]),
    "sidp_cas": (SIDP, lambda d, t: ["--dp-size", str(d), "--tp-size", str(t), "--overlay-mode", "sidp", "--sidp-service", "cas"]),
    "sidp_auto": (SIDP, lambda d, t: ["--dp-size", str(d), "--tp-size", str(t), "--overlay-mode", "sidp", "--sidp-service", "auto"]),
    "tp1": ("sglang.launch_server", lambda d, t: []),  # one GPU: a baseline, and a dry run of this script (--gpus 0)
}


def dp_ranks(name: str, d: int) -> int:
    """DP ranks of configuration `name` (requests are pinned round robin to them; 1: not pinned)."""
    return 1 if name in ("tp", "tp1") else d


#: SiDP's per-mode forward counter (sgl_sidp.sidp.runtime.SiDPMetrics), as /metrics exposes it
FORWARDS = "sglang:sidp_sidp_forwards_total"


def crossover_batch(was: dict, cas: dict) -> int | None:
    """The smallest batch B of the `steps` of two result files at which the WaS step is no slower than the CaS step,
    i.e. B_th in tokens per rank of a decode iteration; None when one sweep is missing or WaS never wins."""
    both = sorted(int(b) for b in set(was.get("steps", {})) & set(cas.get("steps", {}))
                  if was["steps"][b].get("step_ms") and cas["steps"][b].get("step_ms"))
    return next((b for b in both if was["steps"][str(b)]["step_ms"] <= cas["steps"][str(b)]["step_ms"]), None)


def auto_b_th(a) -> int:
    """B_th for sidp_auto: `--b-th`, else the measured crossover in `--out-dir` (see `crossover_batch`).

    Raises:
        SystemExit: neither is there (one line, before any server starts).
    """
    if a.b_th:
        return a.b_th
    out = Path(a.out_dir)
    files = [out / "sidp_was.json", out / "sidp_cas.json"]
    if not all(f.is_file() for f in files):
        raise SystemExit(f"sidp_auto needs --b-th or the step sweeps of sidp_was and sidp_cas in {out} (run them first)")
    b = crossover_batch(*(json.loads(f.read_text()) for f in files))
    if b is None:
        raise SystemExit(f"sidp_auto: WaS is never faster than CaS in the step sweeps of {out}: pass --b-th")
    return b


def mode_shares(metrics_before: str, metrics_after: str) -> dict[str, float]:
    """Share of the SiDP forwards (all DP ranks) run in each mode between two /metrics bodies."""
    from sgl_sidp.bench.server_stats import counters_by_rank

    before = counters_by_rank(metrics_before, FORWARDS, "mode")
    delta = {}
    for (_, mode), v in counters_by_rank(metrics_after, FORWARDS, "mode").items():
        delta[mode] = delta.get(mode, 0.0) + v
    for (_, mode), v in before.items():
        delta[mode] = delta.get(mode, 0.0) - v
    total = sum(delta.values())
    return {m: v / total for m, v in sorted(delta.items())} if total else {}


def job_requests(kv_tokens: int, prompt: int, output: int, max_requests: int, fixed: int | None = None) -> int:
    """Requests of one offline job: `fixed`, else enough that the KV cache is the limit (1.2x what it holds)."""
    if fixed:
        return fixed
    return max(1, min(max_requests, math.ceil(1.2 * kv_tokens / (prompt + output))))


def run_config(name: str, a) -> dict:
    from sgl_sidp.bench.metrics import compute_metrics
    from sgl_sidp.bench.server import ServerProcess
    from sgl_sidp.bench.server_stats import capacity_from_log

    launcher, flags_of = CONFIGS[name]
    extra = flags_of(a.dp, a.tp)
    if name == "sidp_auto":
        extra = [*extra, "--sidp-b-th", str(auto_b_th(a))]
    common = ["--model-path", a.model, "--load-format", "dummy", "--attention-backend", "triton",
              "--sampling-backend", "pytorch", "--enable-metrics", "--tokenizer-path", "sgl_sidp/default_model"]
    if a.mem_fraction_static:
        common += ["--mem-fraction-static", str(a.mem_fraction_static)]
    out_dir = Path(a.out_dir)
    result = {"config": name, "command": None, "kv_tokens": {}, "steps": {}, "jobs": {}}
    path = out_dir / f"{name}.json"
    srv = ServerProcess(launcher, [*common, *extra], port=a.port, log_path=out_dir / f"server_{name}.log", gpus=a.gpus)
    result["command"] = " ".join(srv.command)
    with srv:
        deadline = time.time() + 180
        while "The server is fired up" not in srv.log_text() and time.time() < deadline:
            time.sleep(1)
        result["kv_tokens"] = capacity_from_log(srv.log_text())
        path.write_text(json.dumps(result, indent=1))
        ranks = dp_ranks(name, a.dp)
        for b in a.step_batches:
            n = b * a.dp  # B per DP rank; tp gets the same total
            bodies = [(ids, 64, r) for ids, r in zip(prompts(n, 256, b), spread(n, ranks))]
            outs, _ = run_batch(srv.base_url, bodies)
            itl = [x for o in outs if o.success for x in o.itl]
            result["steps"][b] = {"step_ms": float(np.median(itl) * 1e3) if itl else None,
                                  "failed": sum(not o.success for o in outs)}
            path.write_text(json.dumps(result, indent=1))
        kv_total = sum(result["kv_tokens"].values()) if ranks > 1 else next(iter(result["kv_tokens"].values()), 0)
        for job in a.jobs:
            p, o = (int(x) for x in job.split("+"))
            n = job_requests(kv_total, p, o, a.max_requests, a.requests)
            bodies = [(ids, o, r) for ids, r in zip(prompts(n, p, p + o), spread(n, ranks))]
            before = metrics_text(srv.base_url) if name.startswith("sidp") else ""
            outs, seconds = run_batch(srv.base_url, bodies)
            m = compute_metrics(outs, seconds)
            result["jobs"][job] = {"requests": n, "seconds": seconds, "output_tok_s": m["output_throughput"],
                                   "mean_ttft_ms": m["mean_ttft_ms"], "mean_tpot_ms": m["mean_tpot_ms"],
                                   "failed": m["failed"]}
            if before:
                result["jobs"][job]["mode_share"] = mode_shares(before, metrics_text(srv.base_url))
            path.write_text(json.dumps(result, indent=1))
    return result


def report(out_dir: Path) -> str:
    """One markdown table from every `<config>.json` in `out_dir`: KV tokens, step ms by batch, job tokens/s with
    ratios against dp and tp (where those ran)."""
    res = {p.stem: json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json")) if p.stem in CONFIGS}
    lines = ["| config | KV tokens (per rank) | " + " | ".join(
        [f"step ms @ B={b}" for b in _keys(res, "steps")] + [f"{j} tok/s (vs dp, vs tp)" for j in _keys(res, "jobs")]) + " |"]
    lines.append("|" + "---|" * (2 + len(_keys(res, "steps")) + len(_keys(res, "jobs"))))
    for name, r in res.items():
        cells = [name, ", ".join(f"{v:,}" for _, v in sorted(r["kv_tokens"].items()))]
        for b in _keys(res, "steps"):
            s = r["steps"].get(b, {}).get("step_ms")
            cells.append(f"{s:.1f}" if s else "-")
        for j in _keys(res, "jobs"):
            t = r["jobs"].get(j, {}).get("output_tok_s")
            ref = [res.get(k, {}).get("jobs", {}).get(j, {}).get("output_tok_s") for k in ("dp", "tp")]
            ratios = ", ".join(f"{t / x:.2f}x" if t and x else "-" for x in ref)
            cells.append(f"{t:,.0f} ({ratios})" if t else "-")
        lines.append("| " + " | ".join(cells) + " |")
    shares = [(name, j, r["jobs"][j]["mode_share"]) for name, r in res.items() for j in _keys(res, "jobs")
              if r["jobs"].get(j, {}).get("mode_share")]
    if shares:
        lines += ["", "| config | job | forwards in WaS | forwards in CaS |", "|---|---|---|---|"]
        lines += [f"| {name} | {j} | {sh.get('was', 0):.0%} | {sh.get('cas', 0):.0%} |" for name, j, sh in shares]
    return "\n".join(lines)


def plot(out_dir: Path) -> None:
    """`compare.png` beside `compare.md`: decode step ms at each batch and each job's output tokens/s."""
    from sgl_sidp.bench.report import plot_configs

    res = {p.stem: json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json")) if p.stem in CONFIGS}
    metrics = {f"step ms @ B={b}": {n: r["steps"].get(b, {}).get("step_ms") for n, r in res.items()}
               for b in _keys(res, "steps")}
    metrics.update({f"{j}: output tok/s": {n: r["jobs"].get(j, {}).get("output_tok_s") for n, r in res.items()}
                    for j in _keys(res, "jobs")})
    plot_configs(out_dir / "compare.png", metrics, f"measured side by side ({out_dir.name})")


def _keys(res: dict, field: str) -> list[str]:
    keys = {k for r in res.values() for k in r[field]}
    return sorted(keys, key=lambda k: [int(x) for x in str(k).split("+")])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=".gpu/models/Qwen3-32B",
                    help="--model-path of every server (default: %(default)s)")
    ap.add_argument("--configs", default="dp,dp_attn,tp,sidp_was",
                    help=f"comma-separated configurations to run, of {', '.join(CONFIGS)} (default: %(default)s)")
    ap.add_argument("--dp", type=int, default=2, help="D: DP replicas of the DP configurations")
    ap.add_argument("--tp", type=int, default=1, help="T: GPUs per replica (tp and dp_attn use D x T)")
    ap.add_argument("--out-dir", required=True, help="folder of the <config>.json files, server logs and compare.md")
    ap.add_argument("--gpus", default="0,1", help="GPUs every configuration runs on (default: %(default)s)")
    ap.add_argument("--port", type=int, default=25000, help="the server's port (default: %(default)s)")
    ap.add_argument("--mem-fraction-static", type=float, default=None,
                    help="SGLang's --mem-fraction-static (default: SGLang's)")
    ap.add_argument("--step-batches", type=lambda s: [int(x) for x in s.split(",") if x], default=[], metavar="B,...",
                    help="batches per DP rank of the step-time sweep (default: none)")
    ap.add_argument("--jobs", type=lambda s: [x for x in s.split(",") if x], default=[], metavar="P+O,...",
                    help="offline jobs: P prompt and O forced output tokens per request (default: none)")
    ap.add_argument("--max-requests", type=int, default=2000,
                    help="most requests of an offline job (default: %(default)s)")
    ap.add_argument("--requests", type=int, default=None,
                    help="requests of every offline job, for every configuration (default: sized to the KV cache)")
    ap.add_argument("--b-th", type=int, default=None, help="B_th of sidp_auto (tokens per rank); default: measured")
    ap.add_argument("--report", action="store_true", help="only merge the JSON files in --out-dir into a table")
    a = ap.parse_args(argv)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not a.report:
        for name in a.configs.split(","):
            if name not in CONFIGS:
                raise SystemExit(f"unknown configuration {name!r}; choose from {', '.join(CONFIGS)}")
        if "sidp_auto" in a.configs.split(",") and not {"sidp_was", "sidp_cas"} & set(a.configs.split(",")):
            auto_b_th(a)  # refuse now, not after the other configurations ran
        for name in a.configs.split(","):
            run_config(name, a)
    table = report(out)
    (out / "compare.md").write_text(table + "\n")
    plot(out)
    print(table)


if __name__ == "__main__":
    main()
