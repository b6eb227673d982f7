"""Shift Parallelism: do the shift configuration's weight views cost time against contiguous copies? (one GPU)

For a dense model's layer (default Qwen3-32B) and P = SP (TP = 1 in the base configuration), times on one GPU the
GEMMs a shift rank runs per layer, two ways:

- views (`sgl_sidp.shift.views`, no extra memory): QKV as three GEMMs on row-slice views of the fused base weight,
  gate|up as two, O and down on strided column views (leading dimension = the base width);
- copies (1/SP of those weights extra): one fused QKV GEMM, one fused gate|up GEMM, contiguous O and down;
- mixed: a copy of the (small) QKV shard only; gate|up as one batched GEMM over the strided view of its two equal
  blocks; O and down on views.

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
from sgl_sidp.shift.views import column_parts, row_part


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-config", default=str(Path(__file__).resolve().parents[1] / ".gpu/models/Qwen3-32B/config.json"))
    ap.add_argument("--sp", type=int, default=2)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256, 1024, 8192])
    a = ap.parse_args(argv)
    hf = json.loads(Path(a.model_config).read_text())
    H, I = hf["hidden_size"], hf["intermediate_size"]
    nh, nkv = hf["num_attention_heads"], hf["num_key_value_heads"]
    d = hf.get("head_dim") or H // nh
    sp = a.sp
    dev, dt = torch.device("cuda"), torch.bfloat16
    qkv = torch.randn((nh + 2 * nkv) * d, H, device=dev, dtype=dt)
    gate_up = torch.randn(2 * I, H, device=dev, dtype=dt)
    o = torch.randn(H, nh * d, device=dev, dtype=dt)
    down = torch.randn(H, I, device=dev, dtype=dt)
    s = 0  # every part costs the same
    kv_units = [list(range(s * nkv // sp, (s + 1) * nkv // sp))] if nkv >= sp else [[s * nkv // sp]]
    q_v, k_v, v_v = column_parts(qkv, [nh * d, nkv * d, nkv * d], s, sp, unit_rows=[d, d, d],
                                 units=[None, kv_units[0], kv_units[0]])
    g_v, u_v = column_parts(gate_up, [I, I], s, sp)
    o_v, d_v = row_part(o, s, sp), row_part(down, s, sp)
    qkv_c, gu_c = torch.cat([q_v, k_v, v_v]).contiguous(), torch.cat([g_v, u_v]).contiguous()
    o_c, d_c = o_v.contiguous(), d_v.contiguous()
    gu_v = gate_up.view(2, I, H)[:, s * I // sp:(s + 1) * I // sp]  # [2, I/SP, H], strided: one batched GEMM
    extra = sum(t.numel() * t.element_size() for t in (qkv_c, gu_c, o_c, d_c))
    print(f"{Path(a.model_config).parent.name}, SP={sp}: a shift rank's shard per layer {extra / 1e6:.0f} MB "
          f"(what copies would add); {torch.cuda.get_device_name()}\n")
    qkv_extra = qkv_c.numel() * qkv_c.element_size()
    print(f"mixed: copies the QKV shard only ({qkv_extra / 1e6:.0f} MB per layer)\n")
    print("| tokens | views ms/layer | copies ms/layer | mixed ms/layer | views / copies | mixed / copies |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in a.tokens:
        x = torch.randn(n, H, device=dev, dtype=dt)
        xo = torch.randn(n, o_v.shape[1], device=dev, dtype=dt)
        xd = torch.randn(n, d_v.shape[1], device=dev, dtype=dt)

        def views():
            x @ q_v.T, x @ k_v.T, x @ v_v.T, x @ g_v.T, x @ u_v.T, xo @ o_v.T, xd @ d_v.T

        def copies():
            x @ qkv_c.T, x @ gu_c.T, xo @ o_c.T, xd @ d_c.T

        def mixed():
            x @ qkv_c.T, torch.matmul(x, gu_v.transpose(1, 2)), xo @ o_v.T, xd @ d_v.T

        tv, tc, tm = timed(views), timed(copies), timed(mixed)
        print(f"| {n} | {tv:.3f} | {tc:.3f} | {tm:.3f} | {tv / tc:.2f} | {tm / tc:.2f} |")


if __name__ == "__main__":
    main()
