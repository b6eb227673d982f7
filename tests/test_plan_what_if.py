"""What-ifs (`sgl_sidp.plan.what_if`) are a parameter of the planner, not a patch: a `WhatIf` reaches every shard's
clock and the stream rate of the one plan it is given, and the next plan without it is the calibrated one."""

import argparse
from pathlib import Path

import pytest

from sgl_sidp.plan.planner import plan
from sgl_sidp.plan.steps import ShardClock, find_calibration
from sgl_sidp.plan.what_if import NO_WHAT_IF, WhatIf, add_what_if_args, what_if_from_args

QWEN3_8B = Path(__file__).resolve().parents[2] / "shared" / "models" / "Qwen3-8B"
SIG = "Qwen3ForCausalLM L36 H4096 I12288 A32/8 tp1"


def test_a_clock_takes_the_what_if_s_numbers_and_only_its_own():
    cal = find_calibration(SIG, "NVIDIA H200")[0]
    calibrated = ShardClock(cal, 147_456)
    hand = ShardClock(cal, 147_456, WhatIf(prefix_factor=3.0, host_ms_per_request=0.5))
    assert hand.prefix_factor == 3.0 and hand.host_ms(64) == 32.0
    assert calibrated.what_if == NO_WHAT_IF and calibrated.prefix_factor != 3.0 and calibrated.host_ms(64) != 32.0
    assert ShardClock(cal, 147_456).prefix_factor == calibrated.prefix_factor  # nothing patched on the class
    assert hand != calibrated  # (`steps.shared_clock` never hands one's memo to the other)
    assert calibrated.prefix_factor < 3.0 and hand.prefill_ms([(512, 4096)]) > calibrated.prefill_ms([(512, 4096)])


def test_a_prefill_factor_replaces_the_gpu_kinds_sustained_clock():
    """`WhatIf.prefill_factor`: a prefill's per-token terms at the hand-set factor in place of the GPU kind's
    `PREFILL_SUSTAINED_FACTOR` (1.028 on H200); 1.0 prices what the calibration timed."""
    cal = find_calibration(SIG, "NVIDIA H200")[0]
    served, timed, hand = (ShardClock(cal, 147_456, w) for w in
                           (NO_WHAT_IF, WhatIf(prefill_factor=1.0), WhatIf(prefill_factor=1.1)))
    c, a, b = timed.prefill_fit
    chunk = [(2048, 0)] * 4
    assert timed.prefill_ms(chunk) == pytest.approx(c + a * 8192 + b * 4 * 2048 ** 2)
    assert served.prefill_ms(chunk) == pytest.approx(c + 1.028 * (a * 8192 + b * 4 * 2048 ** 2))
    assert hand.prefill_ms(chunk) == pytest.approx(c + 1.1 * (a * 8192 + b * 4 * 2048 ** 2))


def test_the_flags_build_the_what_if_and_say_so(capsys):
    ap = argparse.ArgumentParser()
    add_what_if_args(ap)
    assert what_if_from_args(ap.parse_args([])) == NO_WHAT_IF and capsys.readouterr().out == ""
    w = what_if_from_args(ap.parse_args(["--stream-tokens-per-s", "12000", "--host-ms-per-request", "0.064"]))
    assert w == WhatIf(stream_tokens_per_s=12000.0, host_ms_per_request=0.064)
    assert capsys.readouterr().out.splitlines()[::2] == [
        "What-if: the tokenizer manager's stream as 12000 tokens/s (steps.stream_tokens_per_s, sim.deliver) on every "
        "shard (set by hand: a sensitivity check, not a prediction)",
        "What-if: the scheduler's host time as 0.064 ms per running request per decode step (ShardClock.host_ms) on "
        "every shard (set by hand: a sensitivity check, not a prediction)"]


def test_a_what_if_moves_its_own_plan_only():
    if not (QWEN3_8B / "config.json").is_file():
        pytest.skip(f"{QWEN3_8B} missing (../shared/models)")
    spec = "offline:256:512:256"
    before = plan(str(QWEN3_8B), 2, "H200", spec)
    slow = plan(str(QWEN3_8B), 2, "H200", spec, what_if=WhatIf(stream_tokens_per_s=5000.0))
    after = plan(str(QWEN3_8B), 2, "H200", spec)
    by = lambda r: {c.name: c for c in r["configurations"]}  # noqa: E731
    assert slow["stream_tokens_per_s"] == 5000.0 and after["stream_tokens_per_s"] == before["stream_tokens_per_s"]
    assert by(slow)["dp2"].total_tok_s < 0.9 * by(before)["dp2"].total_tok_s
    assert after == before
