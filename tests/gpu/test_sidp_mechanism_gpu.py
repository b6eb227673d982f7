"""SiDP's WaS mechanisms on real CUDA, without SGLang's server (run with `pytest -m gpu`; one GPU is enough).

d processes stand for d DP ranks (all on GPU 0 when only one is visible, else rank r on GPU r mod count): each
builds the same 8-layer model (distinct random weights per layer, bf16, hidden 1024, the shape of SGLang's
`Qwen2MLP`), runs `SiDPRuntime.setup` with the real VMM driver and CUDA streams (owned layers re-homed into
shareable memory and served, the others mapped from their owners and bound to a ring of d - 1 slots (at least
2) filled in the peak-shifted order), then checks its
outputs against the same model before set-up, bit for bit: eager forwards at 1, 16 and 64 rows, and a CUDA graph
captured once and replayed on new inputs (the slot copies and events are captured into the graph, as in SGLang's
decode graphs). What this does not cover (SGLang's hooks, its graphs, two GPUs' NVLink) is
`tests/gpu/test_sidp_gpu.py`'s.
"""

import multiprocessing as mp
import uuid

import pytest

pytestmark = [pytest.mark.gpu]

H, I, LAYERS = 1024, 2816, 8


def _rank(r, d, tag, barrier, q):
    import torch

    from sgl_sidp.peer.vmm import socket_address
    from sgl_sidp.prefetch.ring import StreamOps
    from sgl_sidp.sidp.runtime import collect_mlps
    from tests.test_sidp_runtime import Model, hooked_forward, runtime

    try:
        gpu = r % torch.cuda.device_count()
        torch.cuda.set_device(gpu)
        dev = torch.device("cuda", gpu)
        model = Model(LAYERS, h=H, i=I).to(dev, torch.bfloat16)
        g = torch.Generator().manual_seed(7)
        xs = [torch.randn(b, H, generator=g).to(dev, torch.bfloat16) for b in (1, 16, 64, 16, 16)]
        with torch.no_grad():
            want = [model(x) for x in xs]  # every layer's own weights
        rt = runtime(slots=0)  # d - 1 slots (at least 2): the peak-shifted fetch order for d > 2
        rt.setup(collect_mlps(model), r, 0, d, gpu, lambda k: socket_address(f"test-sidp-gpu-{tag}-dp{k}", 0, 0),
                 StreamOps(dev), release_cached=torch.cuda.empty_cache)
        rt.binding.install_start(model.model.layers[0])
        with torch.no_grad():
            eager = [hooked_forward(model, rt, x) for x in xs[:3]]
            static = xs[1].clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                hooked_forward(model, rt, static)  # warm-up outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = hooked_forward(model, rt, static)
            replays = []
            for x in xs[3:] + xs[1:2]:
                static.copy_(x)
                graph.replay()
                replays.append(out.clone())
        torch.cuda.synchronize()
        ok_eager = [torch.equal(a, b) for a, b in zip(eager, want[:3])]
        ok_graph = [torch.equal(a, b) for a, b in zip(replays, want[3:] + want[1:2])]
        q.put((r, ok_eager, ok_graph, rt.owned, rt.streamed, rt.binding.freed_bytes, rt.exporter.peak_extra_bytes,
               rt.fetch_order, None))
    except BaseException as e:  # noqa: BLE001 - reported to the test process
        q.put((r, None, None, None, None, 0, 0, None, f"{type(e).__name__}: {e}"))
    finally:
        barrier.wait(120)  # an owner's memory must outlive its readers' forwards


@pytest.mark.parametrize("d", [2, 3, 4])
def test_was_on_cuda_is_exact_eager_and_in_a_cuda_graph(d):
    ctx = mp.get_context("spawn")
    q, barrier, tag = ctx.Queue(), ctx.Barrier(d), uuid.uuid4().hex
    procs = [ctx.Process(target=_rank, args=(r, d, tag, barrier, q)) for r in range(d)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=240) for _ in range(d))
    for p in procs:
        p.join(60)
    layer_bytes = (2 * I * H + H * I) * 2
    for r, ok_eager, ok_graph, owned, streamed, freed, peak, order, err in results:
        assert err is None, f"rank {r}: {err}"
        assert ok_eager == [True] * 3, f"rank {r} eager: {ok_eager}"
        assert ok_graph == [True] * 3, f"rank {r} graph replays: {ok_graph}"
        assert owned == tuple(range(r, LAYERS, d)) and freed == layer_bytes * len(streamed)
        print(f"rank {r}: owns {owned}, fetches {order}, freed {freed / 1e6:.1f} MB, peak extra {peak / 1e6:.1f} MB "
              "(ranks sharing one GPU see each other's allocations in it)")
