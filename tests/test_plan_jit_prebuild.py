"""`plan.jit_prebuild`: the SGLang JIT modules a calibration's shards need, built ahead in a process of their own."""

import importlib
import inspect
import json
import shutil
from pathlib import Path

import pytest

from sgl_sidp.model_info import read_hf_config
from sgl_sidp.plan import jit_prebuild
from sgl_sidp.plan.calibrate import shards_needed
from sgl_sidp.plan.jit_prebuild import BUILDERS, JitModule, jit_modules


def test_qwen3_32b_on_8_gpus_needs_the_modules_its_servers_compiled_on_an_h200(qwen3_32b):
    """The tvm-ffi cache of a fresh H200 host after `plan calibrate --gpus 8` of Qwen3-32B held these modules:
    sgl_kernel_jit_qknorm_128_true_bf16_t, fused_rope_true_128_true_bf16_t_bf16_t, kvcache_{2048,1024,512,256}_..._true,
    activation_bf16_t_true and clamp_position_int64_t (`benchmarks/results/plan/calibrate_h200_jit_2026-11-24/`)."""
    hf = read_hf_config(qwen3_32b)
    kv = {s.kv_heads for s in shards_needed(hf, 8).values()}
    assert kv == {8, 4, 2, 1}
    assert jit_modules(hf, kv) == [
        JitModule(BUILDERS["activation"], ("torch.bfloat16",)), JitModule(BUILDERS["clamp_position"], ("torch.int64",)),
        JitModule(BUILDERS["fused_rope"], (True, 128, "torch.bfloat16", "torch.bfloat16")),
        JitModule(BUILDERS["qknorm"], (128, "torch.bfloat16")),
        *(JitModule(BUILDERS["kvcache"], (r, r)) for r in (2048, 1024, 512, 256))]


def test_an_mla_model_has_no_kv_cache_store_module_and_a_float16_one_builds_in_float16():
    mla = {"hidden_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 2, "vocab_size": 100,
           "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "float16", "partial_rotary_factor": 0.5}
    mods = jit_modules(mla, {8})
    assert BUILDERS["kvcache"] not in {m.builder for m in mods}
    assert mods[0].args == ("torch.float16",) and mods[2].args == (True, 64, "torch.float16", "torch.float16")


def test_every_builder_is_sglangs_with_the_arguments_we_pass():
    """The pinned SGLang's builders: importable on a CPU host, taking the positional arguments `jit_modules` gives, and
    listed in `hooks.USED_SYMBOLS` (so that `scripts/check_next_sglang.py` compares them with a newer SGLang)."""
    from sgl_sidp.hooks import USED_SYMBOLS

    assert {b.replace(":", ".") for b in BUILDERS.values()} <= {u.path for u in USED_SYMBOLS}
    hf = {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
          "num_hidden_layers": 2, "vocab_size": 100}
    mods = jit_modules(hf, {2}, tp_sizes=(1, 2, 4))
    assert {m.builder for m in mods} == set(BUILDERS.values())
    assert [m.args for m in mods if m.builder == BUILDERS["all_reduce"]] == [("torch.bfloat16", 2), ("torch.bfloat16", 4)]
    assert not {BUILDERS["all_reduce"], BUILDERS["communicator"]} & {m.builder for m in jit_modules(hf, {2}, (1,))}
    for m in mods:
        module, name = m.builder.split(":")
        fn = getattr(importlib.import_module(module), name)
        inspect.signature(fn).bind(*m.args)  # raises TypeError where the arguments no longer fit


def test_start_builds_each_module_in_its_own_process_and_reports(tmp_path, monkeypatch):
    """With stand-in builders from the standard library: one succeeds, one fails (named in the report), one makes a
    module folder in the tvm-ffi cache, and a module that appears after the process finished is named as one the
    servers compiled."""
    cache = tmp_path / "tvm"
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(cache))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.so").write_bytes(b"")
    mods = [JitModule("math:hypot", (3, 4)), JitModule("math:sqrt", (-1,)),
            JitModule("shutil:copytree", (str(src), str(cache / "sgl_kernel_jit_a__arch_9.0a")))]
    pre = jit_prebuild.start(mods, (9, 0), tmp_path / "logs")
    assert pre.proc.wait(timeout=120) == 0, (tmp_path / "logs" / "jit-prebuild.log").read_text()
    shutil.copytree(src, cache / "sgl_kernel_jit_b__arch_9.0a")  # a server's own build
    line = pre.report()
    assert line.startswith("SGLang's JIT kernels: 2 of 3 ready ahead, 1 of them compiled here"), line
    assert "failed: sqrt(-1,): ValueError: math domain error" in line
    assert line.endswith("the servers compiled 1 more: sgl_kernel_jit_b__arch_9.0a"), line
    rows = [json.loads(r) for r in (tmp_path / "logs" / "jit-prebuild.jsonl").read_text().splitlines()]
    assert rows[-1]["new"] == ["sgl_kernel_jit_a__arch_9.0a"]


def test_a_prebuild_that_did_not_finish_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(tmp_path / "tvm"))
    pre = jit_prebuild.start([JitModule("time:sleep", (60,))], (9, 0), tmp_path)
    pre.stop()
    assert "failed: it did not finish" in pre.report()


def test_calibrate_builds_the_jit_modules_of_the_shards_it_serves_while_they_start(qwen3_8b, tmp_path, monkeypatch,
                                                                                  capsys):
    """`calibrate` with this GPU's capability starts one prebuild, for the KV heads of the shards it serves (none for
    those cached), before the first server, and prints its report; without a capability, none."""
    from sgl_sidp.plan import calibrate as cal

    order = []

    class Pre:
        def stop(self):
            order.append("stop")

        def report(self):
            return "prebuild report"

    def start(modules, capability, log_dir):
        order.append(("start", capability, sorted(m.args[0] for m in modules if m.builder == BUILDERS["kvcache"])))
        return Pre()

    def server(args, log):
        order.append("server")
        return _Exits()

    monkeypatch.setattr(jit_prebuild, "start", start)
    cal.calibrate(qwen3_8b, 4, "NVIDIA H200", cache_dir=tmp_path, server=server, measure_overhead=False,
                  jit_capability=(9, 0))
    # Qwen3-8B: KV heads of 128 in bf16, 8 on the TP1 and DP-attention shards, 4 on TP2, 2 on TP4 (2 bytes each)
    assert order[0] == ("start", (9, 0), [512, 1024, 2048]) and order[1] == "server" and order[-1] == "stop"
    assert "sgl-sidp plan calibrate: prebuild report" in capsys.readouterr().err
    order.clear()
    cal.calibrate(qwen3_8b, 4, "NVIDIA H200", cache_dir=tmp_path, server=server, measure_overhead=False)
    assert "stop" not in order and not any(isinstance(o, tuple) for o in order)


class _Exits:
    """A shard's server that exits at once."""

    def __init__(self):
        self.proc = self

    def poll(self):
        return 1

    def start(self):
        pass

    def stop(self):
        pass


def _model(name: str) -> str:
    path = Path(__file__).resolve().parents[2] / "shared" / "models" / name
    if not (path / "config.json").is_file():
        pytest.skip(f"{path} missing (../shared/models)")
    return str(path)


@pytest.fixture
def qwen3_32b():
    return _model("Qwen3-32B")


@pytest.fixture
def qwen3_8b():
    return _model("Qwen3-8B")
