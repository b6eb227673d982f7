"""The plugin enters SGLang through its own entry point, once, and only when asked to."""

import json
import os
import signal
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
    # the batch signal's two hooks, and the fail-closed wrapper of the scheduler's start-up and event loop
    assert got["ours"] == {f"{sched}.__init__": 2, f"{sched}.get_next_batch_to_run": 1, f"{sched}.run_event_loop": 1}
    assert got["added_next_batch"] == 1 and got["added_init"] == 2  # one wrapper per hook, not stacked
    assert got["installed"] == ["Scheduler.__init__", "Scheduler.get_next_batch_to_run", "Scheduler.__init__",
                                "Scheduler.run_event_loop"]


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
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"BatchSignal": 1, "ZeroDPRuntime": 1, "FailClosed": 1}


def _sleeper():
    """A stand-in launcher: a process that SIGQUIT ends (its default action)."""
    return subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGQUIT, signal.SIG_DFL); "
                              "time.sleep(120)"])


def test_bad_settings_stop_the_launcher_with_one_line():
    """`python -m sglang.launch_server` with a $SIDP_CONFIG the plugin cannot read: SGLang's load_plugins would log
    the exception and go on as plain SGLang; the plugin ends the launcher with exit code 2 and one line."""
    env = {**os.environ, ENV_VAR: json.dumps({"mode": "sidp", "sidp": {"owner_timeout_s": None}})}
    env.pop("SIDP_LAUNCHER_PID", None)
    out = subprocess.run([sys.executable, "-c", "import sglang.srt.plugins as p; p.load_plugins(); print('went on')"],
                         env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 2 and "went on" not in out.stdout, (out.returncode, out.stdout, out.stderr[-2000:])
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("sgl-sidp:")]
    assert len(lines) == 1 and lines[0].startswith("sgl-sidp: the overlay could not load in the launcher (pid ")
    assert "--sidp-owner-timeout-s" in lines[0] and "Traceback" not in out.stderr


def test_a_hook_sglang_cannot_apply_stops_the_server_from_a_child():
    """A hook target SGLang cannot patch (here: a method that does not exist) in a process that is not the launcher:
    the plugin sends SIGQUIT to the launcher (whose SGLang handler kills the tree) and exits 1, naming the process."""
    probe = textwrap.dedent(
        """
        import dataclasses
        import sgl_sidp.hooks as h
        h.HOOKS = h.HOOKS + (dataclasses.replace(h.HOOKS[0], target=h.SCHEDULER + ".no_such_method"),)
        import sglang.srt.plugins as p
        p.load_plugins()
        print("went on")
        """
    )
    launcher = _sleeper()
    try:
        env = {**os.environ, ENV_VAR: SidpConfig(batch_signal=True).model_dump_json(),
               "SIDP_LAUNCHER_PID": str(launcher.pid)}
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=240)
        assert launcher.wait(30) == -signal.SIGQUIT, launcher.returncode
    finally:
        launcher.kill()
    assert out.returncode == 1 and "went on" not in out.stdout, (out.returncode, out.stderr[-2000:])
    assert "sgl-sidp: the overlay could not load in an SGLang child process (pid " in out.stderr
    assert "SGLang did not apply 1 of its 5 hooks (AFTER sglang.srt.managers.scheduler.Scheduler.no_such_method)" in out.stderr


def test_applied_hooks_are_found_in_sglangs_wrapper_chain():
    probe = textwrap.dedent(
        """
        import json
        import sglang.srt.plugins as p
        p.load_plugins()
        import sgl_sidp.plugin as plugin
        from sgl_sidp.hooks import HOOKS
        ctx = plugin._loaded
        body = ctx.runtimes["sgl_sidp.control.batch_signal:BatchSignal"].on_next_batch
        target = "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"
        print(json.dumps([plugin.installed_hooks(), plugin.hook_applied(target, body),
                          plugin.hook_applied(target, ctx.runtimes["sgl_sidp.control.batch_signal:BatchSignal"].on_scheduler_init)]))
        """
    )
    env = {**os.environ, ENV_VAR: SidpConfig(batch_signal=True).model_dump_json()}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    installed, applied, other = json.loads(out.stdout.strip().splitlines()[-1])
    assert applied is True and other is False
    assert installed == ["Scheduler.__init__", "Scheduler.get_next_batch_to_run", "Scheduler.__init__",
                         "Scheduler.run_event_loop"]
