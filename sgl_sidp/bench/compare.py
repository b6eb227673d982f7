"""Configurations side by side on the GPUs at hand: exactness first, then KV, bursts and trace replays, every number
also as a ratio to the best vanilla configuration of the same run.

    python -m sgl_sidp.bench.compare --model-path DIR [--model-path DIR2 ...] --gpus 0,1 \\
        --configs tp2,dp2,dp2_attn,sidp_dp2_cas_graphs,shift_sp2_tp1 --out-dir OUT \\
        [--exact] [--burst 256+2048+256] [--trace FILE --rates 0.5,1,2 --slo-ttft-ms 2000 --slo-tpot-ms 100]
    python -m sgl_sidp.bench.compare --report --out-dir OUT      # tables, plot and predictions from OUT alone

Configurations are the planner's names (`sgl_sidp.plan.configs`: `tpN`, `dpN`, `tpT_dpD`, `dpN_attn`, `zerodp_dpD`,
`sidp_dpD_{was,cas,auto}`, `shift_spS_tpT`) with the options `configuration_named` reads (`dpN_attn_ep`,
`zerodp_dp2_all`, `sidp_dp2_cas_graphs`, `sidp_dp2_auto_bth64`, `shift_sp2_tp1_th1`), or `auto` (the launcher's
`--overlay-mode auto` pick). Vanilla ones start with `python -m sglang.launch_server`, the others with ours; the flags
are `Configuration.launch_flags()`. A name that is no configuration of the model (ZeroDP on a dense model, SiDP on an
MoE one, heads that do not split) is skipped with the reason; a launcher that refuses it records its one line.

Per configuration and model (`OUT/<model>/<config>.json`, rewritten after every step; the server log beside it in
`logs/`): GPU name and count, commit, start-up seconds, KV tokens per DP rank, and what was asked:

* `--exact`: the greedy answers (`sgl_sidp.bench.exact.PROMPTS`, 5 to 4,000 tokens, each sent alone) on every DP rank;
  the report compares them with the vanilla reference's (`exact.reference_name`: DP modes against TP of one replica,
  Shift against TP of its size), which runs too when it is missing.
* `--burst S+IN+OUT`: S random prompts of IN tokens, OUT forced output tokens, all at once: throughput, TTFT and TPOT
  p50/p99, and the requests each DP rank decoded (SGLang's Prometheus counters). `--burst-twice`: the same shapes once
  before it, kept apart (whether a burst's first forward pays a one-time cost).
* `--alone N+IN+OUT`: N random prompts of IN tokens, OUT forced output tokens, each sent after the last finished:
  TTFT and TPOT p50 of a server with nothing else to do (the low-load latency).
* `--trace FILE --rates R,...`: `python -m sgl_sidp.replay` of the trace at each arrival-rate factor R (`--time-scale
  1/R`, with `--trace-args`), goodput under `--slo-ttft-ms`/`--slo-tpot-ms`.
* `--profile S+IN+OUT`: where the GPU time goes. S prompts at once as in `--burst`; 1 s later SGLang's own torch
  profiler traces the next `--profile-steps` prefill forwards and as many decode forwards on every GPU, summarised
  per forward by kernel class (`sgl_sidp.bench.profile`: GEMM, attention, communication, ...). Pick S x IN large
  enough that the prefill forwards traced are full chunks (SGLang's `chunked_prefill_size`, recorded beside).
  `--profile-at-start` traces from the burst's first forward instead, each GPU's prefill forwards also one by one,
  and the host's CUDA calls over 1 ms (its waits for the GPU): where a burst's late start goes. `--profile-host
  calls|frames` traces the host too (by aten op and CUDA call, or by Python function): per forward, how long its
  launches took, how far the GPU lagged them and the host's work between forwards, by function
  (`profile.host_timeline`): where an eager step's time goes.
  `--profile-after-s T` starts the trace T s into the burst (decode forwards deep in it; default 1).
* `--freeze-gc`: SGLang's `/freeze_gc` on each server after its warm-up (what SGLang's own warning of a long garbage
  collection advises); off by default, as SGLang starts.
* `--stream-probe`: after each server's warm-up, `plan calibrate`'s stream probe: the tokens a second the server's
  output stream delivers (a property of the host, which bounds decode-heavy bursts), in the report beside the
  planner's stream rate.

Resumable: a step already in the JSON is not run again, and a configuration with every step done (or refused) is
not started, so the next call of a 10-minute device lease goes on where the last stopped (`--deadline-s` starts no
new server after that many seconds). `--parallel` runs configurations at once on disjoint GPU sets (a 4-GPU host:
vanilla on 0,1 and ours on 2,3), every step started at the same time on each. Runs of `--exact` alone may pack
`--servers-per-gpu K` servers on each GPU (small checkpoints; they share the GPU, so no speed number is taken).

The report (`OUT/compare.md`, `compare.png`, `summary.json`; printed at the end) groups configurations by model, GPU
name and GPU count: ratios to the best vanilla configuration of that group, and the planner's prediction for the same
GPU kind beside each measured burst number where it has the shards' calibrations (`sgl_sidp.bench.compare_report`).
The best vanilla configuration of a run is the best it measured: where `--configs` lacks the one the planner ranks
first on `--burst`, a line says so before any server starts (`vanilla_gaps`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from sgl_sidp.bench import exact
from sgl_sidp.bench.profile import AFTER_S as PROFILE_AFTER_S
from sgl_sidp.bench.server_stats import (auto_choice, declined_to, failure_lines, launch_problem,
                                         shift_exchange_logged, shift_threshold_logged)
from sgl_sidp.model_info import DEFAULT_MODEL_DIR
from sgl_sidp.plan.configs import Configuration, configuration_named
from sgl_sidp.plan.sim import ReplicaLimits

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
#: Sources of the KV capacity per DP rank, most trusted first (`sgl_sidp.bench.server_stats`).
CAPACITY_ORDER = ("v1_loads", "log", "zerodp_log", "server_info")
#: Replay summary keys kept per trace and rate.
TRACE_KEYS = ("completed", "failed", "duration", "request_throughput", "output_throughput", "median_ttft_ms",
              "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_e2e_latency_ms", "good_completed",
              "request_goodput")
#: Ports between two servers that run at once (SGLang takes a few above its HTTP port).
PORT_STRIDE = 50
#: The module each launcher runs as (tests put a stand-in server here).
LAUNCHERS = {"sglang.launch_server": "sglang.launch_server", "sgl_sidp.launch_server": "sgl_sidp.launch_server"}


class CompareError(ValueError):
    """Input compare cannot run with (one line for the user, before any server starts)."""


@dataclass
class Job:
    """One configuration of one model to measure.

    Attributes:
        model: the model folder (`--model-path`).
        name: the configuration's name as given ("sidp_dp2_cas_graphs", "auto").
        config: its `Configuration`; None for "auto".
        gpus: GPUs it needs.
        result: `OUT/<model>/<name>.json`.
    """

    model: Path
    name: str
    config: Configuration | None
    gpus: int
    result: Path

    @property
    def log(self) -> Path:
        return self.result.parent / "logs" / f"{self.name}.log"


#: The random prompts' seed of each step (`batches.prompts`). Prompts of one seed share their first row's tokens
#: whatever their length, so a step whose seed another step used before meets a radix-cache hit: the first burst of
#: `--burst-twice` took the short rehearsal's seed until q8_gap_4gpu_h200, and its first request prefilled one token.
PROMPT_SEEDS = {"rehearsal": 3, "rehearsal_short": 5, "burst": 7, "alone": 11, "profile": 13, "burst_first": 17,
                "stream_probe": 19}


def rehearsal_size(prompt_tokens: int, chunk_tokens: int) -> int:
    """Prompts of `prompt_tokens` per DP rank that `Measurement.warm_up` rehearses before a burst: one, then enough
    to fill a prefill chunk of `chunk_tokens` (SGLang's `chunked_prefill_size`), as a burst's first forward takes its
    first request alone and the next a full chunk. 2,048-token prompts, 8,192-token chunk: 5. With 4 (the chunk's worth
    alone, `q8_warm_2gpu_h200`), a Qwen3-8B burst's first token on 2 x H200 still came at 193 ms on TP2 and 165 ms on
    Shift SP2, against 83 and 94 on a second burst and 261 and 275 after a rehearsal of 2."""
    return 1 + max(1, -(-chunk_tokens // max(1, prompt_tokens)))


def triple(spec: str, flag: str = "--burst", first: str = "S") -> tuple[int, int, int]:
    """(S, IN, OUT) of "S+IN+OUT" (`flag`'s value; `first` names its first number in errors).

    Raises:
        CompareError: not three positive integers.
    """
    try:
        s, i, o = (int(x) for x in spec.split("+"))
    except ValueError:
        raise CompareError(f"{flag} {spec}: expected {first}+IN+OUT (three integers)") from None
    if min(s, i, o) < 1:
        raise CompareError(f"{flag} {spec}: each of {first}, IN, OUT at least 1")
    return s, i, o


def trace_key(trace: Path, rate: float) -> str:
    """The name of one replay in results: "<trace file stem>@<rate>x"."""
    return f"{trace.stem}@{rate:g}x"


def model_label(model: Path) -> str:
    """The results sub-folder of a model: its folder's name."""
    return model.resolve().name


def read_model_config(model: Path) -> dict:
    """The model's config.json.

    Raises:
        CompareError: no readable config.json in `model`.
    """
    try:
        return json.loads((model / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise CompareError(f"--model-path {model}: no readable config.json ({e})") from None


def plan_jobs(models: Sequence[Path], names: Sequence[str], gpus: int, with_references: bool,
              out_dir: Path) -> tuple[list[Job], list[str]]:
    """The jobs of a run and a note for each configuration left out.

    Each name is read with `configuration_named`; one the model does not run in on `gpus` GPUs (`plan.configs.
    configurations` does not list its planner name: a dense model's ZeroDP, an MoE model's SiDP or Shift, sizes
    that do not split; Shift at SP 1, the wiring check on TP = P, is a configuration of any dense model too) or that
    needs more GPUs is left out with the reason. With `with_references`, the vanilla reference of every overlay
    configuration (`exact.reference_name`) not named is added after the named ones (so `--parallel` rounds keep the
    named configurations paired as given).

    Raises:
        CompareError: a name of no known form (every one is read before anything runs).
    """
    from sgl_sidp.calibration.memory import ModelShapes
    from sgl_sidp.plan.configs import configurations

    parsed = {}
    for name in names:
        if name == "auto":
            parsed[name] = None
            continue
        try:
            parsed[name] = configuration_named(name)
        except ValueError as e:
            raise CompareError(f"--configs: {e}") from None
    jobs, notes = [], []
    for model in models:
        shapes = ModelShapes.of(read_model_config(model))
        folder = out_dir / model_label(model)
        valid = {n: {c.name for c in configurations(shapes, n)} for n in range(1, gpus + 1)}
        wanted: list[str] = []
        refs: list[str] = []
        for name, c in parsed.items():
            need = gpus if c is None else c.gpus
            if need > gpus:
                notes.append(f"{model_label(model)} {name}: needs {need} GPUs, --gpus has {gpus}")
                continue
            if c is not None and c.base_name not in valid[c.gpus] and not c.kind.launchable_unplanned(c, shapes):
                notes.append(f"{model_label(model)} {name}: not a configuration of this model on {c.gpus} GPUs "
                             f"({'MoE' if shapes.moe_layers else 'dense'} model; see plan.configs.configurations)")
                continue
            wanted.append(name)
            ref = exact.reference_name(c.technique, c.dp, c.tp, c.sp) if (c and with_references) else None
            if ref and ref not in parsed and ref not in refs:
                refs.append(ref)
        for name in wanted + refs:
            c = parsed.get(name) if name in parsed else configuration_named(name)
            jobs.append(Job(model, name, c, gpus if c is None else c.gpus, folder / f"{name}.json"))
    return jobs, notes


# ------------------------------------------------------------------------------------------------- one server
def server_flags(job: Job, a: argparse.Namespace) -> tuple[str, list[str]]:
    """(launcher module, flags without --host/--port) of a job's server."""
    model = job.model
    flags = ["--model-path", str(model), "--enable-metrics"]
    if not any((model / f).exists() for f in TOKENIZER_FILES):
        flags += ["--tokenizer-path", str(DEFAULT_MODEL_DIR)]  # the embedded model's tokenizer (`../shared/models/*`)
    if a.load_format:
        flags += ["--load-format", a.load_format]
    flags += shlex.split(a.extra_args) + shlex.split(a.config_args.get(job.name, ""))
    # our launcher ranks the configurations (auto's pick, the start-up line) on the burst this run sends, unless the
    # flags name a workload
    workload = "offline:%d:%d:%d" % triple(a.burst) if a.burst else None
    if job.config is None:
        launcher, flags = "sgl_sidp.launch_server", flags + ["--overlay-mode", "auto"]
        workload = workload or "offline:512:2048:256"
    else:
        launcher, flags = job.config.launcher, flags + job.config.launch_flags()
    if launcher == "sgl_sidp.launch_server" and workload and "--overlay-plan-workload" not in flags:
        flags += ["--overlay-plan-workload", workload]
    return LAUNCHERS[launcher], flags


def http_json(url: str, body: dict | None = None, timeout_s: float = 600.0) -> dict:
    """GET (`body` None) or POST `body` as JSON; the decoded answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read().decode())


def kv_tokens(srv, log_text: str) -> dict[str, int]:
    """KV tokens per DP rank ({"0": N, ...}) from every source the server has (`CAPACITY_ORDER`)."""
    from sgl_sidp.bench.server_stats import (capacity_from_loads, capacity_from_log, capacity_from_server_info,
                                             merge_capacity, zerodp_capacity_from_log)

    def get(path):
        try:
            return http_json(srv.base_url + path, timeout_s=30)
        except Exception:  # noqa: BLE001 - an endpoint this SGLang lacks or a busy server: that source is missing
            return None

    loads = None
    for _ in range(10):  # each scheduler publishes its load snapshot once it has run
        loads = get("/v1/loads")
        if capacity_from_loads(loads):
            break
        time.sleep(1.0)
    sources = {"v1_loads": capacity_from_loads(loads), "log": capacity_from_log(log_text),
               "zerodp_log": {r: v["kv_tokens"] for r, v in zerodp_capacity_from_log(log_text).items()},
               "server_info": capacity_from_server_info(get("/server_info"))}
    return {str(r): v for r, v in merge_capacity(sources, CAPACITY_ORDER).items()}


def git_commit() -> str | None:
    """The code's commit: $SIDP_COMMIT where set (a device host's copy of the tree may carry a stale .git), else
    `git rev-parse HEAD` of this package's checkout, else None."""
    if os.environ.get("SIDP_COMMIT"):
        return os.environ["SIDP_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else None
    except OSError:
        return None


def vanilla_gaps(jobs: Sequence[Job], a: argparse.Namespace) -> list[str]:
    """One line per (model, GPU count) of `jobs` whose vanilla configurations miss the one the planner ranks first on
    `--burst` (`compare_report.vanilla_gap`): each ratio of this run is then against its own best vanilla
    configuration only, which that line says before any server starts. Nothing where NVML names no GPU."""
    from sgl_sidp.bench.compare_report import is_vanilla, predicted_vanilla, vanilla_gap

    name = gpu_name(a.gpus[0])
    if name is None:
        return []
    out = []
    for model, n in sorted({(j.model, j.gpus) for j in jobs if j.config is not None}):
        measured = [j.name for j in jobs if j.model == model and j.gpus == n and j.config is not None
                    and is_vanilla({"technique": j.config.technique})]
        gap = vanilla_gap(predicted_vanilla(model, n, name, a.burst), measured)
        if gap:
            out.append(f"{model.name} on {n} GPUs: the planner ranks {gap} first among vanilla configurations on "
                       f"--burst {a.burst}, and --configs does not hold it: this run's ratios are against its own "
                       "best vanilla configuration only")
    return out


def gpu_name(index: str) -> str | None:
    """NVML's name of GPU `index` (this process's numbering), None when NVML cannot tell."""
    from sgl_sidp.peer.topology import gpu_name as nvml_name

    return nvml_name(int(index))


def gzip_in_place(path: Path) -> None:
    """`path` replaced by `path`.gz (no timestamp: the same bytes each time); nothing when `path` is not there. For a
    server's log: a results folder travels to every GPU host with the repository, under the device tool's 64 MiB with
    the SGLang wheelhouse."""
    if not path.is_file():
        return
    with open(path, "rb") as src, open(path.with_name(path.name + ".gz"), "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()


#: the per-token gaps of a replay's per-request file, kept apart (`keep_requests`; git-ignored)
ITL_FILE = "itl_ms.jsonl.gz"


def keep_requests(folder: Path) -> None:
    """A replay's `folder`/requests.jsonl (`sgl_sidp.replay`) as a results folder keeps it: `requests.jsonl.gz` with
    every column but each token's gap (`itl_ms`, about 95 % of its bytes: 134 of 141 KB gzipped for 152 Mooncake
    requests), which goes to `ITL_FILE` beside it, one {"id", "itl_ms"} line a request. The results commit the
    first and ignore the second (.gitignore): the tree travels to every GPU host under the device tool's 64 MiB with
    the SGLang wheelhouse, and no tool reads the gaps of a committed run (the replay's summary.json keeps their
    statistics; each request keeps its TPOT). Nothing when there is no requests.jsonl."""
    path = folder / "requests.jsonl"
    if not path.is_file():
        return
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    gaps = folder / ITL_FILE.removesuffix(".gz")
    gaps.write_text("".join(json.dumps({"id": r.get("id"), "itl_ms": r["itl_ms"]}) + "\n"
                            for r in rows if "itl_ms" in r))
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "itl_ms"}) + "\n" for r in rows))
    for plain in (path, gaps):
        gzip_in_place(plain)


#: a GPU that still holds more than this once a server is due to start runs something else: one server's CUDA
#: context is about 0.5 GiB, and a server of the last configuration frees its memory within seconds of exiting
BUSY_GIB = 2.0
#: how long a busy GPU is waited for before the configuration is left with one line saying so (s)
BUSY_WAIT_S = 30.0


def busy_gpus(gpus: Sequence[str], wait_s: float = BUSY_WAIT_S,
              used: Callable[[int], tuple[int, list[int]] | None] | None = None) -> list[str]:
    """One line per GPU of `gpus` (this process's numbering) that holds more than `BUSY_GIB` GiB after waiting up to
    `wait_s` for it to drop: a server started there would fail on memory with SGLang's traceback instead (a server
    a stopped call left running on a 4 x H200 host made the next call's servers OOM). [] when NVML cannot tell."""
    if used is None:
        from sgl_sidp.peer.topology import gpu_memory_used as used
    deadline = time.time() + wait_s
    while True:
        lines = []
        for g in gpus:
            got = used(int(g))
            if got is not None and got[0] > BUSY_GIB * 2**30:
                pids = f" (pids {', '.join(map(str, got[1]))})" if got[1] else ""
                lines.append(f"GPU {g} already holds {got[0] / 2**30:.1f} GiB{pids}: another process runs there")
        if not lines or time.time() >= deadline:
            return lines
        time.sleep(1.0)


def sglang_switches(env: dict[str, str] | None = None) -> dict[str, str]:
    """The SGLANG_* variables a server started from here sees: this process's environment with `env` (compare's own
    additions) over it, sorted by name."""
    return {k: v for k, v in sorted((os.environ | (env or {})).items()) if k.startswith("SGLANG_")}


class Measurement:
    """One job's server on its GPUs and the steps run against it; its result file is rewritten after each step.

    Args:
        job: what to run.
        a: compare's arguments (steps, flags, timeouts).
        gpus: the GPUs it runs on (CUDA_VISIBLE_DEVICES).
        port: the server's HTTP port.
    """

    def __init__(self, job: Job, a: argparse.Namespace, gpus: list[str], port: int):
        self.job, self.a, self.gpus, self.port = job, a, gpus, port
        self.res = load_result(job.result)
        self.srv = None

    def save(self) -> None:
        self.job.result.parent.mkdir(parents=True, exist_ok=True)
        self.job.result.write_text(json.dumps(self.res, indent=1) + "\n")

    def steps(self) -> list[tuple[str, Callable[[], None]]]:
        """(step name, body) of every step asked for and not yet in the result."""
        a, res = self.a, self.res
        out = []
        if a.exact and "exact" not in res:
            out.append(("exact", self.run_exact))
        if a.alone and res.get("alone", {}).get("spec") != a.alone:
            out.append(("alone", self.run_alone))
        if a.burst and res.get("burst", {}).get("spec") != a.burst:
            out.append(("burst", self.run_burst))
        if a.profile and res.get("profile", {}).get("spec") != a.profile:
            out.append(("profile", self.run_profile))
        for trace in a.trace:
            for rate in a.rates:
                key = trace_key(trace, rate)
                if key not in res.get("traces", {}):
                    out.append((key, lambda t=trace, r=rate: self.run_trace(t, r)))
        return out

    def pending(self) -> bool:
        """Whether the job has anything left to run (a refused configuration has not)."""
        return not self.res.get("refused") and bool(self.steps())

    def start(self) -> bool:
        """Start the server and wait until it has fired up; record the facts. False when it did not come up (the
        refusal or failure is recorded)."""
        from sgl_sidp.bench.server import ServerProcess

        if self.a.stopping.is_set():  # interrupted: a thread still running starts no new server
            return False
        launcher, flags = server_flags(self.job, self.a)
        # one calibration cache per model for servers that run one after the other (a ZeroDP source measures its
        # forward times once, and its sinks' copy rates, measured at a start that offloads nothing, reach the next
        # ZeroDP configuration's policy, as at a user's second start); each its own where servers run at once (they
        # would race on one). Packed servers share GPUs, so a TP group's GPUs differ in free memory, which SGLang
        # refuses unless told otherwise
        alone = not self.a.parallel and self.a.servers_per_gpu == 1
        env = {"SIDP_CALIBRATION_DIR": str(self.job.result.parent / "calibration" / ("shared" if alone else self.job.name))}
        if self.a.servers_per_gpu > 1:
            env["SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"] = "0"
        self.srv = ServerProcess(launcher, flags, port=self.port, log_path=self.job.log, gpus=",".join(self.gpus),
                                 env=env)
        self.a.live.add(self)
        c = self.job.config
        self.res.update({"config": self.job.name, "model": model_label(self.job.model),
                         "base_name": c.base_name if c else "auto", "technique": c.technique if c else "auto",
                         "dp": c.dp if c else None, "tp": c.tp if c else None, "sp": c.sp if c else None,
                         "gpu_count": len(self.gpus), "gpus": ",".join(self.gpus), "gpu_name": gpu_name(self.gpus[0]),
                         "commit": git_commit(), "command": shlex.join(self.srv.command),
                         "calibration_dir": env["SIDP_CALIBRATION_DIR"],
                         "sglang_env": sglang_switches(env),  # `compare_report.unmodelled` reads them
                         "config_args": self.a.config_args.get(self.job.name) or None,
                         "started": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        busy = busy_gpus(self.gpus) if self.a.servers_per_gpu == 1 else []  # packed servers share GPUs on purpose
        if busy:
            self.res["error"] = {"where": "start", "what": "; ".join(busy)}
            self.save()
            self.a.live.discard(self)
            return False
        self.res.pop("error", None)
        self.srv.start()
        try:
            self.srv.wait_ready(timeout_s=self.a.ready_timeout_s)
            deadline = time.time() + 120
            while "The server is fired up" not in self.srv.log_text():
                if time.time() > deadline or self.srv.proc.poll() is not None:
                    raise RuntimeError("the server never logged 'The server is fired up'")
                time.sleep(0.5)
        except Exception as e:  # noqa: BLE001 - a server that does not come up is a result of the run
            if self.srv is None:  # stopped by SIGTERM while it came up (`main`): nothing to record
                return False
            text = self.srv.log_text()
            refused = launch_problem(text)
            if refused:
                self.res["refused"] = refused
            else:
                self.res["error"] = {"where": "start", "what": str(e).splitlines()[0], "log": failure_lines(text)}
            self.save()
            self.stop()
            return False
        text = self.srv.log_text()
        self.res.update({"startup_s": round(time.time() - self.srv.t_start, 1), "kv_tokens": kv_tokens(self.srv, text),
                         "auto_choice": auto_choice(text) if c is None else None, "declined_to": declined_to(text),
                         "shift_threshold": shift_threshold_logged(text), "shift_exchange": shift_exchange_logged(text)})
        if self.res["shift_threshold"] == float("inf"):  # JSON has no infinity: the log's word
            self.res["shift_threshold"] = "inf"
        self.ranks = max(1, len(self.res["kv_tokens"]))
        self.save()
        self.warm_up()
        if self.a.freeze_gc:  # SGLang's own remedy for its processes' full garbage collections, after the warm-up
            with urllib.request.urlopen(urllib.request.Request(self.srv.base_url + "/freeze_gc", data=b""),
                                        timeout=60) as r:  # answers in plain text
                r.read()
            self.res["freeze_gc"] = True
        if self.a.stream_probe and "stream_probe" not in self.res:
            self.run_stream_probe()
        return True

    def run_stream_probe(self) -> None:
        """`--stream-probe`, after the warm-up: `plan calibrate`'s stream probe (`calibrate.STREAM_PROBE`,
        `calibrate.delivered_rate`), the tokens a second this server's output stream delivered while every request of
        256 x (16, 128) decoded. The rate is the host's, not the burst's: one H200 host streamed 14.8-16.6K tokens a
        second at every burst size, where the bundled probes of other hosts had 15.6-23.7K
        (benchmarks/results/plan/validate_1gpu_h200_stream_probes_2026-11-29/)."""
        from sgl_sidp.plan.calibrate import STREAM_PROBE, delivered_rate

        got = delivered_rate(self.srv, *STREAM_PROBE, PROMPT_SEEDS["stream_probe"])
        self.res["stream_probe"] = got if isinstance(got, dict) else {"error": got}
        self.save()

    def warm_up(self) -> None:
        """Outside every number: two short greedy requests per DP rank (first allocations, JIT kernels), then, where
        a burst or a profile follows, a rehearsal of its shapes through the server's router: one request per DP rank
        of its prompt length and enough more to fill a full chunk (`rehearsal_size`), at most 4 output tokens each.
        The first full-chunk forward after start-up pays a one-time cost: on 2 x H200 a Qwen3-8B burst of 64 x (2,048
        in, 32 out) rehearsed with two prompts gave its first token 180 ms later the first time than the second, on
        TP2 (261 against 83 ms) and Shift SP2 (275 against 94 ms), each release after it one forward late
        (`q8_shift_twice_2gpu_h200`). Triton specialises kernels on sizes, so a burst's
        first chunks (a full chunk, a chunk over a cached prefix, one DP attention rank prefilling while another
        decodes) would otherwise carry one-time costs: on 2 x H200, DP attention's 16 x (8,192 in, 1 out) right after
        the short requests logged 24K prefill tokens/s a rank and stalled about 1.5 s at its end, where the profiled
        burst of the same shapes after it logged 28-32K (`q30_dpattn_profile_2gpu_h200`). Then one request per DP rank
        a token shorter: Triton also specialises an integer argument on whether it divides by 16, and a burst whose
        random prompts share a first token with an earlier one (a 1-token cache hit) ends with forwards of 2,047 or
        6,143 tokens. DP attention runs such a forward eagerly (outside the prefill CUDA graphs: "cuda graph: False" in
        its log), and the first one stalled every rank 1.25 s near the end of a 256-request burst on 4 x H200
        (`q30_zerodp4_4gpu_h200`, `dp4_attn`: a first compile, as far as the log tells; TP's odd forwards ran in
        the graphs without a stall)."""
        from sgl_sidp.bench.batches import prompts, run_batch

        for rank in range(self.ranks):
            for n in (32, 300):
                try:
                    http_json(self.srv.base_url + "/generate",
                              exact.greedy_body(list(range(100, 100 + n)), 4, rank if self.ranks > 1 else None))
                except Exception:  # noqa: BLE001 - a failing server shows in the steps that follow
                    pass
        spec = self.a.burst or self.a.profile
        if spec:
            s, i, o = triple(spec)
            try:
                info = http_json(self.srv.base_url + "/server_info", timeout_s=30)
                chunk = int(info.get("chunked_prefill_size") or 0)
            except Exception:  # noqa: BLE001 - SGLang's default on H100 and H200, as the planner takes it
                chunk = 0
            chunk = chunk or ReplicaLimits.chunked_prefill
            rehearsals = [prompts(min(s, rehearsal_size(i, chunk) * self.ranks), i, PROMPT_SEEDS["rehearsal"])]
            if i > 1:  # one a rank a token shorter: a forward of another size class (below)
                rehearsals.append(prompts(self.ranks, i - 1, PROMPT_SEEDS["rehearsal_short"]))
            for batch in rehearsals:
                try:
                    run_batch(self.srv.base_url, [(ids, min(o, 4), None) for ids in batch])
                except Exception:  # noqa: BLE001 - as above
                    pass

    def run_exact(self) -> None:
        """Every prompt of `exact.PROMPTS`, alone, on each DP rank: the greedy answers."""
        ranks = {}
        for rank in range(self.ranks):
            ranks[str(rank)] = [exact.parse_answer(http_json(
                self.srv.base_url + "/generate",
                exact.greedy_body(ids, self.a.exact_tokens, rank if self.ranks > 1 else None)))
                for ids in exact.PROMPTS]
        self.res["exact"] = {"prompt_lens": [len(p) for p in exact.PROMPTS], "new_tokens": self.a.exact_tokens,
                             "ranks": ranks}

    def run_burst(self) -> None:
        """`--burst S+IN+OUT`: every request at once (the server's router spreads them over its DP ranks); with
        `--parallel` from a client process of its own (`batches.run_batch_apart`). With `--burst-twice` the same
        shapes run once before, on prompts of their own, kept apart ("burst_first", `bursts/<name>.first.jsonl.gz`):
        whether a burst's first forward pays a one-time cost that the rehearsal of `warm_up` leaves (on 4 x H200 each
        TP group's first request of 2,048 tokens came 0.2-0.4 s late, DP4's single GPUs' 0.09 s); `--burst-gap-s`
        the seconds the server idles between the two (whether the cost is once after start-up or after each idle
        spell: on 2 x H200 a Qwen3-8B burst's first token came ~100 ms later the first time, `q8_warm_2gpu_h200`)."""
        from sgl_sidp.bench.batches import prompts, run_batch, run_batch_apart
        from sgl_sidp.bench.metrics import compute_metrics

        s, i, o = triple(self.a.burst)
        send = run_batch_apart if self.a.parallel else run_batch  # beside another burst: a client process apart
        def numbers(outs, seconds) -> dict:
            m = compute_metrics(outs, seconds)
            return {"seconds": seconds, "failed": m["failed"], "total_tok_s": m["total_throughput"],
                    "output_tok_s": m["output_throughput"], "ttft_ms_p50": m["median_ttft_ms"],
                    "ttft_ms_p99": m["p99_ttft_ms"], "tpot_ms_p50": m["median_tpot_ms"], "tpot_ms_p99": m["p99_tpot_ms"]}

        bursts = self.job.result.parent / "bursts"
        if self.a.burst_twice:  # the same shapes once before, prompts of their own: no cache hits
            first_prompts = prompts(s, i, PROMPT_SEEDS["burst_first"])
            first, first_s = send(self.srv.base_url, [(ids, o, None) for ids in first_prompts])
            self.res["burst_first"] = {**numbers(first, first_s), "gap_s": self.a.burst_gap_s}
            write_burst_requests(bursts / f"{self.job.name}.first.jsonl", first)
            time.sleep(self.a.burst_gap_s)
        bodies = [(ids, o, None) for ids in prompts(s, i, PROMPT_SEEDS["burst"])]
        (outs, seconds), counted = self.counted(lambda: send(self.srv.base_url, bodies))
        self.res["burst"] = {"spec": self.a.burst, **numbers(outs, seconds), **counted}
        write_burst_requests(bursts / f"{self.job.name}.jsonl", outs)

    def counted(self, body: Callable[[], object]) -> tuple[object, dict]:
        """`body()`'s result and what the server counted while it ran (`server_stats.RANK_COUNTERS`' deltas):
        {"per_rank": {DP rank: tokens by mode, GPU-busy seconds (all and by forward category, where the server
        runs SGLang's device timer, SGLANG_ENABLE_METRICS_DEVICE_TIMER=1), retractions}, "overlay": the overlay's
        own counters}."""
        from sgl_sidp.bench.batches import metrics_text
        from sgl_sidp.bench.server_stats import counter_deltas, per_rank_from_deltas, rank_counter_snapshot

        before = rank_counter_snapshot(metrics_text(self.srv.base_url))
        out = body()
        deltas = counter_deltas(before, rank_counter_snapshot(metrics_text(self.srv.base_url)))
        return out, {"per_rank": {str(r): v for r, v in per_rank_from_deltas(deltas).items()},
                     "overlay": {k: v for k, v in deltas.items() if k.startswith("sglang:sidp_") and v}}

    def run_profile(self) -> None:
        """`--profile S+IN+OUT`: the burst's prefill and decode forwards traced by SGLang's profiler, by kernel
        class (`sgl_sidp.bench.profile`); the traces are summarised and removed."""
        from sgl_sidp.bench import profile
        from sgl_sidp.bench.batches import prompts, run_batch

        s, i, o = triple(self.a.profile, "--profile")
        folder = self.job.result.parent / "profile" / self.job.name
        shutil.rmtree(folder, ignore_errors=True)
        info = http_json(self.srv.base_url + "/server_info", timeout_s=30)
        bodies = [(ids, o, None) for ids in prompts(s, i, PROMPT_SEEDS["profile"])]
        sender = threading.Thread(target=run_batch, args=(self.srv.base_url, bodies))
        host, stacks = bool(self.a.profile_at_start or self.a.profile_host), self.a.profile_host == "frames"
        if self.a.profile_at_start:  # from the burst's first forward (one request alone) on, the host's CUDA calls too
            profile.start(self.srv.base_url, folder, self.a.profile_steps, self.job.name, host=True, stacks=stacks)
            sender.start()
        else:
            sender.start()
            time.sleep(self.a.profile_after_s)  # past the first, partly filled, prefill forwards
            profile.start(self.srv.base_url, folder, self.a.profile_steps, self.job.name, host=host, stacks=stacks)
        sender.join()  # every forward has run: a stage that never began (no prefill after the start) has no trace
        found = profile.wait_for_traces(folder, expected=2 * len(self.gpus), settle_s=10.0)
        layers = read_model_config(self.job.model).get("num_hidden_layers")
        self.res["profile"] = {"spec": self.a.profile, "steps": self.a.profile_steps, "traces": found,
                               "at_start": self.a.profile_at_start, "host": self.a.profile_host,
                               "after_s": None if self.a.profile_at_start else self.a.profile_after_s,
                               "chunked_prefill_size": info.get("chunked_prefill_size"),
                               "ranks": profile.summarize_dir(folder, self.a.profile_steps, layers=layers)}

    def run_alone(self) -> None:
        """`--alone N+IN+OUT`: N requests, each sent when the one before finished (distinct prompts: no cache hit)."""
        from sgl_sidp.bench.batches import prompts, run_batch
        from sgl_sidp.bench.metrics import compute_metrics

        n, i, o = triple(self.a.alone, "--alone", "N")
        outs, seconds = [], 0.0
        for ids in prompts(n, i, PROMPT_SEEDS["alone"]):
            got, s = run_batch(self.srv.base_url, [(ids, o, None)])
            outs += got
            seconds += s
        m = compute_metrics(outs, seconds)
        self.res["alone"] = {"spec": self.a.alone, "failed": m["failed"], "ttft_ms_p50": m["median_ttft_ms"],
                             "tpot_ms_p50": m["median_tpot_ms"], "e2e_ms_p50": m.get("median_e2e_latency_ms")}

    def run_trace(self, trace: Path, rate: float) -> None:
        """One replay of `trace` at `rate` times its arrival rate."""
        from sgl_sidp.bench.batches import replay

        a, key = self.a, trace_key(trace, rate)
        args = [f"--trace={trace}", f"--time-scale={1 / rate:g}", *shlex.split(a.trace_args), "--flush-cache"]
        args += [f"--slo-ttft-ms={a.slo_ttft_ms}"] if a.slo_ttft_ms else []
        args += [f"--slo-tpot-ms={a.slo_tpot_ms}"] if a.slo_tpot_ms else []
        folder = self.job.result.parent / "traces" / self.job.name / key.replace("@", "_")
        summary, counted = self.counted(lambda: replay(key, shlex.join(args), self.srv.base_url, folder, self.job.name))
        self.res.setdefault("traces", {})[key] = {"rate": rate, **{k: summary.get(k) for k in TRACE_KEYS}, **counted}
        keep_requests(folder)  # what bench.validate and bench.goodput read
        (folder / "requests.csv").unlink(missing_ok=True)  # the same rows, uncompressed

    def run_step(self, name: str, body: Callable[[], None]) -> None:
        """Run one step; an exception is recorded as the step's error (the server's state with it)."""
        if self.srv is None or self.srv.proc.poll() is not None:
            self.res.setdefault("step_errors", {})[name] = "the server is not running"
            self.save()
            return
        t0 = time.time()
        try:
            body()
            self.res.setdefault("step_errors", {}).pop(name, None)
        except Exception as e:  # noqa: BLE001 - one failed step is a result; the others still run
            self.res.setdefault("step_errors", {})[name] = f"{type(e).__name__}: {str(e)[:300]}"
        self.res.setdefault("step_seconds", {})[name] = round(time.time() - t0, 1)
        self.save()

    def stop(self) -> None:
        """Stop the server and gzip its log."""
        self.a.live.discard(self)
        if self.srv is not None:
            self.srv.stop()
            gzip_in_place(self.job.log)
        self.srv = None


def write_burst_requests(path: Path, outs) -> None:
    """One JSON line per request of a burst, in the order sent, gzipped (`path` + ".gz"): "send_ms" from the first
    request's send, "ttft_ms" and "e2e_ms" from its own (ms), "output_len", "dp_rank" (None where the server did not
    say), "success". What the burst's aggregate numbers hide: when each request's first token came, so that the
    planner's schedule of the burst can be held against it request by request (its requests arrive at once but the
    first, `plan.planner.BURST_REST_S`)."""
    t0 = min((o.start_time for o in outs), default=0.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for o in outs:
            f.write(json.dumps({"send_ms": round((o.start_time - t0) * 1e3, 3), "ttft_ms": round(o.ttft * 1e3, 3),
                                "e2e_ms": round(o.latency * 1e3, 3), "output_len": o.output_len,
                                "dp_rank": o.dp_rank, "success": o.success}) + "\n")
    gzip_in_place(path)


def pending(job: Job, a: argparse.Namespace) -> bool:
    """Whether `job` has a step left to run in its results so far (`Measurement.pending`; starts nothing)."""
    return Measurement(job, a, [], 0).pending()


def start_jit_prebuild(jobs: Sequence[Job], gpus: Sequence[str], log_dir: Path):
    """SGLang's JIT CUDA kernels of every job's model and KV layout, built ahead in one process while the first
    servers start (`sgl_sidp.plan.jit_prebuild`: 82 s of nvcc off a fresh host's critical path in `plan calibrate`);
    None when NVML cannot tell the GPUs' compute capability."""
    from sgl_sidp.calibration.memory import ModelShapes
    from sgl_sidp.peer.topology import gpu_capability
    from sgl_sidp.plan import jit_prebuild

    capability = gpu_capability(int(gpus[0]))
    if capability is None or not jobs:
        return None
    modules = []
    for model in dict.fromkeys(j.model for j in jobs):
        hf = read_model_config(model)
        shapes = ModelShapes.of(hf)
        mine = [j for j in jobs if j.model == model]
        tps = {t for j in mine for t in ((j.config.attn_tp,) if j.config else range(1, j.gpus + 1))}
        groups = {t for j in mine for t in ((j.config.server_tp,) if j.config else range(1, j.gpus + 1))}
        modules += jit_prebuild.jit_modules(hf, sorted({shapes.kv_heads_per_gpu(t) for t in tps}), groups)
    return jit_prebuild.start(list(dict.fromkeys(modules)), capability, log_dir)


def load_result(path: Path) -> dict:
    """A job's result so far ({} when none)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# --------------------------------------------------------------------------------------------- scheduling
class GpuPool:
    """GPUs lent to jobs: each GPU takes up to `per_gpu` servers at once; a job of g GPUs gets an aligned group of g
    (GPUs [k*g, (k+1)*g) of the list), the least loaded first.

    Args:
        gpus: the GPU indices ("0", "1", ...).
        per_gpu: servers one GPU holds at once.
    """

    def __init__(self, gpus: Sequence[str], per_gpu: int = 1):
        self.gpus, self.per_gpu = list(gpus), per_gpu
        self.load = {g: 0 for g in self.gpus}
        self.ports: list[int] = []
        self.cv = threading.Condition()

    def groups(self, g: int) -> list[list[str]]:
        return [self.gpus[k:k + g] for k in range(0, len(self.gpus) - g + 1, g)]

    def try_acquire(self, g: int) -> list[str] | None:
        """A free group of `g` GPUs (now taken), or None."""
        with self.cv:
            free = [grp for grp in self.groups(g) if all(self.load[x] < self.per_gpu for x in grp)]
            if not free:
                return None
            grp = min(free, key=lambda grp: sum(self.load[x] for x in grp))
            for x in grp:
                self.load[x] += 1
            return grp

    def acquire(self, g: int) -> list[str]:
        """Block until a group of `g` GPUs is free; take it."""
        with self.cv:
            while (grp := self.try_acquire(g)) is None:
                self.cv.wait()
            return grp

    def release(self, grp: Sequence[str]) -> None:
        with self.cv:
            for x in grp:
                self.load[x] -= 1
            self.cv.notify_all()


def run_exact_pool(jobs: list[Job], a: argparse.Namespace, log: Callable[[str], None]) -> None:
    """Runs of `--exact` alone: every job as soon as GPUs are free (`--servers-per-gpu` servers a GPU)."""
    pool = GpuPool(a.gpus, a.servers_per_gpu)
    slots = list(range(len(a.gpus) * a.servers_per_gpu))
    lock = threading.Lock()

    def one(job: Job) -> None:
        grp = pool.acquire(job.gpus)
        with lock:
            slot = slots.pop(0)
        try:
            if past_deadline(a):
                log(f"{job.model.name} {job.name}: left for the next call (--deadline-s)")
                return
            m = Measurement(job, a, grp, a.port + PORT_STRIDE * slot)
            if m.start():
                for name, body in m.steps():
                    m.run_step(name, body)
            m.stop()
            log(status_line(job, m.res))
        finally:
            with lock:
                slots.append(slot)
            pool.release(grp)

    threads = [threading.Thread(target=one, args=(j,), daemon=True) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def rounds(jobs: list[Job], gpus: int, parallel: bool) -> list[list[Job]]:
    """Jobs grouped into rounds that run at once on disjoint GPU sets (`parallel`), in order; else one a round."""
    if not parallel:
        return [[j] for j in jobs]
    out, cur, used = [], [], 0
    for j in jobs:
        if cur and used + j.gpus > gpus:
            out.append(cur)
            cur, used = [], 0
        cur.append(j)
        used += j.gpus
    return out + ([cur] if cur else [])


def run_rounds(jobs: list[Job], a: argparse.Namespace, log: Callable[[str], None]) -> None:
    """Timed runs: each round's servers start together, and each step starts on all of them at the same moment (the
    same traffic at the same time on disjoint GPUs)."""
    for rnd in rounds(jobs, len(a.gpus), a.parallel):
        if past_deadline(a):
            log("left for the next call (--deadline-s): " + ", ".join(f"{j.model.name} {j.name}" for j in rnd))
            continue
        offsets, k = [], 0
        for j in rnd:
            offsets.append(a.gpus[k:k + j.gpus])
            k += j.gpus
        ms = [Measurement(j, a, grp, a.port + PORT_STRIDE * i) for i, (j, grp) in enumerate(zip(rnd, offsets))]
        step_names = list(dict.fromkeys(n for m in ms for n, _ in m.steps()))
        barrier = threading.Barrier(len(ms))

        def one(m: Measurement) -> None:
            up = m.start()
            for name in step_names:
                try:
                    barrier.wait(timeout=a.ready_timeout_s + 3600)
                except threading.BrokenBarrierError:
                    pass
                body = dict(m.steps()).get(name)
                if up and body and not past_deadline(a, step=True):
                    m.run_step(name, body)
            m.stop()
            log(status_line(m.job, m.res))

        threads = [threading.Thread(target=one, args=(m,), daemon=True) for m in ms]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def past_deadline(a: argparse.Namespace, step: bool = False) -> bool:
    """Whether `--deadline-s` has passed (steps get `--step-grace-s` more: a step started late still ends inside
    the lease)."""
    if a.deadline_s is None:
        return False
    return time.time() - a.t0 > a.deadline_s + (a.step_grace_s if step else 0)


def status_line(job: Job, res: dict) -> str:
    """One line on a finished job: its start-up, KV and steps, or why it did not run."""
    head = f"{model_label(job.model)} {job.name}"
    if res.get("refused"):
        return f"{head}: refused: {res['refused']}"
    if res.get("error"):
        from sgl_sidp.bench.compare_report import start_failure

        return f"{head}: did not start: {start_failure(res['error'])}"
    done = [k for k in ("exact", "alone", "burst", "profile") if k in res] + list(res.get("traces", {}))
    errs = res.get("step_errors") or {}
    return (f"{head}: up in {res.get('startup_s')} s, KV {res.get('kv_tokens')}, done: {', '.join(done) or 'nothing'}"
            + (f"; errors: {errs}" if errs else ""))


# ----------------------------------------------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sgl_sidp.bench.compare", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 when every configuration ran what was asked (or was refused "
                                "at launch), 1 when one failed or was left for the next call, 2 on bad input.")
    p.add_argument("--model-path", type=Path, action="append", default=[],
                   help="a model folder (config.json; weights unless --load-format dummy); repeatable")
    p.add_argument("--gpus", default="0,1", help="GPU indices to run on (default: %(default)s)")
    p.add_argument("--configs", default="", help="comma-separated configuration names (module docstring) or auto")
    p.add_argument("--out-dir", type=Path, required=True, help="results folder (resumed when it holds results)")
    p.add_argument("--load-format", default=None, help="SGLang's --load-format (e.g. dummy: random weights)")
    p.add_argument("--extra-args", default="",
                   help="more SGLang flags for every server, one shell-quoted string (e.g. \"--attention-backend "
                   "triton --sampling-backend pytorch\")")
    p.add_argument("--config-args", action="append", default=[], metavar="NAME=ARGS",
                   help="more flags for one configuration of --configs, after --extra-args (e.g. "
                   "\"zerodp_dp2=--zerodp-expected-batch kv:8192\"); repeatable")
    p.add_argument("--exact", action="store_true", help="greedy answers on every DP rank against the vanilla reference")
    p.add_argument("--exact-tokens", type=int, default=exact.NEW_TOKENS, help="greedy tokens per prompt (default: %(default)s)")
    p.add_argument("--alone", default=None, metavar="N+IN+OUT",
                   help="N requests of IN prompt and OUT output tokens, one after the other (low-load TTFT, TPOT)")
    p.add_argument("--burst", default=None, metavar="S+IN+OUT", help="S requests of IN prompt and OUT output tokens at once")
    p.add_argument("--burst-twice", action="store_true",
                   help="run the burst once before the measured one, on prompts of its own, and keep both")
    p.add_argument("--burst-gap-s", type=float, default=0.0, metavar="S",
                   help="with --burst-twice: seconds the server idles between the two bursts (default: %(default)s)")
    p.add_argument("--profile", default=None, metavar="S+IN+OUT",
                   help="S requests at once, their prefill and decode forwards traced by SGLang's profiler")
    p.add_argument("--profile-steps", type=int, default=3,
                   help="forwards of each stage --profile traces (default: %(default)s)")
    p.add_argument("--freeze-gc", action="store_true",
                   help="call SGLang's /freeze_gc after each server's warm-up (its tokenizer manager and schedulers "
                        "then never collect the objects they hold: no pause of a full collection mid-burst)")
    p.add_argument("--stream-probe", action="store_true",
                   help="after each server's warm-up, plan calibrate's stream probe (256 x (16, 128)): the tokens a "
                        "second its output stream delivers, which bounds decode-heavy bursts and varies by host")
    p.add_argument("--profile-host", choices=("calls", "frames"), default=None,
                   help="trace --profile's host side too: per forward, the host's launches and its work between "
                        "forwards (profile.host_timeline), by aten op and CUDA call (calls: little overhead) or by "
                        "Python function (frames: the tracer slows the host, traces several times larger)")
    p.add_argument("--profile-after-s", type=float, default=PROFILE_AFTER_S,
                   help="start --profile's trace this long after the burst was sent (default: %(default)s: past its "
                        "first, partly filled, prefill forwards; longer: decode forwards deep in the burst, whose "
                        "prefill then has no trace)")
    p.add_argument("--profile-at-start", action="store_true",
                   help="trace --profile's forwards from the burst's first (one request alone) instead of 1 s in, "
                   "and the host's CUDA calls (its waits for the GPU)")
    p.add_argument("--trace", type=Path, action="append", default=[], help="a trace to replay (repeatable)")
    p.add_argument("--rates", default="1", help="arrival-rate factors of each trace replay (default: %(default)s)")
    p.add_argument("--trace-args", default="", help="more `python -m sgl_sidp.replay` flags (e.g. \"--duration-s 120\")")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="TTFT objective of goodput")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="TPOT objective of goodput")
    p.add_argument("--parallel", action="store_true", help="configurations at once on disjoint GPU sets, in step")
    p.add_argument("--servers-per-gpu", type=int, default=1,
                   help="with --exact alone: servers sharing a GPU at once (give each a --max-total-tokens in "
                   "--extra-args; default: %(default)s)")
    p.add_argument("--port", type=int, default=31000, help="first server's HTTP port (default: %(default)s)")
    p.add_argument("--ready-timeout-s", type=float, default=600.0, help="seconds a server may take to start")
    p.add_argument("--deadline-s", type=float, default=None, help="start no server after this many seconds")
    p.add_argument("--step-grace-s", type=float, default=60.0,
                   help="a step may still start this long after --deadline-s (default: %(default)s)")
    p.add_argument("--report", action="store_true", help="only write the report from --out-dir's results")
    p.add_argument("--no-predict", action="store_true", help="no planner predictions in the report")
    a = p.parse_args(argv)
    a.t0 = time.time()  # what --deadline-s counts from
    a.live = set()  # the Measurements whose server runs (stopped on SIGTERM)
    a.stopping = threading.Event()  # set on SIGTERM: no new server starts
    a.gpus = [g for g in a.gpus.split(",") if g]
    a.config_args = dict(c.partition("=")[::2] for c in a.config_args)
    try:
        a.rates = [float(r) for r in a.rates.split(",") if r]
    except ValueError:
        p.error(f"--rates {a.rates}: expected comma-separated numbers")
    return a


def check(a: argparse.Namespace) -> list[str]:
    """Every problem with the arguments, one line each, before any server starts."""
    problems = []
    if a.report:  # the results folder alone
        return [] if a.out_dir.is_dir() else [f"--out-dir {a.out_dir}: no such folder"]
    if not a.model_path:
        problems.append("--model-path: name at least one model")
    if not a.configs:
        problems.append("--configs: name at least one configuration")
    unknown = sorted(set(a.config_args) - {n for n in a.configs.split(",") if n})
    problems += [f"--config-args {n}=...: {n} is not one of --configs" for n in unknown]
    if not (a.exact or a.alone or a.burst or a.profile or a.trace):
        problems.append("nothing to measure: give --exact, --alone, --burst, --profile or --trace")
    for spec, flag, first in ((a.alone, "--alone", "N"), (a.burst, "--burst", "S"), (a.profile, "--profile", "S")):
        try:
            out = triple(spec, flag, first)[2] if spec else None
        except CompareError as e:
            problems.append(str(e))
            continue
        if flag == "--profile" and out is not None and out < a.profile_steps + 2:
            problems.append(f"--profile {spec}: OUT must be at least --profile-steps + 2 (the decode forwards "
                            "traced, then one that stops the trace)")
    if a.burst_twice and not a.burst:
        problems.append("--burst-twice: give --burst too (the burst to run twice)")
    if a.burst_gap_s and not a.burst_twice:
        problems.append(f"--burst-gap-s {a.burst_gap_s:g}: give --burst-twice too (the gap is between its two bursts)")
    if a.burst_gap_s < 0:
        problems.append(f"--burst-gap-s {a.burst_gap_s:g}: must be at least 0")
    if a.profile and a.profile_steps < 1:
        problems.append(f"--profile-steps {a.profile_steps}: must be at least 1")
    if a.profile_after_s < 0 or (a.profile_after_s != PROFILE_AFTER_S and a.profile_at_start):
        problems.append(f"--profile-after-s {a.profile_after_s:g}: at least 0, and not with --profile-at-start")
    for flag, on in (("--profile-host", a.profile_host), ("--profile-at-start", a.profile_at_start)):
        if on and not a.profile:
            problems.append(f"{flag}: give --profile too (the forwards to trace)")
    if any(r <= 0 for r in a.rates):
        problems.append("--rates: every factor must be positive")
    problems += [f"--trace {t}: no such file" for t in a.trace if not t.is_file()]
    if a.servers_per_gpu < 1:
        problems.append("--servers-per-gpu: at least 1")
    if a.servers_per_gpu > 1 and (a.alone or a.burst or a.profile or a.trace):
        problems.append("--servers-per-gpu > 1 shares GPUs between servers: only for --exact alone (no speed numbers)")
    if not a.gpus or any(not g.isdigit() for g in a.gpus):
        problems.append(f"--gpus {','.join(a.gpus)}: expected GPU indices such as 0,1")
    for m in a.model_path:
        if not (m / "config.json").is_file():
            problems.append(f"--model-path {m}: no config.json")
        elif a.load_format != "dummy" and not any(
                f.suffix in WEIGHT_SUFFIXES for f in m.iterdir()):
            problems.append(f"--model-path {m}: no weights there; pass --load-format dummy for random weights")
    return problems


def _interrupt(signum, frame) -> None:  # noqa: ARG001
    """The first SIGTERM stops the run; later ones are ignored, so that stopping the servers is not itself cut short
    (a second signal inside the handler left a 4-GPU server running into the next device call)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    from sgl_sidp.bench.compare_report import write_report

    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    problems = check(a)
    jobs, notes = [], []
    if not problems and not a.report:
        try:
            jobs, notes = plan_jobs(a.model_path, [n for n in a.configs.split(",") if n], len(a.gpus), a.exact,
                                    a.out_dir)
        except CompareError as e:
            problems.append(str(e))
    if problems:
        for line in problems:
            print(f"compare: error: {line}", file=sys.stderr)
        return 2
    a.out_dir.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(f"[compare {time.time() - a.t0:6.0f} s] {line}", flush=True)

    rc = 0
    if not a.report:
        with open(a.out_dir / "commands.txt", "a") as f:
            inherited = [f"{k}={v}" for k, v in sglang_switches().items()]
            f.write(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')} commit {git_commit()}: "
                    f"{shlex.join([*inherited, 'python', '-m', 'sgl_sidp.bench.compare', *argv])}\n")
        for m in a.model_path:
            folder = a.out_dir / model_label(m)
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(m / "config.json", folder / "config.json")  # what the report's predictions read
        for n in notes:
            log(f"skipped: {n}")
        todo = [j for j in jobs if pending(j, a)]
        log(f"{len(todo)} of {len(jobs)} configurations to run: " + ", ".join(f"{j.model.name}/{j.name}" for j in todo))
        for line in vanilla_gaps(jobs, a) if a.burst else []:
            log(line)
        prebuild = start_jit_prebuild(todo, a.gpus, a.out_dir / "logs")
        signal.signal(signal.SIGTERM, _interrupt)  # `timeout` stops the run: its servers (own sessions) stop too
        try:
            if a.exact and not (a.alone or a.burst or a.profile or a.trace):
                run_exact_pool(todo, a, log)
            else:
                run_rounds(todo, a, log)
        except KeyboardInterrupt:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            a.stopping.set()
            for m in list(a.live):
                m.stop()
            log("interrupted: the servers stopped; what was measured is kept")
        finally:
            if prebuild is not None:
                prebuild.stop()
                log(prebuild.report())
        left = [j for j in jobs if pending(j, a) or load_result(j.result).get("error")]
        rc = 1 if left else 0
        if left:
            log("not done: " + ", ".join(f"{j.model.name}/{j.name}" for j in left))
    print(write_report(a.out_dir, predict=not a.no_predict))
    return rc


if __name__ == "__main__":
    sys.exit(main())
