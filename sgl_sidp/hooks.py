"""The one list of SGLang symbols the overlay hooks or relies on, and why.

Every entry names a symbol of the pinned SGLang (0.5.17) by its dotted path.
`tests/test_hooks.py` resolves each one in the installed SGLang and checks the
parameters we rely on, so an SGLang bump that moves or reshapes one fails in CI
instead of silently disabling the overlay.

- `HOOKS`: targets patched through `sglang.srt.plugins.hook_registry.HookRegistry`.
- `USED_SYMBOLS`: SGLang symbols our hook bodies and launcher read or call.
"""

from __future__ import annotations

import dataclasses
import inspect
import pkgutil
from typing import Callable

from sgl_sidp.config import SidpConfig, SidpMode

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
FUSED_MOE = "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE"
DP_BUDGET = "sglang.srt.managers.data_parallel_controller.DPBudget"
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"


@dataclasses.dataclass(frozen=True)
class Hook:
    """One hook the plugin registers with SGLang's `HookRegistry`.

    Attributes:
        target: dotted path of the SGLang function or method patched.
        hook_type: `HookType` member name: "BEFORE", "AFTER", "AROUND" or "REPLACE".
        impl: "module:function" of our hook body (resolved lazily, in SGLang's processes).
        params: the target's leading parameter names our body relies on, in order.
        why: what the hook is for.
        when: predicate on `SidpConfig`: install this hook in this configuration?
    """

    target: str
    hook_type: str
    impl: str
    params: tuple[str, ...]
    why: str
    when: Callable[[SidpConfig], bool]

    @property
    def short_name(self) -> str:
        """`Class.method` (or `module.function`) for log lines."""
        return ".".join(self.target.split(".")[-2:])

    def resolve_impl(self) -> Callable:
        """Import and return the hook body."""
        return pkgutil.resolve_name(self.impl)


def _signal_on(cfg: SidpConfig) -> bool:
    return cfg.signal_enabled


def _zerodp(cfg: SidpConfig) -> bool:
    return cfg.mode == SidpMode.ZERODP


HOOKS: tuple[Hook, ...] = (
    Hook(
        target=f"{SCHEDULER}.__init__",
        hook_type="AFTER",
        impl="sgl_sidp.control.batch_signal:on_scheduler_init",
        params=("self", "server_args", "port_args", "gpu_id", "tp_rank"),
        why="attach the batch-signal observer once per scheduler process, after SGLang set up its "
        "logging and its metrics collector (whose labels we reuse)",
        when=_signal_on,
    ),
    Hook(
        target=f"{SCHEDULER}.get_next_batch_to_run",
        hook_type="AFTER",
        impl="sgl_sidp.control.batch_signal:on_next_batch",
        params=("self", "running_batch", "last_batch"),
        why="the batch each iteration really runs, after radix-cache admission: batch size, tokens "
        "computed, prefix-hit tokens (the signal later mode switches are driven by)",
        when=_signal_on,
    ),
    Hook(
        target=f"{MODEL_RUNNER}.load_model",
        hook_type="AFTER",
        impl="sgl_sidp.zerodp.engine:on_load_model",
        params=("self",),
        why="ZeroDP: the source shares its experts, a sink drops the offloaded ones, after the weights "
        "are loaded and before alloc_memory_pool sizes the KV cache from the free memory",
        when=_zerodp,
    ),
    Hook(
        target=f"{SCHEDULER}.__init__",
        hook_type="AFTER",
        impl="sgl_sidp.zerodp.engine:on_scheduler_init",
        params=("self", "server_args", "port_args", "gpu_id", "tp_rank"),
        why="ZeroDP metrics (KV tokens by role, bytes pulled per forward), fed by the batch-signal "
        "observer attached by the hook above (registered after it, so it runs after it)",
        when=_zerodp,
    ),
    Hook(
        target=f"{MODEL_RUNNER}.alloc_memory_pool",
        hook_type="AFTER",
        impl="sgl_sidp.zerodp.engine:on_alloc_memory_pool",
        params=("self", "memory_pool_config"),
        why="ZeroDP: log each replica's KV capacity (max_total_num_tokens), source vs sink",
        when=_zerodp,
    ),
    Hook(
        target=f"{FUSED_MOE}.run_moe_core",
        hook_type="AROUND",
        impl="sgl_sidp.zerodp.engine:around_run_moe_core",
        params=("self", "dispatch_output"),
        why="ZeroDP: a sink waits for an offloaded layer's slot before its experts run and prefetches the "
        "slot's next layer after (the points DWDP uses in FusedMoE.forward_impl)",
        when=_zerodp,
    ),
    Hook(
        target=f"{DP_BUDGET}.update_budget",
        hook_type="AFTER",
        impl="sgl_sidp.zerodp.router:after_update_budget",
        params=("self", "loads"),
        why="ZeroDP routing: remember each replica's KV capacity from its load snapshot",
        when=_zerodp,
    ),
    Hook(
        target=f"{DP_BUDGET}.dispatch",
        hook_type="AROUND",
        impl="sgl_sidp.zerodp.router:around_dispatch",
        params=("self", "method", "estimated_tokens"),
        why="ZeroDP routing: --load-balance-method total_tokens compares fractions of each replica's KV "
        "capacity, so sinks get the share their larger cache can hold",
        when=_zerodp,
    ),
)


