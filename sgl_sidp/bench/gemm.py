"""How fast one GPU runs a dense decoder layer's four linear GEMMs in the shapes each configuration gives them.

A prefill forward of T tokens on P GPUs gives every GPU, per decoder layer, the GEMMs of
- DP (one replica's whole weights): T rows by each whole weight;
- TP = P: T rows by each weight's 1/P (QKV and gate|up split along N, O and down along K);
- Shift's base configuration (SP = P, `sgl_sidp.shift.ulysses`): T / P rows by each whole weight, QKV as one GEMM per
  shift shard (`column_blocks`) and O as one GEMM per received block added onto the last (`row_blocks_gemm`).
All three do the same FLOPs per token on P GPUs; this times what each shape costs, so a profile's GEMM column (e.g.
Shift's and TP2's 75.5 ms against DP2's 131 ms per 8,192-token forward on 2 x H100, `benchmarks/results/multi_gpu/
q8_shift_blocks_2gpu_h100`) can be split into FLOPs and shape.

    python -m sgl_sidp.bench.gemm --model-path DIR [--tokens 4096,8192,16384] [--gpus 2]

Times with CUDA events over `--iters` repetitions after `--warmup` (the GEMMs only: no norms, no attention, no
communication), each size's configurations in turn `--sweeps` times with the order rotated, the median kept; on a
machine without CUDA it runs on the CPU in float32 (a check of the shapes, not a timing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

CONFIGURATIONS = ("dp", "tp", "sp")


@dataclass(frozen=True)
class LayerShape:
    """A dense decoder layer's linear shapes: hidden size H, QKV output width (query and KV heads x head dim), the
    attention output width, and the MLP's intermediate size I (gate|up is 2I wide)."""

    hidden: int
    qkv: int
    attn_out: int
    inter: int

    @classmethod
    def of(cls, cfg: dict) -> "LayerShape":
        """From a Hugging Face config.json, as the planner reads it (`calibration.memory.ModelShapes`).

        Raises:
            ValueError: an MoE config (its experts are not one dense MLP).
        """
        from sgl_sidp.calibration.memory import ModelShapes

        s = ModelShapes.of(cfg)
        if s.experts > 1:
            raise ValueError("bench.gemm: an MoE model; its experts are not one dense MLP")
        return cls(s.hidden, s.qkv_width(1), s.heads * s.head_dim, s.intermediate)

    def flops(self, tokens: int) -> float:
        """FLOPs of the four GEMMs of one layer over `tokens` rows with whole weights."""
        return 2.0 * tokens * self.hidden * (self.qkv + self.attn_out + 3 * self.inter)


