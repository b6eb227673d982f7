"""Shift Parallelism's CPU-checkable core: the KV-invariant head order; on gloo, a decoder layer in the base
configuration (Ulysses over SP on the shard-major base weights) against the same layer at TP = P (GQA, KV
replication, token padding, TP_b > 1), the KV each GPU writes, and all-gathers put back in shift order."""

import pytest
import torch
import torch.distributed as dist

from sgl_sidp.shift.heads import (HeadLayoutError, base_q_heads, check_layout, gathered_order, kv_heads_of,
                                  shift_group_order, shift_q_heads, shift_rank)
from sgl_sidp.shift.ulysses import (TorchComm, act_per_shard, column_blocks, gather_tokens, heads_all_to_all, local_tokens,
                                    pad_to_sp, row_blocks_gemm, tokens_all_to_all)
from sgl_sidp.shift.views import COLUMN, ROW, gather_base, shard_view, shares_storage
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
H, D = 16, 4


def weights(n_heads, n_kv, inter):
    g = torch.Generator().manual_seed(5)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64) / shape[-1] ** 0.5  # noqa: E731
    return {"q": r(n_heads * D, H), "k": r(n_kv * D, H), "v": r(n_kv * D, H), "o": r(H, n_heads * D),
            "g": r(inter, H), "u": r(inter, H), "d": r(H, inter)}


