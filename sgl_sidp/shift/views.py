"""The shift configuration's TP = P weight shards as views into the base configuration's TP shards (no copy).

In the base configuration (SP, TP) a GPU holds its TP rank's shards; as shift rank t * SP + s (`heads.shift_rank`)
it needs part s of SP equal parts of each of them:

- column-parallel layers (`QKVParallelLinear`, `MergedColumnParallelLinear`; SGLang keeps weights as
  [output features, input features]) hold several blocks stacked on the output rows (q|k|v, gate|up): part s is a
  contiguous run of rows in every block, so one row-slice view per block (`column_parts`). The GEMM then runs per
  block (or as one batched GEMM where the blocks are equal, gate|up), instead of once on the fused weight;
- row-parallel layers (`RowParallelLinear`: O, down) need a column slice (`row_part`): a strided view whose
  leading dimension is the base shard's width, which cuBLAS reads as it is.

KV blocks with fewer heads than parts are not split but replicated: part s takes the KV head its query heads read
(`heads.kv_heads_of`), again a run of rows. Source of the idea: the issue's "views, not a second copy" against
ArcticInference, which loads the model a second time for its shift configuration; SGLang narrows replicated
attention weights to a TP slice under CP decode the same way (`layers/cp/cp_decode_attn_tp.py`).
"""

from __future__ import annotations

from typing import Sequence

import torch


def column_parts(weight: torch.Tensor, block_rows: Sequence[int], part: int, n_parts: int,
                 unit_rows: Sequence[int] | None = None, units: Sequence[Sequence[int]] | None = None
                 ) -> list[torch.Tensor]:
    """Part `part` of `n_parts` of each row block of a column-parallel weight, as views of `weight`.

    Args:
        weight: [sum(block_rows), in_features], the blocks stacked on the rows (e.g. q|k|v of one TP rank).
        block_rows: rows of each block.
        part, n_parts: which part (0 <= part < n_parts).
        unit_rows: per block, rows of one unit (a head: head_dim); needed with `units`.
        units: per block, explicit unit indices (within the block) for this part, e.g. the KV head a part reads
            when there are fewer KV heads than parts; None for a block: its `part`-th equal share.

    Returns:
        One [rows, in_features] view per block, each sharing `weight`'s storage.

    Raises:
        ValueError: a block does not split into `n_parts`, or explicit units are not one contiguous run.
    """
    views, offset = [], 0
    for b, rows in enumerate(block_rows):
        chosen = units[b] if units is not None else None
        if chosen is None:
            if rows % n_parts:
                raise ValueError(f"block {b} of {rows} rows does not split into {n_parts} parts")
            size = rows // n_parts
            views.append(weight[offset + part * size: offset + (part + 1) * size])
        else:
            u = unit_rows[b]
            if list(chosen) != list(range(chosen[0], chosen[0] + len(chosen))):
                raise ValueError(f"block {b}: units {list(chosen)} are not one contiguous run")
            views.append(weight[offset + chosen[0] * u: offset + (chosen[-1] + 1) * u])
        offset += rows
    return views


def row_part(weight: torch.Tensor, part: int, n_parts: int) -> torch.Tensor:
    """Part `part` of a row-parallel weight [out_features, in_features]: its columns' share, as a strided view.

    Raises:
        ValueError: the columns do not split into `n_parts`.
    """
    cols = weight.shape[1]
    if cols % n_parts:
        raise ValueError(f"{cols} columns do not split into {n_parts} parts")
    size = cols // n_parts
    return weight[:, part * size:(part + 1) * size]


def shares_storage(view: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether `view` reads `base`'s memory (no copy was made)."""
    return view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
