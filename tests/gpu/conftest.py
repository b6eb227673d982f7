"""GPU tests (`pytest -m gpu`): real SGLang servers started through our launcher.

Skipped with a reason where no CUDA device is present. Server logs go to
$SIDP_GPU_LOGS (default: pytest's tmp dir) so a run's evidence can be kept.
Model configs come from $SIDP_MODELS_DIR (default: ../shared/models beside the repo).
With SIDP_GPU_FOLD=1, tests marked `foldable` that ask for more GPUs than are visible run with their DP
replicas folded onto GPU 0 (see servers.py); the others are skipped as usual.

**Shards** (`scripts/gpu_tests.sh` with SHARDS=N: pytest-xdist, `-n N --dist loadfile`): worker gwK sees GPUs
K x G ... K x G + G - 1 of SIDP_HOST_GPUS ("0,1,2,3"), G = SIDP_GPUS_PER_WORKER, before anything touches CUDA; a
test's server GPUs are numbered within them (`sgl_sidp.bench.server.visible_gpus`). A test that needs more than G
GPUs is deselected there, not skipped, so that a later call without shards runs it.
"""

import os
from pathlib import Path

import pytest


def worker_gpus(environ=os.environ) -> str | None:
    """The CUDA_VISIBLE_DEVICES of this pytest-xdist worker under SIDP_GPUS_PER_WORKER (module docstring); None when
    not sharded.

    Raises:
        ValueError: the worker's GPUs are beyond SIDP_HOST_GPUS.
    """
    per, worker = int(environ.get("SIDP_GPUS_PER_WORKER") or 0), environ.get("PYTEST_XDIST_WORKER")
    if not per or not worker:
        return None
    host = [g for g in environ.get("SIDP_HOST_GPUS", "").split(",") if g]
    k = int(worker.removeprefix("gw"))
    if (k + 1) * per > len(host):
        raise ValueError(f"worker {worker}: GPUs {k * per}-{(k + 1) * per - 1} of SIDP_HOST_GPUS={','.join(host)}")
    return ",".join(host[k * per:(k + 1) * per])


SHARD_GPUS = worker_gpus()
if SHARD_GPUS is not None:
    os.environ["CUDA_VISIBLE_DEVICES"] = SHARD_GPUS


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    n = _cuda_count()
    if SHARD_GPUS is not None:
        wider = [item for item in items if _needs(item) > n]
        if wider:
            config.hook.pytest_deselected(items=wider)
            items[:] = [item for item in items if _needs(item) <= n]
    for item in items:
        if "gpu" not in item.keywords:
            continue
        need = _needs(item)
        if n == 0:
            item.add_marker(pytest.mark.skip(reason="no CUDA device: GPU tests run on a GPU host (see README)"))
        elif n < need and os.environ.get("SIDP_GPU_FOLD") == "1" and "foldable" in item.keywords:
            continue
        elif n < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} GPUs, {n} visible"))


def _needs(item) -> int:
    """GPUs a test asks for (its `gpus` marker; 1 without one)."""
    need = item.get_closest_marker("gpus")
    return need.args[0] if need else 1


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory):
    d = os.environ.get("SIDP_GPU_LOGS")
    p = Path(d) if d else tmp_path_factory.mktemp("gpu_logs")
    p.mkdir(parents=True, exist_ok=True)
    return p
