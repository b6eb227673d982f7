"""SiDP Compute-as-a-Service through `SiDPRuntime`'s hook bodies, ranks as gloo processes (no SGLang, no GPU).

Each process is one DP rank holding a toy dense model whose FFN layers have SGLang's parameter names; a "forward"
calls the MLP of every layer through `around_mlp_forward`, as SGLang's decoder layers call `Qwen2MLP.forward` with
the AROUND hook installed. A scheduler iteration is `step(tokens)` (the body of the AFTER
`Scheduler.get_next_batch_to_run` hook) followed by the forward of the ranks that have tokens.
"""

import types

import pytest
import torch
import torch.distributed as dist

from sgl_sidp.config import SidpConfig
from sgl_sidp.control.lockstep import Iteration, Lockstep
from sgl_sidp.control.mode_switch import ServeMode
from sgl_sidp.remote_compute.cas import RemoteCompute
from sgl_sidp.sidp.runtime import SiDPError, SiDPRuntime
from tests.gloo_procs import spawn

H, I, LAYERS = 8, 12, 6


def same(y, ref):
    """float64 results of one GEMM over more rows may differ from a GEMM over fewer in the last bits (the BLAS
    blocks by row count); anything a mix-up or a lost row would do is many orders of magnitude larger."""
    return torch.allclose(y, ref, rtol=1e-12, atol=1e-12)


class ToyMLP(torch.nn.Module):
    """Holds `gate_up_proj.weight` [2I, H] and `down_proj.weight` [H, I] like SGLang's `Qwen2MLP`."""

    def __init__(self, layer):
        super().__init__()
        g = torch.Generator().manual_seed(1000 + layer)  # a different tensor per layer: a mix-up would show
        self.gate_up_proj = torch.nn.Linear(H, 2 * I, bias=False, dtype=torch.float64)
        self.down_proj = torch.nn.Linear(I, H, bias=False, dtype=torch.float64)
        with torch.no_grad():
            self.gate_up_proj.weight.copy_(torch.randn(2 * I, H, generator=g, dtype=torch.float64) / H ** 0.5)
            self.down_proj.weight.copy_(torch.randn(H, I, generator=g, dtype=torch.float64) / I ** 0.5)

    def forward(self, x, forward_batch=None):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(torch.nn.functional.silu(gate) * up)


def original(mlp, x, *args, **kwargs):
    """What HookRegistry hands an AROUND hook: the unhooked `forward`."""
    return ToyMLP.forward(mlp, x, *args, **kwargs)


def rows(rank, it, n):
    return torch.randn(n, H, generator=torch.Generator().manual_seed(97 * rank + it), dtype=torch.float64)


@torch.no_grad()
def reference(x):
    for lid in range(LAYERS):
        x = x + ToyMLP(lid)(x)
    return x


class HookedModel(torch.nn.Module):
    """Calls each MLP as SGLang's decoder layers do, with the AROUND hook body in between."""

    def __init__(self, rt, mlps):
        super().__init__()
        self.rt, self.mlps = rt, mlps

    def forward(self, x):
        for lid in range(LAYERS):
            x = x + self.rt.around_mlp_forward(original, self.mlps[lid], x, forward_batch=None)
        return x


def runtime(rank, world, service, b_th=None, poison=True, collective=False):
    cfg = SidpConfig.model_validate({"mode": "sidp", "sidp": {"service": service}})
    rt = SiDPRuntime(types.SimpleNamespace(config=cfg, listeners=[]))
    mlps = {lid: ToyMLP(lid) for lid in range(LAYERS)}
    rt.dp_rank, rt.d, rt.mlps = rank, world, mlps
    rt._layer_of = {id(m): lid for lid, m in mlps.items()}
    rt.owned = tuple(lid for lid in mlps if lid % world == rank)
    if poison:  # a rank never holds the layers it does not own: any use of them would give NaN
        for lid, m in mlps.items():
            if lid not in rt.owned:
                for p in m.parameters():
                    p.data = torch.full_like(p, float("nan"))
    rt.start_lockstep(Lockstep(None, rt.switch_for(b_th)), RemoteCompute(collective=collective), b_th, "test")
    return rt, HookedModel(rt, mlps)


