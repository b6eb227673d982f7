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

`put` and `barrier` are the two halves of an exchange, for callers that compute between them: `put` copies one
block into a peer's slot on a side stream (after the work queued so far), so the copy engines move it while the SMs
go on; `barrier` joins those copies and meets the peers. `exchange` is `put` of every block, then `barrier`. Shift's
overlapped all-to-alls (`sgl_sidp.shift.ulysses.heads_exchanged`, `tokens_exchanged_gemm`) compute the peers'
blocks first and put them while they compute their own. As a plain all-to-all the copies did not pay
(`sgl_sidp.bench.a2a`: 0.88-0.94x NCCL's time at SP2 on 2 x H100, 1.1-1.6x at SP4); hidden behind GEMMs they may.
"""

from __future__ import annotations

import math

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
        self.stream = torch.cuda.Stream(device) if torch.device(device).type == "cuda" else None  # the copies'
        self._views: dict = {}  # (rank, slot, shape) -> that GPU's receive view
        self.pending: list[torch.Tensor] = []  # sources `put` since the last `barrier`, kept alive until it

    @property
    def nbytes(self) -> int:
        """Bytes of the receive buffer on this GPU (both slots)."""
        return SLOTS * self.max_elems * self.buffer.element_size()

    def view(self, rank: int, slot: int, shape: tuple) -> torch.Tensor:
        """GPU `rank`'s receive view of `slot` (0 or 1) as a tensor of `shape` (mapped into this GPU: a copy into a
        peer's view travels over NVLink); `rank` = this GPU's own: what the peers put here.

        Raises:
            ValueError: `shape` holds more than `max_elems` elements.
        """
        key = (rank, slot, tuple(shape))
        got = self._views.get(key)
        if got is None:
            if math.prod(shape) > self.max_elems:
                raise ValueError(f"exchange: {tuple(shape)} exceeds the buffer's {self.max_elems} elements a slot")
            got = self._views[key] = self.handle.get_buffer(rank, tuple(shape), self.dtype, slot * self.max_elems)
        return got

    def put(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy `src` into `dst` (a part of a peer's `view`) after the work queued so far on the current stream, on
        this exchange's side stream (copy engines; on CPU at once). Valid for the peer after the next `barrier`.
        `src` is held until that `barrier` has joined the copy, so a temporary's memory is not handed to the next
        allocation on the current stream while the copy still reads it; the caller must not write into `src` before
        then."""
        self.pending.append(src)
        if self.stream is None:
            dst.copy_(src)
            return
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            dst.copy_(src)

    def barrier(self) -> None:
        """Join this GPU's `put`s into the current stream, then meet every GPU of the group (the symmetric memory's
        signal pads): after it, every block put to this GPU before its peers' barrier has landed."""
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
        self.pending.clear()  # their memory may go to the current stream's next allocations: ordered after the copies
        self.handle.barrier(channel=0)
        self.exchanges += 1

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
        shape = tuple(send.shape)
        for q in range(self.world):
            self.put(send[q], self.view(q, slot, shape)[self.rank])
        self.barrier()
        return self.view(self.rank, slot, shape)
