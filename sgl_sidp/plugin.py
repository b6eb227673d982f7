"""The SGLang plugin: registers the overlay's hooks in every SGLang process.

SGLang calls `load()` through its general-plugin entry point group
(`sglang.srt.plugins`, see `pyproject.toml`) from `load_plugins()`, which runs at
the top of `run_scheduler_process` and in the launching process. The overlay's
settings arrive through the environment (`sgl_sidp.config.ENV_VAR`, written by
`python -m sgl_sidp.launch_server`).

- Off (`--sidp-mode off`, no `--sidp-batch-signal`): registers nothing at all.
- Idempotent: `HookRegistry` stacks a hook registered twice, so a second `load()`
  in the same process registers nothing more.

The "installed hooks" log line is written by the scheduler-side hook body
(`sgl_sidp.control.batch_signal.on_scheduler_init`), once per scheduler process,
because at `load()` time SGLang has not configured logging yet in that process.
"""

from __future__ import annotations

import logging

from sgl_sidp.config import SidpConfig
from sgl_sidp.hooks import hooks_for

logger = logging.getLogger(__name__)

#: The settings `load()` read in this process, and the hooks it registered (short names, in
#: order); None until `load()` ran.
_config: SidpConfig | None = None
_installed: list[str] | None = None


def load() -> None:
    """SGLang entry point: register the hooks the current settings need (once per process).

    Raises:
        SidpConfigError: `$SIDP_CONFIG` holds an invalid config.
    """
    global _config, _installed
    if _installed is not None:
        return
    cfg = SidpConfig.from_env()
    hooks = hooks_for(cfg)
    if hooks:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        for hook in hooks:
            HookRegistry.register(hook.target, hook.resolve_impl(), HookType[hook.hook_type])
    _config, _installed = cfg, [h.short_name for h in hooks]
    if hooks:
        logger.info("sgl-sidp plugin loaded: mode=%s, hooks: %s", cfg.mode.value, ", ".join(_installed))


def loaded_config() -> SidpConfig:
    """The settings this process's `load()` registered its hooks for (read from the env if it has not run)."""
    return _config if _config is not None else SidpConfig.from_env()


def installed_hooks() -> list[str]:
    """Short names of the hooks `load()` registered in this process (empty if none)."""
    return list(_installed or [])


def _reset_for_tests() -> None:
    """Forget that `load()` ran (tests only; does not unregister anything)."""
    global _config, _installed
    _config = _installed = None
