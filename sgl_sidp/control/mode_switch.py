"""One mode decision per iteration, the same on every rank: a batch-size threshold with hysteresis.

SiDP switches between Weight-as-a-Service (large batches: a layer's weights are fetched from its
owner, hidden behind the forward) and Compute-as-a-Service (small batches: rows are shipped to the
owner). A rank in WaS whose owner is in CaS would wait forever for rows that never come, so every
rank must switch at the same iteration. `ModeSwitch.decide` is a pure function of its own state and
of a signal every rank sees identically (the per-iteration all-gather of each rank's tokens), so
ranks that start in the same mode and see the same signals make the same decisions.
"""

from __future__ import annotations

import enum
from typing import Sequence


class ServeMode(str, enum.Enum):
    """How a rank runs a layer it does not own."""

    WAS = "was"  # Weight-as-a-Service: fetch the weights into a slot, compute locally
    CAS = "cas"  # Compute-as-a-Service: ship the rows to the owner


class ModeSwitch:
    """WaS at or above `b_th` tokens per rank, CaS below `b_th * (1 - hysteresis)`, unchanged in between.

    Args:
        b_th: threshold, tokens per rank per forward (> 0); from a flag or the planner's cost model (SiDP's
            `--sidp-b-th`, else `SiDPTechnique.b_th` at launch).
        hysteresis: width of the band below `b_th` where the mode does not change (0 <= h < 1).
        start: the mode before the first decision.
        forced: always this mode (measurement runs), whatever the signal.

    Raises:
        ValueError: `b_th <= 0` or `hysteresis` outside [0, 1).
    """

    def __init__(self, b_th: float, hysteresis: float = 0.25, start: ServeMode = ServeMode.CAS,
                 forced: ServeMode | None = None):
        if b_th <= 0 or not 0 <= hysteresis < 1:
            raise ValueError(f"need b_th > 0 and 0 <= hysteresis < 1, got {b_th}, {hysteresis}")
        self.b_th, self.low = float(b_th), float(b_th) * (1 - hysteresis)
        self.mode = forced or start
        self.forced = forced
        self.switches = 0

    @staticmethod
    def signal(tokens_per_rank: Sequence[int]) -> float:
        """Tokens per rank this iteration: the mean over the all-gathered counts (idle ranks count as 0)."""
        return sum(tokens_per_rank) / len(tokens_per_rank) if tokens_per_rank else 0.0

    def decide(self, tokens_per_rank: Sequence[int]) -> ServeMode:
        """The mode of this iteration, from every rank's tokens (the same list on every rank)."""
        if self.forced is not None:
            return self.mode
        s = self.signal(tokens_per_rank)
        new = ServeMode.WAS if s >= self.b_th else ServeMode.CAS if s < self.low else self.mode
        if new != self.mode:
            self.mode, self.switches = new, self.switches + 1
        return self.mode