def tp_shards(w, g, p, n_heads, n_kv, inter):
    """GPU g's TP = P shards as SGLang lays them out (QKVParallelLinear: q heads, then k and v heads, KV replicated
    when P > KV heads; MergedColumnParallelLinear: gate rows then up rows; RowParallelLinear: input columns)."""
    hq = n_heads // p
    kv = [g * n_kv // p + i for i in range(n_kv // p)] if n_kv >= p else [g // (p // n_kv)]
    rows = lambda m, heads: torch.cat([m[h * D:(h + 1) * D] for h in heads])  # noqa: E731
    ip = inter // p
    return {"qkv": torch.cat([rows(w["q"], range(g * hq, (g + 1) * hq)), rows(w["k"], kv), rows(w["v"], kv)]),
            "o": w["o"][:, g * hq * D:(g + 1) * hq * D], "gu": torch.cat([w["g"][g * ip:(g + 1) * ip], w["u"][g * ip:(g + 1) * ip]]),
            "down": w["d"][:, g * ip:(g + 1) * ip], "q_heads": list(range(g * hq, (g + 1) * hq)), "kv_heads": kv}


def silu_mul(x):
    a, b = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(a) * b


def attention(q, k, v, q_heads, kv_heads, n_heads, n_kv):
    """Causal attention of a GPU's query heads over all tokens: q [N, hq*D], k/v [N, len(kv_heads)*D]."""
    n = q.shape[0]
    q, k, v = q.view(n, -1, D), k.view(n, -1, D), v.view(n, -1, D)
    idx = torch.tensor([kv_heads.index(j // (n_heads // n_kv)) for j in q_heads])
    k, v = k[:, idx], v[:, idx]
    s = torch.einsum("nhd,mhd->hnm", q, k) / D ** 0.5
    s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    return torch.einsum("hnm,mhd->nhd", s.softmax(-1), v).reshape(n, -1)


def _layer_rank(rank, world, sp, n_tokens, n_heads, n_kv, inter):
    """One decoder layer (attention + gated MLP, residuals, no norms) on this GPU, shift (TP = P) and base (SP,
    TP_b): returns the largest differences of the outputs and of the K, V this GPU writes."""
    p, tb = world, world // sp
    s, t = rank % sp, rank // sp
    sp_groups = [dist.new_group([tt * sp + ss for ss in range(sp)]) for tt in range(tb)]
    tb_groups = [dist.new_group([tt * sp + ss for tt in range(tb)]) for ss in range(sp)]
    comm = TorchComm(sp_groups[t])
    w = weights(n_heads, n_kv, inter)
    sh = tp_shards(w, rank, p, n_heads, n_kv, inter)
    x = torch.randn(n_tokens, H, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    nq, nkv = len(sh["q_heads"]) * D, len(sh["kv_heads"]) * D
    heads = (sh["q_heads"], sh["kv_heads"], n_heads, n_kv)

    # shift configuration: SGLang's TP = P, every GPU all tokens
    q, k, v = (x @ sh["qkv"].T).split([nq, nkv, nkv], dim=-1)
    o = attention(q, k, v, *heads) @ sh["o"].T
    dist.all_reduce(o)
    h1 = x + o
    m = silu_mul(h1 @ sh["gu"].T) @ sh["down"].T
    dist.all_reduce(m)
    want = h1 + m

    # base configuration: base weights gathered over the SP group, this GPU's tokens only
    base = {name: gather_base(sh[name], dim, sp, comm)
            for name, dim in (("qkv", COLUMN), ("gu", COLUMN), ("o", ROW), ("down", ROW))}
    views_ok = all(torch.equal(shard_view(base[n], dim, sp, s), sh[n]) and shares_storage(shard_view(base[n], dim, sp, s), base[n])
                   for n, dim in (("qkv", COLUMN), ("gu", COLUMN), ("o", ROW), ("down", ROW)))
    xl = local_tokens(x, sp, s)
    qkv = heads_all_to_all(column_blocks(xl, base["qkv"], None, sp), n_tokens, comm)
    bq, bk, bv = qkv.split([nq, nkv, nkv], dim=-1)
    ob = row_blocks_gemm(tokens_all_to_all(attention(bq, bk, bv, *heads), sp, comm), base["o"])
    if tb > 1:
        dist.all_reduce(ob, group=tb_groups[s])
    h1b = xl + ob
    mb = act_per_shard(silu_mul, h1b @ base["gu"].T, sp) @ base["down"].T
    if tb > 1:
        dist.all_reduce(mb, group=tb_groups[s])
    got = gather_tokens(h1b + mb, sp, n_tokens, comm)
    return ((got - want).abs().max().item(), max((bk - k).abs().max().item(), (bv - v).abs().max().item()),
            views_ok, xl.shape[0])


@pytest.mark.parametrize("p,sp,n_tokens,n_heads,n_kv", [
    (2, 2, 7, 8, 2),   # GQA, padding (7 tokens over 2 ranks)
    (4, 4, 9, 8, 2),   # fewer KV heads than GPUs: replicated KV heads
    (3, 3, 5, 6, 6),   # MHA, SP = 3
    (4, 2, 6, 8, 2),   # SP = 2, TP_b = 2: all-reduces over the TP_b group
    (2, 1, 5, 8, 2),   # SP = 1: the base path is TP = P on the same weights (a wiring check)
])
def test_base_layer_equals_tp_p_layer_and_writes_the_same_kv(p, sp, n_tokens, n_heads, n_kv):
    out = spawn(_layer_rank, p, sp, n_tokens, n_heads, n_kv, 8 * p)
    for rank, (err, kv_err, views_ok, n_local) in out.items():
        assert err < 1e-12 and kv_err < 1e-12, (rank, err, kv_err)
        assert views_ok, rank
        assert n_local == pad_to_sp(n_tokens, sp) // sp


def test_local_tokens_pad_and_act_per_shard_matches_each_shard():
    x = torch.arange(7.0).view(7, 1)
    assert [local_tokens(x, 2, r).flatten().tolist() for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 0]]
    assert local_tokens(x, 4, 3).flatten().tolist() == [6, 0]
    gu = torch.randn(3, 2 * 2 * 5, dtype=torch.float64)
    want = torch.cat([silu_mul(part) for part in gu.chunk(2, dim=1)], dim=1)
    assert torch.equal(act_per_shard(silu_mul, gu, 2), want)


def test_block_gemms_are_the_base_gemms_in_the_all_to_alls_layouts():
    """`column_blocks` is the base GEMM's output cut into SP column blocks (bias included), stacked: the layout the
    heads' all-to-all sends; `row_blocks_gemm` on SP blocks of columns is the base GEMM on them side by side."""
    g = torch.Generator().manual_seed(5)
    x, w, b = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((5, 6), (3 * 4, 6), (3 * 4,)))
    blocks = column_blocks(x, w, b, 3)
    assert blocks.shape == (3, 5, 4)
    assert torch.allclose(blocks, (x @ w.T + b).view(5, 3, 4).transpose(0, 1), rtol=0, atol=1e-12)
    assert torch.allclose(column_blocks(x, w, None, 1)[0], x @ w.T, rtol=0, atol=1e-12)
    wo = torch.randn(7, 3 * 4, generator=g, dtype=torch.float64)
    side_by_side = blocks.transpose(0, 1).reshape(5, 3 * 4)
    assert torch.allclose(row_blocks_gemm(blocks, wo), side_by_side @ wo.T, rtol=0, atol=1e-12)


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


def test_rebase_points_the_parameter_into_its_base_weight():
    from sgl_sidp.shift.views import rebase

    class Copies:  # the SP group's other ranks hold the same shard
        @staticmethod
        def all_gather_into_tensor(output, input):
            for part in output.chunk(2):
                part.copy_(input)

    for dim, shape in ((COLUMN, (3, 4)), (ROW, (4, 3))):
        shard = torch.arange(12.0).reshape(shape)
        p = torch.nn.Parameter(shard.clone(), requires_grad=False)
        base = rebase(p, dim, 2, 1, Copies)
        assert base.shape == ((6, 4) if dim == COLUMN else (4, 6))
        assert torch.equal(p.data, shard) and shares_storage(p.data, base)


# --------------------------------------------------------------------------- overlapped exchanges (gloo, file-backed symm)
def _overlap_rank(rank, world, folder, sizes):
    from sgl_sidp.peer.exchange import SymmetricExchange
    from sgl_sidp.shift.ulysses import heads_exchanged, tokens_exchanged_gemm
    from tests.file_symm import FileSymm

    comm, k, c, h = TorchComm(), 6, 4, 5
    ex = SymmetricExchange(None, rank, world, world * 3 * c, torch.float64, "cpu", symm=FileSymm(folder, rank))
    g = torch.Generator().manual_seed(3)  # the same weights on every rank
    w, b, wo = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((world * c, k), (world * c,), (h, world * c)))
    got = []
    for n_tokens in sizes:  # slots reused with fewer tokens: no stale rows may come back
        x = local_tokens(torch.randn(n_tokens, k, generator=g, dtype=torch.float64), world, rank)
        want_qkv = heads_all_to_all(column_blocks(x, w, b, world), n_tokens, comm)
        qkv = heads_exchanged(x, w, b, n_tokens, ex)
        o = torch.randn(n_tokens, c, generator=g, dtype=torch.float64) + rank
        want_o = row_blocks_gemm(tokens_all_to_all(o, world, comm), wo)
        out = tokens_exchanged_gemm(o, wo, ex)
        got.append((bool(torch.equal(qkv, want_qkv)), tuple(out.shape) == tuple(want_o.shape),
                    float((out - want_o).abs().max())))
    too_big = heads_exchanged(torch.zeros(4, k, dtype=torch.float64), w, b, 4 * world, ex), \
        tokens_exchanged_gemm(torch.zeros(4 * world, c, dtype=torch.float64), wo, ex)
    return got, too_big == (None, None), ex.exchanges


@pytest.mark.parametrize("world, sizes", [(2, [6, 5, 6, 3]), (3, [9, 7, 9, 2])])
def test_overlapped_exchanges_equal_the_all_to_alls(tmp_path, world, sizes):
    """`heads_exchanged` gives the bits of the NCCL path's QKV all-to-all, `tokens_exchanged_gemm` its O GEMM up to
    the order of the blocks' sum, padding rows included (zero, not what a larger forward left in the slot); both
    hand back blocks beyond the buffer."""
    for rank, (got, handed_back, n) in spawn(_overlap_rank, world, str(tmp_path), sizes).items():
        assert all(eq and shape_ok and err < 1e-12 for eq, shape_ok, err in got), (rank, got)
        assert handed_back and n == 2 * len(sizes), rank


def test_peers_in_ring_order():
    from sgl_sidp.shift.ulysses import peers_of

    assert peers_of(0, 1) == [] and peers_of(1, 2) == [0] and peers_of(2, 4) == [3, 0, 1]
