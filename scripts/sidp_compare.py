"""Retired: SiDP against vanilla SGLang now runs in `python -m sgl_sidp.bench.compare`. This script keeps its old
flags, prints the compare command they map to, and runs it.

Flags, old -> compare (D = --dp replicas of T = --tp GPUs; every configuration runs on --gpus, one after another):

  --configs dp, tp, tp1           --configs dpD (tpT_dpD when T > 1), tp(D x T), tp1
  --configs dp_attn               dpD_attn (T = 1 only: the planner's DP attention spans every GPU)
  --configs sidp_was, sidp_cas    sidp_dpD_was, sidp_dpD_cas (sidp_dpD_tpT_... when T > 1)
  --configs sidp_auto, --b-th B   sidp_dpD_auto_bthB; without --b-th, sidp_dpD_auto: the launcher's B_th (from its
                                  calibration), not the crossover of step sweeps the old script took
  --jobs P+O --requests S         --burst S+P+O (one job a call; the same S requests for every configuration, spread
                                  by SGLang's router)
  --model M                       --model-path M --load-format dummy
  --mem-fraction-static X         --extra-args "--attention-backend triton --sampling-backend pytorch
                                    --mem-fraction-static X"
  --out-dir, --gpus, --port       the same
  --report                        compare's report; a folder this script wrote itself keeps the compare.md it wrote
                                  then

Ignored, with a line saying so: --step-batches (the decode step time against batch, paper Fig. 11: compare has no
such step) and --max-requests (compare does not size a job to each configuration's KV cache). The share of forwards
per SiDP mode is no longer recorded. Refused: sidp_was_unshifted (--sidp-fetch-order forward is no configuration
option of compare's names), dp_attn with T > 1, more than one --jobs, and --jobs without --requests.
"""

from __future__ import annotations

import argparse
import sys

from sgl_sidp.bench import retired

SCRIPT = "sidp_compare.py"
OLD = ("dp", "dp_attn", "tp", "sidp_was", "sidp_was_unshifted", "sidp_cas", "sidp_auto", "tp1")
IGNORED = {"step_batches": "bench.compare has no decode-step sweep",
           "max_requests": "bench.compare sends --requests S to every configuration"}


def config_name(old: str, d: int, t: int, b_th: int | None = None) -> str:
    """compare's name of an old configuration for D replicas of T GPUs.

    Raises:
        ValueError: one bench.compare has no name for.
    """
    sidp = f"sidp_dp{d}" + (f"_tp{t}" if t > 1 else "")
    names = {"dp": f"dp{d}" if t == 1 else f"tp{t}_dp{d}", "tp": f"tp{d * t}", "tp1": "tp1",
             "sidp_was": f"{sidp}_was", "sidp_cas": f"{sidp}_cas", "sidp_auto": f"{sidp}_auto" + (f"_bth{b_th}" if b_th else "")}
    if t == 1:
        names["dp_attn"] = f"dp{d}_attn"
    if old in names:
        return names[old]
    if old == "sidp_was_unshifted":
        raise ValueError("--configs sidp_was_unshifted: --sidp-fetch-order forward is no option of bench.compare's names")
    if old == "dp_attn":
        raise ValueError(f"--configs dp_attn with --tp {t}: the planner's dpN_attn is DP attention over all N GPUs")
    raise ValueError(f"unknown configuration {old!r}; choose from {', '.join(OLD)}")


def compare_args(a: argparse.Namespace) -> list[str]:
    """bench.compare's arguments for the old flags (module docstring).

    Raises:
        ValueError: a configuration or job bench.compare cannot run as asked.
    """
    names = [config_name(old, a.dp, a.tp, a.b_th) for old in filter(None, a.configs.split(","))]
    argv = retired.serial_args(a, names)
    if len(a.jobs) > 1:
        raise ValueError(f"--jobs {','.join(a.jobs)}: bench.compare runs one burst a call; one call per job, each "
                         "into its own --out-dir")
    if a.jobs and not a.requests:
        raise ValueError("--jobs without --requests: bench.compare sends the same S requests to every configuration; "
                         "give --requests S")
    if a.jobs:
        argv += ["--burst", f"{a.requests}+{a.jobs[0]}"]
    return argv


def parser() -> argparse.ArgumentParser:
    ap = retired.parser(__doc__, configs="dp,dp_attn,tp,sidp_was", port=25000)
    ap.add_argument("--dp", type=int, default=2, help="D: DP replicas of the DP configurations (default: %(default)s)")
    ap.add_argument("--tp", type=int, default=1, help="T: GPUs per replica (default: %(default)s)")
    ap.add_argument("--step-batches", default=None, metavar="B,...", help="ignored (see below)")
    ap.add_argument("--jobs", type=lambda s: [x for x in s.split(",") if x], default=[], metavar="P+O",
                    help="an offline job: P prompt and O forced output tokens per request (with --requests)")
    ap.add_argument("--max-requests", type=int, default=2000, help="ignored (see below)")
    ap.add_argument("--requests", type=int, default=None, help="S: requests of the job, for every configuration")
    ap.add_argument("--b-th", type=int, default=None, help="B_th of sidp_auto (tokens per rank)")
    return ap


def main(argv: list[str] | None = None) -> int:
    return retired.main(SCRIPT, parser(), lambda a: [compare_args(a)], IGNORED, argv)


if __name__ == "__main__":
    sys.exit(main())
