"""The slot ring (`sgl_sidp.prefetch.ring`) as a ZeroDP sink uses it, on a small CPU MoE stack: exact numerics.

The reference runs with every layer's experts local. The ZeroDP run keeps only two slots for the
offloaded layers and pulls each layer's true experts from a "remote" dict through
`SlotPrefetcher`, with the streams simulated so copies run at the earliest or the latest legal
moment. Outputs must be bit-identical. Deliberately broken prefetchers show the simulators catch
missing dependencies.
"""

import collections

import pytest
import torch
import torch.nn.functional as F

from sgl_sidp.prefetch.ring import PrefetchSchedule, SimulatedStreams, SlotPrefetcher, sync_points

L, E, H, I, TOPK, T = 6, 4, 16, 4, 2, 5  # layers, experts, hidden, expert intermediate, top-k, tokens
NAMES = ("w13_weight", "w2_weight")


def make_stack(seed=0):
    """Per layer: a router [E, H] and expert weights w13 [E, 2I, H], w2 [E, H, I], distinct in every layer."""
    g = torch.Generator().manual_seed(seed)
    routers = [torch.randn(E, H, generator=g) for _ in range(L)]
    experts = {
        (lid, name): torch.randn(shape, generator=g) * 0.3
        for lid in range(L)
        for name, shape in (("w13_weight", (E, 2 * I, H)), ("w2_weight", (E, H, I)))
    }
    return routers, experts


def moe(x, router, w13, w2):
    """Top-k routed experts: softmax over the picked logits, silu(gate) * up, then down."""
    logits = x @ router.T
    top_w, top_i = logits.topk(TOPK, dim=-1)
    top_w = top_w.softmax(-1)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(TOPK):
            e = int(top_i[t, k])
            gate, up = (w13[e] @ x[t]).split(I)
            out[t] += top_w[t, k] * (w2[e] @ (F.silu(gate) * up))
    return out


def inputs(n):
    g = torch.Generator().manual_seed(1234)
    return [torch.randn(T, H, generator=g) for _ in range(n)]


def reference(routers, experts, x):
    for lid in range(L):
        x = x + moe(x, routers[lid], experts[(lid, "w13_weight")], experts[(lid, "w2_weight")])
    return x


class Sink:
    """The stack on a sink: offloaded layers read their experts from the prefetcher's slots."""

    def __init__(self, offloaded, ops, prefetcher_cls=SlotPrefetcher, fill=float("nan")):
        self.routers, remote = make_stack()
        self.schedule = PrefetchSchedule(offloaded)
        self.slots = [{n: torch.full_like(remote[(offloaded[0], n)], fill) for n in NAMES} for _ in range(2)]
        self.local = {
            lid: self.slots[self.schedule.slot_of(lid)] if lid in self.schedule else {n: remote[(lid, n)].clone() for n in NAMES}
            for lid in range(L)
        }
        self.ops = ops
        self.prefetcher = prefetcher_cls(self.schedule, remote, self.slots, ops)
        self.start, self.before, self.after = sync_points(self.prefetcher)

    def forward(self, x):
        """One forward; returns a holder filled when the compute has run (at once, except on `LaggingCompute`)."""
        holder = [x]
        launch = getattr(self.ops, "launch", lambda fn: fn())
        self.start()
        for lid in range(L):
            if lid in self.schedule:
                self.before(lid)

            def layer(lid=lid):
                w = self.local[lid]  # read at compute time: a slot holds whatever was copied in by then
                holder[0] = holder[0] + moe(holder[0], self.routers[lid], w["w13_weight"], w["w2_weight"])

            launch(layer)
            if lid in self.schedule:
                self.after(lid)
        return holder

    def run(self, xs):
        outs = [self.forward(x) for x in xs]
        self.ops.finish()
        return [o[0] for o in outs]


def matches_reference(sink, n_forwards=3):
    routers, experts = make_stack()
    xs = inputs(n_forwards)
    outs = sink.run(xs)
    return all(torch.equal(o, reference(routers, experts, x)) for o, x in zip(outs, xs))


OFFLOAD_SETS = [(1, 2, 4, 5), (0, 1, 2, 3, 4, 5), (5,), (2, 3), (0, 3, 5)]


