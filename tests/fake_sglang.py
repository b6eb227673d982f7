"""A stand-in for `python -m sglang.launch_server` and `python -m sgl_sidp.launch_server` on CPU (loopback only), for
the tests of `sgl_sidp.bench.compare`: it reads the flags that pick a configuration, prints SGLang-like start-up lines
("max_total_num_tokens=" per DP rank, "The server is fired up"), answers /health, /generate (streamed and not, with
logprobs and `routed_dp_rank`), /v1/loads, /server_info, /metrics (per-rank token counters) and /start_profile (one
small per-stage Chrome trace per TP rank of each DP rank, named as SGLang names them, written 0.3 s later).

Its answers are a function of the prompt alone, so every configuration is "exact", except where
`$FAKE_DIFFERS` names the configuration's overlay mode: then prompts of 2,000 tokens or more get their 4th token
changed (logprobs before it shifted by 0.002). A model whose config.json names a Gemma architecture is refused by
`--overlay-mode sidp` with one `sgl-sidp: error:` line (exit 2), as the real launcher refuses an architecture.
KV tokens: 1,000 x TP per DP rank, 3,000 x TP on the sinks of `--overlay-mode zerodp`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> None:
    from aiohttp import web

    p = argparse.ArgumentParser()
    for flag, kind in (("--port", int), ("--tp-size", int), ("--dp-size", int), ("--model-path", str),
                       ("--overlay-mode", str), ("--host", str)):
        p.add_argument(flag, type=kind, default=None)
    a, _ = p.parse_known_args(argv)
    dp, tp = a.dp_size or 1, a.tp_size or 1
    if "--enable-dp-attention" in argv:  # one KV pool per DP rank, attention TP 1
        tp = 1
    arch = json.loads((Path(a.model_path) / "config.json").read_text()).get("architectures", [""])[0]
    if a.overlay_mode == "sidp" and arch.startswith("Gemma"):
        print(f"sgl-sidp: error: --overlay-mode sidp supports LlamaForCausalLM, not {arch}", flush=True)
        sys.exit(2)
    caps = [(3000 if (a.overlay_mode == "zerodp" and r) else 1000) * tp for r in range(dp)]
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    for r, c in enumerate(caps):
        print(f"[{ts} DP{r} TP0] max_total_num_tokens={c}, chunked_prefill_size=8192", flush=True)
    differs = a.overlay_mode is not None and a.overlay_mode in os.environ.get("FAKE_DIFFERS", "").split(",")
    counters = {(r, m): 0 for r in range(dp) for m in ("decode", "prefill_compute")}
    state = {"next": 0}

    def answer(ids, n):
        out = [(sum(ids) + i) % 1000 + 10 for i in range(n)]
        lps = [-0.1 * (i + 1) for i in range(n)]
        if differs and len(ids) >= 2000 and n > 3:
            out[3] += 1
            lps = [x + 0.002 for x in lps]
        return out, lps

    async def generate(request):
        body = await request.json()
        ids, n = body["input_ids"], body["sampling_params"]["max_new_tokens"]
        rank = body.get("routed_dp_rank")
        if rank is None:
            state["next"] += 1
            rank = state["next"] % dp
        counters[(rank, "prefill_compute")] += len(ids)
        counters[(rank, "decode")] += n - 1
        out, lps = answer(ids, n)
        if not body.get("stream"):
            return web.json_response({"text": "", "output_ids": out, "meta_info": {
                "id": "r", "dp_rank": rank, "completion_tokens": n,
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, out)]}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for done in range(1, n + 1):
            await asyncio.sleep(0.001)
            chunk = {"text": "x" * done, "output_ids": out[:done], "meta_info": {
                "id": "r", "dp_rank": rank, "prompt_tokens": len(ids), "completion_tokens": done, "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": n} if done == n else None}}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def metrics(request):
        lines = ["# TYPE sglang:realtime_tokens_total counter"]
        lines += [f'sglang:realtime_tokens_total{{dp_rank="{r}",mode="{m}",tp_rank="0"}} {float(v)}'
                  for (r, m), v in counters.items()]
        return web.Response(text="\n".join(lines) + "\n")

    async def start_profile(request):
        body = await request.json()
        folder, pid, steps = Path(body["output_dir"]), body["profile_id"], body["num_steps"]

        def write():
            import gzip
            time.sleep(0.3)
            for r in range(dp):
                for t in range(tp):
                    for stage, ms in (("EXTEND", 10.0), ("DECODE", 2.0)):
                        events = [{"ph": "X", "cat": "kernel", "name": name, "ts": 1000.0 * k * ms, "dur": 1000.0 * ms * f}
                                  for k in range(steps) for name, f in (("nvjet_gemm", 0.6), ("ncclAllReduce", 0.2))]
                        rank = f"TP-{t}" + (f"-DP-{r}" if dp > 1 else "")
                        with gzip.open(folder / f"{pid}-{rank}-{stage}.trace.json.gz", "wt") as f:
                            json.dump({"traceEvents": events}, f)

        folder.mkdir(parents=True, exist_ok=True)
        asyncio.get_running_loop().run_in_executor(None, write)
        return web.Response(text="Start profiling.\n")

    async def fired_up(app):
        print("The server is fired up and ready to roll!", flush=True)

    app = web.Application()
    app.on_startup.append(fired_up)
    app.router.add_get("/health", lambda r: web.Response(text="ok"))
    app.router.add_post("/generate", generate)
    app.router.add_post("/flush_cache", lambda r: web.Response(text="ok"))
    app.router.add_post("/freeze_gc", lambda r: web.Response(text="Garbage collection frozen.\n"))
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/loads", lambda r: web.json_response(
        {"loads": [{"dp_rank": i, "max_total_num_tokens": c} for i, c in enumerate(caps)]}))
    app.router.add_post("/start_profile", start_profile)
    app.router.add_get("/server_info", lambda r: web.json_response(
        {"max_total_num_tokens": caps[0], "chunked_prefill_size": 8192}))
    web.run_app(app, host=a.host or "127.0.0.1", port=a.port, print=None, shutdown_timeout=1)


if __name__ == "__main__":
    main(sys.argv[1:])
