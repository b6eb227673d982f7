"""What a simple model of the decode step predicts for SiDP at d = 2, before any run: offline output tokens/s per
GPU of vanilla DP, SiDP WaS and SiDP CaS, from a start-up calibration and the model's config.json.

Offline job: every sequence has a prompt of P tokens and O output tokens (S = P + O); the queue never drains, so
each rank decodes as many sequences as its KV cache holds, at an average context of P + O/2. Per rank:

- vanilla DP: the calibrated decode step (`Calibration.decode_step_ms`) at that batch.
- SiDP WaS: `KVModel` (the ZeroDP capacity model): KV grows by the freed FFN layers less the slots; the step is the
  longer of the forward (plus the copies' slowdown) and streaming d-1 of every d layers at the in-forward copy rate.
- SiDP CaS (not built; an estimate): attention on the rank's own rows, each FFN layer on its owner for both ranks'
  rows: the vanilla step at twice the batch and the short context, plus the rank's own KV reads, plus
  `--comm-us` per layer for shipping rows to the owner and back.
- Prefill at `--prefill-tok-s` on every variant (WaS copies hide behind an 8K-token chunk; CaS moves the same FLOPs).

Output tokens/s per GPU = O / (P / prefill rate + O * step / batch). Prints a markdown table; numbers are a model.
Usage: python scripts/sidp_predict.py CALIBRATION.json --model-config config.json --vanilla-kv 264513 [...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sgl_sidp.calibration.cost import KVModel
from sgl_sidp.calibration.table import Calibration


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("calibration", help="a start-up calibration cache entry (scripts/gpu_calibrate_model.sh)")
    ap.add_argument("--model-config", required=True, help="the model's config.json (layers, hidden sizes, KV heads)")
    ap.add_argument("--vanilla-kv", type=int, nargs="+", required=True, help="SGLang's max_total_num_tokens per budget")
    ap.add_argument("--budget-names", nargs="+", default=None,
                    help="a name per --vanilla-kv value, for the table (default: budget 0, budget 1, ...)")
    ap.add_argument("--d", type=int, default=2, help="DP replicas sharing the FFN layers (default: %(default)s)")
    ap.add_argument("--copy-gbps", type=float, default=390.0, help="idle peer copy rate (GB/s; ZeroDP measured 386-396)")
    ap.add_argument("--prefill-tok-s", type=float, default=9200.0,
                    help="prefill rate of every variant, tokens/s (default: %(default)s)")
    ap.add_argument("--comm-us", type=float, default=40.0, help="CaS: per layer, rows to the owner and back (us)")
    ap.add_argument("--jobs", default="768+256,1536+512,3584+512",
                    help="offline jobs, comma-separated: P prompt + O output tokens, S = P + O (default: %(default)s)")
    a = ap.parse_args(argv)
    entry = json.loads(Path(a.calibration).read_text())
    cal = Calibration.from_entry(entry)
    hf = json.loads(Path(a.model_config).read_text())
    L, H, I = hf["num_hidden_layers"], hf["hidden_size"], hf["intermediate_size"]
    kvh, hd = hf["num_key_value_heads"], hf.get("head_dim") or H // hf["num_attention_heads"]
    kv_tok = L * 2 * kvh * hd * 2
    layer_bytes = 3 * H * I * 2
    streamed = L - L // a.d
    slots = max(2, a.d - 1)
    names = a.budget_names or [f"budget {i}" for i in range(len(a.vanilla_kv))]
    print(f"model L{L} H{H} I{I}: FFN layer {layer_bytes / 1e9:.3f} GB, KV {kv_tok / 1e3:.0f} KB/token; d={a.d}: "
          f"{streamed} layers streamed ({streamed * layer_bytes / 1e9:.1f} GB per forward), {slots} slots\n")
    print("| budget | S (P+O) | variant | KV tokens | batch | step ms | out tok/s/GPU | vs DP2 |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name, vkv in zip(names, a.vanilla_kv):
        for job in a.jobs.split(","):
            P, O = (int(x) for x in job.split("+"))
            ctx = P + O // 2
            model = KVModel(vkv * kv_tok, kv_tok, ctx, cal, n_slots=slots)
            rows = []
            b0 = model.batch(0)
            rows.append(("vanilla DP2", vkv, b0, cal.decode_step_ms(b0, ctx, kv_tok)))
            b, step, _ = model.tokens_per_s(streamed, layer_bytes, a.copy_gbps)
            extra_tok = (streamed - slots) * layer_bytes / kv_tok
            rows.append(("SiDP WaS", vkv + extra_tok, b, step))
            short = min(cal.decode_context.values() or [0])
            cas = (cal.decode_step_ms(2 * b, short, kv_tok) + cal.decode_step_ms(b, ctx, kv_tok)
                   - cal.decode_step_ms(b, short, kv_tok) + L * a.comm_us / 1e3)
            rows.append(("SiDP CaS (est.)", vkv + extra_tok, b, cas))
            base = None
            for variant, kv, bb, st in rows:
                tps = O / (P / a.prefill_tok_s + O * st / 1e3 / bb)
                base = base or tps
                print(f"| {name} | {P + O} ({P}+{O}) | {variant} | {kv:,.0f} | {bb:.0f} | {st:.1f} | {tps:,.0f} | "
                      f"{tps / base:.2f}x |")


if __name__ == "__main__":
    main()
