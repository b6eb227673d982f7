"""The plan for re-homing tensors into shareable memory without ever holding them all twice.

An owner moves each tensor into its own VMM allocation and frees the original before the next
one, so the GPU holds at most one tensor twice at any moment. `plan_moves` fixes the order and
says the peak extra memory that costs; `sgl_sidp.peer.vmm.TensorExporter` executes it and logs
what it measured next to the plan. CPU only.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from sgl_sidp.peer.manifest import TensorSpec


def align_up(value: int, alignment: int) -> int:
    """`value` rounded up to a multiple of `alignment` (> 0)."""
    return -(-value // alignment) * alignment


@dataclasses.dataclass(frozen=True)
class MovePlan:
    """Moves in order, and what they cost.

    Attributes:
        order: tensor keys `(layer_id, name)` in the order they are moved (and served to readers).
        alloc_bytes: key -> bytes of its VMM allocation (rounded up to the allocation granularity).
        peak_extra_bytes: most bytes held twice at once: one allocation, while its original still
            exists (the original is freed before the next allocation).
        total_bytes: bytes of all allocations (what the originals occupied, give or take rounding).
    """

    order: tuple[tuple[int, str], ...]
    alloc_bytes: dict[tuple[int, str], int]
    peak_extra_bytes: int
    total_bytes: int


def plan_moves(specs: Sequence[TensorSpec], granularity: int) -> MovePlan:
    """Move every tensor of `specs`, one at a time, in key order (layer, then name).

    Args:
        specs: the tensors to re-home.
        granularity: VMM allocation granularity in bytes (`cuMemGetAllocationGranularity`, 2 MiB on H100/H200).

    Raises:
        ValueError: repeated keys or a non-positive granularity.
    """
    if granularity <= 0:
        raise ValueError(f"granularity must be > 0, got {granularity}")
    keys = [t.key for t in specs]
    if len(set(keys)) != len(keys):
        raise ValueError("repeated tensors in the move plan")
    ordered = sorted(specs, key=lambda t: t.key)
    alloc = {t.key: align_up(t.nbytes, granularity) for t in ordered}
    return MovePlan(tuple(t.key for t in ordered), alloc, max(alloc.values(), default=0), sum(alloc.values()))
