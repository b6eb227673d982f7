"""ZeroDP vs vanilla SGLang, side by side on one host with 4 GPUs: KV capacity, exactness, throughput.

Starts two servers at the same time, each with two DP replicas on its own two GPUs:

  vanilla: python -m sglang.launch_server  --dp-size 2 COMMON [--vanilla-extra]               on --vanilla-gpus
  ours:    python -m sgl_sidp.launch_server --dp-size 2 --overlay-mode zerodp COMMON [--ours-extra] on --ours-gpus

COMMON = --model-path M --load-format dummy --attention-backend triton --sampling-backend pytorch --enable-metrics
[--tokenizer-path T] [--mem-fraction-static X] [--common-extra]. Vanilla keeps SGLang's routing (round_robin); ours
gets what our launcher picks for ZeroDP (total_tokens, made capacity-aware) unless --ours-extra says otherwise.
Then, against both at once:

1. KV capacity per DP rank (ours: DP0 = source, DP1 = sink) from GET /v1/loads, /server_info and the server logs
   (SGLang's "max_total_num_tokens=" line and our "sgl-sidp zerodp ... KV cache N tokens" line).
2. Exactness (--exactness N): N fixed token-id prompts, greedy, 32 forced new tokens, logprobs with the top 5, one
   request at a time: ours DP0 and DP1 (routed_dp_rank) and vanilla DP0. Identical output tokens, and the largest
   logprob difference (nats) where the tokens agree, for sink vs vanilla, source vs vanilla and sink vs source.
3. Workloads, the same requests at the same instants on both servers (each side's client in its own process:
   `python -m sgl_sidp.replay`, whose rows note the DP rank that served each request):
   --decode-heavy N (N requests of 1024 prompt and 1024 forced output tokens, all at once), --trace-mooncake,
   --azure-code (trace windows, as scripts/compare_replay.py replays them). For each: output tokens/s (all ranks and
   per DP rank), TTFT and TPOT (mean/median/P99, overall and per rank), requests per rank, and the schedulers'
   Prometheus counters per rank (decode tokens, GPU-busy seconds, retracted requests) read before and after.

Writes under --out-dir: compare.json (rewritten after every step, so a failure keeps what came before), compare.md
(printed at the end), <workload>/<side>/ (each replay's requests.jsonl/csv, summary.json, plot, replay.log),
server_<side>.log.gz, server_info_<side>.json, zerodp_throughput.png. Servers and clients are stopped in every case
(also on SIGTERM/SIGINT). --deadline-s skips, and records as skipped, every step that would start after it; a step
is skipped too once a server process has exited. Exit status: 1 when a server failed, a step failed or was skipped
for a dead server, or the run was interrupted; else 0 (steps skipped for the deadline included).

An *-extra value that is one flag without a space must be given with "=": --ours-extra=--enable-foo.

Smoke run (4 GPUs, from the repo root after `source scripts/gpu_env.sh`; about 5 minutes with server start-up):
    timeout -s TERM 570 python3 scripts/zerodp_compare.py --model-path .gpu/models/Qwen3-30B-A3B \\
      --out-dir $OUT/zerodp_smoke --ours-extra "--zerodp-layers all" --exactness 8 --decode-heavy 64 \\
      --trace-mooncake .gpu/traces/conversation_trace.jsonl --mooncake-duration-s 60 --deadline-s 400
"""

from __future__ import annotations

import argparse
import gzip
import json
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_replay  # noqa: E402  (scripts/compare_replay.py: server facts, full metric table)

import sgl_sidp  # noqa: E402
from sgl_sidp.bench.metrics import per_rank_stats  # noqa: E402
from sgl_sidp.bench.server import ServerProcess  # noqa: E402
from sgl_sidp.bench.server_stats import (  # noqa: E402
    capacity_from_loads,
    capacity_from_log,
    capacity_from_server_info,
    counter_deltas,
    merge_capacity,
    per_rank_from_deltas,
    rank_counter_snapshot,
    zerodp_capacity_from_log,
    zerodp_lines,
)

SIDES = ("vanilla", "ours")
LAUNCHERS = compare_replay.LAUNCHERS
#: The embedded tokenizer used when --model-path is a folder with a config but no tokenizer (as .gpu/models/*).
DEFAULT_TOKENIZER_DIR = Path(sgl_sidp.__file__).resolve().parent / "default_model"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
#: Prompt lengths (tokens) of the exactness prompts, cycled.
EXACTNESS_LENGTHS = (16, 128, 700, 2048, 40, 300, 1500, 4000)
EXACTNESS_TOKEN_RANGE = (100, 4000)
#: Sources of the KV capacity per rank, most trusted first (see sgl_sidp.bench.server_stats).
CAPACITY_ORDER = ("v1_loads", "log", "zerodp_log", "server_info")
#: Exactness pairs: (key, label, (side, dp rank) of a, (side, dp rank) of b).
PAIRS = (
    ("sink_vs_vanilla", "ours sink (DP1) vs vanilla DP0", ("ours", 1), ("vanilla", 0)),
    ("source_vs_vanilla", "ours source (DP0) vs vanilla DP0", ("ours", 0), ("vanilla", 0)),
    ("sink_vs_source", "ours sink (DP1) vs ours source (DP0)", ("ours", 1), ("ours", 0)),
)
#: Whole-replay metrics kept in compare.json and compared (summary key, label, unit).
SUMMARY_METRICS = (
    ("output_throughput", "output tok/s, all ranks", "tok/s"),
    ("mean_ttft_ms", "mean TTFT", "ms"),
    ("median_ttft_ms", "median TTFT", "ms"),
    ("p99_ttft_ms", "P99 TTFT", "ms"),
    ("mean_tpot_ms", "mean TPOT", "ms"),
    ("median_tpot_ms", "median TPOT", "ms"),
    ("p99_tpot_ms", "P99 TPOT", "ms"),
    ("mean_e2e_latency_ms", "mean E2E", "ms"),
    ("request_throughput", "requests/s", ""),
    ("completed", "completed requests", ""),
    ("failed", "failed requests", ""),
    ("total_output_tokens", "output tokens", ""),
    ("duration", "duration", "s"),
)
#: Per-rank metrics shown in compare.md (key in the rank dict, label, unit).
RANK_METRICS = (
    ("output_throughput", "output tok/s", "tok/s"),
    ("requests", "requests served", ""),
    ("mean_ttft_ms", "mean TTFT", "ms"),
    ("p99_ttft_ms", "P99 TTFT", "ms"),
    ("mean_tpot_ms", "mean TPOT", "ms"),
    ("p99_tpot_ms", "P99 TPOT", "ms"),
    ("decode_tokens", "decode tokens (Prometheus)", ""),
    ("busy_s", "GPU-busy seconds (Prometheus)", ""),
    ("retracted", "retracted requests (Prometheus)", ""),
)

