"""The cost model: which weight copies hide behind which forwards, and what capacity they buy.

Pure Python on a `Calibration`; features (ZeroDP's offload set, SiDP's B_th, Shift's threshold)
decide with it. Tested on CPU (`tests/test_calibration.py`, `tests/test_zerodp_policy.py`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from sgl_sidp.calibration.table import Calibration

#: Used where a calibration has not measured them: measured on H200 by ZeroDP (a sink pulling 9.66 GB per
#: decode step reached 317 of its 396 GB/s idle rate, and its steps slowed 0.327 ms per GB pulled;
#: benchmarks/results/zerodp/README.md, round 2).
DEFAULT_COPY_RATE_IN_FORWARD = 0.8
DEFAULT_COPY_SLOWDOWN_MS_PER_GB = 0.327

#: Capacity-bound offloading (`best_offload_count`) must beat offloading nothing by this factor. On H200 the model
#: over-predicted the measured steady-state gain of ZeroDP's 8 offloaded layers by about 1.1x
#: (benchmarks/results/zerodp/r80_kv): smaller predicted gains are inside its error.
KV_MIN_GAIN = 1.10

#: Fraction of a forward's time that copies may fill. The rest absorbs jitter and the copy
#: engine's share of the reader's HBM bandwidth.
COPY_BUDGET_MARGIN = 0.85


def copies_that_fit(copy_ms_each: float, budget_ms: float, margin: float = COPY_BUDGET_MARGIN) -> int:
    """How many copies of `copy_ms_each` ms fit in `margin` of a `budget_ms` forward (ms, >= 0)."""
    if copy_ms_each <= 0:
        return 1 << 30
    return max(0, int(margin * budget_ms // copy_ms_each))


def hidden_fraction(copy_ms: float, forward_ms: float) -> float:
    """Fraction of `copy_ms` of copies that can hide behind a forward of `forward_ms` (1.0 = all)."""
    if copy_ms <= 0:
        return 1.0
    return min(1.0, forward_ms / copy_ms)


def spread(candidates: Sequence[int], n: int, phase: float = 0.0) -> tuple[int, ...]:
    """Pick `n` of `candidates` (in order) evenly spaced, the last one included at phase 0.

    Spacing keeps one copy in flight per stretch of compute; ending at the last layer keeps the
    first layer resident, since nothing runs before it to hide its copy. `phase` in [0, 1) shifts
    the picks by that fraction of the spacing (earlier), so readers of one owner pull different
    layers at the same point of their forwards.
    """
    L = len(candidates)
    if n <= 0:
        return ()
    if n >= L:
        return tuple(candidates)
    stride = L / n
    picks = []
    for i in range(n):
        idx = math.ceil((i + 1) * stride - 1 - phase * stride - 1e-9)
        picks.append(candidates[max(0, min(L - 1, idx))])
    return tuple(sorted(set(picks)))


@dataclasses.dataclass(frozen=True)
class KVModel:
    """Capacity-bound decode on a replica that streams `n` of its layers through a slot ring.

    A replica that serves more sequences than its KV cache holds runs decode steps of
    `batch = KV bytes / (context * kv_bytes_per_token)` sequences. Streaming n layers adds
    `(n - min(n, n_slots)) * layer_bytes` bytes of KV (the slots cost `n_slots` layers), so the
    batch grows; the step takes the longer of the modeled forward (`Calibration.decode_step_ms`,
    plus the copies' measured slowdown) and the copies themselves (at `copy_rate_in_forward` of
    the idle rate; the `DEFAULT_*` above where the calibration has not measured them).

    Assumes a queue that never drains: every step runs as many sequences as the cache holds. A
    draining batch (a finite job, light load) keeps paying the copies with fewer sequences.

    Attributes:
        vanilla_kv_bytes: bytes SGLang gives the KV cache without streaming.
        kv_bytes_per_token: KV bytes of one token over all layers of this TP rank.
        context: tokens per running sequence.
        calibration: forward times and the copies' slowdown.
        n_slots: slots of the ring (each costs one layer's bytes).
        max_batch: cap on running sequences (`--max-running-requests`), None: no cap.
    """

    vanilla_kv_bytes: float
    kv_bytes_per_token: int
    context: int
    calibration: Calibration
    n_slots: int = 2
    max_batch: int | None = None

    def batch(self, extra_kv_bytes: float) -> float:
        """Sequences of `context` tokens the KV cache holds with `extra_kv_bytes` more (>= 1)."""
        b = (self.vanilla_kv_bytes + extra_kv_bytes) / (self.context * self.kv_bytes_per_token)
        if self.max_batch:
            b = min(b, self.max_batch)
        return max(1.0, b)

    def tokens_per_s(self, n_layers: int, layer_bytes: int, copy_gbps: float) -> tuple[float, float, float]:
        """(batch, step ms, decode tokens/s) when streaming `n_layers` of `layer_bytes` each at `copy_gbps`."""
        extra = (n_layers - min(n_layers, self.n_slots)) * layer_bytes
        b = self.batch(extra)
        pulled_gb = n_layers * layer_bytes / 1e9
        compute = self.calibration.decode_step_ms(b, self.context, self.kv_bytes_per_token)
        cal = self.calibration
        slowdown = DEFAULT_COPY_SLOWDOWN_MS_PER_GB if cal.copy_slowdown_ms_per_gb is None else cal.copy_slowdown_ms_per_gb
        rate = cal.copy_rate_in_forward or DEFAULT_COPY_RATE_IN_FORWARD  # 0 would mean "never": not a measurement
        compute += slowdown * pulled_gb
        copies = pulled_gb / (copy_gbps * rate) * 1e3
        step = max(compute, copies)
        return b, step, b / step * 1e3


def best_offload_count(kv: "KVModel", n_layers: int, layer_bytes: int, copy_gbps: float,
                       min_gain: float = KV_MIN_GAIN) -> tuple[int, list[tuple[float, float, float]]]:
    """How many of `n_layers` layers of `layer_bytes` each to stream (capacity-bound decode, `KVModel`): the count
    with the most modelled tokens/s (ties: fewer), or 0 unless it beats streaming none by `min_gain`. ZeroDP's
    policy (`--zerodp-expected-batch kv:C`) and the planner decide with it.

    Returns:
        (count, rows): rows[n] is `KVModel.tokens_per_s` (batch, step ms, tokens/s) of streaming n layers.
    """
    rows = [kv.tokens_per_s(n, layer_bytes, copy_gbps) for n in range(n_layers + 1)]
    n = max(range(len(rows)), key=lambda i: (rows[i][2], -i))
    return (n if rows[n][2] >= min_gain * rows[0][2] else 0), rows


def first_lasting_win(win_ms, lose_ms, sizes) -> int | None:
    """The smallest of `sizes` (ascending) from which `win_ms(size) <= lose_ms(size)` holds at every larger size too:
    where a technique that pays a fixed cost per forward (WaS's copies) starts beating one whose cost grows with the
    forward (CaS's exchange); None when it does not hold at the largest size. The planner sets SiDP auto's B_th
    with it (`--sidp-b-th`)."""
    start = None
    for size in sizes:
        if win_ms(size) <= lose_ms(size):
            start = size if start is None else start
        else:
            start = None
    return start


def extrapolated_win(win_ms, lose_ms, sizes) -> int | None:
    """Where `win_ms` would start beating `lose_ms` beyond the largest of `sizes` (ascending, at least two): the
    crossing of the two lines through each one's times at the two largest sizes, rounded up; None when `lose_ms` does
    not grow faster there (the lines do not meet ahead). For SiDP's B_th measured on decode graphs that end before
    WaS wins: WaS's copies are a fixed cost per forward, flat until its compute outgrows them, while CaS's exchange
    adds to its compute at every row, so its line is the steeper one."""
    (a, b) = sizes[-2:]
    win_slope = (win_ms(b) - win_ms(a)) / (b - a)
    lose_slope = (lose_ms(b) - lose_ms(a)) / (b - a)
    if lose_slope <= win_slope:
        return None
    return b + max(1, math.ceil((win_ms(b) - lose_ms(b)) / (lose_slope - win_slope)))


def crossover_batch(cal: Calibration, copy_ms: float, context: int = 0, kv_bytes_per_token: int = 0,
                    margin: float = COPY_BUDGET_MARGIN) -> int | None:
    """The smallest decode batch whose modelled step hides `copy_ms` of copies in `margin` of it (SiDP's B_th).

    Args:
        cal: forward times (`Calibration.decode_step_ms`, interpolated between its batches).
        copy_ms: copies issued per forward (ms), e.g. the non-owned layers' weights at the copy rate.
        context, kv_bytes_per_token: tokens per sequence and KV bytes per token, for the step's KV reads.

    Returns:
        The batch size (1 <= b <= the largest calibrated batch), or None when even that does not hide the copies.
    """
    largest = max(cal.decode_ms, default=0)
    for b in range(1, largest + 1):
        if margin * cal.decode_step_ms(b, context, kv_bytes_per_token) >= copy_ms:
            return b
    return None


def shift_threshold(points: dict[int, tuple[float, float]]) -> float:
    """Shift Parallelism's threshold from measured forwards: the largest measured token count at which the shift
    configuration (TP = P) is faster, provided the base configuration (Ulysses SP) is no slower at every larger count.

    Args:
        points: tokens in a forward -> (shift ms, base ms), at least one point.

    Returns:
        Tokens per forward above which the base configuration runs: 0 when base wins at every measured count,
        `math.inf` when shift wins at the largest (the base configuration then never runs: it loses everywhere
        it was measured, or it does not win to the end).
    """
    import math

    counts = sorted(points)
    if points[counts[-1]][1] > points[counts[-1]][0]:
        return math.inf
    threshold = 0
    for t in counts:
        shift_ms, base_ms = points[t]
        if base_ms > shift_ms:
            threshold = t
    return threshold
