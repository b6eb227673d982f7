"""Build SGLang's JIT CUDA kernels for a calibration's shards ahead, all at once, while its first server starts.

SGLang 0.5.17 compiles some of its CUDA kernels on first use (`sglang.kernels.jit.utils.compile.load_jit`: nvcc through
tvm-ffi, cached per module and GPU arch under `$TVM_FFI_CACHE_DIR`, default `~/.cache/tvm-ffi`), one after another
inside a server's CUDA-graph capture and its first request. On a fresh H200 host that was 82 s of one Qwen3-32B
`plan calibrate --gpus 8`, on its critical path: 44 s in the TP1 shard's first prefill capture (Q/K norm, rotary
embedding, KV-cache store, SiLU-and-mul), 9 s before its first request (position clamp), and 9-10 s in each of the
TP2, TP4 and TP8 shards (a KV-cache store kernel per KV row width). `start` builds the same modules with SGLang's own
builders in a separate process, one thread per module, during the first server's CPU start-up (about 50 s there). A
module being built when a server reaches it waits on tvm-ffi's lock file of that module and is then loaded, so the
result is the same either way; a kernel not in `jit_modules` is still compiled by the server that needs it (the
report says which ones were).

The process sees no GPU (`CUDA_VISIBLE_DEVICES` empty: it must not hold a CUDA context while a server sizes its KV
pool) and runs at nice 10 (the servers' CPU start-up comes first); the target comes from the GPU's compute capability
(NVML) through SGLang's `override_jit_cuda_arch`, so the modules land where a server of that GPU looks for them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from sgl_sidp.calibration.memory import ModelShapes, dtype_bytes

#: SGLang 0.5.17's JIT module builders that a dense or MoE decoder's forward and its first request reach, each
#: compiling on its first call with given arguments (`cache_once`)
BUILDERS = {
    "activation": "sglang.kernels.ops.activation.activation:activation_module",  # SiLU-and-mul: (dtype)
    "clamp_position": "sglang.kernels.ops.attention.clamp_position:_jit_clamp_position_module",  # (int64)
    "fused_rope": "sglang.kernels.ops.attention.rope:_jit_fused_rope_module",  # (is_neox, rope_dim, dtype, q dtype)
    "qknorm": "sglang.kernels.ops.layernorm.norm:_jit_qknorm_module",  # (head_dim, dtype)
    "kvcache": "sglang.kernels.ops.kvcache.kvcache:_jit_kvcache_module",  # (K row bytes, V row bytes)
    # a TP group's custom all-reduce (TP > 1): its kernel per (dtype, world size), its communicator and CUDA-IPC
    # classes (built and registered on first use); a fresh 2 x H100 host's servers compiled these three themselves
    "all_reduce": "sglang.kernels.ops.communication.all_reduce:get_all_reduce_module",  # (dtype, world size)
    "communicator": "sglang.kernels.ops.communication.all_reduce:_init_communicator",  # ()
    "cuda_ipc": "sglang.kernels.ops.communication.all_reduce:_init_ipc_manager",  # ()
}


@dataclasses.dataclass(frozen=True)
class JitModule:
    """One SGLang JIT module: `builder` ("module:function", a `BUILDERS` value) called with `args` (a string
    "torch.X" stands for the dtype torch.X)."""
    builder: str
    args: tuple


def jit_modules(hf: dict, kv_heads: Iterable[int], tp_sizes: Iterable[int] = ()) -> list[JitModule]:
    """The JIT modules SGLang 0.5.17 compiles for the shards of `hf` (a config.json) whose KV heads per GPU are
    `kv_heads`, in the model's dtype: SiLU-and-mul, the position clamp of the first request, the rotary embedding
    (NeoX style, over head_dim x partial_rotary_factor), the Q/K norm (built for every model: an unused module costs a
    thread here, nothing on the GPU), one KV-cache store per KV row width (KV heads x head_dim x element bytes;
    none for MLA), and for servers whose TP groups have `tp_sizes` GPUs (sizes above 1) SGLang's custom all-reduce of
    each size with its communicator and CUDA-IPC classes. A shard's JIT kernels outside this list are still compiled by its server, on first use; on one
    H200 the servers of Qwen3-32B, Qwen3-30B-A3B and Llama-3.1-70B compiled none
    (`benchmarks/results/plan/calibrate_h200_jit_2026-11-24/`)."""
    cfg = hf.get("text_config", hf)
    shapes = ModelShapes.of(hf)
    name = str(cfg.get("torch_dtype") or cfg.get("dtype")).removeprefix("torch.")
    dtype = {"float16": "torch.float16", "half": "torch.float16", "float32": "torch.float32",
             "float": "torch.float32"}.get(name, "torch.bfloat16")
    rope_dim = int(shapes.head_dim * float(cfg.get("partial_rotary_factor") or 1.0))
    out = [JitModule(BUILDERS["activation"], (dtype,)), JitModule(BUILDERS["clamp_position"], ("torch.int64",)),
           JitModule(BUILDERS["fused_rope"], (True, rope_dim, dtype, dtype)),
           JitModule(BUILDERS["qknorm"], (shapes.head_dim, dtype))]
    if not shapes.mla:
        rows = sorted({k * shapes.head_dim * dtype_bytes(cfg) for k in kv_heads}, reverse=True)
        out += [JitModule(BUILDERS["kvcache"], (r, r)) for r in rows]
    sizes = sorted({int(t) for t in tp_sizes if int(t) > 1})
    if sizes:
        out += [JitModule(BUILDERS["communicator"], ()), JitModule(BUILDERS["cuda_ipc"], ())]
        out += [JitModule(BUILDERS["all_reduce"], (dtype, t)) for t in sizes]
    return out


def cache_root() -> Path:
    """Where tvm-ffi keeps SGLang's JIT modules (`load_jit`'s default)."""
    return Path(os.environ.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi")).expanduser()


def built_modules(root: Path | None = None) -> set[str]:
    """Names of the JIT modules in the cache `root` (default `cache_root()`) that have their shared library."""
    root = root or cache_root()
    return {d.name for d in root.glob("sgl_kernel_jit_*") if any(d.glob("*.so"))} if root.is_dir() else set()


class Prebuild:
    """A running `start`: `stop()` ends it, `report()` says what it built."""

    def __init__(self, proc: subprocess.Popen, results: Path, before: set[str]):
        self.proc, self.results, self.before = proc, results, before

    def stop(self) -> None:
        """Kill it if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def report(self) -> str:
        """One line: how many modules it made ready and compiled, which failed, and which modules the servers
        compiled themselves (in the cache now and not when it finished: the first server reaches its first JIT
        kernel after it, 55 s after its launch on a fresh H200 host)."""
        rows = [json.loads(line) for line in self.results.read_text().splitlines()] if self.results.exists() else []
        end = next((r for r in rows if "after" in r), None)
        rows = [r for r in rows if "builder" in r]
        done = [r for r in rows if not r.get("error")]
        line = (f"SGLang's JIT kernels: {len(done)} of {len(rows)} ready ahead, "
                f"{len(end['new']) if end else 0} of them compiled here, the last "
                f"{max((r['end_s'] for r in done), default=0):.0f} s after the start")
        failed = [f"{r['builder'].split(':')[1]}{tuple(r['args'])}: {r['error']}" for r in rows if r.get("error")]
        if failed or end is None:
            line += f"; failed: {'; '.join(failed) or f'it did not finish (exit {self.proc.poll()}), see jit-prebuild.log'}"
        theirs = sorted(built_modules() - set(end["after"] if end else self.before))
        return line + (f"; the servers compiled {len(theirs)} more: {', '.join(theirs)}" if theirs else "")


