"""scripts/shift_compare.py: configurations, argument checks before any server, the merged report (no servers)."""

import json
import runpy
import types
from pathlib import Path

import pytest

MOD = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts/shift_compare.py"))


def test_commands_follow_the_gpus_and_the_threshold():
    a = types.SimpleNamespace(model="M", gpus="0,1", threshold=512, mem_fraction_static=0.5, extra_args="--x 1")
    launcher, flags = MOD["command"]("shift", a)
    assert launcher == "sgl_sidp.launch_server"
    assert flags[-10:] == ["--tp-size", "2", "--overlay-mode", "shift", "--shift-threshold", "512",
                           "--mem-fraction-static", "0.5", "--x", "1"]
    launcher, flags = MOD["command"]("dp", a)
    assert launcher == "sglang.launch_server" and "--dp-size" in flags and "--shift-threshold" not in flags


def test_bad_arguments_are_refused_before_any_server(tmp_path):
    with pytest.raises(SystemExit, match="unknown configuration 'tp8'"):
        MOD["main"](["--out-dir", str(tmp_path), "--configs", "tp,tp8"])
    with pytest.raises(SystemExit, match="'64\\+2048' is not N\\+P\\+O"):
        MOD["main"](["--out-dir", str(tmp_path), "--configs", "tp", "--burst", "64+2048"])
    with pytest.raises(SystemExit, match="--trace 'azure' is not NAME=REPLAY_ARGS"):
        MOD["main"](["--out-dir", str(tmp_path), "--configs", "tp", "--trace", "azure"])


def test_forwards_by_config_between_two_scrapes():
    def body(base, shift):
        return ("# TYPE sglang:sidp_shift_forwards counter\n"
                f'sglang:sidp_shift_forwards_total{{config="base",tp_rank="0"}} {base}\n'
                f'sglang:sidp_shift_forwards_total{{config="shift",tp_rank="0"}} {shift}\n')

    assert MOD["forwards_by_config"](body(1, 5), body(4, 105)) == {"base": 3.0, "shift": 100.0}


def test_report_puts_ratios_against_tp_and_dp(tmp_path):
    def write(name, kv, ttft, burst, tpot):
        (tmp_path / f"{name}.json").write_text(json.dumps({"config": name, "kv_tokens": kv, "ttft_ms": ttft,
                                                           "burst": {"total_tok_s": burst},
                                                           "low_traffic": {"median_tpot_ms": tpot}, "traces": {}}))

    write("tp", [770642, 770642], {"4096": 600.0}, 18200.0, 15.0)
    write("dp", [264513, 264513], {"4096": 1100.0}, 20000.0, 20.0)
    write("shift", [700000, 700000], {"4096": 540.0}, 19656.0, 15.3)
    shift = json.loads((tmp_path / "shift.json").read_text())
    (tmp_path / "shift.json").write_text(json.dumps({**shift, "forwards": {"burst": {"base": 17.0, "shift": 128.0}}}))
    table = MOD["report"](tmp_path).splitlines()
    assert "| burst: forwards base / shift | - | 17 / 128 | - |" in table
    assert table[0] == "| metric | dp | shift | tp |"
    assert "| TTFT ms, 4,096-token prompt | 1100 (1.83x tp) | 540 (0.90x tp, 0.49x dp) | 600 (0.55x dp) |" in table
    assert any(line.startswith("| burst tok/s (in+out) |") and "19,656 (1.08x tp, 0.98x dp)" in line for line in table)
    MOD["plot"](tmp_path)
    assert (tmp_path / "compare.png").stat().st_size > 10_000
