"""`calibration.measure.queued_gpu_ms` on a simulated GPU queue: a launch-bound call (the host spends longer
launching its kernels than the GPU running them) is timed at the GPU's time, as a graph would replay it, not at the
host's; a call that synchronizes inside is reported as not queued ahead; the ranks are aligned before each timed call
and sleep equally long.
"""

import pytest

from sgl_sidp.calibration.measure import QueuedTiming, largest_over, queued_gpu_ms, time_dummy_prefill
from tests.gloo_procs import spawn


class SimQueue:
    """One GPU stream and the host's clock, simulated: a kernel starts when it is launched or when the kernel before
    it ends, whichever is later; an event records when the stream reaches it; synchronize moves the host to the end
    of the queue."""

    def __init__(self):
        self.now = 0.0  # host clock, ms
        self.gpu_free = 0.0  # when the stream has run everything queued, ms
        self.slept = []

    def launch(self, gpu_ms: float, host_ms: float) -> None:
        self.now += host_ms
        self.gpu_free = max(self.now, self.gpu_free) + gpu_ms

    def sleep(self, ms: float) -> None:
        self.slept.append(ms)
        self.launch(ms, 0.0)

    def event(self) -> float:
        return max(self.now, self.gpu_free)

    def elapsed_ms(self, start: float, end: float) -> float:
        return end - start

    def synchronize(self) -> None:
        self.now = max(self.now, self.gpu_free)

    def host_ms(self) -> float:
        return self.now


def launch_bound(q: SimQueue, kernels: int = 100, gpu_ms: float = 0.1, host_ms: float = 0.4):
    """A forward of `kernels` kernels, each `gpu_ms` on the GPU and `host_ms` to launch: 4x launch-bound."""
    def run():
        for _ in range(kernels):
            q.launch(gpu_ms, host_ms)
    return run


def test_a_launch_bound_call_is_timed_at_the_gpus_time():
    """The sleep is sized by the second eager call, not the first (which may compile kernels)."""
    q = SimQueue()
    got = queued_gpu_ms(launch_bound(q), iters=3, queue=q)
    assert got.eager_ms == pytest.approx(40.1)  # the host's launches, and the last kernel
    assert got.gpu_ms == pytest.approx(10.0) and got.ahead  # 100 kernels of 0.1 ms back to back
    assert q.slept == [pytest.approx(1.5 * 40.1 + 10)] * 3  # each timed call queued behind a sleep longer than them


def test_a_gpu_bound_call_is_timed_as_it_runs():
    q = SimQueue()
    got = queued_gpu_ms(launch_bound(q, gpu_ms=0.5, host_ms=0.01), iters=2, queue=q)
    assert got.gpu_ms == pytest.approx(50.0) and got.eager_ms == pytest.approx(50.01) and got.ahead


def test_a_call_that_synchronizes_inside_is_not_ahead():
    q = SimQueue()
    forward = launch_bound(q)

    def run():
        q.synchronize()  # e.g. a .item() in the forward: the host waits for the sleep to end
        forward()

    got = queued_gpu_ms(run, iters=2, queue=q)
    assert not got.ahead and got.gpu_ms == pytest.approx(40.1)  # no better than timing it from the host


def test_prepare_runs_before_the_sleep_and_align_just_before_it():
    q = SimQueue()
    order = []
    run = launch_bound(q)
    got = queued_gpu_ms(lambda: (order.append("run"), run()), iters=2, queue=q,
                        prepare=lambda: order.append("prepare"), align=lambda: order.append(("align", len(q.slept))))
    assert order == ["prepare", "run"] * 2 + ["prepare", ("align", 0), "run", "prepare", ("align", 1), "run"]
    assert got.gpu_ms == pytest.approx(10.0)


def test_the_dummy_prefill_builds_its_batch_before_the_sleep():
    """`time_dummy_prefill` runs SGLang's `capture_prepare` and the attention metadata untimed, then times
    `_run_forward` on that batch."""
    q = SimQueue()
    calls = []

    class Backend:
        def init_forward_metadata(self, fb):
            calls.append(("metadata", fb, len(q.slept)))

    class GraphRunner:
        def capture_prepare(self, num_tokens):
            calls.append(("prepare", num_tokens, len(q.slept)))
            return f"batch{num_tokens}", Backend()

        def _run_forward(self, forward_batch, num_tokens):
            calls.append(("forward", forward_batch, len(q.slept)))
            launch_bound(q)()

    got = time_dummy_prefill(GraphRunner(), 512, iters=1, align=lambda: None, queue=q)
    assert isinstance(got, QueuedTiming) and got.gpu_ms == pytest.approx(10.0)
    assert calls == [("prepare", 512, 0), ("metadata", "batch512", 0), ("forward", "batch512", 0)] * 2 + [
        ("prepare", 512, 0), ("metadata", "batch512", 0), ("forward", "batch512", 1)]


def test_a_first_call_that_compiles_does_not_size_the_sleep():
    """A 128-token body's first eager call took 2,055 ms on H200 (kernel compiles), the next 43 ms: the sleep follows
    the second."""
    q = SimQueue()
    forward, calls = launch_bound(q), []

    def run():
        if not calls:
            q.launch(0.0, 2000.0)  # the compile, on the host
        calls.append(1)
        forward()

    got = queued_gpu_ms(run, iters=2, queue=q)
    assert got.eager_ms == pytest.approx(40.1) and q.slept == [pytest.approx(70.15)] * 2 and got.gpu_ms == pytest.approx(10.0)


def _rank_sleeps(rank, world):
    """One rank of `test_every_rank_sleeps_as_long_as_the_slowest_hosts_needs`: rank r's host launches (r + 1)x as
    slowly."""
    import torch.distributed as dist

    q = SimQueue()
    got = queued_gpu_ms(launch_bound(q, host_ms=0.4 * (rank + 1)), iters=2, queue=q,
                        agree=largest_over(dist.group.WORLD))
    return q.slept, got.gpu_ms


def test_every_rank_sleeps_as_long_as_the_slowest_hosts_needs():
    """Calls holding collectives (Shift's TP2 prefills): a rank with a shorter sleep would wait inside its first
    collective for its peer's and time that wait, so both ranks sleep the longer of their two leads."""
    out = spawn(_rank_sleeps, 2)
    longest = 1.5 * (100 * 0.8 + 0.1) + 10  # rank 1's eager call: 100 launches of 0.8 ms, then the last kernel
    for rank in (0, 1):
        slept, gpu_ms = out[rank]
        assert slept == [pytest.approx(longest)] * 2 and gpu_ms == pytest.approx(10.0)


def test_agree_sizes_the_sleep():
    q = SimQueue()
    seen = []
    queued_gpu_ms(launch_bound(q), iters=2, queue=q, agree=lambda ms: seen.append(ms) or 123.0)
    assert seen == [pytest.approx(1.5 * 40.1 + 10)] and q.slept == [123.0, 123.0]
