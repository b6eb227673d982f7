"""Layers a process never holds, not even while SGLang loads the model: shared placeholders.

A feature that serves some layers' weights from a peer (a ZeroDP sink: the experts; SiDP: the FFN layers
another rank owns) must not hold them for a moment when the model fills the GPU: Mixtral-8x7B is 93 GB on a
141 GB H200 (two of it do not fit one GPU), Llama-3.1-70B at TP1 is 141 GB. SGLang allocates a layer's
parameters in its module's `__init__` (`UnquantizedFusedMoEMethod.create_weights`, `MergedColumnParallelLinear`)
and the loader, or `initialize_dummy_weights`, writes them afterwards. Right after the `__init__` (an AFTER
hook), `LoadPlaceholders.take` points the chosen parameters at one placeholder per (name, shape, dtype,
device), shared by every such layer, so the layer's own storage is freed at once; the loader's writes into
the placeholder are harmless. After loading, every taken layer gets its values from the peer, never from the
placeholder: it is bound to a slot ring (`prefetch.binding.SlotBinding` replaces the placeholder) or given
storage of its own filled from the peer once (`materialize`).

Peak memory while loading: the placeholders, one layer's taken parameters, beyond what the process keeps. Each
layer's freed storage goes back to the GPU at once (`torch.cuda.empty_cache`), so that no later parameter is carved
out of it and no part of it stays reserved when SGLang sizes the KV cache from the free memory.
If SGLang's post-processing (`process_weights_after_loading`) replaces a parameter with a new tensor, that
layer was held in full after all; `left_placeholder` names such layers so the feature can say so.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping, Sequence

import torch

from sgl_sidp.prefetch.binding import param_at


class LoadPlaceholders:
    """Placeholders for the parameters of layers a process must not hold while its model is built.

    Attributes:
        taken: layer id -> the parameter names pointed at placeholders (in `take` order).
        layer_bytes: layer id -> bytes those parameters would have held.
        loading: inside `placing()` (the model is being built: the features' __init__ hooks take layers only then).
    """

    def __init__(self):
        self._ph: dict[tuple, torch.Tensor] = {}
        self._released: list[tuple[str, int, object]] = []  # (name, bytes, weak reference to the storage)
        self.taken: dict[int, tuple[str, ...]] = {}
        self.layer_bytes: dict[int, int] = {}
        self.loading = False

    @contextlib.contextmanager
    def placing(self, active: bool = True) -> Iterator[None]:
        """`loading` is `active` inside the block (around SGLang's `ModelRunner.load_model`), False after it, even
        when loading fails."""
        self.loading = active
        try:
            yield
        finally:
            self.loading = False

    def not_held_bytes(self, held: Sequence[int] = ()) -> int:
        """Bytes the taken layers, less `held` ones (`left_placeholder`), would hold beyond the placeholders."""
        return max(0, sum(b for lid, b in self.layer_bytes.items() if lid not in set(held)) - self.placeholder_bytes)

    @property
    def placeholder_bytes(self) -> int:
        """Bytes the placeholders take now (one layer's taken parameters; 0 after `release`)."""
        return sum(t.nbytes for t in self._ph.values())

    def take(self, layer_id: int, module: torch.nn.Module, names: Sequence[str]) -> None:
        """Point `module`'s parameters `names` (dotted paths, `Module.get_parameter`) at the shared placeholders,
        freeing their fresh storage; call it right after the module's `__init__`.

        Raises:
            AttributeError: `module` has no parameter at one of `names`.
        """
        params = [param_at(module, n) for n in names]
        keys = [(n, tuple(p.shape), p.dtype, p.device) for n, p in zip(names, params)]
        # Every placeholder first, then the rebinding that frees the layer's storage. Made after a freed parameter, a
        # placeholder is carved out of its cached block (the w2 placeholder out of a freed w13_weight's); once a kept
        # layer's w2 fills the rest of that block, the placeholder's share stays free inside a segment with a live
        # block after `release`, which `torch.cuda.empty_cache` cannot hand back. That fits what a ZeroDP sink showed
        # (its KV pool one w2_weight smaller than its source's: 0.41 GB on Qwen3-30B-A3B, and on Mixtral-8x7B 0.96 GB
        # free in such a segment, `memory_note`); not yet rerun on a GPU with this order.
        new = [(key, p) for key, p in zip(keys, params) if key not in self._ph]
        if any(p.is_cuda for _, p in new):
            torch.cuda.empty_cache()  # nor out of a block something freed before this layer: a segment of its own
        for key, p in new:
            self._ph[key] = torch.empty_like(p)
        nbytes, cuda = 0, False
        for key, p in zip(keys, params):
            nbytes += p.nbytes
            cuda |= p.is_cuda
            p.data = self._ph[key]
        self.taken[int(layer_id)] = tuple(names)
        self.layer_bytes[int(layer_id)] = nbytes
        if cuda:
            # Hand the freed storage back to the GPU now. Kept in PyTorch's cache, the next layers' parameters are
            # carved out of it and the rest of each block stays reserved while SGLang sizes the KV cache from the free
            # memory: 64 layers of Qwen3-32B's shapes, every other FFN taken, left 2.12 GiB reserved without this and
            # 0.07 GiB with it on an H100 (`tests/gpu/test_placeholders_memory_gpu.py`); SiDP's KV in a server then
            # came within 1.2 % of the planner's on 2 x H100 (2.9-3.7 % under it on 2 x H200 before).
            torch.cuda.empty_cache()

    def holds(self, p: torch.Tensor) -> bool:
        """Whether `p`'s storage is one of the placeholders."""
        ptr = p.untyped_storage().data_ptr()
        return any(ptr == ph.untyped_storage().data_ptr() for ph in self._ph.values())

    def left_placeholder(self, modules: Mapping[int, torch.nn.Module]) -> list[int]:
        """Taken layers (present in `modules`) whose parameters no longer point at a placeholder before the feature
        bound them: the loader or SGLang's post-processing gave them storage of their own (held in full)."""
        return sorted(lid for lid, names in self.taken.items() if lid in modules
                      and not all(self.holds(param_at(modules[lid], n)) for n in names))

    def materialize(self, modules: Mapping[int, torch.nn.Module], layers: Sequence[int],
                    remote: Mapping[tuple[int, str], torch.Tensor]) -> int:
        """Give the taken `layers` their values from `remote` ((layer, name) -> the peer's tensor, same shape
        and dtype): storage of their own where they still point at a placeholder, then one copy each.

        Returns: the bytes copied.

        Raises:
            KeyError: a layer that was not taken, or a (layer, name) missing from `remote`.
            ValueError: a remote tensor whose shape or dtype differs from the parameter's.
        """
        copied = 0
        for lid in layers:
            for n in self.taken[lid]:
                p, src = param_at(modules[lid], n), remote[(lid, n)]
                if src.shape != p.shape or src.dtype != p.dtype:
                    raise ValueError(f"layer {lid} {n}: the peer's tensor is {tuple(src.shape)} {src.dtype}, "
                                     f"ours {tuple(p.shape)} {p.dtype}")
                if self.holds(p):
                    p.data = torch.empty_like(p)
                p.data.copy_(src, non_blocking=True)
                copied += p.nbytes
        return copied

    def release(self) -> None:
        """Forget the placeholders (their memory goes once no parameter points at them any more); `still_held` then
        names those something still references."""
        from torch.multiprocessing.reductions import StorageWeakRef

        self._released += [(key[0], ph.nbytes, StorageWeakRef(ph.untyped_storage())) for key, ph in self._ph.items()]
        self._ph.clear()

    def still_held(self) -> list[tuple[str, int]]:
        """(parameter name, bytes) of each released placeholder whose storage something still references: a taken
        parameter the feature did not rebind, or a view or alias SGLang kept of one. That memory is neither weights nor
        KV cache: a ZeroDP sink that offloaded nothing held about 0.38 GiB more than both on 2 x H100, the size of
        Qwen3-30B-A3B's `w2_weight` placeholder (a lead, not established). Call once every taken parameter was bound
        or materialized."""
        import gc

        gc.collect()
        return [(name, n) for name, n, ref in self._released if not ref.expired()]

    def still_held_note(self) -> str:
        """One sentence naming `still_held`'s placeholders and their GB, or "" when none is."""
        held = self.still_held()
        if not held:
            return ""
        return (f"{sum(n for _, n in held) / 1e9:.2f} GB of load placeholders still referenced after loading "
                f"({', '.join(f'{name} {n / 1e9:.2f} GB' for name, n in held)}): memory neither its weights nor its "
                "KV cache account for")


#: Free bytes inside segments that also hold live blocks from which `memory_note` describes the worst segment
MIXED_SEGMENT_NOTE_BYTES = 64 << 20


def memory_note(segments: Sequence[Mapping], reserved: int, free: int, total: int) -> str:
    """Where this GPU's used memory sits, as one sentence: PyTorch's allocated bytes, what its caching allocator keeps
    reserved beyond them (and how much of that sits in segments that also hold live blocks, which
    `torch.cuda.empty_cache` cannot hand back), and what is used outside this process's allocator (CUDA contexts,
    communicators, other processes, VMM or IPC mappings).

    Args:
        segments: `torch.cuda.memory_snapshot()` entries of this device (`total_size`, `allocated_size`, bytes;
            `blocks`, each with `size` in bytes and `state`, "active_allocated" or "inactive"). Where the segments
            with live blocks keep `MIXED_SEGMENT_NOTE_BYTES` or more free, the one keeping most is described block by
            block.
        reserved: `torch.cuda.memory_reserved(device)`, bytes.
        free, total: `torch.cuda.mem_get_info(device)`, bytes.

    Why: a ZeroDP sink that offloaded nothing sized its KV pool one `w2_weight` placeholder smaller than its source's
    (0.41 GB on Qwen3-30B-A3B, 2 x H100; 0.96 GB on Mixtral-8x7B, 2 x H200) although every placeholder was released;
    this line on both sides says whether that memory is in PyTorch's cache or outside it. On 2 x H200 (Mixtral
    `auto`, nothing offloaded) it was in the cache, free inside a segment with live blocks (0.96 GB), which
    `torch.cuda.empty_cache` cannot hand back; the block layout says what was allocated inside a larger freed block.
    """
    allocated = sum(int(s.get("allocated_size", 0)) for s in segments)
    mixed = [s for s in segments if 0 < int(s.get("allocated_size", 0)) < int(s["total_size"])]
    pinned = sum(int(s["total_size"]) - int(s["allocated_size"]) for s in mixed)
    outside = total - free - reserved
    worst = ""
    if pinned >= MIXED_SEGMENT_NOTE_BYTES:  # which blocks share the segment says what was carved out of what
        seg = max(mixed, key=lambda s: int(s["total_size"]) - int(s["allocated_size"]))
        blocks = [f"{'live' if str(b.get('state', '')).startswith('active') else 'free'} {int(b['size']) / 1e9:.2f}"
                  for b in seg.get("blocks", [])]
        worst = (f"; the largest such: a {int(seg['total_size']) / 1e9:.2f} GB segment"
                 + (f" of blocks (GB, in address order) {', '.join(blocks[:6])}"
                    + (f" and {len(blocks) - 6} more" if len(blocks) > 6 else "") if blocks else ""))
    return (f"GPU memory used {(total - free) / 1e9:.2f} GB: PyTorch {allocated / 1e9:.2f} GB allocated, "
            f"{(reserved - allocated) / 1e9:.2f} GB reserved beyond it ({pinned / 1e9:.2f} GB of that in segments "
            f"with live blocks{worst}), {outside / 1e9:.2f} GB outside this process's allocator")


def device_memory_note(device: int) -> str:
    """`memory_note` for CUDA device `device`, read now (after `torch.cuda.empty_cache()`)."""
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    segments = [s for s in torch.cuda.memory_snapshot() if s.get("device") == device]
    return memory_note(segments, torch.cuda.memory_reserved(device), free, total)
