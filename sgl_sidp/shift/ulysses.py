"""Ulysses sequence parallelism for inference: one all-to-all of Q, K, V before attention, one of the output after.

Source: DeepSpeed-Ulysses (Jacobs et al.) as used for inference by Shift Parallelism (ArcticInference,
`arctic_inference/vllm/ulysses.py`). In the base configuration the SP ranks of one TP rank each hold a slice of the
batch's tokens (padded to a multiple of SP, `pad_to_sp`) and all of that TP rank's heads. Before attention one
all-to-all gives SP rank s every token for its part of the heads (`sgl_sidp.shift.heads.base_q_heads`) and the KV
heads those read (replicated when there are fewer KV heads than parts: GQA); attention runs on the whole batch;
one all-to-all brings each rank its tokens back with all the TP rank's heads, in head order, for the O projection.

Works on any `torch.distributed` group whose group ranks are the SP ranks in order (gloo in the CPU tests; NCCL
through SGLang's groups on GPU).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from sgl_sidp.shift.heads import kv_heads_of


def pad_to_sp(n_tokens: int, sp: int) -> int:
    """Tokens after padding `n_tokens` to a multiple of `sp` (>= sp, so every rank has a row)."""
    return max(sp, -(-n_tokens // sp) * sp)


class UlyssesLayout:
    """Which of a TP rank's heads each of its SP ranks gets, and the KV heads each part reads.

    Args:
        sp, tp, tp_rank: the base configuration and this GPU's TP rank.
        n_heads, n_kv_heads: the model's query and KV heads (all GPUs).

    Attributes:
        q_local: query heads of this TP rank (global indices, in order).
        kv_local: KV heads this TP rank holds (global indices; one replicated head when TP > kvh).
        q_part: `q_part[s]`: indices into `q_local` of SP rank s's query heads.
        kv_part: `kv_part[s]`: indices into `kv_local` of the KV heads SP rank s's query heads read.
        q_to_kv: `q_to_kv[s][i]`: index into `kv_part[s]` read by SP rank s's i-th query head.
    """

    def __init__(self, sp: int, tp: int, tp_rank: int, n_heads: int, n_kv_heads: int):
        self.sp = sp
        block = n_heads // tp
        part = block // sp
        self.q_local = list(range(tp_rank * block, (tp_rank + 1) * block))
        self.kv_local = kv_heads_of(self.q_local, n_heads, n_kv_heads)
        group = n_heads // n_kv_heads
        self.q_part, self.kv_part, self.q_to_kv = [], [], []
        for s in range(sp):
            q = self.q_local[s * part:(s + 1) * part]
            kv = kv_heads_of(q, n_heads, n_kv_heads)
            self.q_part.append(list(range(s * part, (s + 1) * part)))
            self.kv_part.append([self.kv_local.index(h) for h in kv])
            self.q_to_kv.append([kv.index(j // group) for j in q])


def qkv_all_to_all(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: UlyssesLayout, sp_rank: int,
                   group=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One fused all-to-all of Q, K and V over the SP group.

    Args:
        q: [n_local, len(layout.q_local), head_dim], this rank's tokens, all of its TP rank's query heads.
        k, v: [n_local, len(layout.kv_local), head_dim].
        layout, sp_rank: the head split and this rank's place in the SP group.
        group: the SP group (its group ranks are the SP ranks); None: the default group.

    Returns:
        (q, k, v) for all SP * n_local tokens (rank 0's first): q [N, |q_part[sp_rank]|, d],
        k and v [N, |kv_part[sp_rank]|, d]. Every rank's n_local must be equal (`pad_to_sp`).
    """
    n, d = q.shape[0], q.shape[-1]
    sp = layout.sp
    sizes = [(len(layout.q_part[s]), len(layout.kv_part[s])) for s in range(sp)]
    width = max(hq + 2 * hk for hq, hk in sizes)  # parts are equal unless KV heads are shared unevenly
    send = q.new_zeros(sp, n, width, d)
    for s, (hq, hk) in enumerate(sizes):
        send[s, :, :hq] = q[:, layout.q_part[s]]
        send[s, :, hq:hq + hk] = k[:, layout.kv_part[s]]
        send[s, :, hq + hk:hq + 2 * hk] = v[:, layout.kv_part[s]]
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    hq, hk = sizes[sp_rank]
    full = recv.reshape(sp * n, width, d)
    return full[:, :hq], full[:, hq:hq + hk], full[:, hq + hk:hq + 2 * hk]


def output_all_to_all(o: torch.Tensor, layout: UlyssesLayout, group=None) -> torch.Tensor:
    """The attention output back to the tokens' ranks: [N, |q_part[sp_rank]|, d] -> [n_local, len(q_local), d]."""
    sp = layout.sp
    n = o.shape[0] // sp
    send = o.reshape(sp, n, *o.shape[1:]).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 0, 2, 3).reshape(n, sp * o.shape[1], o.shape[2])  # SP rank s's heads s-th: q_local order
