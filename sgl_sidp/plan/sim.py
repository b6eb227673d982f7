"""A discrete-event simulation of SGLang 0.5.17's scheduler, one DP replica at a time: predicted TTFT, TPOT, E2E and
throughput from a replica's step times.

What it models, after SGLang's `Scheduler` and `PrefillAdder` (`sglang.srt.managers.schedule_policy`):

- continuous batching, prefill first: an iteration runs a prefill batch when requests wait and one fits, else a
  decode step of every running request (no mixed chunks, SGLang's default);
- a prefill batch takes waiting requests first come, first served, up to `chunked_prefill_size` new tokens (a longer
  prompt is chunked over several iterations, one chunked request at a time) and `max_prefill_tokens`, and at most
  `max_running_requests` requests in all;
- KV admission: a request needs its uncached prompt tokens + min(output, 4,096) + 1 < the free and evictable KV
  tokens less every running request's min(remaining output, 4,096) x `new_token_ratio`; the ratio starts at 0.7 and
  decays linearly to 0.098 over 600 decode steps (SGLANG_INIT_NEW_TOKEN_RATIO, _MIN_NEW_TOKEN_RATIO_FACTOR,
  _NEW_TOKEN_RATIO_DECAY_STEPS, CLIP_MAX_NEW_TOKENS);
- retraction: a decode step that finds fewer free tokens than running requests sends the request with the most
  output back to the waiting queue (its KV freed, its prompt and output recomputed later) and resets the ratio to 0.7;
- the radix cache: a request's prompt blocks (Mooncake `hash_ids`, 512 tokens each) already cached skip prefill; a
  finished request's blocks stay cached, evicted least recently used when their tokens are needed.

What it leaves out: the overlap scheduler's CPU time (an iteration lasts its forward), mixed chunks, priorities,
retraction of a request mid-prefill, the tokenizer and detokenizer, and eviction below a block.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Callable, Sequence

CLIP_MAX_NEW_TOKENS = 4096
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.7 * 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
BLOCK_TOKENS = 512


@dataclasses.dataclass
class SimRequest:
    """One request: when it arrives (s), its prompt and output lengths (tokens), its prompt blocks (or None).

    Filled by the simulation: `first_token_s`, `finish_s` (absolute seconds), and the bookkeeping fields."""

    arrival_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    prefilled: int = 0  # prompt tokens in KV (cached prefix included)
    cached: int = 0  # prompt tokens served by the radix cache at admission
    decoded: int = 0
    held: int = 0  # KV tokens this request holds outside the radix cache
    retractions: int = 0
    rejected: bool = False  # needs more KV than the replica has: SGLang refuses it

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        return (self.finish_s - self.first_token_s) / max(1, self.output_len - 1)


@dataclasses.dataclass(frozen=True)
class ReplicaLimits:
    """SGLang's limits of one replica: its KV tokens (`max_total_num_tokens`), `--chunked-prefill-size`,
    `--max-prefill-tokens` and `max_running_requests`."""

    kv_tokens: int
    chunked_prefill: int = 8192
    max_prefill_tokens: int = 16384
    max_running: int = 4096


class StepTimes:
    """A replica's forward times: `decode_ms(batch, mean context)` and `prefill_ms(parts)`, `parts` being each
    request's (new tokens, tokens already in its KV) in the prefill batch."""

    def __init__(self, decode_ms: Callable[[int, float], float],
                 prefill_ms: Callable[[Sequence[tuple[int, int]]], float]):
        self.decode_ms, self.prefill_ms = decode_ms, prefill_ms