def start(modules: Iterable[JitModule], capability: tuple[int, int], log_dir: Path) -> Prebuild:
    """Build `modules` for a GPU of compute `capability` (major, minor) in a new process with no GPU visible, one
    thread per module (at most half this host's cores); its output goes to `log_dir`/jit-prebuild.log, one result per
    module to `log_dir`/jit-prebuild.jsonl."""
    log_dir.mkdir(parents=True, exist_ok=True)
    results = log_dir / "jit-prebuild.jsonl"
    results.unlink(missing_ok=True)
    spec = json.dumps({"capability": list(capability), "modules": [[m.builder, list(m.args)] for m in modules],
                       "results": str(results), "threads": max(1, (os.cpu_count() or 2) // 2), "t0": time.time()})
    before = built_modules()
    with open(log_dir / "jit-prebuild.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sgl_sidp.plan.jit_prebuild", spec], stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    return Prebuild(proc, results, before)


def build(spec: dict) -> None:
    """`start`'s process: build each module of `spec` with SGLang's builder under SGLang's `override_jit_cuda_arch`,
    appending {"builder", "args", "s", "end_s" (since `start`), "error"} per module to spec["results"] as it finishes, then
    {"new": the modules that appeared in the cache meanwhile, "after": all of them}."""
    import importlib
    import threading

    os.nice(10)  # the servers' CPU start-up first: it is the calibration's critical path, this is not
    import torch
    from sglang.kernels.jit.utils.arch import make_jit_cuda_arch, override_jit_cuda_arch

    major, minor = spec["capability"]
    # tvm-ffi reads the target from here; SGLang's `_jit_compile_context` sets and restores it around each build,
    # which would race between threads were it not set to the same value already
    os.environ["TVM_FFI_CUDA_ARCH_LIST"] = make_jit_cuda_arch(major, minor).target_name
    lock = threading.Lock()

    def one(builder: str, args: list) -> None:
        t = time.monotonic()
        row = {"builder": builder, "args": args}
        try:
            module, name = builder.split(":")
            fn = getattr(importlib.import_module(module), name)
            fn(*(getattr(torch, a[6:]) if isinstance(a, str) and a.startswith("torch.") else a for a in args))
        except Exception as e:  # noqa: BLE001 - reported per module; the server compiles it itself then
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        row.update(s=round(time.monotonic() - t, 2), end_s=round(time.time() - spec["t0"], 2))
        with lock, open(spec["results"], "a") as f:
            f.write(json.dumps(row) + "\n")

    before = built_modules()
    with override_jit_cuda_arch(major, minor), ThreadPoolExecutor(spec["threads"]) as pool:
        for f in [pool.submit(one, b, a) for b, a in spec["modules"]]:
            f.result()
    after = built_modules()
    with open(spec["results"], "a") as f:
        f.write(json.dumps({"new": sorted(after - before), "after": sorted(after)}) + "\n")


if __name__ == "__main__":
    build(json.loads(sys.argv[1]))
