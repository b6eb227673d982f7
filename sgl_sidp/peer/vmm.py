"""Owner/reader hand-over of device memory: VMM allocations shared through POSIX file descriptors.

The owner (ZeroDP: the source) moves each shared tensor into its own CUDA VMM allocation
(`cuMemCreate` with a POSIX-fd shareable handle), frees the original before moving the next
(`sgl_sidp.peer.moves.plan_moves`: at most one tensor is ever held twice), and keeps computing on
it. Readers (ZeroDP: the sinks) connect to the owner over a Unix socket, receive one file
descriptor per tensor (`socket.send_fds`, SCM_RIGHTS), import it
(`cuMemImportFromShareableHandle`) and map it into their own address space with read access for
their own GPU (`cuMemSetAccess`). A reader then reads the owner's HBM with plain device-to-device
copies over NVLink: one-sided, the owner does nothing at run time.

The driver calls go through `VmmDriver` (SGLang's own DWDP helpers, `sglang.srt.layers.moe.dwdp.vmm`
and `sglang.srt.distributed.device_communicators.vmm_utils`, plus unmap/release from
`cuda.bindings`), so CPU tests inject a fake driver. What is ours is the move order and the
rendezvous, since owner and readers can be separate DP replicas with no process group in common.

The socket also tells a reader that its owner died: the kernel closes it, the reader's watcher
thread sees EOF and stops the whole server with a message naming the owner (`sgl_sidp.process.stop_server`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import statistics
import struct
import threading
import time
from typing import Callable, Sequence

import torch

from sgl_sidp.peer.manifest import TensorSpec
from sgl_sidp.peer.moves import plan_moves
from sgl_sidp.process import Progress, stop_server

logger = logging.getLogger(__name__)

_FDS_PER_MESSAGE = 64  # well under the kernel's SCM_MAX_FD (253)


class PeerError(RuntimeError):
    """Shared memory cannot be set up: no owner, no peer access, no memory, a bad tensor."""


def socket_address(feature: str, port: int, tp_rank: int) -> str:
    """Abstract-namespace Unix socket of an owner: `feature` (e.g. "zerodp"), server `port`, TP rank."""
    return f"\0sgl-sidp-{feature}.{port}.tp{tp_rank}"


# --------------------------------------------------------------------------- driver
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class VmmDriver:
    """The CUDA VMM and memory calls the transport makes (CUDA implementation; tests inject a fake)."""

    def __init__(self):
        self._dlpack_bases: list[torch.Tensor] = []  # see `tensor`

    def _drv(self):
        from cuda.bindings import driver

        return driver

    def granularity(self, device_id: int) -> int:
        from sglang.srt.layers.moe.dwdp.vmm import get_allocation_granularity

        return int(get_allocation_granularity(device_id))

    def create(self, size: int, device_id: int):
        """A physical allocation of `size` bytes with a POSIX-fd shareable handle (`cuMemCreate`)."""
        from sglang.srt.layers.moe.dwdp.vmm import create_fabric_handle

        return create_fabric_handle(size, device_id)

    def map(self, handle, size: int, device_id: int) -> int:
        """Reserve a VA range, map `handle` there, grant `device_id` access; returns the VA."""
        from sglang.srt.layers.moe.dwdp.vmm import map_handle, reserve_va, set_access

        va = reserve_va(size, self.granularity(device_id))
        map_handle(va, size, handle)
        set_access(va, size, device_id)
        return int(va)

    def export_fd(self, handle) -> int:
        from sglang.srt.distributed.device_communicators.vmm_utils import check_drv

        drv = self._drv()
        posix = drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        return int(check_drv(drv.cuMemExportToShareableHandle(handle, posix, 0), "cuMemExportToShareableHandle(POSIX_FD)"))

    def import_fd(self, fd: int):
        from sglang.srt.distributed.device_communicators.vmm_utils import import_peer_handle

        return import_peer_handle(None, fd, use_fabric=False, peer_rank=0)

    def tensor(self, va: int, shape: tuple[int, ...], dtype: torch.dtype, device_id: int) -> torch.Tensor:
        """A tensor over the mapped range at `va` (no copy, no ownership).

        Goes through SGLang's `tensor_from_ptr` with the integer dtype of the same width and views
        it back: that helper hands bf16 to DLPack as kDLFloat/16, which comes back as float16.
        """
        from sglang.srt.layers.moe.dwdp.vmm import tensor_from_ptr

        base = tensor_from_ptr(va, tuple(shape), _INT_OF_SIZE[dtype.itemsize], device_id)
        # The base owns the DLPack structs its storage's deleter points at: freeing it early crashes
        # the process (seen on H200), so it lives as long as this driver (the exporter or importer).
        self._dlpack_bases.append(base)
        return base.view(dtype)

    def unmap(self, va: int, size: int) -> None:
        drv = self._drv()
        drv.cuMemUnmap(va, size)
        drv.cuMemAddressFree(va, size)

    def release(self, handle) -> None:
        self._drv().cuMemRelease(handle)

    def free_bytes(self, device_id: int) -> int:
        """Free device memory (bytes), as the driver sees it."""
        return int(torch.cuda.mem_get_info(device_id)[0])

    def return_cached(self, device_id: int) -> None:
        """Hand torch's cached free blocks back to the driver, so a freed original is free for `create`."""
        torch.cuda.synchronize(device_id)
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- wire
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
    """Owner side: re-home parameters into shareable VMM memory, one at a time, and serve them to readers.

    Args:
        params: `TensorSpec -> torch.nn.Parameter` on this process's GPU (contiguous).
        device_id: this process's CUDA device index (None: CPU tensors, with a test driver).
        address: socket address (`socket_address`).
        driver: the VMM calls (default `VmmDriver`, CUDA).

    After construction every parameter's `.data` points at its VMM allocation (same shape,
    dtype, values), each original was freed before the next allocation (`plan`), and a daemon
    thread answers readers. `peak_extra_bytes` is the most extra device memory measured during
    the moves (`plan.peak_extra_bytes` is what the plan allows).

    Raises:
        PeerError: a parameter is not contiguous or not on `device_id`; a VMM allocation failed
            (tensors moved until then stay valid where they are).
    """

    def __init__(self, params: dict[TensorSpec, torch.nn.Parameter], device_id: int, address: str,
                 driver: VmmDriver | None = None):
        self.driver = driver or VmmDriver()
        self.device_id = device_id
        self.address = address
        self.plan = plan_moves(list(params), self.driver.granularity(device_id))
        by_key = {spec.key: (spec, p) for spec, p in params.items()}
        self.entries: list[dict] = []
        self._fds: list[int] = []
        self._allocs: list[tuple[object, int, int]] = []  # (handle, va, size): the model computes on them for good
        self._tensors: list[torch.Tensor] = []  # the VMM-backed tensors the parameters now use
        free0 = self.driver.free_bytes(device_id)
        self.peak_extra_bytes = 0
        for key in self.plan.order:
            spec, p = by_key[key]
            if not p.is_contiguous() or p.device.index != device_id:
                raise PeerError(f"layer {spec.layer_id} {spec.name}: expected a contiguous tensor on cuda:{device_id}")
            size = self.plan.alloc_bytes[key]
            try:
                handle = self.driver.create(size, device_id)
            except Exception as e:  # noqa: BLE001 - the driver's own error, with what we tried
                raise PeerError(
                    f"cannot allocate {size / 1e9:.2f} GB of shareable memory on GPU {device_id} to re-home layer "
                    f"{spec.layer_id} {spec.name} ({self.driver.free_bytes(device_id) / 1e9:.2f} GB free): {e}"
                ) from e
            try:
                va = self.driver.map(handle, size, device_id)
            except Exception as e:  # noqa: BLE001
                self.driver.release(handle)
                raise PeerError(f"cannot map shareable memory for layer {spec.layer_id} {spec.name}: {e}") from e
            t = self.driver.tensor(va, tuple(p.shape), p.dtype, device_id)
            if t.dtype != p.dtype or t.shape != p.shape:
                self.driver.unmap(va, size)
                self.driver.release(handle)
                raise PeerError(f"layer {spec.layer_id} {spec.name}: VMM view is {t.dtype} {tuple(t.shape)}, not {p.dtype} {tuple(p.shape)}")
            self._allocs.append((handle, va, size))
            t.copy_(p.data)
            self.peak_extra_bytes = max(self.peak_extra_bytes, free0 - self.driver.free_bytes(device_id))
            p.data = t  # the original storage has no other owner now
            self.driver.return_cached(device_id)
            self._tensors.append(t)
            self._fds.append(self.driver.export_fd(handle))
            self.entries.append({**spec.to_json(), "alloc_size": size})
        self.header = {
            "pid": os.getpid(),
            "device_id": -1 if device_id is None else device_id,  # None: CPU tensors (tests with a fake driver)
            "device_uuid": _device_uuid(device_id),
            "entries": self.entries,
        }
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind(address)
        except OSError as e:
            self._sock.close()
            raise PeerError(f"cannot serve the shared tensors at {address!r} (another server on this port?): {e}") from e
        self._sock.listen(16)
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._serve, name="sgl-sidp-peer-owner", daemon=True).start()

    @property
    def nbytes(self) -> int:
        return sum(e["nbytes"] for e in self.entries)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            try:
                _send_msg(conn, json.dumps(self.header).encode())
                for i in range(0, len(self._fds), _FDS_PER_MESSAGE):
                    socket.send_fds(conn, [b"F"], self._fds[i : i + _FDS_PER_MESSAGE])
                self._conns.append(conn)  # kept open: its EOF tells the reader we died
                logger.info("sgl-sidp peer owner (pid %d): served %d tensors to a reader", os.getpid(), len(self._fds))
            except OSError as e:
                logger.warning("sgl-sidp peer owner: a reader connection failed: %s", e)
                conn.close()


