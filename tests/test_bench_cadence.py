"""`bench.cadence`: the time between a busy server's full prefill chunks, from its log, next to the planner's
simulation of the same replay."""

from pathlib import Path

import pytest

from sgl_sidp.bench.cadence import full_chunk_gaps, main, rows

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT.parent / "shared" / "models"
TRACES = ROOT.parent / "shared" / "traces"


def line(tp: str, new: int, queued: int, rate: float) -> str:
    return (f"[2026-11-28 17:42:14 {tp}] Prefill batch, #new-seq: 4, #new-token: {new}, #cached-token: 0, token usage: "
            f"0.10, #running-req: 9, #queue-req: {queued}, #pending-token: 0, cuda graph: True, input throughput "
            f"(token/s): {rate:.2f}")


def test_gaps_are_full_chunks_back_to_back_with_prompts_queued_per_replay():
    """A chunk's time is its tokens over its line's rate, counted where it and the one before filled the chunk, the
    one before with prompts queued, with no decode line between; each flushed segment (a replay) apart."""
    decode = "[2026-11-28 17:42:15 TP0] Decode batch, #running-req: 9, #token: 100, token usage: 0.01"
    log = "\n".join([
        line("TP0", 8192, 3, 1.0),  # before any flush: a burst, not counted
        "[2026-11-28 17:42:14 TP0] Cache flushed successfully!",
        line("TP0", 8192, 3, 1.0), line("TP0", 8192, 2, 8192 / 0.125),  # 125 ms
        line("TP0", 8192, 0, 8192 / 0.130),  # 130 ms (queued before it)
        line("TP0", 8192, 5, 8192 / 0.5),  # not counted: nothing was queued before it
        decode, line("TP0", 8192, 1, 8192 / 0.9),  # not counted: a decode step between
        line("TP0", 4000, 1, 4000 / 0.05), line("TP0", 8192, 1, 8192 / 0.7),  # not counted: a part chunk before
        line("DP1 TP0", 8192, 9, 8192 / 0.3),  # another replica's line: not read
        "[2026-11-28 17:43:00 TP0] Cache flushed successfully!",
        line("TP0", 8192, 1, 1.0), line("TP0", 8192, 1, 8192 / 0.140),
    ])
    first, second = full_chunk_gaps(log, 8192)
    assert first == pytest.approx([125.0, 130.0]) and second == pytest.approx([140.0])
    assert full_chunk_gaps(log, 4096) == [[], []]


def test_a_dp_server_is_read_from_its_first_replica():
    """Of a server of DP replicas, the first replica's lines ("DP0]", or "DP0 TP0]" with TP) are read; each replica logs
    the flush, and the segments between two flushes hold none of its lines."""
    log = "\n".join([
        "[2026-11-28 17:42:14 DP1] Cache flushed successfully!", "[2026-11-28 17:42:14 DP0] Cache flushed successfully!",
        line("DP0", 8192, 2, 1.0), line("DP1", 8192, 2, 8192 / 0.9), line("DP0", 8192, 1, 8192 / 0.230),
        line("DP0 TP0", 8192, 1, 8192 / 0.240), line("DP1 TP0", 8192, 1, 8192 / 0.9),
    ])
    assert full_chunk_gaps(log, 8192) == [pytest.approx([230.0, 240.0])]


def test_a_committed_shift_replay_against_its_simulation(capsys):
    """`q8_shift_stats_2gpu_h200`: the server's full chunks during the 3x replay against the planner's, each as it ran
    (Shift at its threshold, by NCCL); with `shift.planner.SERVED_BASE_PREFILL` Shift's within 2 %, TP2's within 3 %."""
    if not (MODELS / "Qwen3-8B" / "config.json").is_file() or not (TRACES / "AzureLLMInferenceTrace_code.csv").is_file():
        pytest.skip("needs ../shared/models and ../shared/traces")
    folder = ROOT / "benchmarks" / "results" / "multi_gpu" / "q8_shift_stats_2gpu_h200" / "Qwen3-8B"
    got = {name: (meas, sim) for name, _, meas, _, sim, _ in rows(folder, str(MODELS / "Qwen3-8B"), "H200", TRACES)}
    assert set(got) == {"shift_sp2_tp1_nccl_th1024", "tp2"}
    meas, sim = got["shift_sp2_tp1_nccl_th1024"]
    assert 120 < meas < 135 and sim / meas == pytest.approx(1.0, abs=0.02)
    meas, sim = got["tp2"]
    assert 130 < meas < 145 and sim / meas == pytest.approx(1.0, abs=0.03)
    main([str(folder), "--model-path", str(MODELS / "Qwen3-8B"), "--gpu", "H200", "--trace-dir", str(TRACES)])
    assert "| shift_sp2_tp1_nccl_th1024 | AzureLLMInferenceTrace_code@3x | 127.9 (151) |" in capsys.readouterr().out
