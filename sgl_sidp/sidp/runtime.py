"""SiDP in one SGLang process (a TP rank of a DP rank): owned FFN layers shared, the others streamed (WaS).

Source of the idea: Zhao & He, "SiDP: Memory-Efficient Data Parallelism for Offline LLM Inference"
(Weight-as-a-Service, §3). FFN layer l (`gate_up_proj.weight`, `down_proj.weight` of SGLang's
`Qwen2MLP` / `LlamaMLP`) is owned by DP rank `owner_of(l, d)`; at load time (AFTER
`ModelRunner.load_model`, before `alloc_memory_pool` sizes the KV cache from the free memory):

1. the owner re-homes its owned layers into shareable VMM memory one tensor at a time
   (`peer.vmm.TensorExporter`) and serves them to the other ranks' same TP rank;
2. every non-owned layer's parameters are pointed at a slot of a ring (`prefetch.binding.SlotBinding`),
   which frees them, and the slots are filled from the owner's HBM (`peer.vmm.TensorImporter`) a
   few layers ahead on a side stream; SGLang's own MLP code computes on the slot (AROUND
   `Qwen2MLP.forward` / `LlamaMLP.forward`: wait for the slot before, free it after).

Big models: a rank never holds the FFN layers it does not own, not even while SGLang loads the model
(70B dense at TP1 is 141 GB on a 141 GB GPU). While `ModelRunner.load_model` builds the model (AROUND
it), each non-owned MLP's parameters are pointed, right after `Qwen2MLP.__init__` / `LlamaMLP.__init__`,
at one placeholder per parameter name shared by all such layers; SGLang's loader (or dummy init)
then writes their values there, harmlessly, and the slot binding replaces the placeholders.

The failure domain is the group: a rank whose owner's process is gone stops the server (the
importer's watcher, `peer.vmm.stop_server`). The ring fetches in the peak-shifted order (SiDP §3.3,
`prefetch.schedules.peak_shift_order`: in each cycle of d layers rank r starts after its own layer,
so ranks read different owners at once) when it has d - 1 slots; with d = 2 that is forward order.
"""

from __future__ import annotations

import logging
import re
from typing import Callable, Mapping

import torch

from sgl_sidp.peer.manifest import TensorSpec, manifest_mismatches
from sgl_sidp.prefetch.binding import SlotBinding, decoder_layers, param_at
from sgl_sidp.prefetch.schedules import owner_of, peak_shift_order

logger = logging.getLogger(__name__)

#: The parameters of one FFN layer a non-owner streams (names inside SGLang's `Qwen2MLP` / `LlamaMLP`).
NAMES = ("gate_up_proj.weight", "down_proj.weight")


class SiDPError(RuntimeError):
    """SiDP cannot run on this model or with what the other ranks publish."""


