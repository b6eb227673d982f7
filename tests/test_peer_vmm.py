"""Owner/reader hand-over (`sgl_sidp.peer.vmm`) and its move plan, on CPU with a fake VMM driver and real Unix sockets."""

import os
import socket
import threading
import time
import uuid
import weakref

import pytest
import torch

from sgl_sidp.peer.manifest import TensorSpec
from sgl_sidp.peer.moves import plan_moves
from sgl_sidp.peer.vmm import PeerError, TensorExporter, TensorImporter, VmmDriver, socket_address

GRAN = 4096  # the fake's allocation granularity
CAP = 80_000_000_000  # the fake GPU's memory


class FakeDriver(VmmDriver):
    """VMM on CPU: a handle owns a uint8 buffer ("physical memory"), its VA is the buffer's address.

    Exported fds are memfds; `device` (shared by owner and reader drivers) maps a memfd's inode to
    its buffer, so a reader importing an fd maps the owner's very bytes. Free memory is CAP minus
    the bytes created and not released minus the `track`ed originals whose storage is still alive.
    """

    def __init__(self, device, fail_create_on=None, fail_map_on=None):
        super().__init__()
        self.device, self.fail_create_on, self.fail_map_on = device, fail_create_on, fail_map_on
        self.phys, self.at_va, self.originals = {}, {}, []
        self.created_bytes, self.n_create, self.n_map, self.n_return_cached = 0, 0, 0, 0
        self.create_sizes, self.mapped, self.unmapped, self.released = [], [], [], []

    def track(self, t):
        self.originals.append((weakref.ref(t.untyped_storage()), t.nbytes))

    def granularity(self, device_id):
        return GRAN

    def create(self, size, device_id):
        self.n_create += 1
        if self.n_create == self.fail_create_on:
            raise RuntimeError("CUDA_ERROR_OUT_OF_MEMORY")
        handle = ("created", self.n_create)
        self.phys[handle] = torch.zeros(size, dtype=torch.uint8)
        self.created_bytes += size
        self.create_sizes.append(size)
        return handle

    def map(self, handle, size, device_id):
        self.n_map += 1
        if self.n_map == self.fail_map_on:
            raise RuntimeError("CUDA_ERROR_INVALID_VALUE")
        buf = self.phys[handle]
        self.at_va[buf.data_ptr()] = buf
        self.mapped.append((handle, buf.data_ptr()))
        return buf.data_ptr()

    def tensor(self, va, shape, dtype, device_id):
        n = torch.Size(shape).numel() * dtype.itemsize
        return self.at_va[va][:n].view(dtype).view(shape)

    def export_fd(self, handle):
        fd = os.memfd_create(f"fake-vmm-{handle[1]}")
        self.device[os.fstat(fd).st_ino] = self.phys[handle]
        return fd

    def import_fd(self, fd):
        handle = ("imported", fd)
        self.phys[handle] = self.device[os.fstat(fd).st_ino]
        return handle

    def unmap(self, va, size):
        self.unmapped.append(va)

    def release(self, handle):
        self.released.append(handle)
        if handle[0] == "created":
            self.created_bytes -= self.phys[handle].numel()

    def free_bytes(self, device_id):
        alive = sum(n for ref, n in self.originals if ref() is not None)
        return CAP - self.created_bytes - alive

    def return_cached(self, device_id):
        self.n_return_cached += 1


# (layer, name, shape, dtype): distinct sizes, all multiples of GRAN, listed out of (layer, name) order.
TENSORS = [
    ((1, "w2"), (1024,), torch.float32),  # 4096 bytes
    ((2, "w13"), (5, 1024), torch.int32),  # 20480
    ((0, "w2"), (3, 1024), torch.float32),  # 12288
    ((1, "w13"), (2, 2048), torch.float16),  # 8192
    ((0, "w13"), (2, 4096), torch.bfloat16),  # 16384
]
PLAN_ORDER = [(0, "w13"), (0, "w2"), (1, "w13"), (1, "w2"), (2, "w13")]
SIZES_IN_PLAN_ORDER = [16384, 12288, 8192, 4096, 20480]


def spec(key, shape, dtype):
    return TensorSpec(key[0], key[1], tuple(shape), str(dtype), torch.Size(shape).numel() * dtype.itemsize)


def make_params(driver):
    """Parameters of TENSORS with distinct values (tracked as the fake's originals), and a copy of each."""
    params, before = {}, {}
    for i, (key, shape, dtype) in enumerate(TENSORS):
        p = torch.nn.Parameter((torch.arange(torch.Size(shape).numel()) % 50 + 100 * i).to(dtype).view(shape), requires_grad=False)
        driver.track(p.data)
        params[spec(key, shape, dtype)] = p
        before[key] = p.detach().clone()
    return params, before


