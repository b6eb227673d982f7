"""Capacity-aware DP routing: send each replica a share of requests in proportion to its KV cache.

A ZeroDP sink holds several times the source's KV cache, so SGLang's round robin (equal shares)
leaves most of it idle. SGLang's `total_tokens` load-balance method sends each request to the
replica with the fewest tokens in use or queued (`DPBudget.dispatch`, fed from the schedulers'
load snapshots); we make it compare *fractions of capacity* instead of raw tokens, using the
`max_total_num_tokens` every snapshot already carries. Before every replica has reported, and
for any other method, SGLang's own choice stands.

These hooks run in SGLang's DP controller process. SGLang does not load plugins there, so
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


def after_update_budget(result, budget, loads, *args, **kwargs):
    """AFTER hook on `DPBudget.update_budget`: remember each replica's `max_total_num_tokens`."""
    caps = budget.__dict__.setdefault("_sidp_capacity", [0] * budget.dp_size)
    for load in loads:
        cap = int(getattr(load, "max_total_num_tokens", 0) or 0)
        if cap > 0:
            caps[load.dp_rank] = cap
    return result


def around_dispatch(original, budget, method, estimated_tokens: int = 0, *args, **kwargs):
    """AROUND hook on `DPBudget.dispatch`: capacity-normalized `total_tokens` routing."""
    from sglang.srt.managers.data_parallel_controller import LoadBalanceMethod

    caps = budget.__dict__.get("_sidp_capacity")
    if method != LoadBalanceMethod.TOTAL_TOKENS or not caps or min(caps) <= 0:
        return original(budget, method, estimated_tokens, *args, **kwargs)
    target = pick_rank(budget.total_tokens, budget.total_requests, caps, estimated_tokens)
    budget.total_requests[target] += 1
    budget.total_tokens[target] += estimated_tokens
    return target
