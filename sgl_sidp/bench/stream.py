"""How many streamed tokens a second the bench client (`bench.client.stream_request`) takes in from a stand-in for
SGLang's streamed `/generate`, whose chunks carry the whole output so far (SGLang's default) or only the new token
(`--incremental-streaming-output`). CPU only: the stand-in runs in a process of its own, as a server would.

Why: on `q8_decode2_2gpu_h200` (Qwen3-8B, 256 x (1,024 in, 512 out), 2 x H200) the servers stepped 256 rows in
14-17 ms while the clients saw 23.6-26.8 ms a token (about 11K tokens/s delivered), where `plan calibrate`'s stream
probe, 128 output tokens a request, had delivered 24-33K. A chunk of SGLang's default stream holds every token so
far, so a request's bytes grow with the square of its output and the delivered rate falls as outputs grow. This
tool times the client's side of that alone; a rate far above a run's says the server's side bounded the run.

    python -m sgl_sidp.bench.stream --streams 256 --output-len 128 512
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time

#: the token text of the stand-in (SGLang's detokenized text of random ids is a few characters a token)
TOKEN_TEXT = " tok"


def chunk(k: int, cumulative: bool, prompt_tokens: int = 1024) -> bytes:
    """The SSE line of SGLang 0.5.17's streamed `/generate` that brings token `k` (1-based): the text and output ids so
    far with `cumulative` (SGLang's default), else token `k`'s alone (`--incremental-streaming-output`), and the
    `meta_info` counters the client reads (`completion_tokens`)."""
    first = 1 if cumulative else k
    body = {"text": TOKEN_TEXT * (k - first + 1), "output_ids": list(range(first, k + 1)),
            "meta_info": {"id": "stream", "finish_reason": None, "prompt_tokens": prompt_tokens,
                          "completion_tokens": k, "cached_tokens": 0}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _serve(port: int, output_len: int, cumulative: bool, ready) -> None:
    """The stand-in server (a child process): every POST /generate streams `output_len` chunks as fast as it can."""
    from aiohttp import web

    async def generate(request):
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for k in range(1, output_len + 1):
            await resp.write(chunk(k, cumulative))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def start():
        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(start())


def measure(streams: int, output_len: int, cumulative: bool, timeout_s: float = 120.0) -> dict:
    """Send `streams` streamed requests at once to a fresh stand-in that answers each with `output_len` tokens, and
    time them from the first POST to the last `[DONE]`.

    Returns:
        {"streams", "output_len", "cumulative", "tokens" (the client counted), "seconds", "tokens_per_s",
        "failed" (requests that failed)}.

    Raises:
        ValueError: `streams` or `output_len` below 1.
        RuntimeError: the stand-in did not start within 30 s.
    """
    from sgl_sidp.bench.batches import free_port
    from sgl_sidp.bench.client import make_session, stream_request

    if streams < 1 or output_len < 1:
        raise ValueError(f"streams {streams} and output_len {output_len}: each must be at least 1")
    ctx = multiprocessing.get_context("spawn")
    ready, port = ctx.Event(), free_port()
    server = ctx.Process(target=_serve, args=(port, output_len, cumulative, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the stand-in server did not start within 30 s")
        payload = json.dumps({"input_ids": [1] * 8, "sampling_params": {"max_new_tokens": output_len},
                              "stream": True}).encode()

        async def run():
            async with make_session() as session:
                url = f"http://127.0.0.1:{port}/generate"
                t0 = time.perf_counter()
                outs = await asyncio.gather(*(stream_request(session, "sglang", url, payload, 8, timeout_s)
                                              for _ in range(streams)))
                return outs, time.perf_counter() - t0

        outs, seconds = asyncio.run(run())
    finally:
        server.terminate()
        server.join(10)
    tokens = sum(len(o.itl) + 1 for o in outs if o.success)
    return {"streams": streams, "output_len": output_len, "cumulative": cumulative, "tokens": tokens,
            "seconds": seconds, "tokens_per_s": tokens / seconds, "failed": sum(not o.success for o in outs)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sgl_sidp.bench.stream", description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=256, help="requests streamed at once (default: %(default)s)")
    ap.add_argument("--output-len", type=int, nargs="+", default=[128, 512],
                    help="output tokens a request, one measurement each (default: 128 512)")
    a = ap.parse_args(argv)
    if a.streams < 1 or min(a.output_len) < 1:
        ap.error(f"--streams {a.streams} and --output-len {' '.join(map(str, a.output_len))}: each at least 1")
    print("| output tokens a request | chunks | streams | tokens/s the client took in | failed |")
    print("|---:|---|---:|---:|---:|")
    for n in a.output_len:
        for cumulative in (True, False):
            r = measure(a.streams, n, cumulative)
            kind = "whole output so far (SGLang's default)" if cumulative else "new token only (incremental)"
            print(f"| {n:,} | {kind} | {a.streams} | {r['tokens_per_s']:,.0f} | {r['failed']} |")


if __name__ == "__main__":
    main()
