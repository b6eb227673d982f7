"""Retired: Shift Parallelism against vanilla SGLang now runs in `python -m sgl_sidp.bench.compare`. This script keeps
its old flags, prints the compare command they map to, and runs it.

Flags, old -> compare (P = the number of --gpus; every configuration runs on all of them, one after another):

  --configs tp,dp,dp_attn,shift   --configs tpP,dpP,dpP_attn,shift_spP_tp1
  --threshold T                   the shift configuration's name ends in _thT (shift_spP_tp1_thT)
  --model M                       --model-path M --load-format dummy
  --mem-fraction-static X         --extra-args "--attention-backend triton --sampling-backend pytorch
  --extra-args E                    --mem-fraction-static X E" (the old script's fixed flags come first)
  --burst N+P+O                   --burst N+P+O
  --trace NAME=REPLAY_ARGS        --trace FILE (the --trace of REPLAY_ARGS) --trace-args "the rest of REPLAY_ARGS"
                                  (compare gives every trace the same rest; NAME gives way to the file's stem)
  --out-dir, --gpus, --port       the same
  --report                        compare's report; a folder this script wrote itself keeps the compare.md it wrote
                                  then, and scripts/plan_validate_multi_gpu.py reads its JSON files

Ignored, with a line saying so (compare has no such step): --ttft and --repeats (single-prompt TTFT; the burst has
TTFT p50 and p99), --low-traffic (another burst: run compare again with --burst C+P+O into another --out-dir). The
forwards per Shift configuration (`sglang:sidp_shift_forwards_total`) are no longer recorded. Refused, as compare has
no such configuration: shift_sp1 (SP 1, the mode's wiring, is no planner configuration), tp_eager_prefill and
shift_eager_prefill (tpP or shift_spP_tp1 with --extra-args "--disable-prefill-cuda-graph" into their own --out-dir).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from sgl_sidp.bench import retired

SCRIPT = "shift_compare.py"
#: old configuration -> compare's name, by P
NAMES = {"tp": "tp{p}", "dp": "dp{p}", "dp_attn": "dp{p}_attn", "shift": "shift_sp{p}_tp1"}
REFUSED = {"shift_sp1": "SP 1 (the mode's wiring) is no planner configuration: bench.compare does not run it",
           "tp_eager_prefill": "no per-configuration flags in bench.compare: run tpP with --extra-args "
                               "\"--disable-prefill-cuda-graph\" into its own --out-dir",
           "shift_eager_prefill": "no per-configuration flags in bench.compare: run shift_spP_tp1 with --extra-args "
                                  "\"--disable-prefill-cuda-graph\" into its own --out-dir"}
IGNORED = {"ttft": "bench.compare has no single-prompt TTFT step (its burst has TTFT p50 and p99)",
           "repeats": "goes with --ttft",
           "low_traffic": "bench.compare runs one burst a call: run it again with --burst C+P+O into another --out-dir"}


def split_trace(job: str) -> tuple[str, list[str]]:
    """(trace file, the other replay arguments) of an old `--trace NAME=REPLAY_ARGS`.

    Raises:
        ValueError: no `=`, or no --trace in REPLAY_ARGS.
    """
    name, eq, replay_args = job.partition("=")
    words = shlex.split(replay_args)
    for i, w in enumerate(words):
        if w == "--trace" and i + 1 < len(words):
            return words[i + 1], words[:i] + words[i + 2:]
        if w.startswith("--trace="):
            return w.split("=", 1)[1], words[:i] + words[i + 1:]
    raise ValueError(f"--trace {job!r}: expected NAME=REPLAY_ARGS with --trace FILE among the replay arguments"
                     if eq else f"--trace {name!r} is not NAME=REPLAY_ARGS")


def compare_args(a: argparse.Namespace) -> list[str]:
    """bench.compare's arguments for the old flags (module docstring).

    Raises:
        ValueError: a configuration or trace bench.compare cannot run as asked.
    """
    p = len([g for g in a.gpus.split(",") if g])
    names = []
    for old in filter(None, a.configs.split(",")):
        if old in REFUSED:
            raise ValueError(f"--configs {old}: {REFUSED[old]}")
        if old not in NAMES:
            raise ValueError(f"unknown configuration {old!r}; choose from {', '.join(NAMES)}")
        th = f"_th{a.threshold}" if old == "shift" and a.threshold is not None else ""
        names.append(NAMES[old].format(p=p) + th)
    argv = retired.serial_args(a, names, shlex.split(a.extra_args))
    argv += ["--burst", a.burst] if a.burst else []
    seen: dict = {}
    for job in a.trace:
        argv += retired.trace_flags(*split_trace(job), [1.0], seen)
    return argv


def parser() -> argparse.ArgumentParser:
    ap = retired.parser(__doc__, configs="tp,dp,shift", port=26000)
    ap.add_argument("--threshold", type=int, default=None, help="--shift-threshold of the shift configuration")
    ap.add_argument("--extra-args", default="", help="more flags for every configuration (one shell-quoted string)")
    ap.add_argument("--ttft", default=None, metavar="L,...", help="ignored (see below)")
    ap.add_argument("--repeats", type=int, default=3, help="ignored (see below)")
    ap.add_argument("--burst", default=None, metavar="N+P+O", help="N requests of P prompt and O output tokens at once")
    ap.add_argument("--low-traffic", default=None, metavar="C+P+O", help="ignored (see below)")
    ap.add_argument("--trace", action="append", default=[], metavar="NAME=REPLAY_ARGS",
                    help="a trace replay: NAME and `python -m sgl_sidp.replay` arguments with --trace FILE (repeatable)")
    return ap


def main(argv: list[str] | None = None) -> int:
    return retired.main(SCRIPT, parser(), lambda a: [compare_args(a)], IGNORED, argv)


if __name__ == "__main__":
    sys.exit(main())
