"""ZeroDP's fetch-vs-compute table and calibration file, from two GPU measurements of one run.

Inputs (both made on the same GPU machine, see benchmarks/results/zerodp/README.md):
- `--copy-bench`: JSON from `scripts/zerodp_copy_bench.py` (peer-copy peak, one-layer pull GB/s).
- `--bench-one-batch`: logs of vanilla `python -m sglang.bench_one_batch` runs (forward times:
  "Prefill. latency" of a batch of `bs` prompts of `input_len` tokens, "Decode. median latency"
  of a decode step at batch `bs`).

Outputs:
- `--out-md`: the table the policy is built on: for each decode batch and prefill size, the
  vanilla forward time and how many MoE layers' experts (w13 + w2) a sink can pull within it.
- `--out-calibration`: the JSON `sgl_sidp.calibration.table.Calibration` reads (decode_ms by batch,
  prefill_ms by tokens per forward, copy_gbps).

    python scripts/zerodp_fetch_vs_compute.py --copy-bench copy_bench.json \
        --bench-one-batch bench_one_batch_2k.log bench_one_batch_short.log \
        --model-config .gpu/models/Qwen3-30B-A3B/config.json --gpu H200 \
        --out-md fetch_vs_compute.md --out-calibration h200_qwen3-30b-a3b_tp1.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

from sgl_sidp.calibration.cost import COPY_BUDGET_MARGIN
from sgl_sidp.model_info import model_signature

_PREFILL = re.compile(r"Prefill\. latency: ([\d.]+) s, throughput:\s+([\d.]+) token/s")
_DECODE_BS = re.compile(r"Decode \d+\. Batch size: (\d+)")
_MEDIAN = re.compile(r"Decode\.\s+median latency: ([\d.]+) s")


def parse_bench_one_batch(text: str) -> list[dict]:
    """Runs after SGLang's "Benchmark ..." marker: `{"bs", "prefill_tokens", "prefill_ms", "decode_ms"}` each."""
    text = text.split("Benchmark ...", 1)[-1]
    runs, cur = [], None
    for line in text.splitlines():
        if m := _PREFILL.search(line):
            lat, tput = float(m.group(1)), float(m.group(2))
            cur = {"prefill_ms": lat * 1e3, "prefill_tokens": int(round(lat * tput)), "bs": None}
            runs.append(cur)
        elif cur is not None and (m := _DECODE_BS.search(line)):
            cur["bs"] = int(m.group(1))
        elif cur is not None and (m := _MEDIAN.search(line)):
            cur["decode_ms"] = float(m.group(1)) * 1e3
    return [r for r in runs if r["bs"] is not None and "decode_ms" in r]


def _read(path: str) -> str:
    return gzip.open(path, "rt").read() if path.endswith(".gz") else Path(path).read_text()


def build(copy_bench: dict, runs: list[dict]) -> tuple[dict, list[str]]:
    """(calibration dict without model/gpu, Markdown lines)."""
    one = copy_bench["rounds"][0]["per_sink"][0]
    layer_bytes = one["layer_bytes"]
    gbps = layer_bytes / one["eager_ms"] / 1e6
    layer_ms = one["eager_ms"]
    decode = {r["bs"]: round(r["decode_ms"], 2) for r in runs}
    prefill = {}
    for r in runs:
        if r["bs"] <= 4:  # one forward of bs x input_len tokens: the prefill chunks
            prefill[r["prefill_tokens"]] = round(r["prefill_ms"], 2)
    peak = max(copy_bench["peer_copy_peak_gbps"].values())
    md = [
        f"Peer-copy peak (torch cross-device copy, same run): {peak:.0f} GB/s. One layer's experts "
        f"(w13 + w2, {layer_bytes / 1e9:.2f} GB) pulled through the VMM mapping: {layer_ms:.2f} ms = {gbps:.0f} GB/s "
        f"({gbps / peak:.0%} of peak); inside a CUDA graph: {one['graph_ms']:.2f} ms.",
        "",
        f"| forward (vanilla SGLang) | forward ms | layers whose copy fits ({COPY_BUDGET_MARGIN:.0%} of it) | share of all 48 layers' copy hidden |",
        "|---|---:|---:|---:|",
    ]
    for bs, ms in sorted(decode.items()):
        md.append(f"| decode, batch {bs} | {ms:.2f} | {int(COPY_BUDGET_MARGIN * ms // layer_ms)} | {min(1.0, ms / (48 * layer_ms)):.0%} |")
    for tok, ms in sorted(prefill.items()):
        md.append(f"| prefill, {tok} tokens | {ms:.2f} | {int(COPY_BUDGET_MARGIN * ms // layer_ms)} | {min(1.0, ms / (48 * layer_ms)):.0%} |")
    return {"decode_ms": decode, "prefill_ms": prefill, "copy_gbps": round(gbps, 1)}, md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copy-bench", required=True, help="JSON written by scripts/zerodp_copy_bench.py")
    ap.add_argument("--bench-one-batch", nargs="+", required=True,
                    help="logs of `python -m sglang.bench_one_batch` runs (plain or .gz)")
    ap.add_argument("--model-config", required=True, help="the model's config.json")
    ap.add_argument("--tp-size", type=int, default=1,
                    help="TP size the forward times were measured at (part of the calibration's model key; default: 1)")
    ap.add_argument("--gpu", required=True, help="GPU name as torch.cuda.get_device_name contains it, e.g. H200")
    ap.add_argument("--source", default="", help="how the inputs were made (goes into the calibration file)")
    ap.add_argument("--out-md", required=True, help="where to write the markdown table")
    ap.add_argument("--out-calibration", required=True, help="where to write the calibration JSON")
    a = ap.parse_args()
    runs = [r for p in a.bench_one_batch for r in parse_bench_one_batch(_read(p))]
    cal, md = build(json.loads(Path(a.copy_bench).read_text()), runs)
    cal = {"model": model_signature(json.loads(Path(a.model_config).read_text()), a.tp_size), "gpu": a.gpu, **cal, "source": a.source}
    Path(a.out_md).write_text("\n".join(md) + "\n")
    Path(a.out_calibration).write_text(json.dumps(cal, indent=1) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
