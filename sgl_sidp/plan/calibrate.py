"""`python -m sgl_sidp.plan calibrate`: time every shard a model's configurations need, on the one GPU at hand.

For each shard not calibrated yet, SGLang serves the model with the shard's sizes (`Shard.override_args` as
`--json-model-override-args`, `--load-format dummy`) through our launcher with `--overlay-calibrate`, which measures the
forwards once SGLang captured its CUDA graphs (decode steps at batches 1-256 and two contexts, one-request prefills;
`sgl_sidp.calibration.measure`) and caches them under the shard's signature; the server is stopped as soon as the
entry appears. One shard at a time, so nothing else runs on the GPU while it is timed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable

from sgl_sidp.calibration.cache import default_cache_dir
from sgl_sidp.calibration.memory import ModelShapes
from sgl_sidp.model_info import read_hf_config
from sgl_sidp.plan.configs import Shard, configurations
from sgl_sidp.plan.steps import find_calibration, shard_roles, shard_signature

#: what the launcher needs on the lent GPU hosts (the wheelhouse has no FlashInfer or FA3)
SERVER_ARGS = ("--attention-backend", "triton", "--sampling-backend", "pytorch")


def shards_needed(hf: dict, n_gpus: int) -> dict[str, Shard]:
    """Signature -> shard of every configuration on `n_gpus` GPUs (each shard once)."""
    shapes = ModelShapes.of(hf)
    out = {}
    for c in configurations(shapes, n_gpus):
        for shard in shard_roles(c, shapes).values():
            out.setdefault(shard_signature(hf, shard), shard)
    return out


#: prompt lengths whose client TTFT, less the calibrated prefill of the same length, is a request's time outside
#: forwards
OVERHEAD_PROMPTS = (512, 2048)


def record_request_overhead(srv, entry: Path, repeats: int = 3) -> str:
    """Once `srv` serves: what a request spends outside forwards before its first token (HTTP server, tokenizer
    manager, scheduler, detokenizer): the median over `repeats` distinct prompts of each `OVERHEAD_PROMPTS` length,
    each sent alone with one output token, of the client TTFT less the calibrated prefill of that length. Written into
    the cache entry `entry` as "request_overhead_ms" (with the TTFTs it comes from)."""
    import numpy as np

    from sgl_sidp.bench.batches import prompts, run_batch

    data = json.loads(entry.read_text())
    prefill = {int(k): v for k, v in data["calibration"]["prefill_ms"].items()}
    srv.wait_ready()
    run_batch(srv.base_url, [(prompts(1, 64, 1)[0], 1, None)])  # warm-up
    ttft, over = {}, []
    for t in (t for t in OVERHEAD_PROMPTS if t in prefill):
        ttft[t] = [o.ttft * 1e3 for ids in prompts(repeats, t, t + 3) for o in run_batch(srv.base_url, [(ids, 1, None)])[0]
                   if o.success]
        over += [v - prefill[t] for v in ttft[t]]
    if not over:
        return "request overhead not measured (no calibrated prefill of those lengths, or every request failed)"
    data["request_overhead_ms"] = {"median_ms": float(np.median(over)), "client_ttft_ms": ttft}
    entry.write_text(json.dumps(data, indent=1))
    return f"request overhead {np.median(over):.1f} ms"


def calibrate(model_path: str, n_gpus: int, gpu_name: str, cache_dir: Path | None = None, port: int = 26500,
              timeout_s: float = 600.0, server: Callable | None = None, log_dir: Path | None = None,
              measure_overhead: bool = True) -> dict[str, str]:
    """Calibrate every missing shard of `model_path` for `n_gpus` GPUs on this host's GPU 0 (named `gpu_name`), and
    record each served shard's request overhead (`record_request_overhead`; `measure_overhead` False: not).

    Returns: signature -> "cached <file>", "measured in N s <file>" or why it failed.
    """
    from sgl_sidp.bench.server import ServerProcess
    from sgl_sidp.launch_server import DEFAULT_MODEL_DIR

    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    hf = read_hf_config(model_path)
    shapes = ModelShapes.of(hf)
    server = server or (lambda args, log: ServerProcess("sgl_sidp.launch_server", args, port=port, log_path=log, gpus="0",
                                                        env={"SIDP_CALIBRATION_DIR": str(cache_dir)}))
    results = {}
    for sig, shard in shards_needed(hf, n_gpus).items():
        found = find_calibration(sig, gpu_name, [cache_dir])
        if found is not None:
            results[sig] = f"cached {found[1]}"
            continue
        args = ["--model-path", model_path, "--load-format", "dummy", "--tokenizer-path", str(DEFAULT_MODEL_DIR),
                "--json-model-override-args", json.dumps(shard.override_args(shapes)), "--overlay-calibrate", *SERVER_ARGS]
        log = (log_dir or cache_dir) / f"calibrate-{sig.replace(' ', '_').replace('/', '-')}.log"
        srv = server(args, log)
        t0 = time.monotonic()
        srv.start()
        try:
            while True:
                found = find_calibration(sig, gpu_name, [cache_dir])
                if found is not None:
                    results[sig] = f"measured in {time.monotonic() - t0:.0f} s {found[1]}"
                    if measure_overhead:
                        results[sig] += f"; {record_request_overhead(srv, found[1])}"
                    break
                if srv.proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                    results[sig] = f"failed: the server {'exited' if srv.proc.poll() is not None else 'timed out'}; see {log}"
                    break
                time.sleep(1.0)
        finally:
            srv.stop()
        print(f"sgl-sidp plan calibrate: {sig}: {results[sig]}", file=sys.stderr, flush=True)
    return results