# --------------------------------------------------------------------------- correct prefetcher
def test_stack_is_sensitive_to_wrong_weights():
    """Sanity: swapping two layers' experts changes the output, so a stale slot cannot go unnoticed."""
    routers, experts = make_stack()
    x = inputs(1)[0]
    swapped = dict(experts)
    for n in NAMES:
        swapped[(1, n)], swapped[(4, n)] = experts[(4, n)], experts[(1, n)]
    assert not torch.equal(reference(routers, experts, x), reference(routers, swapped, x))


@pytest.mark.parametrize("policy", ["earliest", "latest"])
@pytest.mark.parametrize("offloaded", OFFLOAD_SETS, ids=str)
def test_prefetcher_matches_reference_exactly(policy, offloaded):
    """Bit-identical to the all-local stack over several forwards (slot state carried across them)."""
    sink = Sink(offloaded, SimulatedStreams(policy))
    assert matches_reference(sink, n_forwards=4)
    assert sink.prefetcher.forwards_started == 4


@pytest.mark.parametrize("offloaded", OFFLOAD_SETS, ids=str)
def test_prefetcher_matches_reference_with_lagging_compute(offloaded):
    """Also exact when the compute stream lags as far as the events allow (copies race ahead)."""
    assert matches_reference(Sink(offloaded, LaggingCompute()), n_forwards=4)


def test_bytes_per_forward_and_wrap():
    """bytes_per_forward sums the offloaded layers' tensors; sync_points passes all three points through wrap."""
    sink = Sink((1, 2, 4), SimulatedStreams("earliest"))
    per_layer = (E * 2 * I * H + E * H * I) * 4
    assert sink.prefetcher.bytes_per_forward == 3 * per_layer
    wrapped = []
    fns = sync_points(sink.prefetcher, wrap=lambda f: wrapped.append(f.__name__) or f)
    assert wrapped == ["prefetch_start_forward", "prefetch_before_use", "prefetch_after_use"] and len(fns) == 3


def test_constructor_checks_slots():
    """A slot count other than the schedule's, or a slot shaped/typed unlike the remote tensor, is refused."""
    _, remote = make_stack()
    sched = PrefetchSchedule([1, 2])
    ok = [{n: torch.empty_like(remote[(1, n)]) for n in NAMES} for _ in range(2)]
    SlotPrefetcher(sched, remote, ok, SimulatedStreams("earliest"))
    with pytest.raises(ValueError, match="1 slots for a schedule of 2"):
        SlotPrefetcher(sched, remote, ok[:1], SimulatedStreams("earliest"))
    bad_shape = [dict(s) for s in ok]
    bad_shape[1]["w2_weight"] = torch.empty(E, H, I + 1)
    with pytest.raises(ValueError, match=r"layer 2 w2_weight: remote \(4, 16, 4\) torch.float32 != slot \(4, 16, 5\)"):
        SlotPrefetcher(sched, remote, bad_shape, SimulatedStreams("earliest"))
    bad_dtype = [dict(s) for s in ok]
    bad_dtype[0]["w13_weight"] = torch.empty(E, 2 * I, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="layer 1 w13_weight.*torch.bfloat16"):
        SlotPrefetcher(sched, remote, bad_dtype, SimulatedStreams("earliest"))


# --------------------------------------------------------------------------- broken prefetchers
class NoWaitBeforeExperts(SlotPrefetcher):
    """Bug: the layer's experts run without waiting for its slot to be filled."""

    def before_use(self, layer_id):
        pass


class IssueBeforeCompute(SlotPrefetcher):
    """Bug: the slot's next tenant is pulled before the layer's experts ran (overwrites a live slot)."""

    def before_use(self, layer_id):
        super().before_use(layer_id)
        nxt = self.schedule.after(layer_id)
        if nxt is not None:
            self._issue(nxt, self._events())

    def after_use(self, layer_id):
        pass


class NoFreeWait(SlotPrefetcher):
    """Bug: after a layer, the next tenant's copy is issued without recording/waiting the slot's free event."""

    def after_use(self, layer_id):
        nxt = self.schedule.after(layer_id)
        if nxt is not None:
            self._issue(nxt, self._events())


class NoForkWait(SlotPrefetcher):
    """Bug: a forward's first copies do not wait for the compute stream (the previous forward's reads)."""

    def start_forward(self):
        ev = self._events()
        for lid in self.schedule.initial:
            self._issue(lid, ev)


