"""SiDP WaS end to end on CPU: d ranks (threads) share the FFN layers they own through the VMM transport
(fake driver, real Unix sockets), stream the others into slots (simulated streams), and compute exactly what
a model holding every layer computes."""

import threading
import uuid
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from sgl_sidp.config import SidpConfig
from sgl_sidp.peer.vmm import PeerError, socket_address
from sgl_sidp.prefetch.ring import SimulatedStreams
from sgl_sidp.prefetch.schedules import peak_shift_order
from sgl_sidp.sidp.runtime import NAMES, SiDPError, SiDPRuntime, collect_mlps
from tests.test_peer_vmm import FakeDriver, close_exporter

H, I = 16, 24


class MLP(nn.Module):
    """The shape of SGLang's `Qwen2MLP`: `gate_up_proj.weight`, `down_proj.weight`, SiLU-and-mul."""

    def __init__(self, h=H, i=I):
        super().__init__()
        self.gate_up_proj = nn.Linear(h, 2 * i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x, forward_batch=None):
        g, u = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(nn.functional.silu(g) * u)


class Layer(nn.Module):
    def __init__(self, h=H, i=I):
        super().__init__()
        self.mlp = MLP(h, i)

    def forward(self, x):
        return x + self.mlp(x)


class Model(nn.Module):
    """`model.model.layers`, as SGLang's causal LMs; a different random tensor in every layer."""

    def __init__(self, n_layers, seed=0, h=H, i=I):
        super().__init__()
        torch.manual_seed(seed)
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(Layer(h, i) for _ in range(n_layers))
        self.model.start_layer, self.model.end_layer = 0, n_layers
        for p in self.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        for layer in self.model.layers:
            x = layer(x)
        return x


def runtime(slots=2):
    return SiDPRuntime(SimpleNamespace(config=SidpConfig.from_mapping({"mode": "sidp", "sidp": {"slots": slots, "service": "was"}}), listeners=[]))


