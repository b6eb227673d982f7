"""The one list of SGLang symbols the overlay hooks or relies on, and why.

Every entry names a symbol of the pinned SGLang (0.5.17) by its dotted path.
`tests/test_hooks.py` resolves each one in the installed SGLang and checks the
parameters we rely on, so an SGLang bump that moves or reshapes one fails in CI
instead of silently disabling the overlay.

- `HOOKS`: targets patched through `sglang.srt.plugins.hook_registry.HookRegistry`. Each body is
  a method of a per-process runtime object (`runtime`), built once by `sgl_sidp.plugin` with the
  plugin's context and handed to SGLang as a bound method: no module globals, nothing pinned on
  SGLang's objects. `feature` None means the core (the batch signal); otherwise the hook is
  installed only in that feature's `--overlay-mode`.
- `TORCH_HOOKS`: torch module hooks a mechanism installs at run time on SGLang's modules.
- `OVERRIDES`: SGLang classes we subclass for instances of our own (not hooks: SGLang's own instances are untouched).
- `USED_SYMBOLS`: SGLang symbols our hook bodies and launcher read or call.
"""

from __future__ import annotations

import dataclasses
import inspect
import pkgutil
import re

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
FUSED_MOE = "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE"
DP_BUDGET = "sglang.srt.managers.data_parallel_controller.DPBudget"
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
DECODE_GRAPHS = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
PREFILL_GRAPHS = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner"

SIGNAL = "sgl_sidp.control.batch_signal:BatchSignal"
ZERODP = "sgl_sidp.zerodp.runtime:ZeroDPRuntime"
CALIBRATION = "sgl_sidp.calibration.startup:StartupCalibration"
SIDP = "sgl_sidp.sidp.runtime:SiDPRuntime"
FOLD = "sgl_sidp.peer.topology:GpuFold"
SHIFT = "sgl_sidp.shift.runtime:ShiftRuntime"
FAIL_CLOSED = "sgl_sidp.process:FailClosed"
GATE = "sgl_sidp.calibration.gate:StartGate"
LINEAR = "sglang.srt.layers.linear"


@dataclasses.dataclass(frozen=True)
class Hook:
    """One hook the plugin registers with SGLang's `HookRegistry`.

    Attributes:
        target: dotted path of the SGLang function or method patched.
        hook_type: `HookType` member name: "BEFORE", "AFTER", "AROUND" or "REPLACE".
        runtime: "module:Class" of the per-process runtime whose method is the body; built once
            per process as `Class(plugin_context)`.
        method: the body, a method of `runtime`.
        params: the target's leading parameter names our body relies on, in order.
        why: what the hook is for.
        feature: the `--overlay-mode` that installs it; None: the core, installed whenever the overlay is on.
        needs: a core setting (a boolean `SidpConfig` attribute) without which it is not installed.
    """

    target: str
    hook_type: str
    runtime: str
    method: str
    params: tuple[str, ...]
    why: str
    feature: str | None = None
    needs: str | None = None

    @property
    def short_name(self) -> str:
        """`Class.method` (or `module.function`) for log lines."""
        return ".".join(self.target.split(".")[-2:])

    def runtime_class(self) -> type:
        """Import and return the runtime class."""
        return pkgutil.resolve_name(self.runtime)


