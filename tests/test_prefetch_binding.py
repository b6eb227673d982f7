"""`SlotBinding` on a small CPU stack: streamed layers compute on slots and match the all-local stack exactly."""

import pytest
import torch
from torch import nn

from sgl_sidp.prefetch.binding import SlotBinding
from sgl_sidp.prefetch.ring import SimulatedStreams

L, D = 6, 4  # layers, hidden size
NAMES = ("w1", "w2")
BOUND = (1, 3, 4, 5)  # streamed layers, in forward order
PARAM_BYTES = D * D * 4  # one float32 4x4 parameter


def mlp(module, x):
    """The layer's compute; reads the parameters at call time, so a layer on a slot uses the slot's contents."""
    return torch.tanh(x @ getattr(module, "w1")) @ getattr(module, "w2")


class Layer(nn.Module):
    def __init__(self, w1, w2):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(w1.clone()), nn.Parameter(w2.clone())

    def forward(self, x, around=None):
        return mlp(self, x) if around is None else around(mlp, self, x)


def weights(seed=0):
    """(layer, name) -> distinct random 4x4 weights for every layer."""
    g = torch.Generator().manual_seed(seed)
    return {(lid, n): torch.randn(D, D, generator=g) for lid in range(L) for n in NAMES}


def make_layers(w):
    return [Layer(w[(lid, "w1")], w[(lid, "w2")]) for lid in range(L)]


def reference(w, x):
    """The all-local stack: residual layers with the original weights."""
    for lid in range(L):
        x = x + torch.tanh(x @ w[(lid, "w1")]) @ w[(lid, "w2")]
    return x


def inputs(n):
    g = torch.Generator().manual_seed(99)
    return [torch.randn(3, D, generator=g) for _ in range(n)]


class CountingStreams(SimulatedStreams):
    """SimulatedStreams that counts the calls made on it."""

    def __init__(self, policy):
        super().__init__(policy)
        self.calls = {"wait": 0, "record": 0, "copy": 0}

    def wait(self, stream, event):
        self.calls["wait"] += 1
        super().wait(stream, event)

    def record(self, event, stream):
        self.calls["record"] += 1
        super().record(event, stream)

    def copy(self, dst, src, stream):
        self.calls["copy"] += 1
        super().copy(dst, src, stream)


def bind(layers, w, ops, **kw):
    """Bind BOUND of `layers` to 2 slots; the remote copies are clones of the original weights."""
    remote = {key: t.clone() for key, t in w.items()}
    return SlotBinding(dict(enumerate(layers)), NAMES, remote, BOUND, n_slots=2, ops=ops, **kw)


def slot_ptrs(binding, name):
    return [s[name].data_ptr() for s in binding.prefetcher.slots]


# --------------------------------------------------------------------------- numerics
def test_stack_is_sensitive_to_wrong_weights():
    """Sanity: swapping two streamed layers' weights changes the output, so a stale slot would show."""
    w, x = weights(), inputs(1)[0]
    swapped = dict(w)
    for n in NAMES:
        swapped[(1, n)], swapped[(3, n)] = w[(3, n)], w[(1, n)]
    assert not torch.equal(reference(w, x), reference(swapped, x))


@pytest.mark.parametrize("policy", ["earliest", "latest"])
def test_bound_stack_matches_reference_exactly(policy):
    """Three forwards through install_start and around are bit-identical to the all-local stack."""
    w = weights()
    layers = make_layers(w)
    ops = SimulatedStreams(policy)
    binding = bind(layers, w, ops)
    for slot in binding.prefetcher.slots:  # a read before its copy landed would show as NaN
        for t in slot.values():
            t.fill_(float("nan"))
    binding.install_start(layers[0])
    xs = inputs(3)
    outs = []
    for x in xs:
        for layer in layers:
            x = x + layer(x, around=binding.around)
        outs.append(x)
    ops.finish()
    assert binding.prefetcher.forwards_started == 3
    for out, x in zip(outs, xs):
        assert torch.equal(out, reference(w, x))


@pytest.mark.parametrize("policy", ["earliest", "latest"])
def test_explicit_start_forward_matches_reference(policy):
    """Calling start_forward directly, then every layer's compute through around, is exact too."""
    w = weights()
    layers = make_layers(w)
    ops = SimulatedStreams(policy)
    binding = bind(layers, w, ops)
    for x in inputs(3):
        binding.start_forward()
        y = x
        for layer in layers:
            y = y + binding.around(mlp, layer, y)
        assert torch.equal(y, reference(w, x))
    ops.finish()


# --------------------------------------------------------------------------- what binding does to the modules
def test_parameters_point_at_slots():
    """Streamed layers share a slot's storage (layer j in slot j % 2); the others keep their own weights."""
    w = weights()
    layers = make_layers(w)
    own = {lid: layers[lid].w1.data_ptr() for lid in range(L)}
    binding = bind(layers, w, SimulatedStreams("earliest"))
    for name in NAMES:
        ptrs = slot_ptrs(binding, name)
        assert ptrs[0] != ptrs[1]
        for j, lid in enumerate(BOUND):
            assert getattr(layers[lid], name).data_ptr() == ptrs[j % 2]
        for lid in (0, 2):
            assert getattr(layers[lid], name).data_ptr() not in ptrs
            assert torch.equal(getattr(layers[lid], name), w[(lid, name)])
    assert layers[0].w1.data_ptr() == own[0] and layers[2].w1.data_ptr() == own[2]
    assert isinstance(layers[1].w1, nn.Parameter)


