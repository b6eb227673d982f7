"""Config validation: every rejected combination gets its own clear line, before any GPU work."""

import argparse
import json
from types import SimpleNamespace

import pytest

from sgl_sidp.config import ENV_VAR, SidpConfig, SidpConfigError, SidpMode
from sgl_sidp.model_info import model_is_moe

MODELS = __import__("pathlib").Path(__file__).resolve().parents[2] / "shared" / "models"


@pytest.fixture
def moe_dir(tmp_path):
    d = tmp_path / "moe"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128}))
    return str(d)


@pytest.fixture
def dense_dir(tmp_path):
    d = tmp_path / "dense"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    return str(d)


def args(model, dp=1, tp=1):
    return SimpleNamespace(model_path=model, dp_size=dp, tp_size=tp, base_gpu_id=0, gpu_id_step=1)


def parse(*argv):
    p = argparse.ArgumentParser()
    SidpConfig.add_cli_args(p)
    return SidpConfig.from_cli_args(p.parse_args(list(argv)))


def problems(cfg, server_args):
    with pytest.raises(SidpConfigError) as e:
        cfg.validate_against(server_args)
    return e.value.problems


def test_defaults_are_off_and_inactive():
    cfg = parse()
    assert cfg.mode == SidpMode.OFF and not cfg.batch_signal and cfg.signal_log_interval == 40
    assert not cfg.active and not cfg.signal_enabled


def test_batch_signal_flag_activates_observer_only():
    cfg = parse("--overlay-batch-signal", "--overlay-signal-log-interval", "5")
    assert cfg.active and cfg.signal_enabled and cfg.mode == SidpMode.OFF and cfg.signal_log_interval == 5


def test_calibrate_flag_turns_the_overlay_on_in_any_mode():
    cfg = parse("--overlay-calibrate")
    assert cfg.calibrate and cfg.active and cfg.mode == SidpMode.OFF
    assert parse("--overlay-calibrate", "--overlay-mode", "zerodp").calibrate


def test_off_accepts_any_sglang_args(dense_dir):
    parse().validate_against(args(dense_dir, dp=8, tp=8))


def test_env_round_trip():
    cfg = parse("--overlay-batch-signal", "--overlay-signal-log-interval", "7")
    env = cfg.to_env({})
    assert json.loads(env[ENV_VAR])["signal_log_interval"] == 7
    assert SidpConfig.from_env(env) == cfg
    assert SidpConfig.from_env({}) == SidpConfig()


def test_rejects_garbage_in_env():
    with pytest.raises(SidpConfigError, match="not JSON"):
        SidpConfig.from_env({ENV_VAR: "{nope"})
    with pytest.raises(SidpConfigError, match="--overlay-bogus: Extra inputs are not permitted"):
        SidpConfig.from_env({ENV_VAR: json.dumps({"bogus": 1})})


def test_rejects_nonpositive_log_interval():
    with pytest.raises(SidpConfigError) as e:
        parse("--overlay-signal-log-interval", "0")
    assert e.value.problems == ["--overlay-signal-log-interval: Input should be greater than or equal to 1"]


def test_rejects_unknown_mode_at_parse():
    p = argparse.ArgumentParser()
    SidpConfig.add_cli_args(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--overlay-mode", "turbo"])


def qwen3(tmp_path, heads=64, kv=8, **extra):
    d = tmp_path / f"qwen3_{heads}_{kv}_{len(extra)}"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "num_attention_heads": heads,
                                               "num_key_value_heads": kv, **extra}))
    return str(d)


def test_shift_accepts_a_dense_qwen3_on_enough_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    parse("--overlay-mode", "shift").validate_against(args(qwen3(tmp_path), tp=2))
    parse("--overlay-mode", "shift", "--shift-sp", "1").validate_against(args(qwen3(tmp_path), tp=1))


def test_shift_reports_every_problem_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    raw = args(qwen3(tmp_path, heads=40, kv=8, quantization_config={"quant_method": "fp8"}), dp=2, tp=4)
    raw.quantization, raw.enable_dp_attention, raw.is_embedding = "fp8", True, True
    ps = problems(parse("--overlay-mode", "shift", "--shift-sp", "3"), raw)
    assert ps[:2] == ["--shift-sp 3 does not divide --tp-size 4",
                      "--overlay-mode shift with --tp-size 4 needs GPU 3, but 2 GPU(s) are visible"]
    assert any("bf16/fp16 weights only" in x for x in ps) and any("--dp-size > 1" in x for x in ps)
    assert any("--enable-dp-attention" in x for x in ps) and any("--quantization" in x for x in ps)
    assert any("--is-embedding" in x for x in ps)
    ps = problems(parse("--overlay-mode", "shift"), args(qwen3(tmp_path, heads=40, kv=8), tp=2 * 3))
    assert any("40 attention heads do not split over SP*TP = 6" in x for x in ps)
    ps = problems(parse("--overlay-mode", "shift", "--shift-all-to-all", "overlap", "--shift-exact"),
                  args(qwen3(tmp_path), tp=2))
    assert ps == ["--shift-all-to-all overlap does not combine with --shift-exact (whose row-parallel layers sum every "
                  "TP rank's partial in rank order after NCCL's all-to-all); drop one of them"]
    ps = problems(parse("--overlay-mode", "shift"), args(dense_moe(tmp_path), tp=1))
    assert ps == [f"--overlay-mode shift is for dense models; {dense_moe(tmp_path)} is MoE"]


