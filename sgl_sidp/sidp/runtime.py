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
at one placeholder per parameter name shared by all such layers (`prefetch.placeholders.LoadPlaceholders`);
SGLang's loader (or dummy init) then writes their values there, harmlessly, and the slot binding replaces
the placeholders.

Compute-as-a-Service (§3, for small batches) and the switch: with `--sidp-service cas|auto` the DP ranks step
together (`control.lockstep.Lockstep`, AFTER `Scheduler.get_next_batch_to_run`: one all-gather of every rank's
tokens per iteration and the mode decided from it, identically on every rank). In a CaS iteration a non-owned layer
sends its input rows to the owner and gets its output rows back; the owner runs SGLang's MLP once over every rank's
rows (`remote_compute.cas.RemoteCompute`, over NCCL, or gloo when replicas share a GPU); a rank with no batch while
others run serves its owned layers in layer order straight from the scheduler hook (no IDLE forward: the MLPs are
the only collectives). CaS iterations run eagerly (AROUND the decode/prefill graph runners' `can_run_graph`: the
row counts change every iteration) and do not run the WaS ring. With `--sidp-cas-graphs` (experimental, not yet
run on GPU) a CaS iteration in which every busy rank decodes replays CUDA graphs instead: every rank captured a
second decode graph set with the static-shape exchange inside (`remote_compute.cas.BucketWire` over SGLang's
`PyNcclCommunicator`), all ranks replay the captured size of the largest rank's batch (`Iteration.bucket`), and an
idle rank serves its layers eagerly with that many zero rows; prefill and mixed iterations stay eager.

