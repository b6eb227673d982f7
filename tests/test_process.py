"""sgl_sidp.process: naming the failing process and stopping the whole server."""

import logging
import multiprocessing
import os
import signal

import pytest

from sgl_sidp import process
from sgl_sidp.process import process_name, stop_server


def test_stop_server_signals_launcher_then_exits(monkeypatch, caplog):
    """stop_server logs at ERROR, sends SIGQUIT to $SIDP_LAUNCHER_PID (else the parent), and always exits 1."""
    kills, exits = [], []
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((pid, sig)))
    monkeypatch.setattr(os, "_exit", exits.append)
    monkeypatch.setenv("SIDP_LAUNCHER_PID", "424242")
    with caplog.at_level(logging.ERROR, logger=process.__name__):
        stop_server("owner X is gone")
    assert kills == [(424242, signal.SIGQUIT)] and exits == [1]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.ERROR, "owner X is gone")]

    monkeypatch.delenv("SIDP_LAUNCHER_PID")
    stop_server("again")
    assert kills[-1] == (os.getppid(), signal.SIGQUIT) and exits == [1, 1]

    def gone(pid, sig):
        raise ProcessLookupError(pid)

    monkeypatch.setattr(os, "kill", gone)
    monkeypatch.setenv("SIDP_LAUNCHER_PID", "424242")
    with pytest.raises(ProcessLookupError):
        stop_server("launcher already dead")
    assert exits == [1, 1, 1]


def run_scheduler_process(server_args, port_args, gpu_id, tp_rank, attn_cp_rank, moe_dp_rank, moe_ep_rank, pp_rank,
                          dp_rank, pipe_writer):
    """Stands in for SGLang's scheduler entry (same parameters): reports the name the child gives itself."""
    pipe_writer.send(process_name())


def run_detokenizer_process(pipe_writer):
    pipe_writer.send(process_name())


@pytest.mark.parametrize("target, args, expected", [
    (run_scheduler_process, (None, None, 1, 0, 0, 0, 0, 0, 1), "scheduler DP1 TP0 (GPU 1, pid "),
    (run_detokenizer_process, (), "detokenizer (pid "),
])
def test_process_name_of_sglang_children(monkeypatch, target, args, expected):
    monkeypatch.delenv(process.LAUNCHER_PID_ENV, raising=False)
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    child = ctx.Process(target=target, args=(*args, writer))
    child.start()
    got = reader.recv()
    child.join(30)
    assert got == f"{expected}{child.pid})"


def test_process_name_of_the_launcher(monkeypatch):
    monkeypatch.setenv(process.LAUNCHER_PID_ENV, str(os.getpid()))
    assert process_name() == f"the launcher (pid {os.getpid()})"
    monkeypatch.delenv(process.LAUNCHER_PID_ENV)
    assert process_name() == f"the launcher (pid {os.getpid()})"  # not started by multiprocessing


def test_a_scheduler_that_raises_stops_the_server_naming_itself(monkeypatch, caplog):
    stopped = []
    monkeypatch.setattr(process, "stop_server", stopped.append)
    monkeypatch.setattr(process, "process_name", lambda: "scheduler DP1 TP0 (GPU 0, pid 7)")
    hook = process.FailClosed(ctx=None)
    assert hook.around_scheduler(lambda x: x + 1, 1) == 2 and stopped == []

    def capture_fails():
        raise RuntimeError("Capture must end on the same stream it began on.")

    with caplog.at_level(logging.ERROR, logger=process.__name__), pytest.raises(RuntimeError):
        hook.around_scheduler(capture_fails)
    assert stopped == ["sgl-sidp: scheduler DP1 TP0 (GPU 0, pid 7) failed (RuntimeError: Capture must end on the same "
                       "stream it began on.); stopping the server"]
    assert caplog.records[0].exc_info is not None  # the traceback is logged before the one line
