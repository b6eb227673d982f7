"""Which SGLang process this is, how any of them stops the whole server (fail closed), and how its long
start-up waits say what they wait for (`Progress`).

SGLang runs a server as a tree of processes: the launcher (HTTP server and tokenizer manager), a DP controller
when `--dp-size > 1`, one scheduler per (DP, TP) rank and a detokenizer, each spawned by `multiprocessing`. The
overlay's plugin loads in every one of them. When anything of ours fails in one process, the whole server stops,
with one line that names the process (`process_name`) and the cause (`stop_server`).
"""

from __future__ import annotations

import inspect
import logging
import multiprocessing
import os
import signal
import threading
import time
from typing import Callable

logger = logging.getLogger(__name__)

#: Environment variable with the pid of the process that launched the server (the HTTP server, where SGLang installs
#: its SIGQUIT handler); set by `sgl_sidp.launch_server`.
LAUNCHER_PID_ENV = "SIDP_LAUNCHER_PID"

#: The prefix of the titles SGLang gives its child processes (`setproctitle("sglang::scheduler_DP0_TP0")`).
SGLANG_CHILD_TITLE = "sglang::"

#: Seconds between two `Progress` lines of a long start-up wait or phase (tests shorten it).
PROGRESS_EVERY_S = 10.0


def in_launcher() -> bool:
    """Whether this is the process that launched the server: `$SIDP_LAUNCHER_PID` (our launcher), else a process
    that `multiprocessing` did not start and is not starting (`python -m sglang.launch_server` itself)."""
    pid = os.environ.get(LAUNCHER_PID_ENV)
    if pid:
        return int(pid) == os.getpid()
    return multiprocessing.parent_process() is None and not getattr(multiprocessing.current_process(), "_inheriting", False)


def _title(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline()) or psutil.Process(pid).name()
    except psutil.Error:
        return ""


def launcher_pid() -> int:
    """The launcher's pid: `$SIDP_LAUNCHER_PID`, else the nearest ancestor that is not one of SGLang's titled child
    processes (a scheduler's parent is the DP controller when `--dp-size > 1`)."""
    pid = int(os.environ.get(LAUNCHER_PID_ENV) or 0)
    if pid > 0:
        return pid
    import psutil

    proc = psutil.Process().parent()
    while proc is not None and _title(proc.pid).startswith(SGLANG_CHILD_TITLE) and proc.parent() is not None:
        proc = proc.parent()
    return proc.pid if proc is not None else os.getppid()


def process_name() -> str:
    """This process for an error line: "scheduler DP1 TP0 (GPU 1, pid 4242)", "DP controller (pid 4240)", "the
    launcher (pid 4200)"; a child caught before `multiprocessing` handed it its target is named by its pid and parent.

    The ranks come from the arguments SGLang spawned the process with (`run_scheduler_process(server_args, port_args,
    gpu_id, tp_rank, ..., dp_rank)`), read from `multiprocessing.current_process()`.
    """
    pid = os.getpid()
    if in_launcher():
        return f"the launcher (pid {pid})"
    proc = multiprocessing.current_process()
    target = getattr(proc, "_target", None)
    name = getattr(target, "__name__", "")
    if name == "run_scheduler_process":
        try:
            a = inspect.signature(target).bind_partial(*proc._args, **proc._kwargs).arguments
            return f"scheduler DP{a.get('dp_rank') or 0} TP{a.get('tp_rank')} (GPU {a.get('gpu_id')}, pid {pid})"
        except (TypeError, AttributeError):
            return f"a scheduler (pid {pid})"
    if name == "run_data_parallel_controller_process":
        return f"DP controller (pid {pid})"
    if name.startswith("run_"):
        return f"{name[4:].removesuffix('_process').replace('_', ' ')} (pid {pid})"
    parent = os.getppid()
    return f"an SGLang child process (pid {pid}, parent {parent} {_title(parent)!r})"


