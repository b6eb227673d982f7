"""The all-reduce a TP-N forward pays, per call, from a TP-N server's calibration and its TP-N shard's on one GPU.

    python scripts/fit_allreduce_from_forwards.py --shard SHARD.json --real REAL.json [REAL.json ...] --gpus 2

REAL: `--overlay-calibrate` cache entries of SGLang serving the whole model at `--tp N` on N GPUs
(`scripts/gpu_calibrate_model.sh OUT MODEL --tp N`); SHARD: the entry of its TP-N shard timed on one GPU
(`python -m sgl_sidp.plan calibrate`). A TP forward is its shard's forward plus two all-reduces of the tokens' hidden
states per layer, so each point both have (decode batches at both contexts, prefills of `--prefill-from` tokens or more)
gives one all-reduce's time at that size: (real - shard) / (2 x layers) (`sgl_sidp.plan.comm.forward_all_reduce_points`).
Prints the points and their fit, latency + bytes / bus bandwidth (`comm.fit`): the numbers the interconnect table's
all_reduce entry takes. `python -m sgl_sidp.plan measure-comm --model-path MODEL` does the same on a node, serving the
model itself.
"""

from __future__ import annotations

import argparse
import json

from sgl_sidp.calibration.table import Calibration
from sgl_sidp.plan.comm import fit, forward_all_reduce_points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shard", required=True, help="the TP-N shard's calibration (cache entry or table)")
    ap.add_argument("--real", nargs="+", required=True, help="calibrations of TP-N servers of the same model")
    ap.add_argument("--gpus", type=int, required=True, help="N, the TP size of the real servers")
    ap.add_argument("--prefill-from", type=int, default=2048, help="prefills of this many tokens or more (default: 2048)")
    a = ap.parse_args()

    def load(path: str) -> Calibration:
        with open(path) as f:
            return Calibration.from_entry(json.load(f))

    shard = load(a.shard)
    # the signature names them: "Qwen3ForCausalLM L36 H4096 I6144 A16/4 tp1"
    layers = int(next(w[1:] for w in shard.model.split() if w[0] == "L" and w[1:].isdigit()))
    hidden = int(next(w[1:] for w in shard.model.split() if w[0] == "H" and w[1:].isdigit()))
    pts = []
    for f in a.real:
        mine = forward_all_reduce_points(load(f), shard, layers, hidden, prefill_from=a.prefill_from)
        lat, bw = fit(mine, "all_reduce", a.gpus)
        print(f"{f}: {len(mine)} points, latency {lat:.1f} us, bus bandwidth {bw:.0f} GB/s")
        pts += mine
    for nbytes, us in sorted(pts):
        print(f"  {nbytes / 2**20:8.3f} MiB  {us:7.1f} us")
    lat, bw = fit(pts, "all_reduce", a.gpus)
    print(f"all: latency {lat:.1f} us, bus bandwidth {bw:.0f} GB/s (layers {layers}, hidden {hidden})")


if __name__ == "__main__":
    main()