def close_exporter(exp):
    """What the exporter has no method for: stop its accept thread, drop readers' connections, close its fds."""
    exp._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
    exp._sock.close()
    for conn in exp._conns:
        conn.close()
    for fd in exp._fds:
        os.close(fd)


@pytest.fixture
def owner():
    """An exporter over make_params with a fake driver; yields (exporter, params, values before, shared device)."""
    device = {}
    driver = FakeDriver(device)
    params, before = make_params(driver)
    exp = TensorExporter(params, None, socket_address(f"test-{uuid.uuid4().hex}", 0, 0), driver=driver)
    exp.header["device_id"] = 0  # CPU tensors have no device index; readers expect an int
    yield exp, params, before, device
    close_exporter(exp)


def wait_for(cond, timeout=2.0):
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


def test_plan_moves_orders_aligns_and_sums():
    """Moves go in (layer, name) order whatever the input order; sizes round up; peak is the largest allocation."""
    specs = [TensorSpec(10, "a", (1,), "torch.uint8", 1), TensorSpec(2, "w2", (4097,), "torch.uint8", 4097),
             TensorSpec(2, "w13", (4096,), "torch.uint8", 4096)]
    plan = plan_moves(specs, 4096)
    assert plan.order == ((2, "w13"), (2, "w2"), (10, "a"))
    assert plan.alloc_bytes == {(2, "w13"): 4096, (2, "w2"): 8192, (10, "a"): 4096}
    assert plan.peak_extra_bytes == 8192
    assert plan.total_bytes == 16384
    assert plan_moves([], 4096).peak_extra_bytes == 0
    with pytest.raises(ValueError, match="repeated"):
        plan_moves(specs + [TensorSpec(2, "w2", (1,), "torch.uint8", 1)], 4096)
    for bad in (0, -4096):
        with pytest.raises(ValueError, match="granularity"):
            plan_moves(specs, bad)


def test_exporter_rehomes_params_one_at_a_time(owner):
    """Each parameter keeps its values in its own fake VMM buffer; originals are freed before the next allocation."""
    exp, params, before, _ = owner
    driver = exp.driver
    for s, p in params.items():
        assert torch.equal(p.data, before[s.key])
        assert p.data.data_ptr() in driver.at_va
        assert p.data.untyped_storage().nbytes() == driver.at_va[p.data.data_ptr()].numel()
    assert driver.create_sizes == SIZES_IN_PLAN_ORDER
    assert driver.n_return_cached == len(TENSORS)
    assert exp.peak_extra_bytes == 20480 == exp.plan.peak_extra_bytes  # one tensor, never the sum (61440)
    assert [(e["layer_id"], e["name"]) for e in exp.entries] == PLAN_ORDER
    assert [e["alloc_size"] for e in exp.entries] == SIZES_IN_PLAN_ORDER
    assert exp.header["entries"] == exp.entries and exp.header["pid"] == os.getpid()
    assert exp.nbytes == sum(SIZES_IN_PLAN_ORDER)
    assert len(exp._fds) == len(TENSORS)


def test_exporter_allocation_failure_names_tensor_and_keeps_moved_ones():
    """A failed allocation raises PeerError naming the tensor and the GB wanted/free; earlier moves stay valid."""
    driver = FakeDriver({}, fail_create_on=3)
    params, before = make_params(driver)
    with pytest.raises(PeerError) as err:
        TensorExporter(params, None, socket_address(f"test-{uuid.uuid4().hex}", 0, 0), driver=driver)
    msg = str(err.value)
    assert "cannot allocate 0.00 GB" in msg and "layer 1 w13" in msg
    assert "(80.00 GB free)" in msg and "CUDA_ERROR_OUT_OF_MEMORY" in msg
    by_key = {s.key: p for s, p in params.items()}
    for key in PLAN_ORDER:
        assert torch.equal(by_key[key].data, before[key])
        assert (by_key[key].data.data_ptr() in driver.at_va) == (key in PLAN_ORDER[:2])


def test_exporter_rejects_param_on_another_device():
    """A parameter not on the exporter's device is refused before anything is allocated."""
    driver = FakeDriver({})
    params, _ = make_params(driver)
    with pytest.raises(PeerError, match="layer 0 w13: expected a contiguous tensor on cuda:0"):
        TensorExporter(params, 0, socket_address(f"test-{uuid.uuid4().hex}", 0, 0), driver=driver)
    assert driver.create_sizes == []


