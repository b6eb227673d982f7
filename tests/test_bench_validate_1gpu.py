"""`python -m sgl_sidp.bench.validate_1gpu report` (`scripts/plan_validate_1gpu.py`): the planner's one-GPU
predictions next to the committed TP1 measurement of Qwen3-8B on one H200, and a shard served alone reported against
its own config.json."""

import json
from pathlib import Path

import pytest

from sgl_sidp.bench import validate_1gpu

ROOT = Path(__file__).resolve().parents[1]
QWEN3_8B = ROOT.parent / "shared/models/Qwen3-8B"


def test_every_measured_number_stands_beside_its_prediction():
    measured = json.loads((ROOT / "benchmarks/results/plan/validate_1gpu_h200/measured.json").read_text())
    measured = {**measured, "decode": measured["decode"][:2], "burst": None, "traces": {}}  # quick ones
    rows = validate_1gpu.rows(measured, str(QWEN3_8B), "H200")
    assert [what for what, *_ in rows] == [
        "KV tokens (max_total_num_tokens)", *(f"TTFT of one {t:,}-token prompt" for t in (16, 512, 2048, 4096, 8192)),
        "decode step, batch 1, context 304", "decode step, batch 8, context 304"]
    kv = rows[0]
    assert kv[3] == 803502 and kv[2] == pytest.approx(kv[3], rel=0.002)
    # within 5 % but the 16-token prompt, measured at 20.6 and 14.1 ms on two days where the planner says 16.1
    # (`benchmarks/results/plan/README.md`)
    assert all(pred == pytest.approx(meas, rel=0.05) for what, _, pred, meas in rows if " 16-token" not in what)


def test_a_shard_served_alone_is_priced_by_its_own_calibration(tmp_path, capsys):
    shard = ROOT / "benchmarks/results/plan/validate_1gpu_h200_prefix_probes_2026-11-29/Qwen3-8B-tp2-shard"
    out = tmp_path / "run"
    out.mkdir()
    measured = json.loads((shard / "measured.json").read_text())
    (out / "measured.json").write_text(json.dumps({**measured, "traces": {}}))
    validate_1gpu.main(["report", str(out), "--model-path", str(shard)])
    kv = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| KV tokens")]
    pred, meas = (float(x.replace(",", "")) for x in kv[0].split(" | ")[2:4])
    assert pred == pytest.approx(meas, rel=0.01) and meas == measured["kv_tokens"][0]


def test_mixed_and_after_replay_decode_points_send_fresh_prompts_and_are_labelled(monkeypatch):
    """A mixed batch's rows take its prompt lengths in turn; no two prompts of a server share a seed (a seed at two
    lengths is one prefix, a radix hit); the repeat after the replays says so in its row."""
    from types import SimpleNamespace

    from sgl_sidp.bench import batches

    sent = []

    def fake_run_batch(url, bodies):
        sent.extend(ids for ids, _, _ in bodies)
        return [SimpleNamespace(success=True, itl=[0.02] * 8) for _ in bodies], 1.0

    monkeypatch.setattr(batches, "run_batch", fake_run_batch)
    a = SimpleNamespace(decode_contexts=["64", "16/112"], decode_batches=[4], decode_output=8)
    points = []
    validate_1gpu.decode_points("http://x", a, points, lambda: None)
    validate_1gpu.decode_points("http://x", a, points, lambda: None, after="the replays")
    assert [len(x) for x in sent] == [64] * 4 + [16, 112, 16, 112] + [64] * 4 + [16, 112, 16, 112]
    firsts = [tuple(x[:16]) for x in sent]
    assert len(set(firsts)) == len(firsts)  # no shared prefix
    assert [(p["prompt"], p["context_mean"], p.get("prompts"), p.get("after")) for p in points] == [
        (64, 70, None, None), (64, 70, [16, 112], None), (64, 70, None, "the replays"),
        (64, 70, [16, 112], "the replays")]
    assert all(p["step_ms"] == pytest.approx(20.0) for p in points)
    with pytest.raises(ValueError, match="at least 1"):
        validate_1gpu.decode_lengths("2048/0")
    measured = {"kv_tokens": [], "ttft_ms": {}, "decode": points[1:2] + points[3:], "burst": None, "traces": {}}
    labels = [what for what, *_ in validate_1gpu.rows(measured, str(QWEN3_8B), "H200")]
    assert labels == ["decode step, batch 4, context 70 (prompts 16/112)",
                      "decode step, batch 4, context 70 (prompts 16/112), after the replays"]


