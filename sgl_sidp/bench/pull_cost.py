"""What weight pulls over NVLink cost a GPU's prefill GEMMs, and whether the SM clock says why.

On 4 x H200 a SiDP WaS rank's 4 x 2,048-token Llama-3.1-70B forward took 1,866-1,892 ms while its copy engines pulled
60 FFNs (84.6 GB) from its peers, against 1,752 ms for the TP1 shard alone (`benchmarks/results/multi_gpu/
l70_sidp_prof_4gpu_h200`, `plan calibrate`): 1.48 ms per GB pulled, 4.5x what a decode step loses (0.90 once the
sustained clock is priced apart: `plan.steps.PREFILL_COPY_SLOWDOWN_MS_PER_GB`, `PREFILL_SUSTAINED_FACTOR`). This
runs one decoder layer's GEMMs in DP shapes (`bench.gemm.layer_gemms`) on every GPU at once, `--layers` times back
to back, first alone and then while each GPU pulls `--gb-per-layer` GB a layer from the
next GPU (`Tensor.copy_` across devices: a cudaMemcpyAsync on the copy engines, which PyTorch issues on the source
GPU's stream, a push where SiDP's slot ring pulls from mapped peer memory: the same bytes over NVLink and HBM), and
samples nvidia-smi's SM clock and power draw in each phase. A slowdown that the clock follows
is the power limit's; one at the same clock is the memory's or the copies' own.

    python -m sgl_sidp.bench.pull_cost --model-path DIR [--tokens 8192] [--gb-per-layer 0,1.06] [--gap-ms 0,3]

`--gap-ms` leaves the GPU near idle for that long after each layer, as a TP layer's all-reduces do: under the power
limit the GEMMs around such gaps may run at a higher clock than back to back, which is what a forward without
communication (SiDP WaS, DP) gives up.

Times with CUDA events on each GPU's compute stream. Needs two CUDA GPUs or more with peer access; refuses otherwise
with one line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SMI_FIELDS = ("index", "clocks.sm", "power.draw")


def parse_smi_line(line: str) -> tuple[int, float, float] | None:
    """(GPU index, SM clock MHz, power W) of one `nvidia-smi --query-gpu=index,clocks.sm,power.draw
    --format=csv,noheader,nounits` line; None for a line that is not one ("[N/A]", a warning)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(SMI_FIELDS):
        return None
    try:
        return int(parts[0]), float(parts[1]), float(parts[2])
    except ValueError:
        return None


@dataclass
class SmiSampler:
    """nvidia-smi's SM clock and power of `gpus` every `period_ms`, each line stamped on arrival (time.monotonic),
    for as long as the sampler runs (a context manager). `command` replaces nvidia-smi (tests)."""

    gpus: list[int]
    period_ms: int = 50
    command: list[str] | None = None
    samples: list[tuple[float, int, float, float]] = field(default_factory=list)

    def __enter__(self) -> "SmiSampler":
        cmd = self.command or ["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits",
                               f"-lms={self.period_ms}", "-i", ",".join(map(str, self.gpus))]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            row = parse_smi_line(line)
            if row is not None:
                self.samples.append((time.monotonic(), *row))

    def __exit__(self, *exc) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self._reader.join(timeout=10)

    def between(self, t0: float, t1: float) -> dict[int, dict]:
        """Per GPU, the median SM clock (MHz) and power (W) of the samples taken between t0 and t1, and their count."""
        out: dict[int, dict] = {}
        for gpu in sorted({s[1] for s in self.samples}):
            rows = [s for s in self.samples if s[1] == gpu and t0 <= s[0] <= t1]
            if rows:
                out[gpu] = {"sm_mhz": statistics.median(r[2] for r in rows),
                            "power_w": statistics.median(r[3] for r in rows), "samples": len(rows)}
        return out


SLEEP_CYCLES_PER_MS = 1.5e6  # `torch.cuda._sleep` spins this many SM cycles a ms at ~1.5 GHz (an H200 at its power cap)


