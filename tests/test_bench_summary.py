"""`python -m sgl_sidp.bench.summary`: each technique's best configuration per run against that run's best vanilla."""

import json
from pathlib import Path

import pytest

from sgl_sidp.bench import summary


def row(config, value, workload="burst 128+8192+16", metric="total_tok_s", best=("dp2", 60_000.0), gpus=2):
    return {"model": "Qwen3-30B-A3B", "gpus": gpus, "gpu_name": "NVIDIA H100 80GB HBM3", "configuration": config,
            "workload": workload, "metric": metric, "value": value, "best_vanilla": best[0],
            "best_vanilla_value": best[1], "ratio": value / best[1], "predicted": None}


def test_best_configuration_of_each_technique_per_workload():
    rows = [row("dp2", 60_000.0), row("tp2", 52_000.0), row("zerodp_dp2_pf8192", 34_000.0), row("zerodp_dp2", 59_000.0),
            row("zerodp_dp2", 9.0, metric="ttft_ms_p50"), row("sidp_dp2_cas", 1.0, workload="trace x",
                                                                metric="request_goodput", best=("tp2", 2.0)),
            row("bogus_name", 1e9), row("auto", 58_000.0)]
    out = summary.technique_rows(rows, "run_a")
    assert [(r["technique"], r["configuration"], r["workload"]) for r in out] == [
        ("auto", "auto", "burst 128+8192+16"), ("sidp", "sidp_dp2_cas", "trace x"),
        ("zerodp", "zerodp_dp2", "burst 128+8192+16")]  # auto: the launcher's pick, against the measured best
    z = out[2]
    assert z["best_vanilla"] == "dp2" and z["ratio"] == pytest.approx(59 / 60) and z["run"] == "run_a"


def test_a_check_of_a_technique_s_wiring_is_no_row():
    """Shift at SP1 runs the base configuration as TP1 on the overlay's hooks (nothing shifts): a check, no way to
    serve, so neither a technique's row nor a vanilla configuration's number."""
    rows = [row("tp1", 34_160.0, gpus=1, best=("tp1", 34_160.0)),
            row("shift_sp1_tp1_th1024", 33_964.0, gpus=1, best=("tp1", 34_160.0))]
    assert summary.technique_of("shift_sp1_tp1_th1024") is None and summary.technique_of("shift_sp2_tp1") == "shift"
    assert summary.technique_rows(rows, "run") == []


def test_combine_keeps_runs_apart_and_writes_both_files(tmp_path, capsys):
    for run, v in (("a", 30_000.0), ("b", 40_000.0)):
        (tmp_path / run).mkdir()
        (tmp_path / run / "summary.json").write_text(json.dumps([row("dp2", 60_000.0), row("zerodp_dp2", v)]))
    (tmp_path / "summary.json").write_text("[]")  # a combined file of an earlier run is not a run
    summary.main([str(tmp_path)])
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["run"], r["value"]) for r in rows] == [("a", 30_000.0), ("b", 40_000.0)]
    md = (tmp_path / "summary.md").read_text()
    assert "| zerodp | Qwen3-30B-A3B | 2 x NVIDIA H100 80GB HBM3 | burst 128+8192+16 | zerodp_dp2 | 40,000 tok/s | dp2 | 60,000 | 0.67x | b |" in md
    assert md in capsys.readouterr().out


def test_a_missing_folder_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="is not a folder"):
        summary.main([str(tmp_path / "nope")])


def test_a_configuration_run_with_its_own_flags_names_them():
    out = summary.technique_rows([{**row("shift_sp2_tp1", 58_000.0), "flags": "--chunked-prefill-size 16384"}], "r")
    assert out[0]["configuration"] == "shift_sp2_tp1 (--chunked-prefill-size 16384)"
    assert "shift_sp2_tp1 (--chunked-prefill-size 16384) | 58,000 tok/s" in summary.markdown(out)


def test_a_mode_that_declined_names_what_it_started():
    """q30_mooncake_2gpu_h200: ZeroDP declined on 2 x H200 (no KV to win) and started vanilla DP2, so its row is DP2's
    numbers under ZeroDP's name unless it says so."""
    out = summary.technique_rows([{**row("zerodp_dp2_kv14459", 59_000.0), "declined_to": "dp2"}], "r")
    assert out[0]["configuration"] == "zerodp_dp2_kv14459 -> dp2 (declined)"


def test_a_run_without_a_vanilla_configuration_gives_no_row():
    """q32_prefill_mixed_2gpu_h100: SiDP alone (the device time ran out before TP2); no ratio across runs."""
    alone = {**row("sidp_dp2_auto", 12_867.0), "best_vanilla": None, "best_vanilla_value": None, "ratio": None}
    assert summary.technique_rows([alone], "r") == []