# Child processes (replay clients) to kill if we are stopped; guarded by _CHILDREN_LOCK.
_CHILDREN: set[subprocess.Popen] = set()
_CHILDREN_LOCK = threading.Lock()


# --------------------------------------------------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The script's flags (see the module docstring); the list given is kept as ``args.argv``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="scripts/zerodp_compare.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s = p.add_argument_group("servers")
    s.add_argument("--model-path", required=True, help="model folder or id (both servers)")
    s.add_argument("--tokenizer-path", default=None,
                   help="default: the model's own, or the embedded byte-level tokenizer when the model folder has none")
    s.add_argument("--load-format", default="dummy", help="SGLang's --load-format, both servers (default: %(default)s)")
    s.add_argument("--attention-backend", default="triton",
                   help="SGLang's --attention-backend, both servers (default: %(default)s)")
    s.add_argument("--sampling-backend", default="pytorch",
                   help="SGLang's --sampling-backend, both servers (default: %(default)s)")
    s.add_argument("--mem-fraction-static", type=float, default=None, help="both servers (default: SGLang's)")
    s.add_argument("--dp-size", type=int, default=2, help="DP replicas per server (default: %(default)s)")
    s.add_argument("--common-extra", default="", help="more flags for both servers (one shell-quoted string)")
    s.add_argument("--vanilla-extra", default="", help="more flags for vanilla only")
    s.add_argument("--ours-extra", default="", help='more flags for ours only, e.g. "--zerodp-layers all"')
    s.add_argument("--vanilla-gpus", default="0,1", help="CUDA_VISIBLE_DEVICES of vanilla (default: %(default)s)")
    s.add_argument("--ours-gpus", default="2,3", help="CUDA_VISIBLE_DEVICES of ours (default: %(default)s)")
    s.add_argument("--vanilla-port", type=int, default=22000, help="port of vanilla (default: %(default)s)")
    s.add_argument("--ours-port", type=int, default=22100, help="port of ours (default: %(default)s)")
    s.add_argument("--no-metrics", action="store_true",
                   help="do not pass --enable-metrics (loses the Prometheus per-rank counters)")
    s.add_argument("--ready-timeout-s", type=float, default=420.0,
                   help="seconds to wait for each server's /health (default: %(default)s)")
    w = p.add_argument_group("exactness and workloads")
    w.add_argument("--exactness", type=int, default=8, metavar="N", help="prompts of the exactness check; 0: skip")
    w.add_argument("--exactness-new-tokens", type=int, default=32,
                   help="forced new tokens per exactness prompt (default: %(default)s)")
    w.add_argument("--exactness-top-k", type=int, default=5, help="top_logprobs_num (default: %(default)s)")
    w.add_argument("--decode-heavy", type=int, default=0, metavar="N",
                   help="N requests of --decode-heavy-input-len prompt and --decode-heavy-output-len forced output "
                   "tokens, all sent at once; 0: skip")
    w.add_argument("--decode-heavy-input-len", type=int, default=1024, help="prompt tokens (default: %(default)s)")
    w.add_argument("--decode-heavy-output-len", type=int, default=1024,
                   help="forced output tokens (default: %(default)s)")
    w.add_argument("--trace-mooncake", type=Path, default=None, help="Mooncake JSONL trace to replay")
    w.add_argument("--mooncake-start-s", type=float, default=0.0, help="window start, trace s (default: %(default)s)")
    w.add_argument("--mooncake-duration-s", type=float, default=120.0, help="window, trace s (default: %(default)s)")
    w.add_argument("--mooncake-time-scale", type=float, default=1.0, help=">1 slower (default: %(default)s)")
    w.add_argument("--azure-code", type=Path, default=None, help="Azure LLM inference (code) CSV trace to replay")
    w.add_argument("--azure-start-s", type=float, default=0.0, help="window start, trace s (default: %(default)s)")
    w.add_argument("--azure-duration-s", type=float, default=120.0, help="window, trace s (default: %(default)s)")
    w.add_argument("--azure-time-scale", type=float, default=1.0, help=">1 slower (default: %(default)s)")
    w.add_argument("--max-context-len", type=int, default=40960,
                   help="trace requests over this many prompt+output tokens are skipped (the model's context; "
                   "0: no limit; default: %(default)s)")
    w.add_argument("--replay-extra", default="--slo-ttft-ms 2000 --slo-tpot-ms 100",
                   help="more `python -m sgl_sidp.replay` flags for every workload (default: %(default)s)")
    w.add_argument("--seed", type=int, default=0, help="seed of every prompt (default: %(default)s)")
    o = p.add_argument_group("output and time")
    o.add_argument("--out-dir", type=Path, default=Path("zerodp_results"),
                   help="folder of the results, created if missing (default: %(default)s)")
    o.add_argument("--deadline-s", type=float, default=None,
                   help="seconds after the script starts; a step (exactness, workload) that would start later is "
                   "skipped and recorded as such, and requests in flight then time out about 60 s past it")
    o.add_argument("--no-plot", action="store_true", help="skip zerodp_throughput.png")
    args = p.parse_args(argv)
    args.argv = argv
    return args


