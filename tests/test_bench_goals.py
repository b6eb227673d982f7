"""`bench.goals`: issue 36's goals counted over committed runs (`checks` on a validate table; the whole command on a
committed run when the shared model configs are here)."""

import shutil
from pathlib import Path

import pytest

from sgl_sidp.bench import goals

SHARED = Path(__file__).resolve().parents[2] / "shared"
RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "multi_gpu" / "q8_par_check_alone_2gpu_h100"


def test_each_number_is_held_against_its_own_goal_and_the_winner_against_the_measured_first():
    table = [("dp2", "KV tokens, all ranks", "tokens", 101.0, 100.0),  # +1 %: within 2 %
             ("tp2", "KV tokens, all ranks", "tokens", 103.0, 100.0),  # +3 %: a miss
             ("dp2", "burst of 8 x (2048 in, 32 out): total throughput", "tok/s", 109.0, 100.0),
             ("tp2", "burst of 8 x (2048 in, 32 out): total throughput", "tok/s", 100.0, 120.0),  # -16.7 %
             ("dp2", "burst of 8 x (2048 in, 32 out): TTFT p50", "ms", 114.0, 100.0),
             ("dp2", "A@2x: goodput (TTFT 1000 ms, TPOT 8 ms)", "req/s", 0.0, 0.0),  # both 0: right
             ("tp2", "A@2x: goodput (TTFT 1000 ms, TPOT 8 ms)", "req/s", 0.5, 0.0),  # measured 0: a miss
             ("dp2", "A@2x: TTFT p50", "ms", 80.0, 100.0),  # -20 %
             ("tp2", "not predicted: run with flags the planner does not model", "", None, None)]
    got = {(c.configuration, c.number): c for c in goals.checks("2 x H100", "run/M", table)}
    assert [got["dp2", "KV tokens"].ok, got["tp2", "KV tokens"].ok] == [True, False]
    assert got["dp2", "burst throughput"].ok and not got["tp2", "burst throughput"].ok
    assert got["dp2", "burst TTFT / TPOT p50"].ok and not got["dp2", "replay TTFT / TPOT p50"].ok
    assert got["dp2", "replay goodput"].ok and not got["tp2", "replay goodput"].ok
    # the burst: DP2 predicted first (109 > 100), TP2 measured first (120 > 100); the replay: both 0 -> TP2 predicted
    winners = [c for c in got.values() if c.number == "winner"]
    assert {(c.configuration, c.ok) for c in winners} == {("dp2", False), ("tp2", False)}
    lines = goals.table(list(got.values()), misses=1)
    assert "| 2 x H100 | KV tokens | 2% | 1 of 2 | `run` tp2 +3.0% |" in lines
    assert "| 2 x H100 | burst throughput | 10% | 1 of 2 | `run` tp2 -16.7% |" in lines


def test_the_predicted_winner_is_the_planners_a_technique_within_its_error_yields_to_vanilla():
    """The winner check names the planner's first (`validate.predicted_first`): a technique predicted less than
    `NEAR_TIE` over the best vanilla configuration yields to it, as `--overlay-mode auto` does."""
    from sgl_sidp.bench import validate

    near = [("sidp_dp4_auto", 101.5, 98.0), ("tp2_dp2", 100.0, 100.0), ("tp4", 84.0, 88.0)]
    assert validate.predicted_first(near) == "tp2_dp2"
    assert validate.predicted_first([("sidp_dp4_was", 108.0, 107.0), ("tp2_dp2", 100.0, 100.0)]) == "sidp_dp4_was"
    assert validate.predicted_first([("dp2", 100.0, 90.0), ("tp2", 99.0, 100.0)]) == "dp2"  # vanilla: as predicted
    unknown = [("shift_sp2_tp1_th512", 101.0, 1.0), ("auto", 100.0, 1.0)]  # auto: no vanilla configuration
    assert validate.predicted_first(unknown) == "shift_sp2_tp1_th512"
    table = [(n, "burst of 8 x (2048 in, 32 out): total throughput", "tok/s", p, m) for n, p, m in near]
    (winner,) = [c for c in goals.checks("4 x H200", "run/M", table) if c.number == "winner"]
    assert (winner.configuration, winner.ok) == ("tp2_dp2", True)


