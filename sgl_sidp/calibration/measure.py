"""Start-up measurements on a running SGLang scheduler (GPU only; called once the scheduler is built).

Runs after `Scheduler.__init__` (KV pool allocated, CUDA graphs captured, nothing served yet) in
every TP rank of a replica, each rank running the same forwards (the graphs hold TP collectives).

- Decode: `ModelRunner.forward` on a synthetic decode `ForwardBatch` of `bs` sequences of
  `context` tokens with random token ids (so an MoE router spreads them over the experts as real
  traffic does; one repeated token would send every row to the same experts), each row on its
  own freshly allocated KV slots where the pool has room (else all rows share one row's slots);
  new K/V go to SGLang's reserved padding slot 0. This replays SGLang's captured decode graph.
  Each batch is timed at two contexts; the difference is what a token of context costs a row at
  that batch (`decode_ms_long`; small batches pay far more per byte of KV than big ones), and the
  largest batch's gives the rate a decode step reads its KV cache (`attention_gbps`). Long-context
  points whose rows would share one row's KV (the pool has no room) are not timed: L2 would serve them.
- Prefill: one request of T tokens through `ScheduleBatch.init_new` / `prepare_for_extend` /
  `ForwardBatch.init_new` / `ModelRunner.forward`, the way SGLang's own start-up profiler
  (`Scheduler.profile_and_init_predictor`) times prefill; its KV is freed afterwards. Then a few forwards of several
  fresh prompts at once (`PREFILL_MULTI`), as a burst of short prompts fills a chunk.
- Copies while a forward runs: a decode forward replayed with and without reader copies on a
  side stream (`time_copy_during_forward`).
- Before the prefill graphs are captured (no scheduler yet): SGLang's own dummy prefill body
  (`time_dummy_prefill`), for a calibration whose result the graphs must be captured with. It runs eagerly, so it
  is timed with its kernels queued behind a GPU sleep (`queued_gpu_ms`): the GPU's time, as a graph replays it,
  not the host's launches.

Every step frees what it allocates; the time spent is bounded by `budget_s`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import statistics
import time
from array import array
from typing import Callable, Sequence

import torch

from sgl_sidp.calibration.table import DECODE_BATCHES, DECODE_CONTEXTS, EAGER_BATCHES, PREFILL_MULTI, PREFILL_TOKENS
from sgl_sidp.process import Progress

logger = logging.getLogger(__name__)


def kv_bytes_per_token(model_runner) -> int:
    """KV bytes of one token over all attention layers of this TP rank (MHA/GQA: K and V; MLA: latent).

    From SGLang's `ModelConfig` and `--kv-cache-dtype` (fp8*: 1 byte, fp4*: half, else the model
    dtype), so it is known before the KV pool exists; this TP rank's share from SGLang's TP world size.
    """
    from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_world_size

    mc = model_runner.model_config
    kv_flag = str(model_runner.server_args.kv_cache_dtype or "auto")
    elt = 1.0 if kv_flag.startswith("fp8") else 0.5 if kv_flag.startswith("fp4") else mc.dtype.itemsize
    layers = int(getattr(mc, "num_attention_layers", mc.num_hidden_layers))
    if getattr(mc, "kv_lora_rank", None):
        per_layer = mc.kv_lora_rank + mc.qk_rope_head_dim
    else:
        per_layer = 2 * mc.get_num_kv_heads(get_tensor_model_parallel_world_size()) * mc.head_dim
    return max(1, int(layers * per_layer * elt))


def median_ms(fn: Callable[[], object], iters: int, warmup: int = 2) -> float:
    """Median ms of `fn()` on the current stream, `iters` times after `warmup` calls, each call timed alone (the host
    waits for it): `pipelined_ms` of one call a round."""
    return pipelined_ms(fn, 1, rounds=iters, warmup=warmup)


def pipelined_ms(fn: Callable[[], object], iters: int, rounds: int = 3, warmup: int = 2) -> float:
    """Mean ms per call of `fn()` issued `iters` times back to back on the current stream (no host sync between
    calls, so one call's host work overlaps the GPU work of the call before), median over `rounds` rounds.

    This is how SGLang's overlap scheduler (`Scheduler.event_loop_overlap`) runs decode steps: the next batch is
    prepared while the GPU runs the current one, so a step costs max(host, GPU) time, not their sum as
    `median_ms` of one call does.
    """
    for _ in range(warmup):
        fn()
    per_call = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / iters)
    return statistics.median(per_call)


class DecodeProbe:
    """A synthetic decode batch of `bs` rows of `context` tokens, run through `ModelRunner.forward`.

    Raises:
        RuntimeError: the KV pool has no room for `context` tokens.
    """

    def __init__(self, model_runner, bs: int, context: int):
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

        self.mr = mr = model_runner
        dev = mr.device
        alloc = mr.token_to_kv_pool_allocator
        self.shared_kv = self.shares_kv(mr, bs, context)
        self.kv = alloc.alloc(context if self.shared_kv else bs * context)
        if self.kv is None:
            raise RuntimeError(f"no room for {context} KV tokens")
        rows = torch.arange(1, bs + 1, device=dev)  # unused request rows (row 0 is SGLang's padding row)
        kv_rows = self.kv.to(torch.int32).view(1 if self.shared_kv else bs, context)
        mr.req_to_token_pool.req_to_token[rows, :context] = kv_rows
        seq = torch.full((bs,), context, dtype=torch.int64, device=dev)
        seq_cpu = seq.cpu()  # once here: a `.cpu()` per forward would sync the host with the GPU
        vocab = int(mr.model_config.vocab_size)
        ids = torch.randint(0, vocab, (bs,), generator=torch.Generator().manual_seed(bs)).to(dev)

        def batch():
            return ForwardBatch(
                forward_mode=ForwardMode.DECODE, batch_size=bs,
                input_ids=ids.clone(),
                req_pool_indices=rows, seq_lens=seq.clone(), orig_seq_lens=seq.clone(), seq_lens_cpu=seq_cpu.clone(),
                out_cache_loc=torch.zeros(bs, dtype=torch.int64, device=dev),  # SGLang's padding slot
                seq_lens_sum=bs * context, positions=seq - 1, return_logprob=False,
                capture_hidden_mode=CaptureHiddenMode.NULL, spec_algorithm=mr.spec_algorithm,
                global_forward_mode=ForwardMode.DECODE,
            )

        self._batch = batch
        self.used_graph = None

    @staticmethod
    def shares_kv(model_runner, bs: int, context: int) -> bool:
        """Whether a probe of `bs` rows of `context` tokens would have its rows share one row's KV slots: the KV pool
        has no room (90 % of what is free) for each row's own. Such rows read their KV partly from L2, so a decode step
        over them is faster than a real one."""
        return bs * context > model_runner.token_to_kv_pool_allocator.available_size() * 9 // 10

    def run(self) -> None:
        out = self.mr.forward(self._batch())
        self.used_graph = bool(getattr(out, "can_run_graph", False))

    def close(self) -> None:
        self.mr.token_to_kv_pool_allocator.free(self.kv)


@contextlib.contextmanager
def eager(model_runner):
    """Within it, `ModelRunner.forward` runs decode batches eagerly: SGLang's `_forward_raw` replays a decode graph
    only when `decode_cuda_graph_runner` is set, so it is unset meanwhile (and restored)."""
    runner = model_runner.decode_cuda_graph_runner
    model_runner.decode_cuda_graph_runner = None
    try:
        yield
    finally:
        model_runner.decode_cuda_graph_runner = runner


#: a one-request prefill whose warm-up run takes this long (ms) or more is timed once after it (`time_prefill`): it is
#: GPU-bound, so the host's jitter of a few ms is under 2 % of it, and its second run costs the start-up calibration of
#: a Llama-3.1-70B shard on one H200 0.5-1 s (prefills of 4,096 and 8,192 tokens)
ONE_RUN_PREFILL_MS = 200.0


def time_prefill(scheduler, tokens: int, iters: int = 2, requests: int = 1) -> float:
    """Median ms of a prefill forward of `requests` fresh prompts of `tokens` tokens each (SGLang's
    `profile_and_init_predictor` path, with `requests` requests in the batch): `iters` runs after a warm-up run, one
    where the warm-up took `ONE_RUN_PREFILL_MS` or more. Their KV is freed after each run."""
    from sglang.srt.layers.dp_attention import set_is_extend_in_batch
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.sampling.sampling_params import SamplingParams

    mr = scheduler.tp_worker.model_runner
    ids = [array("q", torch.randint(0, 1000, (tokens,), generator=torch.Generator().manual_seed(tokens + r)).tolist())
           for r in range(requests)]
    times = []
    for i in range(iters + 1):  # the first run warms up
        reqs = []
        for r in range(requests):
            req = Req(rid=f"sidp-calibration-{tokens}x{requests}-{i}-{r}", origin_input_text="", origin_input_ids=ids[r],
                      sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
            req.full_untruncated_fill_ids = req.origin_input_ids
            req.logprob_start_len = -1
            req.set_extend_range(len(req.prefix_indices), len(req.full_untruncated_fill_ids))
            reqs.append(req)
        batch = ScheduleBatch.init_new(reqs, scheduler.req_to_token_pool, scheduler.token_to_kv_pool_allocator,
                                       scheduler.tree_cache, scheduler.model_config, False, scheduler.spec_algorithm)
        torch.cuda.synchronize()
        start = time.perf_counter()
        batch.prepare_for_extend()
        if batch.input_ids is None and batch.prefill_input_ids_cpu is not None:
            batch.input_ids = batch.prefill_input_ids_cpu.to(mr.device, non_blocking=True)
            batch.prefill_input_ids_cpu = None
        fb = ForwardBatch.init_new(batch, mr, return_hidden_states_before_norm=False)
        set_is_extend_in_batch(True)
        mr.forward(forward_batch=fb)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
        for req in reqs:
            if req.req_pool_idx is not None:
                scheduler.token_to_kv_pool_allocator.free(
                    scheduler.req_to_token_pool.req_to_token[req.req_pool_idx, : req.extend_range.end])
                scheduler.req_to_token_pool.free(req)
        if i and times[0] >= ONE_RUN_PREFILL_MS:
            break
    return statistics.median(times[1:])


class CudaQueue:
    """The CUDA side of `queued_gpu_ms`: a GPU sleep of a given length, timing events, synchronization and the host's
    clock (the CPU tests pass a simulated queue instead)."""

    def __init__(self):
        self._cycles_per_ms: float | None = None

    def sleep(self, ms: float) -> None:
        """Queue a kernel that spins `ms` milliseconds (`torch.cuda._sleep` counts clock cycles; their rate is
        measured once)."""
        if self._cycles_per_ms is None:
            cycles = 10_000_000
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            self._cycles_per_ms = cycles / max(start.elapsed_time(end), 1e-3)
        torch.cuda._sleep(int(ms * self._cycles_per_ms))

    def event(self) -> torch.cuda.Event:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def elapsed_ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()
        return start.elapsed_time(end)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def host_ms(self) -> float:
        """The host's clock, ms."""
        return time.perf_counter() * 1e3


@dataclasses.dataclass(frozen=True)
class QueuedTiming:
    """What `queued_gpu_ms` measured. gpu_ms: median GPU ms of the call with its kernels queued ahead; eager_ms: the
    same call timed alone from the host (launches included); ahead: whether the host had queued every kernel before
    the sleep ended on every timed call (else `gpu_ms` holds host gaps too)."""

    gpu_ms: float
    eager_ms: float
    ahead: bool


def queued_gpu_ms(run: Callable[[], object], iters: int = 2, prepare: Callable[[], object] | None = None,
                  align: Callable[[], object] | None = None, queue=None,
                  agree: Callable[[float], float] | None = None) -> QueuedTiming:
    """The GPU time of `run()` as a CUDA graph replays it, for work that can only run eagerly (no graph yet).

    An eager forward of a few thousand tokens is launch-bound: its host time (tens of ms for a 36-layer model) hides
    the GPU's. So the GPU first runs a sleep kernel longer than the host takes to launch the call (1.5x its eager
    time plus 10 ms), the call's kernels queue behind it, and CUDA events on either side of the call time the GPU
    alone. `prepare()` (host work that may synchronize, e.g. attention metadata) runs before the sleep; `align()`
    (e.g. a TP group's CPU barrier) lines up the ranks whose collectives the call holds, so no rank's kernels wait for
    a peer's host. The technique of timing queued-ahead kernels: Triton's `do_bench` and FlashInfer's
    `bench_gpu_time` time CUDA graphs of the call instead, which needs a capturable call.

    Args:
        run: enqueues the GPU work; must not synchronize the host (if it does, `ahead` says so).
        iters: timed calls after an eager warm-up call and an eager call timed from the host; the median is returned.
        queue: the CUDA side (`CudaQueue`); the CPU tests pass a simulated one.
        agree: maps this rank's sleep (ms) to the one every rank uses (`largest_over`), for calls that hold
            collectives: a rank that sleeps less waits inside its first collective for its peers' longer sleeps,
            and its events time that wait (the likely cause of Shift's 128-token TP2 prefill, timed first, at
            21-22 ms against 5.5-7 at 256 tokens in three 2 x H200 starts, `q8_decode_prof_pair_2gpu_h200`).

    Returns:
        `QueuedTiming` (milliseconds).
    """
    queue = queue or CudaQueue()
    for _ in range(2):  # a warm-up call (the first may compile kernels: 2 s for a 128-token body on H200), then one
        if prepare:     # timed from the host, which sets the sleep
            prepare()
        queue.synchronize()
        t0 = queue.host_ms()
        run()
        queue.synchronize()
        eager_ms = queue.host_ms() - t0
    lead_ms = 1.5 * eager_ms + 10.0
    if agree:
        lead_ms = agree(lead_ms)
    times, ahead = [], True
    for _ in range(iters):
        if prepare:
            prepare()
        queue.synchronize()
        if align:
            align()
        queue.sleep(lead_ms)
        start = queue.event()
        t0 = queue.host_ms()
        run()
        host_ms = queue.host_ms() - t0
        end = queue.event()
        times.append(queue.elapsed_ms(start, end))
        ahead = ahead and host_ms < lead_ms
    return QueuedTiming(statistics.median(times), eager_ms, ahead)


def largest_over(group) -> Callable[[float], float]:
    """`queued_gpu_ms`'s `agree` for the ranks of `group`, a CPU process group (gloo; SGLang's
    `GroupCoordinator.cpu_group`): each rank's value becomes the largest of the group's. Every rank must call it
    at the same point."""
    import torch.distributed as dist

    def largest(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return float(t.item())
    return largest


def time_dummy_prefill(graph_runner, tokens: int, iters: int = 2, align: Callable[[], object] | None = None,
                       queue=None, agree: Callable[[float], float] | None = None) -> QueuedTiming:
    """GPU ms of a prefill body of `tokens` tokens, before any prefill graph exists (`queued_gpu_ms`).

    Builds SGLang's capture-shaped dummy batch (`PrefillCudaGraphRunner.capture_prepare`, attention metadata included:
    the body its `_run_dummy_forward` warm-up runs; the decoder layers only, no logits; K/V written to SGLang's padding
    slot 0) before the GPU sleep, and times `PrefillCudaGraphRunner._run_forward` queued behind it. For calibrations
    that must finish before the prefill graphs are captured, when no scheduler exists yet. `tokens` must not exceed
    the runner's largest capture size (`max_num_tokens`). `align`, `agree`: see `queued_gpu_ms`.
    """
    batch: list = []

    def prepare():
        fb, attn_backend = graph_runner.capture_prepare(tokens)
        attn_backend.init_forward_metadata(fb)
        batch[:] = [fb]

    return queued_gpu_ms(lambda: graph_runner._run_forward(batch[0], tokens), iters, prepare, align, queue, agree)


def feasible_points(scheduler, batches: Sequence[int] = DECODE_BATCHES, contexts: Sequence[int] = DECODE_CONTEXTS,
                    prefill: Sequence[int] = PREFILL_TOKENS,
                    multi: Sequence[tuple[int, int]] = PREFILL_MULTI) -> tuple[list[int], list[int], list[int], list]:
    """The decode batches (captured in a decode graph, rows available), contexts, prefill sizes and prefills of
    several prompts ((requests, tokens each): within the KV pool, the request rows, the context length and the
    chunked-prefill size) this server can run."""
    mr = scheduler.tp_worker.model_runner
    runner = getattr(mr, "decode_cuda_graph_runner", None)
    captured = set(getattr(runner, "capture_bs", []) or [])
    rows = mr.req_to_token_pool.size - 1
    kv_free = mr.token_to_kv_pool_allocator.available_size()
    ctx_len = int(mr.model_config.context_len)
    chunk = int(scheduler.server_args.chunked_prefill_size or 0) or ctx_len
    bs = [b for b in batches if b in captured and b <= rows]
    ctx = [c for c in contexts if c < min(kv_free, ctx_len)]
    pre = [t for t in prefill if t <= min(kv_free, ctx_len, chunk)]
    several = [(k, n) for k, n in multi if k * n <= min(kv_free, chunk) and n <= ctx_len and k <= rows]
    return bs, ctx, pre, several


#: seconds `measure_forwards` may spend on one server: a whole 8B model takes 8-11 s on an H200, a Llama-3.1-70B
#: shard of 64 GB 20-21 s (at 20 s, its last prefills were skipped; `benchmarks/results/plan/`
#: `calibrate_h200_overlap_2026-11-24/`)
FORWARD_BUDGET_S = 60.0


def measure_forwards(scheduler, budget_s: float = FORWARD_BUDGET_S, iters: int = 6, who: str = "this replica") -> dict:
    """Decode and prefill forward times of this server (see the module doc); every 10 s it logs which point it
    measures (`process.Progress`), naming the process as `who`.

    Returns:
        {"decode_ms": {bs: ms}, "decode_context": {bs: tokens}, "decode_ms_long": {bs: ms},
         "decode_ms_alone": {bs: ms}, "decode_context_long": tokens, "attention_gbps": float | None,
         "decode_ms_eager": {bs: ms}, "decode_eager_context": tokens,
         "prefill_ms": {tokens: ms}, "prefill_multi_ms": [(requests, tokens each, ms)], "graph": bool, "seconds": float,
         "skipped": [str]}. `decode_ms` is at the shorter
        context, `decode_ms_long` at the longer one (only batches whose rows have room for their own KV,
        `DecodeProbe.shares_kv`), both pipelined (`pipelined_ms`); `decode_ms_alone` is one forward alone at the
        shorter context (`median_ms`); `attention_gbps` is fitted from the largest batch with its own KV;
        `decode_ms_eager` are `EAGER_BATCHES` run without a graph (`eager`) at the shorter context.
        Points past `budget_s` are skipped: missing from the result and named in "skipped".
    """
    t0 = time.monotonic()
    mr = scheduler.tp_worker.model_runner
    bs_list, ctxs, prefill, several = feasible_points(scheduler)
    short, long_ = (ctxs[0], ctxs[-1]) if ctxs else (None, None)
    kvb = kv_bytes_per_token(mr)
    out = {"decode_ms": {}, "decode_context": {}, "decode_ms_long": {}, "decode_ms_alone": {}, "prefill_ms": {},
           "graph": True, "decode_context_long": long_ if long_ != short else 0, "decode_ms_eager": {},
           "decode_eager_context": short or 0, "skipped": [], "prefill_multi_ms": []}
    rates = []
    progress = Progress(f"sgl-sidp {who}: start-up calibration of the forward times", logger, limit_s=budget_s)

    def point(bs: int, ctx: int, without_graph: bool = False) -> tuple[float, float | None, bool]:
        """(ms pipelined, ms of one forward alone at the short context (graphs only) else None, whether a graph
        ran) of decode batch `bs` at `ctx` tokens."""
        probe = DecodeProbe(mr, bs, ctx)
        try:
            with eager(mr) if without_graph else contextlib.nullcontext():
                ms = pipelined_ms(probe.run, iters)
                alone = median_ms(probe.run, iters) if ctx == short and not without_graph else None
        finally:
            probe.close()
        return ms, alone, bool(probe.used_graph)

    with torch.inference_mode(), progress:
        def over(what: str) -> bool:
            """Whether the budget is spent (then `what`, the points not measured, is named in "skipped")."""
            if time.monotonic() - t0 > budget_s:
                out["skipped"].append(what)
                return True
            return False

        for i, bs in enumerate(bs_list, 1):
            if short is None or over(f"decode batches {bs_list[i - 1:]}"):
                break
            for ctx in dict.fromkeys((short, long_)):
                if ctx != short and DecodeProbe.shares_kv(mr, bs, ctx):
                    continue  # rows sharing one row's KV would read it partly from L2 (too fast)
                progress.at(f"decode batch {bs} ({i} of {len(bs_list)}) at {ctx} tokens of context")
                ms, alone, graph = point(bs, ctx)
                out["graph"] &= graph
                if ctx == short:
                    out["decode_ms"][bs], out["decode_context"][bs], out["decode_ms_alone"][bs] = ms, ctx, alone
                else:
                    out["decode_ms_long"][bs] = ms
            extra_ms = out["decode_ms_long"].get(bs, 0.0) - out["decode_ms"][bs]
            if bs in out["decode_ms_long"] and extra_ms > 0.2:  # below 0.2 ms the difference is noise
                rates.append(bs * (long_ - short) * kvb / (extra_ms * 1e-3) / 1e9)
        rows = mr.req_to_token_pool.size - 1
        eager_batches = [b for b in EAGER_BATCHES if b <= rows]
        for i, bs in enumerate(eager_batches):
            if short is None or over(f"eager decode batches {eager_batches[i:]}"):
                break
            progress.at(f"eager decode batch {bs} at {short} tokens of context")
            out["decode_ms_eager"][bs] = point(bs, short, without_graph=True)[0]
        for i, t in enumerate(prefill, 1):
            if over(f"prefills of {list(prefill[i - 1:])} tokens"):
                break
            progress.at(f"prefill of {t} tokens ({i} of {len(prefill)})")
            out["prefill_ms"][t] = time_prefill(scheduler, t)
        for i, (k, n) in enumerate(several, 1):
            if over(f"prefills of several prompts {several[i - 1:]}"):
                break
            progress.at(f"prefill of {k} prompts of {n} tokens ({i} of {len(several)})")
            out["prefill_multi_ms"].append((k, n, time_prefill(scheduler, n, requests=k)))
    out["attention_gbps"] = max(rates) if rates else None  # the largest batch with its own KV reads fastest
    out["seconds"] = time.monotonic() - t0
    return out


def time_copy_during_forward(scheduler, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], bs: int,
                             context: int = 256, iters: int = 5) -> dict:
    """A reader's copies while its GPU runs decode forwards, against each alone.

    Args:
        pairs: `(local slot, mapped remote tensor)` copies of one layer, as a prefetch issues them.
        bs, context: the decode batch replayed meanwhile.

    Returns:
        {"copy_gbps_idle", "copy_gbps_in_forward" (GB/s), "forward_ms", "forward_ms_with_copies",
         "slowdown_ms_per_gb"}.
    """
    from sgl_sidp.peer.vmm import measure_copy_gbps

    mr = scheduler.tp_worker.model_runner
    side = torch.cuda.Stream(device=mr.device)
    nbytes = sum(d.numel() * d.element_size() for d, _ in pairs)

    def copies():
        for dst, src in pairs:
            dst.copy_(src, non_blocking=True)

    with torch.inference_mode():
        probe = DecodeProbe(mr, bs, context)
        try:
            fwd = median_ms(probe.run, iters)
            idle = nbytes / (measure_copy_gbps(pairs, reps=iters) * 1e9) * 1e3  # ms, as a reader measures it at load
            # both: keep the side stream busy with copies for as long as the forwards run
            n_fwd = 4
            reps = max(1, int(round(n_fwd * fwd / max(idle, 1e-3))))
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            cur = torch.cuda.current_stream()
            torch.cuda.synchronize()
            side.wait_stream(cur)
            ev[0].record(side)
            with torch.cuda.stream(side):
                for _ in range(reps):
                    copies()
            ev[1].record(side)
            ev[2].record(cur)
            for _ in range(n_fwd):
                probe.run()
            ev[3].record(cur)
            torch.cuda.synchronize()
        finally:
            probe.close()
    copy_ms = ev[0].elapsed_time(ev[1]) / reps
    fwd_with = ev[2].elapsed_time(ev[3]) / n_fwd
    copied_gb_per_fwd = nbytes * reps / n_fwd / 1e9
    return {
        "copy_gbps_idle": nbytes / (idle * 1e-3) / 1e9,
        "copy_gbps_in_forward": nbytes / (copy_ms * 1e-3) / 1e9,
        "forward_ms": fwd,
        "forward_ms_with_copies": fwd_with,
        "slowdown_ms_per_gb": max(0.0, fwd_with - fwd) / copied_gb_per_fwd if copied_gb_per_fwd else 0.0,
    }


def describe_measurement(m: dict) -> str:
    """One log line for a `measure_forwards` result."""
    ctx = sorted(set(m["decode_context"].values()))
    kv_rate = f"{m['attention_gbps']:.0f} GB/s" if m["attention_gbps"] else "not measured"
    return "; ".join([
        f"{m['seconds']:.1f} s, {'CUDA graphs' if m['graph'] else 'eager'}",
        f"decode steps back to back at {ctx} tokens of context: " + ", ".join(f"bs{b} {ms:.2f} ms" for b, ms in sorted(m["decode_ms"].items())),
        f"at {m['decode_context_long']} tokens: " + ", ".join(f"bs{b} {ms:.2f} ms" for b, ms in sorted(m["decode_ms_long"].items())),
        "one forward alone (host work not overlapped): "
        + ", ".join(f"bs{b} {ms:.2f} ms" for b, ms in sorted(m.get("decode_ms_alone", {}).items())),
        f"KV read rate {kv_rate}",
        f"eager (no CUDA graph) at {m.get('decode_eager_context', 0)} tokens: "
        + ", ".join(f"bs{b} {ms:.2f} ms" for b, ms in sorted(m.get("decode_ms_eager", {}).items())),
        "prefill " + ", ".join(f"{t} tokens {ms:.1f} ms" for t, ms in sorted(m["prefill_ms"].items())),
        "prefill of several prompts " + ", ".join(f"{k} x {n} tokens {ms:.1f} ms" for k, n, ms in m.get("prefill_multi_ms", ())),
    ] + [f"not measured (past the time budget): {', '.join(m['skipped'])}"] * bool(m.get("skipped")))