def dense_moe(tmp_path):
    d = tmp_path / "moe"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8}))
    return str(d)


def test_shift_keeps_breakable_prefill_graphs_and_refuses_the_others(tmp_path, monkeypatch):
    """Shift changes one SGLang default, its largest decode graph (`shift.feature.sglang_defaults`); SGLang's own
    parser reads the prefill backend (JSON over the per-phase flag over the legacy aliases) and the full /
    tc_piecewise backends are refused."""
    from sgl_sidp import launch_server as ls
    from sgl_sidp.features import FEATURES
    from sgl_sidp.shift.feature import prefill_graph_backend

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert FEATURES["shift"].sglang_defaults(["--tp-size", "2"]) == ["--tp-size", "2", "--cuda-graph-max-bs-decode", "512"]
    assert FEATURES["shift"].sglang_defaults(["--cuda-graph-config", "{}"]) == ["--cuda-graph-config", "{}"]
    model = ["--model-path", qwen3(tmp_path), "--tp-size", "2"]
    cases = {(): None, ("--disable-prefill-cuda-graph",): None, ("--cuda-graph-backend-prefill", "breakable"): "breakable",
             ("--enforce-piecewise-cuda-graph",): "tc_piecewise", ("--cuda-graph-backend-prefill", "full"): "full",
             ("--cuda-graph-config", '{"prefill": {"backend": "tc_piecewise"}}',
              "--cuda-graph-backend-prefill", "breakable"): "tc_piecewise"}
    for flags, backend in cases.items():
        raw = ls.sglang_raw_args([*model, *flags])
        assert prefill_graph_backend(raw) == backend, flags
        if backend in (None, "breakable"):
            parse("--overlay-mode", "shift").validate_against(raw)
        else:
            assert problems(parse("--overlay-mode", "shift"), raw) == [
                f"--overlay-mode shift runs SGLang's breakable prefill CUDA graphs (the default) or none, not '{backend}' "
                + ("(it slices the captured body's rows to the batch's tokens, which in the base configuration are "
                   "this SP rank's share)" if backend == "full" else "(it compiles the forward with torch.compile, "
                   "which would trace the per-forward choice of configuration)")]


def test_features_are_registered_in_one_table():
    """Each registered feature's settings become `SidpConfig.<name>` and its flags `--<name>-<field>`."""
    from sgl_sidp.features import FEATURES

    assert set(FEATURES) == {"zerodp", "sidp", "shift"} and FEATURES["zerodp"].name == "zerodp"
    p = argparse.ArgumentParser()
    SidpConfig.add_cli_args(p)
    flags = {a for action in p._actions for a in action.option_strings}
    for name, feature in FEATURES.items():
        assert isinstance(getattr(SidpConfig(), name), feature.settings)
        for field in feature.settings.model_fields:
            assert f"--{name}-{field.replace('_', '-')}" in flags
    assert parse("--overlay-mode", "zerodp").feature is FEATURES["zerodp"] and parse().feature is None


def test_flag_names_one_prefix_each_and_every_old_spelling_maps_to_one():
    """The core's flags are --overlay-*, a technique's --<its name>-*; `RENAMED` maps each old --sidp-* spelling to one
    of them, all of them covered (its table in docs/flags.md is for results recorded with the old ones)."""
    from sgl_sidp.config import RENAMED, renamed_flags
    from sgl_sidp.features import FEATURES

    p = argparse.ArgumentParser()
    flags = [a.option_strings[0] for a in SidpConfig.add_cli_args(p)._group_actions]
    assert all(f.split("-")[2] in {"overlay", *FEATURES} and f.count("sidp") <= 1 for f in flags), flags
    newer = {"--overlay-start-after", "--shift-exact", "--shift-all-to-all", "--overlay-plan-slo-ttft-ms",
             "--overlay-plan-slo-tpot-ms", "--sidp-b-th-measure"}
    # (added after the rename: no old spelling)
    assert sorted(RENAMED.values()) == sorted(set(flags) - newer) and not set(RENAMED) & set(flags)
    argv = ["--sidp-sidp-force", "cas", "--dp-size", "2", "--sidp-mode=sidp", "--sidp-service", "was"]
    assert renamed_flags(argv) == ["--sidp-sidp-force was renamed --sidp-service", "--sidp-mode was renamed --overlay-mode"]
    doc = (__import__("pathlib").Path(__file__).resolve().parents[1] / "docs" / "flags.md").read_text()
    assert all(f"| `{old}` | `{new}` |" in doc for old, new in RENAMED.items())
    assert all(f"| `{flag}" in doc for flag in flags)  # each flag has its row


