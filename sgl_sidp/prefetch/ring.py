"""Slot rings: per-layer weights fetched into a few static slots, hidden behind compute.

`SlotPrefetcher` owns the slots, the copy (side) stream and the events (all created once, at
start-up) and exposes the three points a feature's hooks call in every forward:

- `start_forward()`: before the first layer; issues the first `n_slots` copies.
- `before_use(layer_id)`: the compute stream waits until that layer's slot is filled.
- `after_use(layer_id)`: the slot is released and the copy of its next tenant is issued.

`PrefetchSchedule` says which slot each layer uses and when its copy is issued.

Streams and events go through a small `StreamOps` interface so the same code runs on CUDA (real
streams; the ops are captured by SGLang's decode CUDA graphs, and run as eager breaks inside its
breakable prefill graphs) and in CPU tests (`SimulatedStreams`, which executes side-stream copies
at the earliest or the latest moment the events allow, to expose a missing dependency).

`sgl_sidp.prefetch.binding.SlotBinding` binds modules to a ring; users: ZeroDP (a sink pulls a
source's MoE experts), and SiDP's WaS next.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Mapping, Sequence

import torch



class PrefetchSchedule:
    """Which slot each fetched layer uses, and when its copy is issued (a ring of `n_slots` slots).

    Layers are used in `layers` order (forward order) and fetched in `fetch_order` (default: the
    same). The first `n_slots` copies are issued when the forward starts; each time a layer's
    weights have been used, its slot is free and the next layer in fetch order is copied into it,
    so the j-th fetch goes into the slot the (j - n_slots)-th used layer frees. With the default
    order, layer j lives in slot j % n_slots. Source of the pattern: ZeroDP (jamesdborin/zerodp)
    and SGLang's DWDP `wait_prefetch` / `record_compute_and_prefetch_next`; a fetch order other
    than the forward order is SiDP's peak shifting (`sgl_sidp.prefetch.schedules.peak_shift_order`).

    Raises:
        ValueError: repeated layers, `n_slots < 1`, a fetch order that is not a permutation of
            `layers`, or one that needs more slots (a layer used before the slot its fetch
            takes is free: the j-th fetch must be used after the (j - n_slots)-th used layer).
    """

    def __init__(self, layers: Sequence[int], n_slots: int = 2, fetch_order: Sequence[int] | None = None):
        if n_slots < 1:
            raise ValueError("n_slots must be >= 1")
        if len(set(layers)) != len(layers):
            raise ValueError(f"repeated layers in {list(layers)}")
        self.layers = tuple(layers)
        self.fetch_order = self.layers if fetch_order is None else tuple(fetch_order)
        if sorted(self.fetch_order) != sorted(self.layers) or len(self.fetch_order) != len(self.layers):
            raise ValueError(f"fetch order {list(self.fetch_order)} is not a permutation of {list(self.layers)}")
        self.n_slots = n_slots
        use = {lid: i for i, lid in enumerate(self.layers)}
        slot: dict[int, int] = {}
        for j, lid in enumerate(self.fetch_order):
            if j >= n_slots and use[lid] <= j - n_slots:
                raise ValueError(
                    f"fetch order {list(self.fetch_order)} needs more than {n_slots} slots: layer {lid} is used "
                    f"before the slot its fetch would take is free"
                )
            slot[lid] = j if j < n_slots else slot[self.layers[j - n_slots]]
        self._slot = slot
        self._next = {self.layers[i]: self.fetch_order[i + n_slots] for i in range(len(self.layers) - n_slots)}

    def __contains__(self, layer_id: int) -> bool:
        return layer_id in self._slot

    def slot_of(self, layer_id: int) -> int:
        return self._slot[layer_id]

    @property
    def initial(self) -> tuple[int, ...]:
        """Layers whose copies are issued at the start of every forward."""
        return self.fetch_order[: self.n_slots]

    def after(self, layer_id: int) -> int | None:
        """The layer to prefetch once `layer_id`'s weights were used (its slot's next tenant), or None.

        Raises:
            KeyError: `layer_id` is not fetched.
        """
        if layer_id not in self._slot:
            raise KeyError(layer_id)
        return self._next.get(layer_id)


class StreamOps:
    """The stream/event operations `SlotPrefetcher` needs (CUDA implementation).

    Every event is created once here; `events(n)` returns a fresh list of them. Recording,
    waiting and copying go to the given streams, so under stream capture they become graph nodes.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.side = torch.cuda.Stream(device=device)

    def current(self):
        return torch.cuda.current_stream(self.device)

    def new_event(self):
        return torch.cuda.Event()

    def record(self, event, stream) -> None:
        event.record(stream)

    def wait(self, stream, event) -> None:
        stream.wait_event(event)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream) -> None:
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def timing_event(self):
        return torch.cuda.Event(enable_timing=True)

    def done(self, event) -> bool:
        return event.query()

    def elapsed_ms(self, start, end) -> float:
        return start.elapsed_time(end)