@dataclasses.dataclass(frozen=True)
class UsedSymbol:
    """An SGLang symbol we call or read without hooking it.

    Attributes:
        path: dotted path; for an instance attribute, `module.Class.attr`.
        params: leading parameter names we pass (callables only).
        instance_attr: True when `attr` is set on instances (dataclass field or
            assigned in `__init__`) rather than defined on the class.
    """

    path: str
    params: tuple[str, ...] = ()
    instance_attr: bool = False


USED_SYMBOLS: tuple[UsedSymbol, ...] = (
    # plugin framework
    UsedSymbol("sglang.srt.plugins.load_plugins"),
    UsedSymbol("sglang.srt.plugins.GENERAL_PLUGINS_GROUP"),
    UsedSymbol("sglang.srt.plugins.hook_registry.HookRegistry.register", ("target", "hook", "hook_type")),
    UsedSymbol("sglang.srt.plugins.hook_registry.HookType.AFTER"),
    # launcher: SGLang's own argument parsing and server entry
    UsedSymbol("sglang.srt.server_args.ServerArgs.add_cli_args", ("parser",)),
    UsedSymbol("sglang.srt.server_args.prepare_server_args", ("argv",)),
    UsedSymbol("sglang.launch_server.run_server", ("server_args",)),
    UsedSymbol("sglang.srt.utils.kill_process_tree", ("parent_pid",)),
    # batch signal: what the hook bodies read
    UsedSymbol(f"{SCHEDULER}.waiting_queue", instance_attr=True),
    UsedSymbol(f"{SCHEDULER}.ps", instance_attr=True),
    UsedSymbol(f"{SCHEDULER}.metrics_collector", instance_attr=True),
    UsedSymbol(f"{SCHEDULE_BATCH}.NextBatchPlan.batch_to_run", instance_attr=True),
    UsedSymbol(f"{SCHEDULE_BATCH}.NextBatchPlan.running_batch", instance_attr=True),
    UsedSymbol(f"{SCHEDULE_BATCH}.ScheduleBatch.batch_size", ("self",)),
    UsedSymbol(f"{SCHEDULE_BATCH}.ScheduleBatch.forward_mode", instance_attr=True),
    UsedSymbol(f"{SCHEDULE_BATCH}.ScheduleBatch.extend_num_tokens", instance_attr=True),
    UsedSymbol(f"{SCHEDULE_BATCH}.ScheduleBatch.reqs", instance_attr=True),
    UsedSymbol(f"{SCHEDULE_BATCH}.Req.cached_tokens", instance_attr=True),
    UsedSymbol("sglang.srt.model_executor.forward_batch_info.ForwardMode.is_extend", ("self",)),
    UsedSymbol("sglang.srt.model_executor.forward_batch_info.ForwardMode.is_idle", ("self",)),
    UsedSymbol("sglang.srt.observability.metrics_collector.SchedulerMetricsCollector.labels", instance_attr=True),
    # ZeroDP: what the hook bodies read or call
    UsedSymbol(f"{MODEL_RUNNER}.ps", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.model", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.model_config", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.server_args", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.is_draft_worker", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.max_total_num_tokens", instance_attr=True),
    UsedSymbol("sglang.srt.distributed.parallel_state_wrapper.ParallelState.dp_rank", instance_attr=True),
    UsedSymbol("sglang.srt.distributed.parallel_state_wrapper.ParallelState.tp_rank", instance_attr=True),
    UsedSymbol(f"{FUSED_MOE}.layer_id", instance_attr=True),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.create_fabric_handle", ("size", "device_id")),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.get_allocation_granularity", ("device_id",)),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.reserve_va", ("size", "granularity")),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.map_handle", ("va", "size", "handle")),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.set_access", ("va", "size", "device_id")),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.tensor_from_ptr", ("ptr", "shape", "dtype", "device_id")),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.align_up", ("value", "alignment")),
    UsedSymbol("sglang.srt.distributed.device_communicators.vmm_utils.check_drv", ("result_tuple", "label")),
    UsedSymbol("sglang.srt.distributed.device_communicators.vmm_utils.import_peer_handle", ("fabric_handle", "fd")),
    UsedSymbol("sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.eager_on_graph", ("enable",)),
    UsedSymbol("sglang.srt.managers.data_parallel_controller.LoadBalanceMethod.TOTAL_TOKENS"),
    UsedSymbol(f"{DP_BUDGET}.total_tokens", instance_attr=True),
    UsedSymbol(f"{DP_BUDGET}.total_requests", instance_attr=True),
    UsedSymbol(f"{DP_BUDGET}.dp_size", instance_attr=True),
    UsedSymbol("sglang.srt.managers.load_snapshot.LoadSnapshot.max_total_num_tokens", instance_attr=True),
)