def test_enumerated_flags_show_their_choices():
    p = argparse.ArgumentParser()
    group = SidpConfig.add_cli_args(p)
    assert {a.option_strings[0]: a.choices for a in group._group_actions if a.choices} == {
        "--overlay-mode": ["off", "zerodp", "sidp", "shift", "auto"], "--sidp-service": ["was", "cas", "auto"],
        "--sidp-fetch-order": ["shifted", "forward"], "--shift-all-to-all": ["nccl", "overlap"]}
    assert "--sidp-service {was,cas,auto}" in p.format_help()
    with pytest.raises(SidpConfigError, match=r"^--sidp-service: Input should be 'was', 'cas' or 'auto'$"):
        SidpConfig.from_mapping({"sidp": {"service": "fast"}})  # $SIDP_CONFIG is checked the same way


def test_zerodp_passes_on_moe_model_with_dp(moe_dir):
    """ZeroDP is implemented: an MoE model with dp >= 2 validates (also with tp > 1 and a hub id)."""
    parse("--overlay-mode", "zerodp").validate_against(args(moe_dir, dp=2))
    parse("--overlay-mode", "zerodp").validate_against(args(moe_dir, dp=4, tp=2))
    parse("--overlay-mode", "zerodp").validate_against(args("Qwen/Qwen3-30B-A3B", dp=2))  # unknown: left to later


@pytest.mark.parametrize(
    "extra, line",
    [
        ({"pp_size": 2}, "--overlay-mode zerodp needs --pp-size 1 (each replica holds all its layers), got 2"),
        ({"enable_dp_attention": True}, "--overlay-mode zerodp pairs independent DP replicas; it does not work with --enable-dp-attention"),
        ({"dwdp_size": 2}, "--overlay-mode zerodp and --dwdp-size both move expert weights; use one of them"),
        ({"offload_mode": "sharded_gpu"}, "--overlay-mode zerodp does not combine with SGLang's weight offloading (--offload-mode/--cpu-offload-gb)"),
        ({"cpu_offload_gb": 8}, "--overlay-mode zerodp does not combine with SGLang's weight offloading (--offload-mode/--cpu-offload-gb)"),
        ({"moe_a2a_backend": "deepep"}, "--overlay-mode zerodp needs --moe-a2a-backend none, got deepep: SGLang's all-to-all "
         "MoE layers (DeepEPMoE) run their experts outside FusedMoE.run_moe_core, where a sink waits for its pulled weights"),
        ({"enable_two_batch_overlap": True}, "--overlay-mode zerodp does not work with --enable-two-batch-overlap: "
         "micro-batches run each MoE layer twice per forward, and a sink's slot ring fetches each offloaded layer once "
         "(SGLang's DWDP refuses it too)"),
        ({"enable_single_batch_overlap": True}, "--overlay-mode zerodp does not work with --enable-single-batch-overlap: "
         "micro-batches run each MoE layer twice per forward, and a sink's slot ring fetches each offloaded layer once "
         "(SGLang's DWDP refuses it too)"),
    ],
    ids=["pp", "dp_attention", "dwdp", "sharded_gpu", "cpu_offload", "a2a", "tbo", "sbo"],
)
def test_rejects_zerodp_with_incompatible_sglang_flags(moe_dir, extra, line):
    """Each SGLang feature ZeroDP cannot combine with gets exactly its own line."""
    ps = problems(parse("--overlay-mode", "zerodp"), SimpleNamespace(**vars(args(moe_dir, dp=2)), **extra))
    assert ps == [line]
    for ok in ({"moe_a2a_backend": "none"}, {"enable_two_batch_overlap": False}):
        parse("--overlay-mode", "zerodp").validate_against(SimpleNamespace(**vars(args(moe_dir, dp=2)), **ok))


