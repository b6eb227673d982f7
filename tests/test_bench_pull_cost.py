"""`bench.pull_cost`: nvidia-smi's lines, the sampler's phases, the table and the refusals (the timing needs GPUs)."""

import json
import sys
import time

from sgl_sidp.bench import pull_cost


def test_smi_lines_parse_and_other_lines_are_skipped():
    assert pull_cost.parse_smi_line("0, 1980, 650.12\n") == (0, 1980.0, 650.12)
    assert pull_cost.parse_smi_line("3, [N/A], 100") is None
    assert pull_cost.parse_smi_line("Failed to query") is None


def test_sampler_stamps_lines_and_gives_each_phase_its_medians():
    lines = "\\n".join(["0, 1980, 600", "1, 1900, 700", "0, 1700, 690", "1, 1910, 710", "junk"])
    fake = [sys.executable, "-c", f"import time; print('{lines}', flush=True); time.sleep(30)"]
    t0 = time.monotonic()
    with pull_cost.SmiSampler([0, 1], command=fake) as s:
        for _ in range(200):
            if len(s.samples) == 4:
                break
            time.sleep(0.05)
    assert len(s.samples) == 4
    got = s.between(t0, time.monotonic())
    assert got == {0: {"sm_mhz": 1840.0, "power_w": 645.0, "samples": 2},
                   1: {"sm_mhz": 1905.0, "power_w": 705.0, "samples": 2}}
    assert s.between(t0 - 10, t0 - 5) == {}


def test_table_shows_the_slowdown_per_gb_and_dashes_what_was_not_sampled():
    rows = [{"gb_per_layer": 0.0, "gap_ms": 0.0, "gap_ms_per_layer": 0.01, "gpu": 0, "gemm_ms_per_layer": 22.0,
             "pull_gb_s": 0.0, "vs_alone": 1.0, "ms_per_gb": None, "sm_mhz": 1980.0, "power_w": 690.0},
            {"gb_per_layer": 1.06, "gap_ms": 3.0, "gap_ms_per_layer": 3.2, "gpu": 0, "gemm_ms_per_layer": 23.5,
             "pull_gb_s": 372.0, "vs_alone": 23.5 / 22, "ms_per_gb": 1.5 / 1.06}]
    out = pull_cost.table(rows).splitlines()
    assert out[2] == "| 0 | 0 (0.01) | 0 | 22.000 | 1.000 | - | 0 | 1980 | 690 |"
    assert out[3] == "| 1.06 | 3 (3.20) | 0 | 23.500 | 1.068 | 1.42 | 372 | - | - |"


def test_cli_refuses_bad_input_in_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    for args, msg in ((["--gb-per-layer", "1,0"], "--gb-per-layer must start with 0"),
                      (["--layers", "0"], "--layers, --reps and --tokens must be 1 or more"),
                      (["--gap-ms", "3"], "--gap-ms must start with 0"),
                      (["--gpus", "0,0"], "name each GPU once"),
                      (["--gpus", "0"], "needs two CUDA GPUs or more")):
        assert pull_cost.main(["--model-path", str(tmp_path), *args]) == 2
        out = capsys.readouterr().out.strip()
        assert out.startswith("bench.pull_cost: error: ") and msg in out and "\n" not in out
    assert pull_cost.main(["--model-path", str(tmp_path / "none")]) == 2
    assert "no config.json" in capsys.readouterr().out
