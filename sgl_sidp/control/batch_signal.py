"""The scheduler's batch signal: what each iteration really computes.

Later features switch modes (SiDP WaS <-> CaS, Shift SP <-> TP, the ZeroDP offload
set) on the batch the scheduler admits, after radix-cache prefix hits. This module
reads that signal off SGLang's own scheduler, once per iteration, without changing
it:

- `IterationSignal.from_plan` turns the `NextBatchPlan` returned by
  `sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run` into numbers.
- `BatchSignalObserver` aggregates them, logs one SGLang-style line every
  `log_interval` busy iterations and, with `--enable-metrics`, exports Prometheus
  metrics under SGLang's `sglang:` prefix with the scheduler's own labels.
- `BatchSignal` is the per-process runtime whose methods `on_scheduler_init` /
  `on_next_batch` are the two hook bodies (see `sgl_sidp.hooks`), registered by
  `sgl_sidp.plugin` with the plugin's per-process context; features subscribe to the
  signal through that context (`PluginContext.listeners`).

Everything here is CPU-only Python, duck-typed on SGLang's objects so the tests can
drive it with small stand-ins.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref
from typing import Any, Callable, MutableMapping, Optional

logger = logging.getLogger(__name__)

#: Batch-size buckets of the Prometheus histogram (powers of two up to SGLang's
#: largest default CUDA-graph batch).
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclasses.dataclass(frozen=True)
class IterationSignal:
    """What one scheduler iteration sends to the model.

    Attributes:
        forward_mode: SGLang `ForwardMode` name ("EXTEND", "DECODE", "MIXED", "IDLE", ...).
        batch_size: requests in the batch that runs (`ScheduleBatch.batch_size()`).
        computed_tokens: tokens the forward really computes: `extend_num_tokens` for
            prefill/mixed batches (prefix hits already subtracted), one per request for decode.
        prefix_hit_tokens: prompt tokens that this iteration's newly admitted requests
            took from the radix cache instead of computing (SGLang's `Req.cached_tokens`,
            each request counted once, as in its `meta_info["cached_tokens"]`).
        running_batch_size: requests in the scheduler's running (decode) batch.
        waiting: requests in the scheduler's waiting queue.
    """

    forward_mode: str
    batch_size: int
    computed_tokens: int
    prefix_hit_tokens: int
    running_batch_size: int
    waiting: int

    @property
    def is_prefill(self) -> bool:
        """True for iterations that compute prompt tokens (EXTEND, MIXED, ...)."""
        return self.forward_mode not in ("DECODE", "IDLE")

    @classmethod
    def from_plan(cls, plan: Any, waiting: int = 0, seen: Optional[MutableMapping] = None) -> Optional["IterationSignal"]:
        """Read the signal off a `NextBatchPlan` (`batch_to_run`, `running_batch`).

        Returns None when the scheduler runs nothing this iteration. `seen` maps each request
        of a prefill batch to the prefix-hit tokens already counted (a `WeakKeyDictionary`
        kept by the caller), so its hits count once even when its prompt is computed in
        several chunks.
        """
        seen = {} if seen is None else seen
        batch = plan.batch_to_run
        if batch is None:
            return None
        mode = batch.forward_mode
        mode_name = getattr(mode, "name", str(mode))
        bs = batch.batch_size()
        hits = 0
        if mode.is_extend():
            tokens = int(batch.extend_num_tokens or 0)
            for req in batch.reqs:
                cached = int(getattr(req, "cached_tokens", 0) or 0)
                hits += cached - seen.get(req, 0)
                seen[req] = cached
        elif mode.is_idle():
            tokens = 0
        else:
            tokens = bs
        running = plan.running_batch
        running_bs = running.batch_size() if running is not None else 0
        return cls(mode_name, bs, tokens, hits, running_bs, waiting)


class BatchSignalObserver:
    """Aggregates `IterationSignal`s; logs and exports them.

    Args:
        log_interval: busy iterations (IDLE and empty ones excluded) between two log lines.
        metric_labels: SGLang's scheduler metric labels (`SchedulerMetricsCollector.labels`);
            None disables Prometheus export (metrics off, or not this rank's job).
        registry: Prometheus registry for tests; None uses prometheus_client's default,
            which SGLang's multiprocess collector serves on `/metrics`.
        rank_name: how log lines name this scheduler (e.g. "DP1 TP0").
        listeners: callables given every recorded (non-idle) iteration's signal, e.g. a feature's
            metrics; the list is kept (not copied), so subscribers may join later.
    """

    def __init__(
        self,
        log_interval: int = 40,
        metric_labels: Optional[dict] = None,
        registry: Any = None,
        rank_name: str = "",
        listeners: Optional[list] = None,
    ):
        self.log_interval = log_interval
        self.rank_name = rank_name
        self.last: Optional[IterationSignal] = None
        self.totals = {"iterations": 0, "computed_tokens": 0, "prefix_hit_tokens": 0}
        self._window: list[IterationSignal] = []
        self._metrics = _PrometheusSignal(metric_labels, registry) if metric_labels is not None else None
        self.listeners: list[Callable[[IterationSignal], None]] = [] if listeners is None else listeners

    def record(self, sig: Optional[IterationSignal]) -> Optional[str]:
        """Account one iteration; returns the log line if this iteration closed a window."""
        if sig is None or sig.forward_mode == "IDLE":
            return None
        self.last = sig
        self.totals["iterations"] += 1
        self.totals["computed_tokens"] += sig.computed_tokens
        self.totals["prefix_hit_tokens"] += sig.prefix_hit_tokens
        if self._metrics is not None:
            self._metrics.observe(sig)
        for listener in self.listeners:
            listener(sig)
        self._window.append(sig)
        if len(self._window) < self.log_interval:
            return None
        line = self.format_window(self._window)
        self._window = []
        logger.info(line)
        return line

    def format_window(self, window: list[IterationSignal]) -> str:
        """One SGLang-style log line summarizing `window` (non-empty)."""
        n = len(window)
        prefill = sum(s.is_prefill for s in window)
        computed = sum(s.computed_tokens for s in window)
        hits = sum(s.prefix_hit_tokens for s in window)
        prompt = sum(s.computed_tokens for s in window if s.is_prefill) + hits
        last = window[-1]
        who = f"[{self.rank_name}] " if self.rank_name else ""
        return (
            f"sgl-sidp batch signal {who}over {n} iters: #prefill-iter: {prefill}, #decode-iter: {n - prefill}, "
            f"mean batch size: {sum(s.batch_size for s in window) / n:.1f}, "
            f"max batch size: {max(s.batch_size for s in window)}, #computed-token: {computed}, "
            f"#prefix-hit-token: {hits}, prefix hit rate: {hits / prompt if prompt else 0.0:.2%}, "
            f"#running-req: {last.running_batch_size}, #queue-req: {last.waiting}"
        )


class _PrometheusSignal:
    """The observer's Prometheus metrics, named and labelled like SGLang's scheduler metrics."""

    def __init__(self, labels: dict, registry: Any = None):
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        reg = REGISTRY if registry is None else registry
        names = list(labels.keys())
        kw = dict(labelnames=names, registry=reg)
        self.batch_size = Gauge(
            "sglang:sidp_batch_size", "Requests in the last batch run (sgl-sidp batch signal).",
            multiprocess_mode="mostrecent", **kw,
        ).labels(**labels)
        self.running = Gauge(
            "sglang:sidp_running_batch_size", "Requests in the running decode batch (sgl-sidp batch signal).",
            multiprocess_mode="mostrecent", **kw,
        ).labels(**labels)
        self.batch_hist = Histogram(
            "sglang:sidp_batch_size_per_iter", "Distribution of batch sizes per busy iteration.",
            buckets=BATCH_SIZE_BUCKETS, **kw,
        ).labels(**labels)
        self.iters = Counter(
            "sglang:sidp_iterations", "Busy scheduler iterations, by forward mode.",
            labelnames=names + ["forward_mode"], registry=reg,
        )
        self.computed = Counter(
            "sglang:sidp_computed_tokens", "Tokens computed by forwards (after radix-cache prefix hits).", **kw
        ).labels(**labels)
        self.hits = Counter(
            "sglang:sidp_prefix_hit_tokens", "Prompt tokens served by radix-cache prefix hits.", **kw
        ).labels(**labels)
        self._labels = labels

    def observe(self, sig: IterationSignal) -> None:
        self.batch_size.set(sig.batch_size)
        self.running.set(sig.running_batch_size)
        self.batch_hist.observe(sig.batch_size)
        self.iters.labels(**self._labels, forward_mode=sig.forward_mode).inc()
        self.computed.inc(sig.computed_tokens)
        self.hits.inc(sig.prefix_hit_tokens)


# ---------------------------------------------------------------------------- hook bodies
class BatchSignal:
    """The batch signal's per-process runtime: its methods are the hook bodies (`sgl_sidp.hooks`).

    Args:
        ctx: the plugin's per-process context (`sgl_sidp.plugin.PluginContext`): the config, the
            installed hooks' names, and the listeners features subscribed to the signal.
    """

    def __init__(self, ctx: Any):
        self.ctx = ctx
        self.observer: Optional[BatchSignalObserver] = None
        self._seen: MutableMapping = weakref.WeakKeyDictionary()  # Req -> prefix-hit tokens counted

    def on_scheduler_init(self, result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
        """AFTER hook on `Scheduler.__init__`: start observing this scheduler.

        Runs once per scheduler process, after SGLang configured its logging and its
        metrics collector, so the log line and the metric labels are SGLang's own.
        """
        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank

        from sgl_sidp.process import dp_rank

        cfg = self.ctx.config
        rank_name = f"DP{dp_rank(scheduler)} TP{get_tensor_model_parallel_rank()}"
        collector = getattr(scheduler, "metrics_collector", None)
        labels = dict(collector.labels) if collector is not None else None
        self.observer = BatchSignalObserver(cfg.signal_log_interval, labels, rank_name=rank_name,
                                            listeners=self.ctx.listeners)
        logger.info(
            "sgl-sidp plugin active in scheduler %s (pid %d): mode=%s, batch signal every %d iters, "
            "prometheus=%s, hooks applied here: %s",
            rank_name, os.getpid(), cfg.mode.value, cfg.signal_log_interval,
            "on" if labels is not None else "off", ", ".join(self.ctx.installed),
        )

    def on_next_batch(self, plan: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
        """AFTER hook on `Scheduler.get_next_batch_to_run`: record this iteration's signal."""
        if self.observer is not None:
            self.observer.record(IterationSignal.from_plan(plan, waiting=len(scheduler.waiting_queue), seen=self._seen))