The failure domain is the group: a rank whose owner's process is gone stops the server (the
importer's watcher, `process.stop_server`). The ring fetches in the peak-shifted order (SiDP §3.3,
`prefetch.schedules.peak_shift_order`: in each cycle of d layers rank r starts after its own layer,
so ranks read different owners at once) when it has d - 1 slots; with d = 2 that is forward order.
"""

from __future__ import annotations

import logging
import re
from typing import Callable, Mapping, Sequence

import torch

from sgl_sidp.control.mode_switch import ModeSwitch, ServeMode
from sgl_sidp.peer.manifest import TensorSpec, manifest_mismatches
from sgl_sidp.prefetch.binding import SlotBinding, decoder_layers, param_at
from sgl_sidp.prefetch.placeholders import LoadPlaceholders, device_memory_note
from sgl_sidp.prefetch.schedules import owner_of, peak_shift_order
from sgl_sidp.sidp.settings import b_th_measured, cas_graphs_on, ring_slots

logger = logging.getLogger(__name__)

#: The parameters of one FFN layer a non-owner streams (names inside SGLang's `Qwen2MLP` / `LlamaMLP`).
NAMES = ("gate_up_proj.weight", "down_proj.weight")

#: decode batches per rank at which `--sidp-b-th-measure` times WaS and CaS (those with a CaS decode graph), and each
#: row's context: attention is the same work in both services, so a short one keeps the probe's KV small
B_TH_BATCHES = (1, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256)
B_TH_CONTEXT = 512


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
            f"--overlay-mode sidp: {type(model).__name__} has decoder layers without an MLP holding "
            f"{' and '.join(NAMES)}: {', '.join(odd[:8]) or 'no layers'}"
        )
    return out


def ring_plan(settings, layers, d: int, rank: int) -> tuple[int, tuple[int, ...]]:
    """(slots, fetch order) of `rank`'s WaS ring over the layers it does not own.

    Slots: `settings.slots`, or d - 1 (at least 2) when 0. Fetch order: peak-shifted
    (`peak_shift_order`) when asked and the slots allow it (d - 1 or more), else forward order.
    `layers` must be 0..L-1 (every decoder layer of the model, as `collect_mlps` returns them).
    """
    n_slots = ring_slots(settings.slots, d)
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


def vanilla_kv_estimate(kv_tokens: int, freed_bytes: int, slot_bytes: int, bytes_per_token: int) -> int:
    """KV tokens a vanilla replica would hold where a SiDP rank holds `kv_tokens`: SGLang sizes the KV cache from the
    memory left after the weights, so the non-owned FFN weights a rank does not hold (`freed_bytes`), net of its WaS
    slots (`slot_bytes`), became KV at `bytes_per_token` (all layers of this TP rank). An estimate, for the log and
    the metric; the measured comparison is a vanilla server's own `max_total_num_tokens`."""
    return max(0, kv_tokens - (freed_bytes - slot_bytes) // max(1, bytes_per_token))


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
        self._placing: tuple[int, int] = (0, 1)  # (DP rank, d) of the model being built
        self.placeholders = LoadPlaceholders()  # non-owned layers' weights while the model loads
        self.held_at_load: list[int] = []  # non-owned layers SGLang gave storage of their own while loading
        self.copy_gbps = 0.0
        self.kv_tokens: int | None = None
        self.kv_vanilla: int | None = None  # estimated KV tokens of a vanilla replica (vanilla_kv_estimate)
        self.metrics: SiDPMetrics | None = None
        self.peer_watch = None  # process.PeerWatch of the other DP ranks, with cas/auto
        self.fold_gpus = bool(getattr(ctx.config, "fold_gpus", False))
        self.mlps: dict[int, torch.nn.Module] = {}
        self._layer_of: dict[int, int] = {}  # id(mlp) -> layer
        self.lockstep = None  # control.lockstep.Lockstep with --sidp-service cas|auto, after the scheduler is built
        self.rc = None  # remote_compute.cas.RemoteCompute over the CaS wire group
        self.b_th: float | None = None
        self.b_th_source = ""
        self._direct = False  # an owner serving CaS rows calls SGLang's MLP through the hook
        # --sidp-cas-graphs: the CaS decode graph set, its exchange and the size every rank replays now
        self.wire = None  # remote_compute.cas.BucketWire
        self.graphs = None  # CasGraphs, once captured
        self._capturing_cas = False
        self._timing_cas = False  # `_time_decode` of a CaS step (--sidp-b-th-measure)
        self._bucket: int | None = None
        ctx.listeners.append(self._on_iteration)

    @property
    def never_held(self) -> set[int]:
        """Non-owned layers whose weights took no memory of their own while the model loaded."""
        return set(self.placeholders.taken) - set(self.held_at_load)

    @property
    def who(self) -> str:
        return f"DP{self.dp_rank} TP{self.tp_rank}"

    def fetch_exposure(self) -> tuple[float | None, float | None]:
        """(measured ms per sampled eager WaS forward that compute waited for slots, share of the fetch hidden behind
        compute: 1 - that over the copy time per forward at the copy rate measured at load); Nones before a sample."""
        stalls = self.binding.prefetcher.stalls if self.binding is not None else None
        exposed = stalls.mean_ms() if stalls is not None else None
        if exposed is None or not self.copy_gbps:
            return exposed, None
        copy_ms = self.copy_ms_per_forward
        return exposed, max(0.0, 1.0 - exposed / copy_ms) if copy_ms else None

    # ------------------------------------------------------------------ set-up (no SGLang, testable on CPU)
    def setup(self, mlps: Mapping[int, torch.nn.Module], dp_rank: int, tp_rank: int, d: int, device_id: int,
              address_of: Callable[[int], str], ops, wrap: Callable = lambda f: f,
              release_cached: Callable[[], None] = lambda: None, driver=None, can_access_peer=None,
              sample_every: int = 0) -> None:
        """Share the owned layers, then map the other ranks' and bind the streamed layers to slots.

        Args:
            mlps: layer index -> MLP module holding `NAMES` (this TP rank's shards).
            dp_rank, tp_rank, d: this rank, its TP rank, the DP size.
            device_id: this process's CUDA device index.
            address_of: DP rank -> that rank's socket address for this TP rank.
            ops, wrap, release_cached: as `SlotBinding` takes them.
            driver, can_access_peer: the VMM driver and peer query (defaults: CUDA's).
            sample_every: measure the slot waits of one eager WaS forward in this many (`StallSampler`; 0: never).

        Raises:
            SiDPError: an owner's tensors differ from this rank's (shapes, dtypes, layers).
            sgl_sidp.peer.vmm.PeerError: no shareable memory, an owner that never publishes, no peer access.
        """
        from sgl_sidp.peer.vmm import TensorExporter, TensorImporter

        self.dp_rank, self.tp_rank, self.d = dp_rank, tp_rank, d
        self.mlps = dict(mlps)
        self._layer_of = {id(m): lid for lid, m in mlps.items()}
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
                                       release_cached=release_cached, fetch_order=self.fetch_order,
                                       sample_every=sample_every)

    def start_lockstep(self, lockstep, rc, b_th: float | None = None, b_th_source: str = "") -> None:
        """Run CaS/auto from now on: `lockstep` (its switch built from the settings) decides each iteration's mode,
        `rc` carries CaS rows (its group ranks are the DP ranks)."""
        self.lockstep, self.rc, self.b_th, self.b_th_source = lockstep, rc, b_th, b_th_source

    def switch_for(self, b_th: float | None) -> ModeSwitch:
        """The WaS/CaS rule of `--sidp-service` (`b_th` only for auto)."""
        forced = {"was": ServeMode.WAS, "cas": ServeMode.CAS}.get(self.settings.service)
        return ModeSwitch(b_th if forced is None else 1.0, self.settings.hysteresis, forced=forced)

    @property
    def cas_now(self) -> bool:
        """This iteration runs CaS (False before the first lockstep iteration: start-up forwards and graph capture
        run WaS, each rank alone)."""
        if self._capturing_cas or self._timing_cas:
            return True
        it = self.lockstep.current if self.lockstep is not None else None
        return it is not None and it.mode is ServeMode.CAS

    def step(self, tokens: int, decode_bs: int = -1):
        """One scheduler iteration (a collective of the DP ranks): gather the tokens (and `decode_bs`, the batch size
        if this rank's forward is a decode, else -1), decide the mode and, with CaS graphs, the graph size every rank
        replays; serve the owned layers when this rank runs nothing while others run CaS. Returns the `Iteration`."""
        before = self.lockstep.switch.switches
        it = self.lockstep.step(tokens, decode_bs)
        if self.graphs is not None:
            self._bucket = it.bucket(self.graphs.capture_bs)
            self.graphs.select(self._bucket)
        if self.lockstep.switch.switches != before:
            logger.info("sgl-sidp sidp %s: %s from this iteration (%.1f tokens per rank; B_th %g, %s)", self.who,
                        "WaS" if it.mode is ServeMode.WAS else "CaS", ModeSwitch.signal(it.counts), self.b_th or 0,
                        self.b_th_source)
        if self.metrics is not None:
            self.metrics.on_step(it, tokens, self.lockstep.switch.switches != before)
        if it.busy and tokens == 0 and it.mode is ServeMode.CAS:
            self.serve_owned(it.counts)
        return it

    def serve_owned(self, counts) -> None:
        """Run each owned layer once, in layer order, over the other ranks' rows (this rank has none); on a
        collective wire, take part in every layer's exchange."""
        self._direct = True
        try:
            every = self._bucket is not None or self.rc.every_rank_every_layer  # a collective per layer
            for lid in (sorted(self.mlps) if every else self.owned):
                mlp = self.mlps[lid]
                w = param_at(mlp, NAMES[0])  # gate_up: [2 * intermediate / tp, hidden]
                self._exchange(lid, w.new_empty((0, w.shape[1])), mlp, counts)
        finally:
            self._direct = False

    def cas_forward(self, original, mlp, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """A CaS iteration's MLP: this rank's rows of the layer, computed by its owner over every rank's rows.

        Raises:
            SiDPError: the rows differ from what this rank announced for the iteration (a forward SiDP does not know).
        """
        lid = self._layer_of[id(mlp)]
        counts = None  # the static-shape wire needs none
        if not self._capturing_cas and self._bucket is None:
            counts = self.lockstep.current.counts
            if x.shape[0] != counts[self.dp_rank]:
                raise SiDPError(f"sidp {self.who}: layer {lid} got {x.shape[0]} rows in a CaS iteration announced "
                                f"with {counts[self.dp_rank]} tokens (counts {list(counts)}); this forward is not one "
                                "SiDP can run in lockstep")
        return self._exchange(lid, x, lambda rows: original(mlp, rows, *args, **kwargs), counts)

    def _exchange(self, lid: int, x: torch.Tensor, fn, counts) -> torch.Tensor:
        """Layer `lid` on its owner for this rank's rows `x` (`fn` runs there, over every rank's rows): with CaS
        graphs on the static-shape wire (the captured size during capture, else the iteration's), else the exact
        counts of the iteration."""
        owner = owner_of(lid, self.d)
        fn = fn if owner == self.dp_rank else None
        bucket = x.shape[0] if self._capturing_cas else self._bucket
        if bucket is not None:  # CaS decode graphs: static shapes (captured, replayed, or an eager fallback)
            return self.wire.run(owner, x, bucket, fn, x.shape[-1])
        return self.rc.run(owner, x, counts, fn, x.shape[-1])

    # ------------------------------------------------------------------ SGLang hooks
    def around_load_model(self, original, runner, *args, **kwargs):
        """AROUND `ModelRunner.load_model`: non-owned FFN layers take no memory while the model loads
        (`after_mlp_init`), then share, map and bind (`setup`) and log what moved.

        Raises:
            SiDPError, sgl_sidp.peer.vmm.PeerError: as `setup`.
        """
        if getattr(runner, "is_draft_worker", False):
            return original(runner, *args, **kwargs)
        from sglang.srt.distributed.parallel_state import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        from sgl_sidp.process import dp_rank

        self._placing = (dp_rank(runner), int(runner.server_args.dp_size))
        if self.settings.service != "was":  # in lockstep from start-up on: a dead or frozen rank stops the group at once
            self._watch_peers(*self._placing, get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size())
        with self.placeholders.placing():
            result = original(runner, *args, **kwargs)
        self._on_loaded(runner)
        return result

    def _watch_peers(self, dp: int, d: int, tp: int, tp_size: int) -> None:
        """cas/auto: watch the other DP ranks of this TP rank (`process.PeerWatch`) from the start of loading on, so a
        rank that dies or is stopped while the group loads, meets or serves stops the server in seconds, named."""
        from sgl_sidp.process import PeerWatch, scheduler_title

        peers = {f"sidp rank DP{r} TP{tp}": scheduler_title(r, tp, tp_size) for r in range(d) if r != dp}
        self.peer_watch = PeerWatch(peers, f"the DP ranks of --sidp-service {self.settings.service} run in lockstep "
                                           "and this one cannot go on without it")
        self.peer_watch.start()

    def after_mlp_init(self, result, mlp, *args, **kwargs):
        """AFTER `Qwen2MLP.__init__` / `LlamaMLP.__init__`: while the target model is built, point a non-owned
        layer's parameters at the shared placeholders, so its own (just allocated) storage is freed at once."""
        if not self.placeholders.loading:
            return result
        dp, d = self._placing
        lid = layer_of_prefix(getattr(getattr(mlp, "gate_up_proj", None), "prefix", ""))
        if lid is None or owner_of(lid, d) == dp:
            return result
        self.placeholders.take(lid, mlp, NAMES)
        return result

    def _on_loaded(self, runner) -> None:
        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank

        from sgl_sidp.peer.vmm import measure_copy_gbps, socket_address
        from sgl_sidp.prefetch.binding import first_decoder_layer
        from sgl_sidp.prefetch.ring import SAMPLE_EVERY, StreamOps, graph_break
        from sgl_sidp.process import dp_rank

        dp, tp = dp_rank(runner), get_tensor_model_parallel_rank()
        device_id = torch.cuda.current_device()
        port = runner.server_args.port
        mlps = collect_mlps(runner.model)
        self.held_at_load = self.placeholders.left_placeholder(mlps)
        self.placeholders.release()  # the parameters hold them until the slot binding replaces them
        self.setup(mlps, dp, tp, int(runner.server_args.dp_size), device_id,
                   lambda r: socket_address(f"sidp-dp{r}", port, tp), StreamOps(torch.device("cuda", device_id)),
                   wrap=graph_break, release_cached=torch.cuda.empty_cache, sample_every=SAMPLE_EVERY)
        b = self.binding
        if b is not None:
            first = b.prefetcher.remote  # (layer, name) -> mapped owner tensor
            lid = self.streamed[0]
            self.copy_gbps = measure_copy_gbps([(torch.empty_like(first[(lid, n)]), first[(lid, n)]) for n in NAMES])
            torch.cuda.empty_cache()
            b.install_start(first_decoder_layer(runner.model), enabled=lambda: not self.cas_now)
        for imp in self.importers.values():
            imp.watch()
        note = self.placeholders.still_held_note()  # the slot binding has replaced every placeholder by now
        if note:
            logger.warning("sgl-sidp sidp %s: %s", self.who, note)
        if set(self.streamed) - self.never_held:
            logger.warning("sgl-sidp sidp %s: FFN layers %s were held in full while loading (their module prefix "
                           "names no decoder layer, or SGLang's post-processing gave them storage of their own); a "
                           "model that fills the GPU may not load", self.who,
                           sorted(set(self.streamed) - self.never_held))
        per_layer = sum(param_at(mlps[self.streamed[0]], n).nbytes for n in NAMES) if self.streamed else 0
        logger.info(
            "sgl-sidp sidp %s: owns FFN layers %s (%.2f GB, shared with peak extra memory %.2f GB), streams %d layers "
            "(WaS, %d slots, fetch order %s, %.2f GB per forward; %.0f GB/s measured per copy, %.1f ms of copies per forward); "
            "%.2f GB of non-owned weights not held (%d of %d layers never held while loading), slots take %.2f GB. %s "
            "(its owned layers, in shareable memory, among the latter)",
            self.who, _ranges(self.owned), self.exporter.nbytes / 1e9, self.exporter.peak_extra_bytes / 1e9,
            len(self.streamed), self.n_slots, _order_name(self.fetch_order, self.streamed), per_layer * len(self.streamed) / 1e9, self.copy_gbps,
            per_layer * len(self.streamed) / (self.copy_gbps * 1e9) * 1e3 if self.copy_gbps else 0.0,
            (b.freed_bytes if b else 0) / 1e9, len(self.never_held & set(self.streamed)), len(self.streamed),
            (b.slot_bytes if b else 0) / 1e9, device_memory_note(device_id),
        )

    def on_alloc_memory_pool(self, result, runner, *args, **kwargs):
        """AFTER `ModelRunner.alloc_memory_pool`: log this rank's KV capacity."""
        if getattr(runner, "is_draft_worker", False):
            return result
        from sgl_sidp.calibration.measure import kv_bytes_per_token

        self.kv_tokens = int(runner.max_total_num_tokens)
        b = self.binding
        if runner.server_args.max_total_tokens or b is None:
            logger.info("sgl-sidp sidp %s: KV cache %d tokens (max_total_num_tokens)", self.who, self.kv_tokens)
            return result
        self.kv_vanilla = vanilla_kv_estimate(self.kv_tokens, b.freed_bytes, b.slot_bytes, kv_bytes_per_token(runner))
        vanilla = (f"about {self.kv_vanilla} ({self.kv_tokens / self.kv_vanilla:.2f}x" if self.kv_vanilla
                   else "none (its weights would not leave room for a KV cache")
        logger.info("sgl-sidp sidp %s: KV cache %d tokens (max_total_num_tokens); a vanilla replica: %s; estimated: "
                    "this rank's KV less the %.2f GB of non-owned weights it does not hold net of its slots)",
                    self.who, self.kv_tokens, vanilla, (b.freed_bytes - b.slot_bytes) / 1e9)
        return result

    def on_scheduler_init(self, result, scheduler, *args, **kwargs):
        """AFTER `Scheduler.__init__` (CUDA graphs captured, in WaS): with cas/auto, join the DP ranks' lockstep and
        CaS groups at the B_th of the settings; then SiDP's Prometheus metrics, labelled like SGLang's scheduler metrics.

        Raises:
            SiDPError: auto without B_th (a server not started by our launcher, which predicts it, nor given
                --sidp-b-th).
        """
        if self.settings.service != "was" and self.mlps:
            self._join_lockstep(scheduler)
        elif self.mlps and self.streamed and self.copy_gbps and self.dp_rank == 0 and self.tp_rank == 0:
            self._say_if_was_is_copy_bound(scheduler.tp_worker.model_runner)
        collector = getattr(scheduler, "metrics_collector", None)
        if collector is not None:
            self.metrics = SiDPMetrics(self, dict(collector.labels))
        return result

    def _join_lockstep(self, scheduler) -> None:
        import os

        from sgl_sidp.control.lockstep import Lockstep, replica_group
        from sgl_sidp.remote_compute.cas import RemoteCompute

        b_th, source = None, ""
        sa = scheduler.server_args
        measure = b_th_measured(self.settings, bool(sa.disable_cuda_graph), self.fold_gpus)
        if self.settings.service == "auto" and not measure:  # every rank's settings hold the same B_th: --sidp-b-th,
            b_th, source = self.settings.b_th, "--sidp-b-th, or the planner's at launch"  # or the planner's (`resolve`)
            if not b_th:
                raise SiDPError("--sidp-service auto needs B_th: start the server with python -m "
                                "sgl_sidp.launch_server (which predicts it), or pass --sidp-b-th TOKENS")
        tag = f"{sa.port}-{os.getppid()}-tp{self.tp_rank}"  # the DP controller's pid: one per server
        cpu = replica_group(f"lockstep-{tag}", self.d, self.dp_rank, "gloo", self.settings.owner_timeout_s)
        wire = cpu if self.fold_gpus else replica_group(f"cas-{tag}", self.d, self.dp_rank, "nccl",
                                                         self.settings.owner_timeout_s)
        # the CaS graphs' capture and the B_th measurement run no scheduler iteration: the lockstep starts after them,
        # at the B_th it runs with
        if cas_graphs_on(self.settings, bool(sa.disable_cuda_graph), self.fold_gpus):
            self._capture_cas_graphs(scheduler.tp_worker.model_runner, tag)
        if measure:  # the launcher refused it without CaS graphs (`sidp.feature.check`)
            runner = scheduler.tp_worker.model_runner
            sizes = [b for b in B_TH_BATCHES if b in self.graphs.capture_bs]
            b_th, points, beyond = self.measure_b_th(lambda rows, cas: self._time_decode(runner, rows, cas), sizes,
                                                     cpu)
            source = "--sidp-b-th-measure: measured at start-up on this group's GPUs" + (
                f", extrapolated beyond the largest decode graph ({sizes[-1]} rows)" if beyond else
                ", CaS at every batch: WaS is slower at the largest decode graph and no faster-growing" if b_th >= 1e9
                else "")
            logger.info("sgl-sidp sidp %s: B_th %g tokens per rank (%s); decode step ms (WaS, CaS; WaS - where not "
                        "timed), the slowest rank's, by rows per rank: %s", self.who, b_th, source,
                        ", ".join(f"{b}: {'-' if w is None else f'{w:.2f}'}, {c:.2f}" for b, (w, c) in points.items()))
        self.start_lockstep(Lockstep(cpu, self.switch_for(b_th)), RemoteCompute(wire), b_th, source)
        logger.info("sgl-sidp sidp %s: DP ranks in lockstep (%s); CaS rows over %s%s", self.who, self.settings.service,
                    "gloo (replicas share a GPU)" if self.fold_gpus else "NCCL",
                    f"; B_th {b_th:g} tokens per rank ({source})" if b_th is not None else "")

    def measure_b_th(self, time_ms: Callable[[int, bool], float], sizes: Sequence[int],
                     group) -> tuple[float, dict[int, tuple[float | None, float]], bool]:
        """auto's B_th measured on the group's GPUs (`--sidp-b-th-measure`): this rank times decode steps of `sizes`
        rows per rank (ascending) in CaS and in WaS (`time_ms(rows, cas)`, ms), the ranks keep the slowest rank's
        time of each (an iteration in lockstep waits for it; an all-reduce over `group`, the lockstep's gloo group),
        and B_th is the smallest size from which WaS is no slower.

        CaS is timed at every size, WaS only where the answer needs it: its step is copy-bound (flat) until its
        compute outgrows the copies while CaS's grows at every row, so once WaS wins it keeps winning (the planner's
        rule, `cost.first_lasting_win`, on the sizes timed). WaS is timed at the largest size first; where it wins
        there, a bisection over the smaller sizes finds the first win; where it does not, it is timed at the second
        largest too and B_th is where the two curves' lines through those sizes meet (`cost.extrapolated_win`):
        without it every prefill chunk, thousands of rows, would run CaS (measured on 2 x H100 with Qwen3-32B: 0.68x
        TP2's throughput against 0.98x at B_th 128). 1e9 (CaS at every batch) where those lines do not meet. Timing
        WaS at all 11 sizes took 79 s of a 4 x H100 start-up with Llama-3.1-70B (each step 386-469 ms, copy-bound).
        Every DP rank calls it at once, with the same `sizes` (a CaS step is a collective; each WaS timing is
        all-reduced before the next is chosen, so every rank times the same sizes).

        Returns:
            (B_th in tokens per rank, {rows: (WaS ms or None where not timed, CaS ms)}, whether B_th is
            extrapolated), the same on every rank.
        """
        import torch.distributed as dist

        from sgl_sidp.calibration.cost import extrapolated_win

        def slowest(values: list[float]) -> list[float]:
            t = torch.tensor(values, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            return t.tolist()

        cas = dict(zip(sizes, slowest([time_ms(b, True) for b in sizes])))
        was: dict[int, float] = {}

        def was_at(i: int) -> float:
            b = sizes[i]
            if b not in was:
                was[b] = slowest([time_ms(b, False)])[0]
            return was[b]

        def points() -> dict[int, tuple[float | None, float]]:
            return {b: (was.get(b), cas[b]) for b in sizes}

        last = len(sizes) - 1
        if was_at(last) <= cas[sizes[last]]:
            lo, hi = 0, last  # WaS wins at sizes[hi]; find the first size it wins at
            while lo < hi:
                mid = (lo + hi) // 2
                if was_at(mid) <= cas[sizes[mid]]:
                    hi = mid
                else:
                    lo = mid + 1
            return float(sizes[hi]), points(), False
        if last == 0:
            return 1e9, points(), False
        was_at(last - 1)
        b = extrapolated_win(was.get, cas.get, sizes)
        return (1e9 if b is None else float(b)), points(), b is not None

    def _time_decode(self, runner, rows: int, cas: bool) -> float:
        """ms of one decode step of `rows` rows of `B_TH_CONTEXT` tokens (`calibration.measure.DecodeProbe`), steps
        issued back to back as SGLang's overlap scheduler issues them (`pipelined_ms`), replaying the CaS graph of that
        size (`cas`: every rank at once) or SGLang's own (WaS)."""
        from sgl_sidp.calibration.measure import DecodeProbe, pipelined_ms

        probe = DecodeProbe(runner, rows, B_TH_CONTEXT)
        self._timing_cas, self._bucket = cas, rows if cas else None
        self.graphs.select(self._bucket)
        try:
            return pipelined_ms(probe.run, iters=4, rounds=3, warmup=2)
        finally:
            self._timing_cas, self._bucket = False, None
            self.graphs.select(None)
            probe.close()

    def _capture_cas_graphs(self, runner, tag: str) -> None:
        """Every rank at once (the capture runs the exchange): an NCCL communicator of the DP ranks (SGLang's
        `PyNcclCommunicator`, graph-capturable) and a second decode graph set captured in CaS (`CasGraphs`).

        Raises:
            SiDPError: SGLang captured no decode graphs, or NCCL is not available.
        """
        import time

        from sglang.srt.distributed.device_communicators.pynccl import PyNcclCommunicator
        from sglang.srt.distributed.utils import StatelessProcessGroup

        from sgl_sidp.control.lockstep import replica_store
        from sgl_sidp.process import Progress
        from sgl_sidp.remote_compute.cas import BucketWire

        if getattr(runner, "decode_cuda_graph_runner", None) is None:
            raise SiDPError("--sidp-cas-graphs: SGLang captured no decode CUDA graphs on this server")
        store = replica_store(f"casgraph-{tag}", self.d)
        with Progress(f"sgl-sidp sidp {self.who} waits for the other {self.d - 1} DP rank(s) to set up the NCCL "
                      "communicator of the CaS decode graphs", logger, limit_s=store.timeout.total_seconds()):
            comm = PyNcclCommunicator(StatelessProcessGroup(rank=self.dp_rank, world_size=self.d, store=store),
                                      device=torch.cuda.current_device())
        if not comm.available:
            raise SiDPError("--sidp-cas-graphs: NCCL is not available to SGLang's PyNcclCommunicator")
        comm.disabled = False  # ours alone: SGLang's graph_capture() enables only its own groups' communicators
        self.wire = BucketWire(comm, self.dp_rank, self.d)
        t0 = time.monotonic()
        self._capturing_cas = True
        try:
            self.graphs = CasGraphs.capture(runner)
        finally:
            self._capturing_cas = False
        logger.info("sgl-sidp sidp %s: CaS decode CUDA graphs captured for %d sizes (%s..%s) in %.1f s", self.who,
                    len(self.graphs.capture_bs), self.graphs.capture_bs[0], self.graphs.capture_bs[-1],
                    time.monotonic() - t0)

    def _say_if_was_is_copy_bound(self, runner) -> None:
        """With `--sidp-service was` and this model's forward times cached: one warning where decode steps cannot hide
        a forward's copies (`was_verdict`)."""
        from sgl_sidp.calibration.cache import CalibrationCache
        from sgl_sidp.calibration.startup import calibration_key

        cal = CalibrationCache().get(calibration_key(runner))
        line = was_verdict(cal, self.copy_ms_per_forward) if cal is not None else None
        if line:
            logger.warning("sgl-sidp sidp %s: %s", self.who, line)

    def on_next_batch(self, plan, scheduler, *args, **kwargs):
        """AFTER `Scheduler.get_next_batch_to_run` (cas/auto): this iteration's lockstep step (`step`)."""
        if self.lockstep is not None:
            from sgl_sidp.control.batch_signal import IterationSignal

            sig = IterationSignal.from_plan(plan)
            busy = sig is not None and sig.forward_mode != "IDLE"
            self.step(sig.computed_tokens if busy else 0, sig.batch_size if busy and sig.forward_mode == "DECODE" else -1)
        return plan

    def on_input_requests(self, result, scheduler, *args, **kwargs):
        """AFTER `Scheduler.process_input_requests` (cas/auto): a rank whose engine is paused (SGLang's
        `pause_generation`; its event loop then skips `get_next_batch_to_run`) still takes its lockstep step, with no
        tokens, serving its owned layers when others run CaS; otherwise a rank that paused one iteration earlier than
        another would leave it waiting in the all-gather, unable to receive the pause (or a weight update) itself."""
        if self.lockstep is not None and getattr(scheduler, "_engine_paused", False):
            self.step(0)
        return result

    def around_can_run_graph(self, original, runner, *args, **kwargs):
        """AROUND the decode/prefill graph runners' `can_run_graph`: a CaS iteration runs eagerly, unless it has a
        graph size (`--sidp-cas-graphs`) and this is the CaS graph runner (if that says no, the forward runs
        eagerly on the same static-shape exchange, so the other ranks' replays still match)."""
        if not self.cas_now:
            return original(runner, *args, **kwargs)
        if self._bucket is not None and self.graphs is not None and runner is self.graphs.cas_runner:
            return original(runner, *args, **kwargs)
        return False

    def _on_iteration(self, sig) -> None:
        if self.metrics is not None and self.lockstep is None:
            self.metrics.observe(sig)

    @property
    def bytes_per_forward(self) -> int:
        return self.binding.prefetcher.bytes_per_forward if self.binding is not None else 0

    @property
    def copy_ms_per_forward(self) -> float:
        """A WaS forward's copies at the copy rate measured at load (ms); needs `copy_gbps` > 0."""
        return self.bytes_per_forward / (self.copy_gbps * 1e9) * 1e3

    def around_mlp_forward(self, original, mlp, *args, **kwargs):
        """AROUND `Qwen2MLP.forward` / `LlamaMLP.forward`: WaS: a streamed layer waits for its slot, frees it after;
        CaS: `cas_forward`."""
        if self._direct:
            return original(mlp, *args, **kwargs)
        if self.cas_now:
            return self.cas_forward(original, mlp, *args, **kwargs)
        if self.binding is None:
            return original(mlp, *args, **kwargs)
        return self.binding.around(original, mlp, *args, **kwargs)


class CasGraphs:
    """SGLang's decode graph runner (WaS) and a second one captured in CaS, with its own attention backend, swapped
    into the `ModelRunner` per iteration (SGLang's adaptive speculative decoding swaps `decode_cuda_graph_runner` and
    `attn_backend` the same way: `speculative/eagle_worker_v2.py` `apply_runtime_state`).

    The CaS runner is a subclass of `ModelRunner._decode_cuda_graph_runner_cls()` whose `_pad_to_bucket` rounds up to
    at least `forced_bs`, the size all ranks agreed on (`sgl_sidp.hooks.OVERRIDES["cas_decode_graph_runner"]`).
    """

    def __init__(self, runner, was_runner, was_backend, cas_runner, cas_backend):
        self.runner, self.was_runner, self.was_backend = runner, was_runner, was_backend
        self.cas_runner, self.cas_backend = cas_runner, cas_backend
        self.capture_bs = sorted(cas_runner.capture_bs)

    @classmethod
    def capture(cls, runner) -> "CasGraphs":
        """Capture the CaS set on `runner` (SGLang's `ModelRunner`, its WaS graphs already captured); the caller puts
        the MLPs in CaS for the capture."""
        was_runner, was_backend = runner.decode_cuda_graph_runner, runner.attn_backend
        keep = runner.init_new_workspace  # as eagle_worker_v2.build_adaptive_runtime_state does
        try:
            cas_backend = runner._get_attention_backend(init_new_workspace=True)
        finally:
            runner.init_new_workspace = keep
        cas_runner = bucket_runner_class(runner._decode_cuda_graph_runner_cls())(runner, attn_backend=cas_backend)
        return cls(runner, was_runner, was_backend, cas_runner, cas_backend)

    def select(self, bucket: int | None) -> None:
        """The CaS set replaying `bucket` for this iteration, else SGLang's own."""
        if bucket is not None:
            self.cas_runner.forced_bs = bucket
            self.runner.decode_cuda_graph_runner, self.runner.attn_backend = self.cas_runner, self.cas_backend
        else:
            self.runner.decode_cuda_graph_runner, self.runner.attn_backend = self.was_runner, self.was_backend


def bucket_runner_class(base: type) -> type:
    """A subclass of SGLang's decode graph runner class `base` that replays at least `forced_bs` (every rank the
    same size), however small its own batch; `forced_bs` 0 (the default, and during capture) changes nothing."""

    class CasDecodeGraphRunner(base):
        forced_bs = 0

        def _pad_to_bucket(self, raw_size, buckets):
            return base._pad_to_bucket(max(raw_size, self.forced_bs), buckets)

    return CasDecodeGraphRunner


def was_verdict(cal, copy_ms: float) -> str | None:
    """What WaS costs a decode step, predicted from vanilla forward times `cal` (`Calibration`) and `copy_ms` (ms) of
    copies per forward: None where the smallest calibrated decode batch hides them; else where they start to hide
    (`cost.crossover_batch`, SiDP's B_th) or that no decode batch does, with the step they bound. SiDP paper §3: WaS
    pays off where a forward's compute covers the streamed weights; below that CaS serves."""
    from sgl_sidp.calibration.cost import crossover_batch

    if not cal.decode_ms:
        return None
    batches = sorted(cal.decode_ms)
    b = crossover_batch(cal, copy_ms)
    if b == batches[0]:
        return None
    lo = cal.decode_ms[batches[0]]
    where = (f"from decode batches of {b} tokens per rank" if b is not None
             else f"at no decode batch up to {batches[-1]}")
    return (f"WaS hides its {copy_ms:.1f} ms of copies per forward {where}; below that a decode step takes at least "
            f"{copy_ms:.1f} ms, up to {copy_ms / lo:.1f}x vanilla's {lo:.1f} ms at batch {batches[0]} (predicted); "
            "--sidp-service auto runs those steps in CaS")


class SiDPMetrics:
    """SiDP's Prometheus metrics (with `--enable-metrics`), labelled like SGLang's scheduler metrics.

    - `sglang:sidp_sidp_kv_tokens`: this rank's KV capacity (tokens; SGLang's `max_total_num_tokens`).
    - `sglang:sidp_sidp_kv_tokens_vanilla_estimate`: what a vanilla replica would hold (`vanilla_kv_estimate`).
    - `sglang:sidp_sidp_streamed_layers`: FFN layers this rank streams from their owners every forward.
    - `sglang:sidp_sidp_bytes_per_forward`: bytes one forward streams (WaS).
    - `sglang:sidp_sidp_forwards_total{mode}`: this rank's forwards by mode ("was", "cas").
    - `sglang:sidp_sidp_served_total`: CaS iterations in which this rank ran no batch but served its owned layers.
    - `sglang:sidp_sidp_switches_total`: WaS <-> CaS switches (cas/auto).
    - `sglang:sidp_sidp_b_th`: B_th in tokens per rank (auto; 0 otherwise).
    - `sglang:sidp_sidp_bytes_fetched_total`: bytes streamed so far (bytes per forward times WaS forwards).
    - `sglang:sidp_sidp_fetch_exposed_ms`: measured ms an eager WaS forward waits for its slots (sampled).
    - `sglang:sidp_sidp_fetch_hidden_share`: 1 - that over the copy time per forward at the load-time copy rate.
    """

    def __init__(self, rt: SiDPRuntime, labels: dict, registry=None):
        from prometheus_client import REGISTRY, Counter, Gauge

        reg = REGISTRY if registry is None else registry
        kw = dict(labelnames=list(labels), registry=reg)
        gauge = lambda name, doc: Gauge(name, doc, multiprocess_mode="mostrecent", **kw).labels(**labels)  # noqa: E731
        self.rt = rt
        gauge("sglang:sidp_sidp_kv_tokens", "KV cache capacity of this rank (tokens).").set(rt.kv_tokens or 0)
        gauge("sglang:sidp_sidp_kv_tokens_vanilla_estimate",
              "KV tokens a vanilla replica would hold (estimate; 0 when the KV cache is capped).").set(rt.kv_vanilla or 0)
        gauge("sglang:sidp_sidp_streamed_layers", "FFN layers this rank streams every forward.").set(len(rt.streamed))
        gauge("sglang:sidp_sidp_bytes_per_forward", "Bytes a forward streams from the owners.").set(rt.bytes_per_forward)
        gauge("sglang:sidp_sidp_b_th", "B_th, tokens per rank (auto).").set(
            rt.b_th if rt.b_th is not None and rt.b_th != float("inf") else 0)
        forwards = Counter("sglang:sidp_sidp_forwards", "Forwards of this rank by mode.",
                           labelnames=[*labels, "mode"], registry=reg)
        self.by_mode = {m: forwards.labels(**labels, mode=m.value) for m in ServeMode}
        self.served = Counter("sglang:sidp_sidp_served", "CaS iterations served without a batch of its own.", **kw).labels(**labels)
        self.switches = Counter("sglang:sidp_sidp_switches", "WaS <-> CaS switches.", **kw).labels(**labels)
        self.exposed = gauge("sglang:sidp_sidp_fetch_exposed_ms",
                             "Measured ms an eager WaS forward waits for its slots (sampled; 0 before a sample).")
        self.hidden = gauge("sglang:sidp_sidp_fetch_hidden_share",
                            "Share of the fetch hidden behind compute: 1 - exposed / copy time at the load-time rate.")
        self.fetched = Counter("sglang:sidp_sidp_bytes_fetched", "Bytes streamed from the owners so far.", **kw).labels(**labels)

    def observe(self, sig) -> None:
        """One busy iteration ran one WaS forward (a batch-signal listener; WaS only, no lockstep)."""
        self.by_mode[ServeMode.WAS].inc()
        self.fetched.inc(self.rt.bytes_per_forward)
        self._exposure()

    def _exposure(self) -> None:
        exposed, hidden = self.rt.fetch_exposure()
        if exposed is not None:
            self.exposed.set(exposed)
        if hidden is not None:
            self.hidden.set(hidden)

    def on_step(self, it, tokens: int, switched: bool) -> None:
        """One lockstep iteration (`SiDPRuntime.step`): `tokens` this rank runs, `switched` if the mode changed."""
        if switched:
            self.switches.inc()
        if tokens:
            self.by_mode[it.mode].inc()
            if it.mode is ServeMode.WAS:
                self.fetched.inc(self.rt.bytes_per_forward)
                self._exposure()
        elif it.busy and it.mode is ServeMode.CAS:
            self.served.inc()


def _order_name(order, streamed) -> str:
    return "forward" if tuple(order) == tuple(streamed) else f"peak-shifted {list(order[:6])}..."


def _ranges(layers) -> str:
    """[0, 2, 4, ..., 62] as 'every 2nd from 0 to 62' when regular, else the list."""
    layers = list(layers)
    if len(layers) > 3 and len({b - a for a, b in zip(layers, layers[1:])}) == 1:
        return f"{layers[0]}..{layers[-1]} step {layers[1] - layers[0]} ({len(layers)} layers)"
    return str(layers)