def hooks_for(cfg: SidpConfig) -> list[Hook]:
    """The hooks to install for `cfg`; empty when the overlay is off."""
    if not cfg.active:
        return []
    return [h for h in HOOKS if h.when(cfg)]


def check_symbol(path: str, params: tuple[str, ...] = (), instance_attr: bool = False) -> None:
    """Resolve `path` in the installed SGLang and check what we rely on.

    Raises:
        LookupError: the symbol, attribute or a relied-on parameter is missing.
    """
    if instance_attr:
        owner_path, attr = path.rsplit(".", 1)
        owner = pkgutil.resolve_name(owner_path)
        fields = {f.name for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else set()
        fields |= set(getattr(owner, "__struct_fields__", ()))  # msgspec.Struct
        fields |= set(getattr(owner, "__annotations__", {}))
        if attr in fields or hasattr(owner, attr):
            return
        for cls in owner.__mro__:
            if not cls.__module__.startswith("sglang"):
                continue
            try:
                src = inspect.getsource(cls)
            except (OSError, TypeError):
                continue
            if f"self.{attr} =" in src or f"self.{attr}:" in src:
                return
        raise LookupError(f"{owner_path} has no attribute {attr!r}")
    try:
        obj = pkgutil.resolve_name(path)
    except (ImportError, AttributeError) as e:
        raise LookupError(f"{path}: {e}") from e
    if params:
        got = list(inspect.signature(obj).parameters)
        if got[: len(params)] != list(params):
            raise LookupError(f"{path}: expected leading parameters {list(params)}, found {got}")
