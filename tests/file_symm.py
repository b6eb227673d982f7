"""A stand-in for torch symmetric memory on CPU processes (`sgl_sidp.peer.exchange` tests): each rank's buffer is a
file-backed shared tensor that every process of the group maps, and the barrier is the group's."""

import math
from pathlib import Path

import torch
import torch.distributed as dist


class FileSymm:
    """`empty` and `rendezvous` as `torch.distributed._symmetric_memory` has them, over files in `folder`."""

    def __init__(self, folder: str, rank: int):
        self.folder, self.rank = Path(folder), rank

    def empty(self, n: int, dtype=None, device=None):
        t = torch.from_file(str(self.folder / f"buf{self.rank}"), shared=True, size=n, dtype=dtype)
        t.zero_()
        return t

    def rendezvous(self, buffer, group):
        dist.barrier(group)  # every rank's file exists
        return Handle(self.folder, buffer.numel(), group)


class Handle:
    def __init__(self, folder: Path, n: int, group):
        self.folder, self.n, self.group, self.maps = folder, n, group, {}

    def get_buffer(self, rank: int, shape, dtype, storage_offset: int = 0):
        if rank not in self.maps:
            self.maps[rank] = torch.from_file(str(self.folder / f"buf{rank}"), shared=True, size=self.n, dtype=dtype)
        return self.maps[rank][storage_offset:storage_offset + math.prod(shape)].view(shape)

    def barrier(self, channel: int = 0):
        dist.barrier(self.group)
