"""Fail closed, on one GPU (`pytest -m gpu tests/gpu/test_fail_closed_gpu.py`): a server whose overlay cannot run in
one of its processes stops, with one line naming that process and why, within seconds.

- SiDP cas with both DP ranks folded onto GPU 0: DP1 killed (SIGKILL) or frozen (SIGSTOP) while the group loads;
  DP0 stops the server naming it (`process.PeerWatch`), not after `--sidp-owner-timeout-s` (900 s).
- ZeroDP with the default policy and a 1 s `--zerodp-source-timeout-s`: the sink gives up waiting for the
  source's start-up calibration and the server stops naming the sink (`process.FailClosed`), not the source.
- `python -m sglang.launch_server` (vanilla SGLang's launcher) with an unreadable $SIDP_CONFIG: SGLang would log the
  plugin's exception and serve plain SGLang; the launcher exits 2 with one line instead.

The family checkpoints come from `scripts/make_family_models.py`; logs and facts go to $SIDP_GPU_LOGS.
"""

import json
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servers import COMMON, FOLD_KV_TOKENS, child_pid, summary
from sgl_sidp.bench.server import GPU_SAFE_ENV, ServerProcess
from sgl_sidp.process import scheduler_title

pytestmark = [pytest.mark.gpu]

MAKER = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts/make_family_models.py"))
FOLD = ["--dp-size", "2", "--overlay-fold-gpus", "--max-total-tokens", str(FOLD_KV_TOKENS)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("families")
    return {f: MAKER["make"](f, out) for f in ("qwen3", "qwen3_moe")}


def stopped_within(srv, seconds):
    t0 = time.time()
    while srv.proc.poll() is None and time.time() - t0 < seconds:
        time.sleep(0.2)
    return srv.proc.poll() is not None, time.time() - t0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["SIGKILL", "SIGSTOP"])
def test_sidp_cas_rank_lost_while_loading_stops_the_group(log_dir, models, sig):
    name = f"sidp_cas_{sig.name.lower()}_dp1"
    srv = ServerProcess("sgl_sidp.launch_server", ["--model-path", str(models["qwen3"]), *COMMON, "--overlay-mode", "sidp",
                                                  "--sidp-service", "cas", *FOLD],
                        port=25100 if sig == signal.SIGKILL else 25200, log_path=log_dir / f"{name}.log", gpus="0")
    srv.start()
    victim = None
    try:
        victim = child_pid(srv, scheduler_title(1, 0, 1))
        time.sleep(3)  # loading: SGLang's model load, the overlay's set-up, CUDA graph capture
        assert srv.proc.poll() is None, srv.log_tail()
        os.kill(victim, sig)
        stopped, after = stopped_within(srv, 60)
        log = srv.log_text()
    finally:
        if victim is not None and sig == signal.SIGSTOP:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        srv.stop()
    assert stopped, f"server still running 60 s after DP1 got {sig.name}:\n{srv.log_tail()}"
    # a killed rank: whichever notices first, the peer watch or the socket watcher of the layers DP1 owns
    named = ([f"sidp rank DP1 TP0 (pid {victim}) exited", f"sidp owner DP1 TP0 (pid {victim}, GPU 0) is gone",
              "sidp rank DP1 TP0 is not running (it exited before this process looked)"]
             if sig == signal.SIGKILL else [f"sidp rank DP1 TP0 (pid {victim}) is stopped (SIGSTOP)"])
    lines = [ln for ln in log.splitlines() if any(n in ln for n in named)]
    assert lines, srv.log_tail()
    summary(log_dir, name, signal=sig.name, stopped_after_s=round(after, 1), line=lines[0][-300:])