def test_zerodp_refuses_what_sglang_resolved_by_itself(moe_dir):
    """`zerodp.feature.resolve` checks SGLang's resolved settings: DeepSeek-V3 with --enable-prefill-cp gets DP attention
    and DeepEP from SGLang itself (`_deepseek_family_overrides`), which the raw flags did not show."""
    from sgl_sidp.features import FEATURES

    cfg = parse("--overlay-mode", "zerodp")
    resolved = dict(vars(args(moe_dir, dp=2)), enable_prefill_cp=True, pp_size=1, offload_mode="cpu", cpu_offload_gb=0,
                    dwdp_size=1, moe_a2a_backend="none", enable_dp_attention=False, enable_two_batch_overlap=False,
                    enable_single_batch_overlap=False)
    assert FEATURES["zerodp"].resolve(cfg, SimpleNamespace(**resolved)) == (cfg, [])
    resolved.update(enable_dp_attention=True, moe_a2a_backend="deepep")
    _, ps = FEATURES["zerodp"].resolve(cfg, SimpleNamespace(**resolved))
    assert ps == [f"--overlay-mode zerodp pairs independent DP replicas; it does not work with --enable-dp-attention "
                  f"(SGLang chose this for {moe_dir} itself)",
                  f"--overlay-mode zerodp needs --moe-a2a-backend none, got deepep: SGLang's all-to-all MoE layers "
                  "(DeepEPMoE) run their experts outside FusedMoE.run_moe_core, where a sink waits for its pulled "
                  f"weights (SGLang chose this for {moe_dir} itself)"]


def test_zerodp_flags_accept_good_values():
    """--zerodp-* take the documented forms."""
    for tensors in ("w13,w2", "w2,w13", "w13", "w2"):
        assert parse("--zerodp-tensors", tensors).zerodp.tensors == tensors
    for layers in ("auto", "all", "every:1", "every:12", "3", "3,7,11"):
        assert parse("--zerodp-layers", layers).zerodp.layers == layers
    for batch in ("decode:1", "decode:64", "prefill:8192", "kv:2048"):
        assert parse("--zerodp-expected-batch", batch).zerodp.expected_batch == batch
    cfg = parse("--zerodp-calibration", "/x/c.json", "--zerodp-source-timeout-s", "30")
    assert cfg.zerodp.calibration == "/x/c.json" and cfg.zerodp.source_timeout_s == 30.0
    d = parse().zerodp
    assert (d.tensors, d.layers, d.expected_batch) == ("w13,w2", "auto", "decode:1")
    assert SidpConfig.from_env(parse("--overlay-mode", "zerodp", "--zerodp-layers", "every:4").to_env({})).zerodp.layers == "every:4"


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--zerodp-tensors", "w14"),
        ("--zerodp-tensors", "w13,"),
        ("--zerodp-tensors", "w13,w2,w13"),
        ("--zerodp-tensors", "w13,w13"),
        ("--zerodp-layers", "3,7,3"),
        ("--zerodp-tensors", ""),
        ("--zerodp-layers", "every:0"),
        ("--zerodp-layers", "every:"),
        ("--zerodp-layers", "some"),
        ("--zerodp-layers", "3,,7"),
        ("--zerodp-layers", "-1"),
        ("--zerodp-expected-batch", "decode:x"),
        ("--zerodp-expected-batch", "decode:0"),
        ("--zerodp-expected-batch", "train:8"),
        ("--zerodp-expected-batch", "decode"),
        ("--zerodp-expected-batch", "kv:0"),
        ("--zerodp-source-timeout-s", "0"),
    ],
)
def test_zerodp_flags_reject_bad_values(flag, value):
    """A bad --zerodp-* value is one SidpConfigError line naming the flag."""
    with pytest.raises(SidpConfigError) as e:
        parse(flag, value)
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith(flag + ": "), e.value.problems


def test_zerodp_flag_patterns_agree_with_the_plan_parsers():
    """Every value the flags accept is one the runtime parsers accept too (no late failures)."""
    from sgl_sidp.calibration.table import ExpectedBatch
    from sgl_sidp.zerodp.policy import GROUPS, parse_layers

    moe = list(range(48))
    for layers in ("auto", "all", "every:1", "every:12", "3", "3,7,11"):
        parse_layers(parse("--zerodp-layers", layers).zerodp.layers, moe)
    for batch in ("decode:1", "prefill:8192", "kv:2048"):
        ExpectedBatch.parse(parse("--zerodp-expected-batch", batch).zerodp.expected_batch)
    for tensors in ("w13,w2", "w2", "w13"):
        assert set(parse("--zerodp-tensors", tensors).zerodp.tensors.split(",")) <= set(GROUPS)


def test_rejects_zerodp_without_dp(moe_dir):
    ps = problems(parse("--overlay-mode", "zerodp"), args(moe_dir, dp=1))
    assert any("needs --dp-size >= 2 (a source and at least one sink), got 1" in p for p in ps)


def test_rejects_zerodp_on_dense_model(dense_dir):
    ps = problems(parse("--overlay-mode", "zerodp"), args(dense_dir, dp=2))
    assert any("has no MoE layers" in p for p in ps)


