"""ZeroDP's policy (`sgl_sidp.zerodp.policy`) on the calibration mechanism: manifests, the offload set, the schedule."""

import json
import math

import pytest
import torch

from sgl_sidp.peer.manifest import TensorSpec as ExpertTensor
from sgl_sidp.peer.manifest import manifest_mismatches
from sgl_sidp.prefetch.ring import PrefetchSchedule
from sgl_sidp.calibration.cache import BUNDLED_DIR, find_bundled
from sgl_sidp.calibration.cost import COPY_BUDGET_MARGIN, KVModel, hidden_fraction, spread
from sgl_sidp.calibration.table import Calibration, CalibrationError, ExpectedBatch
from sgl_sidp.zerodp.policy import (
    ZeroDPError,
    choose_plan,
    group_of,
    manifest_of,
    parse_layers,
    source_sink_pairs,
)


# --------------------------------------------------------------------------- manifests
class FakeMoE(torch.nn.Module):
    """A CPU stand-in for SGLang's FusedMoE: expert params, a resident param, a child, an int layer_id."""

    def __init__(self, layer_id, e=4, h=16, i=8, dtype=torch.bfloat16):
        super().__init__()
        self.layer_id = layer_id
        self.w13_weight = torch.nn.Parameter(torch.zeros(e, 2 * i, h, dtype=dtype), requires_grad=False)
        self.w2_weight = torch.nn.Parameter(torch.zeros(e, h, i, dtype=dtype), requires_grad=False)
        self.w13_weight_scale_inv = torch.nn.Parameter(torch.ones(e, dtype=torch.float32), requires_grad=False)
        self.e_score_correction_bias = torch.nn.Parameter(torch.zeros(e))
        self.child = torch.nn.Linear(h, 2)  # a submodule's params are not the layer's own
        self.child.w13_weight = torch.nn.Parameter(torch.zeros(3))


def test_group_of():
    """Names map to the group by prefix; anything else is resident."""
    assert group_of("w13_weight") == "w13"
    assert group_of("w13_weight_scale_inv") == "w13"
    assert group_of("w2_weight") == "w2"
    assert group_of("w2_input_scale") == "w2"
    assert group_of("e_score_correction_bias") is None
    assert group_of("w13") is None  # the group name alone is not a parameter of it
    assert group_of("gate_weight") is None


def test_manifest_of_lists_only_own_expert_params_sorted():
    """Only the module's own w13_*/w2_* params, with local shapes, dtypes and bytes, sorted by (layer, name)."""
    layers = [(3, FakeMoE(3)), (1, FakeMoE(1, dtype=torch.float16))]
    m = manifest_of(layers)
    assert [t.key for t in m] == [
        (1, "w13_weight"), (1, "w13_weight_scale_inv"), (1, "w2_weight"),
        (3, "w13_weight"), (3, "w13_weight_scale_inv"), (3, "w2_weight"),
    ]
    w13 = m[0]
    assert w13 == ExpertTensor(1, "w13_weight", (4, 16, 16), "torch.float16", 4 * 16 * 16 * 2)
    assert group_of(w13.name) == "w13" and group_of(m[2].name) == "w2"
    assert m[1].nbytes == 4 * 4 and m[1].dtype == "torch.float32"
    assert all(isinstance(t.layer_id, int) for t in m)
    assert ExpertTensor.from_json(json.loads(json.dumps(w13.to_json()))) == w13


def test_manifest_mismatches():
    """Every disagreement gets its own line; identical manifests give none."""
    src = manifest_of([(0, FakeMoE(0)), (1, FakeMoE(1))])
    assert manifest_mismatches(src, list(src)) == []
    assert manifest_mismatches(src, list(reversed(src))) == []  # order does not matter

    sink = [t for t in src if t.key != (1, "w2_weight")]
    assert manifest_mismatches(src, sink) == ["layer 1 w2_weight: the owner has it, the reader does not"]
    assert manifest_mismatches(sink, src) == ["layer 1 w2_weight: the reader has it, the owner does not"]

    bad_shape = [ExpertTensor(t.layer_id, t.name, (9,) + t.shape[1:], t.dtype, t.nbytes) if t.key == (0, "w13_weight") else t for t in src]
    assert manifest_mismatches(src, bad_shape) == ["layer 0 w13_weight: shape (4, 16, 16) on the owner, (9, 16, 16) on the reader"]

    bad_both = [ExpertTensor(t.layer_id, t.name, (1,), "torch.float8_e4m3fn", 1) if t.key == (0, "w2_weight") else t for t in src]
    ps = manifest_mismatches(src, bad_both)
    assert ps == [
        "layer 0 w2_weight: shape (4, 16, 8) on the owner, (1,) on the reader",
        "layer 0 w2_weight: dtype torch.bfloat16 on the owner, torch.float8_e4m3fn on the reader",
    ]


