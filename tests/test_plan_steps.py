"""The planner's step models (`sgl_sidp.plan.steps`) against hand-computed times: every technique's decode step and
prefill from a made-up calibration and interconnect, its decisions (SiDP auto's B_th, Shift's threshold, ZeroDP's
offload count) and the launch flags and ranking built on them."""

import json
from pathlib import Path

import pytest

from sgl_sidp.calibration.cost import DEFAULT_COPY_RATE_IN_FORWARD, DEFAULT_COPY_SLOWDOWN_MS_PER_GB, first_lasting_win
from sgl_sidp.calibration.memory import ModelShapes
from sgl_sidp.calibration.table import Calibration
from sgl_sidp.plan.comm import Interconnect, Link
from sgl_sidp.plan.configs import Configuration
from sgl_sidp.plan.planner import PlanError, PlanRow, launch_flags, rank
from sgl_sidp.plan import steps
from sgl_sidp.plan.steps import BUNDLED_DIR, PREFIX_FADE_END, ShardClock, StepModel, find_calibration

SHAPES = ModelShapes(layers=4, hidden=1024, heads=16, kv_heads=4, head_dim=64, vocab=1000, tied=False, intermediate=4096)
LINK = Link(latency_us=10.0, busbw_gbps=100.0, source="test")
COLLECTIVES = {op: {n: LINK for n in (2, 4)} for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")}
IC = Interconnect("NVIDIA H200", COLLECTIVES | {"peer_copy": {2: Link(0.0, 100.0, "test")}})
SLOW_COPIES = Interconnect("NVIDIA H200", COLLECTIVES | {"peer_copy": {2: Link(0.0, 10.0, "test")}})


@pytest.fixture(autouse=True)
def short_timing_is_served(monkeypatch):
    """The made-up calibrations below are H200's; their hand-computed times assume a served forward takes what the
    calibration timed (`PREFILL_SUSTAINED_FACTOR` 1.0), except where a test sets the factor itself. The shared clocks
    (`steps.shared_clock`) made under it stay in this test: they keep the prices they computed."""
    monkeypatch.setattr(steps, "PREFILL_SUSTAINED_FACTOR", {})
    monkeypatch.setattr(steps, "_CLOCKS", [])


def cal(scale: float = 1.0) -> Calibration:
    """Decode steps 1 ms + 0.01 ms per sequence, prefills 2 ms + 0.01 ms per token (no attention term)."""
    return Calibration(model="m", gpu="NVIDIA H200", decode_ms={b: scale * (1 + 0.01 * b) for b in (1, 64, 256)},
                       prefill_ms={t: scale * (2 + 0.01 * t) for t in (512, 2048, 8192)}, copy_gbps=None, source="test")


def clock(scale: float = 1.0) -> ShardClock:
    return ShardClock(cal(scale), SHAPES.kv_bytes_per_token(1))


def collective_ms(op: str, n: int, tokens: float, per_layer: int = 2, width: int = 1024) -> float:
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    return per_layer * SHAPES.layers * (10.0 + tokens * width * 2 / (100.0 / factor * 1e3)) / 1e3


def test_fast_decode_equals_the_calibration_on_bundled_tables():
    for f in sorted(BUNDLED_DIR.glob("h200_*.json"))[:4]:
        d = json.loads(f.read_text())
        c = Calibration.from_json(d.get("calibration", d))
        k = ShardClock(c, 147_456)
        for b in (1, 3, 50, 200, 256):
            for ctx in (0, 256, 3000):
                assert k.decode_ms(b, ctx) == pytest.approx(c.decode_step_ms(b, ctx, 147_456), rel=1e-12)
    k = clock()
    assert k.decode_ms(512, 0) == pytest.approx(1 + 0.01 * 512)  # past the largest batch: the last slope


def test_vanilla_tp_adds_two_all_reduces_per_layer():
    one = StepModel(Configuration("tp1", "vanilla", 1, 1), SHAPES, {"forward": clock()}, IC)
    two = StepModel(Configuration("tp2", "vanilla", 1, 2), SHAPES, {"forward": clock(0.5)}, IC)
    assert one.decode_ms(64, 0) == pytest.approx(1.64)
    assert two.decode_ms(64, 0) == pytest.approx(0.82 + collective_ms("all_reduce", 2, 64))
    assert two.prefill_ms([(2048, 0)]) == pytest.approx(0.5 * (2 + 20.48) + collective_ms("all_reduce", 2, 2048), rel=1e-6)


def test_batches_past_the_largest_decode_graph_take_at_least_the_eager_step():
    """SGLang runs a decode batch larger than its largest CUDA graph eagerly, bound by the host's launches: the step
    is the graph model's or the calibrated eager step (interpolated in the batch), whichever is longer; up to the
    graph limit, and for a calibration without eager points, the graph model alone."""
    import dataclasses

    from sgl_sidp.calibration.memory import default_decode_graph_max_bs

    eager = ShardClock(dataclasses.replace(cal(), decode_ms_eager={256: 20.0, 512: 30.0}, decode_eager_context=256),
                       SHAPES.kv_bytes_per_token(1))
    assert eager.eager_ms(384) == pytest.approx(25.0) and clock().eager_ms(384) == 0.0
    tp1 = Configuration("tp1", "vanilla", 1, 1)
    model = StepModel(tp1, SHAPES, {"forward": eager}, IC, graph_max_bs=256)
    assert model.decode_ms(256, 0) == pytest.approx(1 + 0.01 * 256)  # in a graph
    assert model.decode_ms(384, 0) == pytest.approx(25.0)  # eager, host-bound
    assert model.decode_ms(4000, 0) == pytest.approx(1 + 0.01 * 4000)  # eager, but the GPU's work is longer
    assert StepModel(tp1, SHAPES, {"forward": eager}, IC).decode_ms(384, 0) == pytest.approx(1 + 0.01 * 384)
    # SGLang 0.5.17's `ServerArgs._handle_gpu_memory_settings`: H200 (143,771 MiB) and H100 (81,559 MiB) capture
    # decode graphs up to 256 below TP4 and 512 from TP4
    assert [default_decode_graph_max_bs(m, tp) for m in (143_771, 81_559) for tp in (1, 2, 4, 8)] == [256, 256, 512, 512] * 2
    assert Calibration.from_json(eager.cal.to_json()) == eager.cal


def test_sidp_was_is_the_longer_of_compute_and_copies_and_auto_switches_at_b_th():
    c = {v: StepModel(Configuration(f"sidp_dp2_{v}", "sidp", 2, 1, variant=v), SHAPES, {"forward": clock()}, SLOW_COPIES)
         for v in ("was", "cas", "auto")}
    nbytes = 2 * 2 * SHAPES.dense_mlp_params()  # 2 of 4 FFN layers not owned, bf16
    copy = nbytes / (10.0 * DEFAULT_COPY_RATE_IN_FORWARD * 1e9) * 1e3
    assert c["was"].streamed_bytes() == nbytes and c["was"].copy_ms() == pytest.approx(copy)
    for b in (1, 256):
        compute = 1 + 0.01 * b
        assert c["was"].decode_ms(b, 0) == pytest.approx(max(compute + DEFAULT_COPY_SLOWDOWN_MS_PER_GB * nbytes / 1e9, copy))
        assert c["cas"].decode_ms(b, 0) > compute  # the owner's FFN on both ranks' rows, and the exchange
    b_th = c["auto"].b_th
    assert 256 < b_th < 1024  # CaS wins while the copies (6.3 ms) outlast the step
    assert c["auto"].decode_ms(b_th, 1024) == c["was"].decode_ms(b_th, 1024)
    assert c["auto"].decode_ms(b_th - 8, 1024) == c["cas"].decode_ms(b_th - 8, 1024)
    assert c["was"].decode_ms(b_th, 1024) <= c["cas"].decode_ms(b_th, 1024)
    assert [c[v].steps_variant() for v in ("was", "cas", "auto")] == ["was", "cas", "auto"]


def test_weight_pulls_slow_a_prefill_at_the_gpu_kinds_prefill_rate_and_a_decode_at_the_decode_rate():
    """`PREFILL_COPY_SLOWDOWN_MS_PER_GB`: on H200 a WaS rank's prefill forward slows 0.90 ms per GB it pulls (profiled,
    SiDP DP4 on Llama-3.1-70B), its decode step 0.327; a kind without its own prefill rate (H100) takes the decode
    rate for both; a configuration that pulls nothing is unchanged."""
    import dataclasses

    from sgl_sidp.plan.steps import PREFILL_COPY_SLOWDOWN_MS_PER_GB

    nbytes = 2 * 2 * SHAPES.dense_mlp_params()
    for gpu, per_gb in (("NVIDIA H200", PREFILL_COPY_SLOWDOWN_MS_PER_GB["H200"]),
                        ("NVIDIA H100 80GB HBM3", DEFAULT_COPY_SLOWDOWN_MS_PER_GB)):
        k = ShardClock(dataclasses.replace(cal(), gpu=gpu), SHAPES.kv_bytes_per_token(1))
        was = StepModel(Configuration("sidp_dp2_was", "sidp", 2, 1, variant="was"), SHAPES, {"forward": k}, IC)
        assert was.prefill_ms([(8192, 0)]) == pytest.approx(2 + 81.92 + per_gb * nbytes / 1e9)
        assert was.decode_ms(64, 0) == pytest.approx(1.64 + DEFAULT_COPY_SLOWDOWN_MS_PER_GB * nbytes / 1e9)
    tp1 = StepModel(Configuration("tp1", "vanilla", 1, 1), SHAPES, {"forward": clock()}, IC)
    assert tp1.prefill_ms([(8192, 0)]) == pytest.approx(2 + 81.92)


def test_a_served_prefill_takes_the_gpu_kinds_sustained_clock(monkeypatch):
    """`PREFILL_SUSTAINED_FACTOR`: on H200 a prefill forward's per-token terms (linears, attention) take 1.028x the
    calibration's short timing (`gemm_sustained_1gpu_h200`), its constant and the small prefills' floor do not; a kind
    without a factor (H100) prices what was timed."""
    import dataclasses

    monkeypatch.setattr(steps, "PREFILL_SUSTAINED_FACTOR", {"H200": 1.028})
    h200, h100 = (ShardClock(dataclasses.replace(cal(), gpu=g), SHAPES.kv_bytes_per_token(1))
                  for g in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"))
    assert h200.prefill_ms([(8192, 0)]) == pytest.approx(2 + 1.028 * 81.92)
    assert h100.prefill_ms([(8192, 0)]) == pytest.approx(2 + 81.92)
    assert h200.prefill_ms([(16, 0)]) == h100.prefill_ms([(16, 0)]) == pytest.approx(2 + 0.01 * 512)  # the floor


@pytest.mark.parametrize("b_th, twin", [(1.0, "was"), (float("inf"), "cas")])
def test_sidp_auto_with_b_th_at_an_end_steps_as_one_service(b_th, twin):
    """`steps_variant`: with B_th at most one token, auto runs WaS at every batch and prefill; with B_th inf, CaS (the
    planner then simulates its schedule once for both)."""
    c = {v: StepModel(Configuration(f"sidp_dp2_{v}", "sidp", 2, 1, variant=v), SHAPES, {"forward": clock()}, SLOW_COPIES)
         for v in (twin, "auto")}
    c["auto"].__dict__["b_th"] = b_th  # (a cached_property)
    assert c["auto"].steps_variant() == twin
    for b, ctx in ((1, 0), (7, 300), (256, 4096), (1024, 100)):
        assert c["auto"].decode_ms(b, ctx) == c[twin].decode_ms(b, ctx)
    for parts in ([(1, 0)], [(512, 0)], [(300, 1024), (40, 0)], [(8192, 0)]):
        assert c["auto"].prefill_ms(parts) == c[twin].prefill_ms(parts)


def test_first_lasting_win_needs_the_win_to_last():
    assert first_lasting_win(lambda x: 5, lambda x: x, [1, 2, 4, 8, 16]) == 8
    assert first_lasting_win(lambda x: 5 if x < 16 else 99, lambda x: x, [1, 2, 4, 8, 16]) is None
    assert first_lasting_win(lambda x: 0, lambda x: x, [1, 2]) == 1


def test_shift_runs_tp_for_small_forwards_and_the_base_above_its_threshold():
    m = StepModel(Configuration("shift_sp2_tp1_nccl", "shift", 1, 1, 2, "", ("nccl",)), SHAPES,
                  {"shift": clock(0.5), "base": clock(0.9)}, IC)
    th = m.shift_threshold
    assert 256 <= th < 8192
    tp2 = StepModel(Configuration("tp2", "vanilla", 1, 2), SHAPES, {"forward": clock(0.5)}, IC)
    assert m.decode_ms(1, 0) == tp2.decode_ms(1, 0)
    big = [(8192, 0)]
    # each SP rank's all-to-all buffer: its 4,096 tokens x the SP group's QKV (8,192 x one shift shard's width)
    qkv = SHAPES.head_dim * (SHAPES.heads + 2 * SHAPES.kv_heads) // 2
    base = (0.9 * (2 + 0.5 * 81.92) + collective_ms("all_to_all", 2, 8192, 1, qkv)
            + collective_ms("all_to_all", 2, 8192, 1, SHAPES.heads * SHAPES.head_dim // 2))  # linears on half the tokens
    assert m.prefill_ms(big) == pytest.approx(base, rel=1e-6) and base < tp2.prefill_ms(big)


@pytest.mark.parametrize("sp, tp", [(2, 1), (4, 1), (2, 2)])
def test_shift_times_the_all_to_all_buffers_bench_a2a_sends(sp, tp):
    """The step model's Ulysses all-to-alls are timed on each rank's own buffer, the one `bench.a2a` sends (and the
    server: `shift.ulysses`): [SP, tokens / SP, block width] per all-to-all, not the whole forward's tokens x the base
    shard's width (SP times the bytes, the miss of `q32_shift_1.5x_4gpu_h200`)."""
    from sgl_sidp.bench.a2a import block_widths
    from sgl_sidp.shift.planner import OVERLAP_DECODE_STEP_US, OVERLAP_STEP_US, TECHNIQUE

    hf = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": SHAPES.layers, "hidden_size": SHAPES.hidden,
          "num_attention_heads": SHAPES.heads, "num_key_value_heads": SHAPES.kv_heads, "head_dim": SHAPES.head_dim,
          "vocab_size": SHAPES.vocab, "intermediate_size": SHAPES.intermediate, "torch_dtype": "bfloat16"}
    assert ModelShapes.of(hf) == SHAPES
    tokens = 8192
    m = StepModel(Configuration(f"shift_sp{sp}_tp{tp}_nccl", "shift", 1, tp, sp, "", ("nccl",)), SHAPES,
                  {"shift": clock(), "base": clock()}, IC)
    sent = [sp * (tokens // sp) * c * 2 for c in block_widths(hf, sp * tp)]  # bench.a2a's send buffers, bf16
    expect = sum(SHAPES.layers * IC.time_us("all_to_all", sp, b) / 1e3 for b in sent)
    assert TECHNIQUE._ulysses_ms(m, tokens, True) == pytest.approx(expect, rel=1e-9)
    # the default, --shift-all-to-all overlap: what its copies and barriers leave per layer, whatever the size; more
    # in a decode forward, whose small GEMMs hide less
    m = StepModel(Configuration(f"shift_sp{sp}_tp{tp}", "shift", 1, tp, sp), SHAPES, {"shift": clock(), "base": clock()},
                  IC)
    left = SHAPES.layers * 2 * sp * OVERLAP_STEP_US / 1e3
    assert TECHNIQUE._ulysses_ms(m, tokens, True) == TECHNIQUE._ulysses_ms(m, 2 * tokens, True) == pytest.approx(left)
    assert TECHNIQUE._ulysses_ms(m, 512, False) == pytest.approx(left * OVERLAP_DECODE_STEP_US / OVERLAP_STEP_US)
    assert left < expect
    th = StepModel(Configuration(f"shift_sp{sp}_tp{tp}_th1", "shift", 1, tp, sp, "", ("th1",)), SHAPES,
                   {"shift": clock(), "base": clock()}, IC)  # every forward of two tokens or more in the base
    assert [TECHNIQUE.terms(th, 512, "replica", None, prefill)[3] for prefill in (True, False)] == [
        pytest.approx(left), pytest.approx(left * OVERLAP_DECODE_STEP_US / OVERLAP_STEP_US)]
    assert m.steps_variant() == "overlap"  # a schedule simulated for one exchange is not reused for the other


def test_dp_attention_pays_for_every_rank_s_tokens_in_its_ffn():
    """The other rank's 64 tokens cost this rank its FFN's share of their linear time: its half of the MLP against the
    whole attention it runs (`StepModel.gathered_ffn_share`), plus the all-gather and reduce-scatter."""
    m = StepModel(Configuration("dp2_attn", "dp_attention", 2, 1), SHAPES, {"forward": clock()}, IC)
    share = SHAPES.dense_mlp_params() / 2 / (SHAPES.dense_mlp_params() / 2 + SHAPES.attention_params(1))
    expect = 1.64 + share * 0.64 + collective_ms("all_gather", 2, 128, 1) + collective_ms("reduce_scatter", 2, 128, 1)
    assert m.decode_ms(64, 0) == pytest.approx(expect)


def test_zerodp_offloads_nothing_on_two_h200s_as_its_runtime_policy_does():
    qwen = Path(__file__).resolve().parents[2] / "shared" / "models" / "Qwen3-30B-A3B" / "config.json"
    if not qwen.is_file():
        pytest.skip(f"{qwen} missing (../shared/models)")
    shapes = ModelShapes.of(json.loads(qwen.read_text()))
    found = find_calibration("Qwen3MoeForCausalLM L48 E128 H2048 I768 A32/4 tp1", "NVIDIA H200")
    m = StepModel(Configuration("zerodp_dp2", "zerodp", 2, 1), shapes, {"forward": ShardClock(found[0], 49_152)},
                  Interconnect.load("NVIDIA H200"), context=2048)
    assert m.choose_offload(700_000 * 49_152) == ()
    assert m.decode_ms(64, 2048, "sink") == m.decode_ms(64, 2048)


def plan_row(name: str, **fields) -> PlanRow:
    """A `PlanRow` of configuration `name` with made-up sizes and the given fields."""
    return PlanRow(**{"name": name, "technique": "", "variant": "", "dp": 1, "tp": 1, "sp": 1, "mem_fraction_static": 0.9,
                      "weights_gb_per_gpu": 1.0, "kv_tokens_total": 1000, **fields})


def test_launch_flags_start_each_technique_with_the_decisions_of_this_cost_model():
    row = lambda name, **d: plan_row(name, decisions=d)  # noqa: E731
    assert launch_flags(row("dp2")) == ["--dp-size", "2"]
    assert launch_flags(row("dp2_attn")) == ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]
    # SiDP auto: the ranks measure B_th at start-up, so the planner's is not passed on; a named one is
    assert launch_flags(row("sidp_dp2_auto", b_th=96.0))[-2:] == ["--sidp-service", "auto"]
    assert launch_flags(row("sidp_dp2_auto_bth64", b_th=96.0))[-2:] == ["--sidp-b-th", "64"]
    assert launch_flags(row("shift_sp2_tp1", shift_threshold=256))[-2:] == ["--shift-threshold", "256"]
    assert "--shift-threshold" not in launch_flags(row("shift_sp2_tp1", shift_threshold=float("inf")))
    assert launch_flags(row("zerodp_dp2_tp2")) == ["--tp-size", "2", "--dp-size", "2", "--overlay-mode", "zerodp"]
    assert launch_flags(row("zerodp_dp2_kv2048"))[-2:] == ["--zerodp-expected-batch", "kv:2048"]


def test_latency_ranking_keeps_to_configurations_that_keep_up():
    rows = [plan_row("a", total_tok_s=100.0, e2e_ms_p50=50.0), plan_row("b", total_tok_s=99.0, e2e_ms_p50=40.0),
            plan_row("c", total_tok_s=50.0, e2e_ms_p50=1.0), plan_row("d", not_predicted="no calibration")]
    assert [r.name for r in rank(rows, "latency")] == ["b", "a", "c"]
    assert [r.name for r in rank(rows, "throughput")] == ["a", "b", "c"]


def _context_cal(scale: float = 1.0) -> Calibration:
    """A calibration whose decode step grows with the context (two contexts per batch)."""
    return Calibration(model="m", gpu="NVIDIA H200", decode_ms={b: scale * (1 + 0.01 * b) for b in (1, 64, 256)},
                       prefill_ms={t: scale * (2 + 0.01 * t) for t in (512, 2048, 8192)}, copy_gbps=None,
                       source="test", decode_ms_long={b: scale * (1.5 + 0.03 * b) for b in (1, 64, 256)},
                       decode_context_long=4096)


def test_decode_run_says_for_how_many_steps_the_rounded_decode_time_lasts():
    """`decode_run(b, ctx)` is (`decode_ms(b, ctx)`, steps): the time of the contexts ctx + i for i < steps, which
    round to the same multiple of CONTEXT_STEP (round() goes to even on a tie), and not of ctx + steps. The
    simulation's contexts are means of whole tokens (S / b, growing by b a step), ties included."""
    import random

    from sgl_sidp.plan.steps import CONTEXT_STEP

    m = StepModel(Configuration("tp1", "vanilla", 1, 1), SHAPES, {"forward": ShardClock(_context_cal(), 4096)}, IC)
    rnd = random.Random(0)
    cases = [(rnd.randint(1, 300), None) for _ in range(1500)]
    cases += [(b, CONTEXT_STEP * q + CONTEXT_STEP // 2) for b in (1, 3, 64) for q in (0, 1, 2, 7, 8)]  # on a tie
    for b, mean in cases:
        s = rnd.randint(0, 20_000 * b) if mean is None else mean * b - rnd.randint(0, 40) * b
        ms, steps = m.decode_run(b, s / b)
        assert steps >= 1 and ms == m.decode_ms(b, s / b)
        q = round(s / b / CONTEXT_STEP)
        assert all(round((s + i * b) / b / CONTEXT_STEP) == q for i in range(steps))
        assert all(m.decode_ms(b, (s + i * b) / b) == ms for i in range(steps))
        assert round((s + steps * b) / b / CONTEXT_STEP) != q


def test_step_models_of_equal_clocks_share_one():
    """Equal clocks (the same calibration and KV bytes, distinct objects, as the planner makes them for each
    configuration) are one clock to the step models, its memo of decode times shared; an unequal one is not."""
    kv = SHAPES.kv_bytes_per_token(1)
    one = StepModel(Configuration("tp1", "vanilla", 1, 1), SHAPES, {"forward": ShardClock(_context_cal(), kv)}, IC)
    two = StepModel(Configuration("sidp_dp2_was", "sidp", 2, 1, variant="was"), SHAPES,
                    {"forward": ShardClock(_context_cal(), kv)}, IC)
    other = StepModel(Configuration("tp1", "vanilla", 1, 1), SHAPES, {"forward": ShardClock(_context_cal(2.0), kv)},
                      IC)
    assert one.clocks["forward"] is two.clocks["forward"] and other.clocks["forward"] is not one.clocks["forward"]
    fresh = ShardClock(_context_cal(), kv)
    for b, ctx in ((1, 0), (64, 1000), (300, 5000)):
        assert one.clock.decode_ms(b, ctx) == fresh._decode_uncached(b, ctx)
        assert one.decode_ms(b, ctx) == fresh.decode_ms(b, 32 * round(ctx / 32))  # (no all-reduce at TP1)
    assert other.decode_ms(64, 1024) > one.decode_ms(64, 1024)


def test_prefills_over_a_cached_prefix_take_the_calibrated_prefix_factor():
    """`ShardClock.prefix_factor` k from `Calibration.prefill_prefix_ms` (prefills over a radix hit): a prefill of
    n new tokens over p cached ones costs c + a n + b n (n + 2 k p); without such points k is 1 and the prefill is the
    fresh-prompt fit's, as before they were measured."""
    import dataclasses

    c, a, b = 3.0, 0.02, 2e-6
    fresh = {t: c + a * t + b * t * t for t in (512, 2048, 4096, 8192)}
    base = Calibration(model="m", gpu="NVIDIA H200", decode_ms={1: 1.0}, prefill_ms=fresh, copy_gbps=None, source="t")
    rows = tuple((n, p, c + a * n + b * n * (n + 2 * 1.6 * p)) for n, p in ((2048, 8192), (2048, 16384), (8192, 8192)))
    plain, probed = (ShardClock(cal_, SHAPES.kv_bytes_per_token(1))
                     for cal_ in (base, dataclasses.replace(base, prefill_prefix_ms=rows)))
    assert plain.prefix_factor == 1.0 and probed.prefix_factor == pytest.approx(1.6)
    assert plain.prefill_ms([(1000, 4000)]) == pytest.approx(c + a * 1000 + b * 1000 * (1000 + 2 * 4000))
    assert probed.prefill_ms([(1000, 4000)]) == pytest.approx(c + a * 1000 + b * 1000 * (1000 + 2 * 1.6 * 4000))
    assert probed.prefill_ms([(4096, 0)]) == plain.prefill_ms([(4096, 0)])  # a fresh prompt: no prefix term
    assert Calibration.from_json(json.loads(json.dumps(probed.cal.to_json()))) == probed.cal


def test_k_grows_with_the_prefix_along_the_probes_line_and_holds_past_the_longest():
    """Probes whose k rises with the prefix (as the bundled ones do: 1.2 at 8,192, 1.7 at 16,384) give k(p) = alpha +
    beta x min(p, p_max); probes that span under 2x in prefix, a falling line or a what-if k give the median k."""
    import dataclasses

    from sgl_sidp.plan.what_if import WhatIf

    c, a, b = 3.0, 0.02, 2e-6
    fresh = {t: c + a * t + b * t * t for t in (512, 2048, 4096, 8192)}
    base = Calibration(model="m", gpu="NVIDIA H200", decode_ms={1: 1.0}, prefill_ms=fresh, copy_gbps=None, source="t")

    def k_of(p):
        return 0.7 + 6e-5 * p

    def clock(probes, what_if=None, k=k_of):
        rows = tuple((n, p, c + a * n + b * n * (n + 2 * k(p) * p)) for n, p in probes)
        cal_ = dataclasses.replace(base, prefill_prefix_ms=rows)
        kv = SHAPES.kv_bytes_per_token(1)
        return ShardClock(cal_, kv, what_if) if what_if else ShardClock(cal_, kv)

    def ms(n, p, k):
        return c + a * n + b * n * (n + 2 * k * p)

    lined = clock(((2048, 8192), (2048, 16384), (8192, 8192)))
    alpha, beta, p_max = lined.prefix_line
    assert (alpha, beta, p_max) == (pytest.approx(0.7), pytest.approx(6e-5), 16384)
    assert lined.prefill_ms([(4096, 4096)]) == pytest.approx(ms(4096, 4096, k_of(4096)))  # k 0.95: below the probes
    assert lined.prefill_ms([(1000, 30000)]) == pytest.approx(ms(1000, 30000, k_of(16384)))  # held past the longest
    assert lined.prefill_ms([(512, 8192), (512, 0)]) == pytest.approx(
        c + a * 1024 + b * (512 * (512 + 2 * k_of(8192) * 8192) + 512 * 512))
    narrow = clock(((2048, 8192), (2048, 10240), (8192, 8192)))  # 1.25x apart: one k, the median
    assert narrow.prefix_line is None and narrow.prefix_factor == pytest.approx(k_of(8192))
    assert narrow.prefill_ms([(4096, 4096)]) == pytest.approx(ms(4096, 4096, k_of(8192)))
    hand = clock(((2048, 8192), (2048, 16384), (8192, 8192)), WhatIf(prefix_factor=1.0))
    assert hand.prefix_line is None and hand.prefill_ms([(4096, 4096)]) == pytest.approx(ms(4096, 4096, 1.0))
    falling = clock(((2048, 8192), (2048, 16384), (8192, 8192)), k=lambda p: 2.0 - 5e-5 * p)  # noise, not physics
    assert falling.prefix_line is None
    # `prefix_new_scale`: the probe of 8,192 new tokens over 8,192 cached at 0.8x the line the 2,048-token probes set
    # scales k by 0.8 from 8,192 new tokens on, by 0.9 at 4,096 (halfway in log n), not at all up to 2,048; that over
    # up to 8,192 cached, back to 1 at `PREFIX_FADE_END` (32,768) and past it
    rows = tuple((n, p, c + a * n + b * n * (n + 2 * (0.8 if n == 8192 else 1.0) * k_of(p) * p))
                 for n, p in ((2048, 8192), (2048, 16384), (8192, 8192)))
    scaled = ShardClock(dataclasses.replace(base, prefill_prefix_ms=rows), SHAPES.kv_bytes_per_token(1))
    assert scaled.prefix_line[:2] == (pytest.approx(0.7), pytest.approx(6e-5))
    assert scaled.prefix_new_scale == (2048.0, 8192.0, pytest.approx(0.8), 8192.0)
    assert scaled.prefill_ms([(8192, 8192)]) == pytest.approx(ms(8192, 8192, 0.8 * k_of(8192)))
    assert scaled.prefill_ms([(8192, 4096)]) == pytest.approx(ms(8192, 4096, 0.8 * k_of(4096)))
    assert PREFIX_FADE_END == 32768
    assert scaled.prefill_ms([(8192, 12288)]) == pytest.approx(ms(8192, 12288, (1 - 0.2 * 5 / 6) * k_of(12288)))
    assert scaled.prefill_ms([(8192, 20480)]) == pytest.approx(ms(8192, 20480, 0.9 * k_of(16384)))  # halfway back
    assert scaled.prefill_ms([(8192, 32768)]) == pytest.approx(ms(8192, 32768, k_of(16384)))
    assert scaled.prefill_ms([(8192, 40000)]) == pytest.approx(ms(8192, 40000, k_of(16384)))
    assert scaled.prefill_ms([(4096, 8192)]) == pytest.approx(ms(4096, 8192, 0.9 * k_of(8192)))
    assert scaled.prefill_ms([(2048, 16384)]) == pytest.approx(ms(2048, 16384, k_of(16384)))
    assert lined.prefix_new_scale[2] == pytest.approx(1.0) and narrow.prefix_new_scale is None


def test_the_schedulers_host_time_per_request_shows_where_it_outlasts_the_forward():
    """`Calibration.host_ms_per_request` (the scheduler's host work per running request per step): hidden behind a
    CUDA-graph step that lasts longer, added to the eager forward past SGLang's largest decode graph (the kernel
    launches keep the host busy there); 0 where not measured, as before."""
    import dataclasses

    base = dataclasses.replace(cal(), decode_ms_eager={256: 20.0, 512: 30.0}, decode_eager_context=256)
    tp1 = Configuration("tp1", "vanilla", 1, 1)
    plain, busy = (StepModel(tp1, SHAPES, {"forward": ShardClock(c, SHAPES.kv_bytes_per_token(1))}, IC, graph_max_bs=256)
                   for c in (base, dataclasses.replace(base, host_ms_per_request=0.02)))
    assert busy.clock.host_ms(100) == pytest.approx(2.0) and plain.clock.host_ms(100) == 0.0
    assert busy.decode_ms(64, 0) == plain.decode_ms(64, 0) == pytest.approx(1 + 0.01 * 64)  # 1.28 ms of host: hidden
    assert busy.decode_ms(200, 0) == pytest.approx(0.02 * 200) and plain.decode_ms(200, 0) == pytest.approx(3.0)
    assert busy.decode_ms(512, 0) == pytest.approx(30.0 + 0.02 * 512) and plain.decode_ms(512, 0) == pytest.approx(30.0)
    assert Calibration.from_json(json.loads(json.dumps(busy.clock.cal.to_json()))) == busy.clock.cal


def test_zerodp_rows_predict_the_policy_each_name_launches():
    """`zerodp_dp2` is the runtime's default policy (decode:1: on H200 nothing hides behind a batch-1 step), `_all`
    every MoE layer, `_pfN` what hides behind an N-token prefill, `_kvN` the capacity-bound count; the planner lists
    the default and the capacity-bound policy at the workload's context, and predicts named ones on request; an option
    no step model reads is listed as not predicted."""
    from sgl_sidp.plan.planner import plan

    qwen = Path(__file__).resolve().parents[2] / "shared" / "models" / "Qwen3-30B-A3B"
    if not (qwen / "config.json").is_file():
        pytest.skip(f"{qwen} missing (../shared/models)")
    r = plan(str(qwen), 2, "H200", "offline:64:8192:16", names=["zerodp_dp2_all", "zerodp_dp2_pf8192",
                                                                 "shift_sp2_tp1_th1"])
    rows = {x.name: x for x in r["configurations"]}
    assert set(rows) >= {"dp2", "zerodp_dp2", "zerodp_dp2_kv8200", "zerodp_dp2_all", "zerodp_dp2_pf8192"}
    layers = {n: rows[n].decisions["offload_layers"] for n in ("zerodp_dp2", "zerodp_dp2_all", "zerodp_dp2_pf8192")}
    assert layers["zerodp_dp2"] == 0 and layers["zerodp_dp2_all"] == 48 and 0 < layers["zerodp_dp2_pf8192"] <= 48
    assert rows["zerodp_dp2"].total_tok_s == rows["dp2"].total_tok_s
    assert rows["zerodp_dp2_all"].kv_tokens_total > 1.3 * rows["dp2"].kv_tokens_total  # the sink holds no experts
    assert rows["shift_sp2_tp1_th1"].not_predicted == "not a configuration of this model on 2 GPUs"  # MoE
    with pytest.raises(PlanError, match="runs on 4 GPUs, not 2"):
        plan(str(qwen), 2, "H200", "offline:4:16:4", names=["zerodp_dp4"])


def test_sidp_auto_with_a_named_b_th_is_predicted_at_that_b_th():
    """`sidp_dp2_auto_bthN` launches auto at B_th = N (`--sidp-b-th N`), and the planner predicts it at that B_th: at
    B_th 1 every forward runs WaS (as `sidp_dp2_was`, but with the ranks in lockstep, which only waits), far above
    every batch every forward but prefill runs CaS."""
    from sgl_sidp.plan.planner import plan

    qwen = Path(__file__).resolve().parents[2] / "shared" / "models" / "Qwen3-32B"
    if not (qwen / "config.json").is_file():
        pytest.skip(f"{qwen} missing (../shared/models)")
    r = plan(str(qwen), 2, "H200", "offline:128:4096:16", names=["sidp_dp2_auto_bth1", "sidp_dp2_auto_bth128"])
    rows = {x.name: x for x in r["configurations"]}
    assert rows["sidp_dp2_auto_bth128"].not_predicted is None
    assert rows["sidp_dp2_auto_bth1"].decisions["b_th"] == 1 and rows["sidp_dp2_auto_bth128"].decisions["b_th"] == 128
    one, was = rows["sidp_dp2_auto_bth1"], rows["sidp_dp2_was"]
    assert (one.prefill_ms, one.decode_step_ms) == (was.prefill_ms, was.decode_step_ms)
    assert 0.95 * was.total_tok_s < one.total_tok_s <= was.total_tok_s
    assert rows["sidp_dp2_auto_bth128"].total_tok_s != pytest.approx(rows["sidp_dp2_was"].total_tok_s)


def test_a_prefill_fit_without_an_attention_term_plans():
    """Llama-3.1-70B's 4-GPU H100 shards fitted no attention term (b clipped at 0, before `nonnegative_fit`; Mixtral's
    H200 TP1 still fits none), and the planner divided by it to read attention over a cached prefix: a
    ZeroDivisionError traceback from `python -m sgl_sidp.plan --gpus 4 --gpu H100`. Such a fit takes a prefix like
    new tokens (k = 1)."""
    from sgl_sidp.plan.planner import plan

    llama = Path(__file__).resolve().parents[2] / "shared" / "models" / "Llama-3.1-70B"
    if not (llama / "config.json").is_file():
        pytest.skip(f"{llama} missing (../shared/models)")
    rows = {r.name: r for r in plan(str(llama), 4, "H100", "offline:128:4096:16")["configurations"]}
    assert rows["tp4"].predicted and rows["sidp_dp4_auto"].predicted and rows["sidp_dp4_auto"].total_tok_s > 0


def test_prefills_below_the_fit_follow_the_measured_points_and_batches_the_fit():
    """The bundled H100 TP2 shard of Qwen3-8B (2 x H100): its 16- and 512-token prefills are launch-bound (15.6 and
    18.5 ms), so the fit takes the prefills of 2,048 tokens and more (`PREFILL_FIT_FROM`) and a smaller prefill
    follows the line through the small points (`prefill_ramp`). Four 2,048-token prompts in one forward then take
    what the profile measured on that GPU within 10 % (129 ms with the all-reduces, 19.3 ms of them: about 110 ms);
    with the small points in the fit the per-token slope fell by 40 % and that batch took 91 ms."""
    from sgl_sidp.plan.steps import PREFILL_FIT_FROM

    found = find_calibration("Qwen3ForCausalLM L36 H4096 I6144 A16/4 tp1", "NVIDIA H100 80GB HBM3")
    c = ShardClock(found[0], 1)
    measured = found[0].prefill_ms
    assert PREFILL_FIT_FROM == 2048 and [t for t, _ in c.prefill_ramp] == [16, 128, 512, 2048]
    for t in (16, 512, 2048, 4096, 8192):
        assert c.prefill_ms([(t, 0)]) == pytest.approx(measured[t], rel=0.03)
    assert measured[512] < c.prefill_ms([(1024, 0)]) < measured[2048]
    assert c.prefill_ms([(2048, 0)] * 4) == pytest.approx(110, rel=0.10)
    assert c.prefill_ms([(200, 0), (200, 0)]) == c.prefill_ms([(400, 0)])  # the line reads the forward's tokens


def test_plan_with_objectives_predicts_each_configurations_goodput():
    """`plan(..., slo=(TTFT ms, TPOT ms))`: every predicted row has its goodput (the TTFT objective includes the
    request overhead); an objective no request meets gives 0, one every request meets its request rate."""
    from sgl_sidp.plan.planner import plan

    qwen = Path(__file__).resolve().parents[2] / "shared" / "models" / "Qwen3-8B"
    if not (qwen / "config.json").is_file():
        pytest.skip(f"{qwen} missing (../shared/models)")
    loose = {r.name: r for r in plan(str(qwen), 2, "H100", "offline:8:512:8", slo=(1e9, 1e9))["configurations"]}
    tight = {r.name: r for r in plan(str(qwen), 2, "H100", "offline:8:512:8", slo=(1.0, 1e9))["configurations"]}
    for name, r in loose.items():
        if r.predicted:
            assert r.good_requests == 8 and r.request_goodput == pytest.approx(8 / r.makespan_s, rel=0.05)  # rounded
            assert tight[name].good_requests == 0
    assert plan(str(qwen), 2, "H100", "offline:8:512:8")["configurations"][0].request_goodput is None


def test_a_winner_within_the_planners_error_of_the_next_is_called_a_near_tie():
    """Qwen3-30B-A3B on 2 x H100, 256 x (2,048 in, 256 out): TP2 is predicted 1.03x DP attention, which measured 1.03x
    TP2 (`NEAR_TIE`); the reason (and `--overlay-mode auto`'s line) says the runner-up may serve it as well."""
    from sgl_sidp.plan.planner import NEAR_TIE, plan

    qwen = Path(__file__).resolve().parents[2] / "shared" / "models" / "Qwen3-30B-A3B"
    if not (qwen / "config.json").is_file():
        pytest.skip(f"{qwen} missing (../shared/models)")
    r = plan(str(qwen), 2, "H100", "offline:256:2048:256")
    assert r["winner"] == "tp2" and r["reason"].endswith(
        "a near tie, within the planner's error: dp2_attn may serve it as well or better")
    clear = plan(str(qwen.parent / "Llama-3.1-70B"), 4, "H100", "offline:64:2048:512")  # TP4 1.29x the next
    assert clear["winner"] == "tp4" and "near tie" not in clear["reason"] and NEAR_TIE == 0.05


def test_a_lockstep_bursts_two_schedules_are_predicted_and_a_reversal_is_named():
    """Llama-3.1-70B SiDP DP4 auto, 512 x (2,048 in, 16 out) on 4 x H100: the burst's first request alone puts one
    replica an iteration ahead for the whole burst (12,213 tok/s predicted), where the server's ranks started in
    phase and ran 14,555 (`l70_sidp512_4gpu_h100`); the in-phase schedule is predicted beside it, and the reason
    names the reversal of the order it allows (here with the winner, SiDP at DP2 x TP2, and with TP4)."""
    from sgl_sidp.plan.planner import phase_note, plan

    llama = Path(__file__).resolve().parents[2] / "shared" / "models" / "Llama-3.1-70B"
    if not (llama / "config.json").is_file():
        pytest.skip(f"{llama} missing (../shared/models)")
    r = plan(str(llama), 4, "H100", "offline:512:2048:16", names=["sidp_dp4_auto", "tp4"])
    rows = {row.name: row for row in r["configurations"]}
    sidp, tp4 = rows["sidp_dp4_auto"], rows["tp4"]
    assert sidp.in_phase_tok_s > tp4.total_tok_s > sidp.total_tok_s and tp4.in_phase_tok_s is None
    assert phase_note(tp4, [sidp]) == ("; sidp_dp4_auto may serve it better: sidp_dp4_auto's replicas step together, "
                                       "and its burst runs 12,213-15,172 tokens/s by whether they start it in phase")
    assert r["winner"] == "sidp_dp2_tp2_auto" and "sidp_dp4_auto may serve it better" in r["reason"]
    row = lambda name, tok, alt=None: PlanRow(name=name, technique="sidp", variant="", dp=2, tp=1, sp=1,  # noqa: E731
                                              mem_fraction_static=0.8, weights_gb_per_gpu=1.0, kv_tokens_total=1,
                                              total_tok_s=tok, in_phase_tok_s=alt)
    assert phase_note(row("a", 100.0), [row("b", 90.0, 99.0)]) == ""  # the faster schedule stays behind
    assert "b may serve it better" in phase_note(row("a", 100.0), [row("b", 90.0, 101.0)])
    assert "a's replicas" in phase_note(row("a", 100.0, 80.0), [row("b", 90.0)])  # the winner's slower schedule
    assert "in_phase_tok_s" not in plan(str(llama), 4, "H100", "latency:2048:4",
                                        names=["sidp_dp4_auto"])["configurations"][0].as_dict()


def test_the_prefill_fit_keeps_every_term_at_least_zero_by_refitting():
    """Llama-3.1-70B's TP4 shard on H100 measured 120.7, 271.8 and 562.0 ms at 2,048, 4,096 and 8,192 tokens: the
    least-squares quadratic through them has a negative attention term. Clipping it at 0 and keeping the other two
    left a line 12 % over the 8,192-token point (628 ms); the fit with every term at least 0 (`nonnegative_fit`) stays
    within 1 % of it and of SGLang's profiled 2 x 4,096-token forward less its all-reduces (489 ms) within 10 %."""
    from sgl_sidp.plan.steps import nonnegative_fit

    c = ShardClock(Calibration(model="m", gpu="NVIDIA H100 80GB HBM3", decode_ms={1: 20.0},
                               prefill_ms={2048: 120.7, 4096: 271.8, 8192: 562.0}, copy_gbps=None, source="test"), 1)
    assert all(v >= 0 for v in c.prefill_fit)
    assert c.prefill_ms([(8192, 0)]) == pytest.approx(562.0, rel=0.01)
    assert c.prefill_ms([(4096, 0), (4096, 0)]) == pytest.approx(489, rel=0.10)
    np = pytest.importorskip("numpy")
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    assert nonnegative_fit(x, np.array([3.0, 2.0, 1.0])) == pytest.approx((2.0, 0.0))  # the slope alone would be < 0
    assert nonnegative_fit(x, np.array([-1.0, -2.0, -3.0])) == (0.0, 0.0)


def test_prefills_of_several_prompts_set_the_attention_apart_from_the_linear_layers():
    """A fit through one-request prefills alone (c + a T + b T^2) is exact on them, but where a prompt's attention grows
    faster than its square (per token pair it costs more the longer the prompt, as over a long cached prefix:
    `prefix_line`), its b is too large for short prompts and a chunk of several comes out cheap: Qwen3-32B's TP1 shard
    on H100, 2 x 4,096 tokens, 946 ms predicted against 1,011 profiled. With the prefills of several prompts in the
    calibration (`Calibration.prefill_multi_ms`) the fit takes them too; a table without them fits as before."""
    import dataclasses

    def truth(parts):  # linear layers, and attention that grows as each prompt's length to the power 2.3
        return 10.0 + 0.1 * sum(parts) + sum(2e-7 * n ** 2.3 for n in parts)

    singles = {t: truth([t]) for t in (2048, 4096, 8192)}
    base = Calibration(model="m", gpu="NVIDIA H100 80GB HBM3", decode_ms={1: 20.0}, prefill_ms=singles,
                       copy_gbps=None, source="test")
    old = ShardClock(base, 1)
    multi = tuple((k, n, truth([n] * k)) for k, n in ((2, 4096), (4, 2048), (8, 1024)))
    new = ShardClock(dataclasses.replace(base, prefill_multi_ms=multi), 1)
    chunks = ([4096] * 2, [2048] * 4, [1024] * 8)
    for t in singles:
        assert old.prefill_ms([(t, 0)]) == pytest.approx(singles[t])
    assert old.prefill_ms([(1024, 0)] * 8) < 0.97 * truth([1024] * 8)  # cheap where the prompts are short
    for parts in (*chunks, [8192], [4096], [2048]):
        assert new.prefill_ms([(n, 0) for n in parts]) == pytest.approx(truth(parts), rel=0.01)
    assert Calibration.from_json(new.cal.to_json()).prefill_multi_ms == multi


def test_a_tp_group_reserves_memory_before_the_model_loads():
    """SGLang's 'avail mem' before loading on H100: 78.50 GiB at TP1, 77.59 at TP2, 77.36-77.41 at TP4 (its NCCL
    communicators and custom all-reduce buffers): the planner's KV for TP4 of Llama-3.1-70B was 3.3 % over SGLang's."""
    from sgl_sidp.calibration.memory import GIB
    from sgl_sidp.plan.steps import free_before_load_bytes

    assert free_before_load_bytes("H100", 1) == int(78.50 * GIB)
    assert free_before_load_bytes("H100", 2) == int(77.59 * GIB)
    assert free_before_load_bytes("H100", 4) == free_before_load_bytes("H100", 8) == int(77.38 * GIB)
    assert free_before_load_bytes("H200", 4) == int(137.99 * GIB)


def test_a_configuration_sglang_does_not_start_is_neither_predicted_nor_picked():
    """SGLang 0.5.17's DP attention fails to start on Llama (measured on 2 x H200 and 4 x H100): the planner says so
    in the row and ranks it nowhere, so neither `--overlay-mode auto` nor a predicted-ratio line names it."""
    from sgl_sidp.plan.planner import plan

    llama = Path(__file__).resolve().parents[2] / "shared" / "models" / "Llama-3.1-70B"
    if not (llama / "config.json").is_file():
        pytest.skip(f"{llama} missing (../shared/models)")
    out = plan(str(llama), 2, "H200", "offline:512:2048:256")
    row = next(r for r in out["configurations"] if r.name == "dp2_attn")
    assert not row.predicted and "does not start DP attention on LlamaForCausalLM" in row.not_predicted
    assert out["winner"] != "dp2_attn" and "dp2_attn" not in out["reason"]


def test_dp_attention_prefills_chunks_of_its_dp_share_and_counts_another_ranks_tokens_at_its_ffn_share():
    """SGLang halves the prefill chunk at DP2 under DP attention (4,096 tokens: its log on 2 x H100), and a DP
    attention shard runs the whole attention and 1/n of the FFN, so another rank's token costs it only that FFN share:
    Qwen3-30B-A3B's top-8 of 768-wide experts halved against its attention, 0.5; Qwen3-8B's dense MLP halved, 0.64."""
    from sgl_sidp.calibration.memory import ModelShapes
    from sgl_sidp.model_info import read_hf_config
    from sgl_sidp.plan.configs import configuration_named
    from sgl_sidp.plan.planner import replica_limits

    assert replica_limits(configuration_named("dp2_attn"), 1000).chunked_prefill == 4096
    assert replica_limits(configuration_named("dp4_attn"), 1000).chunked_prefill == 2048
    assert replica_limits(configuration_named("dp2"), 1000).chunked_prefill == 8192
    models = Path(__file__).resolve().parents[2] / "shared" / "models"
    if not (models / "Qwen3-30B-A3B" / "config.json").is_file():
        pytest.skip(f"{models} missing (../shared/models)")

    class Shard:  # the two attributes `gathered_ffn_share` reads
        def __init__(self, name):
            self.shapes = ModelShapes.of(read_hf_config(str(models / name)))
            self.ffn_share = -1.0  # not used where the config names its experts per token or its MLP

    share = StepModel.gathered_ffn_share
    moe = Shard("Qwen3-30B-A3B")
    assert moe.shapes.experts_per_token == 8 and share(moe, 2) == pytest.approx(0.5)
    assert share(Shard("Qwen3-8B"), 2) == pytest.approx(0.643, abs=1e-3)


def test_shift_named_with_a_threshold_runs_at_it_and_is_simulated_apart():
    """`shift_spS_tpT_thN` is predicted at threshold N (a server's own, as `bench.validate` names it), in a simulation
    of its own (configurations share one only where their decisions match); `_exact`'s cost is not modelled."""
    from sgl_sidp.plan.planner import plan

    qwen = Path(__file__).resolve().parents[2] / "shared" / "models" / "Qwen3-8B"
    if not (qwen / "config.json").is_file():
        pytest.skip(f"{qwen} missing (../shared/models)")
    r = plan(str(qwen), 2, "H200", "offline:256:512:128",
             names=["shift_sp2_tp1_th1", "shift_sp2_tp1_th100000", "shift_sp2_tp1_exact"])
    rows = {x.name: x for x in r["configurations"]}
    assert rows["shift_sp2_tp1"].decisions["shift_threshold"] not in (1, 100000)
    assert rows["shift_sp2_tp1_th1"].decisions["shift_threshold"] == 1.0
    summary = ("total_tok_s", "tpot_ms_p50")  # decodes in base, and all in TP: neither the planner's schedule
    th1, th_inf, own = ([getattr(rows[n], k) for k in summary] for n in
                        ("shift_sp2_tp1_th1", "shift_sp2_tp1_th100000", "shift_sp2_tp1"))
    assert len({tuple(th1), tuple(th_inf), tuple(own)}) == 3
    assert rows["shift_sp2_tp1_exact"].not_predicted == "the planner does not model option 'exact' of shift"


def test_dp_attention_with_ep_is_priced_as_dp_attention_on_moe_and_refused_on_dense():
    """`dpN_attn_ep` (--ep-size N): the same FLOPs and weight bytes per GPU as the FFN split N ways, so the same
    prediction as `dpN_attn` on an MoE model (measured 0.91x and 1.05x of it on 2 x H200); a dense model has no
    experts to place, so the planner names that instead of a number."""
    from sgl_sidp.plan.planner import plan

    models = Path(__file__).resolve().parents[2] / "shared" / "models"
    if not (models / "Qwen3-30B-A3B" / "config.json").is_file():
        pytest.skip(f"{models} missing (../shared/models)")
    r = plan(str(models / "Qwen3-30B-A3B"), 2, "H200", "offline:64:2048:32", names=["dp2_attn_ep"])
    rows = {x.name: x for x in r["configurations"]}
    assert rows["dp2_attn_ep"].not_predicted is None
    assert rows["dp2_attn_ep"].total_tok_s == rows["dp2_attn"].total_tok_s > 0
    dense = plan(str(models / "Qwen3-8B"), 2, "H200", "offline:64:2048:32", names=["dp2_attn_ep"])
    assert {x.name: x for x in dense["configurations"]}["dp2_attn_ep"].not_predicted == \
        "expert parallelism needs an MoE model"


def test_shift_base_prefills_cost_what_busy_servers_took_beyond_their_calibrated_price():
    """`shift.planner.SERVED_BASE_PREFILL`: the base shard's clock (and only its, only at SP > 1) scales its per-token
    prefill terms by the GPU kind's factor; decode steps and other techniques' shards are priced as before."""
    from sgl_sidp.plan.configs import configuration_named
    from sgl_sidp.shift.planner import SERVED_BASE_PREFILL, TECHNIQUE

    shift, tp2 = configuration_named("shift_sp2_tp1"), configuration_named("tp2")
    assert SERVED_BASE_PREFILL == {"H100": 1.05, "H200": 1.03}
    for gpu, f in SERVED_BASE_PREFILL.items():
        assert TECHNIQUE.served_prefill_factor(shift, "base", gpu) == f
        assert TECHNIQUE.served_prefill_factor(shift, "shift", gpu) == 1.0
        assert tp2.kind.served_prefill_factor(tp2, "forward", gpu) == 1.0
    assert TECHNIQUE.served_prefill_factor(configuration_named("shift_sp1_tp2"), "base", "H200") == 1.0
    plain, served = clock(0.9), ShardClock(clock(0.9).cal, clock(0.9).kv_bytes_per_token, served_prefill=1.05)
    c, a, b = plain.prefill_fit
    assert served.prefill_ms([(8192, 0)]) - plain.prefill_ms([(8192, 0)]) == pytest.approx(
        0.05 * (plain.prefill_ms([(8192, 0)]) - c), rel=1e-6)
    assert served.decode_ms(64, 1024) == plain.decode_ms(64, 1024)
