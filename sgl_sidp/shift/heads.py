"""Which attention heads each GPU holds in Shift Parallelism's two configurations, and the order that makes them agree.

Shift Parallelism (Hidayetoglu et al., Snowflake; code snowflakedb/ArcticInference) runs P = SP * TP GPUs either in
a **base** configuration (Ulysses sequence parallelism over SP, tensor parallelism over TP) or in a **shift**
configuration (TP = P), per forward, on one KV cache. That works only if every GPU holds the same heads, in the
same order, in both (KV-cache invariance):

- shift (TP = P, SGLang's contiguous TP sharding): shift rank g holds query heads [g h/P, (g+1) h/P);
- base: TP rank t holds the query-head block [t h/TP, (t+1) h/TP) (its weights), and the Ulysses all-to-all gives
  SP rank s the s-th of SP equal parts of it: heads [(t SP + s) h/P, (t SP + s + 1) h/P).

So GPU (sp = s, tp = t) must be shift rank **t * SP + s** (ArcticInference's "head-order trick"); GPUs numbered
with TP fastest (`gpu = s * TP + t`, SGLang's layout) are not in that order when SP and TP are both > 1.

GQA: query head j reads KV head j // (h / kvh). When a configuration spreads the query heads over more GPUs than
there are KV heads, KV heads are replicated (SGLang does the same for TP > kvh), and each GPU stores exactly the KV
heads its query heads read: the same set in both configurations, since the query heads are.

Pure Python, no torch.
"""

from __future__ import annotations


class HeadLayoutError(ValueError):
    """A (SP, TP, heads) combination Shift Parallelism cannot lay out."""


def check_layout(sp: int, tp: int, n_heads: int, n_kv_heads: int) -> None:
    """Raise `HeadLayoutError` unless P = sp * tp divides the query heads and KV heads split or replicate evenly."""
    p = sp * tp
    if sp < 1 or tp < 1:
        raise HeadLayoutError(f"SP and TP must be >= 1, got SP={sp}, TP={tp}")
    if n_heads % p:
        raise HeadLayoutError(f"{n_heads} attention heads do not split over SP*TP = {p} GPUs")
    if n_heads % n_kv_heads:
        raise HeadLayoutError(f"{n_heads} query heads are not a multiple of {n_kv_heads} KV heads")
    if n_kv_heads % p and p % n_kv_heads:
        raise HeadLayoutError(f"{n_kv_heads} KV heads neither split over nor replicate evenly onto {p} GPUs")


def shift_rank(sp_rank: int, tp_rank: int, sp: int) -> int:
    """The rank in the shift (TP = P) group of the GPU that is (sp_rank, tp_rank) in the base configuration."""
    return tp_rank * sp + sp_rank


def shift_q_heads(rank: int, p: int, n_heads: int) -> list[int]:
    """Query heads of shift rank `rank` among `p` (TP = P; SGLang's contiguous sharding)."""
    k = n_heads // p
    return list(range(rank * k, (rank + 1) * k))


def base_q_heads(sp_rank: int, tp_rank: int, sp: int, tp: int, n_heads: int) -> list[int]:
    """Query heads the Ulysses all-to-all leaves on GPU (sp_rank, tp_rank): part `sp_rank` of TP rank `tp_rank`'s block."""
    block = n_heads // tp
    part = block // sp
    start = tp_rank * block + sp_rank * part
    return list(range(start, start + part))


def kv_heads_of(q_heads: list[int], n_heads: int, n_kv_heads: int) -> list[int]:
    """The KV heads `q_heads` read (GQA: query head j reads KV head j // (n_heads / n_kv_heads)), in order."""
    group = n_heads // n_kv_heads
    return sorted({j // group for j in q_heads})


def shift_group_order(sp: int, tp: int) -> list[int]:
    """Base-layout GPU indices (TP fastest: `gpu = sp_rank * tp + tp_rank`) listed in shift-rank order.

    Entry g is the GPU that must be rank g of the shift group, e.g. SP=3, TP=2 -> [0, 2, 4, 1, 3, 5].
    """
    order = [0] * (sp * tp)
    for s in range(sp):
        for t in range(tp):
            order[shift_rank(s, t, sp)] = s * tp + t
    return order


def gathered_order(group_ranks: list[int]) -> list[int]:
    """How to reorder an all-gather over a group given in shift order into shift order.

    `torch.distributed.new_group` (and so NCCL and SGLang's `PyNcclCommunicator`, which use
    `dist.get_rank(group)`) numbers a group's members by ascending global rank, whatever order
    the caller listed them in; an all-gather returns chunks in that order. `group_ranks[g]` is the
    global rank of shift rank g. Returns `perm` such that `chunks[perm[g]]` is shift rank g's chunk.
    """
    by_global = sorted(group_ranks)
    return [by_global.index(r) for r in group_ranks]
