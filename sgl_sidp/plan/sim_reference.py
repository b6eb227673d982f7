"""The planner's scheduler simulation, written plainly: start here, before the optimised `sim.py`.

It replays requests through SGLang 0.5.17's scheduler one iteration at a time, on a replica's step times (how long
a prefill or decode forward takes, `sim.StepTimes`), and fills in each request's first-token and finish times. What
it models, after SGLang's `Scheduler` and `PrefillAdder` (`sglang.srt.managers.schedule_policy`):

- continuous batching, prefill first: an iteration is a prefill batch when requests wait and one fits, else one
  decode step of every running request;
- chunked prefill: a prefill batch takes waiting requests first come, first served, up to `chunked_prefill_size`
  new tokens and `max_prefill_tokens`; a longer prompt goes on in the next iteration (one chunked request at a time);
  at most `max_running_requests` requests run;
- KV admission as `PrefillAdder` does it: a request needs its uncached prompt + min(output, 4,096) + 1 tokens, less
  than the free and evictable KV tokens minus what the running requests reserve (each one's min(remaining output,
  4,096) x `new_token_ratio`; the ratio starts at 0.7 and decays to 0.098 over 600 decode steps);
- the radix cache: prompt blocks (512 tokens, Mooncake `hash_ids`) already in the tree are not prefilled: a
  request's blocks go in once its prefill is done (held by it while it runs: `live`) and stay cached after it
  finishes, least recently used evicted first when the KV tokens are needed;
- retraction: a decode step that finds fewer free and evictable KV tokens than running requests (it takes one each)
  sends the request with the most output back to the queue (its KV freed, recomputed later) and resets the ratio to
  0.7;
- the overlap scheduler's look-ahead (`Scheduler.event_loop_overlap`): the batch that runs after a forward is chosen
  once that forward is launched (`StepTimes.decide_ms` after its start), so a request arriving later during the
  forward misses the next iteration, unless the replica would otherwise have nothing to run;
- the release of a prefill's first tokens: SGLang's overlap scheduler processes a batch's results once it has
  launched the next batch, so where a prefill follows a prefill back to back, the first tokens of the one before
  leave `StepTimes.release_share` of the way through it where it takes longer than `StepTimes.release_min_ms`
  (`_release`); before a decode step, as their forward ends;
- DP replicas: each replica has its own queue, KV cache and clock; a request goes to one replica at its arrival,
  round robin (SGLang's default) or by a `route` function reading the replicas' state.

Reading order: `reference_simulate` (the event loop: arrivals, routing, which replica runs next), then
`ReferenceReplicaSim.step` (the look-ahead) and `_step` (one iteration: rejection, prefill, or retraction and a
decode step), `_prefill_batch` (chunking and KV admission), `_finish_or_run` and `_retract`, and last
`ReferenceRadixBlocks`. Requests, limits and step times are `sim.SimRequest`, `sim.ReplicaLimits`, `sim.StepTimes`.

`sim.py` (`simulate`, `ReplicaSim`, `RadixBlocks`) is the optimised equivalent the planner runs: running sums
instead of loops over the batch, many decode steps at a time, private blocks kept as one cache entry. It must give
the same schedule as this module float for float (every request's times and counters, every replica's clock, KV,
ratio and cached blocks); tests/test_plan_sim.py checks that on synthetic workloads and real traces. A change to
the modelled behaviour goes here first, then into `sim.py`.

Units: times in seconds (`SimRequest.arrival_s`, `clock`), step times in milliseconds (`StepTimes.decode_ms`,
`prefill_ms`), sizes in tokens.
"""

from __future__ import annotations

import collections
import math
from typing import Callable, Sequence

from sgl_sidp.plan.sim import (BLOCK_TOKENS, CLIP_MAX_NEW_TOKENS, INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO,
                               NEW_TOKEN_RATIO_DECAY_STEPS, ReplicaLimits, SimRequest, StepTimes)


def reference_simulate(requests: Sequence[SimRequest], replicas: Sequence[ReferenceReplicaSim],
                       route: Callable[[SimRequest, Sequence[ReferenceReplicaSim]], int] | None = None
                       ) -> Sequence[SimRequest]:
    """Run `requests` through `replicas` until every one finished (or was rejected); returns `requests`, their
    `first_token_s` and `finish_s` (s) filled in.

    The next event is the next arrival, if it comes no later than the earliest busy replica's clock, else that
    replica's next iteration. An arriving request goes to `route(request, replicas)` (an index), or round robin;
    if its replica's iteration at `clock` was chosen before the arrival, that iteration runs first, without it.
    Replicas that ran before go on from where they are."""
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
            chosen = target.last_start + target.decide_s if target.last_end == target.clock else target.clock
            if chosen < req.arrival_s and (len(target.waiting) > 1 or target.running or target.chunked):
                target.step()  # the iteration chosen before `req` came, which runs without it, before the next arrival
            continue
        if not busy:
            continue
        min(busy, key=lambda r: r.clock).step()
    return requests