#: One eager forward in this many has its slot waits timed, by default (`StallSampler`).
SAMPLE_EVERY = 16


class StallSampler:
    """How long the compute stream waits for slots (the part of the fetch not hidden behind compute), measured with
    timing events around the "slot ready" waits of one eager forward in `every`; never inside a graph capture
    (replays run no Python, so graph-replayed forwards are not sampled).

    Args:
        ops: `StreamOps` (with `timing_event`, `done`, `elapsed_ms`).
        n_waits: waits per forward (the streamed layers).
        every: sample one forward in `every` (>= 1).

    Attributes:
        samples_ms: exposed wait per sampled forward (ms), oldest first, read back once its events completed
            (without blocking: at a later forward's start).
    """

    def __init__(self, ops, n_waits: int, every: int, keep: int = 64):
        self.ops, self.every, self.keep = ops, every, keep
        self.pairs = [(ops.timing_event(), ops.timing_event()) for _ in range(n_waits)]
        for a, b in self.pairs:  # created lazily on first record: never per forward
            ops.record(a, ops.current())
            ops.record(b, ops.current())
        self.samples_ms: list[float] = []
        self._forwards = self._used = 0
        self._active = self._pending = False

    def start(self) -> None:
        """A forward starts: read back a finished sample; sample this one if it is due and nothing is pending.
        A forward being captured into a CUDA graph does neither (CUDA forbids querying an event during a capture)."""
        if self.ops.capturing():
            self._active = False
            return
        if self._pending and all(self.ops.done(b) for _, b in self.pairs[:self._used]):
            self.samples_ms = (self.samples_ms + [sum(self.ops.elapsed_ms(a, b) for a, b in self.pairs[:self._used])])[-self.keep:]
            self._pending = False
        self._forwards += 1
        self._active = not self._pending and self._forwards % self.every == 0
        if self._active:
            self._used = 0

    def wait(self, wait: Callable[[], None]) -> None:
        """Run `wait()` (a compute-stream wait on a slot), timed when this forward is sampled."""
        if not self._active or self._used >= len(self.pairs) or self.ops.capturing():
            wait()
            return
        a, b = self.pairs[self._used]
        self._used += 1
        self.ops.record(a, self.ops.current())
        wait()
        self.ops.record(b, self.ops.current())
        self._pending = True

    def mean_ms(self) -> float | None:
        """Mean exposed wait per sampled forward (ms), or None before the first sample."""
        return sum(self.samples_ms) / len(self.samples_ms) if self.samples_ms else None


@dataclasses.dataclass
class _EventSet:
    fork: object
    ready: list
    free: list