# --------------------------------------------------------------------------- calibration
CAL = {
    "model": "Qwen3MoeForCausalLM L48 E128 H2048 I768 tp1",
    "gpu": "NVIDIA H200",
    "decode_ms": {"1": 10.0, "16": 20.0, "64": 50.0},
    "prefill_ms": {"1024": 30.0, "8192": 100.0},
    "copy_gbps": 391.0,
    "source": "test",
}


@pytest.fixture
def cal_file(tmp_path):
    f = tmp_path / "h200.json"
    f.write_text(json.dumps(CAL))
    return f


def test_calibration_load(cal_file):
    """Keys become ints, values floats."""
    c = Calibration.load(cal_file)
    assert c.decode_ms == {1: 10.0, 16: 20.0, 64: 50.0} and c.prefill_ms == {1024: 30.0, 8192: 100.0}
    assert c.copy_gbps == 391.0 and c.gpu == "NVIDIA H200" and c.source == "test"


def test_calibration_forward_ms_interpolates_and_clamps(cal_file):
    """Linear between measured points, exact at them, clamped beyond the ends, per kind."""
    c = Calibration.load(cal_file)
    ms = lambda s: c.forward_ms(ExpectedBatch.parse(s))
    assert ms("decode:1") == 10.0 and ms("decode:16") == 20.0 and ms("decode:64") == 50.0
    assert ms("decode:8") == pytest.approx(10.0 + 10.0 * 7 / 15)
    assert ms("decode:40") == pytest.approx(35.0)
    assert ms("decode:1000") == 50.0
    assert ms("prefill:1") == 30.0 and ms("prefill:100000") == 100.0
    assert ms("prefill:4608") == pytest.approx(65.0)


def test_calibration_without_a_kind_raises(tmp_path):
    """A file with no prefill times cannot size a prefill batch."""
    f = tmp_path / "c.json"
    f.write_text(json.dumps({**CAL, "prefill_ms": {}}))
    with pytest.raises(CalibrationError, match="no prefill times"):
        Calibration.load(f).forward_ms(ExpectedBatch("prefill", 10))


def test_find_bundled(tmp_path):
    """Matches the model signature exactly and the GPU name case-insensitively as a substring."""
    (tmp_path / "a.json").write_text(json.dumps({**CAL, "model": "Other L2 E8 H64 I32 tp1"}))
    (tmp_path / "b.json").write_text(json.dumps(CAL))
    (tmp_path / "notes.txt").write_text("not json, not globbed")
    sig = CAL["model"]
    assert find_bundled(sig, "nvidia h200", tmp_path) == tmp_path / "b.json"
    assert find_bundled(sig, "NVIDIA H200 NVL", tmp_path) == tmp_path / "b.json"
    assert find_bundled(sig, "NVIDIA H100 80GB HBM3", tmp_path) is None
    assert find_bundled(sig.replace("tp1", "tp2"), "NVIDIA H200", tmp_path) is None
    assert find_bundled(sig, "NVIDIA H200", tmp_path / "missing") is None


def test_expected_batch_parse():
    """'decode:N' / 'prefill:N' with N >= 1; round-trips through str()."""
    assert ExpectedBatch.parse("decode:64") == ExpectedBatch("decode", 64)
    assert ExpectedBatch.parse("prefill:8192") == ExpectedBatch("prefill", 8192)
    assert ExpectedBatch.parse("kv:2048") == ExpectedBatch("kv", 2048)
    assert str(ExpectedBatch.parse("decode:16")) == "decode:16"
    for bad in ("decode:0", "decode:x", "decode:", "decode", "train:4", "", "decode:-1", "decode:1.5", ":8", "kv:0"):
        with pytest.raises(ValueError, match="expected 'decode:N', 'prefill:N' or 'kv:N'"):
            ExpectedBatch.parse(bad)


