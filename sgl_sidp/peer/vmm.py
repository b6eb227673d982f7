"""Owner/reader hand-over of device memory: VMM allocations shared through POSIX file descriptors.

The owner (ZeroDP: the source) moves each shared tensor into its own CUDA VMM allocation
(`cuMemCreate` with a POSIX-fd shareable handle) and keeps computing on it. Readers (ZeroDP: the
sinks) connect to the owner over a Unix socket, receive one file descriptor per tensor
(`socket.send_fds`, SCM_RIGHTS), import it (`cuMemImportFromShareableHandle`) and map it into
their own address space with read access for their own GPU (`cuMemSetAccess`). A reader then
reads the owner's HBM with plain device-to-device copies over NVLink: one-sided, the owner does
nothing at run time, and the reader creates no CUDA context on the owner's GPU.

The VMM calls are SGLang's own (DWDP's `sglang.srt.layers.moe.dwdp.vmm` and
`sglang.srt.distributed.device_communicators.vmm_utils`); what is ours is the rendezvous,
since owner and readers can be separate DP replicas with no process group in common.

The socket also tells a reader that its owner died: the kernel closes it, the reader's watcher
thread sees EOF and stops the server with a clear message (SGLang's own scheduler-failure path:
SIGQUIT to the parent).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import statistics
import struct
import threading
import time
from typing import Callable, Sequence

import torch

from sgl_sidp.peer.manifest import TensorSpec


class PeerError(RuntimeError):
    """Shared memory cannot be set up: no owner, no peer access, a bad tensor."""

logger = logging.getLogger(__name__)

_FDS_PER_MESSAGE = 64  # well under the kernel's SCM_MAX_FD (253)


def socket_address(feature: str, port: int, tp_rank: int) -> str:
    """Abstract-namespace Unix socket of an owner: `feature` (e.g. "zerodp"), server `port`, TP rank."""
    return f"\0sgl-sidp-{feature}.{port}.tp{tp_rank}"


def _drv():
    from cuda.bindings import driver

    return driver


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_KEEP_ALIVE: list[torch.Tensor] = []  # mapped for the life of the process


def vmm_tensor(va: int, shape: tuple[int, ...], dtype: torch.dtype, device_id: int) -> torch.Tensor:
    """A tensor of `shape`/`dtype` on `device_id` over the mapped range at `va` (no copy, no ownership).

    Goes through SGLang's `tensor_from_ptr` with the integer dtype of the same width and views it
    back: that helper hands bf16 to DLPack as kDLFloat/16, which comes back as float16.
    """
    from sglang.srt.layers.moe.dwdp.vmm import tensor_from_ptr

    base = tensor_from_ptr(va, tuple(shape), _INT_OF_SIZE[dtype.itemsize], device_id)
    _KEEP_ALIVE.append(base)  # owns the DLPack structs the storage's deleter points at
    return base.view(dtype)


def _send_msg(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack("<Q", len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return buf


def _recv_msg(sock: socket.socket) -> bytes:
    (n,) = struct.unpack("<Q", _recv_exact(sock, 8))
    return _recv_exact(sock, n)


# --------------------------------------------------------------------------- owner
class TensorExporter:
    """Owner side: re-home parameters into shareable VMM memory and serve them to readers.

    Args:
        params: `TensorSpec -> torch.nn.Parameter` on this process's GPU (contiguous).
        device_id: this process's CUDA device index.
        address: socket address (`socket_address`).

    After construction every parameter's `.data` points at its VMM allocation (same shape,
    dtype, values), the old storage is freed, and a daemon thread answers readers.

    Raises:
        PeerError: a parameter is not contiguous or not on `device_id`.
    """

    def __init__(self, params: dict[TensorSpec, torch.nn.Parameter], device_id: int, address: str):
        from sglang.srt.distributed.device_communicators.vmm_utils import check_drv
        from sglang.srt.layers.moe.dwdp.vmm import (
            align_up,
            create_fabric_handle,
            get_allocation_granularity,
            map_handle,
            reserve_va,
            set_access,
        )

        drv = _drv()
        posix = drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        gran = get_allocation_granularity(device_id)
        self.device_id = device_id
        self.address = address
        self.entries: list[dict] = []
        self._fds: list[int] = []
        self._keep = []  # VMM-backed tensors and handles: alive for the process lifetime
        for spec in sorted(params, key=lambda t: t.key):
            p = params[spec]
            if not p.is_contiguous() or p.device.index != device_id:
                raise PeerError(f"layer {spec.layer_id} {spec.name}: expected a contiguous tensor on cuda:{device_id}")
            size = align_up(spec.nbytes, gran)
            handle = create_fabric_handle(size, device_id)
            va = reserve_va(size, gran)
            map_handle(va, size, handle)
            set_access(va, size, device_id)
            t = vmm_tensor(va, tuple(p.shape), p.dtype, device_id)
            if t.dtype != p.dtype or t.shape != p.shape:
                raise PeerError(f"layer {spec.layer_id} {spec.name}: VMM view is {t.dtype} {tuple(t.shape)}, not {p.dtype} {tuple(p.shape)}")
            t.copy_(p.data)
            p.data = t
            fd = check_drv(drv.cuMemExportToShareableHandle(handle, posix, 0), "cuMemExportToShareableHandle(POSIX_FD)")
            self._fds.append(int(fd))
            self._keep.append((t, handle, va, size))
            self.entries.append({**spec.to_json(), "alloc_size": size})
        torch.cuda.synchronize(device_id)
        torch.cuda.empty_cache()
        self.header = {
            "pid": os.getpid(),
            "device_id": device_id,
            "device_uuid": str(torch.cuda.get_device_properties(device_id).uuid),
            "entries": self.entries,
        }
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(address)
        self._sock.listen(16)
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._serve, name="sgl-sidp-peer-owner", daemon=True).start()

    @property
    def nbytes(self) -> int:
        return sum(e["nbytes"] for e in self.entries)

    def _serve(self) -> None:
        while True:
            conn, _ = self._sock.accept()
            try:
                _send_msg(conn, json.dumps(self.header).encode())
                for i in range(0, len(self._fds), _FDS_PER_MESSAGE):
                    socket.send_fds(conn, [b"F"], self._fds[i : i + _FDS_PER_MESSAGE])
                self._conns.append(conn)  # kept open: its EOF tells the reader we died
                logger.info("sgl-sidp peer owner (pid %d): served %d tensors to a reader", os.getpid(), len(self._fds))
            except OSError as e:
                logger.warning("sgl-sidp peer owner: a reader connection failed: %s", e)
                conn.close()


# --------------------------------------------------------------------------- reader
class TensorImporter:
    """Reader side: fetch the owner's manifest and file descriptors; map what is needed.

    Args:
        address: the owner's socket address (`socket_address`).
        device_id: this process's CUDA device index.
        timeout_s: how long to wait for the owner to publish (it may be loading its weights).
        owner_name: how the owner is called in messages (e.g. "zerodp source DP0 TP0").

    Raises:
        PeerError: the owner did not publish within `timeout_s`, or the two GPUs have no peer access.
    """

    def __init__(self, address: str, device_id: int, timeout_s: float, owner_name: str):
        self.device_id = device_id
        self.owner_name = owner_name
        deadline = time.monotonic() + timeout_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(address)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                if time.monotonic() > deadline:
                    raise PeerError(
                        f"{owner_name} did not publish its tensors within {timeout_s:.0f} s "
                        "(did it fail to start? see its log lines above)"
                    ) from None
                time.sleep(0.5)
        self._sock = sock
        self.header = json.loads(_recv_msg(sock))
        self.owner_pid = int(self.header["pid"])
        self.owner_device = int(self.header["device_id"])
        self.entries = [TensorSpec.from_json(e) for e in self.header["entries"]]
        self._alloc = {(e["layer_id"], e["name"]): int(e["alloc_size"]) for e in self.header["entries"]}
        fds: list[int] = []
        while len(fds) < len(self.entries):
            _, got, _, _ = socket.recv_fds(sock, 1, _FDS_PER_MESSAGE)
            if not got:
                raise PeerError(f"{owner_name} closed the connection while sending handles")
            fds.extend(got)
        self._fd = {t.key: fd for t, fd in zip(self.entries, fds)}
        if self.owner_device != device_id and not torch.cuda.can_device_access_peer(device_id, self.owner_device):
            raise PeerError(f"GPU {device_id} has no peer access to GPU {self.owner_device} ({owner_name})")
        self._mapped = []

    def map(self, keys: Sequence[tuple[int, str]]) -> dict[tuple[int, str], torch.Tensor]:
        """Map the owner's tensors `keys` into this process, as tensors on our device (read them only)."""
        from sglang.srt.distributed.device_communicators.vmm_utils import import_peer_handle
        from sglang.srt.layers.moe.dwdp.vmm import get_allocation_granularity, map_handle, reserve_va, set_access

        gran = get_allocation_granularity(self.device_id)
        spec = {t.key: t for t in self.entries}
        out = {}
        for key in keys:
            t = spec[key]
            size = self._alloc[key]
            handle = import_peer_handle(None, self._fd[key], use_fabric=False, peer_rank=0)
            va = reserve_va(size, gran)
            map_handle(va, size, int(handle))
            set_access(va, size, self.device_id)
            dtype = getattr(torch, t.dtype.replace("torch.", ""))
            out[key] = vmm_tensor(va, t.shape, dtype, self.device_id)
            self._mapped.append((handle, va, size))
        return out

    def watch(self, on_lost: Callable[[str], None] | None = None) -> None:
        """Start a daemon thread that calls `on_lost(message)` when the owner's socket closes.

        Default `on_lost`: log the message and stop the server the way SGLang's scheduler does on
        a fatal error (SIGQUIT to the parent process), then exit this process.
        """

        def default(msg: str) -> None:
            logger.error(msg)
            try:
                import psutil

                psutil.Process().parent().send_signal(signal.SIGQUIT)
            finally:
                os._exit(1)

        cb = on_lost or default

        def run():
            try:
                while self._sock.recv(1):
                    pass
            except OSError:
                pass
            cb(
                f"sgl-sidp: {self.owner_name} (pid {self.owner_pid}, GPU {self.owner_device}) is gone; "
                "this process reads weights from that process's GPU memory and cannot serve without it. "
                "Stopping the server."
            )

        threading.Thread(target=run, name="sgl-sidp-peer-owner-watch", daemon=True).start()


def measure_copy_gbps(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], reps: int = 5) -> float:
    """Copy rate (GB/s, 1e9 bytes/s) of one prefetch: every `dst.copy_(src)` of `pairs` back to back on a
    fresh side stream, as `SlotPrefetcher` issues a layer's copies; the median of `reps` after one warm-up."""
    stream = torch.cuda.Stream(device=pairs[0][0].device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    with torch.cuda.stream(stream):
        for dst, src in pairs:
            dst.copy_(src, non_blocking=True)
        for _ in range(reps):
            start.record(stream)
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end))
    nbytes = sum(dst.numel() * dst.element_size() for dst, _ in pairs)
    return nbytes / (statistics.median(times) * 1e-3) / 1e9
