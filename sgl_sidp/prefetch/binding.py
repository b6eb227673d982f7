"""Binding modules' weights to a slot ring: what any feature that streams layers needs (ZeroDP, SiDP WaS).

`SlotBinding` takes per-layer modules (SGLang's `FusedMoE`, a dense MLP...), the names of the
parameters to stream and a readable remote copy of each, and:

1. allocates `n_slots` slots shaped like one layer's parameters, once;
2. points every streamed layer's parameters at its slot (`param.data = slot`), so its own copy is
   freed and SGLang's own layer code computes on the slot;
3. builds the `SlotPrefetcher` and its three sync points, and exposes them as `around(...)` (for an
   AROUND hook on the module's compute) and `start_forward` (installed as a torch forward pre-hook
   on the first decoder layer: `sgl_sidp.hooks.TORCH_HOOKS`).

Modules are recognised by identity, never by attributes pinned on them. Runs on CPU with
`SimulatedStreams` (tests) and on CUDA with `StreamOps` and SGLang's `eager_on_graph` as `wrap`.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

from sgl_sidp.prefetch.ring import PrefetchSchedule, SlotPrefetcher, sync_points


def param_at(module: torch.nn.Module, name: str) -> torch.nn.Parameter:
    """The parameter at dotted path `name` inside `module` ("down_proj.weight"; `Module.get_parameter`).

    Raises:
        AttributeError: no such submodule or parameter.
    """
    return module.get_parameter(name)


def decoder_layers(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    """`(layer index, decoder layer)` of an SGLang causal LM: `model.model.layers[start_layer:end_layer]`.

    Raises:
        ValueError: the model has no `.model.layers`.
    """
    decoder = getattr(model, "model", model)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers: cannot find its decoder layers")
    start = getattr(decoder, "start_layer", 0)
    end = getattr(decoder, "end_layer", len(layers))
    return [(i, layers[i]) for i in range(start, end)]


def first_decoder_layer(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder layer a forward starts at, where `SlotBinding.install_start` goes (`sgl_sidp.hooks.TORCH_HOOKS`).

    Raises:
        ValueError: the model has no `.model.layers`.
    """
    return decoder_layers(model)[0][1]


class SlotBinding:
    """Streamed layers of one model, bound to a ring of slots.

    Args:
        modules: layer id -> module holding that layer's parameters `names`.
        names: parameter names streamed per layer, dotted paths inside the module (("w13_weight",
            "w2_weight") of a `FusedMoE`; ("gate_up_proj.weight", "down_proj.weight") of a dense MLP).
        remote: `(layer_id, name)` -> readable tensor with the owner's values (same shape/dtype as
            the local parameter).
        layers: streamed layer ids, in forward order.
        n_slots: slots in the ring (>= 1).
        fetch_order: the order the layers are fetched in (default: `layers`' order; see `PrefetchSchedule`).
        ops: stream/event operations (`StreamOps` on CUDA, `SimulatedStreams` on CPU).
        wrap: applied to each sync point (`eager_on_graph(enable=True)` inside SGLang; identity in tests).
        release_cached: called once the originals are dropped (`torch.cuda.empty_cache` on CUDA),
            so their memory goes back to the driver before SGLang sizes its KV cache.
        sample_every: time the slot waits of one eager forward in this many (`StallSampler`; 0: never).

    Attributes:
        freed_bytes: bytes of the streamed layers' own parameters dropped.
        slot_bytes: bytes of the slots.

    Raises:
        ValueError: no layers; a streamed layer has no module or no remote tensor; streamed layers
            whose parameters differ in shape or dtype (they share slots); a remote tensor whose
            shape/dtype differs from its parameter's (`SlotPrefetcher`).
    """

    def __init__(self, modules: Mapping[int, torch.nn.Module], names: Sequence[str], remote: Mapping,
                 layers: Sequence[int], n_slots: int, ops, wrap: Callable[[Callable], Callable] = lambda f: f,
                 release_cached: Callable[[], None] = lambda: None, fetch_order: Sequence[int] | None = None,
                 sample_every: int = 0):
        if not layers:
            raise ValueError("no layers to stream")
        missing = [lid for lid in layers if lid not in modules]
        missing += [(lid, n) for lid in layers for n in names if (lid, n) not in remote]
        if missing:
            raise ValueError(f"no module or no remote tensor for {missing}")
        self.layers = tuple(layers)
        self.schedule = PrefetchSchedule(self.layers, n_slots=n_slots, fetch_order=fetch_order)
        first = modules[self.layers[0]]
        odd = [(lid, n) for lid in self.layers for n in names
               if param_at(modules[lid], n).shape != param_at(first, n).shape or param_at(modules[lid], n).dtype != param_at(first, n).dtype]
        if odd:
            raise ValueError(f"streamed parameters must share one shape and dtype per name; these differ from layer {self.layers[0]}'s: {odd}")
        slots = [{n: torch.empty_like(param_at(first, n)) for n in names} for _ in range(n_slots)]
        self.slot_bytes = sum(t.numel() * t.element_size() for s in slots for t in s.values())
        self.freed_bytes = 0
        remote_used = {(lid, n): remote[(lid, n)] for lid in self.layers for n in names}
        self.prefetcher = SlotPrefetcher(self.schedule, remote_used, slots, ops, sample_every=sample_every)
        for lid in self.layers:
            for n in names:
                p = param_at(modules[lid], n)
                self.freed_bytes += p.numel() * p.element_size()
                p.data = slots[self.schedule.slot_of(lid)][n]
        release_cached()
        self.start_forward, self._before, self._after = sync_points(self.prefetcher, wrap)
        self._layer_of = {id(modules[lid]): lid for lid in self.layers}

    def layer_of(self, module: torch.nn.Module) -> int | None:
        """The streamed layer id `module` computes, or None if it is not streamed."""
        return self._layer_of.get(id(module))

    def around(self, original: Callable, module: torch.nn.Module, *args, **kwargs):
        """Run `original(module, ...)`; for a streamed layer, wait for its slot first and release it after."""
        lid = self._layer_of.get(id(module))
        if lid is None:
            return original(module, *args, **kwargs)
        self._before(lid)
        out = original(module, *args, **kwargs)
        self._after(lid)
        return out

    def install_start(self, first_layer: torch.nn.Module, enabled: Callable[[], bool] = lambda: True):
        """Issue the first copies when `first_layer` (the model's first decoder layer) starts a forward for which
        `enabled()` holds (SiDP: not in a CaS iteration, where no streamed layer is used).

        The torch forward pre-hook `sgl_sidp.hooks.TORCH_HOOKS["slot_ring_start"]`; returns its handle.
        """
        return first_layer.register_forward_pre_hook(lambda module, args: self.start_forward() if enabled() else None)