HOOKS: tuple[Hook, ...] = (
    # ---------------------------------------------------------------- core: the batch signal
    Hook(
        target=f"{SCHEDULER}.__init__", hook_type="AFTER", runtime=SIGNAL, method="on_scheduler_init",
        params=("self", "server_args", "port_args", "gpu_id", "tp_rank"),
        why="attach the batch-signal observer once per scheduler process, after SGLang set up its "
        "logging and its metrics collector (whose labels we reuse)",
    ),
    Hook(
        target=f"{SCHEDULER}.get_next_batch_to_run", hook_type="AFTER", runtime=SIGNAL, method="on_next_batch",
        params=("self", "running_batch", "last_batch"),
        why="the batch each iteration really runs, after radix-cache admission: batch size, tokens "
        "computed, prefix-hit tokens (the signal later mode switches are driven by)",
    ),
    # ---------------------------------------------------------------- core: --overlay-calibrate
    Hook(
        target=f"{SCHEDULER}.__init__", hook_type="AFTER", runtime=CALIBRATION, method="on_scheduler_init",
        params=("self", "server_args", "port_args", "gpu_id", "tp_rank"), needs="calibrate",
        why="measure and cache the forward times once CUDA graphs are captured and before requests are "
        "accepted, in any mode (the features measure through the same code when they need it)",
    ),
    # ---------------------------------------------------------------- core: --overlay-start-after
    Hook(
        target=f"{MODEL_RUNNER}.init_torch_distributed", hook_type="BEFORE", runtime=GATE, method="wait",
        params=("self",), needs="start_after",
        why="plan calibrate on one GPU: the next shard's server does its CPU start-up while the current one is "
        "timed, and takes GPU memory only once that one has stopped (the first memory reading is in this call)",
    ),
    # ---------------------------------------------------------------- core: --overlay-fold-gpus
    Hook(
        target=f"{SCHEDULER}.__init__", hook_type="BEFORE", runtime=FOLD, method="before_scheduler_init",
        params=("self", "server_args", "port_args", "gpu_id"), needs="fold_gpus",
        why="developer aid: DP replicas whose GPU does not exist here run on gpu_id mod the visible GPUs (exactness "
        "checks of the weight-sharing features on one GPU)",
    ),
    # ---------------------------------------------------------------- ZeroDP
    Hook(
        target=f"{MODEL_RUNNER}.load_model", hook_type="AROUND", runtime=ZERODP, method="around_load_model",
        params=("self",), feature="zerodp",
        why="while a sink's model loads, its experts take no memory (the FusedMoE __init__ hook below); after it, "
        "the source shares its experts and a sink binds the offloaded ones to slots and copies the kept ones from "
        "the source, before alloc_memory_pool sizes the KV cache from the free memory",
    ),
    Hook(
        target=f"{FUSED_MOE}.__init__", hook_type="AFTER", runtime=ZERODP, method="after_moe_init",
        params=("self", "num_experts", "hidden_size", "intermediate_size", "layer_id"), feature="zerodp",
        why="a sink's freshly allocated expert tensors are pointed at shared placeholders at once, so a model that "
        "fills the GPU (Mixtral-8x7B: 93 GB) never needs its experts on a sink, not even while loading",
    ),
    Hook(
        target=f"{MODEL_RUNNER}.alloc_memory_pool", hook_type="AFTER", runtime=ZERODP, method="on_alloc_memory_pool",
        params=("self", "memory_pool_config"), feature="zerodp",
        why="log each replica's KV capacity (max_total_num_tokens), source vs sink",
    ),
    Hook(
        target=f"{SCHEDULER}.__init__", hook_type="AFTER", runtime=ZERODP, method="on_scheduler_init",
        params=("self", "server_args", "port_args", "gpu_id", "tp_rank"), feature="zerodp",
        why="start-up calibration once graphs are captured and before requests are accepted (the source: "
        "forward times, cached; a sink: its copy rate while forwards run), and ZeroDP's Prometheus metrics",
    ),
    Hook(
        target=f"{FUSED_MOE}.run_moe_core", hook_type="AROUND", runtime=ZERODP, method="around_run_moe_core",
        params=("self", "dispatch_output"), feature="zerodp",
        why="a sink waits for an offloaded layer's slot before its experts run and prefetches the slot's "
        "next layer after (the points DWDP uses in FusedMoE.forward_impl)",
    ),
    # ---------------------------------------------------------------- SiDP
    Hook(
        target=f"{MODEL_RUNNER}.load_model", hook_type="AROUND", runtime=SIDP, method="around_load_model",
        params=("self",), feature="sidp",
        why="while the model loads, non-owned FFN layers take no memory (the MLP __init__ hooks below); after it, "
        "each rank shares the FFN layers it owns and binds the others to WaS slots, before alloc_memory_pool sizes "
        "the KV cache from the free memory",
    ),
    Hook(
        target="sglang.srt.models.qwen2.Qwen2MLP.__init__", hook_type="AFTER", runtime=SIDP, method="after_mlp_init",
        params=("self", "hidden_size", "intermediate_size", "hidden_act", "quant_config", "prefix"), feature="sidp",
        why="a non-owned layer's freshly allocated FFN weights are pointed at a shared placeholder at once, so a model "
        "that fills the GPU (70B dense at TP1) loads: the rank never holds the layers it does not own",
    ),
    Hook(
        target="sglang.srt.models.llama.LlamaMLP.__init__", hook_type="AFTER", runtime=SIDP, method="after_mlp_init",
        params=("self", "hidden_size", "intermediate_size", "hidden_act", "quant_config", "prefix"), feature="sidp",
        why="as Qwen2MLP.__init__, for Llama",
    ),
    Hook(
        target=f"{MODEL_RUNNER}.alloc_memory_pool", hook_type="AFTER", runtime=SIDP, method="on_alloc_memory_pool",
        params=("self", "memory_pool_config"), feature="sidp",
        why="log each rank's KV capacity (max_total_num_tokens)",
    ),
    Hook(
        target=f"{SCHEDULER}.__init__", hook_type="AFTER", runtime=SIDP, method="on_scheduler_init",
        params=("self", "server_args", "port_args", "gpu_id", "tp_rank"), feature="sidp",
        why="SiDP's Prometheus metrics, labelled like SGLang's scheduler metrics (its collector exists by then)",
    ),
    Hook(
        target="sglang.srt.models.qwen2.Qwen2MLP.forward", hook_type="AROUND", runtime=SIDP,
        method="around_mlp_forward", params=("self", "x", "forward_batch"), feature="sidp",
        why="WaS: a streamed FFN layer waits for its slot before SGLang's MLP computes on it and frees it after "
        "(Qwen2 and Qwen3 dense: qwen3.py imports Qwen2MLP as Qwen3MLP)",
    ),
    Hook(
        target="sglang.srt.models.llama.LlamaMLP.forward", hook_type="AROUND", runtime=SIDP,
        method="around_mlp_forward", params=("self", "x", "forward_batch"), feature="sidp",
        why="WaS on Llama: as Qwen2MLP.forward",
    ),
    Hook(
        target=f"{SCHEDULER}.get_next_batch_to_run", hook_type="AFTER", runtime=SIDP, method="on_next_batch",
        params=("self", "running_batch", "last_batch"), feature="sidp",
        why="cas/auto: the DP ranks' lockstep: one all-gather of every rank's tokens for the batch each iteration runs "
        "(after radix-cache admission), the WaS/CaS decision taken from it alike on every rank, and a rank without a "
        "batch serving its owned layers to the others in a CaS iteration",
    ),
    Hook(
        target=f"{SCHEDULER}.process_input_requests", hook_type="AFTER", runtime=SIDP, method="on_input_requests",
        params=("self", "recv_reqs"), feature="sidp",
        why="cas/auto: a paused engine (pause_generation) skips get_next_batch_to_run; its lockstep step is taken here "
        "instead, with no tokens, so the other ranks never wait for it",
    ),
    Hook(
        target=f"{DECODE_GRAPHS}.can_run_graph", hook_type="AROUND", runtime=SIDP, method="around_can_run_graph",
        params=("self", "forward_batch"), feature="sidp",
        why="a CaS iteration runs eagerly: its MLPs exchange rows whose counts change every iteration",
    ),
    Hook(
        target=f"{PREFILL_GRAPHS}.can_run_graph", hook_type="AROUND", runtime=SIDP, method="around_can_run_graph",
        params=("self", "forward_batch"), feature="sidp",
        why="as the decode graph runner's, for SGLang's breakable prefill graphs",
    ),
    # ---------------------------------------------------------------- Shift Parallelism
    Hook(
        target=f"{MODEL_RUNNER}.init_torch_distributed", hook_type="AFTER", runtime=SHIFT,
        method="on_init_torch_distributed", params=("self",), feature="shift",
        why="the SP and TP_b groups of the base configuration, right after SGLang's TP group and before the model "
        "loads (every rank of the world builds every group)",
    ),
    Hook(
        target=f"{MODEL_RUNNER}.load_model", hook_type="AFTER", runtime=SHIFT, method="on_load_model",
        params=("self",), feature="shift",
        why="the base weights gathered from the TP shards over the SP group, the shards re-pointed into them (the "
        "shift configuration on views), before alloc_memory_pool sizes the KV cache",
    ),
    Hook(
        target=f"{SCHEDULER}.__init__", hook_type="AFTER", runtime=SHIFT, method="on_scheduler_init",
        params=("self", "server_args", "port_args", "gpu_id", "tp_rank"), feature="shift",
        why="which decode and prefill CUDA graphs run which configuration (fixed by their captured sizes), for the "
        "log and the per-configuration counts; the threshold calibration when prefill graphs are off",
    ),
    Hook(
        target=f"{PREFILL_GRAPHS}.capture", hook_type="AROUND", runtime=SHIFT, method="around_prefill_capture",
        params=("self",), feature="shift",
        why="the threshold calibration (neither given nor cached) on SGLang's dummy prefill bodies before the first "
        "CUDA graph is captured (prefill before decode), so every graph is captured with it",
    ),
    Hook(
        target=f"{PREFILL_GRAPHS}._execute_body_capture", hook_type="AROUND", runtime=SHIFT,
        method="around_prefill_replay",
        params=("self", "forward_batch", "static_forward_batch", "static_num_tokens"), feature="shift",
        why="a breakable prefill graph replays the decoder layers only and runs the logits tail eagerly: set the "
        "replayed bucket's configuration so the logits hook gathers the base configuration's tokens",
    ),
    Hook(
        target="sglang.srt.layers.vocab_parallel_embedding.VocabParallelEmbedding.forward", hook_type="AROUND",
        runtime=SHIFT, method="around_embedding", params=("self", "input_"), feature="shift",
        why="every forward starts here, eager or being captured: choose base or shift from its token count; base "
        "keeps this SP rank's slice of the embedded tokens",
    ),
    Hook(
        target=f"{LINEAR}.QKVParallelLinear.forward", hook_type="AROUND", runtime=SHIFT, method="around_qkv",
        params=("self", "input_"), feature="shift",
        why="base: the QKV GEMM on the base weight and the Ulysses all-to-all, so SGLang's attention runs on every "
        "token for this GPU's heads (and writes the KV cache as in the shift configuration)",
    ),
    Hook(
        target=f"{LINEAR}.RowParallelLinear.forward", hook_type="AROUND", runtime=SHIFT, method="around_row_linear",
        params=("self", "input_"), feature="shift",
        why="base: o_proj gets this rank's tokens back with the SP group's heads (all-to-all) and runs the base O GEMM",
    ),
    Hook(
        target="sglang.srt.distributed.communication_op.attention_tensor_model_parallel_all_reduce",
        hook_type="AROUND", runtime=SHIFT, method="around_attn_all_reduce", params=("input_",), feature="shift",
        why="base: the post-attention all-reduce (LayerCommunicator.prepare_mlp) over the TP_b group only: the SP "
        "ranks hold different tokens",
    ),
    Hook(
        target="sglang.srt.models.qwen2.Qwen2MLP.forward", hook_type="AROUND", runtime=SHIFT, method="around_mlp",
        params=("self", "x", "forward_batch"), feature="shift",
        why="base: gate|up and down GEMMs on the base weights with SGLang's act_fn per shard, all-reduced over TP_b",
    ),
    Hook(
        target="sglang.srt.models.llama.LlamaMLP.forward", hook_type="AROUND", runtime=SHIFT, method="around_mlp",
        params=("self", "x", "forward_batch"), feature="shift",
        why="base on Llama: as Qwen2MLP.forward",
    ),
    Hook(
        target="sglang.srt.layers.logits_processor.LogitsProcessor.forward", hook_type="AROUND", runtime=SHIFT,
        method="around_logits", params=("self", "input_ids", "hidden_states", "lm_head", "logits_metadata"),
        feature="shift",
        why="base: every SP rank's last hidden states gathered in token order before SGLang prunes them to the last "
        "token of each request and computes the vocab-sharded logits",
    ),
    Hook(
        target=f"{DP_BUDGET}.update_budget", hook_type="AFTER", runtime=ZERODP, method="after_update_budget",
        params=("self", "loads"), feature="zerodp",
        why="routing: remember each replica's KV capacity from its load snapshot (in the DP controller)",
    ),
    Hook(
        target=f"{DP_BUDGET}.dispatch", hook_type="AROUND", runtime=ZERODP, method="around_dispatch",
        params=("self", "method", "estimated_tokens"), feature="zerodp",
        why="routing: --load-balance-method total_tokens compares fractions of each replica's KV capacity, "
        "so sinks get the share their larger cache can hold",
    ),
    # ---------------------------------------------------------------- core: fail closed (registered last, so these
    # wrap every hook above on the same target and also catch what those raise)
    Hook(
        target=f"{SCHEDULER}.__init__", hook_type="AROUND", runtime=FAIL_CLOSED, method="around_scheduler",
        params=("self", "server_args", "port_args", "gpu_id", "tp_rank"),
        why="a scheduler whose start-up raises (model load, CUDA graph capture, a feature's set-up) stops the whole "
        "server with one line naming it (SGLang signals only its parent, the DP controller when --dp-size > 1, and a "
        "peer's watcher would then blame the peer)",
    ),
    Hook(
        target=f"{SCHEDULER}.run_event_loop", hook_type="AROUND", runtime=FAIL_CLOSED, method="around_scheduler",
        params=("self",),
        why="as Scheduler.__init__, for a scheduler that raises while serving",
    ),
)