def test_importer_maps_owner_memory_and_cleans_up(owner):
    """A reader gets every entry, maps the owner's bytes, undoes a failed map() call, and close() releases the rest."""
    exp, params, before, device = owner
    asked = []
    driver = FakeDriver(device, fail_map_on=5)
    imp = TensorImporter(exp.address, 1, 2.0, "owner A", driver=driver, can_access_peer=lambda a, b: asked.append((a, b)) or True)
    try:
        assert asked == [(1, 0)]
        assert imp.entries == [s for key in PLAN_ORDER for s in params if s.key == key]
        assert imp.owner_pid == os.getpid() and imp.owner_device == 0
        owner_data = {s.key: p.data for s, p in params.items()}
        got = imp.map([(0, "w2"), (2, "w13")])
        for key, t in got.items():
            assert t.dtype == before[key].dtype and t.shape == before[key].shape
            assert torch.equal(t, before[key]) and t.data_ptr() == owner_data[key].data_ptr()
        first = list(driver.mapped)

        with pytest.raises(PeerError, match="owner A does not share layer 9 nope"):
            imp.map([(0, "w13"), (9, "nope")])
        assert driver.unmapped == [driver.mapped[2][1]] and driver.released == [driver.mapped[2][0]]

        with pytest.raises(PeerError, match="mapping owner A's tensors failed: CUDA_ERROR_INVALID_VALUE"):
            imp.map([(1, "w13"), (1, "w2")])  # map call 4 succeeds, call 5 fails
        # the handle whose map() failed is released first, then the call's earlier mapping is undone
        assert driver.unmapped[1:] == [driver.mapped[3][1]] and driver.released[2:] == [driver.mapped[3][0]]
        assert len(driver.released) == 3 and driver.released[1] not in [h for h, _ in driver.mapped]

        driver.unmapped.clear()
        driver.released.clear()
        imp.close()
        assert sorted(driver.unmapped) == sorted(va for _, va in first)
        assert sorted(driver.released) == sorted(h for h, _ in first)
    finally:
        imp.close()


def test_importer_refuses_gpu_without_peer_access(owner):
    """A reader on another GPU without peer access to the owner's GPU raises PeerError naming both."""
    exp = owner[0]
    with pytest.raises(PeerError, match=r"GPU 3 has no peer access to GPU 0 \(owner B\)"):
        TensorImporter(exp.address, 3, 2.0, "owner B", driver=FakeDriver({}), can_access_peer=lambda a, b: False)


def test_importer_times_out_without_owner(monkeypatch, caplog):
    """With nobody listening, the reader gives up after about timeout_s, saying the owner did not publish; meanwhile
    it logs (every `PROGRESS_EVERY_S`, 10 s in a server) whom it waits for, where, how long so far and the limit."""
    import logging

    from sgl_sidp import process

    monkeypatch.setattr(process, "PROGRESS_EVERY_S", 0.3)
    name = f"test-{uuid.uuid4().hex}"
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="sgl_sidp.peer.vmm"), \
            pytest.raises(PeerError, match="owner C did not publish its tensors within 1 s"):
        TensorImporter(socket_address(name, 0, 0), 0, 1.0, "owner C", driver=FakeDriver({}))
    assert 1.0 <= time.monotonic() - t0 < 3.0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) >= 2 and all(m.startswith(f"sgl-sidp GPU 0 (pid {os.getpid()}) waits for owner C to publish its "
                                                f"tensors at @sgl-sidp-{name}.0.tp0: ") for m in lines)
    assert lines[-1].endswith(" s so far, limit 1 s")


def test_importer_times_out_when_owner_sends_nothing():
    """An owner that accepts but never sends makes the reader fail after about timeout_s: it did not hand over."""
    address = socket_address(f"test-{uuid.uuid4().hex}", 0, 0)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(1)
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(PeerError, match="owner D connected but did not hand over its tensors"):
            TensorImporter(address, 0, 1.0, "owner D", driver=FakeDriver({}))
        assert 0.9 <= time.monotonic() - t0 < 3.0
    finally:
        for conn in accepted:
            conn.close()
        server.close()


def test_watch_reports_owner_gone_once(owner):
    """When the owner's end of the connection closes, on_lost is called once with a message naming the owner."""
    exp = owner[0]
    imp = TensorImporter(exp.address, 0, 2.0, "zerodp source DP0 TP0", driver=FakeDriver(owner[3]))
    calls = []
    thread = imp.watch(calls.append)
    assert wait_for(lambda: len(exp._conns) == 1)
    time.sleep(0.2)
    assert calls == []  # a live owner is not reported
    exp._conns[0].close()
    thread.join(timeout=2.0)
    assert not thread.is_alive() and len(calls) == 1
    assert f"zerodp source DP0 TP0 (pid {os.getpid()}, GPU 0) is gone" in calls[0]
    imp.close()
