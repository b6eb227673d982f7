"""`sgl_sidp.bench.intake`: SGLang's per-request time stats (`ReqTimeStats` log lines) read back per burst."""

from __future__ import annotations

import gzip
import json

import pytest

from sgl_sidp.bench import intake


def line(who, inp, out, queue_ms, entry_s, rid="r"):
    return (f"[2026-11-28 06:53:05 {who}] ReqTimeStats(rid={rid}, input_len={inp}, cached_input_len=0, "
            f"output_len={out}, attempts=0, type=unified): queue_duration={queue_ms:.2f}ms, "
            f"forward_duration=4210.33ms, entry_time={entry_s:.3f}")


def test_lines_are_read_with_their_scheduler():
    text = "\n".join([
        "[2026-11-28 06:53:04 TP0] Prefill batch, #new-seq: 1, #new-token: 2048",
        line("TP0", 2048, 32, 2.1, 100.0), line("DP1", 2048, 32, 0.0, 100.5), line("DP3 TP0", 11, 8, 1.0, 99.0)])
    got = intake.request_times(text)
    assert [(t.scheduler, t.input_len, t.output_len) for t in got] == [("TP0", 2048, 32), ("DP1", 2048, 32),
                                                                      ("DP3", 11, 8)]
    assert got[0].forward_entry_s == pytest.approx(100.0021)
    assert intake.request_times("no stats here") == []


def test_a_tp_burst_taken_in_twice_shows_when_each_part_arrived_and_started():
    """TP4 on 4 x H200 (burst_intake_4gpu_h200): the first request alone at 0, four at 59-61 ms, the rest at 276."""
    warm = [line("TP0", 2048, 4, 0.1, 90.0), line("TP0", 2048, 4, 0.1, 90.1)]  # the rehearsal: 4 output tokens
    first = [line("TP0", 2048, 32, 0.0, 95.0 + k * 1e-3) for k in range(4)]  # an earlier burst of the same shape
    burst = ([line("TP0", 2048, 32, 0.0, 100.0)] + [line("TP0", 2048, 32, 2.0, 100.059) for _ in range(2)]
             + [line("TP0", 2048, 32, 1.0, 100.276)])
    found = intake.bursts(intake.request_times("\n".join(warm + first + burst)), 4, 2048, 32)
    assert [len(b) for b in found] == [4, 4] and found[1][0].entry_s == 100.0
    table = intake.intake_lines(found[1])
    assert table[2] == "| TP0 | 4 | 0 ms: 1, 59 ms: 2, 276 ms: 1 | 0 ms: 1, 61 ms: 2, 277 ms: 1 |"
    assert intake.bursts(intake.request_times("\n".join(burst[:3])), 4, 2048, 32) == []  # cut short: dropped
    with pytest.raises(ValueError):
        intake.intake_lines([])


def test_a_compare_folder_gives_each_configurations_bursts(tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    for name, who in (("dp2", ("DP0", "DP1")), ("tp2", None)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"config": name, "burst": {"spec": "2+2048+32"}}))
        if who:
            with gzip.open(tmp_path / "logs" / f"{name}.log.gz", "wt") as f:
                f.write("\n".join(line(w, 2048, 32, 0.5, 10.0 + i * 0.01) for i, w in enumerate(who)))
    (tmp_path / "dp4.json").write_text(json.dumps({"config": "dp4", "profile": {"spec": "2+2048+32"}}))
    out = "\n".join(intake.folder_lines(tmp_path))
    assert "### dp2, burst 2 x (2048 in, 32 out)" in out and "| DP1 | 1 | 10 ms: 1 | 11 ms: 1 |" in out
    assert "the measured burst, 0.010 s from the first request taken in to the last" in out
    assert out.count("no ReqTimeStats lines of that burst") == 2  # tp2 (no log) and dp4 (a profile's burst)
    assert intake.main([str(tmp_path)]) == 0 and "### tp2" in capsys.readouterr().out
    assert intake.main([str(tmp_path / "nothing")]) == 2