def layer_gemms(shape: LayerShape, config: str, tokens: int, p: int, dtype, device) -> list:
    """The GEMMs one GPU runs for one layer of a `tokens`-token forward in `config` ("dp", "tp" or "sp") over `p`
    GPUs, as zero-argument callables on preallocated tensors (bf16/fp16 on CUDA)."""
    h, i = shape.hidden, shape.inter
    rows = tokens // p if config == "sp" else tokens
    col = p if config == "tp" else 1  # the 1/P of N (QKV, gate|up) or K (O, down) a TP rank holds
    t = lambda *s: torch.randn(*s, dtype=dtype, device=device)  # noqa: E731
    x, w_qkv, w_gu = t(rows, h), t(shape.qkv // col, h), t(2 * i // col, h)
    w_o, w_down = t(h, shape.attn_out // col), t(h, i // col)
    a, g = t(rows, shape.attn_out // col), t(rows, i // col)
    if config != "sp" or p == 1:
        return [lambda: torch.mm(x, w_qkv.t()), lambda: torch.mm(a, w_o.t()), lambda: torch.mm(x, w_gu.t()),
                lambda: torch.mm(g, w_down.t())]
    from sgl_sidp.shift.ulysses import column_blocks, row_blocks_gemm

    blocks = t(p, rows, shape.attn_out // p)
    return [lambda: column_blocks(x, w_qkv, None, p), lambda: row_blocks_gemm(blocks, w_o),
            lambda: torch.mm(x, w_gu.t()), lambda: torch.mm(g, w_down.t())]


def time_ms(fns: list, warmup: int, iters: int, cuda: bool) -> float:
    """Milliseconds per round of `fns` (each called once a round), the mean over `iters` rounds after `warmup`: on
    the GPU by CUDA events with the rounds back to back (`calibration.measure.pipelined_ms`), else by the host's
    clock."""
    def one_round():
        for f in fns:
            f()

    if cuda:
        from sgl_sidp.calibration.measure import pipelined_ms

        return pipelined_ms(one_round, iters, rounds=1, warmup=warmup)
    for _ in range(warmup):
        one_round()
    t0 = time.perf_counter()
    for _ in range(iters):
        one_round()
    return (time.perf_counter() - t0) * 1e3 / iters


def measure(shape: LayerShape, tokens_list, p: int, warmup: int = 3, iters: int = 20, sweeps: int = 3) -> list[dict]:
    """One row per (forward tokens, configuration): ms per layer on one GPU, per-GPU TFLOP/s, and GPU-ms per
    1,000 tokens of the forward (the P GPUs' time for DP is one GPU's: each replica runs its own forward).

    Each size's configurations are timed `sweeps` times in turn, the order rotated each sweep, and the median kept
    ("spread": (max - min) / median over the sweeps): under a power limit a GPU's clock drifts with its recent load
    (an H200 ran identical GEMMs 5 % faster when timed first than right after, `gemm_sustained_1gpu_h200`), so one
    timing after another would favour whichever configuration went first."""
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    out = []
    for tokens in tokens_list:
        fns = {c: layer_gemms(shape, c, tokens, p, dtype, device) for c in CONFIGURATIONS}
        times: dict[str, list[float]] = {c: [] for c in CONFIGURATIONS}
        for sweep in range(sweeps):
            k = sweep % len(CONFIGURATIONS)
            for config in CONFIGURATIONS[k:] + CONFIGURATIONS[:k]:
                times[config].append(time_ms(fns[config], warmup, iters, cuda))
        for config in CONFIGURATIONS:
            ms = statistics.median(times[config])
            gpus = 1 if config == "dp" else p
            out.append({"tokens": tokens, "config": config, "ms_per_layer": ms,
                        "spread": (max(times[config]) - min(times[config])) / ms,
                        "tflops_per_gpu": shape.flops(tokens) / gpus / (ms / 1e3) / 1e12,
                        "gpu_ms_per_1k_tokens": ms * gpus / tokens * 1e3})
    return out


def table(rows: list[dict], p: int) -> str:
    """Markdown of `measure`'s rows, each against DP's GPU-ms per token at the same forward size."""
    lines = [f"| forward tokens | configuration | ms per layer (one GPU) | spread | TFLOP/s per GPU | GPU-ms per 1,000 "
             f"tokens, vs DP |", "|---:|---|---:|---:|---:|---:|"]
    names = {"dp": "DP (whole weights)", "tp": f"TP{p}", "sp": f"Shift base SP{p}"}
    for r in rows:
        dp = next(x for x in rows if x["tokens"] == r["tokens"] and x["config"] == "dp")
        per_1k, vs_dp = r["gpu_ms_per_1k_tokens"], r["gpu_ms_per_1k_tokens"] / dp["gpu_ms_per_1k_tokens"]
        lines.append(f"| {r['tokens']:,} | {names[r['config']]} | {r['ms_per_layer']:.3f} | {r['spread']:.1%} | "
                     f"{r['tflops_per_gpu']:.0f} | {per_1k:.3f} ({vs_dp:.2f}x) |")
    return "\n".join(lines)


def layer_cli(prog: str, doc: str, tokens: str, gpus_help: str) -> argparse.ArgumentParser:
    """The flags of the one-layer benches (`bench.gemm`, `bench.a2a`): --model-path, --tokens, --gpus, --warmup,
    --iters."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    ap.add_argument("--model-path", required=True, help="a folder with the model's config.json (dense)")
    ap.add_argument("--tokens", default=tokens, help="forward sizes, tokens (comma-separated)")
    ap.add_argument("--gpus", type=int, default=2, help=gpus_help)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    return ap


def layer_case(a: argparse.Namespace, min_gpus: int) -> tuple[dict, list[int]]:
    """(config.json, forward sizes) of `layer_cli`'s arguments.

    Raises:
        OSError, KeyError, ValueError: no readable config; --gpus under `min_gpus`, or sizes not multiples of it.
    """
    cfg = json.loads((Path(a.model_path) / "config.json").read_text())
    tokens = [int(t) for t in a.tokens.split(",")]
    if a.gpus < min_gpus or any(t < a.gpus or t % a.gpus for t in tokens):
        raise ValueError(f"--gpus must be {min_gpus} or more and --tokens multiples of it (--gpus {a.gpus})")
    return cfg, tokens


def main(argv=None) -> int:
    ap = layer_cli("python -m sgl_sidp.bench.gemm", __doc__, "2048,4096,8192,16384",
                   "P, the GPUs TP and Shift's SP split over")
    ap.add_argument("--sweeps", type=int, default=3, help="timings of each configuration, in rotated order (default: "
                    "%(default)s)")
    a = ap.parse_args(argv)
    try:
        if a.sweeps < 1:
            raise ValueError("--sweeps must be 1 or more")
        cfg, tokens = layer_case(a, 1)
        shape = LayerShape.of(cfg)
    except (OSError, KeyError, ValueError) as e:
        print(f"bench.gemm: error: {e}")
        return 2
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (float32: shapes only, not a timing)"
    print(f"{Path(a.model_path).name}, one layer's GEMMs on {gpu}, P = {a.gpus}\n")
    print(table(measure(shape, tokens, a.gpus, a.warmup, a.iters, a.sweeps), a.gpus))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