def test_reports_every_problem_at_once(dense_dir, moe_dir):
    ps = problems(parse("--overlay-mode", "zerodp"), args(dense_dir, dp=1))
    assert len(ps) == 2  # dp + dense model
    ps = problems(parse("--overlay-mode", "sidp"), args(moe_dir, dp=1))
    assert len(ps) == 2  # dp + MoE model


# --------------------------------------------------------------------------- sidp
def dense(tmp_path, arch="Qwen3ForCausalLM", layers=64):
    d = tmp_path / f"{arch}-{layers}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": [arch], "num_hidden_layers": layers}))
    return str(d)


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"])
def test_sidp_passes_on_supported_dense_models(tmp_path, arch):
    parse("--overlay-mode", "sidp").validate_against(args(dense(tmp_path, arch), dp=2))
    eight = dense(tmp_path, arch, 8)
    parse("--overlay-mode", "sidp", "--sidp-slots", "3").validate_against(args(eight, dp=8, tp=2))
    parse("--overlay-mode", "sidp", "--sidp-service", "cas").validate_against(args(eight, dp=2))
    parse("--overlay-mode", "sidp", "--sidp-service", "auto", "--sidp-b-th", "64").validate_against(args(eight, dp=2))


def test_sidp_reports_every_problem_at_once(tmp_path):
    """CaS with speculative decoding, an unsupported architecture, too few layers for the ranks, DP attention, PP,
    TBO."""
    raw = args(dense(tmp_path, "GemmaForCausalLM", 3), dp=4)
    raw.enable_dp_attention, raw.pp_size, raw.enable_two_batch_overlap = True, 2, True
    raw.speculative_algorithm = "EAGLE"
    ps = problems(parse("--overlay-mode", "sidp", "--sidp-service", "cas"), raw)
    assert [p.split(":")[0].split(" ")[0:2] for p in ps] == [["--sidp-service", "cas"]] + [["--overlay-mode", "sidp"]] * 5
    assert "speculative decoding" in ps[0] and "GemmaForCausalLM" in ps[1] and "3 layers cannot give each of 4" in ps[2]
    assert "--pp-size 1" in ps[3] and "--enable-dp-attention" in ps[4] and "two/single-batch overlap" in ps[5]


def test_sidp_rejects_moe_and_a_single_rank(tmp_path, moe_dir):
    ps = problems(parse("--overlay-mode", "sidp"), args(moe_dir, dp=1))
    assert "needs --dp-size >= 2, got 1" in ps[0] and "is MoE (use --overlay-mode zerodp)" in ps[1]


def test_sidp_rejects_ranks_that_cannot_read_each_other(tmp_path, monkeypatch):
    """Every rank reads every other rank's layers: each ordered pair of same-TP-rank GPUs is checked."""
    from sgl_sidp.peer import topology

    seen = []
    monkeypatch.setattr(topology, "_nvml_p2p_read", lambda visible: lambda a, b: seen.append((a, b)) or (a, b) != (1, 0))
    ps = problems(parse("--overlay-mode", "sidp"), args(dense(tmp_path), dp=2))
    assert sorted(seen) == [(0, 1), (1, 0)] and len(ps) == 1 and "a rank cannot read an owner" in ps[0]


@pytest.mark.skipif(not MODELS.is_dir(), reason=f"{MODELS} not found (the shared model configs)")
def test_model_is_moe_on_shared_configs():
    assert model_is_moe(str(MODELS / "Qwen3-30B-A3B")) is True
    assert model_is_moe(str(MODELS / "Qwen3-32B")) is False
    assert model_is_moe(str(MODELS / "Llama-3.1-70B")) is False
    assert model_is_moe("Qwen/not-a-local-folder") is None


def test_fold_gpus_flag_turns_the_overlay_on():
    cfg = parse("--overlay-fold-gpus")
    assert cfg.fold_gpus and cfg.active and cfg.mode == SidpMode.OFF


def test_sidp_cas_graphs_needs_cas_graphs_and_one_gpu_per_rank(tmp_path):
    """--sidp-cas-graphs: refused with WaS only, without CUDA graphs, and on replicas folded onto one GPU (NCCL);
    accepted with cas or auto."""
    raw = args(dense(tmp_path, "Qwen3ForCausalLM"), dp=2)
    parse("--overlay-mode", "sidp", "--sidp-service", "cas", "--sidp-cas-graphs").validate_against(raw)
    raw.disable_cuda_graph = True
    ps = problems(parse("--overlay-mode", "sidp", "--sidp-service", "was", "--sidp-cas-graphs", "--overlay-fold-gpus"),
                  raw)
    assert [p.split(":")[0] for p in ps[:3]] == ["--sidp-cas-graphs is unused here",
                                                 "--sidp-cas-graphs captures decode CUDA graphs",
                                                 "--sidp-cas-graphs moves CaS rows over NCCL, which refuses two ranks on one GPU"]