def dp_rank(owner) -> int:
    """The DP rank (replica) of an SGLang `Scheduler` or `ModelRunner`: `owner.ps.dp_rank`, 0 where SGLang gives
    none (`--dp-size 1`).

    The one read of SGLang's `.ps` left, on purpose: no DP-rank accessor exists in both the pinned 0.5.17 and 0.5.23
    (0.5.23 drops `.ps` and the Scheduler's `dp_rank` argument and offers `runtime_context.get_parallel().dp_rank`,
    which 0.5.17 lacks). The TP rank, size and group come from `sglang.srt.distributed.parallel_state`, which both keep.
    """
    return int(owner.ps.dp_rank or 0)


class Progress:
    """A long start-up wait or phase that logs, every `every_s` while it lasts, what it waits for and for how long.

    Used as a context manager around the wait: a daemon thread logs `message()` at INFO every `every_s` seconds
    until the block ends (a block shorter than `every_s` logs nothing), so a blocking call (a rendezvous) is covered
    as well as a polling loop. A phase that moves on says where it is with `at(...)`.

    Args:
        what: who waits for what, from whom ("sgl-sidp GPU 1 waits for zerodp source DP0 TP0 to publish its
            tensors"); the message starts with it.
        log: the logger of the module that waits (`logging.getLogger(__name__)`).
        limit_s: the wait's time limit (or a phase's budget), for the message; None: none known.
        every_s: seconds between messages (default `PROGRESS_EVERY_S`, 10).
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, what: str, log: logging.Logger, limit_s: float | None = None, every_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.what, self.log, self.limit_s, self.clock = what, log, limit_s, clock
        self.every_s = PROGRESS_EVERY_S if every_s is None else every_s
        self.detail = ""
        self.t0 = clock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def at(self, detail: str) -> None:
        """Where the wait or phase is now ("decode batch 16 (3 of 6)"), for the next message."""
        self.detail = detail

    def message(self) -> str:
        """The line logged: `<what>: 20 s so far, limit 900 s; now <detail>`."""
        limit = f", limit {self.limit_s:g} s" if self.limit_s is not None else ""
        now = f"; now {self.detail}" if self.detail else ""
        return f"{self.what}: {self.clock() - self.t0:.0f} s so far{limit}{now}"

    def _run(self) -> None:
        while not self._done.wait(self.every_s):
            self.log.info("%s", self.message())

    def __enter__(self) -> "Progress":
        self.t0 = self.clock()
        self._thread = threading.Thread(target=self._run, name="sgl-sidp-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


def stop_server(message: str) -> None:
    """Log `message` and stop the whole server, SGLang's way, then exit this process.

    SGLang's launcher process handles SIGQUIT by killing its process tree (HTTP server, DP controller, every
    scheduler). A scheduler's own exception path signals only its parent, which with `--dp-size > 1` is the DP
    controller (no handler: it dies silently). So the launcher is signalled directly (`launcher_pid`).
    """
    logger.error(message)
    try:
        os.kill(launcher_pid(), signal.SIGQUIT)
    finally:
        os._exit(1)


class FailClosed:
    """The core's AROUND hooks on the scheduler (`sgl_sidp.hooks.HOOKS`): a scheduler that raises stops the server.

    SGLang's `run_scheduler_process` logs the traceback and signals only the scheduler's parent; with `--dp-size > 1`
    that is the DP controller, whose death takes the other replicas down with it, and their peers' watchers then
    report the wrong process. Here the traceback is logged, then `stop_server` names this scheduler and the cause.
    """

    def __init__(self, ctx):
        self.ctx = ctx

    def around_scheduler(self, original, *args, **kwargs):
        """Run `original` (`Scheduler.__init__` or `Scheduler.run_event_loop`); on an exception, stop the server."""
        try:
            return original(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any failure of a scheduler stops the server
            logger.exception("sgl-sidp: %s raised", process_name())
            stop_server(f"sgl-sidp: {process_name()} failed ({type(e).__name__}: {e}); stopping the server")
            raise  # only reached where stop_server is stubbed (tests)


def siblings_starting() -> bool:
    """Whether a sibling of this process (another child of its parent) is still starting: it runs
    `multiprocessing`'s `spawn_main` and SGLang has not titled it yet."""
    import psutil

    try:
        siblings = psutil.Process().parent().children()
    except (psutil.Error, AttributeError):
        return True
    for proc in siblings:
        try:
            if proc.pid != os.getpid() and "spawn_main" in " ".join(proc.cmdline()):
                return True
        except psutil.Error:
            continue
    return False


