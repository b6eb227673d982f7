"""The scheduler batch signal, driven with small stand-ins for SGLang's batch objects."""

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

import weakref

from sgl_sidp.control.batch_signal import BatchSignal, BatchSignalObserver, IterationSignal


class Mode:
    def __init__(self, name):
        self.name = name

    def is_extend(self):
        return self.name in ("EXTEND", "MIXED")

    def is_idle(self):
        return self.name == "IDLE"


class Batch:
    def __init__(self, mode, reqs, extend_num_tokens=None):
        self.forward_mode, self.reqs, self.extend_num_tokens = Mode(mode), reqs, extend_num_tokens

    def batch_size(self):
        return len(self.reqs)


class Req:
    """Like SGLang's `Req`: hashable by identity, weak-referenceable."""

    def __init__(self, cached):
        self.cached_tokens = cached


def req(cached=0):
    return Req(cached)


def plan(batch, running=None):
    return SimpleNamespace(batch_to_run=batch, running_batch=running)


def test_prefill_counts_computed_and_prefix_hit_tokens():
    r1, r2 = req(cached=512), req(cached=0)
    sig = IterationSignal.from_plan(plan(Batch("EXTEND", [r1, r2], extend_num_tokens=900), Batch("DECODE", [req()] * 3)), waiting=4)
    assert sig == IterationSignal("EXTEND", 2, 900, 512, 3, 4)
    assert sig.is_prefill


def test_chunked_prefill_counts_prefix_hits_once():
    r, seen = req(cached=1024), weakref.WeakKeyDictionary()
    first = IterationSignal.from_plan(plan(Batch("EXTEND", [r], extend_num_tokens=2048)), seen=seen)
    second = IterationSignal.from_plan(plan(Batch("EXTEND", [r], extend_num_tokens=2048)), seen=seen)
    assert (first.prefix_hit_tokens, second.prefix_hit_tokens) == (1024, 0)
    assert not any("sidp" in a for a in vars(r))  # nothing pinned on SGLang's request
    del r
    assert len(seen) == 0  # a finished request is forgotten


def test_decode_idle_and_empty():
    assert IterationSignal.from_plan(plan(Batch("DECODE", [req()] * 5))).computed_tokens == 5
    assert IterationSignal.from_plan(plan(Batch("IDLE", []))).computed_tokens == 0
    assert IterationSignal.from_plan(plan(None)) is None


def test_observer_logs_every_interval_and_skips_idle(caplog):
    obs = BatchSignalObserver(log_interval=3, rank_name="DP1 TP0")
    sigs = [IterationSignal("EXTEND", 2, 1000, 500, 0, 1), IterationSignal("IDLE", 0, 0, 0, 0, 0),
            IterationSignal("DECODE", 2, 2, 0, 2, 0), IterationSignal("DECODE", 4, 4, 0, 4, 0)]
    with caplog.at_level("INFO", logger="sgl_sidp.control.batch_signal"):
        lines = [obs.record(s) for s in sigs]
    assert lines[:3] == [None, None, None]
    assert lines[3] == (
        "sgl-sidp batch signal [DP1 TP0] over 3 iters: #prefill-iter: 1, #decode-iter: 2, mean batch size: 2.7, "
        "max batch size: 4, #computed-token: 1006, #prefix-hit-token: 500, prefix hit rate: 33.33%, "
        "#running-req: 4, #queue-req: 0"
    )
    assert lines[3] in caplog.text
    assert obs.totals == {"iterations": 3, "computed_tokens": 1006, "prefix_hit_tokens": 500}


def test_prometheus_metrics_use_sglang_labels():
    reg = CollectorRegistry()
    labels = {"model_name": "m", "tp_rank": 0, "dp_rank": 1}
    obs = BatchSignalObserver(log_interval=100, metric_labels=labels, registry=reg)
    obs.record(IterationSignal("EXTEND", 3, 700, 300, 0, 0))
    obs.record(IterationSignal("DECODE", 3, 3, 0, 3, 0))
    lab = {"model_name": "m", "tp_rank": "0", "dp_rank": "1"}
    assert reg.get_sample_value("sglang:sidp_computed_tokens_total", lab) == 703
    assert reg.get_sample_value("sglang:sidp_prefix_hit_tokens_total", lab) == 300
    assert reg.get_sample_value("sglang:sidp_batch_size", lab) == 3
    assert reg.get_sample_value("sglang:sidp_iterations_total", {**lab, "forward_mode": "DECODE"}) == 1
    assert reg.get_sample_value("sglang:sidp_batch_size_per_iter_count", lab) == 2


def test_runtime_observes_scheduler_and_feeds_listeners(monkeypatch):
    """The hook bodies get their state from the runtime they were registered with, and features' listeners
    (subscribed through the shared context, before or after the scheduler starts) see every busy iteration."""
    from sglang.srt.distributed import parallel_state

    from sgl_sidp.config import SidpConfig
    from sgl_sidp.plugin import PluginContext

    # SGLang's TP group (the TP rank); the scheduler's `ps` gives the DP rank only
    monkeypatch.setattr(parallel_state, "get_tp_group", lambda: SimpleNamespace(rank_in_group=0, world_size=1))

    ctx = PluginContext(SidpConfig(batch_signal=True, signal_log_interval=100), ["Scheduler.__init__"])
    early = []
    ctx.listeners.append(early.append)
    rt = BatchSignal(ctx)
    sched = SimpleNamespace(ps=SimpleNamespace(dp_rank=1), metrics_collector=None, waiting_queue=[1, 2])
    rt.on_next_batch(plan(Batch("DECODE", [req()])), sched)  # before __init__ finished: nothing to record into
    rt.on_scheduler_init(None, sched)
    late = []
    ctx.listeners.append(late.append)
    rt.on_next_batch(plan(Batch("DECODE", [req()])), sched, running_batch=None, last_batch=None)
    assert rt.observer.last.waiting == 2 and rt.observer.last.batch_size == 1 and rt.observer.rank_name == "DP1 TP0"
    assert len(early) == len(late) == 1
    assert not any("sidp" in a for a in vars(sched))