# --------------------------------------------------------------------------- spread / layers
def test_spread_edges():
    """n <= 0 picks nothing; n >= len picks all."""
    c = list(range(10))
    assert spread(c, 0) == () and spread(c, -3) == ()
    assert spread(c, 10) == tuple(c) and spread(c, 99) == tuple(c)
    assert spread([], 3) == ()


def test_spread_evenly_spaced_ending_at_last_layer():
    """At phase 0 the picks are evenly spaced and the last one is the last candidate (first stays resident)."""
    assert spread(list(range(48)), 6) == (7, 15, 23, 31, 39, 47)
    assert spread(list(range(10)), 3) == (3, 6, 9)
    assert spread(list(range(48)), 1) == (47,)
    ids = [2, 5, 9, 11, 13, 20]  # non-contiguous MoE layer ids
    assert spread(ids, 2) == (9, 20) and spread(ids, 3) == (5, 11, 20)
    picks = spread(list(range(48)), 5)
    assert picks[-1] == 47 and 0 not in picks


def test_spread_phases_differ():
    """Different phases give different (here disjoint) picks of the same size."""
    a, b = spread(list(range(48)), 6, 0.0), spread(list(range(48)), 6, 0.5)
    assert b == (3, 11, 19, 27, 35, 43) and not set(a) & set(b)
    quarters = [set(spread(list(range(48)), 4, p)) for p in (0, 0.25, 0.5, 0.75)]
    for i in range(4):
        for j in range(i + 1, 4):
            assert not quarters[i] & quarters[j]


def test_spread_always_sorted_unique_and_of_size_n():
    """For any size, count and phase: sorted, no repeats, exactly min(n, L) candidates."""
    for L in range(1, 40):
        cands = [3 * i + 1 for i in range(L)]
        for n in range(0, L + 2):
            for phase in (0.0, 0.1, 0.33, 0.5, 0.9, 0.999):
                p = spread(cands, n, phase)
                assert list(p) == sorted(set(p)), (L, n, phase)
                assert len(p) == min(n, L), (L, n, phase)
                assert set(p) <= set(cands)
                if phase == 0.0 and n > 0:
                    assert p[-1] == cands[-1]


def test_parse_layers():
    """auto -> None, all, every:K (every K-th MoE layer), and explicit lists (sorted, deduplicated)."""
    moe = [0, 1, 2, 3, 4, 5, 6, 7]
    assert parse_layers("auto", moe) is None
    assert parse_layers("all", moe) == tuple(moe)
    assert parse_layers("every:1", moe) == tuple(moe)
    assert parse_layers("every:2", moe) == (1, 3, 5, 7)
    assert parse_layers("every:3", [10, 11, 12, 13, 14, 15, 16]) == (12, 15)
    assert parse_layers("every:9", moe) == ()
    assert parse_layers("7,3,3, 5", moe) == (3, 5, 7)


def test_parse_layers_rejects():
    """Bad K, non-MoE layers and unknown text each raise a ValueError naming the problem."""
    moe = [1, 3, 5]
    for bad in ("every:0", "every:x", "every:", "every:-2"):
        with pytest.raises(ValueError, match="every:K needs K >= 1"):
            parse_layers(bad, moe)
    with pytest.raises(ValueError, match=r"without MoE experts: \[0, 4\]"):
        parse_layers("0,3,4", moe)
    for bad in ("none", "1;3", "1,x", "1.5"):
        with pytest.raises(ValueError, match="takes auto, all, every:K or a comma list"):
            parse_layers(bad, moe)


# --------------------------------------------------------------------------- choose_plan
W13_BYTES, W2_BYTES = 800_000_000, 410_000_000  # 1.21e9 bytes per layer, like Qwen3-30B-A3B in bf16


