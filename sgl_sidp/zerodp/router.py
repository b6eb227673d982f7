"""Capacity-aware DP routing: send each replica a share of requests in proportion to its KV cache.

A ZeroDP sink can hold several times the source's KV cache, so SGLang's round robin (equal
shares) would leave most of it idle. SGLang's `total_tokens` load-balance method sends each
request to the replica with the fewest tokens in use or queued (`DPBudget.dispatch`, fed from the
schedulers' load snapshots); `ZeroDPRuntime.around_dispatch` makes it compare *fractions of
capacity* instead, using the `max_total_num_tokens` every snapshot already carries. Before every
replica has reported, and for any other method, SGLang's own choice stands.

Those hooks run in SGLang's DP controller process. SGLang does not load plugins there, so
`sgl_sidp.launch_server` loads them when multiprocessing's spawn re-imports it as the child's
main module (see the end of that module).
"""

from __future__ import annotations


def pick_rank(total_tokens, total_requests, capacity, estimated_tokens: int) -> int:
    """The replica whose KV cache would be least full after taking the request.

    Args:
        total_tokens: tokens in use or queued per DP rank (`DPBudget.total_tokens`).
        total_requests: running + waiting requests per DP rank (tie-break).
        capacity: `max_total_num_tokens` per DP rank (> 0).
        estimated_tokens: the new request's prompt tokens.
    """
    return min(
        range(len(capacity)),
        key=lambda i: ((total_tokens[i] + estimated_tokens) / capacity[i], total_requests[i]),
    )