def test_the_command_counts_a_committed_run_and_lists_what_it_skips(tmp_path, capsys):
    if not (SHARED / "models" / "Qwen3-8B" / "config.json").is_file():
        pytest.skip("../shared/models missing")
    shutil.copytree(RUN, tmp_path / "run")
    (tmp_path / "other" / "NoSuchModel").mkdir(parents=True)
    (tmp_path / "other" / "NoSuchModel" / "config.json").write_text("{}")
    assert goals.main([str(tmp_path), "--models-dir", str(SHARED / "models")]) == 0
    out = capsys.readouterr().out
    assert "| 2 x H100 | burst throughput | 10% | 2 of 2 |" in out and "| 2 x H100 | winner |" in out
    assert f"- other/NoSuchModel: no {SHARED / 'models' / 'NoSuchModel'}/config.json" in out
    shutil.copytree(RUN.parent / "overlap_off_4gpu_h200", tmp_path / "off")  # every server with an unmodelled switch
    assert goals.main([str(tmp_path), "--models-dir", str(SHARED / "models")]) == 0
    out = capsys.readouterr().out
    assert ("- off/Qwen3-32B tp4: started with SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1, which the planner does "
            "not model") in out and "off/Qwen3-32B: no bench.compare results" not in out
    shutil.rmtree(tmp_path / "off")
    shutil.copytree(RUN.parent / "q8_shift_sp1_4x_1gpu_h200", tmp_path / "sp1")  # Shift SP1: no planner configuration
    assert goals.main([str(tmp_path), "--models-dir", str(SHARED / "models"), "--trace-dir", str(SHARED / "traces")]) == 0
    out = capsys.readouterr().out
    assert "- sp1/Qwen3-8B shift_sp1_tp1_th1024_nccl: not predicted: not a configuration of this model on 1 GPUs" in out
    assert "| 1 x H200 | KV tokens | 2% | 1 of 1 |" in out  # TP1 beside it is counted
    assert goals.main([str(tmp_path), "--models-dir", str(SHARED / "models"), "--trace-dir", str(SHARED / "traces"),
                       "--per-run", str(tmp_path / "runs")]) == 0
    written = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert written == ["1xH200.md", "2xH100.md"]
    one = (tmp_path / "runs" / "1xH200.md").read_text()
    assert "## sp1/Qwen3-8B" in one and "| tp1 | KV tokens, all ranks | tokens | 803,751.0 | 803,502.0 | +0.0% |" in one
    assert "| shift_sp1_tp1_th1024_nccl | not predicted: not a configuration of this model on 1 GPUs |" in one


def test_a_gpu_name_maps_to_the_planners_kind():
    from sgl_sidp.plan.steps import gpu_key

    assert gpu_key("NVIDIA H100 80GB HBM3") == "H100" and gpu_key("NVIDIA H200") == gpu_key("H200") == "H200"
    assert gpu_key("NVIDIA A100-SXM4-80GB") is None and gpu_key(None) is None


def test_a_shard_served_alone_is_predicted_from_the_config_kept_with_its_results(tmp_path, capsys):
    """A TP2 shard served alone on one GPU (`gpu_runs.sh tp2_shard`) is no model of `--models-dir`: its run counts,
    predicted from the config.json `bench.compare` kept beside its results."""
    conversation = SHARED / "traces" / "conversation_trace.jsonl"
    if not conversation.is_file():
        pytest.skip("../shared/traces missing")
    traces = tmp_path / "traces"
    traces.mkdir()
    with conversation.open() as f:  # the replay's trace: the first 400 lines (goals.md's header)
        (traces / "mooncake_head400.jsonl").write_text("".join(next(f) for _ in range(400)))
    shutil.copytree(RUN.parent / "q8_mooncake_shard_1gpu_h200", tmp_path / "runs" / "shard")
    assert goals.main([str(tmp_path / "runs"), "--models-dir", str(tmp_path / "none"), "--trace-dir", str(traces)]) == 0
    out = capsys.readouterr().out
    assert "| 1 x H200 | KV tokens | 2% | 1 of 1 |" in out and "| 1 x H200 | replay TTFT / TPOT p50 | 15% |" in out