def manifest(n_layers=48):
    return [
        t
        for lid in range(n_layers)
        for t in (
            ExpertTensor(lid, "w13_weight", (128, 1536, 2048), "torch.bfloat16", W13_BYTES),
            ExpertTensor(lid, "w2_weight", (128, 2048, 768), "torch.bfloat16", W2_BYTES),
        )
    ]


def test_choose_plan_fits_the_budget():
    """1.21 GB per layer at 391 GB/s is 3.0946 ms; 85% of 24.4 ms holds 6 layers, spread to end at the last."""
    layer_ms = (W13_BYTES + W2_BYTES) / 391 / 1e6
    assert layer_ms == pytest.approx(3.0946, abs=1e-4)
    n = math.floor(COPY_BUDGET_MARGIN * 24.4 / layer_ms)
    assert n == 6
    p = choose_plan(manifest(), ("w13", "w2"), 391.0, 24.4)
    assert p.layers == spread(list(range(48)), 6) == (7, 15, 23, 31, 39, 47)
    assert p.groups == ("w13", "w2")
    assert p.bytes_per_forward == 6 * (W13_BYTES + W2_BYTES)
    assert p.copy_ms == pytest.approx(6 * layer_ms)
    assert p.copy_ms <= COPY_BUDGET_MARGIN * 24.4
    assert p.budget_ms == 24.4
    assert p.reason.startswith("6 of 48 MoE layers")


def test_choose_plan_fits_the_copies_at_their_rate_beside_compute():
    """Copies that run beside the forward they hide in go at `rate_in_forward` of the idle rate (0.71 measured on
    2 x H100): Qwen3-30B-A3B's 8,192-token prefill of 238.8 ms hides 48 layers at the idle rate, 47 beside compute;
    the 24.4 ms budget above holds 4 instead of 6. A rate outside (0, 1] is refused."""
    one = (W13_BYTES + W2_BYTES) / 397 / 1e6
    assert len(choose_plan(manifest(), ("w13", "w2"), 397.0, 238.8).layers) == 48
    p = choose_plan(manifest(), ("w13", "w2"), 397.0, 238.8, rate_in_forward=0.71)
    assert len(p.layers) == math.floor(COPY_BUDGET_MARGIN * 238.8 / (one / 0.71)) == 47
    assert "ms beside compute, at 71% of that rate)" in p.reason
    assert len(choose_plan(manifest(), ("w13", "w2"), 391.0, 24.4, rate_in_forward=0.71).layers) == 4
    with pytest.raises(ValueError, match="copy rate in forwards"):
        choose_plan(manifest(), ("w13", "w2"), 391.0, 24.4, rate_in_forward=0.0)


def test_choose_plan_edges_of_the_budget():
    """A budget below one layer offloads nothing; a huge one offloads every layer."""
    assert choose_plan(manifest(), ["w13", "w2"], 391.0, 1.0).layers == ()
    assert choose_plan(manifest(), ["w13", "w2"], 391.0, 1.0).bytes_per_forward == 0
    assert choose_plan(manifest(), ["w13", "w2"], 391.0, 1e6).layers == tuple(range(48))


def test_choose_plan_offloads_nothing_when_only_the_slots_fit():
    """A budget that holds 1 or 2 layers offloads none: the two slots would take the memory those layers free.
    The default decode:1 on the bundled H200 table (4.08 ms) is such a budget."""
    layer_ms = (W13_BYTES + W2_BYTES) / 391 / 1e6
    for fits in (1, 2):
        p = choose_plan(manifest(), ("w13", "w2"), 391.0, (fits + 0.5) * layer_ms / COPY_BUDGET_MARGIN)
        assert p.layers == () and f"{fits} would fit, but 2 slots" in p.reason
    assert len(choose_plan(manifest(), ("w13", "w2"), 391.0, 3.5 * layer_ms / COPY_BUDGET_MARGIN).layers) == 3
    cal = Calibration.load(BUNDLED_DIR / "h200_qwen3-30b-a3b_tp1.json")
    assert choose_plan(manifest(), ("w13", "w2"), 396.0, cal.forward_ms(ExpectedBatch.parse("decode:1"))).layers == ()


