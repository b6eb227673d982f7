"""`python -m sgl_sidp.launch_server`: SGLang's server, with the overlay's flags.

Accepts every `python -m sglang.launch_server` flag plus ours (`--overlay-*`, `--zerodp-*`,
`--sidp-*`, `--shift-*`: `sgl_sidp.config.SidpConfig.add_cli_args`), validates both together
before any GPU memory is taken, hands the overlay settings to SGLang's child processes through
the environment, prints one line saying which overlay mode is on, then runs
SGLang's own launch (`sglang.launch_server.run_server`), exactly as
`python -m sglang.launch_server` does.

Every refusal before the server starts, whoever finds it (our checks, argparse, SGLang's
`ServerArgs`, no CUDA GPU), is printed as `sgl-sidp: error: ...` with exit status 2.

Without `--model-path` it serves the embedded default: a small Qwen3-architecture
config with random weights (`--load-format dummy`) and a bundled byte-level BPE
tokenizer (`sgl_sidp/default_model/`), so it starts on any single GPU with no
download.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from importlib.metadata import entry_points
from pathlib import Path

from sgl_sidp.config import ENV_VAR, SidpConfig, SidpConfigError, SidpMode, renamed_flags
from sgl_sidp.feature import flag_given
from sgl_sidp.model_info import DEFAULT_MODEL_DIR
from sgl_sidp.process import LAUNCHER_PID_ENV

PLUGIN_NAME = "sgl_sidp"
PROG = "python -m sgl_sidp.launch_server"


class ArgumentParser(argparse.ArgumentParser):
    """argparse named `PROG`, whose errors are a one-line `SidpConfigError` (printed `sgl-sidp: error: ...`, exit 2)
    instead of argparse's usage dump under whichever parser found it."""

    def __init__(self, **kwargs):
        super().__init__(**{"prog": PROG, **kwargs})

    def error(self, message: str):
        raise SidpConfigError([f"{message} (see {PROG} --help)"])


def with_default_model(argv: list[str]) -> list[str]:
    """Prepend the embedded default model's flags when `argv` names no model.

    `--load-format dummy` is added only with the default model and only if the
    user did not choose a load format. A `--config` file may name the model, so
    it disables the default.
    """
    if flag_given(argv, "--model-path", "--model", "--config"):
        return list(argv)
    extra = ["--model-path", str(DEFAULT_MODEL_DIR)]
    if not flag_given(argv, "--load-format"):
        extra += ["--load-format", "dummy"]
    return extra + list(argv)


def overlay_parser() -> ArgumentParser:
    """A parser of only our flags (no abbreviations, so it never eats SGLang's)."""
    parser = ArgumentParser(add_help=False, allow_abbrev=False)
    SidpConfig.add_cli_args(parser)
    return parser


def split_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(our flags, parsed; SGLang's argv, with the default model's flags where it names none).

    Raises:
        SidpConfigError: an old spelling of one of our flags (one line each, naming the new one) or a bad value.
    """
    renamed = renamed_flags(argv)
    if renamed:
        raise SidpConfigError(renamed)
    return overlay_parser().parse_known_args(with_default_model(argv))


def full_parser() -> ArgumentParser:
    """Our flags, first, then SGLang's `ServerArgs` flags (for `--help`)."""
    from sglang.srt.server_args import ServerArgs

    parser = ArgumentParser(
        usage=f"{PROG} [-h] [--overlay-mode {{{','.join(m.value for m in SidpMode)}}}]\n"
        f"{' ' * len('usage: ' + PROG)} [--zerodp-*|--sidp-*|--shift-* flags] [sglang.launch_server flags]",
        description="SGLang server with the sgl-sidp overlay. Every sglang.launch_server flag works; "
        "without --model-path an embedded small Qwen3 model with random weights is served.",
    )
    SidpConfig.add_cli_args(parser)
    ServerArgs.add_cli_args(parser.add_argument_group("SGLang's flags (python -m sglang.launch_server)"))
    return parser