def run_phase(gpus: list[int], gemms: dict, pulls: dict, layers: int, gb_per_layer: float, reps: int,
              gap_ms: float = 0.0) -> dict:
    """`reps` rounds of `layers` layers of each GPU's GEMMs (`gemms[g]`: zero-argument callables), all GPUs at once.
    With `gb_per_layer` > 0 each layer's GEMMs run beside a pull of that many GB from the next GPU on g's copy stream
    (`pulls[g]`: (copy stream, source bytes on the peer, destination bytes on g)), which waits for the layer's start:
    one pull a layer, as SiDP's slot ring paces its pulls (`prefetch.SlotPrefetcher`). With `gap_ms` > 0 a spinning
    one-thread kernel (`torch.cuda._sleep`) follows each layer's GEMMs: about that long with the GPU near idle, as a
    TP layer's all-reduces leave it. Returns per GPU the GEMMs' ms per layer (CUDA events around each layer's GEMMs
    on g's compute stream, summed over a round, the median round), the gaps' measured ms per layer, and the pulls'
    GB/s (each pull timed by events on the copy stream)."""
    import torch

    n = int(gb_per_layer * 1e9)
    streams = {g: torch.cuda.Stream(device=g) for g in gpus}
    rounds: dict[int, list] = {g: [] for g in gpus}
    copy_marks: dict[int, list] = {g: [] for g in gpus}
    event = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    for _ in range(reps):
        for g in gpus:
            with torch.cuda.device(g):
                copy_stream, src, dst = pulls[g]
                e0, e1, spans = event(), event(), []
                e0.record(streams[g])
                for _layer in range(layers):
                    if n:
                        start = torch.cuda.Event()
                        start.record(streams[g])
                        copy_stream.wait_event(start)
                        c0, c1 = event(), event()
                        c0.record(copy_stream)
                        with torch.cuda.stream(copy_stream):
                            dst[:n].copy_(src[:n], non_blocking=True)
                        c1.record(copy_stream)
                        copy_marks[g].append((c0, c1))
                    l0, l1 = event(), event()
                    with torch.cuda.stream(streams[g]):
                        l0.record()
                        for f in gemms[g]:
                            f()
                        l1.record()
                        if gap_ms:
                            torch.cuda._sleep(int(gap_ms * SLEEP_CYCLES_PER_MS))
                    spans.append((l0, l1))
                e1.record(streams[g])
                rounds[g].append((e0, e1, spans))
    for g in gpus:  # synchronize() waits for the current GPU only
        torch.cuda.synchronize(g)
    out = {}
    for g in gpus:
        gemm = [sum(a.elapsed_time(b) for a, b in spans) for _e0, _e1, spans in rounds[g]]
        whole = [e0.elapsed_time(e1) for e0, e1, _spans in rounds[g]]
        copy_s = sum(a.elapsed_time(b) for a, b in copy_marks[g]) / 1e3
        out[g] = {"gemm_ms_per_layer": statistics.median(gemm) / layers,
                  "gap_ms_per_layer": statistics.median(w - m for w, m in zip(whole, gemm)) / layers,
                  "pull_gb_s": n * len(copy_marks[g]) / 1e9 / copy_s if copy_marks[g] else 0.0}
    return out


def measure(model_path: Path, gpus: list[int], tokens: int, gb_list: list[float], layers: int, reps: int,
            sampler: SmiSampler | None, gap_list: tuple[float, ...] = (0.0,)) -> list[dict]:
    """One row per (GB pulled a layer, gap after each layer, GPU): the GEMMs' ms per layer, its ratio to the phase
    with neither pulls nor gaps, the gaps' measured ms, the pulls' GB/s, the slowdown in ms per GB pulled (against the
    phase of the same gap without pulls), and the median SM clock and power of the phase (where sampled).

    Raises:
        ValueError: an MoE config (`bench.gemm.LayerShape.of`).
    """
    import torch

    from sgl_sidp.bench.gemm import LayerShape, layer_gemms

    shape = LayerShape.of(json.loads((model_path / "config.json").read_text()))
    nbytes = int(max(gb_list) * 1e9)
    gemms, pulls = {}, {}
    for k, g in enumerate(gpus):
        peer = gpus[(k + 1) % len(gpus)]
        gemms[g] = layer_gemms(shape, "dp", tokens, 1, torch.bfloat16, f"cuda:{g}")
        src = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=f"cuda:{peer}")
        dst = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=f"cuda:{g}")
        pulls[g] = (torch.cuda.Stream(device=g), src, dst)
    run_phase(gpus, gemms, pulls, 4, max(gb_list), 1)  # warm-up: cuBLAS handles, peer access
    rows, alone = [], {}
    for gap in gap_list:
        for gb in gb_list:
            t0 = time.monotonic()
            res = run_phase(gpus, gemms, pulls, layers, gb, reps, gap)
            clocks = sampler.between(t0, time.monotonic()) if sampler else {}
            for g in gpus:
                r = res[g]
                if gb == 0:
                    alone[(gap, g)] = r["gemm_ms_per_layer"]
                ref, first = alone[(gap, g)], alone[(gap_list[0], g)]
                rows.append({"gb_per_layer": gb, "gap_ms": gap, "gpu": g, **r,
                             "vs_alone": r["gemm_ms_per_layer"] / first,
                             "ms_per_gb": (r["gemm_ms_per_layer"] - ref) / gb if gb else None,
                             **clocks.get(g, {})})
    return rows