def tokenizer_flags(model_path: str, tokenizer_path: str | None) -> list[str]:
    """``--tokenizer-path`` for both servers: the one given; else the embedded tokenizer when ``model_path`` is a
    local folder without tokenizer files (a config-only folder served with random weights); else none."""
    if tokenizer_path:
        return ["--tokenizer-path", tokenizer_path]
    model = Path(model_path)
    if model.is_dir() and not any((model / f).exists() for f in TOKENIZER_FILES):
        return ["--tokenizer-path", str(DEFAULT_TOKENIZER_DIR)]
    return []


def server_flags(args: argparse.Namespace, side: str) -> list[str]:
    """The flags of one side's server ("vanilla" or "ours"), without --host/--port (ServerProcess adds them)."""
    flags = ["--model-path", args.model_path, *tokenizer_flags(args.model_path, args.tokenizer_path),
             "--load-format", args.load_format, "--attention-backend", args.attention_backend,
             "--sampling-backend", args.sampling_backend, "--dp-size", str(args.dp_size)]
    if args.mem_fraction_static is not None:
        flags += ["--mem-fraction-static", str(args.mem_fraction_static)]
    if not args.no_metrics:
        flags.append("--enable-metrics")
    flags += shlex.split(args.common_extra)
    if side == "ours":
        flags += ["--overlay-mode", "zerodp", *shlex.split(args.ours_extra)]
    else:
        flags += shlex.split(args.vanilla_extra)
    return flags


# ----------------------------------------------------------------------------------------------------- HTTP
def http_get(base_url: str, path: str, timeout_s: float = 30.0) -> str:
    """GET ``base_url + path``; the body as text."""
    with urllib.request.urlopen(base_url + path, timeout=timeout_s) as r:
        return r.read().decode()


def http_post_json(base_url: str, path: str, body: Mapping, timeout_s: float = 600.0) -> dict:
    """POST ``body`` as JSON to ``base_url + path``; the decoded JSON answer (raises on HTTP errors)."""
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read().decode())


def try_json(base_url: str, path: str) -> dict | None:
    """GET a JSON endpoint, ``None`` on any failure (an endpoint this SGLang lacks, a busy server)."""
    try:
        return json.loads(http_get(base_url, path))
    except Exception:  # noqa: BLE001 - optional source
        return None


def scrape_counters(base_url: str) -> dict | None:
    """The per-rank scheduler counters of ``/metrics`` (see server_stats.RANK_COUNTERS); ``None`` without metrics."""
    try:
        return rank_counter_snapshot(http_get(base_url, "/metrics"))
    except Exception:  # noqa: BLE001 - metrics off, or the endpoint failed: the per-rank counters are then missing
        return None


# --------------------------------------------------------------------------------------------- server facts
def capacity_sources(log_text: str, loads: Mapping | None, info: Mapping | None) -> dict[str, dict[int, int]]:
    """KV capacity (tokens) per DP rank from every source we have, by source name (see CAPACITY_ORDER)."""
    return {
        "v1_loads": capacity_from_loads(loads),
        "log": capacity_from_log(log_text),
        "zerodp_log": {r: v["kv_tokens"] for r, v in zerodp_capacity_from_log(log_text).items()},
        "server_info": capacity_from_server_info(info),
    }


def server_facts(srv: ServerProcess, ready_s: float, out_dir: Path, side: str) -> dict:
    """What one ready server says about itself: command, start time, settings, KV capacity per rank (every
    source and the merged value), overlay and ZeroDP log lines. Saves the raw /server_info as
    ``server_info_<side>.json``."""
    facts = compare_replay.server_facts(srv, ready_s)
    info = try_json(srv.base_url, "/server_info") or try_json(srv.base_url, "/get_server_info")
    loads = None
    for _ in range(10):  # the load snapshots appear once each scheduler has published one
        loads = try_json(srv.base_url, "/v1/loads")
        if capacity_from_loads(loads):
            break
        time.sleep(1.0)
    if info is not None:
        (out_dir / f"server_info_{side}.json").write_text(json.dumps(info, indent=1, default=str) + "\n")
    log = srv.log_text()
    sources = capacity_sources(log, loads, info)
    settings = {k: (info or {}).get(k) for k in (
        "load_balance_method", "dp_size", "tp_size", "mem_fraction_static", "max_running_requests",
        "chunked_prefill_size", "cuda_graph_max_bs", "context_length", "version")}
    return {
        **facts,
        "settings": settings,
        "capacity_sources": {k: {str(r): v for r, v in src.items()} for k, src in sources.items()},
        "kv_tokens": {str(r): v for r, v in merge_capacity(sources, CAPACITY_ORDER).items()},
        "zerodp_lines": zerodp_lines(log),
    }


# ------------------------------------------------------------------------------------------------ exactness
def exactness_prompts(n: int, seed: int) -> list[list[int]]:
    """``n`` fixed prompts (token ids uniform in EXACTNESS_TOKEN_RANGE, lengths cycling EXACTNESS_LENGTHS)."""
    rng = np.random.default_rng([seed, 3])
    lo, hi = EXACTNESS_TOKEN_RANGE
    return [rng.integers(lo, hi, size=EXACTNESS_LENGTHS[i % len(EXACTNESS_LENGTHS)]).tolist() for i in range(n)]


