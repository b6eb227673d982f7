"""Shift Parallelism's hook bodies (`sgl_sidp.shift.runtime.ShiftRuntime`) driving a small TP model laid out as
SGLang lays out Qwen3 (vocab-sharded embedding with an all-reduce, fused QKV and gate|up shards, an unreduced o_proj
followed by the post-attention all-reduce, a reduced down_proj, vocab-sharded logits gathered over TP), in gloo
processes: the same forward in the base configuration (above the threshold) and in the shift configuration (TP = P)
gives the same logits and writes the same K, V on every GPU; the base weights are gathered once and the shards
become views of them."""

import types

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from sgl_sidp.shift.runtime import ShiftRuntime
from sgl_sidp.shift.ulysses import TorchComm, sum_in_rank_order
from sgl_sidp.shift.views import shares_storage
from tests.gloo_procs import spawn

H, D, V, LAYERS = 16, 4, 32, 2


def all_reduce(x, group=None):
    """In place, as SGLang's custom all-reduce adds: every rank's tensor upcast, added in rank order, rounded once."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    x.copy_(sum_in_rank_order(torch.stack(parts)) if x.dtype != torch.float64 else sum(parts))
    return x


class TPComm(TorchComm):
    def all_reduce(self, x):
        return all_reduce(x, self.group)


class Linear(torch.nn.Module):
    """A TP shard whose forward returns (output, None), as SGLang's parallel linears do."""

    quant_method = None

    def __init__(self, w, reduce=False):
        super().__init__()
        self.weight = torch.nn.Parameter(w, requires_grad=False)
        self.bias = None
        self.reduce = reduce

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.reduce:
            all_reduce(y)
        return y, None


class QKV(Linear):
    pass


class Row(Linear):
    pass


class Embed(torch.nn.Module):
    def __init__(self, shard, lo):
        super().__init__()
        self.weight, self.lo = shard, lo

    def forward(self, ids):
        local = ids - self.lo
        ok = (local >= 0) & (local < self.weight.shape[0])
        out = self.weight[local.clamp(0, self.weight.shape[0] - 1)] * ok[:, None]
        return all_reduce(out)


def silu_mul(x):
    a, b = x.chunk(2, dim=-1)
    return F.silu(a) * b


class MLP(torch.nn.Module):
    def __init__(self, gu, down):
        super().__init__()
        self.gate_up_proj, self.down_proj, self.act_fn = Linear(gu), Row(down, reduce=True), silu_mul

    def forward(self, x, forward_batch=None):
        return self.down_proj(self.act_fn(self.gate_up_proj(x)[0]))[0]


class Logits(torch.nn.Module):
    def forward(self, input_ids, hidden, lm_head, meta):
        last = hidden[meta]  # the last token of each request
        parts = [torch.empty(last.shape[0], lm_head.shape[0], dtype=last.dtype) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, last @ lm_head.T)
        return torch.cat(parts, dim=1)


