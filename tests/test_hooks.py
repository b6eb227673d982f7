"""Every SGLang symbol we hook or read exists in the installed (pinned) SGLang."""

import importlib.metadata

import pytest

from sgl_sidp.config import SidpConfig, SidpMode
from sgl_sidp.hooks import HOOKS, USED_SYMBOLS, check_symbol, hooks_for


def test_pinned_sglang_version():
    assert importlib.metadata.version("sglang") == "0.5.17"


@pytest.mark.parametrize("hook", HOOKS, ids=lambda h: h.short_name)
def test_hook_target_exists_with_expected_signature(hook):
    from sglang.srt.plugins.hook_registry import HookType

    check_symbol(hook.target, hook.params)
    assert hook.hook_type in HookType.__members__
    assert callable(hook.resolve_impl())
    assert hook.why


@pytest.mark.parametrize("sym", USED_SYMBOLS, ids=lambda s: s.path.split("sglang.")[-1])
def test_used_symbol_exists(sym):
    check_symbol(sym.path, sym.params, sym.instance_attr)


def test_check_symbol_fails_loudly():
    with pytest.raises(LookupError):
        check_symbol("sglang.srt.managers.scheduler.Scheduler.no_such_method")
    with pytest.raises(LookupError, match="leading parameters"):
        check_symbol("sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run", ("self", "batch"))
    with pytest.raises(LookupError, match="no attribute"):
        check_symbol("sglang.srt.managers.schedule_batch.ScheduleBatch.no_such_field", instance_attr=True)


def test_hooks_for_config():
    assert hooks_for(SidpConfig()) == []
    assert [h.short_name for h in hooks_for(SidpConfig(batch_signal=True))] == [
        "Scheduler.__init__", "Scheduler.get_next_batch_to_run"]
    assert [h.short_name for h in hooks_for(SidpConfig(mode=SidpMode.ZERODP))] == [  # modes imply the signal
        "Scheduler.__init__", "Scheduler.get_next_batch_to_run",
        "ModelRunner.load_model", "Scheduler.__init__", "ModelRunner.alloc_memory_pool", "FusedMoE.run_moe_core",
        "DPBudget.update_budget", "DPBudget.dispatch"]
    assert [h.short_name for h in hooks_for(SidpConfig(mode=SidpMode.SHIFT))] == [
        "Scheduler.__init__", "Scheduler.get_next_batch_to_run"]  # ZeroDP's hooks only in zerodp mode