def test_choose_plan_forced_layers():
    """Forced layers are taken as given (sorted), with no budget."""
    p = choose_plan(manifest(), ["w2", "w13"], 391.0, None, forced_layers=[30, 2])
    assert p.layers == (2, 30) and p.budget_ms == 0.0 and p.groups == ("w13", "w2")
    assert p.bytes_per_forward == 2 * (W13_BYTES + W2_BYTES)
    assert "forced" in p.reason and "2 of 48" in p.reason


def test_choose_plan_group_subset_counts_only_those_bytes():
    """With only w2 offloaded, a layer costs 410 MB: 19 layers fit and only their w2 bytes count."""
    p = choose_plan(manifest(), ["w2"], 391.0, 24.4)
    assert p.groups == ("w2",)
    assert len(p.layers) == math.floor(COPY_BUDGET_MARGIN * 24.4 / (W2_BYTES / 391 / 1e6)) == 19
    assert p.bytes_per_forward == 19 * W2_BYTES
    assert choose_plan(manifest(), ["w13"], 391.0, None, forced_layers=[0]).bytes_per_forward == W13_BYTES


def test_choose_plan_rejects():
    """Unknown or no groups, no budget without forced layers, and a non-positive rate raise ValueError."""
    with pytest.raises(ValueError, match="--zerodp-tensors must name groups"):
        choose_plan(manifest(), ["w13", "w3"], 391.0, 24.4)
    with pytest.raises(ValueError, match="--zerodp-tensors must name groups"):
        choose_plan(manifest(), [], 391.0, 24.4)
    with pytest.raises(ValueError, match="needs budget_ms or kv"):
        choose_plan(manifest(), ["w13"], 391.0, None)
    with pytest.raises(ValueError, match="copy rate must be > 0"):
        choose_plan(manifest(), ["w13"], 0.0, 24.4)


# --------------------------------------------------------------------------- kv:C (capacity-bound model)
KV_TOKEN = 98_304  # Qwen3-30B-A3B bf16: 2 x 48 layers x 4 KV heads x 128 x 2 bytes
LAYER = W13_BYTES + W2_BYTES


def kv_cal(**over):
    d = {**CAL, "decode_ms": {"16": 14.0, "64": 24.0, "256": 30.0}, "decode_context": {"16": 2048, "64": 2048, "256": 2048},
         "attention_gbps": 3000.0, "copy_slowdown_ms_per_gb": 0.33, **over}
    return Calibration(**{**{k: v for k, v in d.items() if k not in ("decode_ms", "prefill_ms", "decode_context")},
                          "decode_ms": {int(k): v for k, v in d["decode_ms"].items()},
                          "prefill_ms": {int(k): v for k, v in d["prefill_ms"].items()},
                          "decode_context": {int(k): v for k, v in d["decode_context"].items()}})


def test_calibration_loads_the_model_fields(tmp_path):
    """decode_context, attention_gbps and the copy fields are optional: no context correction, copies 'not measured'."""
    f = tmp_path / "c.json"
    f.write_text(json.dumps({**CAL, "decode_context": {"16": 2048}, "attention_gbps": 3000, "copy_slowdown_ms_per_gb": 0.3}))
    c = Calibration.load(f)
    assert c.decode_context == {16: 2048} and c.attention_gbps == 3000.0 and c.copy_slowdown_ms_per_gb == 0.3
    f.write_text(json.dumps(CAL))
    c = Calibration.load(f)
    assert c.decode_context == {} and c.attention_gbps is None
    assert c.copy_slowdown_ms_per_gb is None and c.copy_rate_in_forward is None
    assert c.decode_step_ms(16, 100_000, KV_TOKEN) == 20.0  # no attention rate: the table as measured


def test_decode_step_ms_adds_only_the_longer_contexts_reads():
    """64 sequences of 4,096 tokens read 64 x 2,048 x 98,304 B more KV than the measured point: +4.29 ms at 3 TB/s."""
    c = kv_cal()
    assert c.decode_step_ms(64, 2048, KV_TOKEN) == 24.0
    assert c.decode_step_ms(64, 1024, KV_TOKEN) == 24.0  # shorter contexts are not credited
    assert c.decode_step_ms(64, 4096, KV_TOKEN) == pytest.approx(24.0 + 64 * 2048 * KV_TOKEN / 3e12 * 1e3)
    with pytest.raises(ValueError, match="fixed batch"):
        c.forward_ms(ExpectedBatch("kv", 2048))


