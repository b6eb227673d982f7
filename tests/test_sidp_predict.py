"""scripts/sidp_predict.py: the pre-run model of SiDP's offline throughput, on the committed Qwen3-32B calibration."""

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CAL = next((ROOT / "benchmarks/results/sidp/calibration_1gpu").glob("*L64_H5120*.json"))



def test_prediction_table(capsys, tmp_path):
    cfg = tmp_path / "config.json"  # Qwen3-32B's shapes
    cfg.write_text('{"num_hidden_layers": 64, "hidden_size": 5120, "intermediate_size": 25600, '
                   '"num_key_value_heads": 8, "num_attention_heads": 64, "head_dim": 128}')
    mod = runpy.run_path(str(ROOT / "scripts/sidp_predict.py"))
    mod["main"]([str(CAL), "--model-config", str(cfg), "--vanilla-kv", "264513", "34748"])
    out = capsys.readouterr().out
    rows = [r for r in out.splitlines() if r.startswith("| budget ") and "variant" not in r]
    assert "FFN layer 0.786 GB, KV 262 KB/token; d=2: 32 layers streamed (25.2 GB per forward), 2 slots" in out
    assert len(rows) == 18 and all(r.endswith("1.00x |") for r in rows if "vanilla DP2" in r)
    # KV gain: 30 freed layers (32 streamed less 2 slots) of 0.786 GB at 262,144 bytes per token
    assert "| SiDP WaS | 354,513 |" in out and "| SiDP WaS | 124,748 |" in out