def test_sidp_cas_graphs_default_on_where_they_can_run(tmp_path):
    """Not given: CaS decodes in graphs with cas and auto wherever SGLang captures decode graphs on one GPU per rank,
    eager (and said so, not refused) without graphs or with folded replicas; --no-sidp-cas-graphs: eager."""
    from sgl_sidp.sidp.feature import describe
    from sgl_sidp.sidp.settings import cas_graphs_on

    raw = args(dense(tmp_path, "Qwen3ForCausalLM"), dp=2)
    cfg = parse("--overlay-mode", "sidp", "--sidp-service", "auto", "--sidp-b-th", "64")
    assert cfg.sidp.cas_graphs is None and cas_graphs_on(cfg.sidp, False, False)
    assert not cas_graphs_on(cfg.sidp, True, False) and not cas_graphs_on(cfg.sidp, False, True)
    assert "CaS decodes in CUDA graphs" in describe(cfg, SimpleNamespace(dp_size=2, disable_cuda_graph=False))
    assert "CaS decodes eager (no decode graphs here" in describe(cfg, SimpleNamespace(dp_size=2, disable_cuda_graph=True))
    raw.disable_cuda_graph = True
    cfg.validate_against(raw)  # the default falls back, never refuses
    off = parse("--overlay-mode", "sidp", "--sidp-service", "cas", "--no-sidp-cas-graphs")
    assert off.sidp.cas_graphs is False and not cas_graphs_on(off.sidp, False, False)
    assert not cas_graphs_on(parse("--overlay-mode", "sidp", "--sidp-service", "was").sidp, False, False)  # none


def test_sidp_b_th_measure_needs_auto_cas_graphs_and_no_given_b_th(tmp_path):
    """--sidp-b-th-measure: refused where no CaS decode graphs are captured and beside --sidp-b-th (both set B_th),
    unused outside auto; the launcher leaves B_th to the ranks (no planner at launch) and says so. Not given: measured
    wherever the CaS decode graphs run and --sidp-b-th is not given (auto, the default service)."""
    from sgl_sidp.features import FEATURES
    from sgl_sidp.sidp.feature import describe
    from sgl_sidp.sidp.settings import b_th_measured

    default = parse("--overlay-mode", "sidp").sidp
    assert default.service == "auto" and default.b_th_measure is None and b_th_measured(default, False, False)
    assert not b_th_measured(default, True, False) and not b_th_measured(default, False, True)  # no graphs
    assert not b_th_measured(parse("--overlay-mode", "sidp", "--sidp-b-th", "64").sidp, False, False)
    assert not b_th_measured(parse("--overlay-mode", "sidp", "--no-sidp-b-th-measure").sidp, False, False)

    raw = args(dense(tmp_path, "Qwen3ForCausalLM"), dp=2)
    cfg = parse("--overlay-mode", "sidp", "--sidp-service", "auto", "--sidp-b-th-measure")
    cfg.validate_against(raw)
    assert FEATURES["sidp"].resolve(cfg, SimpleNamespace(model_path="/nowhere", dp_size=2, tp_size=1)) == (cfg, [])
    assert "B_th measured at start-up" in describe(cfg, SimpleNamespace(dp_size=2, disable_cuda_graph=False))
    raw.disable_cuda_graph = True
    ps = problems(parse("--overlay-mode", "sidp", "--sidp-service", "auto", "--sidp-b-th-measure", "--sidp-b-th",
                        "64"), raw)
    assert ps == ["--sidp-b-th 64 and --sidp-b-th-measure both set B_th: pass one",
                  "--sidp-b-th-measure times the CaS decode graphs, which this server does not capture "
                  "(--disable-cuda-graph, --overlay-fold-gpus or --no-sidp-cas-graphs): drop it, or pass "
                  "--sidp-b-th TOKENS"]
    raw.disable_cuda_graph = False
    assert problems(parse("--overlay-mode", "sidp", "--sidp-service", "was", "--sidp-b-th-measure"), raw)[0].startswith(
        "--sidp-b-th-measure is unused here")


