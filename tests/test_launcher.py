"""The launcher: default model, flag split, clear errors before any device work, --help."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_sidp import launch_server as ls
from sgl_sidp.config import ENV_VAR, SidpConfigError

MOE = Path(__file__).resolve().parents[2] / "shared" / "models" / "Qwen3-30B-A3B"


def launch(*argv, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "sgl_sidp.launch_server", *argv], env=env,
                          capture_output=True, text=True, timeout=240)


def test_default_model_injected_only_without_model():
    d = str(ls.DEFAULT_MODEL_DIR)
    assert ls.with_default_model(["--port", "1"]) == ["--model-path", d, "--load-format", "dummy", "--port", "1"]
    assert ls.with_default_model(["--load-format=auto"]) == ["--model-path", d, "--load-format=auto"]
    assert ls.with_default_model(["--model", "x"]) == ["--model", "x"]
    assert ls.with_default_model(["--config", "c.yaml"]) == ["--config", "c.yaml"]
    assert (ls.DEFAULT_MODEL_DIR / "config.json").is_file() and (ls.DEFAULT_MODEL_DIR / "tokenizer.json").is_file()


def test_sidp_flags_split_from_sglang_flags():
    ours, rest = ls.sidp_parser().parse_known_args(
        ["--sidp-batch-signal", "--tp-size", "2", "--sidp-signal-log-interval", "3", "--port", "9"])
    assert ours.sidp_batch_signal and ours.sidp_signal_log_interval == 3
    assert rest == ["--tp-size", "2", "--port", "9"]


def test_raw_sglang_args_parse_without_server_args():
    raw = ls.sglang_raw_args(ls.with_default_model(["--dp-size", "2"]))
    assert raw.dp_size == 2 and raw.model_path == str(ls.DEFAULT_MODEL_DIR)


def test_entry_point_visibility_respects_sglang_plugins(monkeypatch):
    assert ls.plugin_entry_point_visible()
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")
    assert not ls.plugin_entry_point_visible()
    with pytest.raises(SidpConfigError, match="cannot see the 'sgl_sidp' plugin entry point"):
        ls.parse(["--sidp-batch-signal"])


def test_bad_combination_exits_2_with_one_line_per_problem():
    out = launch("--sidp-mode", "zerodp", "--dp-size", "1")  # default model is dense
    assert out.returncode == 2
    err = out.stderr
    assert "sgl-sidp: error: invalid sgl-sidp settings:" in err
    assert "not implemented" not in err  # zerodp is implemented
    assert "  - --sidp-mode zerodp shares weights across DP replicas: needs --dp-size >= 2" in err
    assert "has no MoE layers" in err


@pytest.mark.skipif(not MOE.is_dir(), reason=f"{MOE} not found (the shared model configs)")
def test_shift_on_a_moe_model_rejected_before_any_gpu_work():
    out = launch("--sidp-mode", "shift", "--model-path", str(MOE), "--load-format", "dummy", "--tp-size", "2",
                 "--sidp-shift-sp", "3")
    assert out.returncode == 2 and "invalid sgl-sidp settings:" in out.stderr
    assert "  - --sidp-shift-sp 3 does not divide --tp-size 2" in out.stderr and "is MoE" in out.stderr


def test_help_lists_our_group_and_sglang_flags():
    out = launch("--help")
    assert out.returncode == 0
    assert "sgl-sidp overlay:" in out.stdout and "--sidp-mode {off,zerodp,sidp,shift,auto}" in out.stdout
    assert "--model-path" in out.stdout and "--dp-size" in out.stdout


# --------------------------------------------------------------------------- zerodp
@pytest.fixture
def moe_dir(tmp_path):
    d = tmp_path / "moe"
    d.mkdir()
    (d / "config.json").write_text('{"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128}')
    return str(d)


def test_zerodp_defaults_add_total_tokens_routing_only_when_not_given():
    """ZeroDP switches SGLang to total_tokens routing unless the user chose a method."""
    from sgl_sidp.zerodp.feature import sglang_defaults

    assert sglang_defaults(["--dp-size", "2"]) == ["--dp-size", "2", "--load-balance-method", "total_tokens"]
    given = ["--load-balance-method", "round_robin", "--dp-size", "2"]
    assert sglang_defaults(given) == given
    assert sglang_defaults(["--load-balance-method=total_requests"]) == ["--load-balance-method=total_requests"]
    argv = ["--dp-size", "2"]
    sglang_defaults(argv)
    assert argv == ["--dp-size", "2"]  # the caller's list is not modified


def test_zerodp_parse_checks_peer_access_of_every_pair(monkeypatch, moe_dir):
    """parse() asks about every (source, sink) GPU pair and refuses a pair without peer access."""
    from sgl_sidp.peer import topology as preflight

    asked = []

    def fake_nvml(visible):
        return lambda a, b: asked.append((a, b)) or (a, b) != (1, 5)

    monkeypatch.setattr(preflight, "_nvml_p2p_read", fake_nvml)
    with pytest.raises(SidpConfigError) as e:
        ls.parse(["--sidp-mode", "zerodp", "--sidp-zerodp-layers", "all", "--model-path", moe_dir, "--dp-size", "3", "--tp-size", "2"])
    assert asked == [(0, 2), (1, 3), (0, 4), (1, 5)]
    assert len(e.value.problems) == 1 and "a sink cannot read its source: GPU 5 cannot read GPU 1's memory" in e.value.problems[0]


def test_zerodp_parse_passes_routing_default_to_sglang(monkeypatch, moe_dir):
    """With peer access, parse() hands SGLang its flags plus the routing default (device steps stubbed out)."""
    import sglang.srt.plugins
    import sglang.srt.server_args
    from sgl_sidp.peer import topology as preflight

    monkeypatch.setenv(ENV_VAR, "")  # parse() writes the config into os.environ; restored afterwards
    monkeypatch.setattr(preflight, "_nvml_p2p_read", lambda visible: lambda a, b: True)
    monkeypatch.setattr(sglang.srt.plugins, "load_plugins", lambda: None)
    monkeypatch.setattr(sglang.srt.server_args, "prepare_server_args", lambda argv: list(argv))
    cfg, rest = ls.parse(["--sidp-mode", "zerodp", "--sidp-zerodp-layers", "all", "--model-path", moe_dir, "--dp-size", "2"])
    assert cfg.mode.value == "zerodp" and os.environ[ENV_VAR]
    assert rest[-2:] == ["--load-balance-method", "total_tokens"]
    _, rest = ls.parse(["--sidp-mode", "zerodp", "--sidp-zerodp-layers", "all", "--model-path", moe_dir, "--dp-size", "2", "--load-balance-method", "round_robin"])
    assert rest.count("--load-balance-method") == 1 and "total_tokens" not in rest


def test_zerodp_validates_against_sglang_default_flags(moe_dir):
    """SGLang's own defaults (pp, dwdp, offload mode, dp attention) do not trip ZeroDP's checks."""
    from sgl_sidp.config import SidpConfig

    raw = ls.sglang_raw_args(["--model-path", moe_dir, "--dp-size", "2"])
    SidpConfig(mode="zerodp").validate_against(raw)
    raw = ls.sglang_raw_args(["--model-path", moe_dir, "--dp-size", "2", "--enable-dp-attention"])
    with pytest.raises(SidpConfigError, match="enable-dp-attention"):
        SidpConfig(mode="zerodp").validate_against(raw)


def test_zerodp_auto_needs_no_calibration_file(monkeypatch, moe_dir):
    """`--sidp-zerodp-layers auto` (the default) starts on any MoE model: the source calibrates at start-up.
    The launcher also tells the schedulers its pid (where they send SIGQUIT to stop the whole server)."""
    import sglang.srt.plugins
    import sglang.srt.server_args
    from sgl_sidp.peer import topology
    from sgl_sidp.process import LAUNCHER_PID_ENV

    monkeypatch.setenv(ENV_VAR, "")
    monkeypatch.setenv(LAUNCHER_PID_ENV, "")
    monkeypatch.setattr(topology, "_nvml_p2p_read", lambda visible: lambda a, b: True)
    monkeypatch.setattr(sglang.srt.plugins, "load_plugins", lambda: None)
    monkeypatch.setattr(sglang.srt.server_args, "prepare_server_args", lambda argv: list(argv))
    cfg, _ = ls.parse(["--sidp-mode", "zerodp", "--model-path", moe_dir, "--dp-size", "2", "--tp-size", "4"])
    assert cfg.zerodp.layers == "auto" and os.environ[LAUNCHER_PID_ENV] == str(os.getpid())


DENSE = MOE.parent / "Qwen3-8B"


@pytest.mark.skipif(not DENSE.is_dir(), reason=f"{DENSE} not found (the shared model configs)")
def test_auto_mode_starts_the_planner_s_winner_in_place_of_the_mode_and_layout_flags(monkeypatch, capsys):
    monkeypatch.setattr("sgl_sidp.peer.topology.gpu_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr("sgl_sidp.peer.topology.visible_gpu_count", lambda: 2)
    argv = ["--model-path", str(DENSE), "--sidp-mode", "auto", "--load-format", "dummy"]
    out = ls.resolve_auto(argv)
    printed = capsys.readouterr().out
    assert "every number below is a prediction" in printed and "--sidp-mode auto starts dp2 (predicted)" in printed
    assert out == ["--model-path", str(DENSE), "--load-format", "dummy", "--dp-size", "2"]  # offline: DP2 wins
    argv = ["--model-path", str(DENSE), "--sidp-mode=auto", "--tp-size", "2", "--sidp-plan-workload", "latency:2048:64"]
    chosen = ls.resolve_auto(argv)
    assert "--sidp-plan-workload" not in chosen and chosen.count("--tp-size") <= 1 and "auto" not in chosen
    assert ls.resolve_auto(["--model-path", str(DENSE), "--tp-size", "2"]) == ["--model-path", str(DENSE), "--tp-size", "2"]


@pytest.mark.skipif(not DENSE.is_dir(), reason=f"{DENSE} not found (the shared model configs)")
def test_auto_mode_without_a_known_gpu_or_calibration_is_one_line(monkeypatch):
    monkeypatch.setattr("sgl_sidp.peer.topology.gpu_name", lambda i: None)
    monkeypatch.setattr("sgl_sidp.peer.topology.visible_gpu_count", lambda: None)
    with pytest.raises(SidpConfigError, match="this host's GPU 0 is not visible"):
        ls.resolve_auto(["--model-path", str(DENSE), "--sidp-mode", "auto"])
    monkeypatch.setattr("sgl_sidp.peer.topology.gpu_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr("sgl_sidp.peer.topology.visible_gpu_count", lambda: 2)
    with pytest.raises(SidpConfigError, match="plan calibrate --model-path"):
        ls.resolve_auto(["--model-path", str(MOE.parent / "Llama-3.1-70B"), "--sidp-mode", "auto"])
    with pytest.raises(SidpConfigError, match="--sidp-plan-workload is unused"):
        ls.parse(["--model-path", str(DENSE), "--sidp-plan-workload", "offline:1:2:3"])
