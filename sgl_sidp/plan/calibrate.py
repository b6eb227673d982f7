"""`python -m sgl_sidp.plan calibrate`: time every shard a model's configurations need, on the GPUs at hand.

For each shard not calibrated yet, SGLang serves the model with the shard's sizes (`Shard.override_args` as
`--json-model-override-args`, `--load-format dummy`) through our launcher with `--overlay-calibrate`, which measures the
forwards once SGLang captured its CUDA graphs (decode steps at batches 1-256 and two contexts, one-request prefills;
`sgl_sidp.calibration.measure`) and caches them under the shard's signature; then a few requests over HTTP add
what a request spends outside forwards (`record_request_overhead`), prefills over a cached prefix
(`record_prefix_prefills`), the scheduler's host time per request of a served step (`record_serving_step`) and the
rate at which the tokenizer manager streams tokens at two output lengths (`record_stream_rate`,
`record_stream_length`), and the server is stopped. One shard on a
GPU at a time, so nothing else runs there while it is timed; the next shard's server does SGLang's CPU start-up
meanwhile and waits for the GPU (`serve_calibrations`, `--overlay-start-after`). On a host of several GPUs the shards
are shared out and each GPU times its own at the same time (`split_jobs`): a shard is one GPU's work, whatever node
it is planned for, so a 2-GPU host also times the shards of 4- and 8-GPU configurations. The servers capture only
the CUDA graphs the calibration times (`timed_graph_flags`) unless asked not to, and find the CUDA kernels SGLang
compiles on first use built already: a process without a GPU builds them all at once while the first server starts
(`jit_prebuild`).

A shard whose weights do not fit this GPU (Llama-3.1-70B's full model on one H200) is served twice with fewer decoder
layers (the largest of L/2, L/4, ... that fits, and half that) and each timed point is extrapolated linearly in the
layer count to L (`extrapolate_layers`): a forward is its layers one after another plus what does not repeat
(embedding, lm_head, the host's work), so two layer counts give both parts. The entry written for L says so in its
`source`.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from sgl_sidp.calibration.cache import CalibrationCache, CalibrationKey, default_cache_dir
from sgl_sidp.calibration.gate import reached
from sgl_sidp.calibration.memory import GIB, ModelShapes, default_mem_fraction_static, free_before_load
from sgl_sidp.calibration.table import BUDGET_SKIPPED, Calibration
from sgl_sidp.model_info import DEFAULT_MODEL_DIR, read_hf_config
from sgl_sidp.plan import jit_prebuild
from sgl_sidp.plan.configs import Shard, configurations
from sgl_sidp.plan.steps import find_calibration, shard_config, shard_roles, shard_signature

#: what the launcher needs on the lent GPU hosts (the wheelhouse has no FlashInfer or FA3)
SERVER_ARGS = ("--attention-backend", "triton", "--sampling-backend", "pytorch")


def shards_needed(hf: dict, n_gpus: int | Sequence[int]) -> dict[str, Shard]:
    """Signature -> shard of every configuration on `n_gpus` GPUs, or on each of several node sizes (each shard
    once)."""
    shapes = ModelShapes.of(hf)
    out = {}
    sizes = [n_gpus] if isinstance(n_gpus, int) else list(n_gpus)
    for c in (c for n in sizes for c in configurations(shapes, n)):
        for shard in shard_roles(c, shapes).values():
            out.setdefault(shard_signature(hf, shard), shard)
    return out


#: KV room a shard's server needs beside its weights for the calibration's decode points (batch 256 at 2,048 tokens of
#: context holds 512K tokens: 4 GiB at Llama-3.1-70B's 320 KiB per token is enough for the points that own their KV)
CALIBRATION_KV_BYTES = 4 * GIB


#: architectures whose SGLang 0.5.17 class computes head_dim as hidden_size / num_attention_heads, ignoring the
#: config's head_dim (`sglang/srt/models/mixtral.py`, `MixtralAttention.__init__`): a TP shard, fewer heads at the same
#: hidden size, would build a KV pool of one head size and attention of another, so one GPU cannot serve it
HEAD_DIM_FROM_HIDDEN = frozenset({"MixtralForCausalLM"})


def unservable(hf: dict, shard: Shard) -> str | None:
    """Why one GPU cannot serve `shard` of `hf` with `--json-model-override-args` (None: it can)."""
    arch = (hf.get("architectures") or [""])[0]
    shapes = ModelShapes.of(hf)
    if arch in HEAD_DIM_FROM_HIDDEN and shard.heads != shapes.heads:
        return (f"SGLang's {arch} derives head_dim from hidden_size / heads, so a shard of {shard.heads} of its "
                f"{shapes.heads} heads cannot be served on one GPU")
    return None


def layers_that_fit(hf: dict, shard: Shard, gpu_bytes: int | None) -> int:
    """How many of `shard`'s decoder layers one GPU of `gpu_bytes` bytes can serve for calibration: all of them when
    its weights and `CALIBRATION_KV_BYTES` fit under SGLang's default `--mem-fraction-static` for that GPU
    (`memory.default_mem_fraction_static`, `memory.free_before_load`), else the largest L/2^k that does (1 at least);
    all when `gpu_bytes` is None (not known)."""
    shapes = ModelShapes.of(hf)
    layers = shapes.layers
    if gpu_bytes is None:
        return layers
    room = free_before_load(gpu_bytes) * default_mem_fraction_static(gpu_bytes / 2**20) - CALIBRATION_KV_BYTES
    n = layers
    while n > 1 and ModelShapes.of(shard_config(hf, shard, num_hidden_layers=n)).weight_bytes() > room:
        n //= 2
    return n


def extrapolate_layers(near: Calibration, far: Calibration, near_layers: int, far_layers: int, layers: int,
                       model: str) -> Calibration:
    """The calibration of `layers` decoder layers from two measured at `near_layers` < `far_layers` (same shard
    otherwise): every point present in both (prefills over a prefix: the same new and prefix tokens) is extended along
    the line through them,
    t(L) = t_far + (t_far - t_near) * (L - far_layers) / (far_layers - near_layers) ms, and never below t_far (more
    layers are never faster). Contexts, the KV read rate and copy rates are the far one's.

    Checked on Qwen3-8B on one H200 (`benchmarks/results/plan/calibrate_h200_2026-11-24/`): L36 from L9 and L18
    against L36 measured, decode steps within 3.1 % (batch 1-256, contexts 256 and 2,048), prefills of 2,048 to 8,192
    tokens within 2.8 %, but prefills of 16 to 512 tokens 11-63 % short (SGLang ran them host-bound at 4.3-4.4 ms at
    L9 and L18 but 12.3-14.3 ms at L36).

    Raises:
        ValueError: `near_layers` is not below `far_layers`.
    """
    if not near_layers < far_layers:
        raise ValueError(f"need two layer counts, the first below the second, got {near_layers} and {far_layers}")
    k = (layers - far_layers) / (far_layers - near_layers)

    def line(a: dict, b: dict) -> dict:
        return {x: max(b[x], b[x] + (b[x] - a[x]) * k) for x in sorted(set(a) & set(b))}

    return dataclasses.replace(
        far, model=model, decode_ms=line(near.decode_ms, far.decode_ms), prefill_ms=line(near.prefill_ms, far.prefill_ms),
        decode_ms_long=line(near.decode_ms_long, far.decode_ms_long),
        decode_ms_alone=line(near.decode_ms_alone, far.decode_ms_alone),
        decode_ms_eager=line(near.decode_ms_eager, far.decode_ms_eager),
        prefill_prefix_ms=tuple((n, p, ms) for (n, p), ms in line(*({(n, p): ms for n, p, ms in c.prefill_prefix_ms}
                                                                    for c in (near, far))).items()),
        prefill_multi_ms=tuple((k, n, ms) for (k, n), ms in line(*({(k, n): ms for k, n, ms in c.prefill_multi_ms}
                                                                   for c in (near, far))).items()),
        decode_context={b: c for b, c in far.decode_context.items() if b in near.decode_ms},
        measure_s=near.measure_s + far.measure_s,
        source=f"extrapolated linearly in the layer count to {layers} layers from servers of {near_layers} and "
               f"{far_layers} layers (the whole shard does not fit one GPU); {far.source}")


#: prompt lengths whose client TTFT, less the calibrated prefill of the same length, is a request's time outside
#: forwards
OVERHEAD_PROMPTS = (512, 2048)


def record_request_overhead(srv, entry: Path, repeats: int = 3) -> str:
    """Once `srv` serves: what a request spends outside forwards before its first token (HTTP server, tokenizer
    manager, scheduler, detokenizer): the median over `repeats` distinct prompts of each `OVERHEAD_PROMPTS` length,
    each sent alone with one output token, of the client TTFT less the calibrated prefill of that length. Written into
    the cache entry `entry` as "request_overhead_ms" (with the TTFTs it comes from)."""
    import numpy as np

    from sgl_sidp.bench.batches import prompts, run_batch

    data = json.loads(entry.read_text())
    prefill = {int(k): v for k, v in data["calibration"]["prefill_ms"].items()}
    srv.wait_ready()
    run_batch(srv.base_url, [(prompts(1, 64, 1)[0], 1, None)])  # warm-up
    ttft, over = {}, []
    for t in (t for t in OVERHEAD_PROMPTS if t in prefill):
        ttft[t] = [o.ttft * 1e3 for ids in prompts(repeats, t, t + 3) for o in run_batch(srv.base_url, [(ids, 1, None)])[0]
                   if o.success]
        over += [v - prefill[t] for v in ttft[t]]
    if not over:
        return "request overhead not measured (no calibrated prefill of those lengths, or every request failed)"
    data["request_overhead_ms"] = {"median_ms": float(np.median(over)), "client_ttft_ms": ttft}
    entry.write_text(json.dumps(data, indent=1))
    return f"request overhead {np.median(over):.1f} ms"


#: (new tokens, prefix tokens) of the prefills over a cached prefix that `record_prefix_prefills` times: Mooncake's
#: conversations prefill a few thousand new tokens over up to ~30,000 cached ones, and a prompt longer than the chunk
#: prefills its later chunks over its first (DP attention's 4,096-token chunks). k grows with the prefix
#: (`ShardClock.prefix_line`: about 1.0 at 4,096, 1.2 at 8,192, 1.7 at 16,384), so the probes span 4,096-16,384. In
#: this order each of the first four extends the prompt of the one before it, so the server prefills no prefix of its
#: own after the first 4,096 tokens (the three prefixes of their own sent before 2026-11-25, 8,192, 16,384 and 8,192
#: tokens, were about 4.7 s of a Llama-3.1-70B TP2 shard's prefills on one H200, a 8,192-token prefill taking 1.05 s)
PREFIX_PROBES = ((4096, 4096), (2048, 8192), (6144, 10240), (2048, 16384), (8192, 8192))


def record_prefix_prefills(srv, entry: Path, probes: Sequence[tuple[int, int]] = PREFIX_PROBES) -> str:
    """Once `srv` serves and `record_request_overhead` wrote the request overhead into the cache entry `entry`: for
    each (new, prefix) of `probes` in turn, a request of `prefix` cached tokens and `new` more (one output token),
    whose client TTFT less the request overhead is the prefill of the tokens not cached over those cached
    (`meta_info.cached_tokens`; a probe counts where that is at least 90 % of the prefix). Every prompt starts with
    the same tokens, so SGLang's radix cache holds a probe's prefix where an earlier request sent it: a probe whose
    prefix is all the tokens sent so far extends them; one whose prefix is shorter than that adds `new` tokens of its
    own after it; one whose prefix is longer is preceded by a request of its prefix (one output token; not timed).
    Written into the entry's calibration as `prefill_prefix_ms` (see `Calibration`), the TTFTs and cached tokens
    beside it as "prefix_prefills"."""
    from sgl_sidp.bench.batches import prompts, run_batch

    data = json.loads(entry.read_text())
    overhead = data.get("request_overhead_ms", {}).get("median_ms")
    if overhead is None:
        return "prefix prefills not measured (no request overhead to take off)"
    base = prompts(1, max(p + n for n, p in probes), 1000)[0]
    rows, raw, sent = [], [], 0  # sent: how many of `base`'s first tokens the server has seen
    for i, (new, prefix) in enumerate(probes):
        warm = None
        if prefix > sent:
            warm = run_batch(srv.base_url, [(base[:prefix], 1, None)])[0][0]
            sent = prefix
        if prefix == sent:
            ids, sent = base[:prefix + new], prefix + new
        else:
            ids = base[:prefix] + prompts(1, new, 1001 + i)[0]
        out = run_batch(srv.base_url, [(ids, 1, None)])[0][0]
        cached = out.cached_tokens or 0
        raw.append({"new": new, "prefix": prefix, "client_ttft_ms": round(out.ttft * 1e3, 3), "cached_tokens": cached,
                    "error": (warm and warm.error) or out.error or None})
        if (warm is None or warm.success) and out.success and cached >= 0.9 * prefix:
            rows.append((len(ids) - cached, cached, round(out.ttft * 1e3 - overhead, 3)))
    data["calibration"]["prefill_prefix_ms"] = rows
    data["prefix_prefills"] = {"request_overhead_ms": overhead, "probes": raw}
    entry.write_text(json.dumps(data, indent=1))
    return f"{len(rows)} of {len(probes)} prefills over a cached prefix"


#: (running requests, prompt tokens, output tokens at least) of `record_serving_step`'s burst: past SGLang's largest
#: decode graph below TP4 (256), so its steps run eagerly, as the calibration's eager points do
SERVING_PROBE = (512, 16, 64)

#: seconds the serving-step probe's requests decode at least (more output tokens where the eager step is short), so
#: that they decode all together for a few seconds after the last one's prefill: the requests reach the server over
#: 1-2 s (on a Llama-3.1-70B TP2 shard on one H200, 23 of 128 steps of 61 ms went by before all 512 decoded)
SERVING_PROBE_DECODE_S = 4.0

#: how many times the output tokens a second burst of the serving-step or stream probe decodes, when the first one's
#: requests never all decoded together long enough (on a fresh H200 host, a Qwen3-30B-A3B TP2 shard's 512 requests
#: took about 4 s to arrive while two more servers started beside it)
BURST_RETRY = 3


def all_running_window(times) -> tuple[float, float]:
    """(from, to) s: from the last request's first token to the first request's last one, while every request of a
    burst decodes and none prefills; `times` are the requests' token arrival times (`metrics.token_times`). Empty
    (to <= from) when the last request's first token came after the first request's last one."""
    return max(float(t[0]) for t in times), min(float(t[-1]) for t in times)


def all_running_gaps(outs) -> list[float]:
    """The gaps (s) between output tokens of the streamed `outs` (`bench.batches` outputs, `metrics.token_times`)
    that lie in their `all_running_window`."""
    from sgl_sidp.bench.metrics import token_times

    times = [token_times(o) for o in outs]
    lo, hi = all_running_window(times)
    return [float(b - a) for t in times for a, b in zip(t[:-1], t[1:]) if a >= lo and b <= hi]


def record_serving_step(srv, entry: Path, probe: tuple[int, int, int] = SERVING_PROBE) -> str:
    """Once `srv` serves: what the scheduler spends per running request per decode step outside the forward. A burst
    of `probe`'s requests, sent at once, decodes together; the median gap between output tokens while all of them
    decode (`all_running_gaps`: SGLang admits them over several prefills as they arrive) is the served step, and
    its excess over the
    calibration's eager forward at that batch (`ShardClock.eager_ms`, timed back to back), divided by the batch, is
    `Calibration.host_ms_per_request` (at least 0), written into the cache entry `entry` with the gaps it comes from
    as "serving_step". The requests decode `SERVING_PROBE_DECODE_S` at least; where they never all decoded together
    (they arrived too slowly), a second burst decodes `BURST_RETRY` times as many tokens. Not measured
    without eager points or where a request fails. (A server that runs fewer than
    `probe`'s requests at once, `--max-running-requests`, times a smaller batch than it divides by.)"""
    import numpy as np

    from sgl_sidp.bench.batches import prompts, run_batch
    from sgl_sidp.plan.steps import ShardClock

    batch, prompt, output = probe
    data = json.loads(entry.read_text())
    cal = Calibration.from_entry(data)
    eager = ShardClock(cal, 0).eager_ms(batch)
    if not eager:
        return "serving step not measured (no eager points)"
    output = max(output, math.ceil(SERVING_PROBE_DECODE_S * 1e3 / eager))  # a fast shard decodes longer
    for burst in (1, 2):
        outs = run_batch(srv.base_url, [(ids, output, None) for ids in prompts(batch, prompt, 2000 + burst)])[0]
        if not all(o.success and len(o.itl) >= 4 for o in outs):
            return "serving step not measured (a request failed or streamed too few tokens)"
        gaps = all_running_gaps(outs)
        if len(gaps) >= batch:
            break
        output *= BURST_RETRY
    else:
        return "serving step not measured (the requests never all decoded together, in two bursts)"
    step = float(np.median(gaps)) * 1e3
    data["calibration"]["host_ms_per_request"] = max(0.0, (step - eager) / batch)
    data["serving_step"] = {"batch": batch, "prompt": prompt, "output": output, "step_ms_median": step,
                            "eager_forward_ms": eager, "gaps": len(gaps), "bursts": burst}
    entry.write_text(json.dumps(data, indent=1))
    return (f"served step at batch {batch} {step:.1f} ms against an eager forward of {eager:.1f} ms"
            + (f" (a second burst of {output} tokens: the first one's requests never all decoded together)"
               if burst > 1 else ""))


#: (requests, prompt tokens, output tokens) of `record_stream_rate`'s burst: they decode in SGLang's largest decode
#: graph below TP4, about 25,000 tokens/s on an H200 for a Qwen3-8B shard
STREAM_PROBE = (256, 16, 128)

#: output tokens a request of the stream probe streams on average while every request decodes, at least; fewer, and a
#: second burst decodes `BURST_RETRY` times as many tokens
STREAM_PROBE_WINDOW_TOKENS = 8


def streamed_window(srv, batch: int, prompt: int, output: int, seed: int) -> tuple[int, float, float, int, int] | str:
    """Send `batch` requests of `prompt` random tokens (seeded `seed` + the burst) and `output` output tokens at once
    to `srv` and count the tokens the client received while every one of them decoded (`all_running_window`). Where
    they streamed fewer than `STREAM_PROBE_WINDOW_TOKENS` each in that window (they arrived too slowly for their
    decode), a second burst decodes `BURST_RETRY` times as many tokens.

    Returns:
        (tokens, from s, to s, output tokens a request of the burst counted, bursts), or why nothing was counted.
    """
    from sgl_sidp.bench.batches import prompts, run_batch
    from sgl_sidp.bench.metrics import token_times

    for burst in (1, 2):
        outs = run_batch(srv.base_url, [(ids, output, None) for ids in prompts(batch, prompt, seed + burst)])[0]
        if not all(o.success and o.output_len == output for o in outs):
            return "a request failed or was cut short"
        times = [token_times(o) for o in outs]
        lo, hi = all_running_window(times)
        tokens = sum(int(((t > lo) & (t <= hi)).sum()) for t in times)
        if hi > lo and tokens >= STREAM_PROBE_WINDOW_TOKENS * batch:
            return tokens, lo, hi, output, burst
        output *= BURST_RETRY
    return "the requests never all decoded together long enough, in two bursts"


def record_stream_rate(srv, entry: Path, probe: tuple[int, int, int] = STREAM_PROBE) -> str:
    """Once `srv` serves: whether SGLang's tokenizer manager, one process whatever the DP replicas, streams the
    tokens as fast as the GPU samples them. A burst of `probe`'s requests sent at once; the tokens the client received
    while all of them decoded (`all_running_window`), over that time, is the delivered rate, and the GPU's is the
    batch over the calibrated decode step at that batch (`Calibration.decode_ms`); a second, longer burst where the
    first's requests never streamed together long enough (`streamed_window`). Where the delivered rate is below 80 %
    of the GPU's, the stream bounded it: written into the cache entry `entry` as "stream": {"tokens_per_s": ...}
    (`steps.stream_tokens_per_s`, `sim.deliver`); else "tokens_per_s" is None and the delivered rate a lower bound.
    (The client is one Python process: the rate it measures is the lesser of its own and the server's. Before
    2026-11-25 the window was the middle half of all arrivals, which took in the burst's ramp where the requests
    arrived over seconds.)"""
    data = json.loads(entry.read_text())
    got = stream_probe(srv, data, probe, 3000)
    if isinstance(got, str):
        return f"stream rate not measured ({got})"
    data["stream"] = got
    entry.write_text(json.dumps(data, indent=1))
    return (f"stream {got['delivered_tokens_per_s']:,.0f} tokens/s against the GPU's {got['gpu_tokens_per_s']:,.0f}"
            + (" (the stream bounds it)" if got["tokens_per_s"] else " (not bound)")
            + (f" (a second burst of {got['probe'][2]} tokens)" if got["bursts"] > 1 else ""))


def delivered_rate(srv, batch: int, prompt: int, output: int, seed: int) -> dict | str:
    """`streamed_window` of `batch` requests of (`prompt`, `output`) tokens as a rate: {"delivered_tokens_per_s",
    "probe" ([batch, prompt, the output of the burst counted]), "window_s", "bursts"}, or why nothing was counted."""
    got = streamed_window(srv, batch, prompt, output, seed)
    if isinstance(got, str):
        return got
    tokens, lo, hi, output, burst = got
    return {"delivered_tokens_per_s": tokens / (hi - lo), "probe": [batch, prompt, output], "window_s": hi - lo,
            "bursts": burst}


def stream_probe(srv, data: dict, probe: tuple[int, int, int], seed: int) -> dict | str:
    """One stream probe of `probe`'s (requests, prompt tokens, output tokens) against `srv`, whose cache entry is
    `data`: the delivered rate (`streamed_window`) against the GPU's, the batch over its calibrated decode step.

    Returns:
        {"tokens_per_s" (the delivered rate where below 80 % of the GPU's, the stream bounding it; else None),
        "delivered_tokens_per_s", "gpu_tokens_per_s", "probe" (the output of the burst counted), "window_s",
        "bursts"}, or why nothing was measured.
    """
    batch, prompt, output = probe
    step_ms = Calibration.from_entry(data).decode_ms.get(batch)
    if not step_ms:
        return f"no calibrated decode step at batch {batch}"
    got = delivered_rate(srv, batch, prompt, output, seed)
    if isinstance(got, str):
        return got
    delivered, gpu = got["delivered_tokens_per_s"], batch / (step_ms / 1e3)
    return {"tokens_per_s": delivered if delivered < 0.8 * gpu else None, **got, "gpu_tokens_per_s": gpu}


#: (requests, prompt tokens, output tokens) of `record_stream_length`'s burst: `STREAM_PROBE`'s requests with four
#: times its output (about 8 s of decode on an H200 for a Qwen3-8B shard, 35 s for Llama-3.1-70B's TP2). Built because
#: on 2 x H200 256 streams of 512 tokens were delivered at about 11-13K tokens/s where the probe's 128 went at 24-33K
#: (`q8_decode2_2gpu_h200`, `q8_decode2_alone_2gpu_h200`) and a stand-in of SGLang's whole-output chunks slowed so
#: (`bench.stream`); on one H200 host this probe then found no fall (15.6-20.6K tokens/s at 128 tokens a request,
#: 17.9-23.7K at 512: `benchmarks/results/plan_multi_gpu/h200/calibrate_q8_stream/`)
STREAM_PROBE_LONG = (256, 16, 512)


def record_stream_length(srv, entry: Path, probe: tuple[int, int, int] | None = None) -> str:
    """Once `srv` serves and `record_stream_rate` measured the stream: its rate at `probe`'s longer output, so that
    the planner's stream slows with the output so far (`steps.stream_rate_at`); the longer chunks may bound a stream
    the shorter did not. A burst sent at once (a second, longer one where the first's requests never streamed
    together long enough: `streamed_window`); the tokens the client received while every request decoded, over that
    time. Written into the cache entry `entry` as "stream"["long"], `stream_probe`'s record (its GPU rate taken at the
    calibrated decode step of the batch, whose context is shorter than these requests' later ones). `probe`: None for
    `STREAM_PROBE_LONG`."""
    data = json.loads(entry.read_text())
    if not (data.get("stream") or {}).get("delivered_tokens_per_s"):
        return "stream length not measured (the shorter probe measured no stream)"
    got = stream_probe(srv, data, probe or STREAM_PROBE_LONG, 3100)
    if isinstance(got, str):
        return f"stream length not measured ({got})"
    data["stream"]["long"] = got
    entry.write_text(json.dumps(data, indent=1))
    return (f"stream {got['delivered_tokens_per_s']:,.0f} tokens/s at {got['probe'][2]} tokens a request"
            + (" (the stream bounds it)" if got["tokens_per_s"] else " (not bound)"))


#: the HTTP probes a served shard runs, in order, once its calibration is cached
PROBES = (record_request_overhead, record_prefix_prefills, record_serving_step, record_stream_rate,
          record_stream_length)

#: the probes of the two layer counts a shard too big for the GPU is served at (`extrapolate_layers`), the fewer
#: first: only what the extrapolated entry reads, the prefills over a prefix of both (and the request overhead they
#: take off) and the host time per request of the second. (The request overhead and stream rate of a whole model's
#: shards are medians over that model's own shards' entries, `steps.request_overhead_ms`, which these are not.)
PART_PROBES = ((record_request_overhead, record_prefix_prefills),
               (record_request_overhead, record_prefix_prefills, record_serving_step))


#: seconds between two looks at the current server (its cache entry, its process, the waiting servers' gates)
POLL_S = 0.5


def serve_calibrations(model_path: str, jobs: Sequence[tuple], gpu_name: str, cache_dir: Path,
                       server: Callable, timeout_s: float, measure_overhead: bool = True,
                       ahead: int = 2, stop: threading.Event | None = None) -> dict[str, tuple[str, Path | None]]:
    """Serve `model_path` (dummy weights, our launcher with `--overlay-calibrate`) once per job (signature, SGLang
    flags, log file[, its HTTP probes: `PROBES` if not given]) whose calibration is not in `cache_dir` yet, one server
    on the GPU at a time: wait until the server cached its calibration (at most `timeout_s` s), run the job's probes
    (none when `measure_overhead` is False) and stop it. `server(args, log)` makes the `bench.server.ServerProcess`.

    The `ahead` jobs after the current one have their servers started already, each behind a gate
    (`--overlay-start-after FILE`, `calibration.gate`): they do SGLang's CPU start-up (about 25 s from the launcher's
    start to the scheduler's first GPU call on a warm H200 host, 55 s on a fresh one) while the current server is
    measured, and the next one takes GPU memory only once its FILE appears, which this function creates after the
    current server's processes are gone. Its `timeout_s` counts from then. The first of them starts with the first
    server, the others once the first server reached its gate (`gate.reached`: fewer CPU start-ups beside the first
    one, which is on the critical path). `ahead` 0: each server starts after the one before it stopped. (The waiting
    servers' CPU work runs beside the current one's timing: on a host of a few cores, use 0. Each waiting server past
    the first may hold a CUDA context, about 0.5 GB, while the current one sizes its KV pool.) `stop`: once set (another
    GPU's calibration failed, the process is stopping), every server of this call is stopped and RuntimeError raised.

    Returns: signature -> (what happened: "cached <file>", "measured in N s <file>[; probe results]" or
    "failed: ...", the cache entry or None).
    """
    results = {}
    todo = []
    for sig, flags, log, *probes in jobs:
        found = find_calibration(sig, gpu_name, [cache_dir])
        if found is not None:
            results[sig] = (f"cached {found[1]}", found[1])
        else:
            todo.append((sig, flags, log, probes[0] if probes else PROBES))
    base = ["--model-path", model_path, "--load-format", "dummy", "--tokenizer-path", str(DEFAULT_MODEL_DIR)]
    cache_dir.mkdir(parents=True, exist_ok=True)  # the gates live there before any entry is written (a fresh host)
    live, gates = [], []  # servers started and not stopped yet; gate files made
    waiting = collections.deque()  # (server, its gate file) of the jobs after the current one, in order

    def remove(gate: Path) -> None:
        """Remove a gate file and the file its server makes on reaching it."""
        for f in (gate, reached(gate)):
            f.unlink(missing_ok=True)

    def launch(k: int, now: bool):
        """Start job `k`'s server behind its gate file, made already if `now`."""
        gate = cache_dir / f".start-after-{os.getpid()}-{threading.get_ident()}-{k}"
        remove(gate)
        gates.append(gate)
        if now:
            gate.touch()
        srv = server([*base, *todo[k][1], "--overlay-calibrate", "--overlay-start-after", str(gate), *SERVER_ARGS],
                     todo[k][2])
        srv.start()
        live.append(srv)
        return srv, gate

    def top_up():
        """Start the next waiting servers: the first one at once, the others once the first server reached its gate or
        exited."""
        nonlocal launched
        while (launched < len(todo) and len(waiting) < ahead
               and (launched == 1 or reached(gates[0]).exists() or first.proc.poll() is not None)):
            waiting.append(launch(launched, False))
            launched += 1

    try:
        srv, t0, launched = (launch(0, True)[0] if todo else None), time.monotonic(), 1
        first = srv
        for sig, _, log, probes in todo:
            while True:
                if stop is not None and stop.is_set():
                    raise RuntimeError("stopped: the calibration on another GPU failed")
                top_up()
                found = find_calibration(sig, gpu_name, [cache_dir])
                if found is not None or srv.proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                    break
                time.sleep(POLL_S)
            if found is not None:
                what = f"measured in {time.monotonic() - t0:.0f} s {found[1]}"
                source = found[0].source
                if BUDGET_SKIPPED in source:  # what its start-up calibration's time budget left out
                    what += f" ({source[source.index(BUDGET_SKIPPED):]})"
                for probe in probes if measure_overhead else ():
                    what += f"; {probe(srv, found[1])}"
                    top_up()
                results[sig] = (what, found[1])
            else:
                results[sig] = (f"failed: the server {'exited' if srv.proc.poll() is not None else 'timed out'}; "
                                f"see {log}", None)
            srv.stop()
            live.remove(srv)
            if waiting:
                srv, gate = waiting.popleft()
                gate.touch()
                if hasattr(srv, "t_start"):
                    srv.t_start = time.time()  # its readiness clock (`wait_ready`) counts from the gate too
            elif launched < len(todo):
                srv, launched = launch(launched, True)[0], launched + 1
            t0 = time.monotonic()
    finally:
        for s in live:
            s.stop()
        for g in gates:
            remove(g)
    return results


def split_jobs(jobs: Sequence[tuple], n: int) -> list[list[tuple]]:
    """`jobs` shared out round-robin among `n` GPUs, in their order (`shards_needed` lists the largest shards of each
    kind first, so each GPU gets some large and some small ones): job i on GPU i mod n. GPUs past the job count get
    an empty list."""
    return [list(jobs[g::n]) for g in range(n)]


def serve_on_gpus(shares: Sequence[Sequence[tuple]], gpus: Sequence[str],
                  serve: Callable[[int, Sequence[tuple], threading.Event], dict]) -> dict:
    """Run `serve(g, shares[g], stop)` for every GPU g with a share at the same time, each in a thread named
    `calibrate-gpu<id>`, and merge what they return. When one raises (or this thread is interrupted: SIGTERM as
    SystemExit, Ctrl-C), `stop` is set so the others stop their servers, and the first exception is raised once
    every thread has ended."""
    stop, results, errors = threading.Event(), {}, []

    def run(g: int) -> None:
        try:
            results.update(serve(g, shares[g], stop))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=run, args=(g,), name=f"calibrate-gpu{gpus[g]}")
               for g in range(len(shares)) if shares[g]]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(POLL_S)
    except BaseException:
        stop.set()
        for t in threads:
            t.join()
        raise
    if errors:
        raise errors[0]
    return results