@dataclasses.dataclass(frozen=True)
class TorchHook:
    """A torch module hook a mechanism installs at run time on an SGLang module.

    Attributes:
        kind: "forward_pre" (`Module.register_forward_pre_hook`).
        module: which SGLang module gets it.
        installer: "module:Class.method" of our code that installs it.
        sglang_attrs: SGLang instance attributes used to find the module (checked like `USED_SYMBOLS`).
        why: what it is for.
    """

    kind: str
    module: str
    installer: str
    sglang_attrs: tuple[str, ...]
    why: str


TORCH_HOOKS: dict[str, TorchHook] = {
    "slot_ring_start": TorchHook(
        kind="forward_pre",
        module="the first decoder layer of ModelRunner.model (`model.model.layers[model.model.start_layer]`)",
        installer="sgl_sidp.prefetch.binding:SlotBinding.install_start",  # found by binding.first_decoder_layer
        sglang_attrs=(
            "sglang.srt.models.qwen3_moe.Qwen3MoeForCausalLM.model",
            "sglang.srt.models.qwen2_moe.Qwen2MoeModel.layers",
            "sglang.srt.models.qwen2_moe.Qwen2MoeModel.start_layer",
            "sglang.srt.models.mixtral.MixtralForCausalLM.model",
            "sglang.srt.models.mixtral.MixtralModel.layers",
            "sglang.srt.models.mixtral.MixtralModel.start_layer",
            "sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM.model",
            "sglang.srt.models.deepseek_v2.DeepseekV2Model.layers",
            "sglang.srt.models.deepseek_v2.DeepseekV2Model.start_layer",
            "sglang.srt.models.qwen3.Qwen3ForCausalLM.model",
            "sglang.srt.models.qwen3.Qwen3Model.layers",
            "sglang.srt.models.qwen2.Qwen2ForCausalLM.model",
            "sglang.srt.models.qwen2.Qwen2Model.layers",
            "sglang.srt.models.qwen2.Qwen2Model.start_layer",
            "sglang.srt.models.qwen2.Qwen2Model.end_layer",
            "sglang.srt.models.qwen2.Qwen2DecoderLayer.mlp",
            "sglang.srt.models.qwen3.Qwen3DecoderLayer.mlp",
            "sglang.srt.models.llama.LlamaForCausalLM.model",
            "sglang.srt.models.llama.LlamaModel.layers",
            "sglang.srt.models.llama.LlamaModel.start_layer",
            "sglang.srt.models.llama.LlamaModel.end_layer",
            "sglang.srt.models.llama.LlamaDecoderLayer.mlp",
        ),
        why="a forward starts: issue the first slot copies (SlotPrefetcher.start_forward), before any layer "
        "computes; captured into decode CUDA graphs, an eager break inside breakable prefill graphs; skipped in SiDP's "
        "CaS iterations (eager, no streamed layer used)",
    ),
}