class ReadyOnlyAtStart(SlotPrefetcher):
    """Bug: copies issued after a layer do not record the slot's ready event (only the first ones do)."""

    def after_use(self, layer_id):
        ev = self._events()
        s = self.schedule.slot_of(layer_id)
        nxt = self.schedule.after(layer_id)
        if nxt is None:
            return
        self.ops.record(ev.free[s], self.ops.current())
        self.ops.wait(self.ops.side, ev.free[s])
        for name in self._names:
            self.ops.copy(self.slots[s][name], self.remote[(nxt, name)], self.ops.side)


def test_missing_ready_wait_caught_under_latest():
    """Skipping before_use reads unfilled slots when copies run as late as allowed (passes under earliest)."""
    assert not matches_reference(Sink((1, 2, 4, 5), SimulatedStreams("latest"), NoWaitBeforeExperts))
    assert matches_reference(Sink((1, 2, 4, 5), SimulatedStreams("earliest"), NoWaitBeforeExperts))


def test_missing_ready_record_caught_under_latest():
    """Waiting on a ready event that a copy did not re-record reads the slot's previous tenant."""
    sink = Sink((1, 2, 4, 5), SimulatedStreams("latest"), ReadyOnlyAtStart, fill=0.0)
    assert not matches_reference(sink)


def test_copy_before_compute_caught_under_earliest():
    """Pulling the next tenant before the layer computes overwrites the live slot when copies run early."""
    assert not matches_reference(Sink((1, 2, 4, 5), SimulatedStreams("earliest"), IssueBeforeCompute))
    assert matches_reference(Sink((1, 2, 4, 5), SimulatedStreams("latest"), IssueBeforeCompute))


def test_missing_free_wait_caught_with_lagging_compute():
    """Without the free event, the next tenant's copy lands before the lagging compute read the slot."""
    assert not matches_reference(Sink((1, 2, 4, 5), LaggingCompute(), NoFreeWait))


def test_missing_fork_wait_caught_with_lagging_compute():
    """Without the fork event, a forward's first copies overwrite slots the previous forward still reads."""
    assert not matches_reference(Sink((1, 2, 4, 5), LaggingCompute(), NoForkWait), n_forwards=2)


# --------------------------------------------------------------------------- SimulatedStreams itself
def test_simulated_streams_policies():
    """'latest' runs a copy only when compute waits on an event recorded after it; 'earliest' at once."""
    for policy, after_issue in (("earliest", 1.0), ("latest", 0.0)):
        ops = SimulatedStreams(policy)
        dst, ev = torch.zeros(1), ops.new_event()
        ops.copy(dst, torch.ones(1), ops.side)
        ops.record(ev, ops.side)
        assert dst.item() == after_issue, policy
        ops.wait(ops.current(), ev)
        assert dst.item() == 1.0
    with pytest.raises(ValueError):
        SimulatedStreams("sometime")


def test_simulated_streams_wait_on_completed_event_runs_nothing_more():
    """Under 'latest', waiting again on an event whose copies already ran must not run later, unrelated copies."""
    ops = SimulatedStreams("latest")
    a, b, ev = torch.zeros(1), torch.zeros(1), ops.new_event()
    ops.copy(a, torch.ones(1), ops.side)
    ops.record(ev, ops.side)
    ops.wait(ops.current(), ev)
    ops.copy(b, torch.ones(1), ops.side)  # recorded on no event yet
    ops.wait(ops.current(), ev)
    assert a.item() == 1.0 and b.item() == 0.0


def test_simulated_streams_wait_refers_to_latest_record():
    """Under 'latest', an event re-recorded on compute no longer pulls the side work of its older side record."""
    ops = SimulatedStreams("latest")
    dst, ev = torch.zeros(1), ops.new_event()
    ops.copy(dst, torch.ones(1), ops.side)
    ops.record(ev, ops.side)
    ops.record(ev, ops.current())
    ops.wait(ops.current(), ev)
    assert dst.item() == 0.0
    ops.finish()
    assert dst.item() == 1.0


def test_simulated_streams_copy_snapshots_source_at_issue():
    """A queued copy moves the source's value at issue time (the remote weights are constant anyway)."""
    ops = SimulatedStreams("latest")
    src, dst, ev = torch.ones(1), torch.zeros(1), ops.new_event()
    ops.copy(dst, src, ops.side)
    ops.record(ev, ops.side)
    src.fill_(5.0)
    ops.finish()
    assert dst.item() == 1.0


