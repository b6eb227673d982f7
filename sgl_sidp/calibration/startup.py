"""Start-up calibration on a running server: measure once per key, cache, reuse (any feature's entry point).

A feature calls these from its hooks once SGLang's scheduler is built (graphs captured, nothing
served): `ensure_forward_times` on a replica that runs as vanilla SGLang (ZeroDP's source; later
SiDP's and Shift's ranks), `record_copy_rates` where a reader measured its peer copies. Both run in
every TP rank of the replica; TP rank 0 decides and writes. GPU only.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from sgl_sidp.calibration.cache import CalibrationCache, CalibrationKey, find_bundled
from sgl_sidp.calibration.measure import describe_measurement, kv_bytes_per_token, measure_forwards
from sgl_sidp.calibration.table import BUDGET_SKIPPED, Calibration, compare_decode

logger = logging.getLogger(__name__)


def calibration_key(runner) -> CalibrationKey:
    """The `CalibrationKey` of an SGLang `ModelRunner` (GPU, model shapes, dtype, quantization, attention, SGLang)."""
    import sglang
    from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_world_size

    from sgl_sidp.model_info import model_signature

    sa = runner.server_args
    return CalibrationKey(
        gpu=torch.cuda.get_device_name(torch.cuda.current_device()),
        model=model_signature(runner.model_config.hf_config.to_dict(), get_tensor_model_parallel_world_size()),
        dtype=str(runner.model_config.dtype),
        quantization=str(sa.quantization or ""),
        attention_backend=str(sa.attention_backend or ""),
        sglang=sglang.__version__,
    )


def ensure_forward_times(scheduler, who: str, cache: CalibrationCache | None = None) -> Calibration | None:
    """Measure this replica's forward times unless they are cached for its key, and cache them.

    Every TP rank must call it (the forwards hold TP collectives); TP rank 0 decides whether to
    measure and writes the cache, and logs the result next to a bundled table for the same key.

    Args:
        scheduler: a built SGLang `Scheduler` (after `__init__`: KV pool, CUDA graphs).
        who: how log lines name this process (e.g. "zerodp source DP0 TP0").

    Returns:
        The calibration measured now, or None when the cache already had one.

    Raises:
        whatever the measurement raises (an SGLang forward failing on this server).
    """
    from sglang.srt.distributed.parallel_state import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
        get_tp_group,
    )

    runner = scheduler.tp_worker.model_runner
    key = calibration_key(runner)
    cache = cache or CalibrationCache()
    tp0 = get_tensor_model_parallel_rank() == 0
    cached = cache.get(key)
    missing = cached is None
    if get_tensor_model_parallel_world_size() > 1:
        missing = get_tp_group().broadcast_object(missing if tp0 else None, src=0)
    if not missing:
        if tp0 and cached is not None:
            logger.info("sgl-sidp %s: start-up calibration read from the cache %s (%s, %.1f s then); not measured again",
                        who, cache.path(key), cached.source, cached.measure_s)
        return None
    m = measure_forwards(scheduler, who=who)
    cal = Calibration(
        model=key.model, gpu=key.gpu, decode_ms=m["decode_ms"], prefill_ms=m["prefill_ms"], copy_gbps=None,
        source=f"measured at start-up by {who} ({time.strftime('%Y-%m-%d')}, "
        f"{'CUDA graphs' if m['graph'] else 'eager'}, {key.attention_backend} attention)"
        + (f"; {BUDGET_SKIPPED}: {', '.join(m['skipped'])}" if m.get("skipped") else ""),
        decode_context=m["decode_context"], attention_gbps=m["attention_gbps"], sglang=key.sglang,
        measure_s=round(m["seconds"], 2), decode_ms_long=m["decode_ms_long"],
        decode_context_long=m["decode_context_long"], decode_timing="pipelined",
        decode_ms_alone=m["decode_ms_alone"], decode_ms_eager=m["decode_ms_eager"],
        decode_eager_context=m["decode_eager_context"], prefill_multi_ms=tuple(m.get("prefill_multi_ms", ())),
    )
    if tp0:
        path = cache.put(key, cal)
        logger.info("sgl-sidp %s: start-up calibration (cached in %s): %s", who, path, describe_measurement(m))
        if m.get("skipped"):
            logger.warning("sgl-sidp %s: start-up calibration stopped at its time budget; not measured: %s", who,
                           ", ".join(m["skipped"]))
        bundled = find_bundled(key.model, key.gpu)
        if bundled is not None:
            rows = compare_decode(cal, Calibration.load(bundled), kv_bytes_per_token(runner))
            logger.info("sgl-sidp %s: start-up calibration vs bundled %s (decode step at the bundled point's batch and "
                        "context): %s", who, bundled.name, "; ".join(rows))
    return cal


class StartupCalibration:
    """Runtime of `--overlay-calibrate` (`sgl_sidp.hooks`): DP rank 0 measures its forward times once its
    scheduler is built, unless cached (`ensure_forward_times`); other DP replicas are the same model
    on the same GPU kind and measure nothing."""

    def __init__(self, ctx):
        self.ctx = ctx

    def on_scheduler_init(self, result, scheduler, *args, **kwargs):
        """AFTER `Scheduler.__init__` (every TP rank of DP rank 0 runs the forwards: they hold TP collectives)."""
        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank

        from sgl_sidp.process import dp_rank

        if dp_rank(scheduler) == 0:
            ensure_forward_times(scheduler, f"DP0 TP{get_tensor_model_parallel_rank()}")
        return result


def record_copy_rates(key: CalibrationKey, probe: dict, cache: CalibrationCache | None = None) -> bool:
    """Add a reader's measured copy rates (`measure.time_copy_during_forward`) to its key's cached entry.

    Only an entry without copy rates is completed (the first clean measurement stays); returns
    whether it was written. Call it from TP rank 0 only, with `calibration_key(runner)`.
    """
    cache = cache or CalibrationCache()
    cal = cache.get(key)
    if cal is None or cal.copy_gbps is not None:
        return False
    cache.put(key, dataclasses.replace(
        cal, copy_gbps=round(probe["copy_gbps_idle"], 1),
        copy_rate_in_forward=round(probe["copy_gbps_in_forward"] / probe["copy_gbps_idle"], 3),
        copy_slowdown_ms_per_gb=round(probe["slowdown_ms_per_gb"], 3)))
    return True
