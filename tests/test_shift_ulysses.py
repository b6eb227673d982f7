"""Shift Parallelism's CPU-checkable core: the KV-invariant head order, Ulysses attention on gloo against plain
attention (GQA, KV replication, token padding), and all-gathers over the shift group put back in shift order."""

import pytest
import torch
import torch.distributed as dist

from sgl_sidp.shift.heads import (HeadLayoutError, base_q_heads, check_layout, gathered_order, kv_heads_of,
                                  shift_group_order, shift_q_heads, shift_rank)
from sgl_sidp.shift.ulysses import UlyssesLayout, output_all_to_all, pad_to_sp, qkv_all_to_all
from tests.gloo_procs import spawn


def factorizations(p):
    return [(sp, p // sp) for sp in range(1, p + 1) if p % sp == 0]


# --------------------------------------------------------------------------- head order (pure)
@pytest.mark.parametrize("p", [2, 4, 6, 8])
def test_base_and_shift_put_the_same_heads_on_every_gpu(p):
    """For every (SP, TP) with SP * TP = P and every GQA shape that lays out: GPU (s, t) holds the same query
    heads and reads the same KV heads in the base configuration as shift rank t * SP + s in TP = P."""
    for n_heads, n_kv in [(48, 48), (48, 8), (48, 2), (48, 6), (24, 1), (96, 12)]:
        for sp, tp in factorizations(p):
            try:
                check_layout(sp, tp, n_heads, n_kv)
            except HeadLayoutError:
                continue
            for s in range(sp):
                for t in range(tp):
                    g = shift_rank(s, t, sp)
                    base, shift = base_q_heads(s, t, sp, tp, n_heads), shift_q_heads(g, p, n_heads)
                    assert base == shift, (n_heads, n_kv, sp, tp, s, t)
                    assert kv_heads_of(base, n_heads, n_kv) == kv_heads_of(shift, n_heads, n_kv)


def test_natural_gpu_order_is_not_the_shift_order_when_both_sp_and_tp_exceed_one():
    assert shift_group_order(3, 2) == [0, 2, 4, 1, 3, 5]
    assert shift_group_order(2, 4) == [0, 4, 1, 5, 2, 6, 3, 7]
    assert shift_group_order(8, 1) == list(range(8)) and shift_group_order(1, 8) == list(range(8))


def test_layouts_that_cannot_work_are_refused():
    with pytest.raises(HeadLayoutError, match="40 attention heads do not split over SP\\*TP = 6"):
        check_layout(3, 2, 40, 8)
    with pytest.raises(HeadLayoutError, match="6 KV heads neither split over nor replicate evenly onto 4"):
        check_layout(2, 2, 24, 6)
    check_layout(4, 2, 64, 8)  # Qwen3-32B on 8 GPUs


def test_padding_to_sp():
    assert [pad_to_sp(n, 3) for n in (1, 3, 4, 7, 9)] == [3, 3, 6, 9, 9]
    assert pad_to_sp(0, 2) == 2  # every rank has a row


def test_gathered_order_undoes_ascending_group_ranks():
    ranks = shift_group_order(3, 2)  # shift rank g lives on global rank ranks[g]
    chunks = [f"from {r}" for r in sorted(ranks)]  # what an all-gather returns
    perm = gathered_order(ranks)
    assert [chunks[perm[g]] for g in range(6)] == [f"from {r}" for r in ranks]


# --------------------------------------------------------------------------- gloo, several processes
HIDDEN, D = 16, 4


def plain_attention(q, k, v, n_heads, n_kv):
    """Causal attention of every query head over all tokens (q [N, h, d], k/v [N, kvh, d]), GQA by repetition."""
    group = n_heads // n_kv
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = torch.einsum("nhd,mhd->hnm", q, k) / D ** 0.5
    n = q.shape[0]
    s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    return torch.einsum("hnm,mhd->nhd", s.softmax(-1), v)


def projections(n_tokens, n_heads, n_kv):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n_tokens, HIDDEN, generator=g, dtype=torch.float64)
    wq, wk, wv = (torch.randn(HIDDEN, h * D, generator=g, dtype=torch.float64) for h in (n_heads, n_kv, n_kv))
    return x, wq, wk, wv


def _ulysses_rank(rank, world, sp, tp, n_tokens, n_heads, n_kv):
    s, t = divmod(rank, tp)  # TP fastest, as SGLang numbers GPUs
    groups = {tt: dist.new_group([ss * tp + tt for ss in range(sp)]) for tt in range(tp)}  # every rank makes every group
    layout = UlyssesLayout(sp, tp, t, n_heads, n_kv)
    x, wq, wk, wv = projections(n_tokens, n_heads, n_kv)
    n_pad = pad_to_sp(n_tokens, sp)
    n = n_pad // sp
    xp = torch.cat([x, x.new_zeros(n_pad - n_tokens, HIDDEN)])[s * n:(s + 1) * n]  # this rank's tokens (padded)
    q = (xp @ wq).view(n, n_heads, D)[:, layout.q_local]
    k = (xp @ wk).view(n, n_kv, D)[:, layout.kv_local]
    v = (xp @ wv).view(n, n_kv, D)[:, layout.kv_local]
    qf, kf, vf = qkv_all_to_all(q, k, v, layout, s, group=groups[t])
    kv_idx = torch.tensor(layout.q_to_kv[s])
    o = plain_attention(qf, kf[:, kv_idx], vf[:, kv_idx], qf.shape[1], qf.shape[1])  # each head with its KV head
    back = output_all_to_all(o, layout, group=groups[t])
    want = plain_attention((x @ wq).view(-1, n_heads, D), (x @ wk).view(-1, n_kv, D), (x @ wv).view(-1, n_kv, D),
                           n_heads, n_kv)[:, layout.q_local]
    real = max(0, min(n, n_tokens - s * n))
    return (back[:real] - want[s * n:s * n + real]).abs().max().item() if real else 0.0, back.shape[1], real


@pytest.mark.parametrize("sp,tp,n_tokens,n_heads,n_kv", [
    (2, 1, 7, 8, 2),   # GQA, padding
    (4, 1, 9, 8, 2),   # fewer KV heads than SP ranks: replicated in the all-to-all
    (3, 1, 5, 6, 6),   # MHA, SP = 3
    (2, 2, 6, 8, 2),   # TP = 2 with SP = 2: one KV head per TP rank, shared by both SP parts
])
def test_ulysses_attention_equals_plain_attention(sp, tp, n_tokens, n_heads, n_kv):
    out = spawn(_ulysses_rank, sp * tp, sp, tp, n_tokens, n_heads, n_kv)
    for rank, (err, heads, real) in out.items():
        assert err < 1e-12, (rank, err)
        assert heads == n_heads // tp
    assert sum(real for _, _, real in out.values()) == n_tokens * tp  # every real token came back once per TP rank


def _logits_rank(rank, world, sp, tp, vocab):
    ranks = shift_group_order(sp, tp)
    group = dist.new_group(ranks)  # listed in shift order; numbered by ascending global rank
    g = ranks.index(rank)  # this GPU's shift rank
    full = torch.arange(3 * vocab, dtype=torch.float64).view(3, vocab)
    shard = vocab // world
    mine = full[:, g * shard:(g + 1) * shard].contiguous()
    chunks = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(chunks, mine, group=group)
    perm = gathered_order(ranks)
    fixed = torch.cat([chunks[perm[i]] for i in range(world)], dim=1)
    naive = torch.cat(chunks, dim=1)
    return bool(torch.equal(fixed, full)), bool(torch.equal(naive, full))


def test_gathered_logits_come_back_in_vocab_order():
    """SP = 3, TP = 2: the shift group's members in shift order are global ranks [0, 2, 4, 1, 3, 5]; an all-gather
    over it returns chunks by ascending global rank, so the vocab shards need `gathered_order` to line up."""
    out = spawn(_logits_rank, 6, 3, 2, 24)
    assert all(fixed for fixed, _ in out.values())
    assert not any(naive for _, naive in out.values())


# --------------------------------------------------------------------------- shift shards as views (no copy)
@pytest.mark.parametrize("sp,tp,n_heads,n_kv", [(2, 1, 8, 2), (4, 1, 8, 2), (2, 2, 8, 2), (2, 2, 8, 8), (3, 2, 12, 6)])
def test_shift_shards_are_views_of_base_shards_and_compute_like_tp_p(sp, tp, n_heads, n_kv):
    """Every GPU's TP = P shard of QKV, gate|up, O and down, taken as views of its base TP shard, reads the base
    storage (no copy) and holds exactly the rows/columns TP = P sharding of the full weights gives shift rank t*SP+s."""
    from sgl_sidp.shift.views import column_parts, row_part, shares_storage

    d, hidden, inter = 4, 16, 24 * sp * tp
    p = sp * tp
    g = torch.Generator().manual_seed(3)
    wq, wk, wv = (torch.randn(h * d, hidden, generator=g) for h in (n_heads, n_kv, n_kv))
    wo = torch.randn(hidden, n_heads * d, generator=g)
    wg, wu = torch.randn(inter, hidden, generator=g), torch.randn(inter, hidden, generator=g)
    wd = torch.randn(hidden, inter, generator=g)
    rows = lambda w, heads: torch.cat([w[h * d:(h + 1) * d] for h in heads])  # noqa: E731
    for t in range(tp):
        layout = UlyssesLayout(sp, tp, t, n_heads, n_kv)
        qkv = torch.cat([rows(wq, layout.q_local), rows(wk, layout.kv_local), rows(wv, layout.kv_local)])
        it = inter // tp
        gate_up = torch.cat([wg[t * it:(t + 1) * it], wu[t * it:(t + 1) * it]])
        o_t, down_t = wo[:, t * len(layout.q_local) * d:(t + 1) * len(layout.q_local) * d], wd[:, t * it:(t + 1) * it]
        nq, nkv = len(layout.q_local) * d, len(layout.kv_local) * d
        for s in range(sp):
            rank = shift_rank(s, t, sp)
            q_heads = shift_q_heads(rank, p, n_heads)
            kv_units = layout.kv_part[s]
            views = column_parts(qkv, [nq, nkv, nkv], s, sp, unit_rows=[d, d, d], units=[None, kv_units, kv_units])
            gu = column_parts(gate_up, [it, it], s, sp)
            o, dn = row_part(o_t, s, sp), row_part(down_t, s, sp)
            assert all(shares_storage(v, qkv) for v in views) and all(shares_storage(v, gate_up) for v in gu)
            assert shares_storage(o, wo) and shares_storage(dn, wd)
            kv_heads = kv_heads_of(q_heads, n_heads, n_kv)
            assert torch.equal(views[0], rows(wq, q_heads))
            assert torch.equal(views[1], rows(wk, kv_heads)) and torch.equal(views[2], rows(wv, kv_heads))
            ip = inter // p
            assert torch.equal(gu[0], wg[rank * ip:(rank + 1) * ip]) and torch.equal(gu[1], wu[rank * ip:(rank + 1) * ip])
            assert torch.equal(o, wo[:, q_heads[0] * d:(q_heads[-1] + 1) * d])
            assert torch.equal(dn, wd[:, rank * ip:(rank + 1) * ip])
            y = torch.randn(5, ip, generator=g)
            assert torch.equal(y @ dn.T, y @ wd[:, rank * ip:(rank + 1) * ip].contiguous().T)  # the strided view as is


def test_views_refuse_what_is_not_a_run():
    from sgl_sidp.shift.views import column_parts, row_part

    w = torch.zeros(12, 4)
    with pytest.raises(ValueError, match="block 0 of 6 rows does not split into 4 parts"):
        column_parts(w, [6, 6], 0, 4)
    with pytest.raises(ValueError, match="units \\[0, 2\\] are not one contiguous run"):
        column_parts(w, [6, 6], 0, 2, unit_rows=[2, 2], units=[None, [0, 2]])
    with pytest.raises(ValueError, match="5 columns do not split into 2 parts"):
        row_part(torch.zeros(3, 5), 0, 2)