def serve_calibration(model_path: str, sig: str, flags: list[str], gpu_name: str, cache_dir: Path,
                      server: Callable, log: Path, timeout_s: float, measure_overhead: bool = True) -> tuple[str, Path | None]:
    """`serve_calibrations` for one job: (what happened, the cache entry or None)."""
    return serve_calibrations(model_path, [(sig, flags, log)], gpu_name, cache_dir, server, timeout_s,
                              measure_overhead)[sig]


def tp_shard_calibrations(model_path: str, n_gpus: int, gpu_name: str,
                          calibration_dirs: list[Path] | None = None) -> dict[int, Calibration]:
    """n -> the calibration of `model_path`'s TP-n shard on `gpu_name`'s kind, for n = 2, 4, ... `n_gpus` (cache or
    bundled; `calibration_dirs` to look elsewhere).

    Raises:
        InterconnectError: a shard has no calibration (one line naming the command that makes it).
    """
    from sgl_sidp.plan.comm import InterconnectError
    from sgl_sidp.plan.configs import shard_of

    hf = read_hf_config(model_path)
    shapes = ModelShapes.of(hf)
    out = {}
    for n in (2 ** k for k in range(1, 8)):
        if n > n_gpus:
            break
        sig = shard_signature(hf, shard_of(shapes, n, n, n))
        found = find_calibration(sig, gpu_name, calibration_dirs)
        if found is None:
            raise InterconnectError(f"no calibration of {model_path}'s TP{n} shard '{sig}' on {gpu_name}: run "
                                    f"python -m sgl_sidp.plan calibrate --model-path {model_path} --gpus {n_gpus} first")
        out[n] = found[0]
    return out