def greedy_body(ids: Sequence[int], new_tokens: int, top_k: int, dp_rank: int | None) -> dict:
    """Native /generate body: greedy, ``new_tokens`` forced output tokens, logprobs with the top ``top_k``."""
    body = {"input_ids": list(ids),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": top_k, "stream": False}
    if dp_rank is not None:
        body["routed_dp_rank"] = dp_rank
    return body


def parse_generation(resp: Mapping) -> dict:
    """Output token ids, their logprobs and the top-k ids per position of a non-streamed /generate answer
    (``meta_info.output_token_logprobs`` = [[logprob, id, text], ...], ``output_top_logprobs`` = per position
    [[logprob, id, text], ...]); also the DP rank the server reports."""
    meta = resp.get("meta_info") or {}
    lp = meta.get("output_token_logprobs") or []
    top = meta.get("output_top_logprobs") or []
    return {
        "ids": [int(x[1]) for x in lp] if lp else [int(i) for i in resp.get("output_ids") or []],
        "logprobs": [None if x[0] is None else float(x[0]) for x in lp],
        "top_ids": [[int(y[1]) for y in pos] if pos else [] for pos in top],
        "dp_rank": meta.get("dp_rank"),
    }


def compare_generations(a: Mapping, b: Mapping) -> dict:
    """Compare two :func:`parse_generation` results of the same prompt.

    Returns:
        ``identical`` (same token ids), ``length`` (tokens of the longer), ``matched_prefix`` (tokens equal before
        the first difference), ``max_abs_logprob_diff`` (largest |logprob a - logprob b| over the matched prefix,
        nats; ``None`` without logprobs), ``top_k_agree`` (positions of the matched prefix whose top-k id sets are
        equal, and ``top_k_positions`` compared).
    """
    ia, ib = a["ids"], b["ids"]
    n = max(len(ia), len(ib))
    k = next((i for i in range(min(len(ia), len(ib))) if ia[i] != ib[i]), min(len(ia), len(ib)))
    diffs = [abs(x - y) for x, y in zip(a["logprobs"][:k], b["logprobs"][:k]) if x is not None and y is not None]
    tops = list(zip(a.get("top_ids", [])[:k], b.get("top_ids", [])[:k]))
    return {
        "identical": ia == ib,
        "length": n,
        "matched_prefix": k,
        "max_abs_logprob_diff": max(diffs) if diffs else None,
        "top_k_agree": sum(set(x) == set(y) for x, y in tops),
        "top_k_positions": len(tops),
    }


def summarize_pair(comparisons: Sequence[Mapping]) -> dict:
    """Totals of one exactness pair over its prompts (see :func:`compare_generations`)."""
    diffs = [c["max_abs_logprob_diff"] for c in comparisons if c["max_abs_logprob_diff"] is not None]
    return {
        "prompts": len(comparisons),
        "identical": sum(c["identical"] for c in comparisons),
        "matched_tokens": sum(c["matched_prefix"] for c in comparisons),
        "tokens": sum(c["length"] for c in comparisons),
        "first_divergence": [None if c["identical"] else c["matched_prefix"] for c in comparisons],
        "max_abs_logprob_diff": max(diffs) if diffs else None,
        "top_k_agree": sum(c["top_k_agree"] for c in comparisons),
        "top_k_positions": sum(c["top_k_positions"] for c in comparisons),
    }


def run_exactness(servers: Mapping[str, ServerProcess], args: argparse.Namespace) -> dict:
    """The exactness check (module docstring, step 2): one request at a time per server.

    Returns:
        ``{"prompts": [{"prompt_len", "outputs": {"ours/DP0": ids...}, "errors"}], "pairs": {key: summary}}``.
    """
    targets = [("ours", 0), ("ours", 1), ("vanilla", 0)]
    prompts, pair_rows = [], {key: [] for key, *_ in PAIRS}
    for ids in exactness_prompts(args.exactness, args.seed):
        gens, errors = {}, {}
        for side, rank in targets:
            try:
                resp = http_post_json(servers[side].base_url, "/generate",
                                      greedy_body(ids, args.exactness_new_tokens, args.exactness_top_k, rank))
                gens[(side, rank)] = parse_generation(resp)
            except Exception as e:  # noqa: BLE001 - one failed request is a result, not a crash
                errors[f"{side}/DP{rank}"] = f"{type(e).__name__}: {e}"
        for key, _, a, b in PAIRS:
            if a in gens and b in gens:
                pair_rows[key].append(compare_generations(gens[a], gens[b]))
        prompts.append({
            "prompt_len": len(ids),
            "outputs": {f"{s}/DP{r}": g["ids"] for (s, r), g in gens.items()},
            "served_by": {f"{s}/DP{r}": g["dp_rank"] for (s, r), g in gens.items()},
            "errors": errors,
        })
    return {"new_tokens": args.exactness_new_tokens, "top_k": args.exactness_top_k, "prompts": prompts,
            "pairs": {key: summarize_pair(rows) for key, rows in pair_rows.items()}}


def warm_up(servers: Mapping[str, ServerProcess], dp_size: int) -> list[str]:
    """Two short requests per DP rank of each server (kernel JIT, first allocations); the errors met."""
    errors = []
    for side, srv in servers.items():
        for rank in range(dp_size):
            for n in (32, 300):
                try:
                    http_post_json(srv.base_url, "/generate", greedy_body(list(range(100, 100 + n)), 8, 0, rank), 300)
                except Exception as e:  # noqa: BLE001
                    errors.append(f"warm-up {side} DP{rank}: {type(e).__name__}: {e}")
    return errors


# ------------------------------------------------------------------------------------------------ workloads
@dataclass(frozen=True)
class Workload:
    """One workload: its name and the `python -m sgl_sidp.replay` flags (without --base-url/--out-dir/--tag)."""

    name: str
    replay_args: tuple[str, ...]
    description: str


def write_decode_heavy_trace(path: Path, n: int, input_len: int, output_len: int) -> Path:
    """A Shift-format JSONL trace of ``n`` requests all arriving at 0 ms (prompts: seeded random token ids)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    row = json.dumps({"timestamp": 0, "input_length": input_len, "output_length": output_len})
    path.write_text((row + "\n") * n)
    return path


def plan_workloads(args: argparse.Namespace, out_dir: Path) -> list[Workload]:
    """The workloads the flags ask for, in run order: decode-heavy, Mooncake, Azure code."""
    seed = ["--seed", str(args.seed)]
    extra = shlex.split(args.replay_extra)
    ctx = ["--max-context-len", str(args.max_context_len)] if args.max_context_len else []
    out: list[Workload] = []
    if args.decode_heavy > 0:
        trace = write_decode_heavy_trace(out_dir / "decode_heavy_trace.jsonl", args.decode_heavy,
                                         args.decode_heavy_input_len, args.decode_heavy_output_len)
        out.append(Workload(
            "decode_heavy",
            ("--trace", str(trace), "--trace-format", "shift", "--max-concurrency", str(args.decode_heavy), *seed,
             *extra),
            f"{args.decode_heavy} requests x ({args.decode_heavy_input_len} prompt + {args.decode_heavy_output_len} "
            "output tokens), all at once"))
    for name, trace, start, dur, scale in (
        ("mooncake", args.trace_mooncake, args.mooncake_start_s, args.mooncake_duration_s, args.mooncake_time_scale),
        ("azure_code", args.azure_code, args.azure_start_s, args.azure_duration_s, args.azure_time_scale),
    ):
        if trace is not None:
            out.append(Workload(
                name,
                ("--trace", str(trace), "--start-s", f"{start:g}", "--duration-s", f"{dur:g}", "--time-scale",
                 f"{scale:g}", *ctx, *seed, *extra),
                f"{trace.name} window [{start:g}, {start + dur:g}) s x{scale:g}"))
    return out


def run_client(workload: Workload, side: str, srv: ServerProcess, out_dir: Path, request_timeout_s: float | None,
               wait_timeout_s: float | None) -> dict:
    """One side's replay client as a child process (its own event loop and CPU), like compare_replay.run_job,
    through `sgl_sidp.replay`, which keeps each request's DP rank (`dp_rank` column).

    Returns:
        ``{"summary": summary.json, "rows": requests.jsonl rows}``.

    Raises:
        RuntimeError: the client failed or ran past ``wait_timeout_s`` (s).
    """
    d = out_dir / workload.name / side
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "sgl_sidp.replay", *workload.replay_args, "--base-url", srv.base_url,
           "--out-dir", str(d), "--tag", side, "--disable-tqdm"]
    if request_timeout_s is not None:
        cmd += ["--request-timeout-s", f"{request_timeout_s:.0f}"]
    with open(d / "replay.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        with _CHILDREN_LOCK:
            _CHILDREN.add(proc)
        try:
            rc = proc.wait(wait_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{workload.name}/{side}: client still running after {wait_timeout_s:.0f} s; killed")
        finally:
            with _CHILDREN_LOCK:
                _CHILDREN.discard(proc)
    if rc != 0 or not (d / "summary.json").exists():
        tail = "\n".join((d / "replay.log").read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{workload.name}/{side}: client exited with {rc}; {d / 'replay.log'}:\n{tail}")
    rows = [json.loads(line) for line in (d / "requests.jsonl").read_text().splitlines() if line.strip()]
    return {"summary": json.loads((d / "summary.json").read_text()), "rows": rows}


def side_report(summary: Mapping, rows: Sequence[Mapping], deltas: Mapping | None) -> dict:
    """One side's result of one workload: whole-replay metrics and per-DP-rank figures.

    Per rank, from the rows' ``dp_rank`` (``per_rank_source = "meta_info.dp_rank"``): requests, output tokens and
    tok/s over the replay's duration, TTFT/TPOT stats; from the Prometheus deltas: decode tokens, prefill tokens,
    GPU-busy seconds, retracted requests, and ``output_throughput_prom``: the replay's output tok/s split in
    proportion to the ranks' decode tokens. Without rows' ranks, ``output_throughput`` is that estimate
    (``per_rank_source = "prometheus"``).
    """
    ranks: dict[int, dict] = {r: dict(v) for r, v in per_rank_stats(rows, float(summary.get("duration") or 0)).items()}
    source = "meta_info.dp_rank" if ranks else None
    prom = per_rank_from_deltas(deltas) if deltas else {}
    total_decode = sum(v["decode_tokens"] for v in prom.values())
    for r, v in prom.items():
        row = ranks.setdefault(r, {})
        row.update(v)
        if total_decode > 0:
            share = v["decode_tokens"] / total_decode
            row["output_throughput_prom"] = float(summary.get("output_throughput") or 0) * share
            if source != "meta_info.dp_rank":
                row["output_throughput"] = row["output_throughput_prom"]
                source = "prometheus"
    return {
        "metrics": {k: summary.get(k) for k, _, _ in SUMMARY_METRICS},
        "requests_sent": (summary.get("window") or {}).get("requests_sent"),
        "cache_hit_rate": (summary.get("cache_report") or {}).get("cache_hit_rate"),
        "ranks": {str(r): v for r, v in sorted(ranks.items())},
        "per_rank_source": source,
        "prometheus_deltas": deltas,
        "summary_path": summary.get("out_dir"),
    }


def ratio(ours, vanilla) -> float | None:
    """ours / vanilla, or ``None`` when either is missing or vanilla is 0."""
    if ours is None or vanilla is None or not isinstance(ours, (int, float)) or not vanilla:
        return None
    return float(ours) / float(vanilla)


def workload_ratios(sides: Mapping[str, Mapping]) -> dict:
    """ours/vanilla of every whole-replay metric and every per-rank metric (``"DP<r> <key>"``)."""
    v, o = sides.get("vanilla"), sides.get("ours")
    if not v or not o:
        return {}
    out = {k: ratio(o["metrics"].get(k), v["metrics"].get(k)) for k, _, _ in SUMMARY_METRICS}
    for r in sorted(set(v["ranks"]) | set(o["ranks"]), key=int):
        for k, _, _ in RANK_METRICS:
            out[f"DP{r} {k}"] = ratio(o["ranks"].get(r, {}).get(k), v["ranks"].get(r, {}).get(k))
    return out


def run_workload(workload: Workload, servers: Mapping[str, ServerProcess], out_dir: Path,
                 deadline: float | None) -> dict:
    """Run one workload on both servers at once; Prometheus counters read just before and after.

    With a deadline, requests time out about 60 s after it (at least 60 s each), and a client still running 5 min
    after it is killed. A side whose client fails is recorded with its error; the other side's results stay.
    """
    left = None if deadline is None else deadline - time.time()
    request_timeout = None if left is None else max(60.0, left + 60.0)
    wait_timeout = None if left is None else max(120.0, left + 300.0)
    before = {s: scrape_counters(p.base_url) for s, p in servers.items()}
    t0 = time.time()
    raw, errors = {}, {}
    pool = ThreadPoolExecutor(len(servers))
    try:
        futs = {s: pool.submit(run_client, workload, s, p, out_dir, request_timeout, wait_timeout)
                for s, p in servers.items()}
        for s, f in futs.items():
            try:
                raw[s] = f.result()
            except Exception as e:  # noqa: BLE001
                errors[s] = str(e)
    except BaseException:  # interrupted: end the clients first, or the pool would wait for them
        _kill_children()
        raise
    finally:
        pool.shutdown(wait=True)
    wall = time.time() - t0
    time.sleep(1.0)  # the schedulers' last counter bumps
    after = {s: scrape_counters(p.base_url) for s, p in servers.items()}
    result: dict = {"status": "ok" if not errors else ("failed" if not raw else "partial"),
                    "description": workload.description, "replay_args": list(workload.replay_args),
                    "wall_s": round(wall, 1), "errors": errors}
    for s, r in raw.items():
        deltas = counter_deltas(before[s], after[s]) if before.get(s) and after.get(s) else None
        result[s] = side_report(r["summary"], r["rows"], deltas)
        result[s]["command"] = r["summary"].get("command")
    result["ratios"] = workload_ratios(result)
    if len(raw) == 2:
        result["full_table"] = compare_replay.compare_table(
            {workload.name: {s: {**r["summary"], "command": r["summary"].get("command")} for s, r in raw.items()}})[0]
    return result


# -------------------------------------------------------------------------------------------------- report
def fmt(v, digits: int = 2) -> str:
    """A table cell: "-" for None, integers with thousands separators, floats with ``digits`` decimals."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) >= 1000):
        return f"{int(v):,}"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def fmt_ratio(r: float | None) -> str:
    """A ratio cell: three decimals, "-" when there is none."""
    return "-" if r is None else f"{r:.3f}"


def rank_label(r: int | str) -> str:
    """``DP0 (ours: source)``, ``DP1 (ours: sink)``, ..."""
    return f"DP{r} (ours: {'source' if int(r) == 0 else 'sink'})"


def capacity_lines(servers: Mapping[str, Mapping]) -> list[str]:
    """Markdown: KV capacity per DP rank of both servers and ours/vanilla, then every source's values."""
    v = (servers.get("vanilla") or {}).get("kv_tokens") or {}
    o = (servers.get("ours") or {}).get("kv_tokens") or {}
    lines = ["| DP rank | vanilla KV tokens | ours KV tokens | ours / vanilla |", "|---|---:|---:|---:|"]
    for r in sorted(set(v) | set(o), key=int):
        a, b = v.get(r), o.get(r)
        lines.append(f"| {rank_label(r)} | {fmt(a)} | {fmt(b)} | {fmt_ratio(ratio(b, a))} |")
    if v or o:
        tv, to = (sum(x.values()) if x else None for x in (v, o))
        lines.append(f"| all ranks | {fmt(tv)} | {fmt(to)} | {fmt_ratio(ratio(to, tv))} |")
    lines += ["", "Sources (tokens per rank; the table takes the first present of "
              + ", ".join(CAPACITY_ORDER) + "):", ""]
    for side, facts in servers.items():
        for name, vals in (facts.get("capacity_sources") or {}).items():
            if vals:
                lines.append(f"- {side} `{name}`: " + ", ".join(f"DP{r} {fmt(x)}" for r, x in sorted(vals.items())))
    return lines


def exactness_lines(ex: Mapping | None) -> list[str]:
    """Markdown: the exactness table (one row per pair)."""
    if not ex or not ex.get("pairs"):
        return ["(not run)"]
    lines = [f"{len(ex['prompts'])} prompts, greedy, {ex['new_tokens']} forced new tokens each, one at a time.", "",
             "| pair | identical outputs | tokens matched | first divergence per prompt | max abs logprob diff "
             f"(matched tokens) | top-{ex['top_k']} sets equal |", "|---|---:|---:|---|---:|---:|"]
    labels = {key: label for key, label, *_ in PAIRS}
    for key, s in ex["pairs"].items():
        div = ", ".join("=" if d is None else str(d) for d in s["first_divergence"]) or "-"
        topk = f"{s['top_k_agree']}/{s['top_k_positions']}" if s["top_k_positions"] else "-"
        mad = "-" if s["max_abs_logprob_diff"] is None else f"{s['max_abs_logprob_diff']:.4g}"
        lines.append(f"| {labels.get(key, key)} | {s['identical']}/{s['prompts']} | "
                     f"{s['matched_tokens']}/{s['tokens']} | {div} | {mad} | {topk} |")
    errs = [f"prompt {i}: {e}" for i, p in enumerate(ex["prompts"]) for e in p["errors"].items()]
    if errs:
        lines += ["", "Errors: " + "; ".join(map(str, errs))]
    return lines


def workload_lines(name: str, w: Mapping) -> list[str]:
    """Markdown: one workload's compact table (whole replay, then per rank), skipped/failed notes, full table."""
    lines = [f"### {name}", ""]
    if w.get("status") == "skipped":
        return lines + [f"Skipped: {w.get('reason')}", ""]
    lines += [f"{w.get('description', '')}; wall {w.get('wall_s')} s; status {w.get('status')}.", ""]
    for s, e in (w.get("errors") or {}).items():
        lines += [f"**{s} failed:**", "", "```", str(e)[-2000:], "```", ""]
    v, o = w.get("vanilla") or {}, w.get("ours") or {}
    if not v and not o:
        return lines
    srcs = {s: (w.get(s) or {}).get("per_rank_source") for s in SIDES}
    lines += [f"Requests sent: vanilla {fmt(v.get('requests_sent'))}, ours {fmt(o.get('requests_sent'))}; per-rank "
              f"figures from {srcs['vanilla']} (vanilla) / {srcs['ours']} (ours).", "",
              "| metric | vanilla | ours | ours / vanilla |", "|---|---:|---:|---:|"]
    ratios = w.get("ratios") or {}
    for k, label, unit in SUMMARY_METRICS:
        a, b = (v.get("metrics") or {}).get(k), (o.get("metrics") or {}).get(k)
        lines.append(f"| {label}{f' ({unit})' if unit and unit != 'tok/s' else ''} | {fmt(a)} | {fmt(b)} "
                     f"| {fmt_ratio(ratios.get(k, ratio(b, a)))} |")
    ranks = sorted(set(v.get("ranks") or {}) | set(o.get("ranks") or {}), key=int)
    for k, label, unit in RANK_METRICS:
        for r in ranks:
            a, b = (v.get("ranks") or {}).get(r, {}).get(k), (o.get("ranks") or {}).get(r, {}).get(k)
            if a is None and b is None:
                continue
            lines.append(f"| {label}{f' ({unit})' if unit and unit != 'tok/s' else ''}, {rank_label(r)} | {fmt(a)} "
                         f"| {fmt(b)} | {fmt_ratio(ratio(b, a))} |")
    if w.get("full_table"):
        lines += ["", "<details><summary>all replay metrics</summary>", "", w["full_table"], "</details>"]
    return lines + [""]


def render_markdown(report: Mapping) -> str:
    """compare.md from the report (what compare.json holds)."""
    servers = report.get("servers") or {}
    lines = ["# ZeroDP vs vanilla SGLang, side by side", "", f"Command: `{report.get('command')}`", "",
             f"Started {report.get('started_at')}; wall {report.get('wall_s', '?')} s; "
             f"status: {report.get('status', 'running')}.", ""]
    if servers:
        lines += ["| server | GPUs | ready (s) | routing | command |", "|---|---|---:|---|---|"]
        for side, f in servers.items():
            lines.append(f"| {side} | {f.get('gpus')} | {f.get('ready_s', '-')} | "
                         f"{(f.get('settings') or {}).get('load_balance_method') or '-'} | `{f.get('command')}` |")
        lines.append("")
        ours = servers.get("ours") or {}
        if ours.get("overlay_line"):
            lines += [f"Overlay: `{ours['overlay_line']}`", ""]
        if ours and not ours.get("zerodp_lines"):
            lines += ["**Warning: ours logged no `sgl-sidp zerodp` line: ZeroDP may not be active.**", ""]
    lines += ["## KV capacity", "", *capacity_lines(servers), ""]
    zl = (servers.get("ours") or {}).get("zerodp_lines") or []
    if zl:
        lines += ["ZeroDP log lines (ours):", "", "```", *zl[:40], "```", ""]
    lines += ["## Exactness", "", *exactness_lines(report.get("exactness")), "", "## Workloads", ""]
    for name, w in (report.get("workloads") or {}).items():
        lines += workload_lines(name, w)
    for name in report.get("planned") or []:
        if name != "exactness" and name not in (report.get("workloads") or {}):
            lines += [f"### {name}", "", "Not run (the run stopped before it).", ""]
    if report.get("errors"):
        lines += ["## Errors", "", *[f"- {e}" for e in report["errors"]], "", "(tracebacks in compare.json)", ""]
    return "\n".join(lines) + "\n"


def write_report(report: Mapping, out_dir: Path) -> None:
    """Write compare.json and compare.md (each through a temporary file, so a reader never sees half of one)."""
    for name, text in (("compare.json", json.dumps(report, indent=2, default=str) + "\n"),
                       ("compare.md", render_markdown(report))):
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out_dir / name)


