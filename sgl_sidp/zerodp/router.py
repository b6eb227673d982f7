"""Capacity-aware DP routing: fill each replica's KV cache in proportion to its size, queue the rest by speed.

A ZeroDP sink can hold several times the source's KV cache, so SGLang's round robin (equal
shares) would leave most of it idle. SGLang's `total_tokens` load-balance method sends each
request to the replica with the fewest tokens in use or queued (`DPBudget.dispatch`, fed from the
schedulers' load snapshots); `ZeroDPRuntime.around_dispatch` makes it compare *fractions of
capacity* instead while the request fits somewhere, using the `max_total_num_tokens` every snapshot
already carries, and the time to drain each replica's tokens once it fits nowhere (`pick_rank`). Before
every replica has reported, and for any other method, SGLang's own choice stands.

Those hooks run in SGLang's DP controller process. SGLang does not load plugins there, so
`sgl_sidp.launch_server` loads them when multiprocessing's spawn re-imports it as the child's
main module (see the end of that module).
"""

from __future__ import annotations


def pick_rank(total_tokens, total_requests, capacity, estimated_tokens: int, seconds_per_token=None) -> int:
    """The DP rank a new request goes to: the least full KV cache it fits in, else the soonest drained.

    While the request fits in some replica's KV cache, it goes to the one whose cache would be least full after
    taking it (fractions of capacity: a sink holding 7x its source's KV takes 7x the tokens, and runs a 7x bigger
    decode batch). Once it fits nowhere, it queues wherever it goes, and a bigger cache no longer helps: it goes to
    the replica that would drain its tokens soonest, `(tokens + estimated) x seconds_per_token` (SGLang's own
    `total_tokens` rule where every replica is equally fast). In a burst this keeps the source busy while the sink
    still has work queued (issue 35: 106 of 128 prompts of 8,192 tokens went to a sink, 20 to its source).

    Args:
        total_tokens: tokens in use or queued per DP rank (`DPBudget.total_tokens`).
        total_requests: running + waiting requests per DP rank (tie-break).
        capacity: `max_total_num_tokens` per DP rank (> 0).
        estimated_tokens: the new request's prompt tokens.
        seconds_per_token: each rank's measured prefill time per token (`prefill_seconds_per_token`), or None
            (equal speeds) until every rank has one.
    """
    ranks = range(len(capacity))
    fits = [i for i in ranks if total_tokens[i] + estimated_tokens <= capacity[i]]
    if fits:
        return min(fits, key=lambda i: ((total_tokens[i] + estimated_tokens) / capacity[i], total_requests[i]))
    spt = seconds_per_token or [1.0] * len(capacity)
    return min(ranks, key=lambda i: ((total_tokens[i] + estimated_tokens) * spt[i], total_requests[i]))


def prefill_seconds_per_token(load) -> float | None:
    """A replica's measured prefill time per uncached prompt token (s), from the counters SGLang's scheduler puts in
    every load snapshot (`LoadSnapshot.total_prefill_busy_us` / `total_prefill_uncached_tokens`, cumulative since
    start), or None before its first prefill. A sink that pulls experts its forwards cannot hide shows it here."""
    busy_us = getattr(load, "total_prefill_busy_us", 0) or 0
    tokens = getattr(load, "total_prefill_uncached_tokens", 0) or 0
    return busy_us * 1e-6 / tokens if busy_us > 0 and tokens > 0 else None