def serve(n_layers, d, policy, slots=2):
    """Set up d ranks in threads (each exports, then imports from the others); returns [(model, runtime, ops)]."""
    device, tag = {}, uuid.uuid4().hex
    ranks = [(Model(n_layers), runtime(slots), SimulatedStreams(policy)) for _ in range(d)]
    errors = []

    def set_up(r):
        model, rt, ops = ranks[r]
        try:
            rt.setup(collect_mlps(model), r, 0, d, None, lambda k: socket_address(f"test-sidp-{tag}-dp{k}", 0, 0), ops,
                     driver=FakeDriver(device), can_access_peer=lambda a, b: True)
            if rt.binding is not None:
                rt.binding.install_start(model.model.layers[0])
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            errors.append(e)

    threads = [threading.Thread(target=set_up, args=(r,), daemon=True) for r in range(d)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return ranks


def hooked_forward(model, rt, x):
    """The model's forward with the AROUND hook on every MLP, as HookRegistry installs it on `Qwen2MLP.forward`."""
    originals = {}
    for layer in model.model.layers:
        mlp = layer.mlp
        originals[mlp] = mlp.forward
        mlp.forward = (lambda m: lambda *a, **k: rt.around_mlp_forward(lambda mod, *a2, **k2: originals[mod](*a2, **k2), m, *a, **k))(mlp)
    try:
        return model(x)
    finally:
        for mlp, f in originals.items():
            mlp.forward = f


def close(ranks):
    for _, rt, _ in ranks:
        for imp in rt.importers.values():
            imp.close()
        close_exporter(rt.exporter)


@pytest.mark.parametrize("policy", ["earliest", "latest"])
@pytest.mark.parametrize("d,n_layers,slots", [(2, 6, 2), (2, 5, 1), (3, 7, 2), (4, 8, 3), (4, 10, 0)])
def test_was_is_exact_on_every_rank(policy, d, n_layers, slots):
    """Every rank's output equals the full model's, bit for bit, over three forwards (slots reused);
    each rank owns layers l with l mod d == rank and freed every other layer's weights."""
    reference = Model(n_layers)
    ranks = serve(n_layers, d, policy, slots)
    try:
        for step in range(3):
            x = torch.randn(5 + step, H)
            want = reference(x)
            for r, (model, rt, ops) in enumerate(ranks):
                got = hooked_forward(model, rt, x)
                ops.finish()
                assert torch.equal(got, want), f"rank {r} step {step}"
        for r, (model, rt, _) in enumerate(ranks):
            assert rt.fetch_order == tuple(x for cycle in peak_shift_order(n_layers, d, r) for x in cycle)
            assert rt.owned == tuple(range(r, n_layers, d))
            assert rt.streamed == tuple(lid for lid in range(n_layers) if lid % d != r)
            per_layer = sum(p.numel() * p.element_size() for p in reference.model.layers[0].mlp.parameters())
            assert rt.binding.freed_bytes == per_layer * len(rt.streamed)
            assert rt.binding.slot_bytes == per_layer * (slots or max(2, d - 1))
            assert rt.binding.prefetcher.bytes_per_forward == per_layer * len(rt.streamed)
    finally:
        close(ranks)


def test_ring_plan_slots_and_fetch_order():
    """0 slots means d - 1 (at least 2); peak shifting needs d - 1 slots, else (or when asked) forward order."""
    from sgl_sidp.sidp.runtime import ring_plan
    from sgl_sidp.sidp.settings import SiDPSettings

    layers = list(range(8))
    assert ring_plan(SiDPSettings(), layers, 4, 1) == (3, (2, 3, 0, 6, 7, 4))
    assert ring_plan(SiDPSettings(), layers, 2, 0) == (2, (1, 3, 5, 7))
    assert ring_plan(SiDPSettings(slots=2), layers, 4, 1) == (2, (0, 2, 3, 4, 6, 7))  # too few slots to shift
    assert ring_plan(SiDPSettings(fetch_order="forward"), layers, 4, 1) == (3, (0, 2, 3, 4, 6, 7))


def test_owners_must_agree_on_shapes():
    """A rank whose model differs from an owner's (another --tp-size, say) is refused, naming the tensor."""
    device, tag = {}, uuid.uuid4().hex
    addr = lambda k: socket_address(f"test-sidp-{tag}-dp{k}", 0, 0)  # noqa: E731
    short = SimpleNamespace(config=SidpConfig.from_mapping({"mode": "sidp", "sidp": {"owner_timeout_s": 10}}), listeners=[])
    owner = SiDPRuntime(short)
    owner_model = Model(4)
    reader_model = Model(4)
    reader_model.model.layers[1].mlp.down_proj = nn.Linear(I, H + 1, bias=False)  # layer 1 is DP1's: irrelevant
    reader_model.model.layers[2].mlp.down_proj = nn.Linear(I, H + 1, bias=False)  # layer 2 is DP0's
    t = threading.Thread(target=lambda: _quiet(lambda: owner.setup(collect_mlps(owner_model), 0, 0, 2, None, addr,
                                                                    SimulatedStreams("earliest"),
                                                                    driver=FakeDriver(device),
                                                                    can_access_peer=lambda a, b: True)), daemon=True)
    t.start()
    reader = SiDPRuntime(short)
    with pytest.raises(SiDPError, match=r"(?s)disagree on 1 FFN tensor.*layer 2 down_proj.weight: shape \(16, 24\) on the owner"):
        reader.setup(collect_mlps(reader_model), 1, 0, 2, None, addr, SimulatedStreams("earliest"),
                     driver=FakeDriver(device), can_access_peer=lambda a, b: True)
    t.join(15)  # the owner reads DP1's published tensors (and refuses them too) before DP1's exporter closes
    assert not t.is_alive()
    close_exporter(reader.exporter)
    for imp in list(reader.importers.values()) + list(owner.importers.values()):
        imp.close()
    close_exporter(owner.exporter)


def _quiet(fn):
    try:
        fn()
    except BaseException:  # noqa: BLE001 - the owner side of a refused pairing
        pass


def test_an_owner_that_never_publishes_times_out_with_its_name():
    rt = SiDPRuntime(SimpleNamespace(config=SidpConfig.from_mapping({"mode": "sidp", "sidp": {"owner_timeout_s": 1}}), listeners=[]))
    tag = uuid.uuid4().hex
    with pytest.raises(PeerError, match="sidp owner DP1 TP0 did not publish its tensors within 1 s"):
        rt.setup(collect_mlps(Model(2)), 0, 0, 2, None, lambda k: socket_address(f"test-sidp-{tag}-dp{k}", 0, 0),
                 SimulatedStreams("earliest"), driver=FakeDriver({}))
    close_exporter(rt.exporter)


def test_collect_mlps_refuses_layers_without_the_dense_mlp():
    m = Model(3)
    m.model.layers[1].mlp = nn.Identity()
    with pytest.raises(SiDPError, match=r"without an MLP holding gate_up_proj.weight and down_proj.weight: 1 \(Identity\)"):
        collect_mlps(m)
    assert list(collect_mlps(Model(3))) == [0, 1, 2] and NAMES == ("gate_up_proj.weight", "down_proj.weight")


def test_metrics_count_was_forwards_and_streamed_bytes_from_the_batch_signal():
    """The runtime subscribes to the plugin context; each busy iteration streams one forward's bytes."""
    from prometheus_client import CollectorRegistry

    from sgl_sidp.control.batch_signal import BatchSignalObserver, IterationSignal
    from sgl_sidp.sidp.runtime import SiDPMetrics

    ranks = serve(4, 2, "earliest")
    try:
        _, rt, _ = ranks[1]
        rt.kv_tokens = 1234
        reg = CollectorRegistry()
        rt.metrics = SiDPMetrics(rt, {"dp_rank": "1"}, registry=reg)
        ctx_listeners = [rt._on_iteration]
        obs = BatchSignalObserver(log_interval=100, listeners=ctx_listeners)
        for sig in (IterationSignal("DECODE", 4, 4, 0, 4, 0), IterationSignal("EXTEND", 1, 9, 0, 9, 0),
                    IterationSignal("IDLE", 0, 0, 0, 0, 0)):
            obs.record(sig)
        per_layer = 2 * H * I * 4 + I * H * 4  # float32 gate_up and down
        s = lambda name, **extra: reg.get_sample_value(name, {"dp_rank": "1", **extra})  # noqa: E731
        assert s("sglang:sidp_sidp_forwards_total", mode="was") == 2  # idle iterations run no forward
        assert s("sglang:sidp_sidp_bytes_fetched_total") == 2 * 2 * per_layer  # layers 0 and 2 each forward
        assert (s("sglang:sidp_sidp_kv_tokens"), s("sglang:sidp_sidp_streamed_layers")) == (1234, 2)
        assert s("sglang:sidp_sidp_bytes_per_forward") == 2 * per_layer
        assert s("sglang:sidp_sidp_fetch_exposed_ms") == 0 and rt.fetch_exposure() == (None, None)  # not sampled
        rt.binding.prefetcher.stalls = SimpleNamespace(mean_ms=lambda: 0.25)  # as a StallSampler reads back
        rt.copy_gbps = 2 * per_layer / 1e6  # the forward's copies take 1 ms at this rate
        obs.record(IterationSignal("DECODE", 4, 4, 0, 4, 0))
        assert s("sglang:sidp_sidp_fetch_exposed_ms") == 0.25 and s("sglang:sidp_sidp_fetch_hidden_share") == 0.75
    finally:
        close(ranks)


def test_layer_of_prefix():
    from sgl_sidp.sidp.runtime import layer_of_prefix

    assert layer_of_prefix("model.layers.17.mlp.gate_up_proj") == 17
    assert layer_of_prefix("layers.0.mlp.gate_up_proj") == 0
    assert layer_of_prefix("model.mlp.gate_up_proj") is None and layer_of_prefix("") is None


def test_non_owned_layers_take_no_memory_while_the_model_loads_and_the_result_is_exact():
    """While the model is built (inside `around_load_model`), each non-owned MLP's parameters point at one shared
    placeholder per name right after its __init__; the loader writes into them harmlessly; after set-up every rank
    computes exactly what the full model computes."""
    n_layers, d = 6, 2
    reference = Model(n_layers)
    device, tag = {}, uuid.uuid4().hex
    ranks = []
    for r in range(d):
        rt = runtime()
        rt._on_loaded = lambda runner: None  # the CUDA set-up; `setup` runs below

        def build(runner, rt=rt):
            model = Model(n_layers, seed=99)  # "freshly allocated": other values than the checkpoint's
            for i, layer in enumerate(model.model.layers):
                layer.mlp.gate_up_proj.prefix = f"model.layers.{i}.mlp.gate_up_proj"
                rt.after_mlp_init(None, layer.mlp)
            rt.after_mlp_init(None, MLP())  # no prefix: left alone
            return model

        runner = SimpleNamespace(ps=SimpleNamespace(dp_rank=r), server_args=SimpleNamespace(dp_size=d))
        model = rt.around_load_model(build, runner)
        rt.after_mlp_init(None, model.model.layers[1 - r].mlp)  # not loading: nothing happens
        storages = {n: {layer.mlp.get_parameter(n).untyped_storage().data_ptr() for i, layer in
                        enumerate(model.model.layers) if i % d != r} for n in NAMES}
        assert all(len(v) == 1 for v in storages.values()), storages  # one placeholder per name, shared
        assert rt.never_held == set(range(1 - r, n_layers, d))
        model.load_state_dict(reference.state_dict())  # the loader writes every layer (placeholders too)
        ranks.append((model, rt, SimulatedStreams("latest")))
    threads = [threading.Thread(target=lambda m=m, rt=rt, ops=ops, r=r: rt.setup(
        collect_mlps(m), r, 0, d, None, lambda k: socket_address(f"test-sidp-{tag}-dp{k}", 0, 0), ops,
        driver=FakeDriver(device), can_access_peer=lambda a, b: True), daemon=True) for r, (m, rt, ops) in enumerate(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        for model, rt, ops in ranks:
            rt.binding.install_start(model.model.layers[0])
            x = torch.randn(4, H)
            assert torch.equal(hooked_forward(model, rt, x), reference(x))
            ops.finish()
    finally:
        close(ranks)


def test_vanilla_kv_estimate_gives_back_the_freed_weights_net_of_slots():
    from sgl_sidp.sidp.runtime import vanilla_kv_estimate

    # Qwen3-32B at d = 2: 32 non-owned layers of 786 MB freed, 2 slots held, 262,144 bytes of KV per token
    freed, slots, per_token = 32 * 786_000_000, 2 * 786_000_000, 262_144
    assert vanilla_kv_estimate(330_000, freed, slots, per_token) == 330_000 - (30 * 786_000_000) // per_token
    assert vanilla_kv_estimate(10, freed, slots, per_token) == 0


@pytest.mark.parametrize("kv_tokens, says", [
    (330_000, "a vanilla replica: about 240,"), (10, "a vanilla replica: none (its weights would not leave room for a KV cache; estimated")])
def test_the_kv_line_says_when_a_vanilla_replica_would_hold_no_kv(monkeypatch, caplog, kv_tokens, says):
    """Llama-3.1-70B at DP4 on 4 x H200 logged "a vanilla replica: about 0 (222465.00x ...)": a vanilla replica's
    141 GB of weights leave it no KV cache, which the line now says in words (and with its brackets paired: on 2 x
    H200 it read "none: ... KV cache (; estimated: ...)")."""
    import logging
    from types import SimpleNamespace

    import sgl_sidp.calibration.measure as measure
    from sgl_sidp.sidp.runtime import SiDPRuntime

    monkeypatch.setattr(measure, "kv_bytes_per_token", lambda runner: 262_144)
    rt = object.__new__(SiDPRuntime)
    rt.dp_rank, rt.tp_rank, rt.binding = 1, 0, SimpleNamespace(freed_bytes=32 * 786_000_000, slot_bytes=2 * 786_000_000)
    runner = SimpleNamespace(max_total_num_tokens=kv_tokens, server_args=SimpleNamespace(max_total_tokens=None))
    with caplog.at_level(logging.INFO, logger="sgl_sidp.sidp.runtime"):
        assert rt.on_alloc_memory_pool("r", runner) == "r"
    line = caplog.messages[-1]
    assert f"KV cache {kv_tokens} tokens" in line and says.replace(",", "") in line.replace(",", "")
    assert "0.00x" not in line and "(" in line and line.count("(") == line.count(")")


def test_joining_the_lockstep_group_logs_whom_it_waits_for(monkeypatch, tmp_path, caplog):
    """A DP rank meeting the others (`replica_group`: SGLang's `init_custom_process_group` on a FileStore) logs, every
    `PROGRESS_EVERY_S` (10 s in a server) while it waits, the group, how many it waits for, the store and the limit."""
    import logging
    import re
    import time

    import sglang.srt.utils.common as common

    from sgl_sidp import process
    from sgl_sidp.control import lockstep

    monkeypatch.setattr(process, "PROGRESS_EVERY_S", 0.02)
    monkeypatch.setattr(common, "init_custom_process_group", lambda **kw: time.sleep(0.2) or kw["group_name"])
    with caplog.at_level(logging.INFO, logger=lockstep.__name__):
        assert lockstep.replica_group("lockstep-30000-4242-tp0", 3, 1, "gloo", 900, str(tmp_path)) == \
            "sgl-sidp-lockstep-30000-4242-tp0"
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(re.fullmatch(
        r"sgl-sidp: rank 1 of the gloo group lockstep-30000-4242-tp0 waits for the other 2 member\(s\) to join "
        rf"\(store {re.escape(str(tmp_path))}/sgl-sidp-lockstep-30000-4242-tp0\.store\): 0 s so far, limit 900 s", m)
        for m in lines), lines


def test_was_says_when_decode_steps_cannot_hide_its_copies():
    """Qwen3-32B-like: 63 ms of copies per forward against 20-60 ms decode forwards (batch 1-256): hidden from no
    batch, a warning with the bound; copies the batch-1 step hides: no line."""
    from sgl_sidp.calibration.table import Calibration
    from sgl_sidp.sidp.runtime import was_verdict

    cal = Calibration("m", "NVIDIA H100 80GB HBM3", {1: 20.0, 64: 30.0, 256: 60.0}, {4096: 400.0}, None, "test")
    line = was_verdict(cal, 63.0)
    assert line == ("WaS hides its 63.0 ms of copies per forward at no decode batch up to 256; below that a decode step "
                    "takes at least 63.0 ms, up to 3.1x vanilla's 20.0 ms at batch 1 (predicted); --sidp-service auto "
                    "runs those steps in CaS")
    assert "from decode batches of" in was_verdict(cal, 40.0)
    assert was_verdict(cal, 10.0) is None


def _measure_b_th_rank(rank, world, sizes):
    """One DP rank of --sidp-b-th-measure with made-up step times: WaS a fixed cost that rank 1 pays more of, CaS
    growing with the rows; rank 0's own times alone would give another B_th. Returns measure_b_th's answer and the
    sizes this rank timed in WaS, in order."""
    import torch.distributed as dist

    rt = SiDPRuntime(SimpleNamespace(config=SidpConfig.from_mapping({"mode": "sidp", "sidp": {"service": "auto"}}),
                                     listeners=[]))
    was, timed = {0: 10.0, 1: 14.0}[rank], []

    def time_ms(rows, cas):
        if not cas:
            timed.append(rows)
        return (4.0 + rows / 8) if cas else was + rows / 64

    return (*rt.measure_b_th(time_ms, sizes, dist.group.WORLD), timed)


def test_measured_b_th_is_the_same_on_every_rank_from_the_slowest_ranks_steps():
    from tests.gloo_procs import spawn

    sizes = [1, 8, 16, 32, 48, 64, 96, 128]
    out = spawn(_measure_b_th_rank, 2, sizes)
    assert out[0] == out[1]
    b_th, points, extrapolated, timed = out[0]
    # the slowest rank's WaS (14 + rows/64) is no slower than CaS (4 + rows/8) from 96 rows on; rank 0's alone: 64
    assert b_th == 96.0 and points[96] == (14.0 + 96 / 64, 4.0 + 96 / 8) and not extrapolated
    # WaS timed where the bisection needs it (the largest, then 32, 64, 96), CaS at every size; every rank alike
    assert timed == [128, 32, 64, 96] and points[1] == (None, 4.0 + 1 / 8)
    # WaS slower at the largest size: timed there and at the next, the lines meet at 10 / (1/8 - 1/64) = 91.4 rows
    out = spawn(_measure_b_th_rank, 2, [1, 8, 16])
    assert out[0][0] == 92.0 and out[0][2] and out[0][3] == [16, 8]
    # one size where WaS loses: CaS at every batch
    out = spawn(_measure_b_th_rank, 2, [8])
    assert out[0][:3] == (1e9, {8: (14.0 + 8 / 64, 4.0 + 1.0)}, False)


def test_extrapolated_b_th_needs_cas_to_grow_faster():
    from sgl_sidp.calibration.cost import extrapolated_win

    # Qwen3-32B on 2 x H100 (the slowest rank's decode ms at 192 and 256 rows): WaS copy-bound, CaS growing
    was, cas = {192: 75.25, 256: 74.11}, {192: 53.86, 256: 64.05}
    assert extrapolated_win(was.get, cas.get, [192, 256]) == 256 + 57  # 10.06 ms / 0.177 ms per row = 56.8 rows
    assert extrapolated_win(lambda x: 10 + x, lambda x: x, [1, 2]) is None  # parallel lines never meet
    assert extrapolated_win(lambda x: 10 + x, lambda x: 2 * x, [1, 2]) == 10  # they meet at 10
