"""DP replicas that step together: every rank's tokens each iteration, and the one mode they all run it in.

SiDP's Compute-as-a-Service makes each FFN layer a collective between its owner and the ranks with rows, so every
replica must know, at every scheduler iteration, how many rows every other replica runs, and all must run the
iteration in the same mode (a rank in WaS whose owner is in CaS would wait forever). SGLang has this only for DP
attention (`managers/scheduler_components/dp_attn.py`: an all-gather of `MLPSyncBatchInfo` per iteration on the TP
group's CPU group); with plain `--dp-size` each replica is its own `torch.distributed` world. `Lockstep` is the same
all-gather on a gloo group of the replicas' schedulers with the same TP rank (`replica_group`), followed by
`ModeSwitch.decide` on the gathered counts: the same list on every rank, so the same decision.
"""

from __future__ import annotations

import dataclasses
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from sgl_sidp.control.mode_switch import ModeSwitch, ServeMode, gather_counts


@dataclasses.dataclass(frozen=True)
class Iteration:
    """One scheduler iteration as every rank of the group sees it.

    Attributes:
        counts: tokens (rows of each FFN layer's input) of every rank's forward, in group-rank order; 0 for a rank
            that runs nothing.
        mode: how non-owned layers run in this iteration, identical on every rank.
    """

    counts: tuple[int, ...]
    mode: ServeMode

    @property
    def busy(self) -> bool:
        """Some rank runs a forward this iteration."""
        return any(self.counts)


class Lockstep:
    """Per-iteration all-gather of token counts and the mode decision, on a group of DP ranks.

    Args:
        group: a CPU (gloo) process group of the DP ranks (same TP rank), e.g. `replica_group(...)`.
        switch: the WaS/CaS rule; every rank must build it with the same arguments.

    Attributes:
        current: the last `Iteration` (None before the first `step`).
    """

    def __init__(self, group, switch: ModeSwitch):
        self.group, self.switch = group, switch
        self.current: Iteration | None = None

    def step(self, tokens: int) -> Iteration:
        """Share this rank's `tokens` for the coming forward (0: none) and decide the mode. Every rank of the group
        must call it once per scheduler iteration, idle ones too (it is a collective)."""
        counts = tuple(gather_counts(tokens, self.group))
        self.current = Iteration(counts, self.switch.decide(counts))
        return self.current



def agree(value: float, group, src: int = 0) -> float:
    """`value` of group rank `src` on every rank of `group` (e.g. B_th decided by DP rank 0); a collective."""
    parts = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, torch.tensor([float(value)], dtype=torch.float64), group=group)
    return float(parts[src])


def replica_group(name: str, world: int, rank: int, backend: str = "gloo", timeout_s: float = 900.0,
                  directory: str = "/tmp"):
    """A process group of `world` processes outside their own `torch.distributed` worlds (SGLang's
    `init_custom_process_group`, which its weight-update groups use), met through a `FileStore`.

    Args:
        name: the same on every member and unique to this server and group (e.g. the DP controller's pid and the
            TP rank): the store file is `directory/sgl-sidp-<name>.store`.
        world, rank: members and this one's rank in the group.
        backend: "gloo" (CPU tensors) or "nccl" (one GPU per member).
        timeout_s: how long members wait for each other, at creation and per collective.

    Raises:
        RuntimeError (torch's DistStoreError): a member did not join within `timeout_s`.
    """
    from sglang.srt.utils.common import init_custom_process_group

    path = os.path.join(directory, f"sgl-sidp-{name}.store")
    store = dist.FileStore(path, world)
    return init_custom_process_group(backend=backend, store=store, world_size=world, rank=rank,
                                     group_name=f"sgl-sidp-{name}", timeout=timedelta(seconds=timeout_s))