def test_sidp_auto_without_b_th_gets_the_planners_at_launch(monkeypatch):
    """`sidp.feature.resolve`, before any GPU memory: auto without --sidp-b-th, where the ranks do not measure it
    (--no-sidp-b-th-measure, or no CaS decode graphs), runs at the B_th the planner predicts for this model, GPU kind
    and DP x TP; a GPU kind without tables is one line naming what to pass or run; a given B_th, a measured one and
    the other services are left alone."""
    import sgl_sidp.peer.topology as topology
    from sgl_sidp.features import FEATURES
    from sgl_sidp.plan.planner import plan

    qwen = MODELS / "Qwen3-32B"
    if not (qwen / "config.json").is_file():
        pytest.skip(f"{qwen} missing (../shared/models)")
    resolve = FEATURES["sidp"].resolve
    sa = SimpleNamespace(model_path=str(qwen), dp_size=2, tp_size=1, base_gpu_id=0)
    monkeypatch.setattr(topology, "gpu_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    measured = parse("--overlay-mode", "sidp", "--sidp-service", "auto")
    assert resolve(measured, sa) == (measured, [])  # the ranks measure it: no planner at launch
    cfg = parse("--overlay-mode", "sidp", "--sidp-service", "auto", "--no-sidp-b-th-measure")
    planned = next(r for r in plan(str(qwen), 2, "H100", cfg.plan_workload)["configurations"]
                   if r.name == "sidp_dp2_auto").decisions["b_th"]
    got, problems = resolve(cfg, sa)
    assert problems == [] and got.sidp.b_th == planned > 0 and got.sidp.service == "auto"
    for given in (parse("--overlay-mode", "sidp", "--sidp-service", "auto", "--sidp-b-th", "64"),
                  parse("--overlay-mode", "sidp", "--sidp-service", "cas")):
        assert resolve(given, sa) == (given, [])
    monkeypatch.setattr(topology, "gpu_name", lambda i=0: "NVIDIA A100-SXM4-80GB")
    _, problems = resolve(cfg, sa)
    assert len(problems) == 1 and problems[0].startswith("--sidp-service auto (the default) needs B_th, which this "
                                                         "server cannot measure at start-up (no CaS decode graphs) "
                                                         "and the planner cannot predict here (the planner knows GPU "
                                                         "kinds")
    assert "--sidp-service was" in problems[0]
    assert "pass --sidp-b-th TOKENS" in problems[0] and f"plan calibrate --model-path {qwen} --gpus 2" in problems[0]


# --------------------------------------------------------------------------- values reach every process intact
#: every flag of ours with values the launcher accepts, edge values included (floats in exponent form, big ints)
ACCEPTED = {
    "--overlay-signal-log-interval": ["1", "1000000"],
    "--overlay-plan-workload": ["offline:512:2048:256", "trace:/a b/c.csv:2"],
    "--overlay-plan-slo-ttft-ms": ["1e3", "2000"],
    "--overlay-plan-slo-tpot-ms": ["80", "0.5"],
    "--overlay-start-after": ["/tmp/a gate"],  # its folder must exist
    "--zerodp-layers": ["all", "every:3", "0,5,47"],
    "--zerodp-tensors": ["w2,w13"],
    "--zerodp-expected-batch": ["kv:131072"],
    "--zerodp-calibration": ["/a b/c.json"],
    "--zerodp-source-timeout-s": ["1e-3", "86400", "0.25"],
    "--sidp-b-th": ["0", "1e3", "63.5"],
    "--sidp-hysteresis": ["0", "0.999"],
    "--sidp-slots": ["0", "16"],
    "--sidp-service": ["cas"],
    "--sidp-fetch-order": ["forward"],
    "--sidp-owner-timeout-s": ["1e-3", "1e6"],
    "--shift-sp": ["0", "8"],
    "--shift-threshold": ["0", "1048576"],
    "--shift-all-to-all": ["overlap"],
}


def test_every_flag_is_covered_by_the_round_trip_cases():
    p = argparse.ArgumentParser()
    group = SidpConfig.add_cli_args(p)
    valued = {a.option_strings[0] for a in group._group_actions if a.nargs != 0 and a.option_strings[0] != "--overlay-mode"}
    assert valued == set(ACCEPTED), valued ^ set(ACCEPTED)


@pytest.mark.parametrize("flag, value", [(f, v) for f, vs in ACCEPTED.items() for v in vs])
def test_accepted_values_reach_child_processes_intact(flag, value):
    """What the launcher accepts is what every SGLang process reads back from $SIDP_CONFIG, to the last bit."""
    cfg = parse(flag, value)
    back = SidpConfig.from_env(cfg.to_env({}))
    assert back.model_dump() == cfg.model_dump()


@pytest.mark.parametrize("switch", ["--sidp-cas-graphs", "--no-sidp-cas-graphs", "--overlay-fold-gpus",
                                    "--overlay-batch-signal"])
def test_switches_reach_child_processes_intact(switch):
    """On, off (`--no-x` of a three-way switch) and not given stay apart in every SGLang process."""
    cfg = parse(switch)
    back = SidpConfig.from_env(cfg.to_env({}))
    assert back.model_dump() == cfg.model_dump() and back.model_dump() != parse().model_dump()


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity", "1e999"])
@pytest.mark.parametrize("flag", ["--sidp-b-th", "--sidp-owner-timeout-s", "--sidp-hysteresis",
                                  "--zerodp-source-timeout-s"])
def test_non_finite_numbers_are_refused_at_launch(flag, value):
    """JSON has no inf or nan: such a value used to reach the plugin as null and fail there, after SGLang started."""
    with pytest.raises(SidpConfigError) as e:
        parse(f"{flag}={value}")
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith(flag + ": "), e.value.problems


def moe_model(tmp_path, **extra):
    d = tmp_path / "moe_layers"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"], "num_local_experts": 8,
                                               "num_hidden_layers": 4, **extra}))
    return str(d)