# --------------------------------------------------------------------------- a stricter stream model
class LaggingCompute:
    """Streams where compute runs as late as the events allow and side copies as early as they allow.

    Compute work is queued through `launch(fn)`; it runs only when the side stream is blocked on a
    compute event (or at `finish`). Events follow CUDA: a wait refers to the event's latest record
    at the time the wait is issued. This exposes copies that overwrite a slot the compute stream
    has not read yet (missing free/fork waits), which `SimulatedStreams` cannot, since there the
    compute runs at the moment the test calls it.
    """

    class _Event:
        def __init__(self):
            self.recorded = 0  # records issued
            self.done = 0  # records reached by their stream

    def __init__(self):
        self.compute, self.side = object(), object()
        self._q = {self.compute: collections.deque(), self.side: collections.deque()}

    def current(self):
        return self.compute

    def new_event(self):
        return self._Event()

    def capturing(self):
        return False

    def record(self, event, stream):
        event.recorded += 1
        self._q[stream].append(("record", event, event.recorded))
        self._run()

    def wait(self, stream, event):
        self._q[stream].append(("wait", event, event.recorded))
        self._run()

    def copy(self, dst, src, stream):
        assert stream is self.side
        self._q[stream].append(("copy", dst, src))
        self._run()

    def launch(self, fn):
        self._q[self.compute].append(("run", fn))
        self._run()

    def _step(self, stream):
        q = self._q[stream]
        if not q:
            return False
        op = q[0]
        if op[0] == "wait" and op[1].done < op[2]:
            return False
        if op[0] == "record":
            op[1].done = max(op[1].done, op[2])
        elif op[0] == "copy":
            op[1].copy_(op[2])
        elif op[0] == "run":
            op[1]()
        q.popleft()
        return True

    def _run(self):
        side, compute = self._q[self.side], self._q[self.compute]
        while True:
            while self._step(self.side):
                pass
            if not side:
                return  # compute stays queued as long as nothing needs it
            if not self._step(self.compute):
                if compute:
                    raise RuntimeError("deadlock: each stream waits on the other")
                return

    def finish(self):
        while self._step(self.side) or self._step(self.compute):
            pass
        if any(self._q.values()):
            raise RuntimeError("deadlock at finish")


# --------------------------------------------------------------------------- fetch order other than use order
def test_schedule_with_a_fetch_order_assigns_each_fetch_the_slot_freed_before_it():
    """Peak shifting at d = 4, rank 1 (cycles [2, 3, 0], [6, 7, 4]), 3 slots: the j-th fetch takes the slot of
    the (j - 3)-th used layer, and each use issues the next fetch in fetch order."""
    use, fetch = [0, 2, 3, 4, 6, 7], [2, 3, 0, 6, 7, 4]
    s = PrefetchSchedule(use, n_slots=3, fetch_order=fetch)
    assert s.initial == (2, 3, 0)
    assert [s.slot_of(x) for x in fetch] == [0, 1, 2, 2, 0, 1]  # 6 into 0's slot, 7 into 2's, 4 into 3's
    assert [s.after(x) for x in use] == [6, 7, 4, None, None, None]
    assert PrefetchSchedule(use, n_slots=3).slot_of(6) == 1  # forward order: j % n


def test_schedule_refuses_a_fetch_order_that_needs_more_slots():
    with pytest.raises(ValueError, match="needs more than 2 slots: layer 0 is used before"):
        PrefetchSchedule([0, 2, 3, 4, 6, 7], n_slots=2, fetch_order=[2, 3, 0, 6, 7, 4])
    with pytest.raises(ValueError, match="not a permutation"):
        PrefetchSchedule([0, 2], fetch_order=[0, 3])


@pytest.mark.parametrize("policy", ["earliest", "latest"])
def test_ring_with_a_shifted_fetch_order_is_exact(policy):
    """Every layer computes on its own weights when fetches run in another order than uses (both copy-engine extremes)."""
    use, fetch = [0, 2, 3, 4, 6, 7, 8], [2, 3, 0, 6, 7, 4, 8]
    remote = {(lid, "w"): torch.full((4,), float(lid)) for lid in use}
    ops = SimulatedStreams(policy)
    sched = PrefetchSchedule(use, n_slots=3, fetch_order=fetch)
    slots = [{"w": torch.zeros(4)} for _ in range(3)]
    pf = SlotPrefetcher(sched, remote, slots, ops)
    for _ in range(2):  # slots are reused across forwards
        pf.start_forward()
        for lid in use:
            pf.before_use(lid)
            assert torch.equal(slots[sched.slot_of(lid)]["w"], remote[(lid, "w")]), (policy, lid)
            pf.after_use(lid)
        ops.finish()


