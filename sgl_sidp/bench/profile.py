"""Where a server's GPU time goes: SGLang's own torch profiler over a few forwards, summarised by kernel class.

Source: SGLang 0.5.17's `POST /start_profile` (`ProfileReq`; `SchedulerProfilerManagerMixin` in
`sglang.srt.managers.scheduler_components.profiler_manager`). With `profile_by_stage` every scheduler (each TP rank of
each DP rank) traces its next `num_steps` prefill forwards, then its next `num_steps` decode forwards, and writes one
Chrome trace per stage: `<profile_id>-TP-<t>[-DP-<d>]-EXTEND.trace.json.gz` and `...-DECODE.trace.json.gz`. Kernels
replayed from CUDA graphs are in them (CUPTI records graph kernels one by one).

`summarize_trace` condenses one such trace into milliseconds per kernel class (`KERNEL_CLASSES`), the GPU span and
busy time, and the heaviest kernels, so two configurations' forwards compare side by side (`compare --profile`)
without shipping the traces (tens of MB each). Pure functions over parsed JSON; the HTTP part is `start`.
"""

from __future__ import annotations

import gzip
import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Iterable, Mapping

#: (class, regular expression on the kernel name, case-insensitive), first match wins; the rest is "other".
#: comm: NCCL, SGLang's custom all-reduce (`cross_device_reduce_*`), torch symmetric-memory collectives;
#: gemm: cuBLAS/cuBLASLt (`nvjet`, `sm90_xmma`, `cutlass`), Triton matmuls; norm: RMSNorm/LayerNorm (FlashInfer's
#: `flashinfer::norm::FusedAddRMSNormKernel` among them, before attention claims "flashinfer"); attention: SGLang's
#: Triton attention (`_fwd_kernel*`, `_fwd_grouped_kernel_stage1`), FlashAttention and FlashInfer's attention kernels.
KERNEL_CLASSES: tuple[tuple[str, str], ...] = (
    ("comm", r"nccl|cross_device_reduce|all_?reduce|all_?gather|all_?to_?all|reduce_?scatter|one_shot|two_shot|symm"),
    ("gemm", r"gemm|xmma|cutlass|nvjet|cublas|matmul|wgmma|_mm_"),
    ("norm", r"rms_?norm|layer_?norm|norm::"),
    ("attention", r"attn|attention|flash_?fwd|flashinfer|_fwd_kernel|fwd_grouped|decode_grouped|_decode_|extend_"),
    ("moe", r"moe|topk|expert"),
)
_CLASS_RES = [(name, re.compile(rx, re.I)) for name, rx in KERNEL_CLASSES]
#: Chrome-trace categories of GPU work (torch profiler / Kineto).
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
#: Chrome-trace categories of the host's CUDA calls (recorded with the "CPU" activity)
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
#: Chrome-trace categories of the host's own work: Python frames (traced with stacks), aten ops, CUDA calls
HOST_CATEGORIES = ("python_function", "cpu_op", "user_annotation") + RUNTIME_CATEGORIES
#: a host CUDA call at least this long (ms) is listed in `host_waits`: where the scheduler's thread stood waiting
HOST_WAIT_MS = 1.0
#: how long after a burst is sent `compare --profile` starts its trace unless told (s, `--profile-after-s`): past the
#: burst's first, partly filled, prefill forwards
AFTER_S = 1.0
STAGES = {"EXTEND": "prefill", "DECODE": "decode"}


def kernel_class(name: str, category: str = "kernel") -> str:
    """The class of one GPU event: "copy" for memcpy/memset events, else the first `KERNEL_CLASSES` entry whose
    pattern the kernel name matches, else "other"."""
    if category != "kernel":
        return "copy"
    for cls, rx in _CLASS_RES:
        if rx.search(name):
            return cls
    return "other"


