"""``python -m sgl_sidp.bench.dp_replay``: ``python -m sgl_sidp.replay`` that also records which DP rank served
each request, and the per-rank statistics derived from it.

SGLang 0.5.17 puts the serving replica's rank in every native ``/generate`` chunk (``meta_info.dp_rank``, from the
scheduler's output batch). The replay client (:mod:`sgl_sidp.bench.client`) does not keep it, so this module wraps
the replay, not copies it: :func:`install` makes

* the SGLang chunk parser note ``meta_info.dp_rank`` into a per-request holder (a :mod:`contextvars` variable set
  by the wrapped streaming call, which runs inside each request's own task, so concurrent requests never mix);
* the replay's streaming call copy the noted rank onto its :class:`~sgl_sidp.bench.client.RequestOutput` as
  ``dp_rank``;
* the replay's per-request row carry a ``dp_rank`` column (``requests.jsonl``; ``None`` where the server sent none:
  the OpenAI backend, a failed request, a server without DP).

Everything else (flags, timing, outputs) is :mod:`sgl_sidp.replay` unchanged.
"""

from __future__ import annotations

import contextvars
import sys
from typing import Mapping, Sequence

from sgl_sidp import replay as _replay
from sgl_sidp.bench import client as _client
from sgl_sidp.bench.metrics import summarize_ms

_HOLDER: contextvars.ContextVar[dict | None] = contextvars.ContextVar("sgl_sidp_dp_rank_holder", default=None)
_ORIGINAL: dict = {}


def dp_rank_of_chunk(data: Mapping) -> int | None:
    """The DP rank a native ``/generate`` chunk (decoded JSON) reports in ``meta_info.dp_rank``, or ``None``."""
    rank = (data.get("meta_info") or {}).get("dp_rank") if isinstance(data, Mapping) else None
    return None if rank is None else int(rank)


def _parse_sglang_chunk_noting_rank(data: dict, n_tokens: int):
    holder = _HOLDER.get()
    if holder is not None:
        rank = dp_rank_of_chunk(data)
        if rank is not None:
            holder["dp_rank"] = rank
    return _ORIGINAL["parse"](data, n_tokens)


async def _stream_request_with_rank(*args, **kwargs) -> _client.RequestOutput:
    holder: dict = {}
    token = _HOLDER.set(holder)
    try:
        out = await _ORIGINAL["stream_request"](*args, **kwargs)
    finally:
        _HOLDER.reset(token)
    out.dp_rank = holder.get("dp_rank")
    return out


def _request_row_with_rank(item, out, t0) -> dict:
    row = _ORIGINAL["request_row"](item, out, t0)
    row["dp_rank"] = getattr(out, "dp_rank", None)
    return row


def install() -> None:
    """Patch :mod:`sgl_sidp.replay` (in this process) to record ``dp_rank`` per request; idempotent."""
    if _ORIGINAL:
        return
    _ORIGINAL.update(
        parse=_client.CHUNK_PARSERS["sglang"], stream_request=_replay.stream_request, request_row=_replay._request_row
    )
    _client.CHUNK_PARSERS["sglang"] = _parse_sglang_chunk_noting_rank
    _replay.stream_request = _stream_request_with_rank
    _replay._request_row = _request_row_with_rank


def uninstall() -> None:
    """Undo :func:`install` (tests use it to leave :mod:`sgl_sidp.replay` as they found it)."""
    if not _ORIGINAL:
        return
    _client.CHUNK_PARSERS["sglang"] = _ORIGINAL["parse"]
    _replay.stream_request = _ORIGINAL["stream_request"]
    _replay._request_row = _ORIGINAL["request_row"]
    _ORIGINAL.clear()


def per_rank_stats(rows: Sequence[Mapping], duration_s: float) -> dict[int, dict]:
    """Per-DP-rank throughput and latency of one replay, from its ``requests.jsonl`` rows.

    Args:
        rows: per-request rows with ``dp_rank``, ``success``, ``output_len_received``, ``ttft_ms``, ``tpot_ms``.
        duration_s: the replay's benchmark duration (s; ``summary["duration"]``), shared by all ranks, so the
            ranks' ``output_throughput`` add up to the replay's.

    Returns:
        ``{dp_rank: {"requests", "completed", "output_tokens", "output_throughput" (tok/s), and TTFT/TPOT stats
        "{mean,median,p90,p99}_{ttft,tpot}_ms"}}`` over successful requests; ``{}`` when no row has a rank.
    """
    by_rank: dict[int, list[Mapping]] = {}
    for r in rows:
        if r.get("dp_rank") is not None:
            by_rank.setdefault(int(r["dp_rank"]), []).append(r)
    out: dict[int, dict] = {}
    for rank, rs in sorted(by_rank.items()):
        ok = [r for r in rs if r.get("success")]
        tokens = sum(int(r.get("output_len_received") or 0) for r in ok)
        ttft = summarize_ms([r["ttft_ms"] / 1000 for r in ok if r.get("ttft_ms") is not None], "ttft")
        tpot = summarize_ms([r["tpot_ms"] / 1000 for r in ok if r.get("tpot_ms") is not None], "tpot")
        stats = {k: v for k, v in {**ttft, **tpot}.items() if not k.startswith(("std_", "p95_"))}
        out[rank] = {
            "requests": len(rs),
            "completed": len(ok),
            "output_tokens": tokens,
            "output_throughput": tokens / duration_s if duration_s > 0 else 0.0,
            **stats,
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: :func:`sgl_sidp.replay.main` with :func:`install` applied (same flags, same exit status)."""
    install()
    return _replay.main(argv)


if __name__ == "__main__":
    sys.exit(main())
