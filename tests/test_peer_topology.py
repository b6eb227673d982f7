"""GPU topology checks (`sgl_sidp.peer.topology`): replica GPU layout and peer access, no GPU needed."""

from sgl_sidp.peer import topology as preflight
from sgl_sidp.peer.topology import peer_access_problems, replica_gpus
from sgl_sidp.zerodp.policy import source_sink_pairs


def test_replica_gpus():
    """DP rank d, TP rank t sits on base + (d * tp + t) * step, as SGLang's DP controller assigns."""
    assert replica_gpus(3, 2) == [[0, 1], [2, 3], [4, 5]]
    assert replica_gpus(2, 1) == [[0], [1]]
    assert replica_gpus(2, 2, base_gpu_id=2, gpu_id_step=2) == [[2, 4], [6, 8]]


def test_peer_access_problems_names_both_gpus():
    """Only pairs answered False are reported, one line each, naming the sink and the source GPU."""
    pairs = source_sink_pairs(3, 2)
    answers = {(1, 3): False, (0, 4): None}
    ps = peer_access_problems(pairs, can_read=lambda a, b: answers.get((a, b), True))
    assert len(ps) == 1
    assert "GPU 3 cannot read GPU 1's memory" in ps[0]
    assert peer_access_problems(pairs, can_read=lambda a, b: None) == []
    assert peer_access_problems(pairs, can_read=lambda a, b: True) == []
    assert len(peer_access_problems(pairs, can_read=lambda a, b: False)) == 4


def test_peer_access_default_reads_cuda_visible_devices(monkeypatch):
    """Without can_read, NVML is asked with $CUDA_VISIBLE_DEVICES split on commas (or None when unset)."""
    seen = []

    def fake_nvml(visible):
        seen.append(visible)
        return lambda a, b: a != 0 or b != 1

    monkeypatch.setattr(preflight, "_nvml_p2p_read", fake_nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, GPU-abc")
    assert peer_access_problems([(0, 1)]) == [peer_access_problems([(0, 1)], can_read=lambda a, b: False)[0]]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert peer_access_problems([(0, 2)]) == []
    assert seen == [["3", "GPU-abc"], None]


def fake_pynvml(monkeypatch, fail_init=False, ok_pairs=()):
    """A stand-in `pynvml` module: handles are names, P2P read status OK only for `ok_pairs` (handle1, handle2)."""
    import sys
    import types

    calls = []
    m = types.ModuleType("pynvml")
    m.NVML_P2P_CAPS_INDEX_READ, m.NVML_P2P_STATUS_OK = 0, 0

    def init():
        if fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    m.nvmlInit = init
    m.nvmlDeviceGetHandleByIndex = lambda i: f"idx{i}"
    m.nvmlDeviceGetHandleByUUID = lambda u: f"uuid:{u}"

    def status(h1, h2, cap):
        calls.append((h1, h2, cap))
        return 0 if (h1, h2) in ok_pairs else 4

    m.nvmlDeviceGetP2PStatus = status
    monkeypatch.setitem(sys.modules, "pynvml", m)
    return calls


def test_nvml_unavailable_answers_unknown(monkeypatch):
    """When NVML cannot start, every pair is 'unknown' (None), so nothing is rejected."""
    fake_pynvml(monkeypatch, fail_init=True)
    can_read = preflight._nvml_p2p_read(None)
    assert can_read(0, 1) is None
    assert peer_access_problems([(0, 1)], can_read) == []


def test_nvml_p2p_read_maps_visible_devices(monkeypatch):
    """Logical GPU i is $CUDA_VISIBLE_DEVICES[i] (an index or a UUID); the sink's handle is asked to read the source's."""
    calls = fake_pynvml(monkeypatch, ok_pairs={("uuid:GPU-b", "idx5")})
    can_read = preflight._nvml_p2p_read(["5", "GPU-b", "7"])
    assert can_read(0, 1) is True  # source 0 -> physical 5, sink 1 -> GPU-b
    assert can_read(0, 2) is False
    assert can_read(1, 1) is True and len(calls) == 2  # same GPU: no NVML call
    assert calls[0] == ("uuid:GPU-b", "idx5", 0)
    calls.clear()
    assert preflight._nvml_p2p_read(None)(2, 3) is False and calls == [("idx3", "idx2", 0)]


def test_nvml_p2p_read_one_gpu_listed_twice(monkeypatch):
    """CUDA_VISIBLE_DEVICES=0,0 (the GPU tests' one-GPU fold): logical GPUs 0 and 1 are one GPU, readable without NVML."""
    calls = fake_pynvml(monkeypatch)
    can_read = preflight._nvml_p2p_read(["0", "0"])
    assert can_read(0, 1) is True and can_read(1, 0) is True and calls == []


def test_gpu_memory_used_reads_nvml_and_its_processes(monkeypatch):
    """Bytes in use and the pids computing on a visible GPU, from NVML; the pids left out where the driver does not
    list them; None without NVML."""
    import types

    from sgl_sidp.peer.topology import gpu_memory_used

    fake_pynvml(monkeypatch)
    import pynvml

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    pynvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used={"idx5": 7 << 30}.get(h, 0))
    pynvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=31), types.SimpleNamespace(pid=9)]
    assert gpu_memory_used(1) == (7 << 30, [9, 31])

    def hidden(h):
        raise RuntimeError("Not Supported")

    pynvml.nvmlDeviceGetComputeRunningProcesses = hidden
    assert gpu_memory_used(0) == (0, [])
    fake_pynvml(monkeypatch, fail_init=True)
    assert gpu_memory_used(0) is None
