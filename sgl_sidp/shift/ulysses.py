"""Ulysses sequence parallelism for inference on the shard-major layout: the all-to-alls and token moves of the base
configuration.

Source: DeepSpeed-Ulysses (Jacobs et al.) as used for inference by Shift Parallelism (Hidayetoglu et al.;
ArcticInference, `arctic_inference/vllm/ulysses.py`). P GPUs serve in the **shift** configuration as SGLang's own
TP = P (GPU g is TP rank g and holds that shard of every weight). In the **base** configuration (SP, TP_b = P / SP)
GPU g is SP rank g % SP of the SP group {t * SP + s : s} with t = g // SP, and holds the base weight of each linear
layer: the SP shift shards of its SP group concatenated in SP-rank order (`views.gather_base`), the *shard-major*
layout. That layout makes the base configuration's data movement plain reshapes:

- the fused QKV GEMM on the base weight gives each token [SP, c] blocks, block s being exactly what shift rank
  t * SP + s's QKV GEMM gives for it (its query heads, its KV heads, replicated as SGLang replicates them when
  P exceeds the KV heads); one all-to-all (`heads_all_to_all`) hands every SP rank its block for all tokens, i.e. the
  shift configuration's QKV output, so SGLang's attention runs unchanged on the whole batch and writes the same KV
  heads in the same cache slots as in the shift configuration (KV invariance by construction: the head order
  `tp * SP + sp` of `heads.shift_rank` is the group layout itself);
- one all-to-all back (`tokens_all_to_all`) gives each rank its tokens with every head of its SP group, in the order
  of the base O weight's columns;
- gate|up on the base weight gives per token SP blocks [gate_s | up_s]: viewed as SP rows of one token, SGLang's
  SiluAndMul runs on it as it is (`act_per_shard`), in the order of the base down weight's columns.

With SP = 1 every function is the identity and never calls `comm`. Every function takes a `comm` with `all_to_all_single(output, input)` and `all_gather_into_tensor(output, input)`
(torch's semantics: equal splits along dim 0, SP-rank order; the all-to-alls pass flat tensors, as
SGLang's pynccl `all_to_all_single` needs): `TorchComm` over a `torch.distributed` group (gloo in
the CPU tests), or SGLang's `GroupCoordinator` of the SP group on GPU.
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


def heads_all_to_all(qkv: torch.Tensor, sp: int, n_tokens: int, comm) -> torch.Tensor:
    """This SP rank's heads for every token, from every rank's tokens with all of the SP group's heads.

    Args:
        qkv: [n, sp * c], this rank's n = pad_to_sp(N) / sp tokens times the base QKV weight (shard-major: block s
            of c columns is SP rank s's shift QKV output).
        sp: SP ranks; n_tokens: N, the real tokens of the batch (padding rows are dropped).
        comm: see the module doc.

    Returns:
        [N, c]: what this rank's shift-configuration QKV GEMM gives for the whole batch, tokens in batch order.
    """
    if sp == 1:
        return qkv[:n_tokens]
    n, width = qkv.shape
    c = width // sp
    send = qkv.view(n, sp, c).transpose(0, 1).contiguous()  # [sp, n, c]: block s goes to SP rank s
    recv = torch.empty_like(send)
    comm.all_to_all_single(recv.view(-1), send.view(-1))
    return recv.view(sp * n, c)[:n_tokens]  # rank 0's tokens first: batch order


def tokens_all_to_all(o: torch.Tensor, sp: int, comm) -> torch.Tensor:
    """Attention output back to the tokens' ranks.

    Args:
        o: [N, c], this rank's heads for every real token of the batch (flattened heads).

    Returns:
        [n, sp * c], n = pad_to_sp(N) / sp: this rank's tokens with the SP group's heads in SP-rank order (the base O
        weight's column order). Padding rows are zeros.
    """
    if sp == 1:
        return o
    n_tokens, c = o.shape
    n_pad = pad_to_sp(n_tokens, sp)
    if n_pad != n_tokens:
        o = torch.cat([o, o.new_zeros(n_pad - n_tokens, c)])
    send = o.contiguous().view(sp, n_pad // sp, c)  # block s: SP rank s's tokens
    recv = torch.empty_like(send)
    comm.all_to_all_single(recv.view(-1), send.view(-1))
    return recv.transpose(0, 1).reshape(n_pad // sp, sp * c)


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
