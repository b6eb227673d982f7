"""`plan calibrate` end to end on one GPU (run with `pytest -m gpu`): Qwen3-8B's shards for two GPUs.

`python -m sgl_sidp.plan calibrate --model-path Qwen3-8B --gpus 2` into an empty $SIDP_CALIBRATION_DIR serves every
shard the configurations on two GPUs need (TP1, the TP2 shard, DP attention over 2), one server on the GPU at a time,
with SGLang's JIT kernels built ahead, and runs the four HTTP probes beside each; `python -m sgl_sidp.plan` then plans
from those entries. How long it takes is a benchmark's business (`benchmarks/results/plan/`
`calibrate_h200_bytecode_2026-11-25/`): the facts file records it, nothing checks it.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from servers import MODELS_DIR, summary

from sgl_sidp.calibration.cache import BUNDLED_DIR

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1200)]  # three servers, one after another, and the probes

#: the shards of Qwen3-8B's configurations on two GPUs (`plan.calibrate.shards_needed`)
SHARDS = ("Qwen3ForCausalLM L36 H4096 I12288 A32/8 tp1", "Qwen3ForCausalLM L36 H4096 I6144 A16/4 tp1",
          "Qwen3ForCausalLM L36 H4096 I6144 A32/8 tp1")


def test_plan_calibrate_times_every_shard_with_its_probes_and_plan_reads_them(log_dir, tmp_path):
    """Every shard "measured", its cache entry holding the decode steps at batches 1-256 and two contexts, the eager
    steps, the prefills up to 8,192 tokens and the four probes' results (request overhead, four prefills over a
    cached prefix, the served step, the stream rate); `plan` reads those entries, not the bundled ones. On H200 the
    TP1 shard's decode steps in graphs are within 0.85-1.10x of the bundled table's."""
    model = MODELS_DIR / "Qwen3-8B"
    if not (model / "config.json").is_file():
        pytest.skip(f"{model} missing: set SIDP_MODELS_DIR")
    cache = tmp_path / "calibration"
    env = {**os.environ, "SIDP_CALIBRATION_DIR": str(cache)}
    cal = subprocess.run([sys.executable, "-m", "sgl_sidp.plan", "calibrate", "--model-path", str(model), "--gpus", "2",
                          "--port", "22500"], env=env, capture_output=True, text=True, timeout=900)
    (log_dir / "plan_calibrate_qwen3_8b.stderr.txt").write_text(cal.stderr)
    for log in cache.glob("*.log"):
        (log_dir / f"plan_calibrate_{log.name}").write_text(log.read_text(errors="replace"))
    assert cal.returncode == 0, cal.stderr[-3000:]
    lines = {sig: next((ln for ln in cal.stdout.splitlines() if ln.startswith(sig + ":")), "") for sig in SHARDS}
    assert all(": measured in" in ln for ln in lines.values()), cal.stdout
    assert "ready ahead" in cal.stderr, cal.stderr[-3000:]

    entries = {}
    for f in cache.glob("*.json"):
        data = json.loads(f.read_text())
        entries[data["calibration"]["model"]] = (f, data)
    assert set(entries) == set(SHARDS)
    for f, data in entries.values():
        c = data["calibration"]
        assert {"1", "4", "16", "32", "64", "128", "256"} <= set(c["decode_ms"]) and c["decode_ms_long"], f
        assert set(c["decode_ms_eager"]) == {"256", "512"} and {"16", "2048", "8192"} <= set(c["prefill_ms"]), f
        assert data["request_overhead_ms"]["median_ms"] > 0 and len(c["prefill_prefix_ms"]) == 4, f
        assert c.get("host_ms_per_request") is not None and "serving_step" in data and "stream" in data, f

    plan = subprocess.run([sys.executable, "-m", "sgl_sidp.plan", "--model-path", str(model), "--gpus", "2",
                           "--workload", "offline:64:512:64", "--json"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert plan.returncode == 0, plan.stderr[-3000:]
    result = json.loads(plan.stdout)
    used = {path for c in result["configurations"] for path in c.get("calibrations", {}).values()}
    assert used and all(str(cache) in p for p in used), used

    tp1 = entries[SHARDS[0]][1]["calibration"]
    bundled = json.loads((BUNDLED_DIR / "h200_qwen3-8b_tp1.json").read_text())
    bundled = bundled.get("calibration", bundled)
    ratios = {b: tp1["decode_ms"][b] / bundled["decode_ms"][b] for b in tp1["decode_ms"] if b in bundled["decode_ms"]}
    summary(log_dir, "plan_calibrate_qwen3_8b", shards=lines, winner=result["winner"],
            tp1_decode_vs_bundled=ratios, calibrate_stderr_tail=cal.stderr[-2000:])
    if "H200" not in torch.cuda.get_device_name(0):
        pytest.skip("the bundled table is for H200: the comparison is only checked there")
    assert ratios and all(0.85 <= r <= 1.1 for r in ratios.values()), ratios
