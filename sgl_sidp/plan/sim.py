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

How it runs (an hour-long trace in a fraction of a second besides the step-time functions' own): an iteration costs
O(1) besides the requests it admits, finishes or retracts. Running sums stand for the sums over the running batch
SGLang takes (where an admission comes within 1e-9 of the line, the reserved tokens are summed request by request as
`PrefillAdder` does, so the floats are SGLang's order of operations); `decode_ms` is called once per distinct (batch,
mean context); and between two arrivals each DP replica runs on its own (`ReplicaSim.advance`).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import math
from typing import Callable, Sequence

CLIP_MAX_NEW_TOKENS = 4096
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.7 * 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
BLOCK_TOKENS = 512
_TIE = 1e-9  # relative: closer than this to the admission line, the reserved tokens are summed per request


@dataclasses.dataclass
class SimRequest:
    """One request: when it arrives (s), its prompt and output lengths (tokens), its prompt blocks (or None).

    Filled by the simulation: `first_token_s`, `finish_s` (absolute seconds), and the bookkeeping fields (a running
    request's `decoded` and `held` are brought up to date when it finishes or is retracted, or `ReplicaSim.running`
    is read)."""

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
    request's (new tokens, tokens already in its KV) in the prefill batch.

    Both must be pure functions of their arguments: a `ReplicaSim` calls `decode_ms` once per distinct (batch, mean
    context) and reuses the result."""

    def __init__(self, decode_ms: Callable[[int, float], float],
                 prefill_ms: Callable[[Sequence[tuple[int, int]]], float]):
        self.decode_ms, self.prefill_ms = decode_ms, prefill_ms


class RadixBlocks:
    """The radix cache at block granularity: block id -> last use, least recently used evicted first.

    `version` counts the changes to the blocks or their order, so that a caller can tell that a `hit` repeated with
    nothing changed in between would find the same tokens and leave the cache as it is."""

    def __init__(self):
        self.blocks: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.version = 0

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
        if n:
            self.version += 1
        return n * BLOCK_TOKENS

    def insert(self, hash_ids: Sequence[int] | None) -> None:
        for h in hash_ids or ():
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        if hash_ids:
            self.version += 1

    def evict(self, tokens: int) -> None:
        if tokens > 0 and self.blocks:
            self.version += 1
        while tokens > 0 and self.blocks:
            self.blocks.popitem(last=False)
            tokens -= BLOCK_TOKENS


class _Running:
    """A running request, and the decode step count at which its `decoded` and `held` were last brought up to date
    (every decode step adds one to both, for every running request: they are written when read)."""

    __slots__ = ("req", "since")

    def __init__(self, req: SimRequest, since: int):
        self.req, self.since = req, since


class ReplicaSim:
    """One DP replica: its queue, running batch, KV cache and clock.

    Args:
        limits: `ReplicaLimits`.
        times: `StepTimes`.

    Every iteration costs O(1) besides the requests it admits, finishes or retracts: the running batch's sums
    (contexts, remaining outputs clipped at 4,096) are kept up to date, the running requests' `decoded` and `held`
    are written when they finish, are retracted or `running` is read, and a waiting request that did not fit is not
    looked up in the radix cache again while the cache is unchanged.
    """

    def __init__(self, limits: ReplicaLimits, times: StepTimes):
        self.limits, self.times = limits, times
        self.clock = 0.0
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.chunked: SimRequest | None = None
        self.cache = RadixBlocks()
        self.used = 0  # KV tokens held by running (and chunked) requests
        self.ratio = INIT_NEW_TOKEN_RATIO
        self.iterations = collections.Counter()
        self._running: dict[int, _Running] = {}  # join number -> running request, in the order they joined
        self._joins = 0  # join numbers handed out
        self._steps = 0  # decode steps run
        self._ctx_sum = 0  # tokens: sum of the running requests' input_len + decoded
        self._out_sum = 0  # tokens: sum of the running requests' min(output_len - decoded, CLIP_MAX_NEW_TOKENS)
        self._clipped = 0  # running requests with more than CLIP_MAX_NEW_TOKENS output tokens left
        self._finish: list[tuple[int, int]] = []  # heap of (decode step after which it finishes, join number)
        self._unclip: list[tuple[int, int]] = []  # heap of (decode step after which CLIP are left, join number)
        self._hit_memo: tuple[SimRequest, int, int] | None = None  # (request, cache version after its hit, tokens)
        self._decode_memo: dict[tuple[int, float], float] = {}  # (batch, mean context) -> decode_ms

    @property
    def running(self) -> list[SimRequest]:
        """The running requests, in the order they joined the batch (a new list; its `decoded` and `held` up to
        date)."""
        for run in self._running.values():
            self._sync(run)
        return [run.req for run in self._running.values()]

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
        """The running requests' reserved decode tokens, summed one request at a time as `PrefillAdder` does."""
        return sum(min(r.output_len - r.decoded, CLIP_MAX_NEW_TOKENS) * self.ratio for r in self.running)

    # ------------------------------------------------------------------ running batch
    def _sync(self, run: _Running) -> None:
        steps = self._steps - run.since
        if steps:
            run.req.decoded += steps
            run.req.held += steps
            run.since = self._steps

    def _join(self, req: SimRequest) -> None:
        j = self._joins
        self._joins += 1
        self._running[j] = _Running(req, self._steps)
        self._ctx_sum += req.input_len + req.decoded
        left = req.output_len - req.decoded
        self._out_sum += min(left, CLIP_MAX_NEW_TOKENS)
        if left > CLIP_MAX_NEW_TOKENS:
            self._clipped += 1
            heapq.heappush(self._unclip, (self._steps + left - CLIP_MAX_NEW_TOKENS, j))
        heapq.heappush(self._finish, (self._steps + left, j))

    def _leave(self, j: int) -> SimRequest:
        """Take running request `j` out of the batch and its sums, its `decoded` and `held` up to date."""
        run = self._running.pop(j)
        self._sync(run)
        req = run.req
        self._ctx_sum -= req.input_len + req.decoded
        left = req.output_len - req.decoded
        self._out_sum -= min(left, CLIP_MAX_NEW_TOKENS)
        if left > CLIP_MAX_NEW_TOKENS:
            self._clipped -= 1
        return req

    def _cached_tokens(self, req: SimRequest) -> int:
        """`self.cache.hit(req.hash_ids)`; a repeat for the same request with the cache unchanged since is skipped
        (it would find the same blocks and leave their order as it is)."""
        memo = self._hit_memo
        if memo is not None and memo[0] is req and memo[1] == self.cache.version:
            return memo[2]
        tokens = self.cache.hit(req.hash_ids)
        self._hit_memo = (req, self.cache.version, tokens)
        return tokens

    # ------------------------------------------------------------------ iterations
    def _admission_need(self, req: SimRequest) -> int:
        """KV tokens `req` needs to be admitted: its uncached prompt + min(output, 4,096) + 1 (its cached prefix looked
        up, and set as its `cached` and `prefilled`)."""
        req.cached = min(self._cached_tokens(req), req.input_len - 1)
        req.prefilled = req.cached
        return req.input_len - req.cached + min(req.output_len, CLIP_MAX_NEW_TOKENS) + 1

    def _prefill_batch(self) -> list[tuple[SimRequest, int]]:
        """(request, new tokens) of the next prefill batch, admitted as `PrefillAdder` does; [] if none fits."""
        batch, chunk, budget = [], self.limits.chunked_prefill, self.limits.max_prefill_tokens
        running, max_running = len(self._running), self.limits.max_running
        base = self.limits.kv_tokens - self.used  # free + evictable KV tokens
        reserved = self.ratio * self._out_sum
        # rem_total as PrefillAdder computes it, but with the reserved tokens as one product instead of a sum of one
        # product per running request: they differ in the last bits only, so where an admission is that close to
        # the line the per-request sum is taken and the admissions so far are replayed on it.
        rem_total, needs = base - reserved, []
        for req in itertools.chain((self.chunked,) if self.chunked else (), self.waiting):
            if running + len(batch) >= max_running or chunk <= 0 or budget <= 0:
                break
            if req is not self.chunked:
                need = self._admission_need(req)
                if needs is not None and abs(need - rem_total) <= _TIE * (abs(base) + reserved + 1.0):
                    rem_total = base - self._reserved()
                    for n in needs:
                        rem_total -= n
                    needs = None
                if need >= rem_total:
                    break
                rem_total -= need
                if needs is not None:
                    needs.append(need)
            take = min(req.input_len - req.prefilled, chunk)
            batch.append((req, take))
            chunk -= take
            budget -= take
            if req.prefilled + take < req.input_len:
                break  # one chunked request at a time, last in its batch
        return batch

    def _head_waits(self) -> bool:
        """Whether the first waiting request does not fit (`_prefill_batch` would return []), when nothing is
        chunked and the running batch and prefill limits leave room for it."""
        need = self._admission_need(self.waiting[0])
        base = self.limits.kv_tokens - self.used
        reserved = self.ratio * self._out_sum
        rem_total = base - reserved
        if abs(need - rem_total) <= _TIE * (abs(base) + reserved + 1.0):
            rem_total = base - self._reserved()
        return need >= rem_total

    def step(self) -> bool:
        """Run one iteration at the current clock; False when there was nothing to run."""
        batch = self._prefill_batch() if (self.waiting or self.chunked) else []
        if not batch and not self._running and not self.chunked and self.waiting:
            self.waiting.popleft().rejected = True  # it can never fit, even alone
            return True
        if batch:
            self.clock += self.times.prefill_ms([(t, r.prefilled) for r, t in batch]) / 1e3
            self.iterations["prefill"] += 1
            chunked, self.chunked = self.chunked, None
            for req, take in batch:
                if req is not chunked:
                    self.waiting.popleft()  # the batch's waiting requests are the head of the queue, in order
                self._take(take)
                req.held += take
                req.prefilled += take
                if req.prefilled < req.input_len:
                    self.chunked = req
                    continue
                req.decoded = 1  # the prefill forward samples the first token
                req.first_token_s = req.first_token_s or self.clock
                if req.decoded >= req.output_len:
                    self._finished(req)
                else:
                    self._join(req)
            return True
        if not self._running:
            return False
        self._decode()
        return True

    def _decode(self) -> None:
        """One decode step of every running request (retracting first where the KV cache is short)."""
        while self.limits.kv_tokens - self.used < len(self._running) and len(self._running) > 1:
            self._retract()  # fewer free and evictable tokens than running requests
        n = len(self._running)
        key = (n, self._ctx_sum / n)  # (batch, mean context)
        ms = self._decode_memo.get(key)
        if ms is None:
            ms = self._decode_memo[key] = self.times.decode_ms(*key)
        self.clock += ms / 1e3
        self.iterations["decode"] += 1
        self._take(n)
        self._steps += 1
        self._ctx_sum += n
        self._out_sum -= n - self._clipped  # a request with more than CLIP output tokens left reserves CLIP still
        while self._unclip and self._unclip[0][0] <= self._steps:
            if heapq.heappop(self._unclip)[1] in self._running:
                self._clipped -= 1
        while self._finish and self._finish[0][0] <= self._steps:
            j = heapq.heappop(self._finish)[1]
            if j in self._running:  # else retracted since
                self._finished(self._leave(j))
        step = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.ratio = max(MIN_NEW_TOKEN_RATIO, self.ratio - step)

    def _finished(self, req: SimRequest) -> None:
        req.finish_s = self.clock
        self.used -= req.held
        req.held = 0
        self.cache.insert(req.hash_ids)  # its prompt blocks stay cached (evictable)

    def _retract(self) -> None:
        """Send the running request with the most output (the first of them to join) back to the queue."""
        steps = self._steps
        j = max(self._running, key=lambda k: self._running[k].req.decoded + steps - self._running[k].since)
        victim = self._leave(j)
        self.used -= victim.held
        victim.prefilled = victim.decoded = victim.held = 0
        victim.retractions += 1
        self.waiting.appendleft(victim)
        self.ratio = INIT_NEW_TOKEN_RATIO

    def advance(self, until_s: float = math.inf) -> None:
        """Run every iteration that starts before `until_s` (s, on this replica's clock), or until there is nothing
        left to run.

        A decode step that admits, finishes, retracts and evicts nothing runs here (what `step` would do, without
        its general checks); any other iteration through `step`."""
        limits, running, memo = self.limits, self._running, self._decode_memo
        kv, max_running = limits.kv_tokens, limits.max_running
        prefills = limits.chunked_prefill > 0 and limits.max_prefill_tokens > 0
        decay = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS
        while self.clock < until_s:
            n = len(running)
            if (not n  # a prefill, a rejection, or nothing to run
                    or (self.chunked and n < max_running and prefills)  # the chunked prompt goes on
                    or (self.waiting and n < max_running and prefills and not self._head_waits())  # admits one
                    or n > kv - self.used - self.cache.tokens  # retracts, or evicts cached blocks
                    or self._finish[0][0] <= self._steps + 1):  # a request finishes (or a retracted one's entry)
                if not (self.waiting or running or self.chunked) or not self.step():
                    return
                continue
            key = (n, self._ctx_sum / n)  # (batch, mean context)
            ms = memo.get(key)
            if ms is None:
                ms = memo[key] = self.times.decode_ms(*key)
            self.clock += ms / 1e3
            self.iterations["decode"] += 1
            self.used += n
            self._steps += 1
            self._ctx_sum += n
            self._out_sum -= n - self._clipped
            while self._unclip and self._unclip[0][0] <= self._steps:
                if heapq.heappop(self._unclip)[1] in running:
                    self._clipped -= 1
            self.ratio = max(MIN_NEW_TOKEN_RATIO, self.ratio - decay)


def simulate(requests: Sequence[SimRequest], replicas: Sequence[ReplicaSim],
             route: Callable[[SimRequest, Sequence[ReplicaSim]], int] | None = None) -> Sequence[SimRequest]:
    """Run `requests` (sorted by arrival) through `replicas` (SGLang's DP replicas) until every one finished; each
    request goes to `route(request, replicas)` at its arrival (default: round robin, SGLang's default). Returns the
    requests with their times filled in.

    A request is routed once every replica has run each iteration that starts before it arrives (a request arriving
    at the clock of a replica's next iteration is queued before that iteration); replicas share nothing else, so
    each runs on its own between arrivals."""
    pending = sorted(requests, key=lambda r: r.arrival_s)
    for rr, req in enumerate(pending):
        for rep in replicas:
            rep.advance(req.arrival_s)
        target = replicas[route(req, replicas) if route else rr % len(replicas)]
        target.clock = max(target.clock, req.arrival_s)
        target.waiting.append(req)
    for rep in replicas:
        rep.advance()
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
