"""The SGLang plugin: registers the overlay's hooks in every SGLang process.

SGLang calls `load()` through its general-plugin entry point group (`sglang.srt.plugins`, see
`pyproject.toml`) from `load_plugins()`, which runs at the top of `run_scheduler_process` and in
the launching process (and, through `sgl_sidp.launch_server`, in the DP controller). The
overlay's settings arrive through the environment (`sgl_sidp.config.ENV_VAR`).

Per process, `load()` builds one `PluginContext` and, for each runtime class named in
`sgl_sidp.hooks.HOOKS` that this configuration needs, one runtime object `Class(context)`; the
hook bodies are that object's bound methods, so each body gets its state from the object it was
registered with.

- Off (`--overlay-mode off`, no `--overlay-batch-signal`): registers nothing at all.
- Idempotent: `HookRegistry` stacks a hook registered twice, so a second `load()` in the same
  process registers nothing more.
- Fail closed: a failure to read the settings or to apply any hook stops the server (`load`).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import pkgutil
import sys
from typing import Any, Callable

from sgl_sidp.config import SidpConfig, SidpConfigError
from sgl_sidp.hooks import hooks_for

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class PluginContext:
    """What every runtime of one process shares, handed to each at construction.

    Attributes:
        config: the settings `load()` read from the environment.
        installed: short names of the hooks SGLang applied in this process, in order.
        listeners: callables given each busy iteration's `IterationSignal` (the batch signal's
            subscribers, e.g. a feature's metrics).
        runtimes: "module:Class" -> the runtime object built for it.
    """

    config: SidpConfig
    installed: list[str]
    listeners: list[Callable[[Any], None]] = dataclasses.field(default_factory=list)
    runtimes: dict[str, Any] = dataclasses.field(default_factory=dict)


#: The context `load()` built in this process; kept only so that a second `load()` is a no-op.
_loaded: PluginContext | None = None


class PluginLoadError(RuntimeError):
    """The overlay could not set itself up in this process (bad settings, a hook SGLang did not apply)."""


def load() -> None:
    """SGLang entry point: register the hooks the current settings need (once per process), fail closed.

    SGLang's `load_plugins` logs a plugin's exception and goes on, and `HookRegistry.apply_hooks` does the same for a
    hook it cannot apply, which would leave this process running plain SGLang while the user asked for a mode. So
    this applies the hooks at once (`HookRegistry.apply_hooks`, idempotent: SGLang's own call after this one skips
    the targets already patched) and checks that each one is in its target's wrapper chain. Any failure stops the
    server: in the launcher, one line on stderr and exit code 2 (`SystemExit`, which SGLang does not catch); in a
    child process, `sgl_sidp.process.stop_server` with one line naming the process.

    One consequence: another plugin that SGLang loads after this one and that hooks the same SGLang symbols has
    those hooks skipped by SGLang's second `apply_hooks` (SGLang patches a target once).
    """
    global _loaded
    if _loaded is not None:
        return
    try:
        _loaded = _register(SidpConfig.from_env())
    except Exception as e:  # noqa: BLE001 - every failure here means this process would run without the overlay
        from sgl_sidp.process import in_launcher, process_name, stop_server

        why = f"{type(e).__name__}: {e}" if not isinstance(e, (PluginLoadError, SidpConfigError)) else str(e)
        message = f"sgl-sidp: the overlay could not load in {process_name()}: {why}".replace("\n", " ")
        if in_launcher():
            print(message, file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        stop_server(message + "; stopping the server")


def _register(cfg: SidpConfig) -> PluginContext:
    """Register and apply `cfg`'s hooks with SGLang's `HookRegistry`; the context, or `PluginLoadError` naming the
    hooks SGLang did not apply."""
    hooks = hooks_for(cfg)
    ctx = PluginContext(cfg, [])
    if not hooks:
        return ctx
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    bodies = []
    for hook in hooks:
        runtime = ctx.runtimes.get(hook.runtime)
        if runtime is None:
            runtime = ctx.runtimes[hook.runtime] = hook.runtime_class()(ctx)
        body = getattr(runtime, hook.method)
        HookRegistry.register(hook.target, body, HookType[hook.hook_type])
        bodies.append((hook, body))
    HookRegistry.apply_hooks()
    missing = [f"{h.hook_type} {h.target}" for h, body in bodies if not hook_applied(h.target, body)]
    if missing:
        raise PluginLoadError(f"SGLang did not apply {len(missing)} of its {len(bodies)} hooks ({'; '.join(missing)}); "
                              "its log says why (\"Failed to apply hooks to ...\")")
    ctx.installed.extend(h.short_name for h in hooks)
    logger.info("sgl-sidp plugin loaded: mode=%s, hooks applied: %s", cfg.mode.value, ", ".join(ctx.installed))
    return ctx


def hook_applied(target: str, body: Callable) -> bool:
    """Whether `body` is in the wrapper chain SGLang installed at `target` (a dotted path): SGLang's
    `HookRegistry._wrap_fn` wrappers hold the hook in their closure and the wrapped function in `__wrapped__`."""
    owner_path, attr = target.rsplit(".", 1)
    try:
        fn = inspect.getattr_static(pkgutil.resolve_name(owner_path), attr)
    except (ImportError, AttributeError, ValueError):
        return False
    fn = getattr(fn, "__func__", fn)  # classmethod / staticmethod
    while fn is not None:
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                held = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if held is body or (getattr(held, "__self__", None) is getattr(body, "__self__", body)
                                and getattr(held, "__func__", None) is getattr(body, "__func__", body)):
                return True  # the same function, or the same method of the same runtime object
        fn = getattr(fn, "__wrapped__", None)
    return False


def installed_hooks() -> list[str]:
    """Short names of the hooks `load()` registered in this process (empty if none or not loaded)."""
    return list(_loaded.installed) if _loaded is not None else []


def _reset_for_tests() -> None:
    """Forget that `load()` ran (tests only; does not unregister anything)."""
    global _loaded
    _loaded = None