def test_a_vanilla_configuration_the_run_lacks_is_named_with_its_predicted_ratio(tmp_path):
    """q32_prefill_only_2gpu_h100: SiDP WaS 1.09x TP2, but the run had no DP2, which the planner ranks first on a
    prefill-only burst (a 1-output request frees its KV at once); with the models' configs the row says so."""
    models = Path(__file__).resolve().parents[2] / "shared" / "models"
    if not (models / "Qwen3-32B" / "config.json").is_file():
        pytest.skip(f"{models}/Qwen3-32B missing (../shared/models)")
    run = [{**row(c, v, workload="burst 128+4096+1", best=("tp2", 15_052.0)), "model": "Qwen3-32B"}
           for c, v in (("sidp_dp2_was", 16_352.0), ("tp2", 15_052.0))]
    (tmp_path / "q32").mkdir()
    (tmp_path / "q32" / "summary.json").write_text(json.dumps(run))
    (out,) = summary.combine(tmp_path, models)
    assert out["unrun_vanilla"].startswith("dp2 (pred. 1.1") and out["unrun_vanilla"].endswith("x tp2)")
    assert out["unrun_vanilla"] in summary.markdown([out])
    run.append({**row("dp2", 16_000.0, workload="burst 128+4096+1", best=("dp2", 16_000.0)), "model": "Qwen3-32B"})
    (tmp_path / "q32" / "summary.json").write_text(json.dumps(run))
    assert summary.combine(tmp_path, models)[0]["unrun_vanilla"] is None  # measured: nothing to name
    assert "vanilla the run lacks" not in summary.markdown(summary.combine(tmp_path))  # not checked: no column


def test_auto_s_pick_on_each_burst_against_the_run_s_best(tmp_path, monkeypatch):
    """Issue 35: `--overlay-mode auto` >= 0.98x the measured best. Per run and burst, the planner's winner over every
    configuration (what auto starts) and, where the run measured it, its measured ratio to the run's best."""
    monkeypatch.setattr(summary, "planned_winner", lambda model, n, gpu, burst: {"128+8192+16": "dp2"}.get(burst, "tp2"))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text(json.dumps(
        [row("dp2", 60_000.0), row("tp2", 52_000.0), row("zerodp_dp2", 56_000.0),
         row("tp2", 1.0, metric="ttft_ms_p50"), {**row("dp2", 70_000.0), "flags": "--chunked-prefill-size 16384"}]))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text(json.dumps(
        [row("dp2_attn", 44_924.0, workload="burst 256+2048+256"), row("dp2", 20_000.0, workload="burst 256+2048+256")]))
    (tmp_path / "c" / "Qwen3-30B-A3B").mkdir(parents=True)  # auto started tp2, the pick: it measures tp2
    (tmp_path / "c" / "Qwen3-30B-A3B" / "auto.json").write_text(json.dumps({"auto_choice": "tp2"}))
    (tmp_path / "c" / "summary.json").write_text(json.dumps(
        [row("dp2_attn", 50_000.0, workload="burst 256+2048+256"), row("auto", 49_000.0, workload="burst 256+2048+256")]))
    (tmp_path / "d").mkdir()  # a TP shard served alone: no model auto serves
    (tmp_path / "d" / "summary.json").write_text(json.dumps([{**row("tp1", 8_000.0), "model": "Llama-3.1-70B-tp2-shard"}]))
    picks = summary.auto_picks(tmp_path, tmp_path)
    assert [(p["run"], p["pick"], p["best"], p["ratio"]) for p in picks] == [
        ("a", "dp2", "dp2", 1.0), ("b", "tp2", "dp2_attn", None),  # flags: another configuration; tp2 not measured
        ("c", "tp2", "dp2_attn", 0.98)]
    assert summary.auto_started(tmp_path / "b") is None
    md = summary.auto_markdown(picks)
    assert "| a | Qwen3-30B-A3B | 2 x NVIDIA H100 80GB HBM3 | burst 128+8192+16 | dp2 | dp2 (60,000 tok/s) | 1.00x |" in md
    assert "| tp2 | dp2_attn (44,924 tok/s) | not measured in the run |" in md


def write_run(root, run, rows, commands=""):
    (root / run).mkdir(parents=True)
    (root / run / "summary.json").write_text(json.dumps(rows))
    (root / run / "commands.txt").write_text(commands)