def build(rank, p, hook, llama=False, dtype=torch.float64):
    """The TP = P shards of GPU `rank` of a model with distinct random weights per layer (8 heads, 2 KV heads)."""
    g = torch.Generator().manual_seed(11)
    r = lambda *shape: (torch.randn(*shape, generator=g, dtype=torch.float64) / shape[-1] ** 0.5).to(dtype)  # noqa: E731
    nh, nkv, inter = 8, 2, 8 * p
    emb, lm = r(V, H), r(V, H)
    hq, ip = nh // p, inter // p
    kv = [rank * nkv // p + i for i in range(nkv // p)] if nkv >= p else [rank // (p // nkv)]
    rows = lambda m, heads: torch.cat([m[h * D:(h + 1) * D] for h in heads])  # noqa: E731
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    vs = V // p
    model.model.embed_tokens = Embed(emb[rank * vs:(rank + 1) * vs], rank * vs)
    model.lm_head = lm[rank * vs:(rank + 1) * vs]
    model.logits_processor = Logits()
    layers = []
    for _ in range(LAYERS):
        wq, wk, wv, wo = r(nh * D, H), r(nkv * D, H), r(nkv * D, H), r(H, nh * D)
        wg, wu, wd = r(inter, H), r(inter, H), r(H, inter)
        layer = torch.nn.Module()
        layer.self_attn = torch.nn.Module()
        layer.self_attn.qkv_proj = QKV(torch.cat([rows(wq, range(rank * hq, (rank + 1) * hq)), rows(wk, kv), rows(wv, kv)]))
        layer.self_attn.o_proj = Row(wo[:, rank * hq * D:(rank + 1) * hq * D], reduce=llama)
        layer.self_attn.o_proj.reduce_results = llama
        layer.mlp = MLP(torch.cat([wg[rank * ip:(rank + 1) * ip], wu[rank * ip:(rank + 1) * ip]]), wd[:, rank * ip:(rank + 1) * ip])
        layer.q_heads, layer.kv_heads = list(range(rank * hq, (rank + 1) * hq)), kv
        layers.append(layer)
    model.model.layers = torch.nn.ModuleList(layers)
    for cls, name in ((Embed, "around_embedding"), (QKV, "around_qkv"), (Row, "around_row_linear"), (MLP, "around_mlp"),
                      (Logits, "around_logits")):
        orig = cls.__dict__.get("_orig_forward") or cls.forward
        cls._orig_forward = orig
        cls.forward = (lambda o, n: lambda self, *a, **k: getattr(hook(), n)(o, self, *a, **k))(orig, name)
    return model


def forward(model, rt, ids, last, kv_out, llama=False):
    """Qwen3's forward as SGLang runs it: the decoder body, then the logits."""
    return model.logits_processor(ids, body(model, rt, ids, kv_out, llama), model.lm_head, last)


def body(model, rt, ids, kv_out, llama=False):
    """Qwen3's decoder layers as SGLang runs them (what a breakable prefill graph captures), with the post-attention
    all-reduce routed through the hook (Llama: the all-reduce is o_proj's own)."""
    nh, nkv = 8, 2
    h = model.model.embed_tokens(ids)
    for layer in model.model.layers:
        qkv = layer.self_attn.qkv_proj(h)[0]
        nq, nk = len(layer.q_heads) * D, len(layer.kv_heads) * D
        q, k, v = qkv.split([nq, nk, nk], dim=-1)
        kv_out.append(torch.cat([k, v], dim=1))
        n = q.shape[0]
        qh, kh, vh = q.view(n, -1, D), k.view(n, -1, D), v.view(n, -1, D)
        idx = torch.tensor([layer.kv_heads.index(j // (nh // nkv)) for j in layer.q_heads])
        s = torch.einsum("nhd,mhd->hnm", qh, kh[:, idx]) / D ** 0.5
        s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
        o = torch.einsum("hnm,mhd->nhd", s.softmax(-1), vh[:, idx]).reshape(n, -1)
        o = layer.self_attn.o_proj(o)[0]
        if not llama:
            o = rt.around_attn_all_reduce(all_reduce, o)
        h = h + o
        h = h + layer.mlp(h)
    return h


def _rank(rank, p, sp, n_tokens, llama=False, exact=False, dtype=torch.float64, overlap_dir=None):
    ctx = types.SimpleNamespace(config=types.SimpleNamespace(shift=types.SimpleNamespace(sp=sp, threshold=4,
                                                                                         exact=exact)), listeners=[])
    rt = ShiftRuntime(ctx)
    model = build(rank, p, lambda: rt, llama, dtype)
    tb = p // sp
    sp_groups = [dist.new_group([t * sp + s for s in range(sp)]) for t in range(tb)]
    tb_groups = [dist.new_group([t * sp + s for t in range(tb)]) for s in range(sp)]
    sp_comm = TorchComm(sp_groups[rank // sp])
    rt.configure(p, sp, rank, sp_comm, TPComm(tb_groups[rank % sp]) if tb > 1 else None)
    if overlap_dir is not None:  # --shift-all-to-all overlap: the SP group's exchange, file-backed (one folder a group)
        from sgl_sidp.peer.exchange import SymmetricExchange
        from tests.file_symm import FileSymm

        folder = Path(overlap_dir) / f"sp{rank // sp}"
        folder.mkdir(exist_ok=True)
        rt.exchange = SymmetricExchange(sp_groups[rank // sp], rank % sp, sp, sp * 16 * 8 * D, dtype, "cpu",
                                        symm=FileSymm(str(folder), rank % sp))
    shards = {id(l): l.self_attn.qkv_proj.weight.clone() for l in model.model.layers}
    rt.adopt(model)
    views = all(torch.equal(l.self_attn.qkv_proj.weight, shards[id(l)]) and
                shares_storage(l.self_attn.qkv_proj.weight, rt.weights[id(l.self_attn.qkv_proj)][0]) for l in model.model.layers)
    ids = torch.randint(0, V, (n_tokens,), generator=torch.Generator().manual_seed(2))
    last = torch.tensor([2, n_tokens - 1])  # two requests: tokens 0..2 and 3..N-1
    kv_shift, kv_base = [], []
    rt.threshold = 10 ** 6
    want = forward(model, rt, ids, last, kv_shift, llama)
    assert not rt.base
    rt.threshold = 4
    got = forward(model, rt, ids, last, kv_base, llama)
    kv_err = max((a - b).abs().max().item() for a, b in zip(kv_shift, kv_base))
    # a breakable prefill graph of the bucket: the body captured in the base configuration, replayed after other
    # forwards left the runtime in the shift configuration; the eager logits tail runs inside the replay hook
    hidden = body(model, rt, ids, [], llama)
    rt.threshold, rt.base, rt.n_tokens = 4, False, 1
    replayed = rt.around_prefill_replay(lambda runner, fb, sfb, n: model.logits_processor(ids, hidden, model.lm_head, last),
                                        None, None, None, n_tokens)
    replay_err = (replayed - want).abs().max().item()
    return (got - want).abs().max().item(), kv_err, views, rt.base_for(n_tokens), replay_err


@pytest.mark.parametrize("p,sp,n_tokens,llama", [(2, 2, 7, False), (4, 4, 9, False), (4, 2, 6, False), (2, 1, 5, False),
                                                  (4, 2, 6, True), (2, 2, 5, True)])
def test_base_forward_through_the_hooks_equals_the_tp_forward(p, sp, n_tokens, llama):
    out = spawn(_rank, p, sp, n_tokens, llama)
    for rank, (err, kv_err, views, base, replay_err) in out.items():
        assert base and views, rank
        assert err < 1e-12 and kv_err < 1e-12 and replay_err < 1e-12, (rank, err, kv_err, replay_err)


@pytest.mark.parametrize("p,sp,n_tokens,llama", [(2, 2, 7, False), (4, 4, 9, False), (4, 2, 6, True)])
def test_overlapped_exchanges_through_the_hooks_equal_the_tp_forward(tmp_path, p, sp, n_tokens, llama):
    """`--shift-all-to-all overlap`: the base forward with its exchanges by copies hidden behind the GEMMs
    (`ulysses.heads_exchanged`, `tokens_exchanged_gemm`) is the TP forward, padding and TP_b included."""
    out = spawn(_rank, p, sp, n_tokens, llama, False, torch.float64, str(tmp_path))
    for rank, (err, kv_err, views, base, replay_err) in out.items():
        assert base and views, rank
        assert err < 1e-12 and kv_err < 1e-12 and replay_err < 1e-12, (rank, err, kv_err, replay_err)


def test_forwards_are_counted_by_configuration_with_graph_sizes():
    ctx = types.SimpleNamespace(config=types.SimpleNamespace(shift=types.SimpleNamespace(sp=2, threshold=64)), listeners=[])
    rt = ShiftRuntime(ctx)
    rt.sp, rt.capture_bs, rt.graph_base = 2, [1, 2, 4, 8, 16, 32, 64, 72, 80], {72, 80}  # captured above 64
    sig = lambda mode, n: types.SimpleNamespace(forward_mode=mode, computed_tokens=n)  # noqa: E731
    for s in (sig("EXTEND", 500), sig("DECODE", 65), sig("DECODE", 60), sig("DECODE", 100), sig("DECODE", 0)):
        ctx.listeners[0](s)
    # 65 decodes replay the 72 graph (base); 60 the 64 graph (shift, not above 64); 100 runs eagerly (base)
    assert rt.forwards == {"base": 3, "shift": 1} and rt.tokens == {"base": 500 + 72 + 100, "shift": 64}
    assert rt.switches == 2


def test_metrics_follow_the_counts():
    from prometheus_client import CollectorRegistry, generate_latest

    from sgl_sidp.shift.runtime import ShiftMetrics

    ctx = types.SimpleNamespace(config=types.SimpleNamespace(shift=types.SimpleNamespace(sp=2, threshold=64)), listeners=[])
    rt = ShiftRuntime(ctx)
    rt.sp = 2
    reg = CollectorRegistry()
    rt.metrics = ShiftMetrics(rt, {"tp_rank": "0"}, registry=reg)
    for n in (500, 1, 1, 300):
        ctx.listeners[0](types.SimpleNamespace(forward_mode="EXTEND", computed_tokens=n))
    text = generate_latest(reg).decode()
    assert 'sglang:sidp_shift_forwards_total{config="base",tp_rank="0"} 2.0' in text
    assert 'sglang:sidp_shift_tokens_total{config="shift",tp_rank="0"} 2.0' in text
    assert 'sglang:sidp_shift_switches_total{tp_rank="0"} 2.0' in text and "sglang:sidp_shift_threshold" in text


def test_threshold_from_measured_prefills():
    import math

    from sgl_sidp.calibration.cost import shift_threshold

    assert shift_threshold({256: (10, 12), 1024: (30, 29), 4096: (110, 95)}) == 256  # base wins from 1024 on
    assert shift_threshold({256: (10, 12), 1024: (30, 29), 4096: (110, 120)}) == math.inf  # loses at the top: off
    assert shift_threshold({256: (10, 9), 1024: (30, 29)}) == 0
    assert shift_threshold({256: (10, 9), 1024: (30, 31), 4096: (110, 95)}) == 1024  # a dip below is ignored


def test_calibrating_forces_a_configuration_and_decode_graphs_keep_theirs():
    ctx = types.SimpleNamespace(config=types.SimpleNamespace(shift=types.SimpleNamespace(sp=2, threshold=0)), listeners=[])
    rt = ShiftRuntime(ctx)
    rt.sp = 2
    assert rt.threshold == float("inf") and not rt.base_for(10 ** 6)  # provisional: everything shift
    rt.force = "base"
    assert rt.base_for(1)
    rt.force = None
    rt.capture_bs, rt.graph_base, rt.threshold = [1, 8, 64, 128], set(), 32  # graphs captured before calibration
    sig = lambda mode, n: types.SimpleNamespace(forward_mode=mode, computed_tokens=n)  # noqa: E731
    assert rt.config_of(sig("DECODE", 100)) == ("shift", 128)  # its graph was captured as shift
    assert rt.config_of(sig("EXTEND", 100)) == ("base", 100)  # eager forwards follow the measured threshold


def test_prefill_buckets_are_counted_by_their_captured_configuration():
    ctx = types.SimpleNamespace(config=types.SimpleNamespace(shift=types.SimpleNamespace(sp=2, threshold=1000)), listeners=[])
    rt = ShiftRuntime(ctx)
    rt.sp, rt.prefill_bs = 2, [4, 8, 512, 1024, 1280, 8192]
    sig = lambda mode, n: types.SimpleNamespace(forward_mode=mode, computed_tokens=n)  # noqa: E731
    assert rt.config_of(sig("EXTEND", 1025)) == ("base", 1280)  # padded to its bucket
    assert rt.config_of(sig("EXTEND", 900)) == ("base", 1024)  # 900 tokens run the 1024-token graph: base
    assert rt.config_of(sig("MIXED", 600)) == ("base", 1024)
    assert rt.config_of(sig("EXTEND", 500)) == ("shift", 512)
    assert rt.config_of(sig("EXTEND", 9000)) == ("base", 9000)  # beyond the graphs: eager


def calibration_runtime(monkeypatch, tmp_path, threshold=0, tp=1):
    """A runtime with SP = 2 whose prefills time as a model where the base configuration wins from 1024 tokens on;
    the calibration key and the cache directory faked on CPU; `tp` TP ranks (this one rank 0), whose sleeps agree
    through `measure.largest_over` (faked: it adds 1 ms)."""
    from sglang.srt.distributed import parallel_state

    import sgl_sidp.calibration.measure as measure
    import sgl_sidp.calibration.startup as startup
    from sgl_sidp.calibration.cache import CalibrationKey

    monkeypatch.setenv("SIDP_CALIBRATION_DIR", str(tmp_path))
    key = CalibrationKey("H200", "qwen3-tiny", "bf16", "", "triton", "0.5.17")
    monkeypatch.setattr(startup, "calibration_key", lambda runner: key)
    ctx = types.SimpleNamespace(config=types.SimpleNamespace(shift=types.SimpleNamespace(sp=2, threshold=threshold)),
                                listeners=[])
    rt = ShiftRuntime(ctx)
    rt.sp, rt.sp_comm = 2, object()
    timed = []

    def fake_time(graph_runner, tokens, align, agree):
        assert (agree is None) if tp == 1 else agree(5.0) == 6.0  # one TP rank: no sleep to agree on
        align()
        timed.append((tokens, rt.force))
        ms = tokens / 100 * (1.0 if rt.force == "shift" else 0.9 if tokens >= 1024 else 1.1)
        return measure.QueuedTiming(ms, eager_ms=60.0, ahead=tokens != 2048)

    monkeypatch.setattr(measure, "time_dummy_prefill", fake_time)
    monkeypatch.setattr(measure, "largest_over", lambda group: (lambda ms: ms + 1.0) if group == "gloo" else None)
    monkeypatch.setattr(parallel_state, "get_tensor_model_parallel_world_size", lambda: tp)
    monkeypatch.setattr(parallel_state, "get_tp_group",
                        lambda: types.SimpleNamespace(rank_in_group=0, world_size=tp, barrier=lambda: None,
                                                      cpu_group="gloo", broadcast_object=lambda obj, src: obj))
    mr = types.SimpleNamespace()  # SGLang's ModelRunner: its TP rank and size come from the TP group above
    graph_runner = types.SimpleNamespace(model_runner=mr, max_num_tokens=2048, prefill_backend_name="breakable")
    return rt, graph_runner, timed, key


def test_prefill_graphs_are_captured_with_the_threshold_calibrated_before_them(monkeypatch, tmp_path, caplog):
    import logging

    from sgl_sidp.calibration.cache import CalibrationCache
    from sgl_sidp.shift.runtime import ShiftError

    rt, graph_runner, timed, key = calibration_runtime(monkeypatch, tmp_path)
    seen = []
    with caplog.at_level(logging.INFO, logger="sgl_sidp.shift.runtime"):
        rt.around_prefill_capture(lambda runner: seen.append((rt.threshold, rt.force)), graph_runner)
    # the GPU times decide; the host's stand beside them in the log, and sizes the host could not queue ahead are named
    assert "timed from the host (launches included), ms (shift, base) by tokens: 128: 60.0, 60.0" in caplog.text
    assert "at [2048] tokens the host was still launching when the GPU sleep ended" in caplog.text
    # every calibration size up to the largest bucket, both configurations, before the capture
    assert timed == [(t, c) for t in (128, 256, 512, 1024, 2048) for c in ("shift", "base")]
    assert seen == [(512, None)] and rt.threshold_source.startswith("start-up calibration")
    cached = CalibrationCache().get_extra(key, "shift-sp2")
    assert cached["threshold"] == 512 and cached["points"]["2048"] == [20.48, 20.48 * 0.9]
    assert cached["points"]["512"] == [5.12, 5.12 * 1.1]

    two, graph_runner, timed, _ = calibration_runtime(monkeypatch, tmp_path / "tp2", tp=2)
    two.around_prefill_capture(lambda runner: None, graph_runner)  # each timing checks the sleeps agree
    assert len(timed) == 10 and two.threshold == 512

    given, graph_runner, timed, _ = calibration_runtime(monkeypatch, tmp_path, threshold=300)
    given.around_prefill_capture(lambda runner: None, graph_runner)
    assert not timed and given.threshold == 300  # given: nothing timed

    graph_runner.prefill_backend_name = "tc_piecewise"
    with pytest.raises(ShiftError, match="SGLang chose the 'tc_piecewise' prefill CUDA graphs"):
        given.around_prefill_capture(lambda runner: None, graph_runner)


def test_the_threshold_calibration_logs_which_prefill_it_times(monkeypatch, tmp_path, caplog):
    """While it lasts, the calibration logs (every `PROGRESS_EVERY_S`, 10 s in a server) which prefill it times."""
    import logging
    import re
    import time

    from sgl_sidp import process

    rt, graph_runner, _, _ = calibration_runtime(monkeypatch, tmp_path)
    monkeypatch.setattr(process, "PROGRESS_EVERY_S", 0.02)

    def slow(tokens):
        time.sleep(0.04)
        return tokens / 100

    with caplog.at_level(logging.INFO, logger="sgl_sidp.shift.runtime"):
        rt.calibrate(graph_runner.model_runner, slow, 512, "dummy prefills")
    lines = [r.getMessage() for r in caplog.records if "threshold calibration" in r.getMessage()]
    assert lines and all(re.fullmatch(r"sgl-sidp shift TP0: threshold calibration \(dummy prefills\): 0 s so far; now "
                                      r"prefill of (128|256|512) tokens \([123] of 3\) in the (shift|base) configuration",
                                      m) for m in lines), lines


def test_cache_keeps_a_feature_measurement_per_key(tmp_path):
    from sgl_sidp.calibration.cache import CalibrationCache, CalibrationKey

    key = CalibrationKey(gpu="NVIDIA H200", model="m", dtype="bf16", quantization="", attention_backend="triton",
                         sglang="0.5.17")
    cache = CalibrationCache(tmp_path)
    assert cache.get_extra(key, "shift-sp2") is None
    cache.put_extra(key, "shift-sp2", {"threshold": float("inf")})
    assert cache.get_extra(key, "shift-sp2") == {"threshold": float("inf")}
    assert cache.get_extra(key, "shift-sp4") is None and cache.get(key) is None


@pytest.mark.parametrize("p,sp,llama", [(2, 2, False), (2, 2, True), (4, 4, False), (4, 2, False), (4, 2, True)])
def test_shift_exact_base_rounds_as_tp_does_in_bf16(p, sp, llama):
    """bf16, all-reduces adding in rank order as SGLang's custom all-reduce does: with `--shift-exact` the base
    configuration's logits and KV equal the TP forward's to the bit; without it (o_proj's block partials added
    unrounded, the MLP's down one GEMM over the whole K, rounded once) they do not."""
    exact = spawn(_rank, p, sp, 9, llama, True, torch.bfloat16)
    for rank, (err, kv_err, views, base, replay_err) in exact.items():
        assert base and views and err == kv_err == replay_err == 0.0, (rank, err, kv_err, replay_err)
    plain = spawn(_rank, p, sp, 9, llama, False, torch.bfloat16)
    assert any(err > 0 for err, *_ in plain.values())


def test_a_base_configuration_that_never_pays_says_so_with_the_ratio():
    """Calibrated points whose base configuration loses at the largest prefill give one line naming vanilla TP and
    the measured ratio; a base that wins there gives none."""
    from sgl_sidp.shift.runtime import base_never_pays

    line = base_never_pays({512: (10.0, 14.0), 4096: (40.0, 46.0)}, 2, 1)
    assert line.startswith("the base configuration (SP2 x TP1) was slower than TP=2 up to the largest prefill measured "
                           "(4096 tokens: 46.0 ms against 40.0 ms, 1.15x)")
    assert "vanilla --tp-size 2 is predicted to serve as fast with more KV" in line
    assert base_never_pays({512: (10.0, 14.0), 4096: (40.0, 38.0)}, 2, 1) is None
    assert base_never_pays({}, 2, 2) is None
