"""Production request-arrival traces: loading, windowing, replay schedule and prompt reconstruction.

Three formats are understood (see ``bench_traces/README.md``):

* ``azure``: the Azure LLM inference CSVs (``TIMESTAMP,ContextTokens,GeneratedTokens``; TIMESTAMP is a naive
  datetime with 7 fractional digits).
* ``mooncake``: Mooncake JSONL (``timestamp`` in ms from trace start, ``input_length``, ``output_length``,
  ``hash_ids``: ``hash_ids[i]`` names the i-th 512-token block of the prompt, hashed with everything before it).
* ``shift``: the Shift Parallelism artifact's JSONL (``timestamp`` ms, ``input_length``, ``output_length``, no
  ``hash_ids``).

No trace carries prompt text, so prompts are rebuilt as token ids: Mooncake prompts from seeded per-hash-id blocks
(requests share exactly the blocks their ``hash_ids`` share), the others as seeded random tokens per request.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

TRACE_FORMATS = ("azure", "mooncake", "shift")
MOONCAKE_BLOCK_TOKENS = 512
DEFAULT_TOKEN_ID_RANGE = (10, 4000)
CONTEXT_OVERFLOW_POLICIES = ("skip", "truncate")

# Domain tags mixed into the seeds, so a Mooncake block and a random prompt never share a random stream.
_BLOCK_STREAM = 0
_PROMPT_STREAM = 1


@dataclass(frozen=True)
class TraceRequest:
    """One row of a trace.

    Attributes:
        index: 0-based row number in the trace file (a stable request id).
        arrival_s: arrival time in seconds since the trace's first row.
        input_len: prompt length in tokens.
        output_len: output length in tokens (the replay forces it with ``ignore_eos``).
        hash_ids: Mooncake prefix-block ids, or ``None`` for traces without them.
    """

    index: int
    arrival_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] | None = None


def detect_format(path: str | Path) -> str:
    """Guess a trace's format from its extension and first line.

    Returns:
        ``"azure"`` for CSV files, ``"mooncake"`` for JSONL whose first row has ``hash_ids``, else ``"shift"``.

    Raises:
        ValueError: the file is neither CSV nor JSON lines of the expected schema.
    """
    path = Path(path)
    with path.open() as f:
        first = f.readline().strip()
    if path.suffix.lower() == ".csv" or first.startswith("TIMESTAMP"):
        return "azure"
    try:
        row = json.loads(first)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a CSV and first line is not JSON ({e}); pass --trace-format") from e
    if not isinstance(row, dict) or not {"timestamp", "input_length", "output_length"} <= row.keys():
        raise ValueError(f"{path}: first JSON row lacks timestamp/input_length/output_length: {first[:200]}")
    return "mooncake" if "hash_ids" in row else "shift"


def _parse_azure_timestamp(text: str) -> datetime:
    # "2023-11-16 18:17:03.9799600": strptime's %f takes at most 6 digits.
    head, _, frac = text.strip().partition(".")
    return datetime.strptime(f"{head}.{(frac or '0')[:6]}", "%Y-%m-%d %H:%M:%S.%f")


def _load_azure(path: Path) -> list[TraceRequest]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return []
    stamps = [_parse_azure_timestamp(r["TIMESTAMP"]) for r in rows]
    t0 = min(stamps)
    return [
        TraceRequest(i, (t - t0).total_seconds(), int(r["ContextTokens"]), int(r["GeneratedTokens"]))
        for i, (t, r) in enumerate(zip(stamps, rows))
    ]


def _load_jsonl(path: Path, with_hash_ids: bool) -> list[TraceRequest]:
    with path.open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    t0 = min((r["timestamp"] for r in rows), default=0)
    return [
        TraceRequest(
            i,
            (r["timestamp"] - t0) / 1000.0,
            int(r["input_length"]),
            int(r["output_length"]),
            tuple(int(h) for h in r["hash_ids"]) if with_hash_ids else None,
        )
        for i, r in enumerate(rows)
    ]


def load_trace(path: str | Path, fmt: str | None = None) -> list[TraceRequest]:
    """Load a whole trace file, sorted by arrival time (ties keep file order).

    Args:
        path: the trace file.
        fmt: ``"azure"``, ``"mooncake"`` or ``"shift"``; ``None`` detects it with :func:`detect_format`.

    Returns:
        One :class:`TraceRequest` per row; ``arrival_s`` counts from the earliest row (0.0).

    Raises:
        ValueError: unknown format, or a row that does not fit the schema.
        FileNotFoundError: no such file.
    """
    path = Path(path)
    fmt = fmt or detect_format(path)
    if fmt not in TRACE_FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; expected one of {TRACE_FORMATS}")
    try:
        reqs = _load_azure(path) if fmt == "azure" else _load_jsonl(path, with_hash_ids=fmt == "mooncake")
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a valid {fmt} trace: {e!r}") from e
    return sorted(reqs, key=lambda r: (r.arrival_s, r.index))


def select_window(
    requests: Sequence[TraceRequest], start_s: float = 0.0, duration_s: float | None = None
) -> list[TraceRequest]:
    """The requests arriving in ``[start_s, start_s + duration_s)`` (trace seconds); ``duration_s=None`` means to
    the end of the trace."""
    end_s = float("inf") if duration_s is None else start_s + duration_s
    return [r for r in requests if start_s <= r.arrival_s < end_s]


def schedule_offsets(
    arrivals_s: Iterable[float], time_scale: float = 1.0, compress_gaps_s: float | None = None
) -> np.ndarray:
    """Replay send offsets, in seconds after the replay starts, for sorted trace arrival times.

    The first request is sent at offset 0. Every gap between consecutive arrivals longer than ``compress_gaps_s``
    (trace seconds) is shortened to ``compress_gaps_s``; the result is then multiplied by ``time_scale``
    (> 1 replays slower, < 1 faster).

    Returns:
        float64 array of shape ``(n,)``, non-decreasing.

    Raises:
        ValueError: ``time_scale`` <= 0, a negative ``compress_gaps_s``, or unsorted arrivals.
    """
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    if compress_gaps_s is not None and compress_gaps_s < 0:
        raise ValueError(f"compress_gaps_s must be >= 0, got {compress_gaps_s}")
    arr = np.asarray(list(arrivals_s), dtype=np.float64)
    if arr.size == 0:
        return arr
    gaps = np.diff(arr)
    if np.any(gaps < 0):
        raise ValueError("arrival times must be sorted")
    if compress_gaps_s is not None:
        gaps = np.minimum(gaps, compress_gaps_s)
    return np.concatenate([[0.0], np.cumsum(gaps)]) * time_scale


class PromptBuilder:
    """Builds a request's prompt token ids, deterministically from ``seed`` (stable across processes).

    Mooncake requests (with ``hash_ids``): each id maps to a block of 512 token ids drawn from
    ``numpy.random.default_rng([seed, 0, hash_id])`` (memoized, LRU); the prompt concatenates the blocks, the last one
    cut to ``input_len - 512 * (len(hash_ids) - 1)`` tokens. Two requests therefore share exactly the blocks their
    ``hash_ids`` share. Other requests: ``input_len`` tokens from ``default_rng([seed, 1, request.index])``.

    Token ids are uniform in ``[lo, hi)`` (``token_id_range``); the default ``(10, 4000)`` avoids special tokens and
    fits any vocabulary of at least 4,096 tokens.

    Raises (from :meth:`build`):
        ValueError: a Mooncake row whose ``input_len`` does not fit its number of blocks.
    """

    def __init__(
        self, seed: int = 0, token_id_range: tuple[int, int] = DEFAULT_TOKEN_ID_RANGE, max_blocks: int = 32768
    ):
        lo, hi = token_id_range
        if not 0 <= lo < hi:
            raise ValueError(f"token id range must satisfy 0 <= LO < HI, got {token_id_range}")
        self.seed, self.lo, self.hi = int(seed), int(lo), int(hi)
        # ~2 KiB per block: the default bound keeps the memo under 64 MiB.
        self.block = functools.lru_cache(maxsize=max_blocks)(self._make_block)

    def _make_block(self, hash_id: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, _BLOCK_STREAM, int(hash_id)])
        block = rng.integers(self.lo, self.hi, size=MOONCAKE_BLOCK_TOKENS, dtype=np.int32)
        block.setflags(write=False)
        return block

    def build(self, req: TraceRequest) -> np.ndarray:
        """Prompt token ids of ``req``: int32 array of shape ``(req.input_len,)``."""
        if req.hash_ids:
            n = len(req.hash_ids)
            last = req.input_len - MOONCAKE_BLOCK_TOKENS * (n - 1)
            if not 0 < last <= MOONCAKE_BLOCK_TOKENS:
                raise ValueError(
                    f"request {req.index}: input_length {req.input_len} does not fit {n} blocks of "
                    f"{MOONCAKE_BLOCK_TOKENS} tokens"
                )
            blocks = [self.block(h) for h in req.hash_ids]
            blocks[-1] = blocks[-1][:last]
            return np.concatenate(blocks)
        rng = np.random.default_rng([self.seed, _PROMPT_STREAM, req.index])
        return rng.integers(self.lo, self.hi, size=req.input_len, dtype=np.int32)


def fitted_prompt_len(req: TraceRequest, max_context_len: int | None, policy: str = "skip") -> int | None:
    """Prompt length to send for ``req`` under a context-length limit (``input_len + output_len`` tokens).

    Args:
        max_context_len: the limit, or ``None`` for no limit.
        policy: what to do with a request over the limit: ``"skip"`` drops it; ``"truncate"`` keeps the last
            ``max_context_len - output_len`` prompt tokens (left truncation; a Mooncake request thereby loses
            shared prefix blocks from the front), or drops it when that leaves no prompt token.

    Returns:
        ``req.input_len`` when it fits, the truncated length, or ``None`` when the request is skipped.
        Cut the prompt with ``ids[len(ids) - n:]``.

    Raises:
        ValueError: unknown policy.
    """
    if policy not in CONTEXT_OVERFLOW_POLICIES:
        raise ValueError(f"unknown context-overflow policy {policy!r}; expected one of {CONTEXT_OVERFLOW_POLICIES}")
    if max_context_len is None or req.input_len + req.output_len <= max_context_len:
        return req.input_len
    keep = max_context_len - req.output_len
    if policy == "skip" or keep < 1:
        return None
    return keep


@dataclass(frozen=True)
class PlannedRequest:
    """A request of a replay: the trace row, the prompt length to send and its target send time.

    Attributes:
        request: the trace row.
        prompt_len: prompt tokens to send (``request.input_len`` unless truncated to fit the context).
        offset_s: target send time in seconds after the replay starts.
    """

    request: TraceRequest
    prompt_len: int
    offset_s: float


@dataclass(frozen=True)
class ReplayPlan:
    """What a replay sends, and what the window held that it does not send.

    Attributes:
        items: the requests to send, in send order.
        in_window: requests arriving in the window.
        skipped_context: requests dropped by the context limit.
        truncated_context: requests whose prompt was cut to fit the context limit.
    """

    items: list[PlannedRequest]
    in_window: int
    skipped_context: int
    truncated_context: int


def plan_replay(
    requests: Sequence[TraceRequest],
    *,
    start_s: float = 0.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
    time_scale: float = 1.0,
    compress_gaps_s: float | None = None,
    max_context_len: int | None = None,
    context_overflow: str = "skip",
) -> ReplayPlan:
    """Select and schedule a replay: the window (:func:`select_window`); in arrival order, the first
    ``max_requests`` requests that the context limit (:func:`fitted_prompt_len`) keeps (the skip/truncate counts
    cover the rows looked at until then); then their send offsets (:func:`schedule_offsets`: the first at 0).

    Raises:
        ValueError: bad ``time_scale``, ``compress_gaps_s``, ``max_requests`` < 0 or overflow policy.
    """
    if max_requests is not None and max_requests < 0:
        raise ValueError(f"max_requests must be >= 0, got {max_requests}")
    window = select_window(requests, start_s, duration_s)
    kept: list[tuple[TraceRequest, int]] = []
    skipped = truncated = 0
    for req in window:
        if max_requests is not None and len(kept) >= max_requests:
            break
        n = fitted_prompt_len(req, max_context_len, context_overflow)
        if n is None:
            skipped += 1
        else:
            truncated += n < req.input_len
            kept.append((req, n))
    offsets = schedule_offsets([r.arrival_s for r, _ in kept], time_scale, compress_gaps_s)
    items = [PlannedRequest(r, n, float(t)) for (r, n), t in zip(kept, offsets)]
    return ReplayPlan(items, len(window), skipped, truncated)


def parse_replay_args(replay_args: str):
    """`python -m sgl_sidp.replay REPLAY_ARGS`'s arguments (an argparse Namespace).

    Raises:
        ValueError: one line, what the replay would refuse (a missing `--trace`, an unknown flag), instead of
            argparse's usage and exit.
    """
    import shlex

    from sgl_sidp.replay import build_parser

    parser = build_parser()

    def refuse(message: str):
        raise ValueError(f"the replay arguments {replay_args!r}: {message}")

    parser.error = refuse
    return parser.parse_args(shlex.split(replay_args))


def replay_trace_path(replay_args: str, trace_dir: str | Path | None = None) -> Path:
    """The trace file `python -m sgl_sidp.replay REPLAY_ARGS` read: its `--trace`, or the file of that name in
    `trace_dir` where one is given (a replay's results read on another host than the one that ran it).

    Raises:
        ValueError: arguments the replay would refuse (`parse_replay_args`).
    """
    return _trace_in(parse_replay_args(replay_args).trace, trace_dir)


def _trace_in(trace: Path, trace_dir: str | Path | None) -> Path:
    return Path(trace_dir) / trace.name if trace_dir else trace


def sim_requests(replay_args: str, trace_dir: str | Path | None = None) -> list:
    """The planner's requests (`sgl_sidp.plan.sim.SimRequest`) for what `python -m sgl_sidp.replay REPLAY_ARGS` sends:
    the same window, scale, gap compression, context limit and prompt lengths (`plan_replay`), arriving at their send
    offsets; `trace_dir`: where to find the trace file instead of its path in the arguments."""
    from sgl_sidp.plan.sim import SimRequest

    r = parse_replay_args(replay_args)
    p = plan_replay(load_trace(_trace_in(r.trace, trace_dir), r.trace_format), start_s=r.start_s, duration_s=r.duration_s,
                    max_requests=r.max_requests, time_scale=r.time_scale, compress_gaps_s=r.compress_gaps_s,
                    max_context_len=r.max_context_len, context_overflow=r.context_overflow)
    return [SimRequest(i.offset_s, i.prompt_len, max(1, i.request.output_len),
                       i.request.hash_ids if i.prompt_len == i.request.input_len else None) for i in p.items]


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file (trace files are checked against ``SHA256SUMS`` / the manifest with it)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def trace_stats(requests: Sequence[TraceRequest]) -> dict:
    """Rows, span (s) and prompt/output token totals of a list of requests."""
    if not requests:
        return {"rows": 0, "span_s": 0.0, "input_tokens": 0, "output_tokens": 0}
    arrivals = [r.arrival_s for r in requests]
    return {
        "rows": len(requests),
        "span_s": max(arrivals) - min(arrivals),
        "input_tokens": int(sum(r.input_len for r in requests)),
        "output_tokens": int(sum(r.output_len for r in requests)),
    }


#: (new tokens, cached tokens) of the requests `prefix_probe_rows` sends after each base prompt: a full chunk and a
#: short extension over 8K-24K of cached prefix, where the calibration's prefix probes stop at 8,192 cached for a
#: full chunk and 16,384 for a short one (`plan.calibrate.PREFIX_PROBES`, `ShardClock.prefix_line`)
PREFIX_PROBE_PAIRS = ((8192, 8192), (8192, 16384), (8192, 24576), (2048, 8192), (2048, 16384), (2048, 24576))


def prefix_probe_rows(bases: int = 2, pairs: Sequence[tuple[int, int]] = PREFIX_PROBE_PAIRS, base_gap_s: float = 8.0,
                      gap_s: float = 6.0, output_len: int = 4) -> list[dict]:
    """Mooncake-format rows (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``) of a trace that
    times prefills over a cached prefix one at a time on a served model: for each of `bases` base prompts (as long as
    the longest cached prefix of `pairs`, blocks of its own), the base, then `base_gap_s` later one request per
    (new, cached) of `pairs`, `gap_s` apart, each the base's first cached / 512 blocks followed by new / 512 blocks
    no other request has. SGLang's radix cache holds the base once it is prefilled, so each request's TTFT is one
    prefill of `new` tokens over `cached` (plus what a request spends outside forwards), and the planner simulates the
    same (`sim.RadixBlocks`). The gaps leave Qwen3-32B's TP1 on one H200 time for each prefill (predicted 6.4 s for
    the base, 5.0 s for 8,192 new tokens over 24,576 cached) before the next request comes.

    Raises:
        ValueError: a pair not a positive multiple of 512 tokens (a Mooncake block) in both terms.
    """
    block = MOONCAKE_BLOCK_TOKENS
    if any(n <= 0 or p <= 0 or n % block or p % block for n, p in pairs):
        raise ValueError(f"prefix probes {list(pairs)}: new and cached tokens must be positive multiples of {block}")
    longest = max(p for _, p in pairs) // block
    rows, t_ms, fresh = [], 0.0, longest * bases  # fresh: the next block id no request has used
    for b in range(bases):
        base = list(range(b * longest, (b + 1) * longest))
        rows.append({"timestamp": round(t_ms), "input_length": longest * block, "output_length": output_len,
                     "hash_ids": base})
        t_ms += base_gap_s * 1e3
        for new, cached in pairs:
            ids = base[:cached // block] + list(range(fresh, fresh + new // block))
            fresh += new // block
            rows.append({"timestamp": round(t_ms), "input_length": new + cached, "output_length": output_len,
                         "hash_ids": ids})
            t_ms += gap_s * 1e3
        t_ms += base_gap_s * 1e3 - gap_s * 1e3
    return rows


def write_prefix_probes(path: str | Path) -> Path:
    """Write `prefix_probe_rows`' trace (its defaults) to `path` as Mooncake JSONL; returns the path."""
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in prefix_probe_rows()))
    return path


if __name__ == "__main__":  # python -m sgl_sidp.bench.traces prefix-probes FILE
    import sys

    if sys.argv[1:2] != ["prefix-probes"] or len(sys.argv) != 3:
        sys.exit("usage: python -m sgl_sidp.bench.traces prefix-probes FILE (a Mooncake-format JSONL)")
    write_prefix_probes(sys.argv[2])