def test_rows_carry_their_run_s_date_and_replay_objectives(tmp_path):
    """A README line names a replay's objectives (runs of one trace used TPOT 8 and 50 ms) and takes the last run."""
    trace = "trace AzureLLMInferenceTrace_code@3x"
    cmd = ("2026-11-27T01:00:00+00:00 commit abc: python -m sgl_sidp.bench.compare --model-path m --configs tp2 --out-dir o "
           "--trace t/AzureLLMInferenceTrace_code.csv --rates 3 --slo-ttft-ms 1000 --slo-tpot-ms 8\n"
           "2026-11-27T02:00:00+00:00 commit abc: python -m sgl_sidp.bench.compare --model-path m --configs tp2 --out-dir o\n")
    write_run(tmp_path, "a", [row("tp2", 1.0, workload=trace, metric="request_goodput", best=("tp2", 1.0)),
                              row("shift_sp2_tp1", 1.5, workload=trace, metric="request_goodput", best=("tp2", 1.0))],
              cmd)
    (out,) = summary.combine(tmp_path)
    assert out["when"] == "2026-11-27T02:00:00+00:00" and out["slo_ms"] == [1000.0, 8.0]
    assert summary.workload_label(out) == "Azure code at 3x; goodput under TTFT 1 s, TPOT 8 ms"
    assert summary.workload_label(row("tp2", 1.0, workload="burst 256+2048+32")) == "256 x (2,048 in, 32 out) at once"


def test_a_better_vanilla_configuration_another_run_measured_is_named():
    """q8_shift_chunk2x_2gpu_h100 ran no TP2: Shift's 2.22x there is against DP2, which TP2 beat under the same
    objectives in another run; the README line says so instead of reading as a win over the best vanilla."""
    runs = {"with_both": {"tp2": 0.9, "dp2": 0.5}, "dp2_only": {"dp2": 0.4}, "other": {"dp2": 0.3}}
    r = {"run": "dp2_only", "best_vanilla": "dp2"}
    assert summary.beaten_elsewhere(r, runs) == "tp2 (measured above dp2 in with_both)"
    assert summary.beaten_elsewhere({"run": "with_both", "best_vanilla": "tp2"}, runs) is None


def test_readme_table_one_line_per_technique_node_workload_and_baseline(tmp_path):
    write_run(tmp_path, "old", [row("dp2", 60_000.0), row("zerodp_dp2", 30_000.0)], "2026-11-26T00:00:00+00:00 commit a:\n")
    write_run(tmp_path, "new", [row("dp2", 60_000.0), row("zerodp_dp2", 54_000.0)], "2026-11-27T00:00:00+00:00 commit b:\n")
    write_run(tmp_path, "tp2_only", [row("tp2", 50_000.0, best=("tp2", 50_000.0)),
                                     row("zerodp_dp2", 55_000.0, best=("tp2", 50_000.0))],
              "2026-11-28T00:00:00+00:00 commit c:\n")
    write_run(tmp_path, "both", [row("tp2", 50_000.0), row("dp2", 60_000.0)], "2026-11-28T00:00:00+00:00 commit c:\n")
    table = summary.readme_table(summary.combine(tmp_path)).splitlines()
    assert table[2] == ("| zerodp | Qwen3-30B-A3B | 2 x H100 | 128 x (8,192 in, 16 out) at once | dp2 | 0.90x | "
                        "0.50-0.90x, median 0.70x (2 runs) | - | new |")  # the last run's ratio, the range of both
    assert table[3] == ("| zerodp | Qwen3-30B-A3B | 2 x H100 | 128 x (8,192 in, 16 out) at once | tp2 | 1.10x | - | "
                        "dp2 (measured above tp2 in both) | tp2_only |")  # another baseline: a line of its own
    assert len(table) == 4


def test_readme_block_is_replaced_and_a_file_without_it_is_one_line(tmp_path):
    text = f"intro\n{summary.README_BEGIN}\nold table\n{summary.README_END}\nrest\n"
    new = summary.with_readme_table(text, [])
    assert new.startswith(f"intro\n{summary.README_BEGIN}\n| technique |") and new.endswith(f"{summary.README_END}\nrest\n")
    assert "old table" not in new and summary.with_readme_table(new, []) == new
    (tmp_path / "run").mkdir()
    (tmp_path / "README.md").write_text("no markers\n")
    with pytest.raises(SystemExit, match="--readme .*README.md: no '<!-- bench.summary --readme: begin -->' line"):
        summary.main([str(tmp_path), "--readme", str(tmp_path / "README.md")])


def test_the_readme_table_is_the_committed_rows_table():
    """The README's "which mode for which workload" table is `readme_table` of the committed summary.json (issue 35:
    written from these rows alone): rerun `python -m sgl_sidp.bench.summary benchmarks/results/multi_gpu
    --models-dir ../shared/models --readme README.md` after a run."""
    repo = Path(__file__).resolve().parents[1]
    rows = json.loads((repo / "benchmarks/results/multi_gpu/summary.json").read_text())
    text = (repo / "README.md").read_text()
    assert summary.with_readme_table(text, rows) == text