def scheduler_title(dp_rank: int, tp_rank: int, tp_size: int) -> str:
    """The title SGLang's `configure_scheduler_process` gives the scheduler of (DP, TP) rank when `--dp-size > 1`
    (the TP rank only where `--tp-size > 1`; no PP, context or expert parallelism)."""
    return f"{SGLANG_CHILD_TITLE}scheduler_DP{dp_rank}" + (f"_TP{tp_rank}" if tp_size > 1 else "")


class PeerWatch:
    """Stop the whole server as soon as a peer process this one waits on exits or is stopped (SIGSTOP).

    Processes that run in step (SiDP's cas/auto ranks: every iteration is a collective) would otherwise wait for a
    dead or frozen peer until a timeout (`--sidp-owner-timeout-s`, 900 s by default). A daemon thread looks the
    peers up by the titles SGLang gives its processes, among the launcher's descendants, every `interval_s`; once a
    peer was seen, its disappearance (or a zombie) means it exited, and a `stopped` state that lasts `stopped_s`
    means it was frozen. A peer under a debugger ("tracing-stop") is left alone.

    A peer that died before this process started watching was never seen: it counts as gone once no sibling process
    (a child of this process's parent, the DP controller) is still starting, i.e. still runs `multiprocessing`'s
    `spawn_main` under no SGLang title yet.

    Args:
        peers: how each peer is named in messages -> its process title (`scheduler_title`).
        why: what this process needs the peers for, for the message.
        on_lost: called once with the message (default `stop_server`).
        find: `title -> psutil.Process | None` (default: the launcher's descendant with that title); tests pass one.
        starting: `() -> bool`, whether a sibling is still starting (default `siblings_starting`); tests pass one.
    """

    def __init__(self, peers: dict[str, str], why: str, on_lost=None, find=None, starting=None, interval_s: float = 0.5,
                 stopped_s: float = 2.0):
        self.peers, self.why, self.interval_s, self.stopped_s = dict(peers), why, interval_s, stopped_s
        self.on_lost = on_lost or stop_server
        self.find = find or self._find
        self.starting = starting or siblings_starting
        self.seen: dict[str, int] = {}
        self._stopped_since: dict[str, float] = {}
        self._done = False

    @staticmethod
    def _find(title: str):
        import psutil

        try:
            for proc in psutil.Process(launcher_pid()).children(recursive=True):
                cmd = " ".join(proc.cmdline()).split()
                if cmd and cmd[0] == title:
                    return proc
        except psutil.Error:
            pass
        return None

    def check(self, now: float) -> str | None:
        """One look at every peer: the message for a lost one, else None."""
        import psutil

        for name, title in self.peers.items():
            proc = self.find(title)
            try:
                status = proc.status() if proc is not None else None
            except psutil.Error:
                status = None
            if status is None or status == psutil.STATUS_ZOMBIE:
                if name in self.seen:
                    return f"sgl-sidp: {name} (pid {self.seen[name]}) exited; {self.why}"
                if not self.starting():
                    return f"sgl-sidp: {name} is not running (it exited before this process looked); {self.why}"
                continue
            self.seen[name] = proc.pid
            if status == psutil.STATUS_STOPPED:
                since = self._stopped_since.setdefault(name, now)
                if now - since >= self.stopped_s:
                    return (f"sgl-sidp: {name} (pid {proc.pid}) is stopped (SIGSTOP) for {now - since:.0f} s; "
                            f"{self.why}")
            else:
                self._stopped_since.pop(name, None)
        return None

    def start(self):
        """Start the watching thread; returns it."""
        import threading
        import time

        def run():
            while not self._done:
                message = self.check(time.monotonic())
                if message is not None:
                    self._done = True
                    self.on_lost(message + "; stopping the server")
                    return
                time.sleep(self.interval_s)

        thread = threading.Thread(target=run, name="sgl-sidp-peer-watch", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._done = True