class RadixBlocks:
    """The radix cache at block granularity: block id -> last use, least recently used evicted first."""

    def __init__(self):
        self.blocks: collections.OrderedDict[int, None] = collections.OrderedDict()

    @property
    def tokens(self) -> int:
        return len(self.blocks) * BLOCK_TOKENS

    def hit(self, hash_ids: Sequence[int] | None) -> int:
        """Cached prompt tokens: the leading blocks present (touched as used)."""
        n = 0
        for h in hash_ids or ():
            if h not in self.blocks:
                break
            self.blocks.move_to_end(h)
            n += 1
        return n * BLOCK_TOKENS

    def insert(self, hash_ids: Sequence[int] | None) -> None:
        for h in hash_ids or ():
            self.blocks[h] = None
            self.blocks.move_to_end(h)

    def evict(self, tokens: int) -> None:
        while tokens > 0 and self.blocks:
            self.blocks.popitem(last=False)
            tokens -= BLOCK_TOKENS


class ReplicaSim:
    """One DP replica: its queue, running batch, KV cache and clock.

    Args:
        limits: `ReplicaLimits`.
        times: `StepTimes`.
    """

    def __init__(self, limits: ReplicaLimits, times: StepTimes):
        self.limits, self.times = limits, times
        self.clock = 0.0
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.running: list[SimRequest] = []
        self.chunked: SimRequest | None = None
        self.cache = RadixBlocks()
        self.used = 0  # KV tokens held by running (and chunked) requests
        self.ratio = INIT_NEW_TOKEN_RATIO
        self.iterations = collections.Counter()

    # ------------------------------------------------------------------ KV
    def _free(self) -> int:
        return self.limits.kv_tokens - self.used - self.cache.tokens

    def _take(self, tokens: int) -> None:
        """Hold `tokens` more, evicting cached blocks where the free pool is short."""
        short = tokens - self._free()
        if short > 0:
            self.cache.evict(short)
        self.used += tokens

    def _reserved(self) -> float:
        return sum(min(r.output_len - r.decoded, CLIP_MAX_NEW_TOKENS) * self.ratio for r in self.running)

    # ------------------------------------------------------------------ iterations
    def _prefill_batch(self) -> list[tuple[SimRequest, int]]:
        """(request, new tokens) of the next prefill batch, admitted as `PrefillAdder` does; [] if none fits."""
        batch, chunk, budget = [], self.limits.chunked_prefill, self.limits.max_prefill_tokens
        rem_total = self._free() + self.cache.tokens - self._reserved()
        queue = ([self.chunked] if self.chunked else []) + list(self.waiting)
        for req in queue:
            if len(self.running) + len(batch) >= self.limits.max_running or chunk <= 0 or budget <= 0:
                break
            if req is not self.chunked:
                req.cached = min(self.cache.hit(req.hash_ids), req.input_len - 1)
                req.prefilled = req.cached
                need = req.input_len - req.cached + min(req.output_len, CLIP_MAX_NEW_TOKENS) + 1
                if need >= rem_total:
                    break
                rem_total -= need
            take = min(req.input_len - req.prefilled, chunk)
            batch.append((req, take))
            chunk -= take
            budget -= take
            if req.prefilled + take < req.input_len:
                break  # one chunked request at a time, last in its batch
        return batch

    def step(self) -> bool:
        """Run one iteration at the current clock; False when there was nothing to run."""
        batch = self._prefill_batch() if (self.waiting or self.chunked) else []
        if not batch and not self.running and not self.chunked and self.waiting:
            self.waiting.popleft().rejected = True  # it can never fit, even alone
            return True
        if batch:
            self.clock += self.times.prefill_ms([(t, r.prefilled) for r, t in batch]) / 1e3
            self.iterations["prefill"] += 1
            self.chunked = None
            for req, take in batch:
                if req in self.waiting:
                    self.waiting.remove(req)
                self._take(take)
                req.held += take
                req.prefilled += take
                if req.prefilled < req.input_len:
                    self.chunked = req
                    continue
                req.decoded = 1  # the prefill forward samples the first token
                req.first_token_s = req.first_token_s or self.clock
                self._finish_or_run(req)
            return True
        if not self.running:
            return False
        while self._free() + self.cache.tokens < len(self.running) and len(self.running) > 1:
            self._retract()
        mean_ctx = sum(r.input_len + r.decoded for r in self.running) / len(self.running)
        self.clock += self.times.decode_ms(len(self.running), mean_ctx) / 1e3
        self.iterations["decode"] += 1
        self._take(len(self.running))
        done = list(self.running)
        self.running = []
        for req in done:
            req.decoded += 1
            req.held += 1
            self._finish_or_run(req)
        step = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.ratio = max(MIN_NEW_TOKEN_RATIO, self.ratio - step)
        return True

    def _finish_or_run(self, req: SimRequest) -> None:
        if req.decoded >= req.output_len:
            req.finish_s = self.clock
            self.used -= req.held
            req.held = 0
            self.cache.insert(req.hash_ids)  # its prompt blocks stay cached (evictable)
        else:
            self.running.append(req)

    def _retract(self) -> None:
        victim = max(self.running, key=lambda r: r.decoded)
        self.running.remove(victim)
        self.used -= victim.held
        victim.prefilled = victim.decoded = victim.held = 0
        victim.retractions += 1
        self.waiting.appendleft(victim)
        self.ratio = INIT_NEW_TOKEN_RATIO


