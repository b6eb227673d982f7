"""Which rank owns which layer, and in which order a rank fetches the layers it does not own.

SiDP (Zhao & He) gives each FFN layer one owner among d DP ranks and lets the others stream it.
Owners rotate layer by layer (`owner_of`), so every run of d consecutive layers (a *cycle*) has one
layer per rank. **Peak shifting**: if every rank fetched a cycle's layers in forward order, all
ranks would read the same owner's HBM at the same moment and share its egress; instead rank r
starts the cycle after its own layer and wraps around (`peak_shift_order`), so at fetch step j of a
cycle rank r reads owner (r + j) mod d: distinct ranks read distinct owners at every step. Each
rank fetches each non-owned layer of a cycle exactly once into its d - 1 slots.
"""

from __future__ import annotations


def owner_of(layer: int, d: int) -> int:
    """The DP rank owning FFN `layer` among `d` ranks (layers rotate over the ranks)."""
    return layer % d


def peak_shift_order(n_layers: int, d: int, rank: int, shift: bool = True) -> list[list[int]]:
    """The layers `rank` fetches, cycle by cycle, in fetch order.

    Args:
        n_layers: FFN layers of the model.
        d: DP ranks sharing them (>= 2).
        rank: this rank, 0 <= rank < d.
        shift: False gives the unshifted order (forward order, own layer skipped) for comparison.

    Returns:
        One list per cycle (layers [c, c + d) with c = 0, d, 2d, ...; the last cycle may be
        short): the cycle's layers not owned by `rank`, in the order they are fetched.

    Raises:
        ValueError: d < 2, rank out of range, or fewer layers than ranks (a rank would own none).
    """
    if d < 2 or not 0 <= rank < d:
        raise ValueError(f"need d >= 2 and 0 <= rank < d, got d={d}, rank={rank}")
    if n_layers < d:
        raise ValueError(f"{n_layers} layers cannot give each of {d} ranks a layer")
    cycles = []
    for c in range(0, n_layers, d):
        order = [c + (rank + j) % d for j in range(1, d)] if shift else [c + k for k in range(d)]
        cycles.append([layer for layer in order if layer < n_layers and owner_of(layer, d) != rank])
    return cycles
