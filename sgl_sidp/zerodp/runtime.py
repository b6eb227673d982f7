"""ZeroDP inside SGLang: DP replica 0 becomes the source, the others sinks (hook bodies, `sgl_sidp.hooks`).

`ZeroDPRuntime` is built once per process by the plugin and its methods are registered as hooks:

- `around_load_model` (AROUND `ModelRunner.load_model`, before SGLang sizes the KV cache, so what a
  sink does not hold becomes KV cache). While the model is built, a sink holds none of its experts
  (`after_moe_init`, AFTER `FusedMoE.__init__`: they point at shared placeholders,
  `sgl_sidp.prefetch.placeholders`), so a model that fills the GPU never needs twice its size on a
  sink's GPU. After loading:
  - source (DP rank 0): moves its expert tensors into shareable VMM memory one at a time
    (`sgl_sidp.peer.vmm.TensorExporter`; peak extra memory logged) and serves them.
  - sink: imports the source's tensors (checked against its own, fail closed), measures the copy
    rate, gets a calibration (`sgl_sidp.calibration.cache.resolve`; on a first start it waits for
    the source to measure one), chooses the offload set (`policy.choose_plan`; TP rank 0 decides
    for the replica), binds the offloaded layers to a slot ring (`sgl_sidp.prefetch.binding`) and
    copies the layers it keeps from the source once (never from the placeholders).
- `around_run_moe_core` (AROUND `FusedMoE.run_moe_core`): a sink's offloaded layer waits for its
  slot before its experts run and releases it after.
- `on_alloc_memory_pool`: logs the KV capacity.
- `on_scheduler_init` (AFTER `Scheduler.__init__`: graphs captured, nothing served yet): the
  source measures its forward times if no calibration is cached for this key and caches them; a
  sink measures its copy rate while forwards run; both attach `ZeroDPMetrics`.
- `after_update_budget` / `around_dispatch` (DP controller): capacity-aware routing.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from sgl_sidp.calibration.cost import DEFAULT_COPY_RATE_IN_FORWARD, KVModel, hidden_fraction
from sgl_sidp.calibration.measure import kv_bytes_per_token
from sgl_sidp.calibration.table import Calibration, ExpectedBatch
from sgl_sidp.peer.manifest import manifest_mismatches
from sgl_sidp.prefetch.placeholders import LoadPlaceholders, device_memory_note
from sgl_sidp.process import Progress, dp_rank
from sgl_sidp.zerodp.policy import GROUPS, N_SLOTS, OffloadPlan, ZeroDPError, choose_plan, group_of, manifest_of, parse_layers
from sgl_sidp.zerodp.router import Router

logger = logging.getLogger(__name__)

#: Decode batch the sink replays while measuring its copy rate inside forwards.
COPY_PROBE_BATCH = 64
#: Most bytes the in-forward copy probe moves per copy (a slice of the first offloaded tensor).
COPY_PROBE_BYTES = 256 << 20


def collect_moe_layers(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    """`(layer_id, FusedMoE)` of every MoE layer, in forward order (as SGLang's DWDP collects them).

    Raises:
        ZeroDPError: a layer's class runs its experts outside `FusedMoE.run_moe_core` (e.g. SGLang's
            `DeepEPMoE`, chosen by an all-to-all MoE backend), where a sink could not wait for its slot.
    """
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    found = [(int(m.layer_id), m) for m in model.modules() if isinstance(m, FusedMoE)]
    odd = sorted({type(m).__name__ for _, m in found if type(m).run_moe_core is not FusedMoE.run_moe_core})
    if odd:
        raise ZeroDPError(
            f"--overlay-mode zerodp: SGLang built MoE layers of class {', '.join(odd)}, whose run_moe_core is not "
            "FusedMoE's (an all-to-all MoE backend?): a sink could not synchronise its pulled weights; use "
            "--moe-a2a-backend none"
        )
    return sorted(found, key=lambda x: x[0])


def _who(dp: int, tp: int) -> str:
    return f"DP{dp} TP{tp}"


@dataclasses.dataclass
class CopyProbe:
    """What a sink measured of its copies while its GPU ran forwards (`time_copy_during_forward`)."""

    copy_gbps_idle: float
    copy_gbps_in_forward: float
    forward_ms: float
    forward_ms_with_copies: float
    slowdown_ms_per_gb: float


class ZeroDPRuntime:
    """ZeroDP's state in one process, and its hook bodies (see the module doc).

    Args:
        ctx: the plugin's per-process context (`sgl_sidp.plugin.PluginContext`); ZeroDP reads
            `ctx.config.zerodp` and subscribes its metrics to `ctx.listeners`.
    """

    def __init__(self, ctx):
        self.settings = ctx.config.zerodp
        self.role: str | None = None  # "source" or "sink" once the model is loaded
        self.dp_rank = self.tp_rank = 0
        self.plan: OffloadPlan | None = None
        self.copy_gbps = 0.0
        self.exporter = None
        self.importer = None
        self.binding = None
        self.kv_tokens: int | None = None
        self.calibration: Calibration | None = None
        self.calibration_origin = ""
        self.copy_probe: CopyProbe | None = None
        self._probe_src: torch.Tensor | None = None
        self.metrics: ZeroDPMetrics | None = None
        self.placeholders = LoadPlaceholders()  # a sink's experts while its model loads
        self.held_at_load: list[int] = []  # MoE layers SGLang gave expert storage of their own while loading
        self.router = Router()  # DP controller: capacities, speeds, requests in flight
        ctx.listeners.append(self._on_iteration)

    @property
    def who(self) -> str:
        return _who(self.dp_rank, self.tp_rank)

    @property
    def groups(self) -> tuple[str, ...]:
        """The expert groups a sink may pull (`--zerodp-tensors`), in `GROUPS` order."""
        return tuple(g for g in GROUPS if g in self.settings.tensors.split(","))

    # ------------------------------------------------------------------ model runner hooks
    def around_load_model(self, original, runner, *args, **kwargs):
        """AROUND `ModelRunner.load_model`: a sink's experts take no memory while the model loads
        (`after_moe_init`); then set up the source or the sink (`on_loaded`)."""
        if getattr(runner, "is_draft_worker", False):
            return original(runner, *args, **kwargs)
        with self.placeholders.placing(dp_rank(runner) > 0):
            result = original(runner, *args, **kwargs)
        self.on_loaded(runner)
        return result

    def after_moe_init(self, result, layer, *args, **kwargs):
        """AFTER `FusedMoE.__init__`: while a sink's model is built, point the layer's offloadable expert tensors
        (the `--zerodp-tensors` groups) at shared placeholders, freeing their fresh storage at once."""
        if self.placeholders.loading:
            groups = self.groups
            names = [n for n, _ in layer.named_parameters(recurse=False) if group_of(n) in groups]
            self.placeholders.take(int(layer.layer_id), layer, names)
        return result

    def on_loaded(self, runner) -> None:
        """After `ModelRunner.load_model`: set up the source or the sink.

        Raises:
            ZeroDPError: no MoE layers or an unsupported MoE layer class; source and sink disagree
                on an expert tensor; no calibration for `auto` in time.
            sgl_sidp.peer.vmm.PeerError: no shareable memory for a move; the source did not
                publish in time; the GPUs have no peer access.
        """
        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank

        from sgl_sidp.peer.vmm import socket_address

        self.dp_rank, self.tp_rank = dp_rank(runner), get_tensor_model_parallel_rank()
        moe_layers = collect_moe_layers(runner.model)
        if not moe_layers:
            raise ZeroDPError(f"--overlay-mode zerodp: {type(runner.model).__name__} has no FusedMoE layers to share")
        address = socket_address("zerodp", runner.server_args.port, self.tp_rank)
        if self.dp_rank == 0:
            self._setup_source(moe_layers, address)
        else:
            self._setup_sink(runner, moe_layers, address)

    def _setup_source(self, moe_layers, address: str) -> None:
        from sgl_sidp.peer.vmm import TensorExporter

        device_id = torch.cuda.current_device()
        modules = dict(moe_layers)
        manifest = manifest_of(moe_layers)
        params = {t: getattr(modules[t.layer_id], t.name) for t in manifest}
        self.role = "source"
        self.exporter = ex = TensorExporter(params, device_id, address)
        logger.info(
            "sgl-sidp zerodp %s: source, serving %d expert tensors of %d MoE layers (%.2f GB) from GPU %d; moved one "
            "at a time into shareable memory: peak extra memory %.2f GB measured (plan: %.2f GB, the largest tensor). "
            "%s (its experts, in shareable memory, among the latter)",
            self.who, len(manifest), len(moe_layers), ex.nbytes / 1e9, device_id,
            ex.peak_extra_bytes / 1e9, ex.plan.peak_extra_bytes / 1e9, device_memory_note(device_id),
        )

    def _setup_sink(self, runner, moe_layers, address: str) -> None:
        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_world_size, get_tp_group

        from sgl_sidp.peer.vmm import TensorImporter, measure_copy_gbps
        from sgl_sidp.prefetch.binding import SlotBinding, first_decoder_layer
        from sgl_sidp.prefetch.ring import SAMPLE_EVERY, StreamOps, graph_break

        s = self.settings
        device_id = torch.cuda.current_device()
        load_peak = torch.cuda.max_memory_allocated(device_id)  # this process, while SGLang loaded the model
        source = f"zerodp source {_who(0, self.tp_rank)}"
        self.role = "sink"
        self.importer = imp = TensorImporter(address, device_id, s.source_timeout_s, source)
        manifest = manifest_of(moe_layers)
        problems = manifest_mismatches(imp.entries, manifest)
        if problems:
            raise ZeroDPError(
                f"zerodp sink {self.who} and {source} disagree on {len(problems)} expert tensor(s) "
                "(same --model-path, --tp-size, --dtype and quantization on both are required):\n  "
                + "\n  ".join(problems[:20])
            )
        groups = self.groups
        names = sorted({t.name for t in manifest if group_of(t.name) in groups})
        modules = dict(moe_layers)
        moe_ids = [lid for lid, _ in moe_layers]
        self.held_at_load = self.placeholders.left_placeholder(modules)
        first = imp.map([(moe_ids[0], n) for n in names])
        scratch = {n: torch.empty_like(getattr(modules[moe_ids[0]], n)) for n in names}
        self.copy_gbps = measure_copy_gbps([(scratch[n], first[(moe_ids[0], n)]) for n in names])
        self._probe_src = first[(moe_ids[0], names[0])]  # what the in-forward copy probe reads later
        del scratch
        torch.cuda.empty_cache()

        forced = parse_layers(s.layers, moe_ids)
        budget = kv = None
        if forced is None:
            self.calibration, self.calibration_origin = self._calibration(runner, imp)
            expected = ExpectedBatch.parse(s.expected_batch)
            if expected.kind == "kv":
                kv = KVModel(
                    vanilla_kv_bytes=_vanilla_kv_bytes(runner, device_id, self.placeholders.not_held_bytes(self.held_at_load)),
                    kv_bytes_per_token=kv_bytes_per_token(runner),
                    context=expected.size,
                    calibration=self.calibration,
                    n_slots=N_SLOTS,
                    max_batch=runner.server_args.max_running_requests,
                )
            else:
                budget = self.calibration.forward_ms(expected)
        n_sinks = max(1, int(runner.server_args.dp_size) - 1)
        rate = (self.calibration.copy_rate_in_forward or DEFAULT_COPY_RATE_IN_FORWARD) if self.calibration else 1.0
        plan = choose_plan(manifest, groups, self.copy_gbps, budget, forced, sink_index=self.dp_rank - 1,
                           n_sinks=n_sinks, kv=kv, rate_in_forward=rate)
        if get_tensor_model_parallel_world_size() > 1:  # one decision per replica: TP rank 0's (copy rate, memory)
            plan = get_tp_group().broadcast_object(plan if self.tp_rank == 0 else None, src=0)
        self.plan = plan
        if plan.layers:
            remote = {**first, **imp.map([(lid, n) for lid in plan.layers for n in names if lid != moe_ids[0]])}
            self.binding = SlotBinding(modules, names, remote, plan.layers, N_SLOTS, StreamOps(torch.device("cuda", device_id)),
                                       wrap=graph_break, release_cached=torch.cuda.empty_cache,
                                       sample_every=SAMPLE_EVERY)
            self.binding.install_start(first_decoder_layer(runner.model))
        kept = [lid for lid in moe_ids if lid in self.placeholders.taken and lid not in plan.layers]
        kept_bytes, kept_s = 0, 0.0
        if kept:  # their values come from the source once, never from the placeholders
            t0 = time.monotonic()
            keys = [(lid, n) for lid in kept for n in self.placeholders.taken[lid]]
            remote = {**first, **imp.map([k for k in keys if k not in first])}
            kept_bytes = self.placeholders.materialize(modules, kept, remote)
            torch.cuda.synchronize(device_id)
            kept_s = time.monotonic() - t0
        self.placeholders.release()
        note = self.placeholders.still_held_note()
        if note:
            logger.warning("sgl-sidp zerodp %s: %s", self.who, note)
        memory = device_memory_note(device_id)  # what SGLang's KV sizing will see next
        imp.watch()
        b = self.binding
        logger.info(
            "sgl-sidp zerodp %s: sink of %s (GPU %d -> GPU %d, %.0f GB/s measured); offloads %s of layers %s: %s. "
            "Pulls %.2f GB per forward (%.1f ms of copies at that rate); does not hold %.2f GB, slots take %.2f GB. "
            "While loading, %d of %d MoE layers' experts were never held%s (peak allocation of this process %.2f GB); "
            "the %d layers kept were copied from the source once (%.2f GB in %.2f s).%s %s.",
            self.who, source, imp.owner_device, device_id, self.copy_gbps, "+".join(plan.groups), list(plan.layers),
            plan.reason, plan.bytes_per_forward / 1e9, plan.copy_ms, (b.freed_bytes if b else 0) / 1e9,
            (b.slot_bytes if b else 0) / 1e9, len(self.placeholders.taken) - len(self.held_at_load), len(moe_ids),
            f" (held in full: {self.held_at_load})" if self.held_at_load else "", load_peak / 1e9, len(kept),
            kept_bytes / 1e9, kept_s,
            f" Calibration: {self.calibration_origin}." if self.calibration_origin else "", memory,
        )
        cal = self.calibration or (self._cached_calibration(runner) if plan.layers else None)
        if cal is not None and plan.layers and cal.decode_ms:
            self._warn_if_copy_bound(plan, cal)
        if cal is not None and plan.layers:
            rows = [f"decode:{n} {ms:.1f} ms -> {hidden_fraction(plan.copy_ms, ms):.0%}" for n, ms in sorted(cal.decode_ms.items())]
            rows += [f"prefill:{t} {ms:.1f} ms -> {hidden_fraction(plan.copy_ms, ms):.0%}" for t, ms in sorted(cal.prefill_ms.items())]
            logger.info("sgl-sidp zerodp %s: modelled share of the copies hidden behind compute, by batch: %s", self.who, "; ".join(rows))

    def _cached_calibration(self, runner) -> Calibration | None:
        """This model's forward times if a flag, bundled table or cache has them (no waiting for the source)."""
        from sgl_sidp.calibration.cache import CalibrationCache, resolve
        from sgl_sidp.calibration.startup import calibration_key

        return resolve(calibration_key(runner), self.settings.calibration, CalibrationCache())[0]

    def _warn_if_copy_bound(self, plan: OffloadPlan, cal: Calibration) -> None:
        """One warning line where this sink's decode steps cannot hide its copies (issue 35: `--zerodp-layers all` on
        Qwen3-30B-A3B, 2 x H100, pulled 58 GB per forward, 146 ms at the idle copy rate, against 4.6-28 ms decode
        forwards: 0.61x vanilla DP2's throughput on a decode-heavy burst), with the predicted slowdown."""
        batches = sorted(cal.decode_ms)
        lo, hi = cal.decode_ms[batches[0]], cal.decode_ms[batches[-1]]
        if plan.copy_ms <= hi:
            return
        logger.warning(
            "sgl-sidp zerodp %s: this sink's decode steps are copy-bound: %.1f ms of copies per forward (at the idle "
            "copy rate; slower beside compute) against vanilla decode forwards of %.1f-%.1f ms (batch %d-%d), so a "
            "decode step takes at least %.0f ms, %.1f-%.0fx a vanilla replica's (predicted). Only prefill forwards of "
            "%s hide them; --zerodp-layers auto with the default --zerodp-expected-batch offloads only what decode "
            "steps hide", self.who, plan.copy_ms, lo, hi, batches[0], batches[-1], plan.copy_ms, plan.copy_ms / hi,
            plan.copy_ms / lo, _hiding_prefills(cal, plan.copy_ms))

    def _calibration(self, runner, importer) -> tuple[Calibration, str]:
        """The calibration `auto` decides with: flag file, bundled table, cache, or (first start) the source's."""
        import psutil

        from sgl_sidp.calibration.cache import CalibrationCache, resolve
        from sgl_sidp.calibration.startup import calibration_key

        key = calibration_key(runner)
        cache = CalibrationCache()
        cal, origin = resolve(key, self.settings.calibration, cache)
        if cal is not None:
            return cal, origin
        timeout = self.settings.source_timeout_s
        logger.info(
            "sgl-sidp zerodp %s: no calibration cached for %s on %s; waiting up to %.0f s for the source to measure "
            "it once its CUDA graphs are captured (first start only; later starts read %s)",
            self.who, key.model, key.gpu, timeout, cache.path(key),
        )
        t0 = time.monotonic()
        source = f"zerodp source {_who(0, self.tp_rank)} (pid {importer.owner_pid})"
        with Progress(f"sgl-sidp zerodp {self.who} waits for the start-up calibration of {source} in {cache.path(key)}",
                      logger, limit_s=timeout):
            cal = cache.wait(key, timeout, alive=lambda: psutil.pid_exists(importer.owner_pid))
        if cal is None:
            raise ZeroDPError(
                f"--zerodp-layers auto: the source measured no calibration for {key.model} on {key.gpu} within "
                f"{timeout:.0f} s (it failed, or runs without CUDA graphs?); pass --zerodp-calibration FILE or "
                "force the set with --zerodp-layers all|every:K|3,7,11"
            )
        return cal, f"measured by the source at start-up ({cal.measure_s:.1f} s; waited {time.monotonic() - t0:.0f} s), cache {cache.path(key)}"

    def around_run_moe_core(self, original, layer, *args, **kwargs):
        """AROUND `FusedMoE.run_moe_core`: bracket a sink's offloaded layer with its slot's sync points."""
        if self.binding is None:
            return original(layer, *args, **kwargs)
        return self.binding.around(original, layer, *args, **kwargs)

    def on_alloc_memory_pool(self, result, runner, *args, **kwargs):
        """AFTER `ModelRunner.alloc_memory_pool`: log this replica's KV capacity."""
        if self.role is None or getattr(runner, "is_draft_worker", False):
            return result
        self.kv_tokens = int(runner.max_total_num_tokens)
        freed = self.binding.freed_bytes if self.binding else 0
        logger.info(
            "sgl-sidp zerodp %s: %s KV cache %d tokens (max_total_num_tokens)%s", self.who, self.role, self.kv_tokens,
            f", {freed / 1e9:.2f} GB of experts freed for it" if self.role == "sink" else "",
        )
        return result

    # ------------------------------------------------------------------ scheduler hook
    def on_scheduler_init(self, result, scheduler, *args, **kwargs):
        """AFTER `Scheduler.__init__`: start-up calibration (source) or copy probe (sink), then metrics."""
        if self.role == "source":
            self._calibrate_source(scheduler)
        elif self.role == "sink":
            self._probe_sink_copies(scheduler)
        collector = getattr(scheduler, "metrics_collector", None)
        if self.role is not None and collector is not None:
            self.metrics = ZeroDPMetrics(self, dict(collector.labels))
        return result

    def _calibrate_source(self, scheduler) -> None:
        """The source measures its forward times at start-up if none are cached (`calibration.startup`)."""
        from sgl_sidp.calibration.startup import ensure_forward_times

        try:
            ensure_forward_times(scheduler, f"zerodp source {self.who}")
        except Exception as e:
            raise ZeroDPError(
                f"zerodp source {self.who}: start-up calibration failed ({type(e).__name__}: {e}); pass "
                "--zerodp-calibration FILE or force the set with --zerodp-layers all|every:K|3,7,11"
            ) from e

    def _probe_sink_copies(self, scheduler) -> None:
        """Measure this sink's copy rate while decode forwards run (informs `kv:C`); merged into the cache entry."""
        from sgl_sidp.calibration.measure import feasible_points, time_copy_during_forward
        from sgl_sidp.calibration.startup import calibration_key, record_copy_rates

        runner = scheduler.tp_worker.model_runner
        bs_list, _, _, _ = feasible_points(scheduler, batches=(COPY_PROBE_BATCH, 32, 8, 1))
        if not bs_list:
            return
        src = self._probe_src.view(-1)
        n = min(src.numel(), COPY_PROBE_BYTES // src.element_size())
        pairs = [(torch.empty(n, dtype=src.dtype, device=src.device), src[:n])]
        r = time_copy_during_forward(scheduler, pairs, bs=max(bs_list))
        self.copy_probe = CopyProbe(**r)
        logger.info(
            "sgl-sidp zerodp %s: copies from the source while decode forwards (batch %d) run: %.0f GB/s (idle %.0f GB/s, "
            "%.0f%%); forward %.2f ms alone, %.2f ms with copies (%.2f ms per GB copied)",
            self.who, max(bs_list), r["copy_gbps_in_forward"], r["copy_gbps_idle"],
            100 * r["copy_gbps_in_forward"] / r["copy_gbps_idle"], r["forward_ms"], r["forward_ms_with_copies"],
            r["slowdown_ms_per_gb"],
        )
        if self.tp_rank == 0 and not self.plan.layers:  # with a ring running, its own copies would skew this
            record_copy_rates(calibration_key(runner), r)

    # ------------------------------------------------------------------ batch signal listener
    def _on_iteration(self, sig) -> None:
        if self.metrics is not None:
            self.metrics.observe(sig)

    # ------------------------------------------------------------------ DP controller hooks
    def after_update_budget(self, result, budget, loads, *args, **kwargs):
        """AFTER `DPBudget.update_budget`: capacities, speeds and the requests the snapshots miss (`router.Router`)."""
        self.router.observe(budget, loads)
        return result

    def around_dispatch(self, original, budget, method, estimated_tokens: int = 0, *args, **kwargs):
        """AROUND `DPBudget.dispatch`: `total_tokens` routing by KV fraction among the replicas not much slower per
        decode step, overflow by drain time (`router.pick_rank`)."""
        from sglang.srt.managers.data_parallel_controller import LoadBalanceMethod

        if method != LoadBalanceMethod.TOTAL_TOKENS or not self.router.ready():
            return original(budget, method, estimated_tokens, *args, **kwargs)
        return self.router.dispatch(budget, estimated_tokens)

    # ------------------------------------------------------------------ facts
    def status(self) -> dict:
        """This process's ZeroDP facts for logs and tests (empty before the model is loaded)."""
        if self.role is None:
            return {}
        out = {"role": self.role, "dp_rank": self.dp_rank, "tp_rank": self.tp_rank, "kv_tokens": self.kv_tokens}
        if self.plan is not None:
            out.update(layers=list(self.plan.layers), groups=list(self.plan.groups),
                       bytes_per_forward=self.plan.bytes_per_forward, copy_ms=self.plan.copy_ms,
                       budget_ms=self.plan.budget_ms, copy_gbps=self.copy_gbps, reason=self.plan.reason,
                       calibration=self.calibration_origin)
        return out


def _hiding_prefills(cal: Calibration, copy_ms: float) -> str:
    """ "8192 tokens or more" for the smallest calibrated prefill whose forward takes `copy_ms`, or "no measured size"."""
    hiding = [t for t, ms in sorted(cal.prefill_ms.items()) if ms >= copy_ms]
    return f"{hiding[0]} tokens or more" if hiding else "no measured size"


def _vanilla_kv_bytes(runner, device_id: int, not_held: int = 0) -> float:
    """Bytes SGLang would give this sink's KV cache without ZeroDP (its own formula, before our changes).

    SGLang (`KVCacheConfigurator._profile_available_bytes`) takes the free memory after the weights
    load less `pre_model_load_memory * (1 - mem_fraction_static)`; `not_held` (bytes) are the experts
    this sink never held while loading, which a vanilla replica would hold. CUDA-graph and activation
    memory that SGLang takes later are not subtracted, so this is a slight overestimate.
    """
    free, total = torch.cuda.mem_get_info(device_id)
    pre_gib = getattr(runner, "pre_model_load_memory", None) or total / (1 << 30)
    slack = pre_gib * (1 << 30) * (1 - float(runner.mem_fraction_static))
    return max(0.0, free - not_held - slack)


class ZeroDPMetrics:
    """ZeroDP's Prometheus metrics, labelled like SGLang's scheduler metrics plus `role`.

    - `sglang:sidp_zerodp_kv_tokens`: this replica's KV capacity (tokens; SGLang's `max_total_num_tokens`).
    - `sglang:sidp_zerodp_offloaded_layers`: MoE layers pulled from the source each forward (sinks).
    - `sglang:sidp_zerodp_bytes_per_forward`: bytes one forward pulls (the plan; sinks).
    - `sglang:sidp_zerodp_copy_ms_per_forward_estimate`: those bytes at the copy rate measured at start-up
      on an idle GPU (ms). An estimate: inside busy forwards copies run slower (next metric).
    - `sglang:sidp_zerodp_copy_gbps_in_forward`: the copy rate measured at start-up while decode
      forwards ran (GB/s; sinks; 0 if not measured).
    - `sglang:sidp_zerodp_fetch_exposed_ms`: measured: how long a sampled eager forward waited for its pulled
      experts (`prefetch.ring.StallSampler`, one eager forward in 16; graph replays are not sampled).
    - `sglang:sidp_zerodp_bytes_pulled_total`: bytes pulled so far, counted as the plan's bytes per
      forward times the busy scheduler iterations (one forward each).
    """

    def __init__(self, rt: "ZeroDPRuntime", labels: dict, registry=None):
        from prometheus_client import REGISTRY, Counter, Gauge

        reg = REGISTRY if registry is None else registry
        labels = {**labels, "role": rt.role}
        kw = dict(labelnames=list(labels), registry=reg)
        gauge = lambda name, doc: Gauge(name, doc, multiprocess_mode="mostrecent", **kw).labels(**labels)  # noqa: E731
        self.rt = rt
        self.kv = gauge("sglang:sidp_zerodp_kv_tokens", "KV cache capacity of this replica (tokens).")
        self.layers = gauge("sglang:sidp_zerodp_offloaded_layers", "MoE layers this sink pulls every forward.")
        self.per_fwd = gauge("sglang:sidp_zerodp_bytes_per_forward", "Bytes a forward pulls from the source.")
        self.copy_ms = gauge("sglang:sidp_zerodp_copy_ms_per_forward_estimate",
                             "One forward's pulls at the idle copy rate measured at start-up (ms, estimate).")
        self.exposed = gauge("sglang:sidp_zerodp_fetch_exposed_ms",
                             "Measured ms a sampled eager forward waits for its pulled experts (0 before a sample).")
        self.in_fwd = gauge("sglang:sidp_zerodp_copy_gbps_in_forward",
                            "Copy rate measured at start-up while decode forwards ran (GB/s).")
        self.pulled = Counter("sglang:sidp_zerodp_bytes_pulled", "Bytes pulled from the source so far.", **kw).labels(**labels)
        plan = rt.plan
        self.kv.set(rt.kv_tokens or 0)
        self.layers.set(len(plan.layers) if plan else 0)
        self.per_fwd.set(plan.bytes_per_forward if plan else 0)
        self.copy_ms.set(plan.copy_ms if plan else 0.0)
        self.in_fwd.set(rt.copy_probe.copy_gbps_in_forward if rt.copy_probe else 0.0)

    def observe(self, sig) -> None:
        """One busy iteration ran one forward (a batch-signal listener)."""
        if self.rt.plan is not None:
            self.pulled.inc(self.rt.plan.bytes_per_forward)
        stalls = self.rt.binding.prefetcher.stalls if self.rt.binding is not None else None
        if stalls is not None and stalls.mean_ms() is not None:
            self.exposed.set(stalls.mean_ms())