#: SGLang classes subclassed for instances we build ourselves: name -> (our factory, what it changes and why).
OVERRIDES: dict[str, tuple[str, str]] = {
    "cas_decode_graph_runner": (
        "sgl_sidp.sidp.runtime:bucket_runner_class",
        "subclass of ModelRunner._decode_cuda_graph_runner_cls() (SGLang's DecodeCudaGraphRunner) whose "
        "_pad_to_bucket rounds up to the graph size every DP rank agreed on; only the second, CaS decode graph set "
        "of --sidp-cas-graphs is built from it (SGLang's own runner keeps its behaviour)",
    ),
}


@dataclasses.dataclass(frozen=True)
class UsedSymbol:
    """An SGLang symbol we call or read without hooking it.

    Attributes:
        path: dotted path; for an instance attribute, `module.Class.attr`.
        params: leading parameter names we pass (callables only).
        instance_attr: True when `attr` is set on instances (dataclass field or
            assigned in `__init__`) rather than defined on the class.
        keywords: parameter names we pass by keyword only, wherever they stand (callables only).
    """

    path: str
    params: tuple[str, ...] = ()
    instance_attr: bool = False
    keywords: tuple[str, ...] = ()


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
    UsedSymbol(f"{SCHEDULER}._engine_paused", instance_attr=True),
    UsedSymbol(f"{SCHEDULER}.ps", instance_attr=True),  # the DP rank only (`process.dp_rank`: none in both 0.5.17/0.5.23)
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
    UsedSymbol(f"{MODEL_RUNNER}.ps", instance_attr=True),  # as Scheduler.ps
    UsedSymbol(f"{MODEL_RUNNER}.model", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.model_config", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.server_args", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.is_draft_worker", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.max_total_num_tokens", instance_attr=True),
    UsedSymbol("sglang.srt.distributed.parallel_state_wrapper.ParallelState.dp_rank", instance_attr=True),
    # the TP rank, size and group (every feature and the calibration; not `.ps` nor `ModelRunner.tp_group`)
    UsedSymbol("sglang.srt.distributed.parallel_state.get_tensor_model_parallel_rank"),
    UsedSymbol("sglang.srt.distributed.parallel_state.get_tensor_model_parallel_world_size"),
    UsedSymbol("sglang.srt.distributed.parallel_state.get_tp_group"),
    UsedSymbol(f"{FUSED_MOE}.layer_id", instance_attr=True),
    # SiDP --sidp-cas-graphs: a second decode graph set, swapped in per iteration, over our own NCCL communicator
    UsedSymbol(f"{MODEL_RUNNER}._decode_cuda_graph_runner_cls", ("self",)),
    UsedSymbol(f"{MODEL_RUNNER}._get_attention_backend", ("self", "init_new_workspace")),
    UsedSymbol(f"{MODEL_RUNNER}.init_new_workspace", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.attn_backend", instance_attr=True),
    UsedSymbol("sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.__init__",
               ("self", "model_runner", "attn_backend")),
    UsedSymbol("sglang.srt.model_executor.runner.base_cuda_graph_runner.BaseCudaGraphRunner._pad_to_bucket",
               ("raw_size", "buckets")),
    UsedSymbol("sglang.srt.distributed.device_communicators.pynccl.PyNcclCommunicator", ("group", "device")),
    UsedSymbol("sglang.srt.distributed.device_communicators.pynccl.PyNcclCommunicator.all_gather",
               ("self", "output_tensor", "input_tensor")),
    UsedSymbol("sglang.srt.distributed.device_communicators.pynccl.PyNcclCommunicator.broadcast",
               ("self", "tensor", "src")),
    UsedSymbol("sglang.srt.distributed.device_communicators.pynccl.PyNcclCommunicator.disabled", instance_attr=True),
    UsedSymbol("sglang.srt.distributed.device_communicators.pynccl.PyNcclCommunicator.available", instance_attr=True),
    UsedSymbol("sglang.srt.distributed.utils.StatelessProcessGroup", ("rank", "world_size", "store")),
    UsedSymbol(f"{MODEL_RUNNER}.pre_model_load_memory", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.mem_fraction_static", instance_attr=True),
    UsedSymbol("sglang.srt.distributed.parallel_state.GroupCoordinator.broadcast_object", ("self", "obj", "src")),
    UsedSymbol(f"{FUSED_MOE}.run_moe_core", ("self", "dispatch_output")),
    # SiDP: the dense MLPs' parameters it shares and streams
    UsedSymbol("sglang.srt.models.qwen2.Qwen2MLP.gate_up_proj", instance_attr=True),
    UsedSymbol("sglang.srt.layers.linear.MergedColumnParallelLinear.prefix", instance_attr=True),
    UsedSymbol("sglang.srt.models.qwen2.Qwen2MLP.down_proj", instance_attr=True),
    UsedSymbol("sglang.srt.models.llama.LlamaMLP.gate_up_proj", instance_attr=True),
    UsedSymbol("sglang.srt.models.llama.LlamaMLP.down_proj", instance_attr=True),
    # (an unquantized linear layer's `weight` is registered by this method)
    UsedSymbol("sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.create_weights",
               ("self", "layer", "input_size_per_partition", "output_partition_sizes")),
    # start-up calibration (sgl_sidp.calibration.measure): what it reads and calls on a built scheduler
    UsedSymbol(f"{SCHEDULER}.tp_worker", instance_attr=True),
    UsedSymbol(f"{SCHEDULER}.req_to_token_pool", instance_attr=True),
    UsedSymbol(f"{SCHEDULER}.token_to_kv_pool_allocator", instance_attr=True),
    UsedSymbol(f"{SCHEDULER}.tree_cache", instance_attr=True),
    UsedSymbol(f"{SCHEDULER}.model_config", instance_attr=True),
    UsedSymbol(f"{SCHEDULER}.spec_algorithm", instance_attr=True),
    UsedSymbol(f"{SCHEDULER}.server_args", instance_attr=True),
    UsedSymbol("sglang.srt.managers.tp_worker.TpModelWorker.model_runner", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.decode_cuda_graph_runner", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.req_to_token_pool", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.token_to_kv_pool_allocator", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.device", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.spec_algorithm", instance_attr=True),
    UsedSymbol(f"{MODEL_RUNNER}.forward", ("self", "forward_batch")),
    UsedSymbol("sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture_bs", instance_attr=True),
    # ... and before the prefill graphs exist (Shift's threshold), on the prefill graph runner
    UsedSymbol(f"{MODEL_RUNNER}.prefill_cuda_graph_runner", instance_attr=True),
    UsedSymbol(f"{PREFILL_GRAPHS}.capture_prepare", ("self", "num_tokens")),
    UsedSymbol(f"{PREFILL_GRAPHS}._run_forward", ("self", "forward_batch", "num_tokens")),
    UsedSymbol("sglang.srt.layers.attention.base_attn_backend.AttentionBackend.init_forward_metadata",
               ("self", "forward_batch")),
    UsedSymbol(f"{PREFILL_GRAPHS}.model_runner", instance_attr=True),
    UsedSymbol(f"{PREFILL_GRAPHS}.capture_num_tokens", instance_attr=True),
    UsedSymbol(f"{PREFILL_GRAPHS}.max_num_tokens", instance_attr=True),
    UsedSymbol(f"{PREFILL_GRAPHS}.prefill_backend_name", instance_attr=True),
    UsedSymbol("sglang.srt.model_executor.forward_batch_info.ForwardBatch", ("forward_mode", "batch_size", "input_ids",
               "req_pool_indices", "seq_lens", "out_cache_loc", "seq_lens_sum")),
    UsedSymbol("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new", ("batch", "model_runner")),
    UsedSymbol("sglang.srt.model_executor.forward_batch_info.ForwardBatch.orig_seq_lens", instance_attr=True),
    UsedSymbol("sglang.srt.model_executor.forward_batch_info.ForwardBatch.seq_lens_cpu", instance_attr=True),
    UsedSymbol("sglang.srt.model_executor.forward_batch_info.ForwardBatch.global_forward_mode", instance_attr=True),
    UsedSymbol("sglang.srt.model_executor.forward_batch_info.ForwardBatch.capture_hidden_mode", instance_attr=True),
    UsedSymbol("sglang.srt.model_executor.forward_batch_info.CaptureHiddenMode.NULL"),
    UsedSymbol(f"{SCHEDULE_BATCH}.Req", ("rid", "origin_input_text", "origin_input_ids", "sampling_params")),
    UsedSymbol(f"{SCHEDULE_BATCH}.Req.set_extend_range", ("self",)),
    UsedSymbol(f"{SCHEDULE_BATCH}.ScheduleBatch.init_new", ("reqs", "req_to_token_pool", "token_to_kv_pool_allocator",
               "tree_cache", "model_config", "enable_overlap", "spec_algorithm")),
    UsedSymbol(f"{SCHEDULE_BATCH}.ScheduleBatch.prepare_for_extend", ("self",)),
    UsedSymbol("sglang.srt.layers.dp_attention.set_is_extend_in_batch", ("is_extend_in_batch",)),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.create_fabric_handle", ("size", "device_id")),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.get_allocation_granularity", ("device_id",)),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.reserve_va", ("size", "granularity")),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.map_handle", ("va", "size", "handle")),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.set_access", ("va", "size", "device_id")),
    UsedSymbol("sglang.srt.layers.moe.dwdp.vmm.tensor_from_ptr", ("ptr", "shape", "dtype", "device_id")),
    UsedSymbol("sglang.srt.distributed.device_communicators.vmm_utils.check_drv", ("result_tuple", "label")),
    UsedSymbol("sglang.srt.distributed.device_communicators.vmm_utils.import_peer_handle", ("fabric_handle", "fd")),
    UsedSymbol("sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.eager_on_graph",
               keywords=("enable",)),
    UsedSymbol("sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph.get_current_stream",
               ("device",)),
    UsedSymbol("sglang.srt.managers.data_parallel_controller.LoadBalanceMethod.TOTAL_TOKENS"),
    # SiDP cas/auto: the DP ranks' lockstep and CaS groups, outside each replica's own world
    UsedSymbol("sglang.srt.utils.common.init_custom_process_group", ("backend", "init_method", "timeout", "world_size",
                                                                    "rank", "store", "group_name")),
    UsedSymbol("sglang.srt.server_args.ServerArgs.port", instance_attr=True),
    UsedSymbol("sglang.srt.server_args.ServerArgs.max_total_tokens", instance_attr=True),
    UsedSymbol(f"{DP_BUDGET}.total_tokens", instance_attr=True),
    UsedSymbol(f"{DP_BUDGET}.total_requests", instance_attr=True),
    UsedSymbol(f"{DP_BUDGET}.dp_size", instance_attr=True),
    UsedSymbol("sglang.srt.managers.load_snapshot.LoadSnapshot.max_total_num_tokens", instance_attr=True),
    # Shift Parallelism: its groups and the modules its base configuration reads
    UsedSymbol("sglang.srt.distributed.parallel_state.init_model_parallel_group",
               ("group_ranks", "local_rank", "backend", "use_pynccl", "use_custom_allreduce")),
    UsedSymbol("sglang.srt.distributed.parallel_state.get_world_group"),
    UsedSymbol("sglang.srt.distributed.parallel_state.GroupCoordinator.local_rank", instance_attr=True),
    UsedSymbol("sglang.srt.distributed.parallel_state.GroupCoordinator.pynccl_comm", instance_attr=True),
    UsedSymbol("sglang.srt.distributed.parallel_state.GroupCoordinator.all_to_all_single", ("self", "output", "input")),
    UsedSymbol("sglang.srt.distributed.parallel_state.GroupCoordinator.all_gather_into_tensor", ("self", "output", "input")),
    UsedSymbol("sglang.srt.distributed.parallel_state.GroupCoordinator.all_reduce", ("self", "input_")),
    UsedSymbol("sglang.srt.distributed.device_communicators.pynccl.PyNcclCommunicator.disabled", instance_attr=True),
    UsedSymbol("sglang.srt.models.qwen3.Qwen3Attention.qkv_proj", instance_attr=True),
    UsedSymbol("sglang.srt.models.qwen3.Qwen3Attention.o_proj", instance_attr=True),
    UsedSymbol("sglang.srt.models.qwen3.Qwen3DecoderLayer.self_attn", instance_attr=True),
    UsedSymbol("sglang.srt.models.qwen2.Qwen2Attention.qkv_proj", instance_attr=True),
    UsedSymbol("sglang.srt.models.qwen2.Qwen2Attention.o_proj", instance_attr=True),
    UsedSymbol("sglang.srt.models.qwen2.Qwen2DecoderLayer.self_attn", instance_attr=True),
    UsedSymbol("sglang.srt.models.qwen2.Qwen2MLP.act_fn", instance_attr=True),
    UsedSymbol("sglang.srt.models.qwen2.Qwen2Model.embed_tokens", instance_attr=True),
    UsedSymbol("sglang.srt.models.qwen3.Qwen3ForCausalLM.logits_processor", instance_attr=True),
    UsedSymbol("sglang.srt.models.qwen2.Qwen2ForCausalLM.logits_processor", instance_attr=True),
    UsedSymbol(f"{LINEAR}.RowParallelLinear.reduce_results", instance_attr=True),
    UsedSymbol("sglang.srt.models.llama.LlamaAttention.qkv_proj", instance_attr=True),
    UsedSymbol("sglang.srt.models.llama.LlamaAttention.o_proj", instance_attr=True),
    UsedSymbol("sglang.srt.models.llama.LlamaDecoderLayer.self_attn", instance_attr=True),
    UsedSymbol("sglang.srt.models.llama.LlamaMLP.act_fn", instance_attr=True),
    UsedSymbol("sglang.srt.models.llama.LlamaModel.embed_tokens", instance_attr=True),
    UsedSymbol("sglang.srt.models.llama.LlamaForCausalLM.logits_processor", instance_attr=True),
    # plan calibrate: SGLang's JIT kernel builders, called ahead in a process of their own (`plan.jit_prebuild`)
    UsedSymbol("sglang.kernels.ops.activation.activation.activation_module", ("dtype",)),
    UsedSymbol("sglang.kernels.ops.attention.clamp_position._jit_clamp_position_module", ("dtype",)),
    UsedSymbol("sglang.kernels.ops.attention.rope._jit_fused_rope_module", ("is_neox", "rope_dim", "dtype", "q_dtype")),
    UsedSymbol("sglang.kernels.ops.layernorm.norm._jit_qknorm_module", ("head_dim", "dtype")),
    UsedSymbol("sglang.kernels.ops.kvcache.kvcache._jit_kvcache_module", ("k_row_bytes", "v_row_bytes")),
    UsedSymbol("sglang.kernels.ops.communication.all_reduce.get_all_reduce_module", ("dtype", "world_size")),
    UsedSymbol("sglang.kernels.ops.communication.all_reduce._init_communicator", ()),
    UsedSymbol("sglang.kernels.ops.communication.all_reduce._init_ipc_manager", ()),
    UsedSymbol("sglang.kernels.jit.utils.arch.override_jit_cuda_arch", ("major", "minor")),
    UsedSymbol("sglang.kernels.jit.utils.arch.make_jit_cuda_arch", ("major", "minor")),
)