def collect_mlps(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Layer index -> the decoder layer's `mlp` (holding `NAMES`), for every decoder layer of `model`.

    Raises:
        SiDPError: a decoder layer without an `mlp` holding `gate_up_proj.weight` and `down_proj.weight`
            (an architecture SiDP does not know).
    """
    out, odd = {}, []
    for i, layer in decoder_layers(model):
        mlp = getattr(layer, "mlp", None)
        try:
            for n in NAMES:
                param_at(mlp, n)
        except AttributeError:
            odd.append(f"{i} ({type(mlp).__name__})")
            continue
        out[i] = mlp
    if odd or not out:
        raise SiDPError(
            f"--sidp-mode sidp: {type(model).__name__} has decoder layers without an MLP holding "
            f"{' and '.join(NAMES)}: {', '.join(odd[:8]) or 'no layers'}"
        )
    return out


def ring_plan(settings, layers, d: int, rank: int) -> tuple[int, tuple[int, ...]]:
    """(slots, fetch order) of `rank`'s WaS ring over the layers it does not own.

    Slots: `settings.slots`, or d - 1 (at least 2) when 0. Fetch order: peak-shifted
    (`peak_shift_order`) when asked and the slots allow it (d - 1 or more), else forward order.
    `layers` must be 0..L-1 (every decoder layer of the model, as `collect_mlps` returns them).
    """
    n_slots = settings.slots or max(2, d - 1)
    streamed = [lid for lid in layers if owner_of(lid, d) != rank]
    if settings.fetch_order == "shifted" and n_slots >= d - 1:
        order = tuple(lid for cycle in peak_shift_order(len(layers), d, rank) for lid in cycle)
    else:
        order = tuple(streamed)
    return n_slots, order


#: The decoder layer index inside an SGLang module prefix ("model.layers.17.mlp.gate_up_proj").
_LAYER_IN_PREFIX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_of_prefix(prefix: str) -> int | None:
    """17 for "model.layers.17.mlp.gate_up_proj"; None when the prefix names no decoder layer."""
    m = _LAYER_IN_PREFIX.search(prefix or "")
    return int(m.group(1)) if m else None


def spec_of(layer: int, name: str, t: torch.Tensor) -> TensorSpec:
    return TensorSpec(layer, name, tuple(t.shape), str(t.dtype), t.numel() * t.element_size())


class SiDPRuntime:
    """SiDP's state in one process and its hook bodies (see the module doc).

    Args:
        ctx: the plugin's per-process context (`sgl_sidp.plugin.PluginContext`); reads `ctx.config.sidp`.

    Attributes (after `setup`):
        dp_rank, tp_rank, d: this process's DP rank and TP rank, and the DP size.
        owned, streamed: layer indices this rank owns / streams from their owners.
        exporter: the `TensorExporter` serving the owned layers.
        importers: owner DP rank -> `TensorImporter`.
        binding: the `SlotBinding` of the streamed layers (None if none).
    """

    def __init__(self, ctx):
        self.settings = ctx.config.sidp
        self.dp_rank = self.tp_rank = 0
        self.d = 1
        self.owned: tuple[int, ...] = ()
        self.streamed: tuple[int, ...] = ()
        self.exporter = None
        self.importers: dict = {}
        self.binding: SlotBinding | None = None
        self.n_slots = 0
        self.fetch_order: tuple[int, ...] = ()
        self._placing: tuple[int, int] | None = None  # (DP rank, d) while the target model is being built
        self._placeholders: dict[str, torch.Tensor] = {}
        self.never_held: set[int] = set()  # non-owned layers whose weights took no memory of their own at load
        self.copy_gbps = 0.0
        self.kv_tokens: int | None = None
        self.metrics: SiDPMetrics | None = None
        ctx.listeners.append(self._on_iteration)

    @property
    def who(self) -> str:
        return f"DP{self.dp_rank} TP{self.tp_rank}"

    # ------------------------------------------------------------------ set-up (no SGLang, testable on CPU)
    def setup(self, mlps: Mapping[int, torch.nn.Module], dp_rank: int, tp_rank: int, d: int, device_id: int,
              address_of: Callable[[int], str], ops, wrap: Callable = lambda f: f,
              release_cached: Callable[[], None] = lambda: None, driver=None, can_access_peer=None) -> None:
        """Share the owned layers, then map the other ranks' and bind the streamed layers to slots.

        Args:
            mlps: layer index -> MLP module holding `NAMES` (this TP rank's shards).
            dp_rank, tp_rank, d: this rank, its TP rank, the DP size.
            device_id: this process's CUDA device index.
            address_of: DP rank -> that rank's socket address for this TP rank.
            ops, wrap, release_cached: as `SlotBinding` takes them.
            driver, can_access_peer: the VMM driver and peer query (defaults: CUDA's).

        Raises:
            SiDPError: an owner's tensors differ from this rank's (shapes, dtypes, layers).
            sgl_sidp.peer.vmm.PeerError: no shareable memory, an owner that never publishes, no peer access.
        """
        from sgl_sidp.peer.vmm import TensorExporter, TensorImporter

        self.dp_rank, self.tp_rank, self.d = dp_rank, tp_rank, d
        ids = sorted(mlps)
        self.owned = tuple(lid for lid in ids if owner_of(lid, d) == dp_rank)
        self.streamed = tuple(lid for lid in ids if owner_of(lid, d) != dp_rank)
        specs = {lid: {n: spec_of(lid, n, param_at(mlps[lid], n)) for n in NAMES} for lid in ids}
        params = {specs[lid][n]: param_at(mlps[lid], n) for lid in self.owned for n in NAMES}
        self.exporter = TensorExporter(params, device_id, address_of(dp_rank), driver=driver)
        remote = {}
        timeout = self.settings.owner_timeout_s
        for r in range(d):
            if r == dp_rank:
                continue
            owner = f"sidp owner DP{r} TP{tp_rank}"
            imp = self.importers[r] = TensorImporter(address_of(r), device_id, timeout, owner, driver=driver,
                                                     can_access_peer=can_access_peer)
            want = [specs[lid][n] for lid in self.streamed if owner_of(lid, d) == r for n in NAMES]
            problems = manifest_mismatches(imp.entries, want)
            if problems:
                raise SiDPError(
                    f"sidp {self.who} and {owner} disagree on {len(problems)} FFN tensor(s) (same --model-path, "
                    "--tp-size, --dtype and quantization on every rank are required):\n  " + "\n  ".join(problems[:20])
                )
            remote.update(imp.map([t.key for t in want]))
        if self.streamed:
            self.n_slots, self.fetch_order = ring_plan(self.settings, ids, d, dp_rank)
            self.binding = SlotBinding(mlps, NAMES, remote, self.streamed, self.n_slots, ops, wrap=wrap,
                                       release_cached=release_cached, fetch_order=self.fetch_order)

    # ------------------------------------------------------------------ SGLang hooks
    def around_load_model(self, original, runner, *args, **kwargs):
        """AROUND `ModelRunner.load_model`: non-owned FFN layers take no memory while the model loads
        (`after_mlp_init`), then share, map and bind (`setup`) and log what moved.

        Raises:
            SiDPError, sgl_sidp.peer.vmm.PeerError: as `setup`.
        """
        if getattr(runner, "is_draft_worker", False):
            return original(runner, *args, **kwargs)
        self._placing = (int(runner.ps.dp_rank or 0), int(runner.server_args.dp_size))
        try:
            result = original(runner, *args, **kwargs)
        finally:
            self._placing = None
        self._on_loaded(runner)
        return result

    def after_mlp_init(self, result, mlp, *args, **kwargs):
        """AFTER `Qwen2MLP.__init__` / `LlamaMLP.__init__`: while the target model is built, point a non-owned
        layer's parameters at the shared placeholders, so its own (just allocated) storage is freed at once."""
        if self._placing is None:
            return result
        dp, d = self._placing
        lid = layer_of_prefix(getattr(getattr(mlp, "gate_up_proj", None), "prefix", ""))
        if lid is None or owner_of(lid, d) == dp:
            return result
        for n in NAMES:
            p = param_at(mlp, n)
            ph = self._placeholders.get(n)
            if ph is None or ph.shape != p.shape or ph.dtype != p.dtype or ph.device != p.device:
                ph = self._placeholders[n] = torch.empty_like(p)
            p.data = ph
        self.never_held.add(lid)
        return result

    def _on_loaded(self, runner) -> None:
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import eager_on_graph

        from sgl_sidp.peer.vmm import measure_copy_gbps, socket_address
        from sgl_sidp.prefetch.binding import first_decoder_layer
        from sgl_sidp.prefetch.ring import StreamOps

        dp, tp = int(runner.ps.dp_rank or 0), int(runner.ps.tp_rank)
        device_id = torch.cuda.current_device()
        port = runner.server_args.port
        mlps = collect_mlps(runner.model)
        self._placeholders.clear()  # the parameters hold them until the slot binding replaces them
        self.setup(mlps, dp, tp, int(runner.server_args.dp_size), device_id,
                   lambda r: socket_address(f"sidp-dp{r}", port, tp), StreamOps(torch.device("cuda", device_id)),
                   wrap=eager_on_graph(True), release_cached=torch.cuda.empty_cache)
        b = self.binding
        if b is not None:
            first = b.prefetcher.remote  # (layer, name) -> mapped owner tensor
            lid = self.streamed[0]
            self.copy_gbps = measure_copy_gbps([(torch.empty_like(first[(lid, n)]), first[(lid, n)]) for n in NAMES])
            torch.cuda.empty_cache()
            b.install_start(first_decoder_layer(runner.model))
        for imp in self.importers.values():
            imp.watch()
        if set(self.streamed) - self.never_held:
            logger.warning("sgl-sidp sidp %s: FFN layers %s were loaded in full before being dropped (their module prefix "
                           "names no decoder layer); a model that fills the GPU may not load", self.who,
                           sorted(set(self.streamed) - self.never_held))
        per_layer = sum(param_at(mlps[self.streamed[0]], n).nbytes for n in NAMES) if self.streamed else 0
        logger.info(
            "sgl-sidp sidp %s: owns FFN layers %s (%.2f GB, shared with peak extra memory %.2f GB), streams %d layers "
            "(WaS, %d slots, fetch order %s, %.2f GB per forward; %.0f GB/s measured per copy, %.1f ms of copies per forward); "
            "%.2f GB of non-owned weights not held (%d of %d layers never held while loading), slots take %.2f GB",
            self.who, _ranges(self.owned), self.exporter.nbytes / 1e9, self.exporter.peak_extra_bytes / 1e9,
            len(self.streamed), self.n_slots, _order_name(self.fetch_order, self.streamed), per_layer * len(self.streamed) / 1e9, self.copy_gbps,
            per_layer * len(self.streamed) / (self.copy_gbps * 1e9) * 1e3 if self.copy_gbps else 0.0,
            (b.freed_bytes if b else 0) / 1e9, len(self.never_held & set(self.streamed)), len(self.streamed),
            (b.slot_bytes if b else 0) / 1e9,
        )

    def on_alloc_memory_pool(self, result, runner, *args, **kwargs):
        """AFTER `ModelRunner.alloc_memory_pool`: log this rank's KV capacity."""
        if getattr(runner, "is_draft_worker", False):
            return result
        self.kv_tokens = int(runner.max_total_num_tokens)
        logger.info("sgl-sidp sidp %s: KV cache %d tokens (max_total_num_tokens)", self.who, self.kv_tokens)
        return result

    def on_scheduler_init(self, result, scheduler, *args, **kwargs):
        """AFTER `Scheduler.__init__`: SiDP's Prometheus metrics, labelled like SGLang's scheduler metrics."""
        collector = getattr(scheduler, "metrics_collector", None)
        if collector is not None:
            self.metrics = SiDPMetrics(self, dict(collector.labels))
        return result

    def _on_iteration(self, sig) -> None:
        if self.metrics is not None:
            self.metrics.observe(sig)

    @property
    def bytes_per_forward(self) -> int:
        return self.binding.prefetcher.bytes_per_forward if self.binding is not None else 0

    def around_mlp_forward(self, original, mlp, *args, **kwargs):
        """AROUND `Qwen2MLP.forward` / `LlamaMLP.forward`: a streamed layer waits for its slot, frees it after."""
        if self.binding is None:
            return original(mlp, *args, **kwargs)
        return self.binding.around(original, mlp, *args, **kwargs)


class SiDPMetrics:
    """SiDP's Prometheus metrics (with `--enable-metrics`), labelled like SGLang's scheduler metrics.

    - `sglang:sidp_sidp_kv_tokens`: this rank's KV capacity (tokens; SGLang's `max_total_num_tokens`).
    - `sglang:sidp_sidp_streamed_layers`: FFN layers this rank streams from their owners every forward.
    - `sglang:sidp_sidp_bytes_per_forward`: bytes one forward streams (WaS).
    - `sglang:sidp_sidp_forwards_total{mode}`: busy scheduler iterations (one forward each) by mode ("was").
    - `sglang:sidp_sidp_bytes_fetched_total`: bytes streamed so far (bytes per forward times WaS forwards).
    """

    def __init__(self, rt: SiDPRuntime, labels: dict, registry=None):
        from prometheus_client import REGISTRY, Counter, Gauge

        reg = REGISTRY if registry is None else registry
        kw = dict(labelnames=list(labels), registry=reg)
        gauge = lambda name, doc: Gauge(name, doc, multiprocess_mode="mostrecent", **kw).labels(**labels)  # noqa: E731
        self.rt = rt
        gauge("sglang:sidp_sidp_kv_tokens", "KV cache capacity of this rank (tokens).").set(rt.kv_tokens or 0)
        gauge("sglang:sidp_sidp_streamed_layers", "FFN layers this rank streams every forward.").set(len(rt.streamed))
        gauge("sglang:sidp_sidp_bytes_per_forward", "Bytes a forward streams from the owners.").set(rt.bytes_per_forward)
        self.forwards = Counter("sglang:sidp_sidp_forwards", "Busy iterations by mode.",
                                labelnames=[*labels, "mode"], registry=reg).labels(**labels, mode="was")
        self.fetched = Counter("sglang:sidp_sidp_bytes_fetched", "Bytes streamed from the owners so far.", **kw).labels(**labels)

    def observe(self, sig) -> None:
        """One busy iteration ran one forward (a batch-signal listener)."""
        self.forwards.inc()
        self.fetched.inc(self.rt.bytes_per_forward)


def _order_name(order, streamed) -> str:
    return "forward" if tuple(order) == tuple(streamed) else f"peak-shifted {list(order[:6])}..."


def _ranges(layers) -> str:
    """[0, 2, 4, ..., 62] as 'every 2nd from 0 to 62' when regular, else the list."""
    layers = list(layers)
    if len(layers) > 3 and len({b - a for a, b in zip(layers, layers[1:])}) == 1:
        return f"{layers[0]}..{layers[-1]} step {layers[1] - layers[0]} ({len(layers)} layers)"
    return str(layers)
