"""`sgl_sidp.plan.verdict`: the start-up line of an explicit mode, its predicted ratio to the best vanilla
configuration (bundled H200 calibrations), a warning where it is predicted to lose, or why there is none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sgl_sidp.plan.verdict import verdict
from sgl_sidp.shift.settings import ShiftSettings
from sgl_sidp.sidp.settings import SiDPSettings
from sgl_sidp.zerodp.settings import ZeroDPSettings

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
pytestmark = pytest.mark.skipif(not (MODELS / "Qwen3-8B").is_dir(), reason="needs ../shared/models")


def test_a_mode_predicted_to_lose_says_so_with_the_ratio_and_the_vanilla_command():
    line, loses = verdict(str(MODELS / "Qwen3-8B"), 1, 2, "NVIDIA H200", "shift", ShiftSettings(sp=2),
                          "offline:512:2048:256")
    assert loses
    assert re.search(r"^sgl-sidp: --overlay-mode shift \(shift_sp2_tp1\): warning: predicted to lose: 0\.\d\dx the "
                     r"throughput of the best vanilla configuration, dp2 \([\d,]+ against [\d,]+ tokens/s\) on "
                     r"offline:512:2048:256 \(2 x H200; predicted by the planner", line)
    assert line.endswith("vanilla `python -m sglang.launch_server --dp-size 2` is predicted to serve this workload better")


def test_a_mode_that_holds_its_own_gets_its_ratio_labelled_predicted():
    line, loses = verdict(str(MODELS / "Qwen3-30B-A3B"), 2, 1, "NVIDIA H200", "zerodp", ZeroDPSettings(),
                          "offline:512:2048:256")
    assert not loses and "warning" not in line
    assert re.search(r"\(zerodp_dp2\) is predicted at \d\.\d\dx the throughput of the best vanilla configuration", line)
    assert "not measured" in line


def test_latency_workloads_compare_median_e2e_and_four_gpus_are_no_longer_an_extrapolation():
    line, loses = verdict(str(MODELS / "Qwen3-8B"), 2, 1, "NVIDIA H200", "sidp", SiDPSettings(service="cas"),
                          "latency:2048:128")
    assert loses and "(sidp_dp2_cas)" in line and "median E2E latency of" in line
    line, _ = verdict(str(MODELS / "Qwen3-8B"), 1, 4, "NVIDIA H200", "shift", ShiftSettings(sp=4),
                      "offline:512:2048:256")
    assert "(shift_sp4_tp1)" in line and "an extrapolation" not in line  # measured on 4 x H200 and 4 x H100


@pytest.mark.parametrize("gpu, dp, why", [
    ("NVIDIA A100-SXM4-80GB", 1, "the planner knows GPU kinds"),
    (None, 1, "not this one"),
    ("NVIDIA H200", 2, "the planner has no configuration of this layout"),  # Shift with DP replicas
])
def test_no_prediction_says_why_and_names_no_number(gpu, dp, why):
    line, loses = verdict(str(MODELS / "Qwen3-8B"), dp, 2, gpu, "shift", ShiftSettings(sp=2), "offline:512:2048:256")
    assert not loses and "no prediction against vanilla SGLang" in line and why in line
    assert not re.search(r"\d\.\d\dx", line)


def test_zerodp_is_predicted_with_the_offload_policy_it_runs():
    """The line names the configuration of ZeroDP's settings (`launched_name`: `_all`, `_pfN`, `_kvN`, none for the
    default decode:1), and the planner predicts that policy's offload set, not another's."""
    from sgl_sidp.plan.technique import technique_named

    z = technique_named("zerodp")
    named = {z.launched_name(2, 1, ZeroDPSettings(**kw)) for kw in ({}, {"layers": "all"},
                                                                   {"expected_batch": "prefill:8192"},
                                                                   {"expected_batch": "kv:2048"},
                                                                   {"expected_batch": "decode:4"}, {"layers": "3,7"})}
    assert named == {"zerodp_dp2", "zerodp_dp2_all", "zerodp_dp2_pf8192", "zerodp_dp2_kv2048", None}
    line, loses = verdict(str(MODELS / "Qwen3-30B-A3B"), 2, 1, "NVIDIA H200", "zerodp", ZeroDPSettings(layers="all"),
                          "offline:512:2048:256")
    assert "(zerodp_dp2_all)" in line and loses  # every layer pulled by a decoding sink: copy-bound


def test_with_slos_the_line_compares_goodput():
    line, loses = verdict(str(MODELS / "Qwen3-8B"), 1, 2, "NVIDIA H200", "shift", ShiftSettings(sp=2),
                          "offline:64:2048:64", (1000.0, 50.0))
    assert re.search(r"\(shift_sp2_tp1\)(: warning: predicted to lose:| is predicted at) \d+\.\d\dx the goodput of "
                     r"the best vanilla configuration, \w+ \([\d.]+ against [\d.]+ req/s under TTFT 1000 ms and TPOT "
                     r"50 ms\) on offline:64:2048:64", line), line
