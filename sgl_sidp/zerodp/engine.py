"""ZeroDP inside SGLang: the hook bodies that turn DP replica 0 into the source and the others into sinks.

Hooks (registered by `sgl_sidp.plugin` from `sgl_sidp.hooks.HOOKS` when `--sidp-mode zerodp`):

- AFTER `ModelRunner.load_model` -> `on_load_model`: runs before SGLang sizes the KV cache
  (`ModelRunner.alloc_memory_pool`), so what a sink frees becomes KV cache.
  - source (DP rank 0): moves the expert tensors into shareable VMM memory and serves them.
  - sink: imports the source's tensors, checks them against its own (fail closed), measures
    the copy rate, chooses the offload set (`plan.choose_plan`), points the offloaded layers'
    expert parameters at two slots, frees their own copies, and installs the prefetcher.
- AROUND `FusedMoE.run_moe_core` -> `around_run_moe_core`: on a sink's offloaded layer, wait
  for the slot before the experts run, release it and prefetch the next tenant after (the same
  two points SGLang's DWDP uses in `FusedMoE.forward_impl`).
- AFTER `ModelRunner.alloc_memory_pool` -> `on_alloc_memory_pool`: logs the KV capacity.
- AFTER `Scheduler.__init__` -> `on_scheduler_init`: Prometheus metrics (`ZeroDPMetrics`), fed by
  the batch-signal observer (`sgl_sidp.control.batch_signal`) once per busy iteration.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from sgl_sidp.peer.manifest import manifest_mismatches
from sgl_sidp.zerodp.plan import (
    GROUPS,
    Calibration,
    ExpectedBatch,
    KVModel,
    N_SLOTS,
    OffloadPlan,
    ZeroDPError,
    choose_plan,
    find_calibration,
    group_of,
    hidden_fraction,
    manifest_of,
    model_signature,
    parse_layers,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ZeroDPState:
    """What this process is in the ZeroDP pairing (one per scheduler process)."""

    role: str  # "source" or "sink"
    dp_rank: int
    tp_rank: int
    plan: OffloadPlan | None = None
    copy_gbps: float = 0.0
    freed_bytes: int = 0
    exporter: object = None
    importer: object = None
    prefetcher: object = None
    kv_tokens: int | None = None


#: This process's state; None outside ZeroDP or before the model is loaded.
STATE: ZeroDPState | None = None


def collect_moe_layers(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    """`(layer_id, FusedMoE)` of every MoE layer, in forward order (as SGLang's DWDP collects them)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    found = [(int(m.layer_id), m) for m in model.modules() if isinstance(m, FusedMoE)]
    return sorted(found, key=lambda x: x[0])


def _first_decoder_layer(model: torch.nn.Module) -> torch.nn.Module:
    decoder = getattr(model, "model", model)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ZeroDPError(f"{type(model).__name__} has no .model.layers; ZeroDP cannot find where a forward starts")
    return layers[getattr(decoder, "start_layer", 0)]


def _who(dp: int, tp: int) -> str:
    return f"DP{dp} TP{tp}"


def on_load_model(result, runner, *args, **kwargs):
    """AFTER hook on `ModelRunner.load_model`: set up the source or the sink (see module doc).

    Raises:
        ZeroDPError: no MoE layers; source and sink disagree on an expert tensor; no calibration
            for `--sidp-zerodp-layers auto`.
        sgl_sidp.peer.vmm.PeerError: the source did not publish in time; the GPUs have no peer access.
    """
    global STATE
    from sgl_sidp.plugin import loaded_config

    cfg = loaded_config()
    if getattr(runner, "is_draft_worker", False):
        return result
    dp = int(runner.ps.dp_rank or 0)
    tp = int(runner.ps.tp_rank)
    moe_layers = collect_moe_layers(runner.model)
    if not moe_layers:
        raise ZeroDPError(f"--sidp-mode zerodp: {type(runner.model).__name__} has no FusedMoE layers to share")
    manifest = manifest_of(moe_layers)
    from sgl_sidp.peer.vmm import TensorExporter, socket_address

    address = socket_address("zerodp", runner.server_args.port, tp)
    device_id = torch.cuda.current_device()
    if dp == 0:
        modules = dict(moe_layers)
        params = {t: getattr(modules[t.layer_id], t.name) for t in manifest}
        exporter = TensorExporter(params, device_id, address)
        STATE = ZeroDPState("source", dp, tp, exporter=exporter)
        logger.info(
            "sgl-sidp zerodp %s: source, serving %d expert tensors of %d MoE layers (%.2f GB) from GPU %d",
            _who(dp, tp), len(manifest), len(moe_layers), exporter.nbytes / 1e9, device_id,
        )
        return result
    STATE = _setup_sink(cfg, runner, dp, tp, moe_layers, manifest, address, device_id)
    return result


def _setup_sink(cfg, runner, dp, tp, moe_layers, manifest, address, device_id) -> ZeroDPState:
    from sgl_sidp.peer.vmm import TensorImporter, measure_copy_gbps
    from sgl_sidp.prefetch.ring import PrefetchSchedule, SlotPrefetcher, StreamOps, sync_points

    who = _who(dp, tp)
    importer = TensorImporter(address, device_id, cfg.zerodp_source_timeout_s, f"zerodp source {_who(0, tp)}")
    problems = manifest_mismatches(importer.entries, manifest)
    if problems:
        raise ZeroDPError(
            f"zerodp sink {who} and source {_who(0, tp)} disagree on {len(problems)} expert tensor(s) "
            "(same --model-path, --tp-size, --dtype and quantization on both are required):\n  "
            + "\n  ".join(problems[:20])
        )
    groups = tuple(g for g in GROUPS if g in cfg.zerodp_tensors.split(","))
    wanted = [t for t in manifest if group_of(t.name) in groups]
    remote = importer.map([t.key for t in wanted])
    moe_ids = [lid for lid, _ in moe_layers]
    first = moe_ids[0]
    names = sorted({t.name for t in wanted})
    modules = dict(moe_layers)
    slots = [{n: torch.empty_like(getattr(modules[first], n)) for n in names} for _ in range(N_SLOTS)]
    slot_bytes = sum(t.numel() * t.element_size() for slot in slots for t in slot.values())
    gbps = measure_copy_gbps([(slots[0][n], remote[(first, n)]) for n in names])

    forced = parse_layers(cfg.zerodp_layers, moe_ids)
    budget = None
    cal = None
    kv = None
    if forced is None:
        cal_path = cfg.zerodp_calibration
        sig = model_signature(runner.model_config.hf_config.to_dict(), runner.ps.tp_size)
        gpu = torch.cuda.get_device_name(device_id)
        if cal_path is None:
            found = find_calibration(sig, gpu)
            if found is None:
                raise ZeroDPError(
                    f"--sidp-zerodp-layers auto needs forward times for '{sig}' on {gpu}: run "
                    "scripts/zerodp_fetch_vs_compute.py and pass --sidp-zerodp-calibration, or force the "
                    "set with --sidp-zerodp-layers all|every:K|3,7,11"
                )
            cal_path = str(found)
        cal = Calibration.load(cal_path)
        expected = ExpectedBatch.parse(cfg.zerodp_expected_batch)
        if expected.kind == "kv":
            kv = KVModel(
                vanilla_kv_bytes=_vanilla_kv_bytes(runner, device_id, slot_bytes),
                kv_bytes_per_token=_kv_bytes_per_token(runner),
                context=expected.size,
                calibration=cal,
                max_batch=runner.server_args.max_running_requests,
            )
        else:
            budget = cal.forward_ms(expected)
    n_sinks = max(1, int(runner.server_args.dp_size) - 1)
    plan = choose_plan(manifest, groups, gbps, budget, forced, sink_index=dp - 1, n_sinks=n_sinks, kv=kv)

    state = ZeroDPState("sink", dp, tp, plan=plan, copy_gbps=gbps, importer=importer)
    if not plan.layers:
        del slots
        torch.cuda.empty_cache()
    else:
        schedule = PrefetchSchedule(plan.layers, n_slots=N_SLOTS)
        for lid in plan.layers:
            for n in names:
                p = getattr(modules[lid], n)
                state.freed_bytes += p.numel() * p.element_size()
                p.data = slots[schedule.slot_of(lid)][n]
        torch.cuda.empty_cache()
        prefetcher = SlotPrefetcher(schedule, {(lid, n): remote[(lid, n)] for lid in plan.layers for n in names}, slots, StreamOps(torch.device("cuda", device_id)))
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import eager_on_graph

        start, before, after = sync_points(prefetcher, wrap=eager_on_graph(True))
        for lid in plan.layers:
            modules[lid]._sidp_zerodp = (before, after)
        _first_decoder_layer(runner.model).register_forward_pre_hook(lambda module, args: start())
        state.prefetcher = prefetcher
    importer.watch()
    logger.info(
        "sgl-sidp zerodp %s: sink of source %s (GPU %d -> GPU %d, %.0f GB/s measured); offloads %s of layers %s: %s. "
        "Pulls %.2f GB per forward (%.1f ms of copies); frees %.2f GB, slots take %.2f GB.",
        who, _who(0, tp), importer.owner_device, device_id, gbps, "+".join(plan.groups), list(plan.layers), plan.reason,
        plan.bytes_per_forward / 1e9, plan.copy_ms, state.freed_bytes / 1e9, (slot_bytes if plan.layers else 0) / 1e9,
    )
    if cal is not None and plan.layers:
        rows = [f"decode:{b} {ms:.1f} ms -> {hidden_fraction(plan.copy_ms, ms):.0%}" for b, ms in sorted(cal.decode_ms.items())]
        rows += [f"prefill:{t} {ms:.1f} ms -> {hidden_fraction(plan.copy_ms, ms):.0%}" for t, ms in sorted(cal.prefill_ms.items())]
        logger.info("sgl-sidp zerodp %s: copy time hidden behind compute, by batch (calibration %s): %s", who, cal.model, "; ".join(rows))
    return state


def _vanilla_kv_bytes(runner, device_id: int, slot_bytes: int) -> float:
    """Bytes SGLang would give this sink's KV cache without ZeroDP (its own formula, before our changes).

    SGLang (`KVCacheConfigurator._profile_available_bytes`) takes the free memory after the weights
    load less `pre_model_load_memory * (1 - mem_fraction_static)`; the experts are still resident
    here, and the two slots we just allocated are added back. CUDA-graph and activation memory that
    SGLang takes later are not subtracted, so this is a slight overestimate.
    """
    free, total = torch.cuda.mem_get_info(device_id)
    pre_gib = getattr(runner, "pre_model_load_memory", None) or total / (1 << 30)
    slack = pre_gib * (1 << 30) * (1 - float(runner.server_args.mem_fraction_static))
    return max(0.0, free + slot_bytes - slack)


def _kv_bytes_per_token(runner) -> int:
    """KV bytes of one token over all attention layers of this TP rank (MHA/GQA: K and V; MLA: latent).

    `ModelRunner.configure_kv_cache_dtype` runs after `load_model`, so the dtype comes from
    `--kv-cache-dtype` (fp8*: 1 byte, fp4*: half) or else the model dtype.
    """
    mc = runner.model_config
    kv_flag = str(runner.server_args.kv_cache_dtype or "auto")
    elt = 1.0 if kv_flag.startswith("fp8") else 0.5 if kv_flag.startswith("fp4") else mc.dtype.itemsize
    layers = int(getattr(mc, "num_attention_layers", mc.num_hidden_layers))
    if getattr(mc, "kv_lora_rank", None):
        per_layer = mc.kv_lora_rank + mc.qk_rope_head_dim
    else:
        per_layer = 2 * mc.get_num_kv_heads(runner.ps.tp_size) * mc.head_dim
    return max(1, int(layers * per_layer * elt))


def around_run_moe_core(original, layer, *args, **kwargs):
    """AROUND hook on `FusedMoE.run_moe_core`: bracket a sink's offloaded layer with the slot sync points."""
    points = getattr(layer, "_sidp_zerodp", None)
    if points is None:
        return original(layer, *args, **kwargs)
    before, after = points
    before(layer.layer_id)
    out = original(layer, *args, **kwargs)
    after(layer.layer_id)
    return out


def on_alloc_memory_pool(result, runner, *args, **kwargs):
    """AFTER hook on `ModelRunner.alloc_memory_pool`: log this replica's KV capacity."""
    if STATE is None or getattr(runner, "is_draft_worker", False):
        return result
    STATE.kv_tokens = int(runner.max_total_num_tokens)
    logger.info(
        "sgl-sidp zerodp %s: %s KV cache %d tokens (max_total_num_tokens)%s",
        _who(STATE.dp_rank, STATE.tp_rank), STATE.role, STATE.kv_tokens,
        f", {STATE.freed_bytes / 1e9:.2f} GB of experts freed for it" if STATE.role == "sink" else "",
    )
    return result


class ZeroDPMetrics:
    """ZeroDP's Prometheus metrics, labelled like SGLang's scheduler metrics plus `role`.

    - `sglang:sidp_zerodp_kv_tokens`: this replica's KV capacity (tokens).
    - `sglang:sidp_zerodp_offloaded_layers`: MoE layers pulled from the source each forward (sinks).
    - `sglang:sidp_zerodp_bytes_per_forward`: bytes one forward pulls (sinks).
    - `sglang:sidp_zerodp_copy_ms_per_forward`: those bytes at the measured copy rate, ms (sinks);
      set against a forward's duration it is the share of the copy that cannot hide.
    - `sglang:sidp_zerodp_bytes_pulled_total`: bytes pulled so far (one forward per busy iteration).
    """

    def __init__(self, state: ZeroDPState, labels: dict, registry=None):
        from prometheus_client import REGISTRY, Counter, Gauge

        reg = REGISTRY if registry is None else registry
        labels = {**labels, "role": state.role}
        kw = dict(labelnames=list(labels), registry=reg)
        gauge = lambda name, doc: Gauge(name, doc, multiprocess_mode="mostrecent", **kw).labels(**labels)  # noqa: E731
        self.state = state
        self.kv = gauge("sglang:sidp_zerodp_kv_tokens", "KV cache capacity of this replica (tokens).")
        self.layers = gauge("sglang:sidp_zerodp_offloaded_layers", "MoE layers this sink pulls every forward.")
        self.per_fwd = gauge("sglang:sidp_zerodp_bytes_per_forward", "Bytes a forward pulls from the source.")
        self.copy_ms = gauge("sglang:sidp_zerodp_copy_ms_per_forward", "Copy time of one forward's pulls (ms).")
        self.pulled = Counter("sglang:sidp_zerodp_bytes_pulled", "Bytes pulled from the source so far.", **kw).labels(**labels)
        plan = state.plan
        self.kv.set(state.kv_tokens or 0)
        self.layers.set(len(plan.layers) if plan else 0)
        self.per_fwd.set(plan.bytes_per_forward if plan else 0)
        self.copy_ms.set(plan.copy_ms if plan else 0.0)

    def observe(self, sig) -> None:
        """One busy iteration ran one forward (listener of `BatchSignalObserver`)."""
        if self.state.plan is not None:
            self.pulled.inc(self.state.plan.bytes_per_forward)


def on_scheduler_init(result, scheduler, *args, **kwargs):
    """AFTER hook on `Scheduler.__init__` (after the batch-signal one): attach `ZeroDPMetrics`."""
    observer = getattr(scheduler, "_sidp_signal", None)
    collector = getattr(scheduler, "metrics_collector", None)
    if STATE is None or observer is None or collector is None:
        return result
    metrics = ZeroDPMetrics(STATE, dict(collector.labels))
    observer.listeners.append(metrics.observe)
    return result


def status() -> dict:
    """This process's ZeroDP facts for logs and metrics (empty outside ZeroDP)."""
    if STATE is None:
        return {}
    out = {"role": STATE.role, "dp_rank": STATE.dp_rank, "tp_rank": STATE.tp_rank, "kv_tokens": STATE.kv_tokens}
    if STATE.plan is not None:
        out.update(
            layers=list(STATE.plan.layers),
            groups=list(STATE.plan.groups),
            bytes_per_forward=STATE.plan.bytes_per_forward,
            copy_ms=STATE.plan.copy_ms,
            budget_ms=STATE.plan.budget_ms,
            copy_gbps=STATE.copy_gbps,
            reason=STATE.plan.reason,
        )
    return out