def simulate(requests: Sequence[SimRequest], replicas: Sequence[ReplicaSim],
             route: Callable[[SimRequest, Sequence[ReplicaSim]], int] | None = None) -> Sequence[SimRequest]:
    """Run `requests` (sorted by arrival) through `replicas` (SGLang's DP replicas) until every one finished; each
    request goes to `route(request, replicas)` at its arrival (default: round robin, SGLang's default). Returns the
    requests with their times filled in."""
    pending = collections.deque(sorted(requests, key=lambda r: r.arrival_s))
    rr = 0
    while pending or any(r.waiting or r.running or r.chunked for r in replicas):
        busy = [r for r in replicas if r.waiting or r.running or r.chunked]
        now = min((r.clock for r in busy), default=math.inf)
        if pending and pending[0].arrival_s <= now:
            req = pending.popleft()
            i = route(req, replicas) if route else rr % len(replicas)
            rr += 1
            target = replicas[i]
            target.clock = max(target.clock, req.arrival_s)
            target.waiting.append(req)
            continue
        if not busy:  # idle until the next arrival
            continue
        min(busy, key=lambda r: r.clock).step()
    return requests


def summarize(requests: Sequence[SimRequest]) -> dict:
    """Predicted throughput (tokens/s over the makespan) and TTFT/TPOT/E2E p50 and p99 (ms) of finished requests."""
    import numpy as np

    done = [r for r in requests if r.finish_s is not None]
    if not done:
        return {"requests": 0, "rejected": sum(r.rejected for r in requests)}
    start = min(r.arrival_s for r in requests)
    makespan = max(r.finish_s for r in done) - start
    ttft = np.array([r.ttft_s for r in done]) * 1e3
    tpot = np.array([r.tpot_s for r in done if r.output_len > 1] or [0.0]) * 1e3
    e2e = np.array([r.finish_s - r.arrival_s for r in done]) * 1e3
    out_tokens = sum(r.output_len for r in done)
    return {"requests": len(done), "makespan_s": makespan,
            "total_tok_s": (out_tokens + sum(r.input_len for r in done)) / makespan, "output_tok_s": out_tokens / makespan,
            "ttft_ms_p50": float(np.percentile(ttft, 50)), "ttft_ms_p99": float(np.percentile(ttft, 99)),
            "tpot_ms_p50": float(np.percentile(tpot, 50)), "tpot_ms_p99": float(np.percentile(tpot, 99)),
            "e2e_ms_p50": float(np.percentile(e2e, 50)), "e2e_ms_p99": float(np.percentile(e2e, 99)),
            "retractions": sum(r.retractions for r in requests), "rejected": sum(r.rejected for r in requests)}
