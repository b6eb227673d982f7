"""Compute-as-a-Service: one call of a layer on its owner, for the rows of every rank of a group.

SiDP paper (Zhao & He, "SiDP: Memory-Efficient Data Parallelism for Offline LLM Inference"), CaS:
at small batches, shipping activations to the rank that owns a layer's weights costs less than
shipping the weights. Every rank knows every rank's row count for this iteration (the per-iteration
all-gather of token counts that SGLang's DP attention already does), so no sizes travel: non-owners
with rows send them to the owner, the owner concatenates its own rows and theirs in rank order,
runs the layer once (`fn`, SGLang's MLP: one GEMM per weight over all rows) and sends each rank
back its slice. A rank with no rows (idle, or an IDLE batch) takes no part and costs the owner
nothing. Point-to-point ops of `torch.distributed`, so it runs on NCCL (one GPU per rank) and gloo (CPU tests, and
DP replicas folded onto one GPU, where NCCL refuses two ranks on one device): on gloo, CUDA rows travel through host
memory.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist


class RemoteCompute:
    """CaS over the ranks of one process group.

    Args:
        group: the process group (None: the default group); its ranks are the DP ranks sharing layers.
        collective: move rows with collectives (an all-gather of every rank's rows padded to the largest count, a
            broadcast of the owner's result) instead of point-to-point sends; then every rank must call `run` for
            every layer, ranks without rows too (`every_rank_every_layer`). Default: on gloo (the CPU path). Every rank
            receives every rank's padded rows and the owner's whole result: a correctness path, not a fast one.
    """

    def __init__(self, group=None, collective: bool | None = None):
        self.group = group
        # a group made outside this process's world (SGLang's init_custom_process_group) knows its own rank;
        # dist.get_rank(group) would map this process's rank in its *own* world into it
        self.rank = group.rank() if group is not None else dist.get_rank()
        self.world = group.size() if group is not None else dist.get_world_size()
        self.host_wire = dist.get_backend(group) == "gloo"  # gloo moves host tensors only
        self.collective = self.host_wire if collective is None else collective

    @property
    def every_rank_every_layer(self) -> bool:
        """Whether a rank without rows must still call `run` for each layer (the collective wire)."""
        return self.collective

    def _send(self, t: torch.Tensor, group_rank: int) -> None:
        dist.send(t.contiguous().cpu() if self.host_wire else t.contiguous(), group=self.group, group_dst=group_rank)

    def _recv(self, like: torch.Tensor, rows: int, width: int, group_rank: int) -> torch.Tensor:
        buf = torch.empty((rows, width), dtype=like.dtype, device="cpu" if self.host_wire else like.device)
        dist.recv(buf, group=self.group, group_src=group_rank)
        return buf.to(like.device) if self.host_wire else buf

    def run(self, owner: int, x: torch.Tensor, counts: Sequence[int], fn: Callable[[torch.Tensor], torch.Tensor],
            out_features: int) -> torch.Tensor:
        """This rank's rows of `fn` applied on `owner` to every rank's rows.

        Args:
            owner: group rank that holds the layer's weights and runs `fn`.
            x: this rank's rows, shape [counts[rank], in_features].
            counts: rows of every rank this iteration (identical on every rank), len == world size.
            fn: the layer, [N, in_features] -> [N, out_features]; called once, on the owner only, and
                only when some rank has rows.
            out_features: width of `fn`'s output (non-owners allocate their result with it).

        Returns:
            [counts[rank], out_features], dtype of `x`: rows i of the result are fn's rows of x[i].

        Raises:
            ValueError: `counts` does not match the group size or this rank's rows.
        """
        if len(counts) != self.world or counts[self.rank] != x.shape[0]:
            raise ValueError(f"counts {list(counts)} do not fit a group of {self.world} with {x.shape[0]} rows here")
        if self.collective:
            return self._run_collective(owner, x, counts, fn, out_features)
        mine = counts[self.rank]
        if self.rank != owner:
            if mine == 0:
                return x.new_empty((0, out_features))
            self._send(x, owner)
            return self._recv(x, mine, out_features, owner)
        if sum(counts) == 0:
            return x.new_empty((0, out_features))
        parts = []
        for r, n in enumerate(counts):
            if r == self.rank:
                parts.append(x)
            elif n:
                parts.append(self._recv(x, n, x.shape[1], r))
        y = fn(torch.cat(parts) if len(parts) > 1 else parts[0])
        start = 0
        mine_out = None
        for r, n in enumerate(counts):
            if r == self.rank:
                mine_out = y[start:start + n]
            elif n:
                self._send(y[start:start + n], r)
            start += n
        return mine_out

    def _run_collective(self, owner, x, counts, fn, out_features):
        m = max(counts)
        if m == 0:
            return x.new_empty((0, out_features))
        wire = "cpu" if self.host_wire else x.device
        padded = torch.zeros((m, x.shape[1]), dtype=x.dtype, device=wire)
        padded[: x.shape[0]] = x.to(wire)
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(parts, padded, group=self.group)
        total = sum(counts)
        if self.rank == owner:
            rows = torch.cat([p[:n] for p, n in zip(parts, counts) if n]).to(x.device)
            y = fn(rows).to(wire).contiguous()
        else:
            y = torch.empty((total, out_features), dtype=x.dtype, device=wire)
        dist.broadcast(y, group=self.group, group_src=owner)
        start = sum(counts[: self.rank])
        return y[start:start + counts[self.rank]].to(x.device)


class TorchCollectives:
    """`all_gather(out, inp)` and `broadcast(t, src)` of `torch.distributed` on `group` (the CPU/gloo stand-in for
    SGLang's `PyNcclCommunicator` in `BucketWire`; group ranks)."""

    def __init__(self, group=None):
        self.group = group
        self.world = group.size() if group is not None else dist.get_world_size()

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        dist.all_gather(list(out.chunk(self.world)), inp, group=self.group)

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        dist.broadcast(t, group=self.group, group_src=src)


class BucketWire:
    """CaS with static shapes, so that a decode step runs inside a CUDA graph: every rank sends exactly `bucket` rows
    (its own, zero-padded), the owner runs the layer once over all `world * bucket` rows, and one broadcast returns
    them; each rank keeps its own slice. SGLang's DP attention pads every rank to the largest captured batch the same
    way (`global_num_tokens`). Every rank must call `run` for every layer in layer order, ranks without rows too (an
    idle rank serves its owned layers with `bucket` rows of zeros, eagerly: NCCL matches an eager call with a
    replayed one).

    Args:
        comm: `all_gather(out [world * bucket, h], inp [bucket, h])` and `broadcast(t, src)` over the DP ranks of
            this TP rank, in group-rank order: SGLang's `PyNcclCommunicator` (graph-capturable) on GPU,
            `TorchCollectives` on CPU.
        rank, world: this rank and the group's size.
    """

    def __init__(self, comm, rank: int, world: int):
        self.comm, self.rank, self.world = comm, rank, world

    def run(self, owner: int, x: torch.Tensor, bucket: int, fn: Callable[[torch.Tensor], torch.Tensor] | None,
            out_features: int) -> torch.Tensor:
        """This rank's rows of `fn` applied on `owner` to `bucket` rows of every rank.

        Args:
            owner: group rank that runs `fn`.
            x: this rank's rows, [n, in_features], n <= bucket (n == bucket inside a captured graph: no padding op).
            bucket: rows every rank sends (the iteration's agreed graph size).
            fn: the layer, [world * bucket, in_features] -> [world * bucket, out_features]; called on the owner only.
            out_features: width of `fn`'s output.

        Returns:
            [n, out_features], dtype of `x`: a view of the broadcast result.

        Raises:
            ValueError: more rows than `bucket`, or no `fn` on the owner.
        """
        n = x.shape[0]
        if n > bucket:
            raise ValueError(f"{n} rows do not fit a bucket of {bucket}")
        if self.rank == owner and fn is None:
            raise ValueError("the owner needs the layer to run")
        if n < bucket:
            x = torch.cat([x, x.new_zeros((bucket - n, x.shape[1]))])
        gathered = x.new_empty((self.world * bucket, x.shape[1]))
        self.comm.all_gather(gathered, x.contiguous())
        if self.rank == owner:
            y = fn(gathered).contiguous()
        else:
            y = x.new_empty((self.world * bucket, out_features))
        self.comm.broadcast(y, owner)
        return y[self.rank * bucket: self.rank * bucket + n]