def require_cuda_gpu() -> None:
    """Refuse to go on without a CUDA GPU (NVML's count and $CUDA_VISIBLE_DEVICES; initialises neither CUDA nor
    torch, so it is cheap and runs before SGLang would query the device).

    Raises:
        SidpConfigError: no GPU visible, one line.
    """
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        import pynvml

        pynvml.nvmlInit()
        count, why = pynvml.nvmlDeviceGetCount(), "NVML sees no GPU"
    except Exception as e:  # no driver, no NVML
        count, why = 0, f"NVML: {e}"
    if vis is not None and vis.split(",")[0].strip() in ("", "-1"):
        count, why = 0, "it hides every GPU"
    if count == 0:
        shown = "CUDA_VISIBLE_DEVICES unset" if vis is None else f"CUDA_VISIBLE_DEVICES={vis}"
        raise SidpConfigError([f"no CUDA GPU visible: sgl-sidp serves on NVIDIA GPUs ({shown}; {why})"])


def plugin_entry_point_visible() -> bool:
    """Whether SGLang's `load_plugins()` will find and run our entry point in child processes."""
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP

    if not any(ep.name == PLUGIN_NAME for ep in entry_points(group=GENERAL_PLUGINS_GROUP)):
        return False
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    return not allowed or PLUGIN_NAME in {x.strip() for x in allowed.split(",")}


def sglang_raw_args(argv: list[str]) -> argparse.Namespace:
    """SGLang's flags parsed by argparse alone (no `ServerArgs`, so no device query).

    Merges a `--config` YAML file the way `sglang.srt.server_args.prepare_server_args` does.

    Raises:
        SidpConfigError: argparse's error (an unknown flag, a bad value) or the `--config` file's, one line.
    """
    from sglang.srt.server_args import ServerArgs

    parser = ArgumentParser()
    ServerArgs.add_cli_args(parser)
    with _deprecated_aliases_quiet():
        if "--config" in argv:
            from sglang.srt.server_args_config_parser import ConfigArgumentMerger

            try:
                argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
            except ValueError as e:
                raise SidpConfigError([f"--config: {e}"]) from None
        return parser.parse_args(argv)


#: the logger of SGLang's argparse actions for deprecated flags (`DeprecatedAliasStoreAction`, ...): each logs its
#: warning whenever argparse meets the flag
SGLANG_ARGPARSE_LOGGER = "sglang.srt.arg_groups.argparse_actions"


@contextlib.contextmanager
def _deprecated_aliases_quiet():
    """SGLang's deprecated-flag warnings off while the launcher parses SGLang's flags for itself (`sglang_raw_args`,
    in `resolve_auto` and `parse`): SGLang's own parse (`prepare_server_args`) still warns, once, as vanilla SGLang does."""
    log = logging.getLogger(SGLANG_ARGPARSE_LOGGER)
    was, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = was


