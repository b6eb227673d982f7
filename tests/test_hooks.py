"""Every SGLang symbol we hook or read exists in the installed (pinned) SGLang."""

import importlib.metadata

import pytest

from sgl_sidp.config import SidpConfig, SidpMode
from sgl_sidp.hooks import HOOKS, TORCH_HOOKS, USED_SYMBOLS, check_symbol, hooks_for


def test_pinned_sglang_version():
    assert importlib.metadata.version("sglang") == "0.5.17"


@pytest.mark.parametrize("hook", HOOKS, ids=lambda h: h.short_name)
def test_hook_target_exists_with_expected_signature(hook):
    from sglang.srt.plugins.hook_registry import HookType

    check_symbol(hook.target, hook.params)
    assert hook.hook_type in HookType.__members__
    assert callable(getattr(hook.runtime_class(), hook.method))
    assert hook.why


@pytest.mark.parametrize("name", list(TORCH_HOOKS))
def test_torch_hook_installer_and_sglang_attrs_exist(name):
    import pkgutil

    th = TORCH_HOOKS[name]
    cls_path, method = th.installer.rsplit(".", 1)
    assert callable(getattr(pkgutil.resolve_name(cls_path), method)) and th.kind == "forward_pre" and th.why
    for attr in th.sglang_attrs:
        check_symbol(attr, instance_attr=True)


@pytest.mark.parametrize("sym", USED_SYMBOLS, ids=lambda s: s.path.split("sglang.")[-1])
def test_used_symbol_exists(sym):
    check_symbol(sym.path, sym.params, sym.instance_attr, sym.keywords)


def test_check_symbol_fails_loudly():
    with pytest.raises(LookupError):
        check_symbol("sglang.srt.managers.scheduler.Scheduler.no_such_method")
    with pytest.raises(LookupError, match="leading parameters"):
        check_symbol("sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run", ("self", "batch"))
    with pytest.raises(LookupError, match="no attribute"):
        check_symbol("sglang.srt.managers.schedule_batch.ScheduleBatch.no_such_field", instance_attr=True)
    with pytest.raises(LookupError, match="passed by keyword"):
        check_symbol("sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run", keywords=("batch",))
    check_symbol("sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run", keywords=("last_batch",))


def test_hooks_for_config():
    assert hooks_for(SidpConfig()) == []
    fail_closed = ["Scheduler.__init__", "Scheduler.run_event_loop"]  # the core's last two, in every active mode
    assert [h.short_name for h in hooks_for(SidpConfig(batch_signal=True))] == [
        "Scheduler.__init__", "Scheduler.get_next_batch_to_run", *fail_closed]
    assert [h.short_name for h in hooks_for(SidpConfig(mode=SidpMode.ZERODP))] == [  # modes imply the signal
        "Scheduler.__init__", "Scheduler.get_next_batch_to_run",
        "ModelRunner.load_model", "FusedMoE.__init__", "ModelRunner.alloc_memory_pool", "Scheduler.__init__", "FusedMoE.run_moe_core",
        "DPBudget.update_budget", "DPBudget.dispatch", *fail_closed]
    assert [h.short_name for h in hooks_for(SidpConfig(mode=SidpMode.SHIFT))] == [  # ZeroDP's hooks only in zerodp mode
        "Scheduler.__init__", "Scheduler.get_next_batch_to_run",
        "ModelRunner.init_torch_distributed", "ModelRunner.load_model", "Scheduler.__init__",
        "PrefillCudaGraphRunner.capture", "PrefillCudaGraphRunner._execute_body_capture",
        "VocabParallelEmbedding.forward", "QKVParallelLinear.forward", "RowParallelLinear.forward",
        "communication_op.attention_tensor_model_parallel_all_reduce", "Qwen2MLP.forward", "LlamaMLP.forward",
        "LogitsProcessor.forward", *fail_closed]
    calibrate = hooks_for(SidpConfig(calibrate=True))  # --overlay-calibrate alone: the signal and the calibration
    assert [h.runtime.rsplit(":")[-1] for h in calibrate] == ["BatchSignal", "BatchSignal", "StartupCalibration",
                                                              "FailClosed", "FailClosed"]
    assert "StartupCalibration" not in {h.runtime.rsplit(":")[-1] for h in hooks_for(SidpConfig(mode=SidpMode.ZERODP))}


def test_fold_gpus_hook_only_when_asked_and_folds_gpu_id():
    """--overlay-fold-gpus adds one BEFORE hook on Scheduler.__init__ that maps gpu_id onto the visible GPUs."""
    from sgl_sidp.peer.topology import GpuFold

    fold = [h for h in hooks_for(SidpConfig(fold_gpus=True)) if h.runtime.endswith("GpuFold")]
    assert [(h.short_name, h.hook_type) for h in fold] == [("Scheduler.__init__", "BEFORE")]
    assert not any(h.runtime.endswith("GpuFold") for h in hooks_for(SidpConfig(mode=SidpMode.SIDP)))
    body = GpuFold(device_count=lambda: 1).before_scheduler_init
    assert body("self", "sa", "pa", 1, 0, x=2) == (("self", "sa", "pa", 0, 0), {"x": 2})  # SGLang passes it by position
    assert body("self", "sa", "pa", gpu_id=3, tp_rank=0) == (("self", "sa", "pa"), {"gpu_id": 0, "tp_rank": 0})
    assert GpuFold(device_count=lambda: 2).before_scheduler_init("s", "a", "p", 3)[0][3] == 1


def test_overrides_name_factories_that_exist():
    import pkgutil

    from sgl_sidp.hooks import OVERRIDES

    for name, (factory, why) in OVERRIDES.items():
        assert callable(pkgutil.resolve_name(factory)) and why, name