# --------------------------------------------------------------------------- measured exposed fetch time
def sampled_sink(policy, every):
    sink = Sink((1, 2, 4, 5), SimulatedStreams(policy))
    sink.prefetcher = SlotPrefetcher(sink.schedule, make_stack()[1], sink.slots, sink.ops, sample_every=every)
    sink.start, sink.before, sink.after = sync_points(sink.prefetcher)
    return sink


def test_stall_sampler_sees_waits_only_when_copies_are_late():
    """Timing events around the "slot ready" waits of one forward in `every`: with copies that run only when compute
    waits for them ("latest") every sampled forward shows the waits (one tick per copy: 4 layers x 2 tensors); with
    copies that finish as soon as they may ("earliest") none. Exactness is unchanged."""
    late, early = sampled_sink("latest", 2), sampled_sink("earliest", 2)
    assert matches_reference(late, n_forwards=5) and matches_reference(early, n_forwards=5)
    for sink in (late, early):
        sink.forward(inputs(1)[0])  # the next start reads back the last sample
    assert late.prefetcher.stalls.samples_ms == [8.0, 8.0] and late.prefetcher.stalls.mean_ms() == 8.0
    assert early.prefetcher.stalls.samples_ms == [0.0, 0.0]
    assert sampled_sink("latest", 2).prefetcher.stalls.mean_ms() is None  # nothing before the first sample


def test_no_sampling_unless_asked():
    sink = Sink((1, 2), SimulatedStreams("latest"))
    assert sink.prefetcher.stalls is None and matches_reference(sink)


def test_stall_sampler_never_touches_events_while_a_graph_is_captured():
    """SGLang's warm-up forwards are eager, then it captures: a sample pending from a warm-up must not be read back
    (`event.query()`) in the captured forward, nor may the capture sample (CUDA forbids both during a capture)."""
    sink = sampled_sink("latest", 1)
    sink.forward(inputs(1)[0])  # eager: sampled, its events pending
    stalls = sink.prefetcher.stalls
    assert stalls._pending and stalls.samples_ms == []
    touched = []
    sink.ops.capturing = lambda: True
    sink.ops.done = lambda e: touched.append(e) or True
    sink.forward(inputs(1)[0])  # captured
    assert touched == [] and stalls.samples_ms == [] and stalls._pending
    del sink.ops.capturing, sink.ops.done
    sink.forward(inputs(1)[0])  # eager again: the warm-up's sample is read back
    assert stalls.samples_ms == [8.0]


# --------------------------------------------------------------------------- graph breaks on a side stream
class _Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits {other.name}")


def _graph_break_case(on_side: bool):
    from contextlib import contextmanager

    from sgl_sidp.prefetch.ring import graph_break

    log = []
    main, side = _Stream("main", log), _Stream("side", log)
    where = [side if on_side else main]

    @contextmanager
    def on_stream(s):
        before, where[0] = where[0], s
        log.append(f"enter {s.name}")
        yield
        where[0] = before
        log.append(f"leave {s.name}")

    def sglang_break(fn):  # SGLang's eager_on_graph(True): the segment ends on the stream current at the break
        def broken(*args):
            log.append(f"segment ends on {where[0].name}")
            return fn(*args)
        return broken

    def sync(layer):
        log.append(f"sync {layer} on {where[0].name}")
        return layer

    run = graph_break(sync, sglang_break=sglang_break, capture_stream=lambda: main, current_stream=lambda: where[0],
                      on_stream=on_stream)
    assert run(3) == 3
    return log


def test_graph_break_on_the_capture_stream_runs_in_place():
    assert _graph_break_case(on_side=False) == ["segment ends on main", "sync 3 on main"]


def test_graph_break_on_a_side_stream_moves_to_the_capture_stream_and_forks_back():
    """Qwen2-MoE's experts run on an alternate stream while SGLang captures: the break must end the segment on the
    capture stream (after joining the side stream's work), and the side stream resumes after the sync."""
    assert _graph_break_case(on_side=True) == [
        "main waits side", "enter main", "segment ends on main", "sync 3 on main", "leave main", "side waits main"]