def test_zerodp_sink_that_fails_to_start_names_itself(log_dir, models, tmp_path):
    name = "zerodp_sink_fails"
    env = {"SIDP_CALIBRATION_DIR": str(tmp_path / "calibration")}  # empty: the sink waits for the source's
    srv = ServerProcess("sgl_sidp.launch_server", ["--model-path", str(models["qwen3_moe"]), *COMMON,
                                                  "--overlay-mode", "zerodp", "--zerodp-source-timeout-s", "1", *FOLD],
                        port=25300, log_path=log_dir / f"{name}.log", gpus="0", env=env)
    srv.start()
    try:
        stopped, after = stopped_within(srv, 240)
        log = srv.log_text()
    finally:
        srv.stop()
    assert stopped, srv.log_tail()
    import re

    first = next((ln for ln in log.splitlines() if re.search(r"sgl-sidp: .*( failed \(| is gone| exited)", ln)), "")
    assert "sgl-sidp: scheduler DP1 TP0 (GPU " in first and " failed (" in first, srv.log_tail()
    lines = [first]
    summary(log_dir, name, stopped_after_s=round(after, 1), line=lines[0][-400:], exit_code=srv.proc.returncode)


def test_vanilla_launcher_with_unreadable_overlay_settings_exits_with_one_line(log_dir, models):
    env = {**os.environ, **GPU_SAFE_ENV, "CUDA_VISIBLE_DEVICES": "0",
           "SIDP_CONFIG": json.dumps({"mode": "sidp", "sidp": {"b_th": None}})}
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", str(models["qwen3"]), *COMMON,
                          "--port", "25400"], env=env, capture_output=True, text=True, timeout=300)
    (log_dir / "vanilla_launcher_bad_settings.log").write_text(out.stdout + out.stderr)
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("sgl-sidp:")]
    assert out.returncode == 2 and len(lines) == 1, (out.returncode, out.stderr[-2000:])
    assert lines[0].startswith("sgl-sidp: the overlay could not load in the launcher (pid ")
    summary(log_dir, "vanilla_launcher_bad_settings", exit_code=out.returncode, seconds=round(time.time() - t0, 1),
            line=lines[0])


def launcher_refusal(args, log_path):
    """Our launcher on `args` (no server may start): its exit code and the lines it printed that start with sgl-sidp."""
    env = {**os.environ, **GPU_SAFE_ENV, "CUDA_VISIBLE_DEVICES": "0"}
    out = subprocess.run([sys.executable, "-m", "sgl_sidp.launch_server", *args, *COMMON, "--port", "25500"], env=env,
                         capture_output=True, text=True, timeout=300)
    log_path.write_text(out.stdout + out.stderr)
    return out.returncode, [ln.strip() for ln in out.stderr.splitlines() if "sgl-sidp" in ln or ln.startswith("  - ")]


def test_shift_refuses_the_deprecated_fused_all_reduce_flag(log_dir, models):
    """--enable-flashinfer-allreduce-fusion passes the raw-flag check; SGLang resolves it to a fused all-reduce +
    RMSNorm backend, which the launcher reads and refuses before any model memory is taken."""
    rc, lines = launcher_refusal(["--model-path", str(models["qwen3"]), "--overlay-mode", "shift",
                                  "--enable-flashinfer-allreduce-fusion"], log_dir / "shift_fused_all_reduce.log")
    assert rc == 2 and any("bypasses the all-reduce" in ln for ln in lines), lines
    summary(log_dir, "shift_fused_all_reduce", exit_code=rc, lines=lines)


def test_shift_refuses_a_model_whose_base_weights_leave_no_kv_room(log_dir):
    """Llama-3.1-70B (141 GB of bf16 weights) at --tp-size 1: no SP leaves KV room on this GPU; refused at launch."""
    from servers import model_args

    rc, lines = launcher_refusal([*model_args("Llama-3.1-70B"), "--overlay-mode", "shift"], log_dir / "shift_70b_tp1.log")
    assert rc == 2 and any("no SP of --tp-size 1 leaves KV room" in ln for ln in lines), lines
    summary(log_dir, "shift_70b_tp1", exit_code=rc, lines=lines)
