"""GPU topology: which GPU each SGLang replica gets, and whether two GPUs can read each other.

CPU-only (NVML, no CUDA context), so launchers can check before any GPU memory is taken.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence


def replica_gpus(dp_size: int, tp_size: int, base_gpu_id: int = 0, gpu_id_step: int = 1) -> list[list[int]]:
    """GPU index of each (DP rank, TP rank), as SGLang's DP controller assigns them.

    `DataParallelController.launch_dp_schedulers` gives DP rank d the GPUs starting at
    `base_gpu_id + d * tp_size * gpu_id_step`, TP rank t at `+ t * gpu_id_step`.
    """
    return [[base_gpu_id + (d * tp_size + t) * gpu_id_step for t in range(tp_size)] for d in range(dp_size)]


def _nvml_p2p_read(visible: Sequence[str] | None) -> Callable[[int, int], bool | None]:
    """A `(gpu_a, gpu_b) -> peer read OK?` function backed by NVML (no CUDA context is created).

    `visible` is $CUDA_VISIBLE_DEVICES split on commas (indices or UUIDs), or None.
    Returns a function answering None when NVML is unavailable.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return lambda a, b: None

    def handle(i: int):
        if visible:
            v = visible[i]
            return pynvml.nvmlDeviceGetHandleByUUID(v) if not v.isdigit() else pynvml.nvmlDeviceGetHandleByIndex(int(v))
        return pynvml.nvmlDeviceGetHandleByIndex(i)

    # nvidia-ml-py 13.x defines NVML_P2P_CAPS_INDEX_READ as the tuple (0,) (a stray comma): use its value.
    read_index = 0

    def ok(a: int, b: int) -> bool | None:
        if a == b or (visible and a < len(visible) and b < len(visible) and visible[a] == visible[b]):
            return True  # one GPU (CUDA_VISIBLE_DEVICES=0,0: DP replicas folded onto it, see tests/gpu/servers.py)
        try:
            status = pynvml.nvmlDeviceGetP2PStatus(handle(b), handle(a), read_index)
        except Exception:
            return None  # unknown here; the reader checks again with CUDA before mapping anything
        return status == pynvml.NVML_P2P_STATUS_OK

    return ok


def visible_gpu_count() -> int | None:
    """GPUs this process may use (CUDA_VISIBLE_DEVICES' entries, else NVML's count), without initialising CUDA;
    None when neither can tell (no NVML)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([v for v in vis.split(",") if v.strip()])
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return None


def visible_gpu_ids() -> list[str]:
    """CUDA_VISIBLE_DEVICES' entries (indices or UUIDs) in order, blanks dropped; [] when it is unset or empty (then
    the visible GPUs are 0, 1, ...)."""
    return [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]


def _nvml_handle(index: int):
    import pynvml

    pynvml.nvmlInit()
    vis = visible_gpu_ids()
    v = vis[index] if index < len(vis) else str(index)
    return pynvml.nvmlDeviceGetHandleByIndex(int(v)) if v.isdigit() else pynvml.nvmlDeviceGetHandleByUUID(v)


def _nvml_query(index: int, read: Callable):
    """`read(pynvml, handle)` for visible GPU `index` (CUDA_VISIBLE_DEVICES applied), without initialising CUDA; None
    when NVML cannot tell (no pynvml, no driver, no such GPU)."""
    try:
        import pynvml

        return read(pynvml, _nvml_handle(index))
    except Exception:
        return None


def gpu_name(index: int) -> str | None:
    """NVML's name of visible GPU `index` (as torch.cuda.get_device_name gives it), without initialising CUDA; None
    when NVML cannot tell."""
    def read(nvml, handle):
        name = nvml.nvmlDeviceGetName(handle)
        return name.decode() if isinstance(name, bytes) else str(name)

    return _nvml_query(index, read)


def gpu_capability(index: int) -> tuple[int, int] | None:
    """Compute capability (major, minor) of visible GPU `index` from NVML, without initialising CUDA; None when NVML
    cannot tell."""
    return _nvml_query(index, lambda nvml, handle: tuple(map(int, nvml.nvmlDeviceGetCudaComputeCapability(handle))))


def gpu_memory_bytes(index: int) -> int | None:
    """Total memory of visible GPU `index` (CUDA_VISIBLE_DEVICES applied) from NVML, without initialising CUDA; None
    when NVML cannot tell."""
    return _nvml_query(index, lambda nvml, handle: int(nvml.nvmlDeviceGetMemoryInfo(handle).total))


def gpu_memory_used(index: int) -> tuple[int, list[int]] | None:
    """(bytes in use, pids of the processes computing on it) of visible GPU `index` from NVML, without initialising
    CUDA; None when NVML cannot tell."""
    def read(nvml, handle):
        used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        try:
            pids = sorted(int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except Exception:  # noqa: BLE001 - some drivers do not list processes inside a container
            pids = []
        return used, pids

    return _nvml_query(index, read)


def peer_access_problems(pairs: Sequence[tuple[int, int]], can_read: Callable[[int, int], bool | None] | None = None) -> list[str]:
    """One line per (owner, reader) GPU pair where the reader cannot read the owner's memory.

    Args:
        pairs: `(owner_gpu, reader_gpu)` pairs (ZeroDP: `zerodp.policy.source_sink_pairs`).
        can_read: `(owner_gpu, reader_gpu) -> True/False/None (unknown)`; default NVML.
    """
    if can_read is None:
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        can_read = _nvml_p2p_read([v.strip() for v in vis.split(",")] if vis else None)
    problems = []
    for src, snk in pairs:
        if can_read(src, snk) is False:
            problems.append(
                f"GPU {snk} cannot read GPU {src}'s memory over a peer link "
                "(no NVLink/PCIe peer access between them); pick GPUs with peer access (nvidia-smi topo -m)"
            )
    return problems


class GpuFold:
    """`--overlay-fold-gpus`: a scheduler process runs on GPU `gpu_id mod torch.cuda.device_count()`.

    SGLang's DP controller gives DP rank d the GPUs from `d * tp_size` on (`replica_gpus`); on a one-GPU
    machine rank 1's GPU does not exist. Folding the id the scheduler gets (`Scheduler.__init__`'s `gpu_id`, from
    which `ModelRunner` sets its device) runs every replica on the GPUs there are, so the weight-sharing features
    (one process per replica, CUDA VMM handles between them) can be checked for exactness on one GPU. A developer
    aid: the replicas share memory and compute.

    Args:
        ctx: the plugin's per-process context (unused; the hook table builds every runtime from one).
    """

    def __init__(self, ctx=None, device_count: Callable[[], int] | None = None):
        self._count = device_count

    def before_scheduler_init(self, *args, **kwargs):
        """BEFORE hook of `Scheduler.__init__(self, server_args, port_args, gpu_id, ...)`: fold `gpu_id`.

        Returns:
            (args, kwargs) with `gpu_id` replaced by `gpu_id mod` the visible GPU count.
        """
        count = self._count() if self._count else __import__("torch").cuda.device_count()
        if "gpu_id" in kwargs:
            kwargs = {**kwargs, "gpu_id": kwargs["gpu_id"] % count}
        elif len(args) > 3:
            args = (*args[:3], args[3] % count, *args[4:])
        return args, kwargs
