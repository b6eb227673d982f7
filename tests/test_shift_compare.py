"""scripts/shift_compare.py, retired into `python -m sgl_sidp.bench.compare`: its old flags mapped onto compare's,
what compare cannot run refused before anything starts, and its own committed result folders still pointed at."""

import runpy
from pathlib import Path

import pytest

from sgl_sidp.plan.configs import configuration_named

ROOT = Path(__file__).resolve().parents[1]
MOD = runpy.run_path(str(ROOT / "scripts/shift_compare.py"))


def mapped(*argv):
    return MOD["compare_args"](MOD["parser"]().parse_args(["--out-dir", "OUT", *argv]))


def test_configurations_are_the_planners_names_for_the_gpus_given():
    argv = mapped("--configs", "tp,dp,dp_attn,shift", "--gpus", "0,1,2,3", "--model", "M", "--threshold", "256",
                  "--mem-fraction-static", "0.5", "--extra-args", "--x 1", "--burst", "64+2048+16")
    names = argv[argv.index("--configs") + 1].split(",")
    assert names == ["tp4", "dp4", "dp4_attn", "shift_sp4_tp1_th256"]
    assert all(configuration_named(n).gpus == 4 for n in names)
    assert "--shift-threshold" in configuration_named(names[-1]).launch_flags()
    assert argv[:4] == ["--model-path", "M", "--load-format", "dummy"] and argv[argv.index("--gpus") + 1] == "0,1,2,3"
    assert "--extra-args=--attention-backend triton --sampling-backend pytorch --mem-fraction-static 0.5 --x 1" in argv
    assert argv[-2:] == ["--burst", "64+2048+16"] and argv[argv.index("--port") + 1] == "26000"


def test_traces_become_files_with_one_set_of_replay_arguments():
    argv = mapped("--configs", "tp", "--trace", "az=--trace a.csv --duration-s 60", "--trace",
                  "mc=--duration-s 60 --trace=m.jsonl")
    assert argv[argv.index("--trace-args=--duration-s 60") - 2:] == [
        "--trace", "a.csv", "--trace-args=--duration-s 60", "--trace", "m.jsonl"]
    with pytest.raises(ValueError, match="unlike the first trace's"):
        mapped("--trace", "az=--trace a.csv --duration-s 60", "--trace", "mc=--trace m.jsonl --duration-s 300")
    with pytest.raises(ValueError, match="'azure' is not NAME=REPLAY_ARGS"):
        mapped("--trace", "azure")
    with pytest.raises(ValueError, match="with --trace FILE"):
        mapped("--trace", "azure=--duration-s 60")


@pytest.mark.parametrize("old,why", [("shift_sp1", "no planner configuration"), ("tp_eager_prefill", "--extra-args"),
                                     ("tp8", "unknown configuration 'tp8'")])
def test_configurations_compare_does_not_run_are_refused_before_anything(old, why, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        MOD["main"](["--out-dir", str(tmp_path), "--configs", f"tp,{old}"])
    assert e.value.code == 2 and why in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_print_only_says_the_new_command_and_what_it_drops(capsys):
    assert MOD["main"](["--out-dir", "OUT", "--configs", "tp,shift", "--ttft", "512", "--low-traffic", "4+1024+64",
                        "--burst", "8+64+8", "--print-only"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("shift_compare.py: --ttft ignored: bench.compare has no single-prompt TTFT step")
    assert out[1].startswith("shift_compare.py: --low-traffic ignored")
    assert out[2].endswith("python -m sgl_sidp.bench.compare --model-path .gpu/models/Qwen3-32B --load-format dummy "
                           "--gpus 0,1 --configs tp2,shift_sp2_tp1 --out-dir OUT --port 26000 '--extra-args=--attention-"
                           "backend triton --sampling-backend pytorch' --burst 8+64+8")


def test_report_of_a_committed_folder_points_at_its_table(capsys):
    folder = ROOT / "benchmarks/results/shift/prefill_graphs_1gpu"
    assert MOD["main"](["--report", "--out-dir", str(folder)]) == 0
    assert f"their table is {folder / 'compare.md'}" in capsys.readouterr().out
