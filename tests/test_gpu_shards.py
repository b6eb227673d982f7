"""GPU tests in shards on one host (`scripts/gpu_tests.sh` with SHARDS=N): each pytest-xdist worker sees its own
GPUs (`tests/gpu/conftest.worker_gpus`), and a server asked for "0,1" starts on the worker's first two
(`bench.server.visible_gpus`, CUDA's numbering of a restricted process)."""

import importlib.util
from pathlib import Path

import pytest

from sgl_sidp.bench.server import ServerProcess, visible_gpus

spec = importlib.util.spec_from_file_location("gpu_conftest", Path(__file__).parent / "gpu" / "conftest.py")
gpu_conftest = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_conftest)


def test_server_gpus_are_numbered_as_this_process_sees_them(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpus("0,1") == "0,1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_gpus("0,1") == "2,3" and visible_gpus("1") == "3"
    assert ServerProcess("m", [], port=1, log_path=Path("x"), gpus="1").env["CUDA_VISIBLE_DEVICES"] == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa, GPU-bb")
    assert visible_gpus("1,0") == "GPU-bb,GPU-aa"
    with pytest.raises(ValueError, match=r"GPUs '0,2': this process sees 2"):
        visible_gpus("0,2")


def test_each_xdist_worker_takes_its_own_gpus():
    env = {"SIDP_GPUS_PER_WORKER": "2", "SIDP_HOST_GPUS": "0,1,2,3"}
    assert gpu_conftest.worker_gpus({**env, "PYTEST_XDIST_WORKER": "gw0"}) == "0,1"
    assert gpu_conftest.worker_gpus({**env, "PYTEST_XDIST_WORKER": "gw1"}) == "2,3"
    assert gpu_conftest.worker_gpus(env) is None  # not under xdist
    assert gpu_conftest.worker_gpus({"PYTEST_XDIST_WORKER": "gw1"}) is None  # not sharded
    with pytest.raises(ValueError, match="worker gw2: GPUs 4-5"):
        gpu_conftest.worker_gpus({**env, "PYTEST_XDIST_WORKER": "gw2"})