def forward_all_reduce(model_path: str, shards: dict[int, Calibration], gpu_name: str, cache_dir: Path | None = None,
                       port: int = 26500, timeout_s: float = 600.0, server: Callable | None = None) -> dict[int, dict]:
    """The all-reduce SGLang pays inside its TP forwards on this node, for each TP size n of `shards`
    (`tp_shard_calibrations`): the model served whole at `--tp-size n` on GPUs 0..n-1 with `--overlay-calibrate`, its
    forwards less its TP-n shard's forwards on one GPU, over the forward's 2L all-reduces
    (`comm.forward_all_reduce_points`), fitted as latency + bytes / bus bandwidth (`comm.fit`).

    Returns: n -> the interconnect table's all_reduce entry ({"latency_us", "busbw_gbps", "source"}); an n whose
    server failed is missing (its line on stderr says why).
    """
    from sgl_sidp.bench.server import ServerProcess
    from sgl_sidp.model_info import model_signature
    from sgl_sidp.plan.comm import fit, forward_all_reduce_points

    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    hf = read_hf_config(model_path)
    shapes = ModelShapes.of(hf)
    links = {}
    for n, shard in sorted(shards.items()):
        gpus = ",".join(str(i) for i in range(n))
        make = server or (lambda args, log, gpus=gpus: ServerProcess(
            "sgl_sidp.launch_server", args, port=port, log_path=log, gpus=gpus,
            env={"SIDP_CALIBRATION_DIR": str(cache_dir)}))
        sig = model_signature(hf, n)
        what, entry = serve_calibration(model_path, sig, ["--tp-size", str(n)], gpu_name, cache_dir, make,
                                        cache_dir / f"measure-comm-tp{n}.log", timeout_s, measure_overhead=False)
        print(f"sgl-sidp plan measure-comm: {sig}: {what}", file=sys.stderr, flush=True)
        if entry is None:
            continue
        data = json.loads(entry.read_text())
        pts = forward_all_reduce_points(Calibration.from_entry(data), shard, shapes.layers, shapes.hidden)
        lat, bw = fit(pts, "all_reduce", n)
        links[n] = {"latency_us": round(lat, 2), "busbw_gbps": round(bw, 1),
                    "source": f"measured by measure-comm in SGLang's TP{n} forwards of {Path(model_path).name} "
                              f"less its TP{n} shard's on one GPU, per all-reduce, {len(pts)} points (decode batches "
                              f"at two contexts, prefills of 2,048 tokens or more)"}
    return links