def test_kv_model_batch_grows_with_the_freed_bytes_less_the_slots():
    """One or two layers only pay for the two slots; from the third on each adds a layer of KV."""
    m = KVModel(vanilla_kv_bytes=64 * 2048 * KV_TOKEN, kv_bytes_per_token=KV_TOKEN, context=2048, calibration=kv_cal())
    b0, step0, tps0 = m.tokens_per_s(0, LAYER, 342.0)
    assert b0 == pytest.approx(64) and step0 == 24.0 and tps0 == pytest.approx(64 / 24.0 * 1e3)
    for n in (1, 2):
        b, step, _ = m.tokens_per_s(n, LAYER, 342.0)
        assert b == pytest.approx(64) and step == pytest.approx(24.0 + 0.33 * n * LAYER / 1e9)  # slower, no gain
    b, step, _ = m.tokens_per_s(4, LAYER, 342.0)
    assert b == pytest.approx(64 + 2 * LAYER / (2048 * KV_TOKEN))
    assert KVModel(64 * 2048 * KV_TOKEN, KV_TOKEN, 2048, kv_cal(), max_batch=50).batch(1e12) == 50


def test_kv_model_step_is_bound_by_the_copies_when_they_do_not_fit():
    """48 layers at 342 GB/s are 170 ms of copies: the step is the copies, not the compute; at 80 % of the
    start-up rate inside forwards (measured on H200, the default where a calibration has no rate) 212 ms."""
    m = KVModel(64 * 2048 * KV_TOKEN, KV_TOKEN, 2048, kv_cal(copy_rate_in_forward=1.0))
    _, step, _ = m.tokens_per_s(48, LAYER, 342.0)
    assert step == pytest.approx(48 * LAYER / 342e9 * 1e3)
    _, step, _ = KVModel(64 * 2048 * KV_TOKEN, KV_TOKEN, 2048, kv_cal()).tokens_per_s(48, LAYER, 342.0)
    assert step == pytest.approx(48 * LAYER / (0.8 * 342e9) * 1e3)


def test_choose_plan_kv_picks_the_best_modeled_throughput():
    """Capacity-bound at 2K contexts the sink offloads some layers and beats vanilla; the count is the argmax."""
    m = KVModel(67 * 2048 * KV_TOKEN, KV_TOKEN, 2048, kv_cal())
    p = choose_plan(manifest(), ("w13", "w2"), 342.0, None, kv=m)
    rows = [m.tokens_per_s(n, LAYER, 342.0)[2] for n in range(49)]
    best = max(range(49), key=lambda n: (rows[n], -n))
    assert 2 < len(p.layers) == best < 48 and rows[best] > rows[0]
    assert p.layers == spread(list(range(48)), best)
    assert p.reason.startswith(f"{best} of 48 MoE layers: decode of 2048-token sequences")
    assert p.budget_ms == pytest.approx(m.tokens_per_s(best, LAYER, 342.0)[1])


def test_choose_plan_kv_with_the_bundled_h200_table():
    """The bundled table at the emulated 80 GB budget (137,804 vanilla KV tokens): 2K contexts offload 6 layers;
    Mooncake-like 14K contexts (10 sequences, 15 ms steps) offload none; the full budget (750,519) offloads none."""
    cal = Calibration.load(BUNDLED_DIR / "h200_qwen3-30b-a3b_tp1.json")
    pick = lambda tokens, ctx: choose_plan(manifest(), ("w13", "w2"), 342.0, None, kv=KVModel(tokens * KV_TOKEN, KV_TOKEN, ctx, cal))
    assert len(pick(137_804, 2048).layers) == 6
    assert pick(137_804, 14_000).layers == ()
    assert pick(750_519, 2048).layers == ()