def hooks_for(cfg) -> list[Hook]:
    """The hooks to install for `cfg` (a `SidpConfig`): the core's when the overlay is on, plus its mode's."""
    if not cfg.active:
        return []
    return [h for h in HOOKS if (h.feature is None or h.feature == cfg.mode.value)
            and (h.needs is None or getattr(cfg, h.needs))]


def check_symbol(path: str, params: tuple[str, ...] = (), instance_attr: bool = False,
                 keywords: tuple[str, ...] = ()) -> None:
    """Resolve `path` in the installed SGLang and check what we rely on: its leading parameters `params`, and
    `keywords` among its parameters.

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
            if re.search(rf"self\.{attr}\s*[,:=]", src):  # assigned, annotated, or unpacked into
                return
        raise LookupError(f"{owner_path} has no attribute {attr!r}")
    try:
        obj = pkgutil.resolve_name(path)
    except (ImportError, AttributeError) as e:
        raise LookupError(f"{path}: {e}") from e
    if params or keywords:
        got = list(inspect.signature(obj).parameters)
        if got[: len(params)] != list(params):
            raise LookupError(f"{path}: expected leading parameters {list(params)}, found {got}")
        if not set(keywords) <= set(got):
            raise LookupError(f"{path}: expected parameters {list(keywords)} (passed by keyword), found {got}")