class SlotPrefetcher:
    """Fetches of per-layer weights into a ring of slots, issued on a side stream.

    Args:
        schedule: the fetched layers and their slots (`PrefetchSchedule`).
        remote: `(layer_id, param_name) -> tensor` views of the owner's tensors, readable from this
            device (on CUDA: the owner's memory mapped with VMM, `sgl_sidp.peer.vmm`).
        slots: `n_slots` dicts `param_name -> tensor`, the local buffers; each shaped like the
            corresponding remote tensor of any fetched layer (same shape and dtype in every layer).

    Raises:
        ValueError: slot count differs from the schedule's, or a remote tensor's shape/dtype
            differs from its slot's.
        ops: stream/event implementation (`StreamOps` on CUDA).

    Two event sets are kept: one used while a CUDA graph is being captured and one for eager
    forwards, since CUDA forbids waiting eagerly on an event last recorded inside a capture.
    """

    def __init__(self, schedule: PrefetchSchedule, remote: Mapping, slots: list[dict], ops, sample_every: int = 0):
        if len(slots) != schedule.n_slots:
            raise ValueError(f"{len(slots)} slots for a schedule of {schedule.n_slots}")
        self.schedule = schedule
        self.remote = dict(remote)
        self.slots = slots
        self.ops = ops
        names = set(slots[0])
        for lid in schedule.layers:
            for name in names:
                src, dst = self.remote[(lid, name)], slots[schedule.slot_of(lid)][name]
                if src.shape != dst.shape or src.dtype != dst.dtype:
                    raise ValueError(f"layer {lid} {name}: remote {tuple(src.shape)} {src.dtype} != slot {tuple(dst.shape)} {dst.dtype}")
        self._names = sorted(names)
        n = schedule.n_slots
        self._sets = {
            capture: _EventSet(ops.new_event(), [ops.new_event() for _ in range(n)], [ops.new_event() for _ in range(n)])
            for capture in (False, True)
        }
        # record each event once now: CUDA events are created lazily on first record, and
        # nothing may be created per forward (or inside a graph capture)
        for es in self._sets.values():
            for e in (es.fork, *es.ready, *es.free):
                ops.record(e, ops.current())
        self.bytes_per_forward = sum(self.remote[(lid, nm)].numel() * self.remote[(lid, nm)].element_size() for lid in schedule.layers for nm in self._names)
        self.forwards_started = 0  # eager forwards and graph captures (replays run no Python)
        # exposed fetch time, measured on one eager forward in `sample_every` (0: not measured)
        self.stalls = StallSampler(ops, len(schedule.layers), sample_every) if sample_every else None

    # ------------------------------------------------------------------ the three points
    def start_forward(self) -> None:
        """Issue the copies of the first `n_slots` fetched layers (they wait for the previous forward's reads)."""
        ev = self._events()
        cur = self.ops.current()
        self.ops.record(ev.fork, cur)
        self.ops.wait(self.ops.side, ev.fork)
        for lid in self.schedule.initial:
            self._issue(lid, ev)
        self.forwards_started += 1
        if self.stalls is not None:
            self.stalls.start()

    def before_use(self, layer_id: int) -> None:
        """Make the compute stream wait until `layer_id`'s slot holds its weights."""
        ev = self._events()
        ready = ev.ready[self.schedule.slot_of(layer_id)]
        if self.stalls is None:
            self.ops.wait(self.ops.current(), ready)
        else:
            self.stalls.wait(lambda: self.ops.wait(self.ops.current(), ready))

    def after_use(self, layer_id: int) -> None:
        """Release `layer_id`'s slot and start pulling the next layer that uses it."""
        ev = self._events()
        s = self.schedule.slot_of(layer_id)
        nxt = self.schedule.after(layer_id)
        if nxt is None:
            return
        self.ops.record(ev.free[s], self.ops.current())
        self.ops.wait(self.ops.side, ev.free[s])
        self._issue(nxt, ev)

    # ------------------------------------------------------------------ internals
    def _events(self) -> _EventSet:
        return self._sets[self.ops.capturing()]

    def _issue(self, layer_id: int, ev: _EventSet) -> None:
        s = self.schedule.slot_of(layer_id)
        for name in self._names:
            self.ops.copy(self.slots[s][name], self.remote[(layer_id, name)], self.ops.side)
        self.ops.record(ev.ready[s], self.ops.side)


# --------------------------------------------------------------------------- CPU simulation
class SimulatedStreams:
    """A CPU stand-in for `StreamOps` that models two asynchronous streams.

    The compute stream runs synchronously, in program order. Side-stream work is queued; with
    `policy="latest"` a queued copy runs only when the compute stream waits on an event recorded
    after it (the slowest legal copy engine); with `policy="earliest"` it runs as soon as every
    event it waits on has been recorded on the compute stream (the fastest legal one).

    A missing "slot ready" wait reads a stale slot under "latest", and a copy issued before its
    slot's last reader ran overwrites it under "earliest". Because compute is synchronous here, a
    missing "slot free" or start-of-forward wait cannot show; `tests/test_prefetch_ring.py` checks
    those with a stricter model in which compute lags too.
    """

    class _Stream:
        def __init__(self, name):
            self.name = name

    class _Event:
        def __init__(self):
            self.side_seq = None  # side-queue position this event marks (recorded on side)
            self.compute_done = False  # recorded on compute (compute reached it)
            self.t = 0  # the simulated clock when recorded on compute (timing events)

    def __init__(self, policy: str):
        if policy not in ("earliest", "latest"):
            raise ValueError(policy)
        self.policy = policy
        self.compute = self._Stream("compute")
        self.side = self._Stream("side")
        self._queue: collections.deque = collections.deque()  # ("wait", ev) | ("copy", dst, src) | ("mark", ev)
        self._seq = 0
        self._done_seq = 0  # the last side mark the side stream has reached
        self.clock = 0  # one tick per copy run: compute "waits" the ticks of the copies a wait drains
        self.log: list[str] = []

    def current(self):
        return self.compute

    def new_event(self):
        return self._Event()

    def capturing(self) -> bool:
        return False

    def timing_event(self):
        return self._Event()

    def done(self, event) -> bool:
        return True

    def elapsed_ms(self, start, end) -> float:
        return float(end.t - start.t)

    def record(self, event, stream) -> None:
        if stream is self.compute:
            event.t = self.clock
            event.compute_done = True
            event.side_seq = None  # a wait now refers to this (compute) record, already reached
            if self.policy == "earliest":
                self._drain(until=None)
        else:
            event.compute_done = False
            self._seq += 1
            event.side_seq = self._seq
            self._queue.append(("mark", event, self._seq))
            if self.policy == "earliest":
                self._drain(until=None)

    def wait(self, stream, event) -> None:
        if stream is self.side:
            self._queue.append(("wait", event))
            if self.policy == "earliest":
                self._drain(until=None)
        else:
            if event.side_seq is not None and event.side_seq > self._done_seq:
                self._drain(until=event.side_seq)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream) -> None:
        assert stream is self.side
        self._queue.append(("copy", dst, src.clone()))
        if self.policy == "earliest":
            self._drain(until=None)

    def _drain(self, until) -> None:
        """Run queued side work: everything up to mark `until`, or (until=None) all that is unblocked."""
        while self._queue:
            op = self._queue[0]
            if op[0] == "wait":
                if not op[1].compute_done:
                    if until is not None:
                        raise RuntimeError("deadlock: compute waits on side work that waits on compute")
                    return
            elif op[0] == "copy":
                op[1].copy_(op[2])
                self.clock += 1
            elif op[0] == "mark":
                self._done_seq = op[2]
                if until is not None and op[2] >= until:
                    self._queue.popleft()
                    return
            self._queue.popleft()

    def finish(self) -> None:
        """Run whatever side work remains (end of a test)."""
        self._drain(until=None)