def test_zerodp_layers_must_exist_in_the_model(tmp_path):
    model = moe_model(tmp_path)
    parse("--overlay-mode", "zerodp", "--zerodp-layers", "0,3").validate_against(args(model, dp=2))
    ps = problems(parse("--overlay-mode", "zerodp", "--zerodp-layers", "1,4,9"), args(model, dp=2))
    assert ps == ["--zerodp-layers names layers the model has no MoE experts in: [4, 9] (its MoE layers: 0-3)"]
    ps = problems(parse("--overlay-mode", "zerodp", "--zerodp-layers", "every:5"), args(model, dp=2))
    assert ps == ["--zerodp-layers every:5 offloads nothing: the model has 4 MoE layers"]
    deepseek = moe_model(tmp_path, first_k_dense_replace=1, n_routed_experts=8, num_local_experts=None)
    ps = problems(parse("--overlay-mode", "zerodp", "--zerodp-layers", "0,2"), args(deepseek, dp=2))
    assert ps == ["--zerodp-layers names layers the model has no MoE experts in: [0] (its MoE layers: 1-3)"]


def test_flags_of_another_mode_or_an_unused_sub_mode_are_refused(tmp_path, dense_dir):
    """Flags that the chosen settings would silently leave unused, each one line."""
    model = moe_model(tmp_path)
    ps = problems(parse("--overlay-mode", "zerodp", "--sidp-service", "cas", "--shift-sp", "2",
                        "--zerodp-layers", "all", "--zerodp-expected-batch", "decode:8"), args(model, dp=2))
    assert ps == ["--zerodp-expected-batch is unused here: it applies with --zerodp-layers auto",
                  "--sidp-service is a flag of --overlay-mode sidp, but the mode is zerodp",
                  "--shift-sp is a flag of --overlay-mode shift, but the mode is zerodp"]
    ps = problems(parse("--zerodp-layers", "all", "--overlay-signal-log-interval", "5"), args(model))
    assert ps == ["--overlay-signal-log-interval is unused with the overlay off: add --overlay-batch-signal or an --overlay-mode",
                  "--zerodp-layers is a flag of --overlay-mode zerodp, but the mode is off"]
    d = dense(tmp_path, "Qwen3ForCausalLM", 8)
    ps = problems(parse("--overlay-mode", "sidp", "--sidp-service", "was", "--sidp-b-th", "64", "--sidp-hysteresis",
                        "0.1"), args(d, dp=2))
    assert ps == ["--sidp-b-th is unused here: it applies with --sidp-service auto",
                  "--sidp-hysteresis is unused here: it applies with --sidp-service auto"]
    parse("--overlay-mode", "sidp", "--sidp-service", "auto", "--sidp-b-th", "64").validate_against(args(d, dp=2))


def test_the_planners_slos_go_together_and_are_refused_alone_or_with_the_overlay_off():
    cfg = parse("--overlay-mode", "auto", "--overlay-plan-slo-ttft-ms", "2000", "--overlay-plan-slo-tpot-ms", "80")
    assert cfg.plan_slo == (2000.0, 80.0) and cfg.unused_flags() == []
    assert parse("--overlay-mode", "shift").plan_slo is None
    assert parse("--overlay-mode", "shift", "--overlay-plan-slo-ttft-ms", "2000").unused_flags() == [
        "--overlay-plan-slo-ttft-ms and --overlay-plan-slo-tpot-ms go together: give both or neither"]
    assert "--overlay-plan-slo-tpot-ms is unused: it applies with an --overlay-mode" in parse(
        "--overlay-plan-slo-ttft-ms", "1", "--overlay-plan-slo-tpot-ms", "1").unused_flags()
    with pytest.raises(SidpConfigError, match=r"^--overlay-plan-slo-ttft-ms: Input should be greater than 0$"):
        parse("--overlay-mode", "shift", "--overlay-plan-slo-ttft-ms", "0")
