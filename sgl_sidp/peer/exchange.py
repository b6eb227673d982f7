"""All-to-alls of equal blocks by copies into the peers' memory: each GPU of a group writes block q of what it sends
straight into GPU q's receive buffer, then all meet at a barrier.

Source: torch symmetric memory (`torch.distributed._symmetric_memory`: `empty`, `rendezvous`, a handle's
`get_buffer` and `barrier`), the mechanism under SGLang's `TorchSymmMemCommunicator`. A buffer allocated with
`empty` and exchanged with `rendezvous` is mapped into every process of the group, so a `copy_` into a peer's
buffer is a device-to-device `cudaMemcpyAsync` over NVLink, run by the copy engines, not the SMs (NCCL's all-to-all
moves the data with kernels, the block a GPU keeps for itself included). The handle's barrier (a kernel on the
current stream, on the symmetric memory's signal pads) returns once every GPU's copies before it have landed; both
the copies and the barrier are stream-ordered, so they run inside CUDA graphs as captured.

Two receive slots alternate (Shift's QKV blocks in one, the attention output in the other): a GPU writes into a
peer's slot only after the barrier of the other slot's exchange, which the peer reaches only once it has read
what that slot held before (each slot is read before the next exchange of the other slot starts, on every GPU).

No feature here, and none uses it: `sgl_sidp.bench.a2a` times it against NCCL's all-to-all for Shift's base
configuration, where it did not pay (0.88-0.94x NCCL's time at SP2 on 2 x H100, 1.1-1.6x at SP4).
"""

from __future__ import annotations

import torch

#: receive slots, used alternately (see the module doc)
SLOTS = 2


class ExchangeError(RuntimeError):
    """Symmetric memory could not be set up over the group (no P2P access between its GPUs, an old driver)."""


class SymmetricExchange:
    """All-to-alls of [W, ...] blocks over a group of W GPUs through a symmetric receive buffer.

    Args:
        group: the `torch.distributed` process group (or its name) the buffer is rendezvoused over.
        rank, world: this GPU's rank in `group` and the group's size W.
        max_elems: the largest block tensor (all W blocks, in elements) an exchange may carry; larger ones return
            None from `exchange` (the caller's other path serves them).
        dtype, device: of the buffer (the blocks' dtype; this GPU).
        symm: the symmetric-memory module (`torch.distributed._symmetric_memory`; tests pass a stand-in with the
            same `empty` and `rendezvous`).

    Raises:
        ExchangeError: `empty` or `rendezvous` failed, with the reason.
    """

    def __init__(self, group, rank: int, world: int, max_elems: int, dtype: torch.dtype, device, symm=None):
        if symm is None:
            import torch.distributed._symmetric_memory as symm
        self.rank, self.world, self.max_elems, self.dtype = rank, world, int(max_elems), dtype
        try:
            self.buffer = symm.empty(SLOTS * self.max_elems, dtype=dtype, device=device)
            self.handle = symm.rendezvous(self.buffer, group)
        except Exception as e:  # noqa: BLE001 - whatever torch raises, one line naming it
            raise ExchangeError(f"torch symmetric memory over {world} GPUs: {type(e).__name__}: {e}") from e
        self.exchanges = 0  # exchanges run (eager, or captured in a CUDA graph once)

    @property
    def nbytes(self) -> int:
        """Bytes of the receive buffer on this GPU (both slots)."""
        return SLOTS * self.max_elems * self.buffer.element_size()

    def exchange(self, send: torch.Tensor, slot: int) -> torch.Tensor | None:
        """Block q of `send` [W, ...] to GPU q; returns this GPU's receive view [W, ...] (block q from GPU q) in
        `slot` (0 or 1), valid until this slot's next exchange; None when `send` exceeds `max_elems`.

        Raises:
            ValueError: `send`'s first dimension is not W, or its dtype not the buffer's.
        """
        if send.shape[0] != self.world or send.dtype != self.dtype:
            raise ValueError(f"exchange: blocks {tuple(send.shape)} {send.dtype}, the group has {self.world} GPUs "
                             f"and a {self.dtype} buffer")
        if send.numel() > self.max_elems:
            return None
        shape, offset = tuple(send.shape), slot * self.max_elems
        for q in range(self.world):
            self.handle.get_buffer(q, shape, self.dtype, offset)[self.rank].copy_(send[q])
        self.handle.barrier(channel=0)
        self.exchanges += 1
        return self.handle.get_buffer(self.rank, shape, self.dtype, offset)