def sync_points(
    prefetcher: SlotPrefetcher,
    wrap: Callable[[Callable], Callable] = lambda f: f,
) -> tuple[Callable, Callable, Callable]:
    """The three sync points as plain functions, each passed through `wrap`.

    On CUDA, `wrap` is `graph_break` (SGLang's `eager_on_graph(enable=True)` of
    `sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph`, taken on the capture's
    stream), so inside a breakable prefill graph each point runs eagerly between graph segments and
    the copies overlap across segments; in a full decode graph (or eagerly) the call runs inline and
    is captured as graph nodes.
    """

    def prefetch_start_forward():
        prefetcher.start_forward()

    def prefetch_before_use(layer_id: int):
        prefetcher.before_use(layer_id)

    def prefetch_after_use(layer_id: int):
        prefetcher.after_use(layer_id)

    return wrap(prefetch_start_forward), wrap(prefetch_before_use), wrap(prefetch_after_use)


def graph_break(fn: Callable, *, sglang_break: Callable[[Callable], Callable] | None = None,
                capture_stream: Callable[[], object] | None = None, current_stream: Callable[[], object] | None = None,
                on_stream: Callable[[object], object] | None = None) -> Callable:
    """`fn` as a break point of SGLang's breakable CUDA graphs, taken on the capture's own stream: the `wrap` of
    `sync_points` on CUDA.

    SGLang's `eager_on_graph(enable=True)` ends the current graph segment where it is called, and a CUDA graph capture
    must end on the stream it began on. Models that run their experts on a second stream while capturing (Qwen2-MoE's
    `forward_normal_dual_stream`: the routed experts under `torch.cuda.stream(alt_stream)`) reach a sync point on
    that side stream, where the plain break fails ("Capture must end on the same stream it began on"). Here the side
    stream's work joins the capture stream first, the break (and `fn`) runs on the capture stream, and the side stream
    then waits for it, so it takes part in the next segment (SGLang's `wait_stream` hook records that fork). Eagerly,
    in a full (decode) graph capture and in a breakable graph's replay (which calls `fn` itself, on the replay stream)
    the two streams are the same and `fn` runs where it is called.

    Args:
        fn: the sync point.
        sglang_break, capture_stream, current_stream, on_stream: SGLang's `eager_on_graph(enable=True)`, its
            `get_current_stream` (the breakable capture's stream, else the current one), `torch.cuda.current_stream`
            and `torch.cuda.stream` by default; tests pass stand-ins.

    Source: SGLang `sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph` (`eager_on_graph`,
    `_end_current_segment`, `_hooked_wait_stream`).
    """
    if sglang_break is None:
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph import (
            eager_on_graph,
            get_current_stream,
        )

        sglang_break, capture_stream = eager_on_graph(enable=True), get_current_stream
        current_stream, on_stream = torch.cuda.current_stream, torch.cuda.stream
    broken = sglang_break(fn)

    def run(*args):
        main, here = capture_stream(), current_stream()
        if main == here:
            return broken(*args)
        main.wait_stream(here)  # what the side stream did so far ends with this segment
        with on_stream(main):
            out = broken(*args)
        here.wait_stream(main)  # the side stream goes on after the break, inside the next segment
        return out

    run.__name__ = getattr(fn, "__name__", "graph_break")
    return run