def test_choose_plan_kv_offloads_nothing_when_it_cannot_win():
    """A batch cap the vanilla KV already reaches: more KV cannot grow the batch, so nothing is offloaded."""
    capped = KVModel(67 * 2048 * KV_TOKEN, KV_TOKEN, 2048, kv_cal(), max_batch=67)
    p = choose_plan(manifest(), ("w13", "w2"), 342.0, None, kv=capped)
    assert p.layers == () and p.bytes_per_forward == 0 and p.reason.startswith("0 of 48")


def test_choose_plan_sink_index_staggers_layers():
    """Two sinks of one source pull the same number of layers, at different (disjoint) positions."""
    a = choose_plan(manifest(), ["w13", "w2"], 391.0, 24.4, sink_index=0, n_sinks=2)
    b = choose_plan(manifest(), ["w13", "w2"], 391.0, 24.4, sink_index=1, n_sinks=2)
    assert a.layers == (7, 15, 23, 31, 39, 47) and b.layers == (3, 11, 19, 27, 35, 43)
    assert a.bytes_per_forward == b.bytes_per_forward
    assert choose_plan(manifest(), ["w13", "w2"], 391.0, 24.4, sink_index=2, n_sinks=2).layers == a.layers


def test_hidden_fraction():
    """Share of the copy time a forward can hide, capped at 1."""
    assert hidden_fraction(0.0, 5.0) == 1.0
    assert hidden_fraction(10.0, 5.0) == 0.5
    assert hidden_fraction(10.0, 20.0) == 1.0


# --------------------------------------------------------------------------- schedule
def test_prefetch_schedule_slots_and_order():
    """Layer j uses slot j % n; the first n are issued at start; each slot's next tenant follows it."""
    s = PrefetchSchedule([1, 2, 4, 5, 7])
    assert [s.slot_of(x) for x in (1, 2, 4, 5, 7)] == [0, 1, 0, 1, 0]
    assert s.initial == (1, 2)
    assert [s.after(x) for x in (1, 2, 4, 5, 7)] == [4, 5, 7, None, None]
    assert 4 in s and 3 not in s
    s3 = PrefetchSchedule([10, 20, 30, 40], n_slots=3)
    assert s3.initial == (10, 20, 30) and s3.slot_of(40) == 0 and s3.after(10) == 40 and s3.after(20) is None
    one = PrefetchSchedule([3])
    assert one.initial == (3,) and one.after(3) is None
    assert PrefetchSchedule([]).initial == ()


def test_prefetch_schedule_errors():
    """Repeated layers, fewer than one slot, and unknown layers are refused."""
    with pytest.raises(ValueError, match="repeated layers"):
        PrefetchSchedule([1, 2, 1])
    with pytest.raises(ValueError, match="n_slots must be >= 1"):
        PrefetchSchedule([1, 2], n_slots=0)
    s = PrefetchSchedule([1, 2])
    with pytest.raises(KeyError):
        s.slot_of(3)
    with pytest.raises(KeyError):
        s.after(3)


def test_source_sink_pairs():
    """Sink TP rank k reads source TP rank k; GPUs follow SGLang's DP controller layout."""
    assert source_sink_pairs(3, 2) == [(0, 2), (1, 3), (0, 4), (1, 5)]
    assert source_sink_pairs(2, 1) == [(0, 1)]
    assert source_sink_pairs(1, 4) == []
    assert source_sink_pairs(2, 1, base_gpu_id=4) == [(4, 5)]


def test_zerodp_launch_checks_read_the_calibration_flag_file(tmp_path):
    """`auto` needs no file any more (start-up calibration); a named calibration file must be readable."""
    from types import SimpleNamespace

    from sgl_sidp.config import SidpConfig
    from sgl_sidp.zerodp.feature import check

    moe = tmp_path / "moe"
    moe.mkdir()
    (moe / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"], "num_local_experts": 8}))
    raw = SimpleNamespace(model_path=str(moe), dp_size=2, tp_size=2, base_gpu_id=0, gpu_id_step=1)
    assert check(SidpConfig(mode="zerodp"), raw) == []  # Mixtral at TP2: no bundled table needed
    [line] = check(SidpConfig(mode="zerodp", zerodp={"calibration": str(tmp_path / "missing.json")}), raw)
    assert line.startswith(f"--zerodp-calibration {tmp_path / 'missing.json'}: cannot read it")