def test_server_step_ms_reads_the_decode_lines_of_its_batch_past_the_first_half(monkeypatch):
    """`--decode-log-interval 1` lines (SGLang 0.5.17's format): rows / tokens a second, the point's batch only, the
    first half left out (its first line's interval holds the prefills); a point records what its stretch of the log
    says, and a log without such lines gives None."""
    from types import SimpleNamespace

    from sgl_sidp.bench import batches

    def line(n, rate):
        return (f"[2026-11-29 14:23:45] Decode batch, #running-req: {n}, #token: 609249, token usage: 0.76, "
                f"cuda graph: True, gen throughput (token/s): {rate}, #queue-req: 0\n")

    log = (line(512, 1151.46) + line(512, 12800.0) + line(480, 1.0) + line(511, 12775.0) + line(512, 12800.0)
           + line(512, 25600.0))
    assert validate_1gpu.server_step_ms(log, 512) == pytest.approx(40.0)  # 445, 40 | 40, 40, 20 ms; 480 rows: not it
    assert validate_1gpu.server_step_ms(log, 256) is None
    assert validate_1gpu.server_step_ms("Prefill batch, #new-seq: 1", 512) is None

    logs = ["old lines " + line(4, 1.0)]

    def fake_run_batch(url, bodies):
        logs.append(line(4, 200.0) * 4)
        return [SimpleNamespace(success=True, itl=[0.02] * 8) for _ in bodies], 1.0

    monkeypatch.setattr(batches, "run_batch", fake_run_batch)
    a = SimpleNamespace(decode_contexts=["64"], decode_batches=[4], decode_output=8)
    points = []
    validate_1gpu.decode_points("http://x", a, points, lambda: None, log_text=lambda: "".join(logs))
    assert points[0]["server_step_ms"] == pytest.approx(20.0)
    measured = {"kv_tokens": [], "ttft_ms": {}, "decode": points, "burst": None, "traces": {}}
    labels = [what for what, *_ in validate_1gpu.rows(measured, str(QWEN3_8B), "H200")]
    assert labels == ["decode step, batch 4, context 70", "the same step by the server's log"]


def test_stream_probes_record_the_delivered_rate_and_report_it_against_the_planners(monkeypatch):
    """A stream probe keeps the tokens a second of `calibrate.streamed_window`'s window (the output counted, a second
    burst's where the first never streamed long enough) or why nothing was counted; `rows` sets each counted one
    beside the stream rate the planner applies to that output length."""
    from sgl_sidp.plan import calibrate

    answers = iter([(25_600, 10.0, 12.0, 512, 2), "a request failed or was cut short"])
    monkeypatch.setattr(calibrate, "streamed_window", lambda srv, n, p, o, seed: next(answers))
    got = validate_1gpu.stream_point(None, 512, 1024, 256, seed=3)
    assert got == {"requests": 512, "prompt": 1024, "output": 512, "bursts": 2, "window_s": 2.0,
                   "delivered_tokens_per_s": 12_800.0}
    failed = validate_1gpu.stream_point(None, 256, 16, 128, seed=4)
    assert failed == {"requests": 256, "prompt": 16, "output": 128, "error": "a request failed or was cut short"}
    measured = {"kv_tokens": [], "ttft_ms": {}, "decode": [], "stream": [got, failed], "burst": None, "traces": {}}
    (row,) = validate_1gpu.rows(measured, str(QWEN3_8B), "H200")
    from sgl_sidp.plan.planner import stream_rate

    rate = stream_rate(str(QWEN3_8B), "H200", 512)
    assert row == ("stream of 512 x (1,024 in, 512 out) while all decode (the planner's stream rate)", "tok/s", rate,
                   12_800.0)
    assert 10_000 < rate < 30_000  # the bundled H200 probes: 15.6-23.7K
