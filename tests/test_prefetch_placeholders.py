"""`sgl_sidp.prefetch.placeholders.LoadPlaceholders`: layers a process never holds while its model loads."""

import pytest
import torch

from sgl_sidp.prefetch.placeholders import LoadPlaceholders

NAMES = ("up.weight", "down.weight")


class Layer(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.up = torch.nn.Linear(4, 8, bias=False)
        self.down = torch.nn.Linear(8, 4, bias=False)
        self.up.weight.data = torch.randn(8, 4, generator=g)
        self.down.weight.data = torch.randn(4, 8, generator=g)

    def forward(self, x):
        return self.down(self.up(x))


def storage(p):
    return p.untyped_storage().data_ptr()


def test_taken_layers_share_one_placeholder_per_name_and_get_the_peers_values_back():
    """Layers 1 and 3 are taken right after their __init__: one storage per name for both, the loader's writes land
    there harmlessly, and `materialize` gives each its own storage with the peer's values: the model then computes
    exactly what the peer's model computes."""
    peer = {i: Layer(seed=i) for i in range(4)}
    layers, ph = {}, LoadPlaceholders()
    for i in range(4):
        layers[i] = Layer(seed=100 + i)  # fresh values, not the checkpoint's
        if i in (1, 3):
            ph.take(i, layers[i], NAMES)
    assert {storage(layers[1].up.weight)} == {storage(layers[3].up.weight)}
    assert storage(layers[1].up.weight) != storage(layers[1].down.weight)
    assert ph.taken == {1: NAMES, 3: NAMES}
    assert ph.layer_bytes == {1: 2 * 32 * 4, 3: 2 * 32 * 4} and ph.placeholder_bytes == 2 * 32 * 4
    assert ph.not_held_bytes() == 2 * 32 * 4  # two layers' worth, less the placeholders
    for i in range(4):  # the loader writes every layer, placeholders included
        layers[i].load_state_dict(peer[i].state_dict())
    assert ph.left_placeholder(layers) == []
    remote = {(i, n): peer[i].get_parameter(n).detach() for i in (1, 3) for n in NAMES}
    assert ph.materialize(layers, [1, 3], remote) == 2 * 2 * 32 * 4
    ph.release()
    assert storage(layers[1].up.weight) != storage(layers[3].up.weight)
    x = torch.randn(3, 4)
    for i in range(4):
        assert torch.equal(layers[i](x), peer[i](x))


def test_every_placeholder_is_made_before_any_of_the_layers_storage_is_freed(monkeypatch):
    """A placeholder made after the layer's first parameter was rebound would be carved out of that parameter's freed
    block on a GPU (`take`'s comment): each is made while the layer still holds all of its own storage."""
    from sgl_sidp.prefetch import placeholders

    layer, ph, made = Layer(seed=1), LoadPlaceholders(), []
    own = {n: storage(layer.get_parameter(n)) for n in NAMES}

    def empty_like(p):
        made.append({n: storage(layer.get_parameter(n)) == own[n] for n in NAMES})
        return torch.empty(p.shape, dtype=p.dtype)

    monkeypatch.setattr(placeholders.torch, "empty_like", empty_like)
    ph.take(0, layer, NAMES)
    assert made == [{"up.weight": True, "down.weight": True}] * 2
    assert all(ph.holds(layer.get_parameter(n)) for n in NAMES)


def test_a_parameter_sglang_replaced_while_loading_is_named_and_still_gets_the_peers_values():
    """Post-processing that swaps a taken parameter for a new tensor (held in full) is reported, not hidden."""
    peer, layer, ph = Layer(seed=1), Layer(seed=2), LoadPlaceholders()
    ph.take(5, layer, NAMES)
    layer.down.weight = torch.nn.Parameter(layer.down.weight.data * 2, requires_grad=False)  # a re-layout
    assert ph.left_placeholder({5: layer}) == [5]
    assert ph.not_held_bytes(held=[5]) == 0
    own = storage(layer.down.weight)
    ph.materialize({5: layer}, [5], {(5, n): peer.get_parameter(n).detach() for n in NAMES})
    assert storage(layer.down.weight) == own  # copied in place
    assert torch.equal(layer.down.weight, peer.down.weight) and torch.equal(layer.up.weight, peer.up.weight)


def test_materialize_refuses_a_peer_tensor_of_another_shape():
    layer, ph = Layer(seed=1), LoadPlaceholders()
    ph.take(0, layer, NAMES)
    with pytest.raises(ValueError, match=r"layer 0 up.weight: the peer's tensor is \(4, 4\)"):
        ph.materialize({0: layer}, [0], {(0, "up.weight"): torch.zeros(4, 4), (0, "down.weight"): torch.zeros(4, 8)})
    with pytest.raises(KeyError):
        ph.materialize({0: layer}, [1], {})


def test_placing_is_on_only_inside_the_block_even_when_loading_fails():
    ph = LoadPlaceholders()
    with ph.placing(False):
        assert not ph.loading
    with pytest.raises(RuntimeError):
        with ph.placing():
            assert ph.loading
            raise RuntimeError("out of memory while loading")
    assert not ph.loading


def test_a_placeholder_something_still_references_after_release_is_named():
    """Once every taken parameter has its own storage, the released placeholders are freed; one that an object still
    references (here a view, as SGLang might keep of a weight) is named with its bytes: memory neither weights nor
    KV cache account for."""
    layers, ph = {i: Layer(seed=i) for i in range(2)}, LoadPlaceholders()
    ph.take(1, layers[1], NAMES)
    remote = {(1, n): Layer(seed=7).get_parameter(n).detach() for n in NAMES}
    kept = layers[1].down.weight.data.view(-1)  # a view of the down placeholder, taken while loading
    ph.materialize(layers, [1], remote)
    ph.release()
    assert ph.still_held() == [("down.weight", 4 * 8 * 4)]
    del kept
    assert ph.still_held() == []


def test_the_note_names_each_placeholder_still_held_in_one_sentence():
    ph = LoadPlaceholders()
    assert ph.still_held_note() == ""
    layer = Layer(seed=1)
    ph.take(1, layer, NAMES)
    ph.release()  # the parameters still point at them: both held
    assert ph.still_held_note() == ("0.00 GB of load placeholders still referenced after loading (up.weight 0.00 GB, "
                                    "down.weight 0.00 GB): memory neither its weights nor its KV cache account for")


def test_memory_note_splits_used_memory_into_allocated_cached_and_outside():
    """10 GB used of 80: 6 GB allocated in two segments (one of 4 GB holding 3 GB live: 1 GB the cache cannot hand
    back), 2 GB more reserved (one free segment of 1 GB among them), so 8 GB reserved and 2 GB outside the
    allocator."""
    from sgl_sidp.prefetch.placeholders import memory_note

    G = 10**9
    segments = [{"total_size": 3 * G, "allocated_size": 3 * G}, {"total_size": 4 * G, "allocated_size": 3 * G},
                {"total_size": 1 * G, "allocated_size": 0}]
    note = memory_note(segments, reserved=8 * G, free=70 * G, total=80 * G)
    assert note == ("GPU memory used 10.00 GB: PyTorch 6.00 GB allocated, 2.00 GB reserved beyond it (1.00 GB of that "
                    "in segments with live blocks; the largest such: a 4.00 GB segment), 2.00 GB outside this "
                    "process's allocator")
    blocks = [{"size": 1 * G, "state": "active_allocated"}, {"size": 1 * G, "state": "inactive"},
              {"size": 2 * G, "state": "active_allocated"}]
    segments[1]["blocks"] = blocks
    note = memory_note(segments, reserved=8 * G, free=70 * G, total=80 * G)
    assert ("(1.00 GB of that in segments with live blocks; the largest such: a 4.00 GB segment of blocks (GB, in "
            "address order) live 1.00, free 1.00, live 2.00), 2.00 GB outside") in note
    segments[1]["allocated_size"] = 4 * G - (1 << 20)  # 1 MiB free there: not worth a word
    assert "largest such" not in memory_note(segments, reserved=8 * G, free=70 * G, total=80 * G)
