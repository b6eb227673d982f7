"""Ulysses sequence parallelism for inference on the shard-major layout: the all-to-alls and token moves of the base
configuration.

Source: DeepSpeed-Ulysses (Jacobs et al.) as used for inference by Shift Parallelism (Hidayetoglu et al.;
ArcticInference, `arctic_inference/vllm/ulysses.py`). P GPUs serve in the **shift** configuration as SGLang's own
TP = P (GPU g is TP rank g and holds that shard of every weight). In the **base** configuration (SP, TP_b = P / SP)
GPU g is SP rank g % SP of the SP group {t * SP + s : s} with t = g // SP, and holds the base weight of each linear
layer: the SP shift shards of its SP group concatenated in SP-rank order (`views.gather_base`), the *shard-major*
layout. That layout makes the base configuration's data movement plain reshapes:

- the QKV GEMM on the base weight, one GEMM per shift shard (`column_blocks`), writes [SP, n, c] blocks, block s
  being exactly what shift rank t * SP + s's QKV GEMM gives for this rank's n tokens (its query heads, its KV heads,
  replicated as SGLang replicates them when P exceeds the KV heads), already in the all-to-all's send layout;
  one all-to-all (`heads_all_to_all`) hands every SP rank its block for all tokens, i.e. the
  shift configuration's QKV output, so SGLang's attention runs unchanged on the whole batch and writes the same KV
  heads in the same cache slots as in the shift configuration (KV invariance by construction: the head order
  `tp * SP + sp` of `heads.shift_rank` is the group layout itself);
- one all-to-all back (`tokens_all_to_all`) gives each rank its tokens with every head of its SP group as SP
  blocks, block s multiplying the base O weight's s-th column block (`row_blocks_gemm`, one GEMM per block: no
  copy into one [n, SP * c] matrix);
- gate|up on the base weight gives per token SP blocks [gate_s | up_s]: viewed as SP rows of one token, SGLang's
  SiluAndMul runs on it as it is (`act_per_shard`), in the order of the base down weight's columns.

With SP = 1 every function is the identity and never calls `comm`. Every function takes a `comm` with
`all_to_all_single(output, input)` and `all_gather_into_tensor(output, input)` (torch's semantics: equal splits along
dim 0, SP-rank order; the all-to-alls pass flat tensors, as SGLang's pynccl `all_to_all_single` needs): `TorchComm`
over a `torch.distributed` group (gloo in the CPU tests), or SGLang's `GroupCoordinator` of the SP group on GPU.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class TorchComm:
    """`comm` over a `torch.distributed` group whose group ranks are the SP ranks (CPU tests, gloo).

    Args:
        group: the process group (None: the default group).
    """

    def __init__(self, group=None):
        self.group = group

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor) -> None:
        dist.all_to_all_single(output, input, group=self.group)

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None:
        parts = list(output.chunk(dist.get_world_size(self.group)))
        dist.all_gather(parts, input.contiguous(), group=self.group)
        if parts[0].data_ptr() != output.data_ptr():  # gloo filled copies: put them in place
            output.copy_(torch.cat(parts))


def pad_to_sp(n_tokens: int, sp: int) -> int:
    """Tokens after padding `n_tokens` to a multiple of `sp` (>= sp, so every rank has a row)."""
    return max(sp, -(-n_tokens // sp) * sp)


def local_tokens(x: torch.Tensor, sp: int, sp_rank: int) -> torch.Tensor:
    """SP rank `sp_rank`'s slice of a whole batch's rows `x` [N, ...], padded with zero rows to `pad_to_sp(N)`:
    [pad_to_sp(N) / sp, ...] (a view when no padding falls in it)."""
    n_tokens = x.shape[0]
    n = pad_to_sp(n_tokens, sp) // sp
    lo, hi = sp_rank * n, (sp_rank + 1) * n
    if hi <= n_tokens:
        return x[lo:hi]
    out = x.new_zeros(n, *x.shape[1:])
    if lo < n_tokens:
        out[:n_tokens - lo] = x[lo:]
    return out


def column_blocks(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, sp: int) -> torch.Tensor:
    """A column-parallel base GEMM written block by block: x [n, K] by the base weight w [SP * c, K] (shard-major)
    and bias b [SP * c] or None -> [SP, n, c], block s = x @ w_s.T (+ b_s), the GEMM shift rank s runs on its own
    shard. The blocks are the layout `heads_all_to_all` sends (block s to SP rank s), so no transposing copy of
    [n, SP * c] precedes the all-to-all (each block's GEMM writes it in place)."""
    n, c = x.shape[0], w.shape[0] // sp
    out = x.new_empty(sp, n, c)
    for s, w_s in enumerate(w.chunk(sp)):
        if b is None:
            torch.mm(x, w_s.t(), out=out[s])
        else:
            torch.addmm(b[s * c:(s + 1) * c], x, w_s.t(), out=out[s])
    return out


def heads_all_to_all(blocks: torch.Tensor, n_tokens: int, comm) -> torch.Tensor:
    """This SP rank's heads for every token, from every rank's tokens with all of the SP group's heads.

    Args:
        blocks: [SP, n, c], this rank's n = pad_to_sp(N) / SP tokens by the base QKV weight, block s being SP rank
            s's shift QKV output (`column_blocks`).
        n_tokens: N, the real tokens of the batch (padding rows are dropped).
        comm: see the module doc.

    Returns:
        [N, c]: what this rank's shift-configuration QKV GEMM gives for the whole batch, tokens in batch order.
    """
    sp, n, c = blocks.shape
    if sp == 1:
        return blocks[0, :n_tokens]
    return blocks_all_to_all(blocks, comm).view(sp * n, c)[:n_tokens]  # rank 0's tokens first: batch order


def tokens_all_to_all(o: torch.Tensor, sp: int, comm) -> torch.Tensor:
    """Attention output back to the tokens' ranks.

    Args:
        o: [N, c], this rank's heads for every real token of the batch (flattened heads).

    Returns:
        [SP, n, c], n = pad_to_sp(N) / SP: this rank's tokens, block s with SP rank s's heads (block s multiplies
        the base O weight's columns s * c to (s + 1) * c: `row_blocks_gemm`). Padding rows are zeros.
    """
    n_tokens, c = o.shape
    if sp == 1:
        return o.unsqueeze(0)
    n_pad = pad_to_sp(n_tokens, sp)
    if n_pad != n_tokens:
        o = torch.cat([o, o.new_zeros(n_pad - n_tokens, c)])
    return blocks_all_to_all(o.contiguous().view(sp, n_pad // sp, c), comm)  # block s: SP rank s's tokens


def blocks_all_to_all(send: torch.Tensor, comm) -> torch.Tensor:
    """The all-to-all of both directions: `send` [SP, n, c], block s to SP rank s -> a new [SP, n, c], block s from
    SP rank s (`comm.all_to_all_single` on the flat tensors)."""
    recv = torch.empty_like(send)
    comm.all_to_all_single(recv.view(-1), send.view(-1))
    return recv


def row_blocks_gemm(blocks: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A row-parallel base GEMM on `tokens_all_to_all`'s blocks: the sum over s of blocks[s] [n, k] by w_s, the
    columns s * k to (s + 1) * k of the base weight w [H, SP * k] -> [n, H]; one GEMM per block, each added onto the
    last (`addmm_`), instead of copying the blocks into [n, SP * k] for one GEMM. Rounding: the first product is
    rounded to the blocks' dtype and each next one added to it in fp32 and rounded again, where one GEMM rounds once
    and TP = P rounds each rank's partial before its all-reduce adds them (`--shift-exact` does that:
    `ShiftRuntime.row_gemm_exact`)."""
    sp, _, k = blocks.shape
    out = torch.mm(blocks[0], w[:, :k].t())
    for s in range(1, sp):
        out.addmm_(blocks[s], w[:, s * k:(s + 1) * k].t())
    return out


def heads_exchanged(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, n_tokens: int, ex) -> torch.Tensor | None:
    """`heads_all_to_all(column_blocks(x, w, b, SP), n_tokens, comm)` with the exchange hidden behind the GEMMs: the
    peers' blocks are computed first, each copied into its owner's receive slot 0 (`ex.put`, copy engines) while the
    next block's GEMM runs, this rank's own block last, straight into its own slot; then `ex.barrier()`.

    Args:
        x: [n, K], this rank's n = pad_to_sp(N) / SP tokens; w [SP * c, K] (shard-major) and b [SP * c] or None: the
            base QKV weight and bias.
        n_tokens: N, the batch's real tokens.
        ex: a `sgl_sidp.peer.exchange.SymmetricExchange` over the SP group (rank, world = SP, `view`, `put`,
            `barrier`); its slot 0 holds the result until the next call.

    Returns:
        [N, c] as `heads_all_to_all` gives it (the same GEMMs, so the same bits), a view of `ex`'s slot 0; None when
        the blocks exceed `ex.max_elems` (the caller's NCCL path serves them).
    """
    sp, r = ex.world, ex.rank
    n, c = x.shape[0], w.shape[0] // sp
    shape = (sp, n, c)
    if sp * n * c > ex.max_elems:
        return None

    def block(q: int, out: torch.Tensor) -> torch.Tensor:
        wq = w[q * c:(q + 1) * c].t()
        return torch.mm(x, wq, out=out) if b is None else torch.addmm(b[q * c:(q + 1) * c], x, wq, out=out)

    for q in peers_of(r, sp):
        ex.put(block(q, x.new_empty(n, c)), ex.view(q, 0, shape)[r])
    recv = ex.view(r, 0, shape)
    block(r, recv[r])
    ex.barrier()
    return recv.view(sp * n, c)[:n_tokens]  # rank 0's tokens first: batch order


def tokens_exchanged_gemm(o: torch.Tensor, w: torch.Tensor, ex) -> torch.Tensor | None:
    """`row_blocks_gemm(tokens_all_to_all(o, SP, comm), w)` with the exchange hidden behind the GEMM of this rank's
    own heads: each peer's tokens of `o` are copied into its receive slot 1 (`ex.put`) first, this rank's own block
    multiplies its columns of `w` meanwhile, then `ex.barrier()` and the peers' blocks are added on (`addmm_`).

    Args:
        o: [N, c], this rank's heads for every real token (the attention output); w: [H, SP * c], the base O weight.
        ex: as in `heads_exchanged`; slot 1.

    Returns:
        [n, H], n = pad_to_sp(N) / SP: this rank's tokens (padding rows zero before the GEMM). Rounding: this rank's
        own block's product first, then the peers' in ring order (`row_blocks_gemm` starts at block 0), so rank r's
        tokens round as there with the blocks rotated; None when the blocks exceed `ex.max_elems`.
    """
    sp, r = ex.world, ex.rank
    n_tokens, c = o.shape
    n = pad_to_sp(n_tokens, sp) // sp
    shape = (sp, n, c)
    if sp * n * c > ex.max_elems:
        return None
    for q in peers_of(r, sp):
        rows = o[q * n:min((q + 1) * n, n_tokens)]
        if rows.shape[0]:
            ex.put(rows, ex.view(q, 1, shape)[r][:rows.shape[0]])
    out = torch.mm(local_tokens(o, sp, r), w[:, r * c:(r + 1) * c].t())
    ex.barrier()
    recv, real = ex.view(r, 1, shape), max(0, min(n, n_tokens - r * n))
    for q in peers_of(r, sp):
        if real < n:
            recv[q][real:].zero_()  # this rank's padding rows: no peer put them
        out.addmm_(recv[q], w[:, q * c:(q + 1) * c].t())
    return out


def peers_of(rank: int, sp: int) -> list[int]:
    """The other SP ranks in ring order from `rank` + 1 (each rank's first copy goes to a different peer)."""
    return [(rank + i) % sp for i in range(1, sp)]


def gather_tokens(x: torch.Tensor, sp: int, n_tokens: int, comm) -> torch.Tensor:
    """Every rank's rows of `x` [n, ...] in SP-rank order, padding dropped: [N, ...] (e.g. the last hidden states
    before the logits)."""
    if sp == 1:
        return x[:n_tokens]
    out = x.new_empty(sp * x.shape[0], *x.shape[1:])
    comm.all_gather_into_tensor(out, x.contiguous())
    return out[:n_tokens]


def act_per_shard(act_fn, gate_up: torch.Tensor, sp: int) -> torch.Tensor:
    """SGLang's gated activation (`SiluAndMul`: [.., 2i] -> [.., i]) on the shard-major base gate|up output.

    Args:
        act_fn: the MLP's own activation module (`Qwen2MLP.act_fn`).
        gate_up: [n, sp * 2i], blocks [gate_s | up_s] per SP rank s.

    Returns:
        [n, sp * i]: block s = act(gate_s) * up_s, the base down weight's column order.
    """
    n, width = gate_up.shape
    out = act_fn(gate_up.reshape(n * sp, width // sp))
    return out.reshape(n, -1)


def sum_in_rank_order(parts: torch.Tensor) -> torch.Tensor:
    """The sum over dim 0 of `parts` [R, N, H] (bf16/fp16 partial sums of R TP ranks, in rank order) as SGLang's
    all-reduce adds them: upcast to fp32, added rank 0 first, rounded once to `parts.dtype` (sgl_kernel's custom
    all-reduce; any all-reduce of two ranks gives the same). Returns [N, H]."""
    acc = parts[0].float()
    for part in parts[1:]:
        acc.add_(part.float())
    return acc.to(parts.dtype)
