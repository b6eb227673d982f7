"""Base weights gathered from SGLang's TP = P shards, and the shift shards as views into them (no second copy).

SGLang loads the model at TP = P: GPU g holds shard g of every linear layer (`QKVParallelLinear`: its query heads and
its KV heads, replicated when P exceeds them; `MergedColumnParallelLinear`: its gate and up rows; `RowParallelLinear`
(O, down): its block of input columns). The base configuration (SP, TP_b) needs on each GPU the shards of its whole
SP group. `gather_base` all-gathers them over the SP group and concatenates them in SP-rank order, **shard-major**:

- column-parallel weights [rows, in] stack on the rows: base [sp * rows, in]; GPU g's own shard is rows
  [s * rows, (s + 1) * rows), a contiguous view, so the shift configuration keeps SGLang's fused GEMMs;
- row-parallel weights [out, cols] stack on the columns: base [out, sp * cols]; the own shard is a strided column
  view whose leading dimension is the base width, which cuBLAS reads as it is.

The base GEMMs then run once on the base weights, and `sgl_sidp.shift.ulysses` turns their outputs into the
shift configuration's by reshapes and all-to-alls. Memory: SP / P of the model's linear weights per GPU (the base
configuration's share), nothing more for the shift configuration. The idea of views instead of ArcticInference's
second model copy is the issue's; SGLang narrows weights to a TP slice under CP decode the same way
(`layers/cp/cp_decode_attn_tp.py`).
"""

from __future__ import annotations

import torch

#: Which dimension a layer kind's shards stack on.
COLUMN, ROW = 0, 1


def gather_base(shard: torch.Tensor, dim: int, sp: int, comm) -> torch.Tensor:
    """The SP group's shards of one weight, concatenated in SP-rank order along `dim` (`COLUMN` or `ROW`).

    Args:
        shard: this GPU's TP = P shard, [rows, in] (column-parallel) or [out, cols] (row-parallel).
        comm: `all_gather_into_tensor` over the SP group (`ulysses.TorchComm` or SGLang's `GroupCoordinator`).

    Returns:
        A new contiguous tensor: [sp * rows, in] or [out, sp * cols]; `shard` itself when sp = 1.
    """
    if sp == 1:
        return shard
    stacked = shard.new_empty(sp * shard.shape[0], *shard.shape[1:]) if dim == COLUMN else \
        shard.new_empty(sp * shard.shape[1], shard.shape[0])
    comm.all_gather_into_tensor(stacked, shard.contiguous() if dim == COLUMN else shard.t().contiguous())
    return stacked if dim == COLUMN else stacked.t().contiguous()


def rebase(param: torch.Tensor, dim: int, sp: int, sp_rank: int, comm) -> torch.Tensor:
    """Gather `param`'s base weight over the SP group (`gather_base`) and point `param.data` at this rank's part of it
    (`shard_view`). Returns the base weight, [sp * rows, in] or [out, sp * cols].

    On CUDA the caching allocator then hands back the old shard's and the gather's blocks (`torch.cuda.empty_cache`).
    Kept, they were split for the next weights' gathers and the rest of each block stayed reserved: SGLang, which
    sizes the KV cache after this from the free memory, then allocated about 4.4 GiB fewer KV bytes a GPU for
    Llama-3.1-70B at SP2 x TP2 than the weights leave (measured on 4 x H200, commit 40b0086).
    """
    base = gather_base(param.data, dim, sp, comm)
    param.data = shard_view(base, dim, sp, sp_rank)
    if base.is_cuda:
        torch.cuda.empty_cache()
    return base


def shard_view(base: torch.Tensor, dim: int, sp: int, sp_rank: int) -> torch.Tensor:
    """SP rank `sp_rank`'s shard of a `gather_base` weight, as a view of it (rows for `COLUMN`, columns for `ROW`).

    Raises:
        ValueError: the dimension does not split into `sp` parts.
    """
    size = base.shape[dim]
    if size % sp:
        raise ValueError(f"dimension {dim} of {tuple(base.shape)} does not split into {sp} parts")
    part = size // sp
    return base.narrow(dim, sp_rank * part, part)


def shares_storage(view: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether `view` reads `base`'s memory (no copy was made)."""
    return view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
