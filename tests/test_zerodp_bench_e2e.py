"""scripts/zerodp_compare.py end to end on CPU: the retired script's old flags through `python -m sgl_sidp.bench.compare`
against stand-in servers (`tests/fake_sglang.py`, loopback only): the exactness call, then vanilla and ours side by
side on their own GPUs, into one results folder and one report."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

from sgl_sidp.bench import compare
from sgl_sidp.bench.batches import free_port

HERE = Path(__file__).resolve().parent
MOE = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
       "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 4096,
       "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "num_experts": 8, "num_experts_per_tok": 2,
       "moe_intermediate_size": 256, "decoder_sparse_step": 1, "mlp_only_layers": []}


def test_old_flags_run_exactness_then_both_servers_side_by_side(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compare, "LAUNCHERS", {k: "fake_sglang" for k in compare.LAUNCHERS})
    monkeypatch.setenv("PYTHONPATH", f"{HERE}:{HERE.parent}")
    model = tmp_path / "qwen3-moe"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MOE))
    out = tmp_path / "res"
    zc = runpy.run_path(str(HERE.parent / "scripts" / "zerodp_compare.py"))
    rc = zc["main"](["--model-path", str(model), "--out-dir", str(out), "--vanilla-port", str(free_port()),
                     "--ready-timeout-s", "60", "--exactness", "2", "--exactness-new-tokens", "4", "--decode-heavy", "8",
                     "--decode-heavy-input-len", "16", "--decode-heavy-output-len", "6"])
    assert rc == 0, capsys.readouterr().out
    said = [line for line in capsys.readouterr().out.splitlines() if "is retired into" in line]
    assert len(said) == 2 and "--exact" in said[0] and "--parallel" in said[1]
    res = {n: json.loads((out / "qwen3-moe" / f"{n}.json").read_text()) for n in ("tp1", "dp2", "zerodp_dp2")}
    assert res["zerodp_dp2"]["kv_tokens"] == {"0": 1000, "1": 3000} and res["dp2"]["kv_tokens"] == {"0": 1000, "1": 1000}
    assert set(res["zerodp_dp2"]["exact"]["ranks"]) == {"0", "1"} and "exact" not in res["dp2"]
    assert (res["dp2"]["gpus"], res["zerodp_dp2"]["gpus"]) == ("0,1", "2,3")  # vanilla on its GPUs, ours on its own
    assert all(res[n]["burst"]["spec"] == "8+16+6" and res[n]["burst"]["failed"] == 0 for n in ("dp2", "zerodp_dp2"))
    md = (out / "compare.md").read_text()
    assert "bit-identical" in md and "vs tp1" in md and "| zerodp_dp2 | " in md
    # the other retired scripts' --report of a compare folder is compare's report
    sidp = runpy.run_path(str(HERE.parent / "scripts" / "sidp_compare.py"))
    (out / "compare.md").unlink()
    assert sidp["main"](["--report", "--out-dir", str(out)]) == 0
    assert (out / "compare.md").read_text() == md and "compare --report --out-dir" in capsys.readouterr().out