def test_byte_counts_release_and_wrap():
    """freed_bytes: the streamed layers' params; slot_bytes: two layers' worth; release_cached once; wrap thrice."""
    calls, wrapped = [], []
    w = weights()
    binding = bind(make_layers(w), w, SimulatedStreams("latest"), release_cached=lambda: calls.append(1),
                   wrap=lambda f: wrapped.append(f.__name__) or f)
    assert binding.freed_bytes == len(BOUND) * len(NAMES) * PARAM_BYTES  # 4 * 2 * 64 = 512
    assert binding.slot_bytes == 2 * len(NAMES) * PARAM_BYTES  # 256
    assert calls == [1]
    assert wrapped == ["prefetch_start_forward", "prefetch_before_use", "prefetch_after_use"]


def test_layer_of():
    """layer_of names the streamed layer of a bound module, None for any other module."""
    w = weights()
    layers = make_layers(w)
    binding = bind(layers, w, SimulatedStreams("earliest"))
    assert [binding.layer_of(layers[lid]) for lid in range(L)] == [None, 1, None, 3, 4, 5]
    assert binding.layer_of(Layer(w[(1, "w1")], w[(1, "w2")])) is None  # equal weights, another module
    assert binding.layer_of(nn.Linear(2, 2)) is None


def test_around_unbound_module_just_calls_original():
    """For an unstreamed module, around returns the original's result and touches no stream or event."""
    w = weights()
    layers = make_layers(w)
    ops = CountingStreams("earliest")
    binding = bind(layers, w, ops)
    before = dict(ops.calls)
    x = inputs(1)[0]
    assert torch.equal(binding.around(mlp, layers[2], x), torch.tanh(x @ w[(2, "w1")]) @ w[(2, "w2")])
    assert binding.around(lambda m, a, b=0: (m, a, b), layers[0], 1, b=2) == (layers[0], 1, 2)
    assert ops.calls == before
    binding.start_forward()
    waits = ops.calls["wait"]
    binding.around(mlp, layers[1], x)
    assert ops.calls["wait"] > waits  # a streamed layer waits for its slot


# --------------------------------------------------------------------------- start hook
def test_install_start_triggers_start_forward():
    """Running the first layer's forward issues the first copies; removing the handle stops that."""
    w = weights()
    layers = make_layers(w)
    binding = bind(layers, w, SimulatedStreams("earliest"))
    handle = binding.install_start(layers[0])
    x = inputs(1)[0]
    assert torch.equal(layers[0](x), torch.tanh(x @ w[(0, "w1")]) @ w[(0, "w2")])
    assert binding.prefetcher.forwards_started == 1
    # copies run at once under "earliest": slot 0 holds layer 1, slot 1 holds layer 3
    for name in NAMES:
        assert torch.equal(getattr(layers[1], name), w[(1, name)])
        assert torch.equal(getattr(layers[3], name), w[(3, name)])
    handle.remove()
    layers[0](x)
    assert binding.prefetcher.forwards_started == 1


# --------------------------------------------------------------------------- refused inputs
def test_missing_module_is_refused():
    """A streamed layer without a module is a ValueError naming it."""
    w = weights()
    modules = dict(enumerate(make_layers(w)))
    del modules[4]
    with pytest.raises(ValueError, match=r"no module or no remote tensor for \[4\]"):
        SlotBinding(modules, NAMES, dict(w), BOUND, n_slots=2, ops=SimulatedStreams("earliest"))
    remote = dict(w)
    del remote[(BOUND[0], NAMES[0])]
    with pytest.raises(ValueError, match=rf"no module or no remote tensor for \[\({BOUND[0]}, '{NAMES[0]}'\)\]"):
        SlotBinding(dict(enumerate(make_layers(w))), NAMES, remote, BOUND, n_slots=2, ops=SimulatedStreams("earliest"))
    with pytest.raises(ValueError, match="no layers to stream"):
        SlotBinding(dict(enumerate(make_layers(w))), NAMES, dict(w), (), n_slots=2, ops=SimulatedStreams("earliest"))


def test_wrong_remote_shape_is_refused_and_leaves_modules_alone():
    """A remote tensor shaped unlike its parameter is a ValueError, raised before any parameter is rebound."""
    w = weights()
    layers = make_layers(w)
    ptrs = [layers[lid].w2.data_ptr() for lid in range(L)]
    remote = dict(w)
    remote[(3, "w2")] = torch.zeros(D, D + 1)
    with pytest.raises(ValueError, match=r"layer 3 w2: remote \(4, 5\)"):
        SlotBinding(dict(enumerate(layers)), NAMES, remote, BOUND, n_slots=2, ops=SimulatedStreams("earliest"))
    assert [layers[lid].w2.data_ptr() for lid in range(L)] == ptrs
