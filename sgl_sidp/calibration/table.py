"""A calibration: forward times and copy rates of one model on one GPU kind (pure data, no GPU)."""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import statistics
from pathlib import Path

import numpy as np


def _opt_float(v) -> float | None:
    return None if v is None else float(v)


def _interp(x: float, xs, ys) -> float:
    """`numpy.interp` at one point (clamped at the ends) without numpy's per-call cost: the planner's simulation asks
    for millions of decode steps."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1 = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


class CalibrationError(RuntimeError):
    """A calibration is missing, unreadable, or lacks the numbers a decision needs."""


#: Default decode batch sizes and the two contexts each is timed at; prefill chunk sizes (`measure` times them; they
#: are here so that `plan calibrate` reads them without importing torch, 2-6 s before its first server starts).
#: (Decode time is concave in the batch for MoE models, so the batches are spaced by 4x at most.) 384 and 512: in
#: graphs up to 512 rows where Shift captures them (`shift.feature.DECODE_GRAPH_MAX_BS`) or the user asks
#: (`--cuda-graph-max-bs-decode`); without them the planner went on along the slope of 128 and 256, and priced
#: Qwen3-8B's TP2 steps of 458-512 rows on 2 x H200 at 23.9-24.7 ms where Shift's server ran 21.7-22.0
#: (`q8_graphs512_shift_on_2gpu_h200`).
DECODE_BATCHES = (1, 4, 16, 32, 64, 128, 256, 384, 512)
DECODE_CONTEXTS = (256, 2048)
#: decode batches also timed eagerly (no CUDA graph): SGLang runs a batch larger than its largest decode graph that
#: way (on H200 below TP4 the graphs stop at 256, `ServerArgs` `cuda_graph_config.decode.max_bs`), and on 2 x H200 a
#: TP2 decode step of 512 rows took 48-77 ms eagerly where the graphs' 256 took 21 ms
EAGER_BATCHES = (256, 512)
PREFILL_TOKENS = (16, 128, 512, 2048, 4096, 8192)
#: (requests, prompt tokens each) of the prefills of several fresh prompts in one forward (`Calibration.prefill_multi_ms`):
#: chunks of SGLang's default 8,192 tokens as a burst of short prompts fills them
PREFILL_MULTI = ((2, 4096), (4, 2048), (8, 1024))


def gpu_kind(name: str) -> str:
    """"NVIDIA H200" and "H200" -> "h200": a GPU name as NVML or a hand-made table spells it, reduced to its kind
    (matches calibrations and interconnect tables to GPUs, and keys the per-kind constants)."""
    words = name.lower().replace("nvidia", "").split()
    return words[0] if words else ""


#: The rate (GB/s) at which SGLang 0.5.17's triton decode attention reads a batch's KV past `DECODE_CONTEXTS`' longer
#: context, by GPU kind (`gpu_kind` of the calibration's GPU name; other kinds: none): a row's cost per token of context
#: far past it is the time the shard's KV bytes per token take at this rate (`Calibration.decode_step_ms`). The two
#: calibrated contexts give per-row costs 1.5x apart between tables (2,100-3,170 GB/s): short contexts' rows cost more
#: or less per token than long ones do, and priced long steps from 21 % long to 16 % short. Measured on one H200, rows
#: read 2,490-3,110 GB/s at 8K-32K tokens of context once batches of 8-64 set the step (Qwen3-8B and Qwen3-32B TP1,
#: `benchmarks/results/plan/validate_1gpu_h200_long_context_2026-11-24/`; Qwen3-30B-A3B's TP2 shard,
#: `validate_1gpu_h200_long_context_moe_2026-11-29/`; Qwen3-8B's TP2 shard at 64 rows,
#: `validate_1gpu_h200_decode64_2026-11-29/`); of 2,500-2,900, 2,700 prices their 27 steps best (rms 3.6 %, -5.6 to
#: +6.6 %; 2,600: 3.7 %, 2,800: 4.0 %). Until session 41 a table's own per-row cost was taken where it was the faster
#: (rms 5.1 %, down to -15.7 % at 64 rows). Not measured on H100.
LONG_CONTEXT_KV_GBPS = {"h200": 2700.0}

#: what a start-up calibration's `source` says before the points its time budget skipped
#: (`startup.ensure_forward_times` writes it, `plan.calibrate.serve_calibrations` reports it)
BUDGET_SKIPPED = "not measured, past the time budget"


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Forward times and copy rates a cost model decides with.

    Attributes:
        model: what the numbers were measured on (`sgl_sidp.model_info.model_signature`), e.g.
            "Qwen3MoeForCausalLM L48 E128 H2048 I768 A32/4 tp1".
        gpu: GPU name, e.g. "NVIDIA H200".
        decode_ms: vanilla forward time (ms) of a decode step, by batch size.
        prefill_ms: vanilla forward time (ms) of a prefill forward, by tokens in the forward.
        copy_gbps: peer-copy rate (GB/s, 1e9 bytes/s) of an idle GPU pair; None if not measured
            (readers re-measure it at start-up anyway).
        source: where the numbers come from ("measured at start-up ...", a command and date).
        decode_context: tokens per sequence of each `decode_ms` point; missing points count as 0.
        attention_gbps: rate (GB/s) at which a decode step reads its KV cache; `decode_step_ms`
            adds the time of the context beyond a point's own. None: no correction.
        copy_slowdown_ms_per_gb: how much a decode step slows (ms) per GB copied into its GPU
            during it; None: not measured (the cost model then uses its H200 default).
        copy_rate_in_forward: fraction of the idle copy rate that copies reach while forwards run;
            None: not measured (likewise).
        sglang: SGLang version the numbers were taken with ("" if unknown).
        measure_s: seconds the start-up measurement took (0 for files made offline).
        decode_ms_long: decode times (ms) of the same batches at `decode_context_long` tokens per
            sequence; where present, `decode_step_ms` reads the context's cost per batch from the two
            points instead of from `attention_gbps` (a small batch's attention is latency-bound, far
            slower per byte than a big batch's). Empty for tables measured at one context.
        decode_context_long: tokens per sequence of every `decode_ms_long` point (0: none).
        decode_timing: how the decode points were timed: "pipelined" (forwards back to back, the host's
            preparation of a step overlapping the GPU's previous one, as SGLang's overlap scheduler runs
            them; `measure.pipelined_ms`) or "alone" (one forward with its host preparation; tables
            measured before this field existed).
        decode_ms_alone: with "pipelined", one forward alone at the `decode_context` points (ms, by
            batch): what the host adds when nothing overlaps it.
        decode_ms_eager: decode steps run eagerly, without a CUDA graph (ms, by batch, pipelined), at
            `decode_eager_context` tokens per sequence: how SGLang runs a batch larger than its largest decode
            graph (`ModelRunner._forward_raw`; on H200 256 below TP4, `ServerArgs` `cuda_graph_config.decode.max_bs`).
            Empty for tables measured before this field existed.
        decode_eager_context: tokens per sequence of the `decode_ms_eager` points.
        prefill_prefix_ms: one-request prefills of new tokens over a prefix already in the KV cache (a radix hit),
            as (new tokens, prefix tokens, ms) rows: what attention over cached tokens costs
            (`plan.calibrate.record_prefix_prefills`; `plan.steps.ShardClock.prefix_factor`). Empty for tables
            measured before this field existed.
        prefill_multi_ms: prefills of several fresh prompts in one forward, as (requests, tokens each, ms) rows
            (`PREFILL_MULTI`, `measure.time_prefill`): they set apart what grows with each prompt's square (causal
            attention) from what grows with the tokens (`plan.steps.ShardClock.prefill_fit`), which one-request
            prefills cannot. Empty for tables measured before this field existed.
        host_ms_per_request: what SGLang's scheduler spends on the host per running request per decode step
            outside the forward (ms: its batch preparation and the processing of each step's results), from a
            served eager step against the timed eager forward (`plan.calibrate.record_serving_step`). The overlap
            scheduler hides it behind a CUDA-graph forward that lasts longer, not behind an eager one, whose
            kernel launches keep the host busy (`plan.steps.StepModel`). None: not measured.
    """

    model: str
    gpu: str
    decode_ms: dict[int, float]
    prefill_ms: dict[int, float]
    copy_gbps: float | None
    source: str
    decode_context: dict[int, int] = dataclasses.field(default_factory=dict)
    attention_gbps: float | None = None
    copy_slowdown_ms_per_gb: float | None = None
    copy_rate_in_forward: float | None = None
    sglang: str = ""
    measure_s: float = 0.0
    decode_ms_long: dict[int, float] = dataclasses.field(default_factory=dict)
    decode_context_long: int = 0
    decode_timing: str = "alone"
    decode_ms_alone: dict[int, float] = dataclasses.field(default_factory=dict)
    decode_ms_eager: dict[int, float] = dataclasses.field(default_factory=dict)
    decode_eager_context: int = 0
    prefill_prefix_ms: tuple[tuple[int, int, float], ...] = ()
    host_ms_per_request: float | None = None
    prefill_multi_ms: tuple[tuple[int, int, float], ...] = ()

    # ------------------------------------------------------------------ files
    @classmethod
    def from_json(cls, d: dict) -> "Calibration":
        """Build from the JSON form (`to_json`; the bundled files use the same keys).

        Raises:
            KeyError, ValueError: a required key is missing or not a number.
        """
        return cls(
            model=d["model"],
            gpu=d["gpu"],
            decode_ms={int(k): float(v) for k, v in d["decode_ms"].items()},
            prefill_ms={int(k): float(v) for k, v in d.get("prefill_ms", {}).items()},
            copy_gbps=float(d["copy_gbps"]) if d.get("copy_gbps") else None,
            source=d.get("source", ""),
            decode_context={int(k): int(v) for k, v in d.get("decode_context", {}).items()},
            attention_gbps=float(d["attention_gbps"]) if d.get("attention_gbps") else None,
            copy_slowdown_ms_per_gb=_opt_float(d.get("copy_slowdown_ms_per_gb")),
            copy_rate_in_forward=_opt_float(d.get("copy_rate_in_forward")),
            sglang=str(d.get("sglang", "")),
            measure_s=float(d.get("measure_s", 0.0)),
            decode_ms_long={int(k): float(v) for k, v in d.get("decode_ms_long", {}).items()},
            decode_context_long=int(d.get("decode_context_long", 0)),
            decode_timing=str(d.get("decode_timing", "alone")),
            decode_ms_alone={int(k): float(v) for k, v in d.get("decode_ms_alone", {}).items()},
            decode_ms_eager={int(k): float(v) for k, v in d.get("decode_ms_eager", {}).items()},
            decode_eager_context=int(d.get("decode_eager_context", 0)),
            prefill_prefix_ms=tuple((int(n), int(p), float(ms)) for n, p, ms in d.get("prefill_prefix_ms", ())),
            host_ms_per_request=_opt_float(d.get("host_ms_per_request")),
            prefill_multi_ms=tuple((int(k), int(n), float(ms)) for k, n, ms in d.get("prefill_multi_ms", ())),
        )

    @classmethod
    def from_entry(cls, d: dict) -> "Calibration":
        """Build from a calibration file's JSON: a cache entry (`{"key", "calibration"}`, as
        `cache.CalibrationCache.put` writes it and the bundled entries are) or a plain table (`to_json`).

        Raises:
            KeyError, ValueError: as `from_json`.
        """
        return cls.from_json(d.get("calibration", d))

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        """Read a calibration JSON file: a plain table or a cache entry (`from_entry`).

        Raises:
            OSError, json.JSONDecodeError, KeyError, ValueError: unreadable or incomplete file.
        """
        return cls.from_entry(json.loads(Path(path).read_text()))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def pipelined(self, host_ms: float | None) -> "Calibration":
        """This table with decode times as SGLang's overlap scheduler runs them: itself if its decode points were
        timed pipelined; else (timed alone) every decode point less `host_ms`, the host time a forward alone adds
        (`plan.steps.host_time_alone_ms`), at least half the point; unchanged when `host_ms` is None."""
        if self.decode_timing == "pipelined" or host_ms is None:
            return self
        less = lambda t: {b: max(ms - host_ms, ms / 2) for b, ms in t.items()}  # noqa: E731
        return dataclasses.replace(self, decode_ms=less(self.decode_ms), decode_ms_long=less(self.decode_ms_long),
                                   decode_timing="pipelined",
                                   source=f"{self.source}; timed alone, less {host_ms:.2f} ms of host time per step")

    # ------------------------------------------------------------------ lookups
    def forward_ms(self, expected: "ExpectedBatch") -> float:
        """Forward time of a fixed `expected` batch ("decode:N" or "prefill:T"), interpolated linearly
        between measured points (clamped at the ends).

        Raises:
            ValueError: `expected` is not a fixed batch.
            CalibrationError: no points of that kind.
        """
        if expected.kind not in ("decode", "prefill"):
            raise ValueError(f"forward_ms takes a fixed batch (decode:N or prefill:T), not {expected}")
        table = self.decode_ms if expected.kind == "decode" else self.prefill_ms
        if not table:
            raise CalibrationError(f"calibration for {self.model} has no {expected.kind} times")
        xs = sorted(table)
        return float(np.interp(expected.size, xs, [table[x] for x in xs]))

    def decode_step_ms(self, batch: float, context: int, kv_bytes_per_token: int) -> float:
        """Modeled vanilla decode step (ms) of `batch` sequences of `context` tokens each.

        The measured time at `batch` (interpolated between batches) plus the cost of the context
        beyond the measured point's own (nothing is subtracted for shorter contexts):
        - with `decode_ms_long`, up to `decode_context_long`: the step's cost per token of context,
          measured as the difference between the two contexts at each batch, interpolated between
          batches (past the largest, each row's cost of the largest);
        - with `decode_ms_long`, past `decode_context_long`: max(s1, batch x r) per token of context
          (`_far_slope`): s1, the smallest batch's cost per token, is a latency floor (SGLang's triton
          decode kernel runs a few rows on part of the GPU: batch 1 and 4 cost the same); r, each row's
          cost where rows, not latency, set the step (batches at least twice s1), the median of those
          batches' (each is noisy: at short contexts part of the KV read hides behind the step's other
          work, or does not); on a GPU kind with a `LONG_CONTEXT_KV_GBPS`, r is the KV bytes per token read
          at that rate instead. Measured on one H200 at 8K-32K tokens of context, batch 1-64: Qwen3-8B TP1
          within -5.4 % to +5.2 % of 15 steps, Qwen3-32B TP1 within +0.2 % to +2.8 % of 5, Qwen3-30B-A3B's TP2
          shard within +1.0 % to +6.6 % of 6, Qwen3-8B's TP2 shard -5.6 % at 64 rows of 11,288 (with the
          calibration's r where it is the faster: -15.7 %; without the rate: Qwen3-32B up to +13.0 %,
          Qwen3-30B-A3B +21.4 %); extending the short contexts' per-row cost linearly, as before, -21.6 % to
          +23.7 % on Qwen3-8B (`benchmarks/results/plan/validate_1gpu_h200_long_context_2026-11-24/`,
          `..._moe_2026-11-29/`, `validate_1gpu_h200_decode64_2026-11-29/`);
        - else with `attention_gbps`: the extra KV bytes read at that rate;
        - else: the table as measured.

        Raises:
            CalibrationError: no decode points.
        """
        key = (batch, kv_bytes_per_token)
        at = self._decode_at_batch.get(key)
        if at is None:
            at = self._decode_at_batch[key] = self._decode_interpolated(batch, kv_bytes_per_token)
        ms, point_context, near, span, far = at
        extra_tokens = context - point_context
        if extra_tokens <= 0:
            return ms
        if near is not None:
            if extra_tokens <= span:
                return ms + near * extra_tokens
            return ms + near * span + far * (extra_tokens - span)
        if self.attention_gbps:
            return ms + batch * extra_tokens * kv_bytes_per_token / (self.attention_gbps * 1e9) * 1e3
        return ms

    def _decode_interpolated(self, batch: float, kv_bytes_per_token: int
                             ) -> tuple[float, float, float | None, float, float]:
        """`decode_step_ms`'s terms at `batch` rows of `kv_bytes_per_token`: (ms, the point's context, the step's cost
        per token of context up to `decode_context_long` or None without `decode_ms_long`, how many tokens past the
        point's context that is, the cost per token past it)."""
        xs, ys, ctxs, lx, slopes = self._decode_tables
        ms, point = _interp(batch, xs, ys), _interp(batch, xs, ctxs)
        if not lx:
            return ms, point, None, 0.0, 0.0
        floor, per_row = self._far_slope
        cap = self._long_context_gbps
        if cap:  # a row reads its KV at `LONG_CONTEXT_KV_GBPS` (ms per token: bytes / (GB/s x 1e6))
            per_row = kv_bytes_per_token / (cap * 1e6)
        near = _interp(batch, lx, slopes) if batch <= lx[-1] else slopes[-1] * batch / lx[-1]  # past it: per row
        return ms, point, near, max(0.0, self.decode_context_long - point), max(floor, batch * per_row)

    @functools.cached_property
    def _long_context_gbps(self) -> float | None:
        """`LONG_CONTEXT_KV_GBPS` of this calibration's GPU kind, or None."""
        return LONG_CONTEXT_KV_GBPS.get(gpu_kind(self.gpu or ""))

    @functools.cached_property
    def _far_slope(self) -> tuple[float, float]:
        """(s1, r) of `decode_step_ms`'s cost per token of context past `decode_context_long`: the smallest batch's
        step cost per token of context (ms), and the median cost per row (ms per token) of the batches whose step
        cost is at least twice s1 (if none: the largest batch's)."""
        _, _, _, lx, slopes = self._decode_tables
        floor = slopes[0]
        bound = [s / b for b, s in zip(lx, slopes) if s >= 2 * floor] or [slopes[-1] / lx[-1]]
        return floor, statistics.median(bound)

    @functools.cached_property
    def _decode_at_batch(self) -> dict[tuple[float, int], tuple[float, float, float | None, float, float]]:
        """(batch, KV bytes per token) -> `_decode_interpolated`'s terms, each computed once: the planner's simulation
        asks `decode_step_ms` for some 90,000 (batch, context) pairs over about a thousand batches of one shard (three
        interpolations each time before this memo)."""
        return {}

    @property
    def decode_batches(self) -> tuple[int, ...]:
        """The calibrated decode batch sizes, ascending.

        Raises:
            CalibrationError: no decode points.
        """
        return self._decode_tables[0]

    @functools.cached_property
    def _decode_tables(self) -> tuple:
        """`decode_step_ms`'s interpolation tables, built once: (batches, ms, each batch's context, the batches
        measured at `decode_context_long`, each of those batches' step cost per token of context, ms)."""
        if not self.decode_ms:
            raise CalibrationError(f"calibration for {self.model} has no decode times")
        xs = tuple(sorted(self.decode_ms))
        lx = tuple(sorted(self.decode_ms_long))
        slopes = tuple(max(0.0, self.decode_ms_long[b] - self.decode_ms[b])
                       / max(1, self.decode_context_long - self.decode_context.get(b, 0)) for b in lx)
        return (xs, tuple(self.decode_ms[x] for x in xs), tuple(float(self.decode_context.get(x, 0)) for x in xs),
                lx, slopes)