class ReferenceReplicaSim:
    """One DP replica: its waiting queue, running batch, chunked request, radix cache and clock (s).

    `used`: KV tokens the running and chunked requests hold (tokens); the radix cache's blocks hold
    `cache.tokens` more; the rest of `limits.kv_tokens` is free. `ratio`: SGLang's `new_token_ratio`.
    `iterations`: prefill and decode iterations run. `last_start`, `last_end` (s): the last forward's."""

    def __init__(self, limits: ReplicaLimits, times: StepTimes):
        self.limits, self.times = limits, times
        self.decide_s = times.decide_ms / 1e3  # from an iteration's start to the choice of the next
        self.clock = 0.0
        self.waiting = collections.deque()
        self.running = []
        self.chunked = None
        self.cache = ReferenceRadixBlocks()
        self.used = 0
        self.ratio = INIT_NEW_TOKEN_RATIO
        self.iterations = collections.Counter()
        self.last_start = self.last_end = -math.inf  # the last prefill or decode iteration (not a rejection)
        self.unreleased = []  # the requests whose first token the last iteration, a prefill, sampled

    def step(self) -> bool:
        """Run one iteration (or reject one request), advancing `clock`; False if there was nothing to run."""
        # SGLang's overlap scheduler chose this iteration once it had launched the one before it (`decide_s` after
        # that one's start), if it follows that one back to back, else now: a request that arrived later is not part
        # of it, unless nothing else would run
        chosen = self.last_start + self.decide_s if self.last_end == self.clock else self.clock
        late = [r for r in self.waiting if r.arrival_s > chosen]
        if late and (len(late) < len(self.waiting) or self.running or self.chunked):
            for r in late:
                self.waiting.remove(r)
            ran = self._step()
            self.waiting.extend(late)
            return ran
        return self._step()

    def _step(self):
        batch = self._prefill_batch() if (self.waiting or self.chunked) else []
        if not batch and not self.running and not self.chunked and self.waiting:
            self.waiting.popleft().rejected = True  # it does not fit an empty replica: SGLang refuses it
            return True
        if batch:
            ms = self.times.prefill_ms([(t, r.prefilled) for r, t in batch])
            if self.unreleased and self.last_end == self.clock and ms > self.times.release_min_ms:  # after a prefill
                self._release(self.clock + self.times.release_share * ms / 1e3)
            self.unreleased = []
            self.last_start = self.clock
            self.clock += ms / 1e3
            self.last_end = self.clock
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
                req.decoded = 1
                self.cache.share(req.hash_ids)
                if not req.first_token_s:
                    req.first_token_s = self.clock
                    if self.times.release_share:
                        self.unreleased.append(req)
                self._finish_or_run(req)
            return True
        self.unreleased = []  # a decode step's launch returns at once: they left as their forward ended
        if not self.running:
            return False
        while self._free() + self.cache.tokens < len(self.running) and len(self.running) > 1:
            self._retract()
        n, d = len(self.running), self.times.decode_ms
        ms = d(n, sum(r.input_len + r.decoded for r in self.running) / n)
        if self.times.longest_row and n > 1:  # at least the longest row's step and what the other rows add
            ms = max(ms, d(1, max(r.input_len + r.decoded for r in self.running)) + (d(n, 0) - d(1, 0)))
        self.last_start = self.clock
        self.clock += ms / 1e3
        self.last_end = self.clock
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

    def _prefill_batch(self):
        """[(request, new tokens)]: the chunked request first, then waiting requests while they fit."""
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
                break
        return batch

    def _release(self, at_s):
        """Move the first token of each request in `unreleased` to `at_s` (s), and the finish of one whose only
        token it was."""
        for req in self.unreleased:
            if req.finish_s == req.first_token_s:
                req.finish_s = at_s
            req.first_token_s = at_s

    def _finish_or_run(self, req):
        if req.decoded >= req.output_len:
            req.finish_s = self.clock
            self.used -= req.held
            req.held = 0
            self.cache.unshare(req.hash_ids)
            self.cache.insert(req.hash_ids)
        else:
            self.running.append(req)

    def _retract(self):
        victim = max(self.running, key=lambda r: r.decoded)
        self.running.remove(victim)
        self.cache.unshare(victim.hash_ids)
        self.used -= victim.held
        victim.prefilled = victim.decoded = victim.held = 0
        victim.retractions += 1
        self.waiting.appendleft(victim)
        self.ratio = INIT_NEW_TOKEN_RATIO

    def _free(self):
        return self.limits.kv_tokens - self.used - self.cache.tokens

    def _take(self, tokens):
        short = tokens - self._free()
        if short > 0:
            self.cache.evict(short)
        self.used += tokens

    def _reserved(self):
        return sum(min(r.output_len - r.decoded, CLIP_MAX_NEW_TOKENS) * self.ratio for r in self.running)


class ReferenceRadixBlocks:
    """The radix cache at block granularity (BLOCK_TOKENS = 512 tokens a block): `blocks`, block id -> None, least
    recently used first."""

    def __init__(self):
        self.blocks = collections.OrderedDict()
        self.live = collections.Counter()  # block id -> running requests whose prefill put it in the tree

    @property
    def tokens(self) -> int:
        """Tokens the cached blocks hold."""
        return len(self.blocks) * BLOCK_TOKENS

    def hit(self, hash_ids: Sequence[int] | None) -> int:
        """Cached prompt tokens: the leading blocks present (touched as used) or live."""
        n = 0
        for h in hash_ids or ():
            if h in self.blocks:
                self.blocks.move_to_end(h)
            elif not self.live[h]:
                break
            n += 1
        return n * BLOCK_TOKENS

    def share(self, hash_ids: Sequence[int] | None) -> None:
        """A running request's prefill is done: its blocks go live (its own tokens, not the cache's)."""
        self.live.update(hash_ids or ())

    def unshare(self, hash_ids: Sequence[int] | None) -> None:
        """That request leaves the running batch."""
        self.live.subtract(hash_ids or ())

    def insert(self, hash_ids: Sequence[int] | None) -> None:
        """Add the blocks, or touch those present: they become the most recently used, in their order."""
        for h in hash_ids or ():
            self.blocks[h] = None
            self.blocks.move_to_end(h)

    def evict(self, tokens: int) -> None:
        """Drop least recently used blocks until `tokens` tokens are freed (whole blocks) or none is left."""
        while tokens > 0 and self.blocks:
            self.blocks.popitem(last=False)
            tokens -= BLOCK_TOKENS