def timed_graph_flags() -> list[str]:
    """SGLang flags that capture only the CUDA graphs a calibration times: the decode batches `DECODE_BATCHES` and
    the prefill sizes `PREFILL_TOKENS` (all of them buckets of SGLang's default prefill graphs, which reach the
    chunked-prefill size: `ServerArgs._generate_prefill_cuda_graph_batch_sizes`). A timed batch runs in the same
    graph as with SGLang's default lists (one of its own size); what changes is the start (SGLang 0.5.17 captures
    about 36 decode and 58 prefill sizes by default: 13-27 s of a shard's start on one H200) and the memory SGLang
    keeps for graphs, so such a server's KV pool is not a default server's. Checked on one H200 for Qwen3-8B's TP1
    shard (`benchmarks/results/plan/calibrate_h200_probes_2026-11-24/`): decode steps within 1.4 % of a default
    server's, prefills of 512 tokens or more within 5 %, graph capture 5 s instead of 57 s."""
    from sgl_sidp.calibration.table import DECODE_BATCHES, PREFILL_TOKENS

    return ["--cuda-graph-bs-decode", *map(str, DECODE_BATCHES), "--cuda-graph-bs-prefill", *map(str, PREFILL_TOKENS)]


def calibrate(model_path: str, n_gpus: int | Sequence[int], gpu_name: str, cache_dir: Path | None = None,
              port: int = 26500, timeout_s: float = 600.0, server: Callable | None = None, log_dir: Path | None = None,
              measure_overhead: bool = True, gpu_bytes: int | None = None,
              timed_graphs_only: bool = True, ahead: int = 2,
              jit_capability: tuple[int, int] | None = None, gpus: Sequence[str] | None = None) -> dict[str, str]:
    """Calibrate every missing shard of `model_path` for `n_gpus` GPUs (or each of several node sizes) on this host's
    `gpus` (indices of the GPUs this process sees, `bench.server.visible_gpus`, each timing its share of the shards
    at the same time, `split_jobs`; default: the first, "0"; all of kind `gpu_name` and of `gpu_bytes` bytes: a shard that does not fit
    is timed at two smaller layer counts, `layers_that_fit`, and extrapolated, `extrapolate_layers`), and run each
    served shard's HTTP probes (`serve_calibrations`; `measure_overhead` False: none). `timed_graphs_only`: the servers capture only the graphs
    they time (`timed_graph_flags`). `ahead`: how many servers after the current one are started on each GPU while it
    is measured (`serve_calibrations`); GPU g's servers use `port + g (ahead + 1)` ... `port + g (ahead + 1) + ahead`
    in turn. `server(args, log)` (tests) stands in for every GPU's servers; it runs in the thread named
    `calibrate-gpu<id>`.
    `jit_capability`: this GPU's compute capability, for which SGLang's JIT kernels of the shards to serve are built
    in parallel while the first server starts (`jit_prebuild`; None: each server compiles what it needs on first use).

    Returns: signature -> "cached <file>", "measured in N s <file>" (or "extrapolated from ...") or why it failed.
    """
    from sgl_sidp.bench.server import ServerProcess

    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    hf = read_hf_config(model_path)
    shapes = ModelShapes.of(hf)
    gpus = list(gpus or ["0"])

    def gpu_server(g: int) -> Callable:
        """GPU `gpus[g]`'s server factory: at most ahead + 1 servers at a time, on ports of its own."""
        if server is not None:
            return server
        ports = itertools.cycle(range(port + g * (ahead + 1), port + (g + 1) * (ahead + 1)))
        return lambda args, log: ServerProcess("sgl_sidp.launch_server", args, port=next(ports), log_path=log,
                                               gpus=gpus[g], env={"SIDP_CALIBRATION_DIR": str(cache_dir)},
                                               kill_on_stop=True)

    def job(sig: str, overrides: dict, probes=PROBES) -> tuple[str, list[str], Path, tuple]:
        """The `serve_calibrations` job of one shard (`overrides` for `--json-model-override-args`) whose signature is
        `sig`, running `probes`."""
        flags = ["--json-model-override-args", json.dumps(overrides)] + (timed_graph_flags() if timed_graphs_only else [])
        return sig, flags, (log_dir or cache_dir) / f"calibrate-{sig.replace(' ', '_').replace('/', '-')}.log", probes

    needed = shards_needed(hf, n_gpus)
    results, jobs, parts = {}, [], {}  # parts: signature -> (near layers, far layers, their signatures)
    kv_heads = set()  # KV heads per GPU of the shards to serve
    for sig, shard in needed.items():
        overrides = shard.override_args(shapes)
        fit = layers_that_fit(hf, shard, gpu_bytes)
        found = find_calibration(sig, gpu_name, [cache_dir])
        why_not = unservable(hf, shard)
        if found is not None:
            results[sig] = f"cached {found[1]}"
        elif why_not:
            results[sig] = f"failed: {why_not}"
        elif fit == shapes.layers:
            jobs.append(job(sig, overrides))
            kv_heads.add(shard.kv_heads)
        elif fit < 2:
            results[sig] = f"failed: not even {fit} decoder layer(s) of this shard fit one GPU of {gpu_bytes / GIB:.0f} GiB"
        else:
            part_sigs = [shard_signature(hf, shard, num_hidden_layers=n) for n in (fit // 2, fit)]
            jobs += [job(ps, {**overrides, "num_hidden_layers": n}, probes)
                     for ps, n, probes in zip(part_sigs, (fit // 2, fit), PART_PROBES)]
            parts[sig] = (fit // 2, fit, part_sigs)
            kv_heads.add(shard.kv_heads)
        if sig in results:
            print(f"sgl-sidp plan calibrate: {sig}: {results[sig]}", file=sys.stderr, flush=True)
    prebuild = (jit_prebuild.start(jit_prebuild.jit_modules(hf, kv_heads), jit_capability, log_dir or cache_dir)
                if jobs and jit_capability else None)
    try:
        served = serve_on_gpus(split_jobs(jobs, len(gpus)), gpus,
                               lambda g, share, stop: serve_calibrations(model_path, share, gpu_name, cache_dir,
                                                                         gpu_server(g), timeout_s, measure_overhead,
                                                                         ahead, stop))
    finally:
        if prebuild is not None:
            prebuild.stop()
    if prebuild is not None:
        print(f"sgl-sidp plan calibrate: {prebuild.report()}", file=sys.stderr, flush=True)
    for sig in needed:
        if sig in parts:
            near_n, far_n, part_sigs = parts[sig]
            timed = [served[ps] for ps in part_sigs]
            for ps, (what, _) in zip(part_sigs, timed):
                print(f"sgl-sidp plan calibrate: {ps} (for {sig}): {what}", file=sys.stderr, flush=True)
            failed = [what for what, entry in timed if entry is None]
            if failed:
                results[sig] = f"failed: {failed[0]}"
            else:
                near, far = (json.loads(entry.read_text()) for _, entry in timed)
                cal = extrapolate_layers(Calibration.from_json(near["calibration"]),
                                         Calibration.from_json(far["calibration"]), near_n, far_n, shapes.layers, sig)
                out = CalibrationCache(cache_dir).put(CalibrationKey(**{**far["key"], "model": sig}), cal)
                results[sig] = f"extrapolated from {near_n} and {far_n} layers {out}"
        elif sig in served:
            results[sig] = served[sig][0]
        else:
            continue
        print(f"sgl-sidp plan calibrate: {sig}: {results[sig]}", file=sys.stderr, flush=True)
    return results
