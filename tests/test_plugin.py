"""The plugin enters SGLang through its own entry point, once, and only when asked to."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sgl_sidp import plugin
from sgl_sidp.config import ENV_VAR, SidpConfig

# Runs in a fresh interpreter: SGLang's HookRegistry and patches are process-global.
PROBE = textwrap.dedent(
    """
    import json
    import sglang.srt.plugins as plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.managers.scheduler import Scheduler

    def depth(fn):
        n = 0
        while hasattr(fn, "__wrapped__"):
            fn, n = fn.__wrapped__, n + 1
        return n

    base_next, base_init = depth(Scheduler.get_next_batch_to_run), depth(Scheduler.__init__)
    plugins.load_plugins()
    plugins._plugins_loaded = False   # SGLang loading plugins a second time in one process
    plugins.load_plugins()
    import sgl_sidp.plugin
    sgl_sidp.plugin.load()            # and a direct second call

    ours = {t: sum(1 for h in hs if h[2] is not None and h[2].plugin_name == "sgl_sidp")
            for t, hs in HookRegistry._hooks.items()}
    print(json.dumps({"ours": {t: n for t, n in ours.items() if n},
                      "added_next_batch": depth(Scheduler.get_next_batch_to_run) - base_next,
                      "added_init": depth(Scheduler.__init__) - base_init,
                      "installed": sgl_sidp.plugin.installed_hooks()}))
    """
)


def run_probe(env_cfg):
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if env_cfg is not None:
        env[ENV_VAR] = env_cfg.model_dump_json()
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("sgl_sidp") == "sgl_sidp.plugin:load", "install the package (pip install -e .) first"


def test_sglang_loads_plugin_once_when_on():
    got = run_probe(SidpConfig(batch_signal=True))
    sched = "sglang.srt.managers.scheduler.Scheduler"
    assert got["ours"] == {f"{sched}.__init__": 1, f"{sched}.get_next_batch_to_run": 1}
    assert got["added_next_batch"] == 1 and got["added_init"] == 1  # one wrapper each, not stacked
    assert got["installed"] == ["Scheduler.__init__", "Scheduler.get_next_batch_to_run"]


def test_sglang_loads_plugin_as_noop_when_off():
    got = run_probe(None)
    assert got == {"ours": {}, "added_next_batch": 0, "added_init": 0, "installed": []}


def test_load_without_sglang_hooks_when_off(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    plugin._reset_for_tests()
    plugin.load()
    plugin.load()
    assert plugin.installed_hooks() == []
    plugin._reset_for_tests()


def test_hook_bodies_are_methods_of_one_runtime_per_class():
    """In zerodp mode every registered body is a bound method; the ZeroDP hooks share one runtime object and the
    batch-signal hooks another, so per-process state lives in those objects (nothing global, nothing on SGLang's)."""
    probe = textwrap.dedent(
        """
        import json
        import sglang.srt.plugins as plugins
        from sglang.srt.plugins.hook_registry import HookRegistry

        plugins.load_plugins()
        owners = {}
        for hooks in HookRegistry._hooks.values():
            for _, fn, src in hooks:
                if src is not None and src.plugin_name == "sgl_sidp":
                    owners.setdefault(type(fn.__self__).__name__, set()).add(id(fn.__self__))
        print(json.dumps({k: len(v) for k, v in owners.items()}))
        """
    )
    env = {**{k: v for k, v in os.environ.items() if k != ENV_VAR}, ENV_VAR: SidpConfig(mode="zerodp").model_dump_json()}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"BatchSignal": 1, "ZeroDPRuntime": 1}