def compare_decode(measured: Calibration, reference: Calibration, kv_bytes_per_token: int) -> list[str]:
    """`measured`'s modelled decode step next to each of `reference`'s points, at that point's batch and context.

    Returns one line per reference point: "bs16@2052: 14.25 ms ref, 13.80 ms measured (0.97x)".
    """
    rows = []
    for bs, ref_ms in sorted(reference.decode_ms.items()):
        ctx = reference.decode_context.get(bs, 0)
        ms = measured.decode_step_ms(bs, ctx, kv_bytes_per_token)
        rows.append(f"bs{bs}@{ctx}: {ref_ms:.2f} ms ref, {ms:.2f} ms measured ({ms / ref_ms:.2f}x)")
    return rows


@dataclasses.dataclass(frozen=True)
class ExpectedBatch:
    """The load a decision is sized for.

    "decode:64": decode steps of 64 sequences; "prefill:8192": forwards of 8,192 tokens;
    "kv:2048": decode steps of as many 2,048-token sequences as the KV cache holds (a saturated,
    capacity-bound queue; see `sgl_sidp.calibration.cost.KVModel`).
    """

    kind: str
    size: int

    KINDS = ("decode", "prefill", "kv")

    @classmethod
    def parse(cls, text: str) -> "ExpectedBatch":
        """Raises: ValueError: not 'decode:N', 'prefill:N' or 'kv:N' with N >= 1."""
        kind, _, size = text.partition(":")
        if kind not in cls.KINDS or not size.isdigit() or int(size) < 1:
            raise ValueError(f"expected 'decode:N', 'prefill:N' or 'kv:N' with N >= 1, got {text!r}")
        return cls(kind, int(size))

    def __str__(self) -> str:
        return f"{self.kind}:{self.size}"
