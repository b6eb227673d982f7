"""What the retired per-technique compare scripts share (`scripts/shift_compare.py`, `sidp_compare.py`,
`zerodp_compare.py`): each keeps its old flags, maps them onto `python -m sgl_sidp.bench.compare` (its docstring says
how), prints the new command and runs it. Their own result folders (a `<config>.json` per configuration, or ZeroDP's
`compare.json`) stay readable: each holds the `compare.md` the script wrote when it ran, and
`scripts/plan_validate_multi_gpu.py` reads shift_compare.py's JSON files."""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path
from typing import Callable, Sequence

COMPARE = ("python", "-m", "sgl_sidp.bench.compare")


def parser(doc: str, configs: str | None = None, port: int | None = None) -> argparse.ArgumentParser:
    """A retired script's parser: its docstring's first paragraph as description, the rest (the flag mapping) as
    epilog, and `--print-only`; with `configs` (their default), also the flags shift_compare.py and sidp_compare.py
    share (`serial_args`)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--print-only", action="store_true", help="print the compare command and run nothing")
    if configs is None:
        return ap
    ap.add_argument("--model", default=".gpu/models/Qwen3-32B", help="--model-path of every server (default: %(default)s)")
    ap.add_argument("--configs", default=configs, help="old configuration names, comma-separated (see below; default: "
                    "%(default)s)")
    ap.add_argument("--out-dir", required=True, help="compare's results folder")
    ap.add_argument("--gpus", default="0,1", help="GPUs every configuration runs on (default: %(default)s)")
    ap.add_argument("--port", type=int, default=port, help="the first server's port (default: %(default)s)")
    ap.add_argument("--mem-fraction-static", type=float, default=None, help="SGLang's --mem-fraction-static")
    ap.add_argument("--report", action="store_true", help="only the report of --out-dir")
    return ap


def serial_args(a: argparse.Namespace, names: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """compare's arguments for shift_compare.py's and sidp_compare.py's shared flags: configurations `names` one after
    another on --gpus, the model with dummy weights, and the flags they gave every server (triton attention, pytorch
    sampling, --mem-fraction-static, then `extra`)."""
    flags = ["--attention-backend", "triton", "--sampling-backend", "pytorch"]
    flags += ["--mem-fraction-static", str(a.mem_fraction_static)] if a.mem_fraction_static else []
    return ["--model-path", a.model, "--load-format", "dummy", "--gpus", a.gpus, "--configs", ",".join(names),
            "--out-dir", a.out_dir, "--port", str(a.port), f"--extra-args={shlex.join([*flags, *extra])}"]


def main(script: str, ap: argparse.ArgumentParser, calls_of: Callable[[argparse.Namespace], list[list[str]]],
         reasons: dict[str, str], argv: Sequence[str] | None = None) -> int:
    """A retired script's run: `--report` (where it has one), else compare's calls for its flags (`calls_of`; a
    ValueError is the usage error it says), printed and run (`run`); `reasons`: its flags compare ignores."""
    a = ap.parse_args(argv)
    if getattr(a, "report", False):
        return report(script, Path(a.out_dir))
    try:
        calls = calls_of(a)
    except ValueError as e:
        ap.error(str(e))
    return run(script, calls, ignored(ap, a, reasons), a.print_only, getattr(a, "deadline_s", None))


def ignored(ap: argparse.ArgumentParser, a: argparse.Namespace, reasons: dict[str, str]) -> list[str]:
    """"--flag ignored: why" of each old flag in `reasons` (by its dest) given a value other than its default."""
    return [f"--{dest.replace('_', '-')} ignored: {why}" for dest, why in reasons.items()
            if getattr(a, dest) != ap.get_default(dest)]


def run(script: str, calls: Sequence[list[str]], dropped: Sequence[str] = (), print_only: bool = False,
        deadline_s: float | None = None) -> int:
    """Print the lines on the old flags compare has no use for (`dropped`, from `ignored`), then print and run each
    compare command (`calls`, compare's arguments) in order; with `deadline_s`, each call gets `--deadline-s` of
    what is left of it.

    Returns:
        the worst exit status of the calls (0 with `print_only`).
    """
    t0 = time.time()
    for line in dropped:
        print(f"{script}: {line}", flush=True)
    rc = 0
    for argv in calls:
        if deadline_s is not None:
            argv = [*argv, "--deadline-s", f"{max(0.0, deadline_s - (time.time() - t0)):.0f}"]
        print(f"{script} is retired into sgl_sidp.bench.compare; this run is: {shlex.join([*COMPARE, *argv])}",
              flush=True)
        if not print_only:
            from sgl_sidp.bench import compare

            rc = max(rc, compare.main(argv))
    return rc


def report(script: str, out_dir: Path) -> int:
    """`--report` of a results folder: compare's report of it, or, for a folder the retired script wrote itself
    (JSON files at its top), where that script's table is."""
    if any(p.name != "summary.json" for p in out_dir.glob("*.json")):
        print(f"{out_dir} holds results of the retired {script}: their table is {out_dir / 'compare.md'}, written when "
              "they ran (scripts/plan_validate_multi_gpu.py reads shift_compare.py's JSON files)")
        return 0
    from sgl_sidp.bench.compare_report import write_report

    print(f"{script} is retired into sgl_sidp.bench.compare; this report is: "
          f"{shlex.join([*COMPARE, '--report', '--out-dir', str(out_dir)])}", flush=True)
    print(write_report(out_dir))
    return 0


def trace_flags(file: Path | str, rest: Sequence[str], rates: Sequence[float], seen: dict) -> list[str]:
    """compare's `--trace FILE`, and its `--trace-args`/`--rates` on the first trace: compare gives every trace the
    same replay arguments and rates, so a trace asking for others is refused.

    Args:
        seen: the arguments of the traces mapped so far (updated).

    Raises:
        ValueError: replay arguments or rates unlike an earlier trace's.
    """
    args = (shlex.join(rest), ",".join(f"{r:g}" for r in rates))
    if seen and seen["args"] != args:
        raise ValueError(f"trace {file}: replay arguments {args} unlike the first trace's {seen['args']}; compare "
                         "gives every trace the same: run it separately (its own --out-dir)")
    if seen:
        return ["--trace", str(file)]
    seen["args"] = args
    return ["--trace", str(file)] + ([f"--trace-args={args[0]}"] if args[0] else []) + (
        ["--rates", args[1]] if args[1] != "1" else [])