def plot_throughput(report: Mapping, path: Path) -> Path | None:
    """Bar plot of output tok/s per workload: vanilla DP0, DP1, all; ours source, sink, all. ``None`` when no
    workload has results."""
    done = {n: w for n, w in (report.get("workloads") or {}).items() if w.get("vanilla") or w.get("ours")}
    if not done:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [("vanilla", "0", "vanilla DP0"), ("vanilla", "1", "vanilla DP1"), ("vanilla", None, "vanilla all"),
            ("ours", "0", "ours source DP0"), ("ours", "1", "ours sink DP1"), ("ours", None, "ours all")]
    colors = ["#9ecae1", "#6baed6", "#2171b5", "#fdae6b", "#fd8d3c", "#d94801"]
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 + 2.4 * len(done)), 5.0), constrained_layout=True)
    width = 0.8 / len(bars)
    for i, ((side, rank, label), color) in enumerate(zip(bars, colors)):
        ys = []
        for w in done.values():
            s = w.get(side) or {}
            ys.append(((s.get("metrics") or {}).get("output_throughput") if rank is None
                       else (s.get("ranks") or {}).get(rank, {}).get("output_throughput")) or 0.0)
        ax.bar(np.arange(len(done)) + (i - (len(bars) - 1) / 2) * width, ys, width, label=label, color=color)
    ax.set_xticks(np.arange(len(done)), list(done))
    ax.set_ylabel("output tokens/s")
    ax.set_title("ZeroDP (ours) vs vanilla SGLang, dp=2")
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    ax.grid(True, axis="y", alpha=0.3)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------------- main
def _kill_children() -> None:
    """Kill the replay clients still running (their threads then return)."""
    with _CHILDREN_LOCK:
        children = list(_CHILDREN)
    for proc in children:
        try:
            proc.kill()
        except OSError:
            pass