def run_iterations(rt, model, rank, plan):
    """`plan`: per iteration, every rank's tokens. Returns (per iteration: mode, this rank's output or None)."""
    out = []
    for it, counts in enumerate(plan):
        with torch.no_grad():
            step = rt.step(counts[rank])
        if counts[rank]:
            with torch.no_grad():  # SGLang runs its forwards in inference mode
                y = model(rows(rank, it, counts[rank]))
            out.append((step.mode.value, y.numpy(), rt.cas_now))
        else:
            out.append((step.mode.value, None, rt.cas_now))
    return out


def cas_rank(rank, world, plan, collective):
    rt, model = runtime(rank, world, "cas", collective=collective)
    return run_iterations(rt, model, rank, plan)


@pytest.mark.parametrize("collective", [False, True], ids=["p2p", "collective"])
@pytest.mark.parametrize("world", [2, 3])
def test_cas_equals_a_model_holding_every_layer(world, collective):
    """--sidp-service cas: every rank's output equals the full model's (float64, to 1e-12), though it holds only its own
    layers (the others are NaN); a rank with no batch in an iteration serves its owned layers to the busy ones."""
    plan = [[3] * world, [5 if r == 0 else 0 for r in range(world)], [0] + [2] * (world - 1), [1] * world,
            [0] * world, [7] + [1] * (world - 1)]
    got = spawn(cas_rank, world, plan, collective)
    for r in range(world):
        for it, (mode, y, cas) in enumerate(got[r]):
            assert mode == "cas" and cas
            if plan[it][r]:
                assert same(torch.from_numpy(y), reference(rows(r, it, plan[it][r]))), (r, it)
            else:
                assert y is None


def auto_rank(rank, world, plan, b_th):
    rt, model = runtime(rank, world, "auto", b_th=b_th, poison=False)
    return run_iterations(rt, model, rank, plan), rt.lockstep.switch.switches


def test_auto_switches_alike_on_every_rank_with_hysteresis():
    """auto, B_th 8 tokens per rank, hysteresis 0.25 (back to CaS below 6): the mean of the gathered counts decides,
    every rank takes the same mode at the same iteration, CaS iterations are eager (cas_now) and exact."""
    plan = [[2, 2], [10, 8], [7, 6], [6, 0], [5, 5], [0, 1], [16, 0]]
    want = ["cas", "was", "was", "cas", "cas", "cas", "was"]  # means 2, 9, 6.5, 3, 5, 0.5, 8
    got = spawn(auto_rank, 2, plan, 8.0)
    for r in (0, 1):
        iters, switches = got[r]
        assert [m for m, _, _ in iters] == want and switches == 3
        assert [c for _, _, c in iters] == [m == "cas" for m in want]
        for it, (mode, y, _) in enumerate(iters):
            if plan[it][r]:
                assert same(torch.from_numpy(y), reference(rows(r, it, plan[it][r])))


def test_rows_other_than_announced_are_refused():
    """A forward whose rows differ from the tokens the rank announced for the iteration stops with SiDP's error
    before anything is sent (the owner would otherwise wait for rows that never come)."""
    cfg = SidpConfig.model_validate({"mode": "sidp", "sidp": {"service": "cas"}})
    rt = SiDPRuntime(types.SimpleNamespace(config=cfg, listeners=[]))
    mlp = ToyMLP(1)
    rt.dp_rank, rt.d, rt.mlps, rt._layer_of = 0, 2, {1: mlp}, {id(mlp): 1}
    rt.lockstep = types.SimpleNamespace(current=Iteration((4, 2), ServeMode.CAS))
    with pytest.raises(SiDPError, match="layer 1 got 3 rows in a CaS iteration announced with 4 tokens"):
        rt.around_mlp_forward(original, mlp, torch.zeros(3, H, dtype=torch.float64))


def test_graphs_only_outside_cas_iterations():
    """The can_run_graph hook body: SGLang's answer before the first lockstep iteration and in WaS, False in CaS."""
    cfg = SidpConfig.model_validate({"mode": "sidp", "sidp": {"service": "auto"}})
    rt = SiDPRuntime(types.SimpleNamespace(config=cfg, listeners=[]))
    yes = lambda runner, fb: True  # noqa: E731
    assert rt.around_can_run_graph(yes, None, None) is True  # no lockstep (service was, or not started)
    rt.lockstep = types.SimpleNamespace(current=None)
    assert rt.around_can_run_graph(yes, None, None) is True  # start-up forwards and graph capture: WaS
    rt.lockstep.current = Iteration((4, 0), ServeMode.CAS)
    assert rt.around_can_run_graph(yes, None, None) is False
    rt.lockstep.current = Iteration((400, 300), ServeMode.WAS)
    assert rt.around_can_run_graph(yes, None, None) is True


