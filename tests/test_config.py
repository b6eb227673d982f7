"""Config validation: every rejected combination gets its own clear line, before any GPU work."""

import argparse
import json
from types import SimpleNamespace

import pytest

from sgl_sidp.config import ENV_VAR, SidpConfig, SidpConfigError, SidpMode, model_is_moe

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
    return SimpleNamespace(model_path=model, dp_size=dp, tp_size=tp)


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
    cfg = parse("--sidp-batch-signal", "--sidp-signal-log-interval", "5")
    assert cfg.active and cfg.signal_enabled and cfg.mode == SidpMode.OFF and cfg.signal_log_interval == 5


def test_off_accepts_any_sglang_args(dense_dir):
    parse().validate_against(args(dense_dir, dp=8, tp=8))


def test_env_round_trip():
    cfg = parse("--sidp-batch-signal", "--sidp-signal-log-interval", "7")
    env = cfg.to_env({})
    assert json.loads(env[ENV_VAR])["signal_log_interval"] == 7
    assert SidpConfig.from_env(env) == cfg
    assert SidpConfig.from_env({}) == SidpConfig()


def test_rejects_garbage_in_env():
    with pytest.raises(SidpConfigError, match="not JSON"):
        SidpConfig.from_env({ENV_VAR: "{nope"})
    with pytest.raises(SidpConfigError, match="--sidp-bogus: Extra inputs are not permitted"):
        SidpConfig.from_env({ENV_VAR: json.dumps({"bogus": 1})})


def test_rejects_nonpositive_log_interval():
    with pytest.raises(SidpConfigError) as e:
        parse("--sidp-signal-log-interval", "0")
    assert e.value.problems == ["--sidp-signal-log-interval: Input should be greater than or equal to 1"]


def test_rejects_unknown_mode_at_parse():
    p = argparse.ArgumentParser()
    SidpConfig.add_cli_args(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--sidp-mode", "turbo"])


def test_rejects_unimplemented_mode(moe_dir):
    ps = problems(parse("--sidp-mode", "zerodp"), args(moe_dir, dp=2))
    assert ps == ["--sidp-mode zerodp is not implemented in this version of sgl-sidp yet"]


def test_rejects_zerodp_without_dp(moe_dir):
    ps = problems(parse("--sidp-mode", "zerodp"), args(moe_dir, dp=1))
    assert any("needs --dp-size >= 2 (a source and at least one sink), got 1" in p for p in ps)


def test_rejects_zerodp_on_dense_model(dense_dir):
    ps = problems(parse("--sidp-mode", "zerodp"), args(dense_dir, dp=2))
    assert any("has no MoE layers" in p for p in ps)


def test_rejects_sidp_without_dp(dense_dir):
    ps = problems(parse("--sidp-mode", "sidp"), args(dense_dir, dp=1))
    assert any("needs --dp-size >= 2 (at least two FFN owners), got 1" in p for p in ps)


def test_rejects_sidp_on_moe_model(moe_dir):
    ps = problems(parse("--sidp-mode", "sidp"), args(moe_dir, dp=2))
    assert any("is an MoE model (use --sidp-mode zerodp)" in p for p in ps)


def test_rejects_shift_without_tp(dense_dir):
    ps = problems(parse("--sidp-mode", "shift"), args(dense_dir, tp=1))
    assert any("needs --tp-size >= 2, got 1" in p for p in ps)


def test_reports_every_problem_at_once(dense_dir):
    ps = problems(parse("--sidp-mode", "zerodp"), args(dense_dir, dp=1))
    assert len(ps) == 3  # not implemented + dp + dense model


@pytest.mark.skipif(not MODELS.is_dir(), reason=f"{MODELS} not found (the shared model configs)")
def test_model_is_moe_on_shared_configs():
    assert model_is_moe(str(MODELS / "Qwen3-30B-A3B")) is True
    assert model_is_moe(str(MODELS / "Qwen3-32B")) is False
    assert model_is_moe(str(MODELS / "Llama-3.1-70B")) is False
    assert model_is_moe("Qwen/not-a-local-folder") is None
