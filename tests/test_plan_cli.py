"""`python -m sgl_sidp.plan`: the JSON keys scripts rely on, the table, the PNG, and one line with exit code 2 for
bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_sidp.plan.__main__ import main, plan

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
KEYS = {"name", "technique", "dp", "tp", "sp", "weights_gb_per_gpu", "kv_tokens_total", "decode_step_ms", "prefill_ms",
        "total_tok_s", "output_tok_s", "ttft_ms_p50", "tpot_ms_p50", "ttft_ms_p99", "tpot_ms_p99"}


@pytest.fixture
def qwen3_8b():
    path = MODELS / "Qwen3-8B"
    if not (path / "config.json").is_file():
        pytest.skip(f"{path} missing (../shared/models)")
    return str(path)


def test_json_keeps_the_keys_scripts_rely_on(qwen3_8b):
    r = plan(qwen3_8b, 2, "H200", "offline:32:1024:64")
    by = {c["name"]: c for c in r["configurations"]}
    predicted = {n for n, c in by.items() if "total_tok_s" in c}
    # bundled H200 shards: every configuration of 2 GPUs but DP attention (its 2-way shard is not bundled)
    assert r["predicted"] is True and predicted == set(by) - {"dp2_attn"} and r["winner"] in predicted
    assert {c["technique"] for c in by.values()} == {"vanilla", "dp_attention", "sidp", "shift"}
    assert r["launch"][:3] == ["python", "-m", "sgl_sidp.launch_server"] and r["objective"] == "throughput"
    for name in predicted:
        assert KEYS <= set(by[name]) and set(by[name]["decode_step_ms"]) >= {"256", "2048"}
    assert all("not_predicted" in c for n, c in by.items() if n not in predicted)
    assert all({"name", "technique", "dp", "tp", "sp", "weights_gb_per_gpu", "kv_tokens_total"} <= set(c) for c in by.values())


def test_table_and_png_label_every_number_predicted(qwen3_8b, tmp_path, capsys):
    main(["--model-path", qwen3_8b, "--gpus", "2", "--workload", "latency:512:16", "--png", str(tmp_path / "p.png")])
    out = capsys.readouterr().out
    assert out.startswith("Predicted for ") and "(every number below is a prediction)" in out and "Winner (predicted)" in out
    assert (tmp_path / "p.png").stat().st_size > 10_000


@pytest.mark.parametrize("args, says", [
    (["--model-path", "/nonexistent", "--gpus", "2"], "no config.json there"),
    (["--gpus", "2", "--gpu", "A10"], "known kinds are"),
    (["--gpus", "2", "--workload", "burst:3"], "expected offline:S:IN:OUT"),
    (["--gpus", "2", "--workload", "trace:/nonexistent.csv"], "--workload trace:/nonexistent.csv"),
    (["--gpus", "0"], "at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(qwen3_8b, args, says):
    argv = args if "--model-path" in args else ["--model-path", qwen3_8b, *args]
    out = subprocess.run([sys.executable, "-m", "sgl_sidp.plan", *argv], capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("sgl-sidp plan: error: ") and says in lines[0], out.stderr


def test_no_calibration_of_any_shard_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024,
        "intermediate_size": 3072, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 64, "vocab_size": 4096}))
    with pytest.raises(SystemExit) as e:
        main(["--model-path", str(tmp_path), "--gpus", "1"])
    assert e.value.code == 2


class _FakeServer:
    """Stands in for a shard's SGLang server: "measures" by writing the cache entry the launcher would."""

    def __init__(self, cache, sig, exits=False):
        self.cache, self.sig, self.exits, self.proc = cache, sig, exits, self

    def poll(self):
        return 1 if self.exits else None

    def start(self):
        if not self.exits:
            entry = {"model": self.sig, "gpu": "NVIDIA H200", "decode_ms": {"1": 5.0}, "prefill_ms": {"512": 9.0}}
            (self.cache / f"{len(list(self.cache.glob('*')))}.json").write_text(json.dumps({"key": {}, "calibration": entry}))

    def stop(self):
        pass


def test_calibrate_times_each_missing_shard_once(qwen3_8b, tmp_path):
    from sgl_sidp.calibration.memory import ModelShapes
    from sgl_sidp.model_info import read_hf_config
    from sgl_sidp.plan.calibrate import calibrate, shards_needed

    needed = shards_needed(read_hf_config(qwen3_8b), 4)  # tp1 (dp4), tp2 (tp2_dp2), tp4, dp4_attn
    assert len(needed) == 4 and all(s.endswith("tp1") for s in needed)
    shapes = ModelShapes.of(read_hf_config(qwen3_8b))
    by_args = {json.dumps(shard.override_args(shapes)): sig for sig, shard in needed.items()}
    started = []

    def server(args, log):
        sig = by_args[args[args.index("--json-model-override-args") + 1]]
        started.append(sig)
        return _FakeServer(tmp_path, sig, exits="I6144" in sig)  # the tp2 shard's server dies

    res = calibrate(qwen3_8b, 4, "NVIDIA H200", cache_dir=tmp_path, server=server, measure_overhead=False)
    assert sorted(started) == sorted(needed)
    assert sum(v.startswith("measured") for v in res.values()) == 3 and sum(v.startswith("failed") for v in res.values()) == 1
    again = calibrate(qwen3_8b, 4, "NVIDIA H200", cache_dir=tmp_path, server=server, measure_overhead=False)
    assert sum(v.startswith("cached") for v in again.values()) == 3 and len(started) == 5  # only the failed one retried
