"""`python -m sgl_sidp.plan calibrate`: time every shard a model's configurations need, on the one GPU at hand.

For each shard not calibrated yet, SGLang serves the model with the shard's sizes (`Shard.override_args` as
`--json-model-override-args`, `--load-format dummy`) through our launcher with `--sidp-calibrate`, which measures the
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
from sgl_sidp.plan.steps import MODELLED, find_calibration, shard_signature

#: what the launcher needs on the lent GPU hosts (the wheelhouse has no FlashInfer or FA3)
SERVER_ARGS = ("--attention-backend", "triton", "--sampling-backend", "pytorch")


def shards_needed(hf: dict, n_gpus: int) -> dict[str, Shard]:
    """Signature -> shard of every modelled configuration on `n_gpus` GPUs (each shard once)."""
    shapes = ModelShapes.of(hf)
    out = {}
    for c in configurations(shapes, n_gpus):
        if c.technique in MODELLED:
            shard = c.shards(shapes)["forward"]
            out.setdefault(shard_signature(hf, shard), shard)
    return out


def calibrate(model_path: str, n_gpus: int, gpu_name: str, cache_dir: Path | None = None, port: int = 26500,
              timeout_s: float = 600.0, server: Callable | None = None, log_dir: Path | None = None) -> dict[str, str]:
    """Calibrate every missing shard of `model_path` for `n_gpus` GPUs on this host's GPU 0 (named `gpu_name`).

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
                "--json-model-override-args", json.dumps(shard.override_args(shapes)), "--sidp-calibrate", *SERVER_ARGS]
        log = (log_dir or cache_dir) / f"calibrate-{sig.replace(' ', '_').replace('/', '-')}.log"
        srv = server(args, log)
        t0 = time.monotonic()
        srv.start()
        try:
            while True:
                found = find_calibration(sig, gpu_name, [cache_dir])
                if found is not None:
                    results[sig] = f"measured in {time.monotonic() - t0:.0f} s {found[1]}"
                    break
                if srv.proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                    results[sig] = f"failed: the server {'exited' if srv.proc.poll() is not None else 'timed out'}; see {log}"
                    break
                time.sleep(1.0)
        finally:
            srv.stop()
        print(f"sgl-sidp plan calibrate: {sig}: {results[sig]}", file=sys.stderr, flush=True)
    return results
