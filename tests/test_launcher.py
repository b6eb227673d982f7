"""The launcher: default model, flag split, clear errors before any device work, --help."""

import json
import logging
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from sgl_sidp import launch_server as ls
from sgl_sidp.config import ENV_VAR, SidpConfig, SidpConfigError

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


def test_our_flags_split_from_sglang_flags():
    ours, rest = ls.split_args(
        ["--overlay-batch-signal", "--tp-size", "2", "--overlay-signal-log-interval", "3", "--shift-sp", "2", "--port", "9"])
    assert ours.overlay_batch_signal and ours.overlay_signal_log_interval == 3 and ours.shift_sp == 2
    assert rest == ["--model-path", str(ls.DEFAULT_MODEL_DIR), "--load-format", "dummy", "--tp-size", "2", "--port", "9"]


def test_raw_sglang_args_parse_without_server_args():
    raw = ls.sglang_raw_args(ls.with_default_model(["--dp-size", "2"]))
    assert raw.dp_size == 2 and raw.model_path == str(ls.DEFAULT_MODEL_DIR)


def test_deprecated_sglang_flag_warns_once_as_in_sglang(caplog):
    """The launcher's own parses of SGLang's flags stay quiet about a deprecated alias; SGLang's parser (what
    `prepare_server_args` runs once) still warns, so the user sees SGLang's one warning."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    argv = ls.with_default_model(["--cuda-graph-max-bs", "512"])
    with caplog.at_level(logging.WARNING, logger=ls.SGLANG_ARGPARSE_LOGGER):
        assert ls.sglang_raw_args(argv).cuda_graph_max_bs_decode == 512
        assert ls.sglang_raw_args(argv).cuda_graph_max_bs_decode == 512
        assert not [r for r in caplog.records if r.name == ls.SGLANG_ARGPARSE_LOGGER]
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        parser.parse_args(argv)
    warned = [r.getMessage() for r in caplog.records if r.name == ls.SGLANG_ARGPARSE_LOGGER]
    assert len(warned) == 1 and "--cuda-graph-max-bs" in warned[0]


def test_entry_point_visibility_respects_sglang_plugins(monkeypatch):
    assert ls.plugin_entry_point_visible()
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")
    assert not ls.plugin_entry_point_visible()
    with pytest.raises(SidpConfigError, match="cannot see the 'sgl_sidp' plugin entry point"):
        ls.parse(["--overlay-batch-signal"])


def main_errors(argv, capsys):
    """`main(argv)` on this machine, a CUDA GPU faked, stopped where it refuses: (exit status, its stderr lines)."""
    with pytest.raises(SystemExit) as e:
        ls.main(argv)
    return e.value.code, capsys.readouterr().err.splitlines()


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(ls, "require_cuda_gpu", lambda: None)


def test_bad_combination_exits_2_with_one_line_per_problem(fake_gpu, capsys):
    code, err = main_errors(["--overlay-mode", "zerodp", "--dp-size", "1"], capsys)  # default model is dense
    assert code == 2 and err[0] == "sgl-sidp: error: invalid sgl-sidp settings:" and len(err) == 3
    assert "  - --overlay-mode zerodp shares weights across DP replicas: needs --dp-size >= 2" in err[1]
    assert "has no MoE layers" in err[2] and "not implemented" not in "".join(err)  # zerodp is implemented


@pytest.mark.skipif(not MOE.is_dir(), reason=f"{MOE} not found (the shared model configs)")
def test_shift_on_a_moe_model_rejected_before_any_gpu_work(fake_gpu, capsys):
    code, err = main_errors(["--overlay-mode", "shift", "--model-path", str(MOE), "--load-format", "dummy",
                             "--tp-size", "2", "--shift-sp", "3"], capsys)
    assert code == 2 and err[0] == "sgl-sidp: error: invalid sgl-sidp settings:"
    assert "  - --shift-sp 3 does not divide --tp-size 2" in err and any("is MoE" in x for x in err)


def test_every_argparse_error_is_one_sgl_sidp_line(fake_gpu, capsys):
    """An unknown flag (SGLang's parser), a bad choice or a missing value (ours): one line, exit 2, no usage dump."""
    hint = f" (see {ls.PROG} --help)"
    cases = {("--dp-size", "2", "--bogus-flag"): "unrecognized arguments: --bogus-flag",
             ("--overlay-mode", "turbo"): "argument --overlay-mode: invalid choice: 'turbo' (choose from 'off', "
                                          "'zerodp', 'sidp', 'shift', 'auto')",
             ("--sidp-service",): "argument --sidp-service: expected one argument",
             ("--dp-size", "two"): "argument --dp-size/--data-parallel-size: invalid int value: 'two'"}
    for argv, message in cases.items():
        assert main_errors(list(argv), capsys) == (2, [f"sgl-sidp: error: {message}{hint}"]), argv


def test_sglang_refusing_its_settings_is_one_sgl_sidp_line(fake_gpu, capsys, monkeypatch):
    """`prepare_server_args` raising (ServerArgs' checks) is one line too: its message, or where a bare assert failed."""
    import sglang.srt.server_args

    def refuse(argv):
        raise ValueError("--tp-size 3 does not divide\nthe 64 heads")

    import sglang.srt.plugins
    from sgl_sidp.process import LAUNCHER_PID_ENV

    monkeypatch.setenv(ENV_VAR, "")  # parse() sets both; monkeypatch restores them
    monkeypatch.setenv(LAUNCHER_PID_ENV, "")
    monkeypatch.setattr(sglang.srt.plugins, "load_plugins", lambda: None)
    monkeypatch.setattr(sglang.srt.server_args, "prepare_server_args", refuse)
    assert main_errors([], capsys) == (2, ["sgl-sidp: error: SGLang: --tp-size 3 does not divide the 64 heads"])

    def bare_assert(argv):  # as a bare `assert` in SGLang raises it (pytest rewrites asserts in this file)
        raise AssertionError

    monkeypatch.setattr(sglang.srt.server_args, "prepare_server_args", bare_assert)
    code, err = main_errors([], capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith("sgl-sidp: error: SGLang: AssertionError at test_launcher.py:") and "raise AssertionError" in err[0]


def test_old_spellings_are_refused_naming_the_new_flag():
    """A user upgrading is told the new name, in one line per old flag, before anything else (no SGLang, no GPU)."""
    t0 = time.time()
    out = launch("--sidp-sidp-force", "cas", "--dp-size", "2")
    assert (out.returncode, out.stderr) == (2, "sgl-sidp: error: --sidp-sidp-force was renamed --sidp-service\n")
    assert time.time() - t0 < 10  # ~0.3 s: imports neither SGLang nor torch
    with pytest.raises(SidpConfigError) as e:
        ls.parse(["--sidp-mode=sidp", "--sidp-sidp-b-th", "64", "--shift-sp", "2"])
    assert e.value.problems == ["--sidp-mode was renamed --overlay-mode", "--sidp-sidp-b-th was renamed --sidp-b-th"]


def test_no_cuda_gpu_is_one_line_before_sglang_is_imported():
    """This machine has no CUDA GPU: the real check (NVML, $CUDA_VISIBLE_DEVICES) refuses in one line, at once."""
    t0 = time.time()
    out = launch("--overlay-mode", "sidp", "--dp-size", "2")
    took = time.time() - t0
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr[-2000:]
    assert out.stderr.startswith("sgl-sidp: error: no CUDA GPU visible: sgl-sidp serves on NVIDIA GPUs "
                                 "(CUDA_VISIBLE_DEVICES unset; ")
    assert took < 10, took  # ~0.3 s here; SGLang's import alone takes ~10 s on this machine
    out = launch(env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 2 and "(CUDA_VISIBLE_DEVICES=; " in out.stderr and len(out.stderr.splitlines()) == 1


def test_cuda_gpu_check_reads_nvml_and_cuda_visible_devices(monkeypatch):
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ls.require_cuda_gpu()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    ls.require_cuda_gpu()
    for hidden in ("", "-1", " ,0"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        with pytest.raises(SidpConfigError, match=f"no CUDA GPU visible: .*CUDA_VISIBLE_DEVICES={hidden}; it hides"):
            ls.require_cuda_gpu()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 0)
    with pytest.raises(SidpConfigError, match=r"\(CUDA_VISIBLE_DEVICES=0; NVML sees no GPU\)$"):
        ls.require_cuda_gpu()


def test_help_shows_our_group_first_with_choices_and_needs_no_gpu():
    out = launch("--help", env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"usage: {ls.PROG} [-h] [--overlay-mode {{off,zerodp,sidp,shift,auto}}]")
    group = lines.index("sgl-sidp overlay (weights shared across the GPUs of a node):")
    assert group < 40 and "  --overlay-mode {off,zerodp,sidp,shift,auto}" in lines[group:group + 10]
    ours = lines[group:lines.index("SGLang's flags (python -m sglang.launch_server):")]
    for flag in ("--sidp-service {was,cas,auto}", "--sidp-fetch-order {shifted,forward}",
                 "--zerodp-tensors w13,w2|w13|w2", "--zerodp-layers auto|all|every:K|3,7,11", "--shift-sp SP"):
        assert any(x.strip().startswith(flag) for x in ours), flag
    assert "--model-path" in out.stdout and "--dp-size" in out.stdout and "--sidp-sidp" not in out.stdout


def test_our_flags_never_meet_sglang_s():
    """No SGLang flag is one of ours or starts with one of our prefixes (argparse would also refuse a clash)."""
    sglang = {o for a in ls.full_parser()._actions for o in a.option_strings} - {
        o for a in ls.overlay_parser()._actions for o in a.option_strings}
    assert not [o for o in sglang if o.startswith(("--overlay-", "--zerodp-", "--sidp-", "--shift-"))]


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
        ls.parse(["--overlay-mode", "zerodp", "--zerodp-layers", "all", "--model-path", moe_dir, "--dp-size", "3", "--tp-size", "2"])
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
    cfg, rest, _ = ls.parse(["--overlay-mode", "zerodp", "--zerodp-layers", "all", "--model-path", moe_dir, "--dp-size", "2"])
    assert cfg.mode.value == "zerodp" and os.environ[ENV_VAR]
    assert rest[-2:] == ["--load-balance-method", "total_tokens"]
    _, rest, _ = ls.parse(["--overlay-mode", "zerodp", "--zerodp-layers", "all", "--model-path", moe_dir, "--dp-size", "2", "--load-balance-method", "round_robin"])
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
    """`--zerodp-layers auto` (the default) starts on any MoE model: the source calibrates at start-up.
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
    cfg, _, _ = ls.parse(["--overlay-mode", "zerodp", "--model-path", moe_dir, "--dp-size", "2", "--tp-size", "4"])
    assert cfg.zerodp.layers == "auto" and os.environ[LAUNCHER_PID_ENV] == str(os.getpid())


@pytest.mark.skipif(not MOE.is_dir(), reason=f"{MOE} not found (the shared model configs)")
def test_zerodp_predicted_to_offload_nothing_starts_vanilla_dp_with_one_line(monkeypatch, capsys):
    """Issue 35: ZeroDP's default policy on Qwen3-30B-A3B on 2 x H100 offloads nothing (a batch-1 decode step hides
    no layer's pulls); such a sink is a DP replica with a smaller pool and another routing (measured 0.94x DP2).
    The launcher starts vanilla SGLang instead, with SGLang's routing and one line that also names the best vanilla
    configuration; it runs ZeroDP where its router alone is predicted to pay, with a forced or prefill-sized policy,
    with `--zerodp-layers auto` given (the sinks' measurements decide), and where the planner cannot predict (an
    unknown GPU: the runtime's policy decides)."""
    import sglang.srt.plugins
    import sglang.srt.server_args
    from sgl_sidp.peer import topology
    from sgl_sidp.plan import verdict

    monkeypatch.setenv(ENV_VAR, "")
    monkeypatch.setattr(topology, "_nvml_p2p_read", lambda visible: lambda a, b: True)
    monkeypatch.setattr(sglang.srt.plugins, "load_plugins", lambda: None)
    monkeypatch.setattr(sglang.srt.server_args, "prepare_server_args", lambda argv: list(argv))
    monkeypatch.setattr(topology, "gpu_name", lambda i: "NVIDIA H100 80GB HBM3")
    base = ["--overlay-mode", "zerodp", "--model-path", str(MOE), "--dp-size", "2"]
    cfg, rest, _ = ls.parse(base)
    line = capsys.readouterr().out
    assert cfg.mode.value == "off" and cfg.feature is None and "total_tokens" not in rest and line.count("\n") == 1
    assert line.startswith("sgl-sidp: --overlay-mode zerodp declines: on 2 x NVIDIA H100 80GB HBM3 its policy is "
                           "predicted to offload no MoE layer at --zerodp-expected-batch decode:1")
    assert "its router at 1.00x the throughput of SGLang's round robin on offline:512:2048:256" in line
    assert "starting vanilla SGLang (dp2: --dp-size 2 --tp-size 1" in line and "best vanilla configuration, dp2_attn" in line
    assert "predicted by the planner" in line and "--zerodp-layers auto (the sinks' own measurements decide)" in line
    for forced in (["--zerodp-layers", "all"], ["--zerodp-expected-batch", "prefill:8192"], ["--zerodp-layers", "auto"]):
        cfg, rest, _ = ls.parse(base + forced)
        assert cfg.mode.value == "zerodp" and "total_tokens" in rest and "declines" not in capsys.readouterr().out
    with monkeypatch.context() as m:  # the router alone predicted 1.2x round robin's: ZeroDP runs
        m.setattr(verdict, "objective_ratio", lambda objective, ours, other: 1.2)
        assert ls.parse(base)[0].mode.value == "zerodp"
    monkeypatch.setattr(topology, "gpu_name", lambda i: "NVIDIA A100-SXM4-80GB")
    assert ls.parse(base)[0].mode.value == "zerodp"
    capsys.readouterr()
    monkeypatch.setattr(verdict, "planned", lambda *a, **k: 1 / 0)  # a planner bug never stops the server asked for
    assert ls.parse(base)[0].mode.value == "zerodp"
    assert "no prediction of whether it gains over vanilla SGLang (ZeroDivisionError" in capsys.readouterr().out


DENSE = MOE.parent / "Qwen3-8B"


@pytest.mark.skipif(not DENSE.is_dir(), reason=f"{DENSE} not found (the shared model configs)")
def test_auto_mode_starts_the_planner_s_winner_in_place_of_the_mode_and_layout_flags(monkeypatch, capsys):
    monkeypatch.setattr("sgl_sidp.peer.topology.gpu_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr("sgl_sidp.peer.topology.visible_gpu_count", lambda: 2)
    argv = ["--model-path", str(DENSE), "--overlay-mode", "auto", "--load-format", "dummy"]
    out = ls.resolve_auto(argv)
    printed = capsys.readouterr().out
    assert "every number below is a prediction" in printed and "--overlay-mode auto starts dp2 (predicted; the highest predicted throughput on " in printed
    assert out == ["--model-path", str(DENSE), "--load-format", "dummy", "--dp-size", "2"]  # offline: DP2 wins
    argv = ["--model-path", str(DENSE), "--overlay-mode=auto", "--tp-size", "2", "--overlay-plan-workload", "latency:2048:64"]
    chosen = ls.resolve_auto(argv)
    assert chosen.count("--tp-size") <= 1 and "auto" not in chosen
    # the workload stays where a technique won (it decides at its launch: Feature.declines, SiDP's B_th), else goes
    assert ("--overlay-plan-workload" in chosen) == ("--overlay-mode" in chosen)
    assert ls.resolve_auto(["--model-path", str(DENSE), "--tp-size", "2"]) == ["--model-path", str(DENSE), "--tp-size", "2"]
    argv = ["--model-path", str(DENSE), "--overlay-mode", "auto", "--overlay-plan-workload", "offline:64:2048:64",
            "--overlay-plan-slo-ttft-ms", "1000", "--overlay-plan-slo-tpot-ms=50"]
    chosen = ls.resolve_auto(argv)
    out = capsys.readouterr().out
    assert "(predicted; the highest predicted goodput" in out and "under TTFT 1000 ms and TPOT 50 ms" in out
    assert not [a for a in chosen if a.startswith("--overlay-plan")] and "1000" not in chosen
    with pytest.raises(SidpConfigError, match="go together: give both or neither"):
        ls.resolve_auto(argv[:-1])


@pytest.mark.skipif(not DENSE.is_dir(), reason=f"{DENSE} not found (the shared model configs)")
def test_auto_mode_without_a_known_gpu_or_calibration_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr("sgl_sidp.peer.topology.gpu_name", lambda i: None)
    monkeypatch.setattr("sgl_sidp.peer.topology.visible_gpu_count", lambda: None)
    with pytest.raises(SidpConfigError, match="this host's GPU 0 is not visible"):
        ls.resolve_auto(["--model-path", str(DENSE), "--overlay-mode", "auto"])
    monkeypatch.setattr("sgl_sidp.peer.topology.gpu_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr("sgl_sidp.peer.topology.visible_gpu_count", lambda: 2)
    uncalibrated = tmp_path / "qwen3-odd"  # a model no bundled calibration covers
    uncalibrated.mkdir()
    (uncalibrated / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 4,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 4096}))
    with pytest.raises(SidpConfigError, match="plan calibrate --model-path"):
        ls.resolve_auto(["--model-path", str(uncalibrated), "--overlay-mode", "auto"])
    with pytest.raises(SidpConfigError, match="--overlay-plan-workload is unused: it applies with an --overlay-mode"):
        ls.parse(["--model-path", str(DENSE), "--overlay-plan-workload", "offline:1:2:3"])


@pytest.mark.skipif(not DENSE.is_dir(), reason="needs ../shared/models")
def test_an_explicit_mode_logs_its_predicted_ratio_on_the_workload_given(monkeypatch):
    monkeypatch.setattr("sgl_sidp.peer.topology.gpu_name", lambda i: "NVIDIA H200")
    cfg = SidpConfig.from_cli_args(ls.split_args(["--overlay-mode", "shift", "--overlay-plan-workload",
                                                  "offline:64:1024:32"])[0])
    server_args = types.SimpleNamespace(model_path=str(DENSE), dp_size=1, tp_size=2, base_gpu_id=0)  # as resolved
    line = ls.mode_verdict(cfg, server_args)
    assert line.startswith("sgl-sidp: --overlay-mode shift (shift_sp2_tp1)") and "offline:64:1024:32" in line
    monkeypatch.setattr("sgl_sidp.plan.verdict.verdict", lambda *a: 1 / 0)  # a planner bug never stops the server
    assert "no prediction against vanilla SGLang: ZeroDivisionError" in ls.mode_verdict(cfg, server_args)


def test_auto_keeps_the_planning_flags_for_a_technique_it_starts(monkeypatch, capsys):
    """`--overlay-mode auto` that starts a technique keeps `--overlay-plan-*`: the technique still decides with them at
    launch (ZeroDP's `declines` on the same workload auto ranked it on); a vanilla winner drops them (unused)."""
    from sgl_sidp.plan import planner

    monkeypatch.setattr("sgl_sidp.peer.topology.gpu_name", lambda i: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr("sgl_sidp.peer.topology.visible_gpu_count", lambda: 2)
    monkeypatch.setattr(planner, "table", lambda result: "")
    launch = {"zerodp_dp2": ["--dp-size", "2", "--overlay-mode", "zerodp"], "dp2": ["--dp-size", "2"]}
    argv = ["--model-path", str(MOE), "--overlay-mode", "auto", "--overlay-plan-workload", "trace:T",
            "--overlay-plan-slo-ttft-ms", "2000", "--overlay-plan-slo-tpot-ms", "100"]
    for winner in launch:
        monkeypatch.setattr(planner, "plan", lambda *a, **k: {
            "winner": winner, "reason": "w: the highest predicted goodput", "launch":
            ["python", "-m", "sgl_sidp.launch_server", "--model-path", str(MOE), *launch[winner]]})
        got = ls.resolve_auto(argv)
        kept = [a for a in got if a.startswith("--overlay-plan")]
        assert got[-len(launch[winner]):] == launch[winner] and "auto" not in got
        assert kept == (["--overlay-plan-workload", "--overlay-plan-slo-ttft-ms", "--overlay-plan-slo-tpot-ms"]
                        if winner == "zerodp_dp2" else [])
