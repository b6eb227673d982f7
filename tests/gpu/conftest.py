"""GPU tests (`pytest -m gpu`): real SGLang servers started through our launcher.

Skipped with a reason where no CUDA device is present. Server logs go to
$SIDP_GPU_LOGS (default: pytest's tmp dir) so a run's evidence can be kept.
Model configs come from $SIDP_MODELS_DIR (default: ../shared/models beside the repo).
With SIDP_GPU_FOLD=1, tests marked `foldable` that ask for more GPUs than are visible run with their DP
replicas folded onto GPU 0 (see servers.py); the others are skipped as usual.
"""

import os
from pathlib import Path

import pytest


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    n = _cuda_count()
    for item in items:
        if "gpu" not in item.keywords:
            continue
        need = item.get_closest_marker("gpus")
        need = need.args[0] if need else 1
        if n == 0:
            item.add_marker(pytest.mark.skip(reason="no CUDA device: GPU tests run on a GPU host (see README)"))
        elif n < need and os.environ.get("SIDP_GPU_FOLD") == "1" and "foldable" in item.keywords:
            continue
        elif n < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} GPUs, {n} visible"))


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory):
    d = os.environ.get("SIDP_GPU_LOGS")
    p = Path(d) if d else tmp_path_factory.mktemp("gpu_logs")
    p.mkdir(parents=True, exist_ok=True)
    return p
