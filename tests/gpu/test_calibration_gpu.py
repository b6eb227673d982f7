"""Start-up calibration on one GPU (run with `pytest -m gpu`): `--overlay-calibrate` on Qwen3-30B-A3B.

A plain server (`--overlay-mode off`, DP1, TP1) measures its forward times through the same code a ZeroDP
source uses (`sgl_sidp.calibration.startup.ensure_forward_times`), writes the cache, and logs them next to
the bundled H200 table; a second start reads the cache and measures nothing. The log and a facts file go
to $SIDP_GPU_LOGS.
"""

import json
import re

import pytest
import torch

from servers import COMMON, PROMPTS, Server, greedy, model_args, summary

pytestmark = [pytest.mark.gpu]


def test_qwen3_30b_calibration_next_to_bundled_then_cached(log_dir, tmp_path):
    """Next to the bundled table at each of its points (on H200); the second start reuses the cache.

    The issue's bar is 10 %. The calibration times the GPU's forward (a replayed decode graph). The bundled
    table was `bench_one_batch` until 2026-11-24, whose synchronous steps add the step's host work (0.4-1.0 ms,
    measured side by side in benchmarks/results/mechanisms/calibration_1gpu: 0.90-0.97x of bench_one_batch on
    the same GPU); it is now this same start-up calibration, timed pipelined by `plan calibrate` on another H200
    host (`benchmarks/results/plan/calibrate_h200_overlap_2026-11-24/qwen3_30b_a3b/`). The checked band stays
    0.85-1.10 and the README states which points miss 10 %."""
    env = {"SIDP_CALIBRATION_DIR": str(tmp_path / "calibration")}
    args = [*model_args("Qwen3-30B-A3B"), *COMMON, "--overlay-calibrate"]
    with Server("sgl_sidp.launch_server", args, port=22400, log_path=log_dir / "qwen3_30b_calibrate.log",
                env=env, gpus="0") as srv:
        greedy(srv.base_url, PROMPTS[1], n=4)  # it serves after measuring
        log = srv.log_text()
    took = re.search(r"start-up calibration \(cached in .*?\): ([0-9.]+) s, (.*)", log)
    assert took, "no start-up calibration line"
    m = re.search(r"start-up calibration vs bundled \S+ \(.*?\): (.*)", log)
    entry = json.loads(next((tmp_path / "calibration").glob("*.json")).read_text())
    with Server("sgl_sidp.launch_server", args, port=22400, log_path=log_dir / "qwen3_30b_calibrate_cached.log",
                env=env, gpus="0") as srv:
        log2 = srv.log_text()
    ratios = [float(x) for x in re.findall(r"\(([0-9.]+)x\)", m.group(1))] if m else []
    summary(log_dir, "qwen3_30b_calibrate", seconds=float(took.group(1)), measured=took.group(2),
            vs_bundled=m.group(1) if m else None, ratios=ratios, calibration=entry["calibration"],
            second_start_read_cache="start-up calibration read from the cache" in log2)
    assert "start-up calibration read from the cache" in log2 and "start-up calibration (cached" not in log2
    if "H200" not in torch.cuda.get_device_name(0):
        pytest.skip("the bundled table is for H200: the comparison is only checked there")
    assert ratios and all(0.85 <= r <= 1.1 for r in ratios), m.group(1)