def _drop_flags(argv: list[str], flags: dict[str, bool]) -> list[str]:
    """`argv` without `flags` (flag -> whether it takes a value), in `--flag value` or `--flag=value` form."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in flags:
            skip = flags[name] and "=" not in a
            continue
        out.append(a)
    return out


def resolve_auto(argv: list[str]) -> list[str]:
    """With `--overlay-mode auto`: the planner's winner for this model, GPU kind and GPU count (`--tp-size` x
    `--dp-size` where given, else every visible GPU) on `--overlay-plan-workload` (by goodput with
    `--overlay-plan-slo-ttft-ms` and `--overlay-plan-slo-tpot-ms`), printed with its table; returns
    `argv` with the winner's flags in place of the mode, TP, DP and DP-attention flags (and of the planning flags
    where the winner is vanilla SGLang; a technique keeps them: they still decide at its launch). Other argv is
    returned as is.

    Raises:
        SidpConfigError: no local config.json, an unknown GPU, or nothing the planner can predict (e.g. no
            calibration of a shard: the line says how to make one).
    """
    ours, rest = split_args(argv)
    if ours.overlay_mode != SidpMode.AUTO.value:
        return argv
    from sgl_sidp.peer.topology import gpu_name, visible_gpu_count
    from sgl_sidp.plan.planner import PlanError, plan, table
    from sgl_sidp.plan.server_flags import ServerFlags, ServerFlagsError
    from sgl_sidp.plan.steps import GPUS, gpu_key

    raw = sglang_raw_args(rest)
    n = raw.tp_size * raw.dp_size if flag_given(rest, "--tp-size", "--tp", "--dp-size", "--dp") else visible_gpu_count()
    name = gpu_name(0)
    kind = gpu_key(name)
    if not n or kind is None:
        raise SidpConfigError([f"--overlay-mode auto: the planner knows GPU kinds {', '.join(GPUS)}; "
                               f"this host's GPU 0 is {name or 'not visible'}"])
    cfg = SidpConfig.from_cli_args(ours)
    unused = cfg.unused_flags()  # e.g. one SLO flag without the other: refused before the planner runs
    if unused:
        raise SidpConfigError(unused)
    try:
        result = plan(raw.model_path, n, kind, cfg.plan_workload, slo=cfg.plan_slo, server=ServerFlags.from_namespace(raw))
    except (PlanError, ServerFlagsError) as e:
        raise SidpConfigError([f"--overlay-mode auto: {e}"]) from None
    print(table(result), flush=True)
    chosen = result["launch"][result["launch"].index("--model-path") + 2:]
    why = result["reason"].split(": ", 1)[-1]  # "the highest predicted throughput on ... (..., 1.01x the next, ...)"
    print(f"sgl-sidp: --overlay-mode auto starts {result['winner']} (predicted; {why}): "
          f"{' '.join(chosen) or 'TP1, one GPU'}", flush=True)
    dropped = {"--overlay-mode": True, "--tp-size": True, "--tp": True, "--dp-size": True, "--dp": True,
               "--enable-dp-attention": False}
    if "--overlay-mode" not in chosen:  # vanilla SGLang: nothing reads the workload; with a mode, it still decides
        dropped.update({"--overlay-plan-workload": True, "--overlay-plan-slo-ttft-ms": True,
                        "--overlay-plan-slo-tpot-ms": True})  # (e.g. `Feature.declines`, SiDP's B_th at launch)
    return _drop_flags(argv, dropped) + chosen


def parse(argv: list[str]):
    """Split and validate `argv` into (SidpConfig, SGLang ServerArgs, SGLang's flags as argparse parsed them, before
    the feature's defaults: `sglang_raw_args`, what the start-up line plans with, `mode_verdict`).

    Our settings are checked against SGLang's raw flags before `ServerArgs` is built
    (which queries the GPU), so a bad combination never touches a device. The mode's feature
    (`SidpConfig.feature`) brings its own checks and its SGLang defaults, and checks SGLang's resolved
    `ServerArgs` too (`Feature.resolve`), still before any model or KV memory is taken. A mode predicted to gain
    nothing over vanilla SGLang (`Feature.declines`) is turned off with one line saying why.

    Raises:
        SidpConfigError: one line per problem; SGLang's own refusal of its flags (`ServerArgs`) as one line too.
    """
    ours, rest = split_args(argv)
    cfg = SidpConfig.from_cli_args(ours)
    raw = sglang_raw_args(rest)
    cfg.validate_against(raw)
    declined = _declined(cfg, raw)
    if declined:  # predicted to gain nothing over vanilla SGLang: start vanilla SGLang, and say so
        print(f"sgl-sidp: {declined}", flush=True)
        cfg = cfg.model_copy(update={"mode": SidpMode.OFF})
    if cfg.feature is not None:
        rest = cfg.feature.sglang_defaults(rest)
    if cfg.active and not plugin_entry_point_visible():
        raise SidpConfigError(
            [
                f"the overlay is on but SGLang cannot see the '{PLUGIN_NAME}' plugin entry point "
                "(group sglang.srt.plugins), so its scheduler processes would run without it: "
                "install the package (`pip install -e .`, or `pip install --no-deps --target DIR .` "
                "with DIR on PYTHONPATH) and do not exclude it with SGLANG_PLUGINS"
            ]
        )
    # Children inherit os.environ: set it before SGLang's own load_plugins() in this process.
    cfg.to_env()
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # where a scheduler sends SIGQUIT to stop the server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    try:
        server_args = prepare_server_args(rest)
    except Exception as e:  # noqa: BLE001 - ServerArgs refuses with ValueError, assert, RuntimeError...: one line
        raise SidpConfigError([sglang_refusal(e)]) from None
    if cfg.feature is not None:  # what needs SGLang's resolved settings; the children get the resolved config
        cfg, problems = cfg.feature.resolve(cfg, server_args)
        if problems:
            raise SidpConfigError(problems)
        cfg.to_env()
    return cfg, server_args, raw


def _declined(cfg: SidpConfig, raw: argparse.Namespace) -> str:
    """The mode's `Feature.declines` line, or "" (no feature, or it runs). A failure of the prediction behind it never
    stops the server the user asked for: one line says so, and the mode runs."""
    if cfg.feature is None:
        return ""
    try:
        return cfg.feature.declines(cfg, raw)
    except Exception as e:  # noqa: BLE001 - the prediction informs; any failure of it is the same for the user
        print(f"sgl-sidp: --overlay-mode {cfg.mode.value}: no prediction of whether it gains over vanilla SGLang "
              f"({type(e).__name__}: {e}); it runs as asked", flush=True)
        return ""


def sglang_refusal(e: BaseException) -> str:
    """One line for SGLang refusing its settings (`prepare_server_args`): its message, else where it failed."""
    why = " ".join(str(e).split())
    if not why:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        why = f"{type(e).__name__} at {Path(frame.filename).name}:{frame.lineno}: {frame.line}"
    return f"SGLang: {why}"


def describe(cfg: SidpConfig, server_args) -> str:
    """The one line printed at start-up."""
    model = "embedded default" if Path(server_args.model_path) == DEFAULT_MODEL_DIR else server_args.model_path
    signal = "on" if cfg.signal_enabled else "off"
    line = (
        f"sgl-sidp: overlay mode={cfg.mode.value} (batch signal {signal}); model={model}, "
        f"load_format={server_args.load_format}, dp={server_args.dp_size}, tp={server_args.tp_size}"
    )
    extra = cfg.feature.describe(cfg, server_args) if cfg.feature is not None else ""
    if cfg.active:
        from sgl_sidp.plugin import installed_hooks

        extra += ("; " if extra else "") + f"{len(installed_hooks())} hooks applied in the launcher (each scheduler logs its own)"
    return line + (f"; {extra}" if extra else "")


def mode_verdict(cfg: SidpConfig, server_args, raw=None) -> str:
    """The start-up line of an explicit mode: the planner's predicted ratio of the configuration it runs to the best
    vanilla one of the same GPUs on `--overlay-plan-workload` (`plan.verdict`), every configuration planned with the
    SGLang flags the user gave (`raw`: SGLang's parsed, unresolved flags; None: SGLang's defaults), a warning where it
    is predicted to lose, or why there is no prediction."""
    from sgl_sidp.peer.topology import gpu_name
    from sgl_sidp.plan.verdict import verdict

    try:
        line, _ = verdict(server_args.model_path, int(server_args.dp_size), int(server_args.tp_size),
                          gpu_name(int(server_args.base_gpu_id or 0)), cfg.mode.value, getattr(cfg, cfg.mode.value),
                          cfg.plan_workload, cfg.plan_slo, raw)
    except Exception as e:  # noqa: BLE001 - the prediction informs; it never stops a server the user asked for
        line = f"sgl-sidp: --overlay-mode {cfg.mode.value}: no prediction against vanilla SGLang: {type(e).__name__}: {e}"
    return line


def main(argv: list[str] | None = None) -> None:
    """Console entry point (`python -m sgl_sidp.launch_server` / `sgl-sidp-server`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if flag_given(argv, "-h", "--help"):
        full_parser().print_help()
        return
    try:
        SidpConfig.from_cli_args(split_args(argv)[0])  # old spellings and our values: no SGLang import, no device
        require_cuda_gpu()
        argv = resolve_auto(argv)
        cfg, server_args, raw = parse(argv)
    except SidpConfigError as e:
        print(f"sgl-sidp: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(describe(cfg, server_args), flush=True)
    if cfg.feature is not None:
        print(mode_verdict(cfg, server_args, raw), flush=True)

    from sglang.launch_server import run_server
    from sglang.srt.utils import kill_process_tree

    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
elif __name__ == "__mp_main__" and os.environ.get(ENV_VAR):
    # multiprocessing's spawn re-imports the parent's main module as __mp_main__ in every child
    # before it runs the child's target. SGLang loads plugins in its scheduler processes but not
    # in its DP controller, whose routing a feature may hook (ZeroDP's): load them here.
    from sglang.srt.plugins import load_plugins

    load_plugins()