def _stop_everything(servers: Mapping[str, ServerProcess]) -> None:
    """Kill the replay clients still running, then stop both servers (in parallel: each may take 20 s)."""
    _kill_children()
    threads = [threading.Thread(target=srv.stop) for srv in servers.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def _gzip_logs(out_dir: Path) -> None:
    """server_<side>.log -> server_<side>.log.gz."""
    for side in SIDES:
        log = out_dir / f"server_{side}.log"
        if log.exists():
            with open(log, "rb") as src, gzip.open(str(log) + ".gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            log.unlink()


def wait_all_ready(servers: Mapping[str, ServerProcess], timeout_s: float) -> dict[str, float]:
    """Wait for every server's /health at once (ServerProcess.wait_ready in threads).

    Returns:
        Seconds from each server's start to ready, by side.

    Raises:
        RuntimeError: the first server that exits or is not ready in ``timeout_s`` (s), at once: the caller stops
            the others, which ends their waits.
    """
    pool = ThreadPoolExecutor(len(servers))
    futs = {pool.submit(srv.wait_ready, timeout_s): side for side, srv in servers.items()}
    try:
        return {futs[f]: f.result() for f in as_completed(futs)}
    finally:
        pool.shutdown(wait=False)


def skip_reason(now: float, t_start: float, deadline_s: float | None,
                servers: Mapping[str, ServerProcess]) -> str | None:
    """Why a step starting at ``now`` (time.time(), s) must be skipped: past ``t_start + deadline_s``, or a server
    process has exited; ``None`` when it may run."""
    if deadline_s is not None and now > t_start + deadline_s:
        return f"deadline: would start {now - t_start:.0f} s after the start (--deadline-s {deadline_s:g})"
    for side, srv in servers.items():
        rc = srv.proc.poll() if srv.proc is not None else None
        if rc is not None:
            return f"the {side} server exited with {rc} (see server_{side}.log.gz)"
    return None


def _raise_on_signal(signum, frame) -> None:  # noqa: ARG001
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Run everything (module docstring); returns the exit status (module docstring)."""
    args = parse_args(argv)
    t_start = time.time()
    deadline = None if args.deadline_s is None else t_start + args.deadline_s
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_on_signal)
    report: dict = {
        "command": shlex.join([sys.executable, "scripts/zerodp_compare.py", *args.argv]),
        "started_at": datetime.now(timezone.utc).isoformat(),
        "deadline_s": args.deadline_s,
        "servers": {}, "exactness": None, "workloads": {}, "errors": [], "tracebacks": [], "status": "running",
    }
    workloads = plan_workloads(args, out)
    steps = (["exactness"] if args.exactness > 0 else []) + [w.name for w in workloads]
    report["planned"] = steps
    servers: dict[str, ServerProcess] = {}
    failed = False

    def skipped(step: str) -> bool:
        """Record ``step`` as skipped when it is too late or a server is gone; True then."""
        nonlocal failed
        reason = skip_reason(time.time(), t_start, args.deadline_s, servers)
        if reason is None:
            return False
        failed |= not reason.startswith("deadline")
        entry = {"status": "skipped", "reason": reason}
        if step == "exactness":
            report["exactness"] = entry
        else:
            report["workloads"][step] = entry
        print(f"[zerodp_compare] {step}: skipped ({reason})", flush=True)
        write_report(report, out)
        return True

    def note_error(where: str, e: BaseException) -> None:
        """One line in ``errors`` (shown in compare.md), the traceback in ``tracebacks`` (compare.json)."""
        first = (str(e).splitlines() or [""])[0]
        report["errors"].append(f"{where}: {type(e).__name__}: {first}")
        report["tracebacks"].append(f"{where}: {traceback.format_exc()}")

    try:
        gpus = {"vanilla": args.vanilla_gpus, "ours": args.ours_gpus}
        ports = {"vanilla": args.vanilla_port, "ours": args.ours_port}
        for side in SIDES:
            srv = ServerProcess(LAUNCHERS[side], server_flags(args, side), ports[side], out / f"server_{side}.log",
                                gpus=gpus[side])
            srv.env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # each server makes its own
            servers[side] = srv.start()
            report["servers"][side] = {"command": shlex.join(srv.command), "gpus": gpus[side], "port": ports[side]}
        write_report(report, out)
        timeout = args.ready_timeout_s
        if deadline is not None:
            timeout = max(30.0, min(timeout, deadline - time.time()))
        for side, ready_s in wait_all_ready(servers, timeout).items():
            srv = servers[side]
            report["servers"][side].update(server_facts(srv, ready_s, out, side))
            report["servers"][side]["gpus"] = gpus[side]
            print(f"[zerodp_compare] {side} ready in {ready_s:.0f} s; KV tokens per rank "
                  f"{report['servers'][side]['kv_tokens']}", flush=True)
        report["errors"] += warm_up(servers, args.dp_size)
        write_report(report, out)

        if args.exactness > 0 and not skipped("exactness"):
            try:
                report["exactness"] = run_exactness(servers, args)
                print("[zerodp_compare] exactness: " + json.dumps(
                    {k: {x: v[x] for x in ("identical", "prompts", "max_abs_logprob_diff")}
                     for k, v in report["exactness"]["pairs"].items()}), flush=True)
            except Exception as e:  # noqa: BLE001
                failed = True
                report["exactness"] = {"status": "failed", "error": traceback.format_exc()}
                note_error("exactness", e)
            write_report(report, out)

        for wl in workloads:
            if skipped(wl.name):
                continue
            print(f"[zerodp_compare] {wl.name}: {wl.description}", flush=True)
            try:
                res = run_workload(wl, servers, out, deadline)
            except Exception:  # noqa: BLE001
                res = {"status": "failed", "description": wl.description, "errors": {"both": traceback.format_exc()}}
            except BaseException:
                report["workloads"][wl.name] = {"status": "interrupted", "description": wl.description}
                raise
            failed |= res["status"] != "ok"
            report["workloads"][wl.name] = res
            write_report(report, out)
            summary = {s: (res.get(s) or {}).get("metrics", {}).get("output_throughput") for s in SIDES}
            print(f"[zerodp_compare] {wl.name} {res['status']}: output tok/s {summary}", flush=True)
    except BaseException as e:  # noqa: BLE001 - record, then clean up and report whatever we have
        failed = True
        what = "interrupted" if isinstance(e, (KeyboardInterrupt, SystemExit)) else "error"
        note_error(what, e)
        print(f"[zerodp_compare] {what}: {e!r}", file=sys.stderr, flush=True)
    finally:
        for side, srv in servers.items():  # ZeroDP lines again: runtime errors come after start-up
            report["servers"][side]["zerodp_lines"] = zerodp_lines(srv.log_text())
        _stop_everything(servers)
        _gzip_logs(out)
        report["wall_s"] = round(time.time() - t_start, 1)
        report["status"] = "failed" if failed else "ok"
        write_report(report, out)
        if not args.no_plot:
            try:
                plot_throughput(report, out / "zerodp_throughput.png")
            except Exception as e:  # noqa: BLE001
                print(f"[zerodp_compare] plot failed: {e!r}", file=sys.stderr)
        print((out / "compare.md").read_text(), flush=True)
        print(f"[zerodp_compare] results in {out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
