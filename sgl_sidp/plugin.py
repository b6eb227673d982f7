"""The SGLang plugin: registers the overlay's hooks in every SGLang process.

SGLang calls `load()` through its general-plugin entry point group (`sglang.srt.plugins`, see
`pyproject.toml`) from `load_plugins()`, which runs at the top of `run_scheduler_process` and in
the launching process (and, through `sgl_sidp.launch_server`, in the DP controller). The
overlay's settings arrive through the environment (`sgl_sidp.config.ENV_VAR`).

Per process, `load()` builds one `PluginContext` and, for each runtime class named in
`sgl_sidp.hooks.HOOKS` that this configuration needs, one runtime object `Class(context)`; the
hook bodies are that object's bound methods, so each body gets its state from the object it was
registered with.

- Off (`--sidp-mode off`, no `--sidp-batch-signal`): registers nothing at all.
- Idempotent: `HookRegistry` stacks a hook registered twice, so a second `load()` in the same
  process registers nothing more.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from sgl_sidp.config import SidpConfig
from sgl_sidp.hooks import hooks_for

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class PluginContext:
    """What every runtime of one process shares, handed to each at construction.

    Attributes:
        config: the settings `load()` read from the environment.
        installed: short names of the hooks registered in this process, in order.
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


def load() -> None:
    """SGLang entry point: register the hooks the current settings need (once per process).

    Raises:
        SidpConfigError: `$SIDP_CONFIG` holds an invalid config.
    """
    global _loaded
    if _loaded is not None:
        return
    cfg = SidpConfig.from_env()
    hooks = hooks_for(cfg)
    ctx = PluginContext(cfg, [h.short_name for h in hooks])
    if hooks:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        for hook in hooks:
            runtime = ctx.runtimes.get(hook.runtime)
            if runtime is None:
                runtime = ctx.runtimes[hook.runtime] = hook.runtime_class()(ctx)
            HookRegistry.register(hook.target, getattr(runtime, hook.method), HookType[hook.hook_type])
        logger.info("sgl-sidp plugin loaded: mode=%s, hooks: %s", cfg.mode.value, ", ".join(ctx.installed))
    _loaded = ctx


def installed_hooks() -> list[str]:
    """Short names of the hooks `load()` registered in this process (empty if none or not loaded)."""
    return list(_loaded.installed) if _loaded is not None else []


def _reset_for_tests() -> None:
    """Forget that `load()` ran (tests only; does not unregister anything)."""
    global _loaded
    _loaded = None
