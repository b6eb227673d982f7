"""Quick ZeroDP checks against a running server pair (used by scripts/gpu_zerodp_smoke.sh).

1. The same token-id prompts, greedy, on the zerodp server's source (routed_dp_rank 0), its sink
   (routed_dp_rank 1) and a vanilla SGLang server: output tokens must match, logprobs within bf16.
2. A burst of concurrent requests of mixed lengths on the zerodp server (exercises decode graphs
   of several batch sizes and chunked prefill on both replicas): all must succeed.

    python scripts/zerodp_smoke_client.py --ours http://127.0.0.1:30000 --vanilla http://127.0.0.1:30100
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import random
import time

import requests


def generate(url: str, ids: list[int], max_new: int, dp_rank: int | None = None) -> dict:
    body = {
        "input_ids": ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True},
        "return_logprob": True,
    }
    if dp_rank is not None:
        body["routed_dp_rank"] = dp_rank
    r = requests.post(url + "/generate", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def tokens_and_logprobs(out: dict) -> tuple[list[int], list[float]]:
    lp = out["meta_info"]["output_token_logprobs"]
    return [int(x[1]) for x in lp], [float(x[0]) for x in lp]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--vanilla", default=None)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--burst", type=int, default=96)
    ap.add_argument("--out", default="smoke.json")
    a = ap.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 4000) for _ in range(n)] for n in [16, 100, 700, 2500, 9000, 40][: a.prompts]]
    rows = []
    for i, p in enumerate(prompts):
        res = {"prompt_len": len(p)}
        src = tokens_and_logprobs(generate(a.ours, p, 24, 0))
        snk = tokens_and_logprobs(generate(a.ours, p, 24, 1))
        res["sink_vs_source_tokens_equal"] = src[0] == snk[0]
        res["sink_vs_source_max_logprob_diff"] = max(abs(x - y) for x, y in zip(src[1], snk[1]))
        if a.vanilla:
            van = tokens_and_logprobs(generate(a.vanilla, p, 24))
            res["sink_vs_vanilla_tokens_equal"] = snk[0] == van[0]
            res["source_vs_vanilla_tokens_equal"] = src[0] == van[0]
            res["sink_vs_vanilla_max_logprob_diff"] = max(abs(x - y) for x, y in zip(snk[1], van[1]))
        rows.append(res)
        print(json.dumps(res), flush=True)
    t0 = time.time()
    lens = [rng.choice([50, 300, 1200, 4000, 12000]) for _ in range(a.burst)]
    with cf.ThreadPoolExecutor(a.burst) as ex:
        futs = [ex.submit(generate, a.ours, [rng.randrange(100, 4000) for _ in range(n)], rng.choice([8, 64, 200])) for n in lens]
        outs = [f.result() for f in futs]
    burst = {"requests": len(outs), "ok": sum(1 for o in outs if o["meta_info"]["completion_tokens"] > 0), "seconds": time.time() - t0}
    print(json.dumps({"burst": burst}), flush=True)
    with open(a.out, "w") as f:
        json.dump({"exactness": rows, "burst": burst}, f, indent=1)


if __name__ == "__main__":
    main()
