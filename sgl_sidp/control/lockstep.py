"""DP replicas that step together: every rank's tokens each iteration, and the one mode they all run it in.

SiDP's Compute-as-a-Service makes each FFN layer a collective between its owner and the ranks with rows, so every
replica must know, at every scheduler iteration, how many rows every other replica runs, and all must run the
iteration in the same mode (a rank in WaS whose owner is in CaS would wait forever). SGLang has this only for DP
attention (`managers/scheduler_components/dp_attn.py`: an all-gather of `MLPSyncBatchInfo` per iteration on the TP
group's CPU group); with plain `--dp-size` each replica is its own `torch.distributed` world. `Lockstep` is the same
all-gather on a gloo group of the replicas' schedulers with the same TP rank (`replica_group`), followed by
`ModeSwitch.decide` on the gathered counts: the same list on every rank, so the same decision. With CaS decode
CUDA graphs each rank also shares its decode batch size, so that all ranks replay graphs of one size (`Iteration.bucket`:
SGLang's DP attention pads every rank to the largest batch the same way, through `global_num_tokens`).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import os
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist

from sgl_sidp.control.mode_switch import ModeSwitch, ServeMode
from sgl_sidp.process import Progress

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Iteration:
    """One scheduler iteration as every rank of the group sees it.

    Attributes:
        counts: tokens (rows of each FFN layer's input) of every rank's forward, in group-rank order; 0 for a rank
            that runs nothing.
        mode: how non-owned layers run in this iteration, identical on every rank.
        decode_bs: every rank's batch size where its forward is a decode (one token per request), -1 where it is not
            (a prefill or a mixed batch), 0 where it runs nothing.
    """

    counts: tuple[int, ...]
    mode: ServeMode
    decode_bs: tuple[int, ...] = ()

    @property
    def busy(self) -> bool:
        """Some rank runs a forward this iteration."""
        return any(self.counts)

    def bucket(self, capture_bs: Sequence[int]) -> int | None:
        """The decode CUDA-graph size every rank replays in this CaS iteration: the smallest captured size (sorted
        `capture_bs`) holding the largest rank's batch; None (CaS without graphs) unless the iteration is CaS, some
        rank is busy, every busy rank decodes and the largest batch fits a captured size."""
        if self.mode is not ServeMode.CAS or not self.busy or not capture_bs or len(self.decode_bs) != len(self.counts):
            return None
        if any(c and b <= 0 for c, b in zip(self.counts, self.decode_bs)):
            return None
        largest = max(self.decode_bs)
        if largest > capture_bs[-1]:
            return None
        return capture_bs[bisect.bisect_left(capture_bs, largest)]


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

    def step(self, tokens: int, decode_bs: int = -1) -> Iteration:
        """Share this rank's `tokens` for the coming forward (0: none) and its `decode_bs` (batch size if the forward
        is a decode, else -1) and decide the mode. Every rank of the group must call it once per scheduler iteration,
        idle ones too (it is a collective: one all-gather of two int64 per rank)."""
        rows = gather_ints((tokens, decode_bs if tokens else 0), self.group)
        counts = tuple(r[0] for r in rows)
        self.current = Iteration(counts, self.switch.decide(counts), tuple(r[1] for r in rows))
        return self.current


def gather_ints(values: Sequence[int], group=None) -> list[tuple[int, ...]]:
    """Every rank's `values` (the same number of ints on every rank), in group-rank order: the same list on every
    rank. One all-gather on `group` (a CPU/gloo group; None: the default group)."""
    mine = torch.tensor([int(v) for v in values], dtype=torch.int64)
    parts = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, mine, group=group)
    return [tuple(int(v) for v in p) for p in parts]


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

    store = replica_store(name, world, directory)
    with Progress(f"sgl-sidp: rank {rank} of the {backend} group {name} waits for the other {world - 1} member(s) to "
                  f"join (store {directory}/sgl-sidp-{name}.store)", logger, limit_s=timeout_s):
        return init_custom_process_group(backend=backend, store=store, world_size=world, rank=rank,
                                         group_name=f"sgl-sidp-{name}", timeout=timedelta(seconds=timeout_s))


def replica_store(name: str, world: int, directory: str = "/tmp") -> "dist.FileStore":
    """The `FileStore` at `directory/sgl-sidp-<name>.store` that `world` processes meet through (`replica_group`; the
    NCCL communicator of `--sidp-cas-graphs`)."""
    return dist.FileStore(os.path.join(directory, f"sgl-sidp-{name}.store"), world)
