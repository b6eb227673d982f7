"""`bench.a2a`: Shift's two all-to-alls per layer, checked on gloo (the copies into peers' memory need CUDA)."""

import json

from sgl_sidp.bench import a2a

TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
        "num_hidden_layers": 3, "vocab_size": 128}


def test_block_widths_are_a_shift_shards_qkv_and_heads():
    assert a2a.block_widths(TINY, 2) == ((2 + 2 * 1) * 16, 2 * 16)
    assert a2a.block_widths(TINY, 4) == ((1 + 2 * 1) * 16, 16)  # 2 KV heads on 4 GPUs: replicated, one each
    qwen3_8b = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                "num_hidden_layers": 36, "vocab_size": 151936}
    assert a2a.block_widths(qwen3_8b, 2) == (3072, 2048)


def test_the_exchange_is_checked_and_timed_on_gloo(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    assert a2a.main(["--model-path", str(tmp_path), "--tokens", "8", "--iters", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "| 8 | nccl | yes |" in out and "| 8 | copy | not run (needs CUDA) |" in out
    assert a2a.main(["--model-path", str(tmp_path), "--gpus", "3", "--tokens", "6"]) == 2
    assert capsys.readouterr().out.strip() == "bench.a2a: error: 4 attention heads do not split over 3 GPUs"
    assert a2a.main(["--model-path", str(tmp_path), "--tokens", "9"]) == 2
    assert "--tokens multiples of it" in capsys.readouterr().out


def test_one_layer_with_its_exchanges_is_checked_on_gloo(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    assert a2a.main(["--model-path", str(tmp_path), "--tokens", "8", "--iters", "1", "--warmup", "0", "--layer"]) == 0
    out = capsys.readouterr().out
    assert "| 8 | gemms | yes |" in out and "| 8 | nccl | yes |" in out
    assert "| 8 | overlap | not run (needs CUDA) | - | - | - | - |" in out