def table(rows: list[dict]) -> str:
    """Markdown of `measure`'s rows."""
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    lines = ["| GB pulled a layer | gap a layer ms (measured) | GPU | GEMMs ms a layer | vs neither | ms lost per GB | "
             "pulls GB/s | SM clock MHz (median) | power W (median) |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gap = f"{r.get('gap_ms', 0):g} ({r.get('gap_ms_per_layer', 0):.2f})"
        lines.append(f"| {r['gb_per_layer']:g} | {gap} | {r['gpu']} | {r['gemm_ms_per_layer']:.3f} | "
                     f"{f(r['vs_alone'], '.3f')} | {f(r['ms_per_gb'], '.2f')} | {r['pull_gb_s']:.0f} | {f(r.get('sm_mhz'), '.0f')} | {f(r.get('power_w'), '.0f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.bench.pull_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True, type=Path, help="a folder with a dense model's config.json")
    ap.add_argument("--gpus", default="0,1,2,3", help="CUDA GPUs, each pulling from the next (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=8192, help="the forward's tokens (default: %(default)s)")
    ap.add_argument("--gb-per-layer", default="0,1.06",
                    help="GB each GPU pulls a layer, 0 first (default: %(default)s: SiDP DP4's 60 of Llama-3.1-70B's "
                    "80 FFNs of 1.41 GB, per layer)")
    ap.add_argument("--gap-ms", default="0",
                    help="ms of a near-idle GPU after each layer's GEMMs, as TP's all-reduces leave it, 0 first "
                    "(default: %(default)s)")
    ap.add_argument("--layers", type=int, default=80, help="layers a round (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=5, help="rounds per phase, the median kept (default: %(default)s)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    a = ap.parse_args(argv)
    try:
        import torch

        gpus = [int(g) for g in a.gpus.split(",") if g]
        gb_list = [float(x) for x in a.gb_per_layer.split(",") if x]
        gap_list = tuple(float(x) for x in a.gap_ms.split(",") if x)
        if not gap_list or gap_list[0] != 0 or any(x < 0 for x in gap_list):
            raise ValueError("--gap-ms must start with 0 and hold no negative number")
        if not gb_list or gb_list[0] != 0 or any(x < 0 for x in gb_list):
            raise ValueError("--gb-per-layer must start with 0 (the GEMMs alone) and hold no negative number")
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"--gpus {a.gpus}: name each GPU once")
        if a.layers < 1 or a.reps < 1 or a.tokens < 1:
            raise ValueError("--layers, --reps and --tokens must be 1 or more")
        if not (a.model_path / "config.json").is_file():
            raise ValueError(f"no config.json in {a.model_path}")
        if not torch.cuda.is_available() or len(gpus) < 2 or torch.cuda.device_count() <= max(gpus):
            raise ValueError(f"needs two CUDA GPUs or more (asked for {a.gpus}, this host has "
                             f"{torch.cuda.device_count() if torch.cuda.is_available() else 0})")
        for k, g in enumerate(gpus):
            peer = gpus[(k + 1) % len(gpus)]
            if not torch.cuda.can_device_access_peer(g, peer):
                raise ValueError(f"GPU {g} has no peer access to GPU {peer}")
    except ValueError as e:
        print(f"bench.pull_cost: error: {e}")
        return 2
    name = torch.cuda.get_device_name(gpus[0])
    with SmiSampler(gpus) as sampler:
        rows = measure(a.model_path, gpus, a.tokens, gb_list, a.layers, a.reps, sampler, gap_list)
    print(f"{a.model_path.name}: one layer's DP GEMMs of {a.tokens:,} tokens on {len(gpus)} x {name}, {a.layers} "
          f"layers a round, median of {a.reps} rounds; each GPU pulls from the next\n")
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps({"gpu_name": name, "tokens": a.tokens, "layers": a.layers, "rows": rows},
                                     indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
