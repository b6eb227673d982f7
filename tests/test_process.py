"""sgl_sidp.process: naming the failing process, stopping the whole server, and the progress lines of long waits."""

import logging
import multiprocessing
import os
import signal
import time

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


class _Proc:
    def __init__(self, pid, status):
        self.pid, self._status = pid, status

    def status(self):
        return self._status


def test_peer_watch_names_a_peer_that_exits_or_is_stopped():
    import psutil

    table = {}
    watch = process.PeerWatch({"sidp rank DP1 TP0": "sglang::scheduler_DP1_TP0"}, "the ranks run in lockstep",
                              find=lambda title: table.get(title), starting=lambda: True)
    assert watch.check(0.0) is None  # not started yet: wait
    table["sglang::scheduler_DP1_TP0"] = _Proc(42, psutil.STATUS_RUNNING)
    assert watch.check(1.0) is None
    table["sglang::scheduler_DP1_TP0"] = _Proc(42, psutil.STATUS_STOPPED)
    assert watch.check(2.0) is None and watch.check(3.5) is None  # stopped for 1.5 s: not yet
    assert watch.check(4.0) == ("sgl-sidp: sidp rank DP1 TP0 (pid 42) is stopped (SIGSTOP) for 2 s; the ranks run "
                                "in lockstep")
    table["sglang::scheduler_DP1_TP0"] = _Proc(42, psutil.STATUS_TRACING_STOP)  # a debugger: left alone
    assert watch.check(9.0) is None
    del table["sglang::scheduler_DP1_TP0"]
    assert watch.check(10.0) == "sgl-sidp: sidp rank DP1 TP0 (pid 42) exited; the ranks run in lockstep"


def test_peer_watch_finds_a_real_process_by_its_title_and_sees_it_stop(monkeypatch):
    """A real child titled like an SGLang scheduler, under this process as the launcher: SIGSTOP, then SIGKILL."""
    import subprocess
    import sys
    import time

    monkeypatch.setenv(process.LAUNCHER_PID_ENV, str(os.getpid()))
    assert process.scheduler_title(1, 0, 1) == "sglang::scheduler_DP1"  # SGLang names TP ranks only with TP > 1
    assert process.scheduler_title(1, 3, 4) == "sglang::scheduler_DP1_TP3"
    child = subprocess.Popen([sys.executable, "-c", "import setproctitle, time; "
                              "setproctitle.setproctitle('sglang::scheduler_DP1'); time.sleep(60)"])
    lost = []
    watch = process.PeerWatch({"DP1": process.scheduler_title(1, 0, 1)}, "why", on_lost=lost.append, interval_s=0.1,
                              stopped_s=0.3, starting=lambda: True)
    try:
        deadline = time.monotonic() + 20
        while "DP1" not in watch.seen and time.monotonic() < deadline:
            assert watch.check(time.monotonic()) is None
            time.sleep(0.1)
        assert watch.seen == {"DP1": child.pid}
        watch.start()
        os.kill(child.pid, signal.SIGSTOP)
        while not lost and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lost and lost[0].startswith(f"sgl-sidp: DP1 (pid {child.pid}) is stopped (SIGSTOP)"), lost
    finally:
        child.kill()
        child.wait()


def test_peer_watch_names_a_peer_that_died_before_it_looked():
    """Never seen, and no sibling is still starting: the peer is gone (it died before this process loaded)."""
    starting = [True]
    watch = process.PeerWatch({"sidp rank DP1 TP0": "sglang::scheduler_DP1"}, "lockstep", find=lambda title: None,
                              starting=lambda: starting[0])
    assert watch.check(0.0) is None
    starting[0] = False
    assert watch.check(1.0) == "sgl-sidp: sidp rank DP1 TP0 is not running (it exited before this process looked); lockstep"


def test_siblings_starting_sees_a_spawned_child_before_its_title(tmp_path):
    """A `multiprocessing` spawn child under the same parent counts as starting until SGLang titles it."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing as mp, time, setproctitle
        from sgl_sidp.process import siblings_starting

        def titled(q, title):
            if title:
                setproctitle.setproctitle(title)
            q.put(1)
            time.sleep(30)

        def ask(q):
            q.put(siblings_starting())
            time.sleep(30)

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            for title in ("sglang::scheduler_DP1", None):
                a = ctx.Process(target=titled, args=(q, title), daemon=True); a.start(); q.get(timeout=60)
                b = ctx.Process(target=ask, args=(q,), daemon=True); b.start(); print("answer", q.get(timeout=60), flush=True)
                a.kill(); b.kill(); a.join(); b.join()
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert out.stdout.split() == ["answer", "False", "answer", "True"], (out.stdout, out.stderr[-2000:])


def test_progress_says_what_is_awaited_how_long_and_the_limit(caplog):
    """A long wait logs, every `every_s`, who waits for what, the seconds so far and the limit, and where it is now;
    a wait shorter than `every_s` logs nothing."""
    log = logging.getLogger("tests.progress")
    now = [100.0]
    p = process.Progress("sgl-sidp GPU 1 waits for zerodp source DP0 TP0 to publish its tensors", log, limit_s=900,
                         clock=lambda: now[0])
    now[0] += 10
    assert p.message() == ("sgl-sidp GPU 1 waits for zerodp source DP0 TP0 to publish its tensors: 10 s so far, "
                           "limit 900 s")
    now[0] += 10.4
    p.at("decode batch 16 (3 of 6)")
    assert p.message().endswith(": 20 s so far, limit 900 s; now decode batch 16 (3 of 6)")
    assert process.Progress("x", log).message() == "x: 0 s so far"  # no limit known

    with caplog.at_level(logging.INFO, logger=log.name):
        with process.Progress("quick", log):  # the default 10 s: nothing before the block ends
            pass
        assert caplog.records == []
        with process.Progress("sgl-sidp: rank 0 waits for rank 1", log, limit_s=5, every_s=0.01) as p:
            p.at("the handles")
            deadline = time.monotonic() + 1.0
            while len(caplog.records) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        n = len(caplog.records)
        time.sleep(0.05)
    assert n >= 2 and len(caplog.records) == n  # none after the block ended
    assert all(r.getMessage().startswith("sgl-sidp: rank 0 waits for rank 1: 0 s so far, limit 5 s; now the handles")
               for r in caplog.records)


def test_dp_rank_reads_the_ps_of_a_scheduler_or_runner():
    from types import SimpleNamespace

    assert process.dp_rank(SimpleNamespace(ps=SimpleNamespace(dp_rank=2))) == 2
    assert process.dp_rank(SimpleNamespace(ps=SimpleNamespace(dp_rank=None))) == 0  # --dp-size 1