def _device_uuid(device_id: int) -> str:
    try:
        return str(torch.cuda.get_device_properties(device_id).uuid)
    except Exception:  # noqa: BLE001 - informative only (and absent on CPU test doubles)
        return ""


# --------------------------------------------------------------------------- reader
class TensorImporter:
    """Reader side: fetch the owner's manifest and file descriptors; map what is needed.

    Args:
        address: the owner's socket address (`socket_address`).
        device_id: this process's CUDA device index.
        timeout_s: how long to wait for the owner to publish (it may be loading its weights), and
            for each message of the hand-over once connected.
        owner_name: how the owner is called in messages (e.g. "zerodp source DP0 TP0").
        driver: the VMM calls (default `VmmDriver`, CUDA).
        can_access_peer: `(our device, owner device) -> bool` (default CUDA's peer-access query).

    Raises:
        PeerError: the owner did not publish or hand over within `timeout_s`, or the two GPUs
            have no peer access.
    """

    def __init__(self, address: str, device_id: int, timeout_s: float, owner_name: str,
                 driver: VmmDriver | None = None, can_access_peer: Callable[[int, int], bool] | None = None):
        self.driver = driver or VmmDriver()
        self.device_id = device_id
        self.owner_name = owner_name
        deadline = time.monotonic() + timeout_s
        waiting = (f"sgl-sidp GPU {device_id} (pid {os.getpid()}) waits for {owner_name} to publish its tensors at "
                   f"{address.replace(chr(0), '@')}")
        with Progress(waiting, logger, limit_s=timeout_s):  # the owner may still be loading its weights
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
        sock.settimeout(max(1.0, deadline - time.monotonic()))
        fds: list[int] = []
        self._closed = False
        self._mapped: list[tuple[object, int, int]] = []
        self._fd: dict[tuple[int, str], int] = {}
        try:
            self.header = json.loads(_recv_msg(sock))
            self.entries = [TensorSpec.from_json(e) for e in self.header["entries"]]
            while len(fds) < len(self.entries):
                _, got, _, _ = socket.recv_fds(sock, 1, _FDS_PER_MESSAGE)
                if not got:
                    raise PeerError(f"{owner_name} closed the connection while sending handles")
                fds.extend(got)
            if len(fds) != len(self.entries):
                raise PeerError(f"{owner_name} sent {len(fds)} handles for {len(self.entries)} tensors")
            self.owner_pid = int(self.header["pid"])
            self.owner_device = int(self.header["device_id"])
            self._alloc = {(e["layer_id"], e["name"]): int(e["alloc_size"]) for e in self.header["entries"]}
            self._fd = {t.key: fd for t, fd in zip(self.entries, fds)}
            can = can_access_peer or torch.cuda.can_device_access_peer
            if self.owner_device != device_id and not can(device_id, self.owner_device):
                raise PeerError(f"GPU {device_id} has no peer access to GPU {self.owner_device} ({owner_name})")
        except BaseException as e:
            for fd in fds:
                os.close(fd)
            sock.close()
            if isinstance(e, (socket.timeout, ConnectionError)):
                raise PeerError(f"{owner_name} connected but did not hand over its tensors ({e})") from None
            raise
        sock.settimeout(None)  # from here on the socket only carries the owner's EOF (`watch`)

    def map(self, keys: Sequence[tuple[int, str]]) -> dict[tuple[int, str], torch.Tensor]:
        """Map the owner's tensors `keys` into this process, as tensors on our device (read them only).

        Raises:
            PeerError: a key the owner does not share, or a driver call failed (what this call
                mapped so far is unmapped and released again).
        """
        spec = {t.key: t for t in self.entries}
        out = {}
        done: list[tuple[object, int, int]] = []
        try:
            for key in keys:
                if key not in spec:
                    raise PeerError(f"{self.owner_name} does not share layer {key[0]} {key[1]}")
                t = spec[key]
                size = self._alloc[key]
                handle = self.driver.import_fd(self._fd[key])
                try:
                    va = self.driver.map(handle, size, self.device_id)
                except Exception:
                    self.driver.release(handle)
                    raise
                done.append((handle, va, size))
                dtype = getattr(torch, t.dtype.replace("torch.", ""))
                out[key] = self.driver.tensor(va, t.shape, dtype, self.device_id)
        except Exception as e:
            for handle, va, size in reversed(done):
                self.driver.unmap(va, size)
                self.driver.release(handle)
            if isinstance(e, PeerError):
                raise
            raise PeerError(f"mapping {self.owner_name}'s tensors failed: {e}") from e
        self._mapped += done
        return out

    def close(self) -> None:
        """Unmap and release everything `map` mapped, close the handles' fds and the socket.

        A watcher started by `watch` ends without calling its `on_lost`: closing is not losing the owner.
        """
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the watcher's recv
        except OSError:
            pass
        for handle, va, size in reversed(self._mapped):
            self.driver.unmap(va, size)
            self.driver.release(handle)
        self._mapped = []
        for fd in self._fd.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fd = {}
        self._sock.close()

    def watch(self, on_lost: Callable[[str], None] = stop_server) -> threading.Thread:
        """Start a daemon thread that calls `on_lost(message)` once the owner's socket closes (the owner died).

        Default `on_lost`: `stop_server` (log, stop the whole server, exit this process).
        """

        def run():
            try:
                while self._sock.recv(1):
                    pass
            except OSError:
                pass
            if self._closed:
                return
            on_lost(
                f"sgl-sidp: {self.owner_name} (pid {self.owner_pid}, GPU {self.owner_device}) is gone; "
                "this process reads weights from that process's GPU memory and cannot serve without it. "
                "Stopping the server."
            )

        thread = threading.Thread(target=run, name="sgl-sidp-peer-owner-watch", daemon=True)
        thread.start()
        return thread


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
