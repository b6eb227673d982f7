"""Retired: ZeroDP against vanilla SGLang side by side on 4 GPUs now runs in `python -m sgl_sidp.bench.compare`. This
script keeps its old flags, prints the compare commands they map to, and runs them.

Vanilla `dpD` and ours `zerodp_dpD` (D = --dp-size) run at the same time with --parallel, vanilla on --vanilla-gpus
and ours on --ours-gpus (--gpus VANILLA,OURS), every step started on both at once. The exactness check is a first,
separate call (compare's --exact with the vanilla reference TP1 of one replica: with the reference in the same call,
--parallel would no longer pair dpD with zerodp_dpD). Flags, old -> compare:

  --ours-extra "--zerodp-layers all"   zerodp_dpD_all (no other --ours-extra has a name in compare)
  --exactness N                        --exact (compare's 5 fixed prompts of 5 to 4,000 tokens, on every DP rank)
  --exactness-new-tokens K             --exact-tokens K
  --decode-heavy N, its -input-len I   --burst N+I+O
    and -output-len O
  --trace-mooncake F, --azure-code F   --trace F; each trace's window as --trace-args "--start-s S --duration-s W",
                                       its --*-time-scale X as --rates 1/X (both traces the same: compare gives every
                                       trace the same), with --max-context-len, --seed and --replay-extra
  --model-path, --load-format,         the same
    --ready-timeout-s, --out-dir
  --attention-backend, --sampling-backend, --extra-args "..." of them all, with --common-extra
    --tokenizer-path, --mem-fraction-static
  --vanilla-port P                     --port P (compare spaces its servers 50 ports apart)
  --deadline-s S                       --deadline-s: what is left of S at each call (compare starts no server after it)

Ignored, with a line saying so: --exactness-top-k (compare compares the tokens and their logprobs, not top-k sets),
--ours-port, --no-metrics (compare always serves /metrics) and --no-plot. Refused: --vanilla-extra (compare gives
every configuration the same flags) and an --ours-extra other than the one above. compare reports per DP rank the
KV tokens and the burst's decode tokens, not each rank's TTFT and TPOT.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sgl_sidp.bench import retired

SCRIPT = "zerodp_compare.py"
#: --ours-extra values with a compare name: the option they add to zerodp_dpD
OURS_EXTRA = {"": "", "--zerodp-layers all": "_all", "--zerodp-layers=all": "_all", "--sidp-zerodp-layers all": "_all"}
IGNORED = {"exactness_top_k": "bench.compare compares tokens and their logprobs, not top-k sets",
           "ours_port": "bench.compare spaces its servers' ports from --port (--vanilla-port)",
           "no_metrics": "bench.compare always serves /metrics", "no_plot": "bench.compare draws its own plot"}


def compare_calls(a: argparse.Namespace) -> list[list[str]]:
    """bench.compare's calls for the old flags: the exactness check, then vanilla and ours side by side (module
    docstring).

    Raises:
        ValueError: a flag bench.compare has no counterpart of.
    """
    ours = " ".join(shlex.split(a.ours_extra))
    if ours not in OURS_EXTRA:
        raise ValueError(f"--ours-extra {a.ours_extra!r}: bench.compare's only ZeroDP option is --zerodp-layers all")
    if a.vanilla_extra.strip():
        raise ValueError("--vanilla-extra: bench.compare gives every configuration the same flags (--common-extra)")
    ours = f"zerodp_dp{a.dp_size}{OURS_EXTRA[ours]}"
    extra = ["--attention-backend", a.attention_backend, "--sampling-backend", a.sampling_backend]
    extra += ["--tokenizer-path", a.tokenizer_path] if a.tokenizer_path else []
    extra += ["--mem-fraction-static", str(a.mem_fraction_static)] if a.mem_fraction_static is not None else []
    common = ["--model-path", a.model_path, "--load-format", a.load_format, "--gpus", f"{a.vanilla_gpus},{a.ours_gpus}",
              "--out-dir", str(a.out_dir), "--port", str(a.vanilla_port), "--ready-timeout-s", f"{a.ready_timeout_s:g}",
              f"--extra-args={shlex.join(extra + shlex.split(a.common_extra))}"]
    calls = [[*common, "--configs", ours, "--exact", "--exact-tokens", str(a.exactness_new_tokens)]] if a.exactness > 0 else []
    timed = ["--burst", f"{a.decode_heavy}+{a.decode_heavy_input_len}+{a.decode_heavy_output_len}"] if a.decode_heavy > 0 else []
    replay = (["--max-context-len", str(a.max_context_len)] if a.max_context_len else []) + [
        "--seed", str(a.seed), *shlex.split(a.replay_extra)]
    seen: dict = {}
    for trace, start, duration, scale in ((a.trace_mooncake, a.mooncake_start_s, a.mooncake_duration_s, a.mooncake_time_scale),
                                          (a.azure_code, a.azure_start_s, a.azure_duration_s, a.azure_time_scale)):
        if trace is not None:
            timed += retired.trace_flags(trace, ["--start-s", f"{start:g}", "--duration-s", f"{duration:g}", *replay],
                                         [1 / scale], seen)
    if not (calls or timed):
        raise ValueError("nothing to measure: give --exactness N, --decode-heavy N or a trace")
    return calls + ([[*common, "--configs", f"dp{a.dp_size},{ours}", "--parallel", *timed]] if timed else [])


def parser() -> argparse.ArgumentParser:
    ap = retired.parser(__doc__)
    s = ap.add_argument_group("servers")
    s.add_argument("--model-path", required=True, help="model folder (both servers)")
    s.add_argument("--tokenizer-path", default=None, help="default: the model's, else the embedded tokenizer")
    s.add_argument("--load-format", default="dummy", help="SGLang's --load-format (default: %(default)s)")
    s.add_argument("--attention-backend", default="triton", help="SGLang's --attention-backend (default: %(default)s)")
    s.add_argument("--sampling-backend", default="pytorch", help="SGLang's --sampling-backend (default: %(default)s)")
    s.add_argument("--mem-fraction-static", type=float, default=None, help="both servers (default: SGLang's)")
    s.add_argument("--dp-size", type=int, default=2, help="D: DP replicas per server (default: %(default)s)")
    s.add_argument("--common-extra", default="", help="more flags for both servers (one shell-quoted string)")
    s.add_argument("--vanilla-extra", default="", help="refused (see below)")
    s.add_argument("--ours-extra", default="", help='"--zerodp-layers all" or nothing (see below)')
    s.add_argument("--vanilla-gpus", default="0,1", help="GPUs of vanilla (default: %(default)s)")
    s.add_argument("--ours-gpus", default="2,3", help="GPUs of ours (default: %(default)s)")
    s.add_argument("--vanilla-port", type=int, default=22000, help="the first server's port (default: %(default)s)")
    s.add_argument("--ours-port", type=int, default=22100, help="ignored (see below)")
    s.add_argument("--no-metrics", action="store_true", help="ignored (see below)")
    s.add_argument("--ready-timeout-s", type=float, default=420.0, help="seconds a server may take to start "
                   "(default: %(default)s)")
    w = ap.add_argument_group("exactness and workloads")
    w.add_argument("--exactness", type=int, default=8, metavar="N", help="0: no exactness check; else compare's --exact")
    w.add_argument("--exactness-new-tokens", type=int, default=32, help="greedy tokens per prompt (default: %(default)s)")
    w.add_argument("--exactness-top-k", type=int, default=5, help="ignored (see below)")
    w.add_argument("--decode-heavy", type=int, default=0, metavar="N", help="N requests at once; 0: none")
    w.add_argument("--decode-heavy-input-len", type=int, default=1024, help="prompt tokens (default: %(default)s)")
    w.add_argument("--decode-heavy-output-len", type=int, default=1024, help="output tokens (default: %(default)s)")
    w.add_argument("--trace-mooncake", type=Path, default=None, help="Mooncake JSONL trace to replay")
    w.add_argument("--mooncake-start-s", type=float, default=0.0, help="window start, trace s (default: %(default)s)")
    w.add_argument("--mooncake-duration-s", type=float, default=120.0, help="window, trace s (default: %(default)s)")
    w.add_argument("--mooncake-time-scale", type=float, default=1.0, help=">1 slower (default: %(default)s)")
    w.add_argument("--azure-code", type=Path, default=None, help="Azure LLM inference (code) CSV trace to replay")
    w.add_argument("--azure-start-s", type=float, default=0.0, help="window start, trace s (default: %(default)s)")
    w.add_argument("--azure-duration-s", type=float, default=120.0, help="window, trace s (default: %(default)s)")
    w.add_argument("--azure-time-scale", type=float, default=1.0, help=">1 slower (default: %(default)s)")
    w.add_argument("--max-context-len", type=int, default=40960, help="longer trace requests are skipped; 0: no "
                   "limit (default: %(default)s)")
    w.add_argument("--replay-extra", default="--slo-ttft-ms 2000 --slo-tpot-ms 100",
                   help="more `python -m sgl_sidp.replay` flags for every trace (default: %(default)s)")
    w.add_argument("--seed", type=int, default=0, help="seed of the replays' prompts (default: %(default)s)")
    o = ap.add_argument_group("output and time")
    o.add_argument("--out-dir", type=Path, default=Path("zerodp_results"), help="compare's results folder "
                   "(default: %(default)s)")
    o.add_argument("--deadline-s", type=float, default=None, help="compare's --deadline-s, over all its calls")
    o.add_argument("--no-plot", action="store_true", help="ignored (see below)")
    return ap


def main(argv: list[str] | None = None) -> int:
    return retired.main(SCRIPT, parser(), compare_calls, IGNORED, argv)


if __name__ == "__main__":
    sys.exit(main())