def _union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length (us) of the union of [start, end) intervals."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def forwards_in(by_name: Mapping[str, tuple[float, int]], layers: int) -> int | None:
    """Forwards a trace covers, counted from its attention kernels: every decoder layer launches the same attention
    kernel once per forward, so the most-called attention-class kernel ran `layers` times a forward. None when that
    count is not a whole number of forwards (e.g. a backend launching a kernel per request)."""
    calls = [n for name, (_, n) in by_name.items() if kernel_class(name) == "attention"]
    if not calls or layers < 1 or max(calls) % layers:
        return None
    return max(calls) // layers


def summarize_trace(trace: Mapping, steps: int, top: int = 8, layers: int | None = None, class_top: int = 4) -> dict:
    """One Chrome trace's GPU work, per forward.

    Args:
        trace: the parsed trace (`{"traceEvents": [...]}`); complete events (`"ph": "X"`) of `GPU_CATEGORIES`
            count, with `ts` and `dur` in microseconds.
        steps: the forwards SGLang was asked to trace (`num_steps`): the divisor when `layers` cannot count them (a
            stage that ended sooner, e.g. the last prefill before decoding, covers fewer).
        top: how many of the heaviest kernels to list.
        layers: the model's decoder layers: count the forwards from the attention kernels (`forwards_in`).
        class_top: how many of each class's heaviest kernels to list (`"by_class_top"`): what a class's ms hold
            where `top` names only the heaviest overall (Shift's TP2 decode step's "other" class, 0.35 ms a forward
            over DP2's in `q8_decode_prof_pair_2gpu_h200`, had none of its kernels in `top`).

    Returns:
        `{"steps", "counted", "kernels", "span_ms", "busy_ms", "by_class_ms": {class: ms}, "top": [[name, ms, calls],
        ...], "by_class_top": {class: [[name, ms, calls], ...]}}`, times in ms per forward (`steps` = the divisor used;
        `counted`: whether it was counted from the trace): span = first GPU event's start to the last one's end (idle
        gaps included), busy = the union of GPU events (overlapping streams counted once), a class = the sum of its
        events' durations (overlap counted twice, so classes may add up to more than busy). Where `layers` counted the
        forwards, also `"first_us"` (the first GPU event's timestamp, us), `"forwards"` (`each_forward`) and, where the
        host was traced, `"host"` (`host_timeline`); where the host was traced, also `"host_waits"` (`host_waits`).

    Raises:
        ValueError: `steps` < 1, or the trace has no GPU event (a profile that saw no forward).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    events = [e for e in trace.get("traceEvents", [])
              if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES and "dur" in e and "ts" in e]
    if not events:
        raise ValueError("the trace has no GPU event (no forward ran while profiling)")
    by_class: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    class_of: dict[str, str] = {}  # kernel name -> class
    for e in events:
        cls = kernel_class(e.get("name", ""), e["cat"])
        by_class[cls] = by_class.get(cls, 0.0) + float(e["dur"])
        name = e.get("name", "")[:100]
        class_of[name] = cls
        agg = by_name.setdefault(name, [0.0, 0])
        agg[0] += float(e["dur"])
        agg[1] += 1
    start = min(float(e["ts"]) for e in events)
    end = max(float(e["ts"]) + float(e["dur"]) for e in events)
    busy = _union_us((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events)
    heaviest = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    counted = forwards_in(by_name, layers) if layers else None
    steps = counted or steps
    per = 1e3 * steps
    out = {"steps": steps, "counted": counted is not None, "kernels": len(events),
           "span_ms": round((end - start) / per, 3), "busy_ms": round(busy / per, 3),
           "by_class_ms": {c: round(v / per, 3) for c, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
           "top": [[name, round(ms / per, 3), calls // steps] for name, (ms, calls) in heaviest],
           "by_class_top": {c: [[name, round(ms / per, 3), calls // steps] for name, (ms, calls) in
                                sorted(((n, v) for n, v in by_name.items() if class_of[n] == c),
                                       key=lambda kv: -kv[1][0])[:class_top]] for c in by_class}}
    if counted:  # one by one, from the trace's first GPU event (first_us: its own clock, the host's across ranks)
        slices = forward_slices(events, by_name, counted)
        out["first_us"], out["forwards"] = start, each_forward(slices)
        if (timeline := host_timeline(trace, slices)) is not None:
            out["host"] = timeline
    waits = host_waits(trace, start)
    if waits is not None:
        out["host_waits"] = waits
    return out


def host_waits(trace: Mapping, t0_us: float, top: int = 24) -> list[list] | None:
    """The host's CUDA calls of at least `HOST_WAIT_MS` in a trace recorded with the "CPU" activity: `[[start ms
    (from `t0_us`, the first GPU event), ms, name], ...]`, the `top` longest in time order; None where the trace has
    no host CUDA call (recorded without "CPU"). A kernel launch that blocks (a full launch queue) or a
    synchronisation shows here: the scheduler's thread waiting for the GPU instead of preparing the next batch."""
    calls = [e for e in trace.get("traceEvents", [])
             if e.get("ph") == "X" and e.get("cat") in RUNTIME_CATEGORIES and "dur" in e and "ts" in e]
    if not calls:
        return None
    long = sorted((e for e in calls if float(e["dur"]) >= HOST_WAIT_MS * 1e3), key=lambda e: -float(e["dur"]))[:top]
    return [[round((float(e["ts"]) - t0_us) / 1e3, 3), round(float(e["dur"]) / 1e3, 3), e.get("name", "")[:60]]
            for e in sorted(long, key=lambda e: float(e["ts"]))]


def forward_slices(events: list[Mapping], by_name: Mapping[str, tuple[float, int]], n: int) -> list[list[Mapping]]:
    """The trace's GPU events cut into its `n` forwards (`forwards_in` counted them), in time order. Forward k starts
    after the longest idle gap between forward k-1's last and forward k's first call of the most-called attention
    kernel (its layers' attention), so the embedding, norms and GEMMs before the first layer's attention count to their
    own forward (forwards back to back, with no gap, are cut right before that attention kernel)."""
    ev = sorted(events, key=lambda e: float(e["ts"]))
    attn = max((name for name, _ in by_name.items() if kernel_class(name) == "attention"), key=lambda k: by_name[k][1])
    marks = [i for i, e in enumerate(ev) if e.get("name", "")[:100] == attn and e["cat"] == "kernel"]
    per = len(marks) // n
    cuts = [0]
    for k in range(1, n):
        lo, hi = marks[k * per - 1], marks[k * per]
        best, done = (float("-inf"), lo + 1), float("-inf")
        for j in range(lo, hi):  # done: when everything up to event j has ended
            done = max(done, float(ev[j]["ts"]) + float(ev[j]["dur"]))
            best = max(best, (float(ev[j + 1]["ts"]) - done, j + 1))
        cuts.append(best[1])
    cuts.append(len(ev))
    return [ev[a:b] for a, b in zip(cuts, cuts[1:])]


def each_forward(slices: list[list[Mapping]]) -> list[dict]:
    """The trace's forwards one by one (`forward_slices`): `{"start_ms"` (from the trace's first GPU event),
    `"span_ms"`, `"busy_ms"`, `"comm_ms"}` each. Why per forward: a burst's first forward (one request alone) can run
    apart from the rest (`compare --profile-at-start`); with NCCL, a rank that waits for a late peer shows it as
    communication time."""
    t0, out = float(slices[0][0]["ts"]), []
    for part in slices:
        iv = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in part]
        comm = sum(float(e["dur"]) for e in part if kernel_class(e.get("name", ""), e["cat"]) == "comm")
        out.append({"start_ms": round((iv[0][0] - t0) / 1e3, 3),
                    "span_ms": round((max(e for _, e in iv) - iv[0][0]) / 1e3, 3),
                    "busy_ms": round(_union_us(iv) / 1e3, 3), "comm_ms": round(comm / 1e3, 3)})
    return out


def _short(name: str) -> str:
    """A host event's name without the interpreter's path: "sglang/srt/managers/scheduler.py(1234): run_batch"."""
    return re.sub(r"^.*?(site-packages|dist-packages)/", "", name)[:90]


def _exclusive_pieces(events: list[Mapping]) -> list[tuple[str, float, float]]:
    """(name, start us, end us) pieces of the time each host event of one thread ran outside its children: Kineto's
    python frames, aten ops and CUDA calls nest on a thread; a child sticking out of its parent is clipped to it."""
    pieces, stack = [], []  # stack entries: [name, end, since] (since: its start, then its last child's end)

    def close(until: float) -> None:
        while stack and stack[-1][1] <= until:
            name, end, since = stack.pop()
            pieces.append((name, since, end))
            if stack:
                stack[-1][2] = end
    for e in sorted(events, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
        s = float(e["ts"])
        close(s)
        end = s + float(e["dur"])
        if stack:
            parent = stack[-1]
            pieces.append((parent[0], parent[2], s))
            end = min(end, parent[1])
        stack.append([_short(e.get("name", "")), end, s])
    close(float("inf"))
    return [(n, a, b) for n, a, b in pieces if b > a]


def _self_ms_in(pieces: list[tuple[str, float, float]], windows: list[tuple[float, float]], n_windows: int,
                top: int) -> list[list]:
    """The `top` host events by their own time inside `windows` (us), as [name, ms per window]."""
    by: dict[str, float] = {}
    for name, a, b in pieces:
        for lo, hi in windows:
            if a < hi and b > lo:
                by[name] = by.get(name, 0.0) + min(b, hi) - max(a, lo)
    return [[name, round(us / 1e3 / n_windows, 3)] for name, us in sorted(by.items(), key=lambda kv: -kv[1])[:top]]


def host_timeline(trace: Mapping, slices: list[list[Mapping]], top: int = 12) -> dict | None:
    """The host's side of each traced forward, from a trace recorded with the "CPU" activity (`compare
    --profile-host`): where an eager step's time goes when the GPU is not the bottleneck (SGLang launches every
    kernel of a forward from Python outside CUDA graphs; its overlap scheduler prepares the next batch and reads the
    last one's tokens between forwards on the same thread).

    Each GPU event is tied to the host call that launched it by Kineto's `args.correlation`. Per forward
    (`forward_slices`): `launch_ms` (the first launch's start to the last launch's end), `gpu_ms` (its first kernel's
    start to its last kernel's end), `lag_ms` (last kernel's end minus last launch's end: about 0 when the GPU keeps
    up with the launches, the forward's launch-bound tail), `gap_ms` (the last launch's end to the next forward's first
    launch: the host's work between forwards; None after the last). `in_gaps` and `in_launches`: the `top` host events
    of the launching thread by their own (exclusive) time inside those gaps / launch windows, ms per window (Python
    frames where the trace has stacks, else aten ops and CUDA calls).

    Returns None where no GPU event has a host call with its correlation (a trace without the "CPU" activity)."""
    host = [e for e in trace.get("traceEvents", [])
            if e.get("ph") == "X" and "dur" in e and "ts" in e and e.get("cat") in HOST_CATEGORIES]
    by_corr = {e["args"]["correlation"]: e for e in host
               if e.get("cat") in RUNTIME_CATEGORIES and "correlation" in (e.get("args") or {})}
    launches = [[by_corr[c] for g in part if (c := (g.get("args") or {}).get("correlation")) in by_corr]
                for part in slices]
    if not any(launches):
        return None
    tids = [e.get("tid") for part in launches for e in part]
    tid = max(set(tids), key=tids.count)
    fwd, gaps, spans = [], [], []
    for part, calls in zip(slices, launches):
        calls = [c for c in calls if c.get("tid") == tid]
        if not calls:
            return None
        first, last = min(float(c["ts"]) for c in calls), max(float(c["ts"]) + float(c["dur"]) for c in calls)
        g0, g1 = float(part[0]["ts"]), max(float(e["ts"]) + float(e["dur"]) for e in part)
        fwd.append({"launch_ms": round((last - first) / 1e3, 3), "gpu_ms": round((g1 - g0) / 1e3, 3),
                    "lag_ms": round((g1 - last) / 1e3, 3), "gap_ms": None})
        spans.append((first, last))
    for k in range(len(spans) - 1):
        fwd[k]["gap_ms"] = round((spans[k + 1][0] - spans[k][1]) / 1e3, 3)
        gaps.append((spans[k][1], spans[k + 1][0]))
    pieces = _exclusive_pieces([e for e in host if e.get("tid") == tid])
    return {"forwards": fwd, "in_gaps": _self_ms_in(pieces, gaps, len(gaps), top) if gaps else [],
            "in_launches": _self_ms_in(pieces, spans, len(spans), top)}


def trace_key(path: Path) -> tuple[str, str] | None:
    """(rank, stage) of one of SGLang's per-stage trace files: ("TP-0-DP-1", "prefill"); None for another file."""
    m = re.match(r".*?-(TP-\d+(?:-DP-\d+)?(?:-PP-\d+)?(?:-EP-\d+)?)-(EXTEND|DECODE)\.trace\.json\.gz$", path.name)
    return (m.group(1), STAGES[m.group(2)]) if m else None


def summarize_dir(folder: Path, steps: int, remove: bool = True,
                  layers: int | None = None) -> dict[str, dict[str, dict]]:
    """`{rank: {stage: summarize_trace(...)}}` of every per-stage trace in `folder` (`layers`: see `summarize_trace`);
    each trace removed once read when `remove` (they are tens of MB). A trace that cannot be read gives
    `{"error": ...}` for its stage."""
    out: dict[str, dict[str, dict]] = {}
    for path in sorted(folder.glob("*.trace.json.gz")):
        key = trace_key(path)
        if key is None:
            continue
        try:
            with gzip.open(path, "rt") as f:
                out.setdefault(key[0], {})[key[1]] = summarize_trace(json.load(f), steps, layers=layers)
        except (OSError, ValueError) as e:
            out.setdefault(key[0], {})[key[1]] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        if remove:
            path.unlink(missing_ok=True)
    return out


def start(base_url: str, folder: Path, steps: int, profile_id: str, host: bool = False,
          stacks: bool = False) -> None:
    """Ask the server to trace its next `steps` prefill and `steps` decode forwards (GPU activity only, no stacks
    or shapes: small traces, little overhead; `host`: the CPU activity too, for `host_waits` and `host_timeline`;
    `stacks`: with Python frames, so `host_timeline` names the functions, traces several times larger) into
    `folder` (a path on the server's host).

    Raises:
        urllib.error.URLError / HTTPError: the server refused (e.g. a profile already running).
    """
    folder.mkdir(parents=True, exist_ok=True)
    body = {"output_dir": str(folder.resolve()), "num_steps": steps, "activities": ["CPU", "GPU"] if host else ["GPU"],
            "profile_by_stage": True,
            "with_stack": bool(host and stacks), "record_shapes": False, "profile_id": profile_id}
    req = urllib.request.Request(base_url + "/start_profile", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


def wait_for_traces(folder: Path, expected: int, timeout_s: float = 120.0, settle_s: float | None = None) -> int:
    """Wait until `expected` per-stage traces are in `folder` and none has grown for 2 s (SGLang writes them after
    the forwards, seconds later), or, with `settle_s`, until at least one is there and none has changed for that
    long (the caller knows no forward is left to trace: a stage that never began writes nothing); returns how many
    there are at the end (fewer on timeout)."""
    deadline, last, stable_since = time.time() + timeout_s, None, time.time()
    while time.time() < deadline:
        files = sorted(p for p in folder.glob("*.trace.json.gz") if trace_key(p))
        state = [(p.name, p.stat().st_size) for p in files]
        if state != last:
            last, stable_since = state, time.time()
        elif len(files) >= expected and time.time() - stable_since >= 2.0:
            return len(files)
        elif files and settle_s is not None and time.time() - stable_since >= settle_s:
            return len(files)
        time.sleep(0.5)
    return len(last or [])
