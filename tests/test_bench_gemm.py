"""`bench.gemm`: one layer's GEMMs in the shapes DP, TP and Shift's base give them (CPU: shapes, not timings)."""

import json

import pytest

from sgl_sidp.bench import gemm

TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
        "num_hidden_layers": 3, "vocab_size": 128}


def test_sweeps_rotate_the_order_and_keep_the_median(monkeypatch):
    """Each size's configurations are timed in turn, the first of a sweep moving on each sweep: a GPU whose clock
    drifts with its load then favours none of them."""
    order, fake = [], iter([5.0, 1.0, 1.0, 3.0, 2.0, 2.0, 4.0, 3.0, 3.0])
    monkeypatch.setattr(gemm, "layer_gemms", lambda shape, c, *a: c)
    monkeypatch.setattr(gemm, "time_ms", lambda fns, *a: (order.append(fns), next(fake))[1])
    rows = gemm.measure(gemm.LayerShape.of(TINY), [16], 2, sweeps=3)
    assert order == ["dp", "tp", "sp", "tp", "sp", "dp", "sp", "dp", "tp"]
    got = {r["config"]: (r["ms_per_layer"], round(r["spread"], 3)) for r in rows}
    assert got == {"dp": (3.0, 1.0), "tp": (3.0, 0.667), "sp": (2.0, 1.5)}


def test_every_configuration_does_the_same_flops_per_token_in_its_own_shapes():
    shape = gemm.LayerShape.of(TINY)
    assert shape == gemm.LayerShape(hidden=64, qkv=(4 + 4) * 16, attn_out=64, inter=96)
    rows = gemm.measure(shape, [8, 16], 2, warmup=1, iters=2)
    assert [(r["tokens"], r["config"]) for r in rows] == [(t, c) for t in (8, 16) for c in gemm.CONFIGURATIONS]
    assert all(r["ms_per_layer"] > 0 and r["tflops_per_gpu"] > 0 and r["spread"] >= 0 for r in rows)
    import torch

    # the outputs: TP's shards are 1/P of N or K; Shift's base runs half the rows whole, its QKV as P blocks
    dp, tp, sp = (gemm.layer_gemms(shape, c, 16, 2, torch.float32, "cpu") for c in gemm.CONFIGURATIONS)
    assert [f().shape for f in dp] == [(16, 128), (16, 64), (16, 192), (16, 64)]
    assert [f().shape for f in tp] == [(16, 64), (16, 64), (16, 96), (16, 64)]
    assert [f().shape for f in sp] == [(2, 8, 64), (8, 64), (8, 192), (8, 64)]


def test_cli_prints_the_table_and_refuses_what_it_cannot_time(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    assert gemm.main(["--model-path", str(tmp_path), "--tokens", "8,16", "--iters", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "| 16 | Shift base SP2 |" in out and "| 8 | DP (whole weights) |" in out and "(1.00x) |" in out
    assert gemm.main(["--model-path", str(tmp_path), "--sweeps", "0"]) == 2
    assert capsys.readouterr().out.strip() == "bench.gemm: error: --sweeps must be 1 or more"
    assert gemm.main(["--model-path", str(tmp_path), "--tokens", "7"]) == 2
    assert capsys.readouterr().out.strip() == "bench.gemm: error: --gpus must be 1 or more and --tokens multiples of it (--gpus 2)"
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "num_experts": 8}))
    assert gemm.main(["--model-path", str(tmp_path)]) == 2
    assert "an MoE model" in capsys.readouterr().out
    with pytest.raises(ValueError):
        gemm.LayerShape.of({**TINY, "num_local_experts": 8})
