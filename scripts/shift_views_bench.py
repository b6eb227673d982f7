"""Shift Parallelism: do the shift configuration's weight views cost time against contiguous copies? (one GPU)

For a dense model's layer (default Qwen3-32B) and P = SP (TP_b = 1), times on one GPU the GEMMs a shift rank runs
per layer on its TP = P shard, two ways:

- views (`sgl_sidp.shift.views`, no extra memory): the shard as a view of the shard-major base weight (the SP
  group's shards concatenated): QKV and gate|up contiguous row runs (SGLang's fused GEMMs as they are), O and down
  strided column views (leading dimension = the base width);
- copies (1/SP of those weights extra): the same shards contiguous.

Prints ms per layer for each and their ratio, at decode batches and a prefill chunk; bf16, each variant captured in
a CUDA graph and replayed (CUDA events, medians).
Usage: python scripts/shift_views_bench.py [--model-config config.json] [--sp 2] [--tokens 1 8 64 256 8192]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from sgl_sidp.calibration.measure import median_ms
from sgl_sidp.shift.views import COLUMN, ROW, shard_view


def timed(fn, iters=50):
    """Median ms of `fn` captured in a CUDA graph and replayed (as SGLang runs decode; no launch overhead)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return median_ms(graph.replay, iters, warmup=5)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-config", default=str(Path(__file__).resolve().parents[1] / ".gpu/models/Qwen3-32B/config.json"),
                    help="a dense model's config.json (default: .gpu/models/Qwen3-32B/config.json)")
    ap.add_argument("--sp", type=int, default=2, help="P = SP: a shift rank holds a TP = P shard (default: %(default)s)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256, 1024, 8192],
                    help="tokens per forward to time: decode batches and a prefill chunk "
                         "(default: 1 8 64 256 1024 8192)")
    a = ap.parse_args(argv)
    hf = json.loads(Path(a.model_config).read_text())
    H, I = hf["hidden_size"], hf["intermediate_size"]
    nh, nkv = hf["num_attention_heads"], hf["num_key_value_heads"]
    d = hf.get("head_dim") or H // nh
    sp = a.sp
    dev, dt = torch.device("cuda"), torch.bfloat16
    kv_p = max(1, nkv // sp)  # KV heads per shard (one replicated head when SP > KV heads)
    c_qkv, i_p = (nh // sp + 2 * kv_p) * d, I // sp
    base = {"qkv": torch.randn(sp * c_qkv, H, device=dev, dtype=dt), "gu": torch.randn(sp * 2 * i_p, H, device=dev, dtype=dt),
            "o": torch.randn(H, nh * d, device=dev, dtype=dt), "down": torch.randn(H, I, device=dev, dtype=dt)}
    dims = {"qkv": COLUMN, "gu": COLUMN, "o": ROW, "down": ROW}
    views = {k: shard_view(w, dims[k], sp, 0) for k, w in base.items()}  # every part costs the same
    copies = {k: v.contiguous() for k, v in views.items()}
    extra = sum(t.numel() * t.element_size() for t in copies.values())
    print(f"{Path(a.model_config).parent.name}, SP={sp}: a shift rank's shard per layer {extra / 1e6:.0f} MB "
          f"(what copies would add); {torch.cuda.get_device_name()}\n")
    print("| tokens | views ms/layer | copies ms/layer | views / copies |")
    print("|---:|---:|---:|---:|")
    for n in a.tokens:
        x = torch.randn(n, H, device=dev, dtype=dt)
        xo = torch.randn(n, views["o"].shape[1], device=dev, dtype=dt)
        xd = torch.randn(n, views["down"].shape[1], device=dev, dtype=dt)

        def run(w):
            return lambda: (x @ w["qkv"].T, x @ w["gu"].T, xo @ w["o"].T, xd @ w["down"].T)

        tv, tc = timed(run(views)), timed(run(copies))
        print(f"| {n} | {tv:.3f} | {tc:.3f} | {tv / tc:.2f} |")


if __name__ == "__main__":
    main()