def paused_rank(rank, world):
    """Rank 1's engine is paused for the first two iterations: its event loop skips get_next_batch_to_run, so its
    lockstep step comes from the process_input_requests hook (no tokens); rank 0 keeps running CaS batches."""
    rt, model = runtime(rank, world, "cas")
    paused, running = types.SimpleNamespace(_engine_paused=True), types.SimpleNamespace(_engine_paused=False)
    out = []
    for it in range(3):
        if rank == 1 and it < 2:
            with torch.no_grad():
                assert rt.on_input_requests("result", paused) == "result"
            continue
        assert rt.on_input_requests(None, running) is None  # not paused: the step is on_next_batch's
        with torch.no_grad():
            rt.step(4)
            out.append(model(rows(rank, it, 4)).numpy())
    return out


def test_a_paused_rank_keeps_the_lockstep_and_serves_its_layers():
    got = spawn(paused_rank, 2)
    assert len(got[0]) == 3 and len(got[1]) == 1
    for it, y in enumerate(got[0]):
        assert same(torch.from_numpy(y), reference(rows(0, it, 4))), it
    assert same(torch.from_numpy(got[1][0]), reference(rows(1, 2, 4)))


# --------------------------------------------------------------------------- --sidp-cas-graphs (static shapes)
class FakeGraphs:
    """Stands in for `CasGraphs` (no SGLang, no GPU): the captured sizes and the size each iteration selected."""

    capture_bs = [1, 2, 4, 8]

    def __init__(self):
        self.selected = []

    def select(self, bucket):
        self.selected.append(bucket)


def graph_rank(rank, world, plan):
    """`plan`: per iteration, every rank's (tokens, decode batch size or -1)."""
    from sgl_sidp.remote_compute.cas import BucketWire, TorchCollectives

    rt, model = runtime(rank, world, "cas")
    rt.wire, rt.graphs = BucketWire(TorchCollectives(), rank, world), FakeGraphs()
    out = []
    for it, ranks in enumerate(plan):
        tokens, decode = ranks[rank]
        with torch.no_grad():
            rt.step(tokens, decode)
            y = model(rows(rank, it, tokens)).numpy() if tokens else None
        out.append(y)
    return out, rt.graphs.selected


@pytest.mark.parametrize("world", [2, 3])
def test_cas_graph_iterations_pad_every_rank_to_one_size_and_stay_exact(world):
    """Decode iterations in CaS get one graph size on every rank (the largest batch's captured size), every layer
    goes through the static-shape exchange (an idle rank serves with zero rows), and every rank's output still
    equals the full model's; a prefill iteration runs the exact-count exchange (no size)."""
    plan = [[(3, 3)] * world, [(5, 5)] + [(0, 0)] * (world - 1), [(0, 0)] + [(2, 2)] * (world - 1),
            [(40, -1)] + [(1, 1)] * (world - 1), [(1, 1)] * world]
    got = spawn(graph_rank, world, plan)
    for r in range(world):
        outs, selected = got[r]
        assert selected == [4, 8, 2, None, 1]
        for it, y in enumerate(outs):
            tokens = plan[it][r][0]
            assert (y is None) == (tokens == 0)
            if tokens:
                assert same(torch.from_numpy(y), reference(rows(r, it, tokens))), (r, it)


def test_the_cas_graph_runner_replays_the_agreed_size():
    """`bucket_runner_class`: SGLang's runner class with `_pad_to_bucket` rounding up to at least `forced_bs`."""
    from sgl_sidp.sidp.runtime import bucket_runner_class

    class Base:
        @staticmethod
        def _pad_to_bucket(raw_size, buckets):
            return next(b for b in buckets if b >= raw_size)

    runner = bucket_runner_class(Base)()
    assert runner._pad_to_bucket(3, [1, 2, 4, 8]) == 4  # forced_bs 0: SGLang's choice
    runner.forced_bs = 8
    assert runner._pad_to_bucket(3, [1, 2, 4, 8]) == 8
    assert isinstance(runner, Base)
