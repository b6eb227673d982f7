"""A discrete-event simulation of SGLang 0.5.17's scheduler, one DP replica at a time: predicted TTFT, TPOT, E2E and
throughput from a replica's step times.

A reader starts from `sim_reference.py`: the same simulation written plainly, one iteration at a time. This module is
its optimised equivalent and must give the same schedule float for float (tests/test_plan_sim.py).

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
- the radix cache: a request's prompt blocks (Mooncake `hash_ids`, 512 tokens each) already in the tree skip
  prefill: those of every request whose prefill is done, running or finished (SGLang inserts a prompt once its
  prefill forward is done, `maybe_cache_unfinished_req`); a finished request's blocks stay cached, evicted least
  recently used when their tokens are needed;
- the overlap scheduler's look-ahead: the batch that runs after a forward is chosen when that forward starts
  (`Scheduler.event_loop_overlap`), so a request that arrives while a forward runs waits for the iteration after
  the next one, and one that finds the replica idle is taken at once (`ReplicaSim.arrive`);
- the same loop's late release of a prefill's first tokens: it processes a batch's results once it has launched the
  next, so where a prefill follows a prefill, the first tokens of the one before leave `StepTimes.release_share` of
  the way through it where it takes longer than `StepTimes.release_min_ms` (`ReplicaSim._release`).

What it leaves out: the overlap scheduler's CPU time (an iteration lasts its forward; the step times may fold the
host's share in), its look-ahead for what is not an arrival (here a batch is chosen knowing which requests the
forward before it finishes and the KV they free; SGLang's is chosen before that forward's results), mixed chunks,
priorities, retraction of a request mid-prefill and eviction below a block. The tokenizer manager, one process for
all DP replicas, comes after the schedule where its rate is known (`deliver`, from the replicas' `tokens_log`); not
its intake of a burst, nor its garbage collections: on one H200 VM a full collection of its 857K objects stopped it
for 0.38 s in the middle of a burst of 384 short requests, which then reached the scheduler over 0.76-0.78 s in clumps
and saw their first tokens no sooner (`q8_intake128_1gpu_h200`, `q8_intake_gc_1gpu_h200`; SGLang's `/freeze_gc` is
its own remedy, called by no server measured here).

How it runs (an hour-long trace of 12,000 requests under one configuration in about half a second): an iteration
costs O(1) besides the requests it admits, finishes or retracts. Running sums stand for the sums over the running
batch SGLang takes (where an admission comes within 1e-9 of the line, the reserved tokens are summed request by
request as `PrefillAdder` does, so the floats are SGLang's order of operations). The decode steps between two events
(an arrival, an admission, a finish, a retraction) run as a loop over them that asks the step times once per run of
steps of equal time (`StepTimes.decode_run`: the planner's round the context to 32 tokens) and moves the sums once,
the clock by the run's steps at once too, in closed form while it stays in its binade (`_binade`), else a step at a
time (`ReplicaSim._decodes`): the floats are those of one step at a time. DP replicas share nothing: with round-robin
routing each runs through its own requests on its own (`simulate`), unless they step together (SiDP's CaS and auto,
DP attention: `simulate_lockstep`, one `step` per replica per iteration). The radix cache keeps the blocks of a request
that no other request of its replica has (most of a Mooncake prompt's last blocks) as one entry (`PrivateBlocks`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import gc
import heapq
import itertools
import math
import operator
from typing import Callable, Sequence

CLIP_MAX_NEW_TOKENS = 4096
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.7 * 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
BLOCK_TOKENS = 512
_ULP = 2.0 ** -52  # float64's relative spacing at 1: a bound on one addition's relative error (half of it), with room
_TIE = 1e-9  # relative: closer than this to the admission line, the reserved tokens are summed per request
_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS  # per decode step
_round = float.__round__  # round() of a float, without the builtin's lookup of the method (a third of its time)


def _ratios() -> tuple[float, ...]:
    """`new_token_ratio` after 0, 1, 2... decode steps since its reset, decayed one step at a time as `_decode` does
    (the same floats), down to MIN_NEW_TOKEN_RATIO."""
    out = [INIT_NEW_TOKEN_RATIO]
    while out[-1] > MIN_NEW_TOKEN_RATIO:
        out.append(max(MIN_NEW_TOKEN_RATIO, out[-1] - _RATIO_DECAY))
    return tuple(out)


_RATIOS = _ratios()
_RATIO_STEPS = {r: i for i, r in enumerate(_RATIOS)}  # ratio -> decode steps since its reset (it is one of _RATIOS)


@dataclasses.dataclass(slots=True)
class SimRequest:
    """One request: when it arrives (s), its prompt and output lengths (tokens), its prompt blocks (or None).

    Filled by the simulation: `first_token_s`, `finish_s` (absolute seconds), and the bookkeeping fields (a running
    request's `decoded` and `held` are brought up to date when it finishes or is retracted, or `ReplicaSim.running`
    is read).

    Slotted (no `__dict__`): a planning run makes some 200,000 of them (a copy of the trace per configuration) and
    the simulation reads and writes their fields millions of times; slots make both cheaper."""

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
    #: how many of the last `hash_ids` no other request the replica serves has (`private_blocks`): nothing looks them
    #: up once the request inserted them, so the radix cache keeps them as one entry (`RadixBlocks.insert`); 0: none
    private_blocks: int = 0

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
    context) and reuses the result.

    `decode_run(batch, mean context) -> (ms, steps)`, optional, is `decode_ms` and for how many decode steps it
    stays the same as the mean context grows by one token a step (`decode_ms(batch, context + i) == ms` for every
    0 <= i < steps; steps >= 1): step times that round the context (`steps.StepModel`) let the simulation ask once
    per run of equal steps instead of once per step. Where it is given, the simulation calls it instead of
    `decode_ms`.

    `longest_row`: a step of `batch` rows takes at least what one row of the batch's longest context takes, plus what
    the other rows' linears add (`decode_ms(1, longest) + decode_ms(batch, 0) - decode_ms(1, 0)`). SGLang's triton
    decode attention splits each row's KV into a fixed number of parts (`--triton-attention-num-kv-splits`, 8), so a
    few rows leave most of the GPU idle and the longest row sets the step. Measured on one H200 (Qwen3-8B TP1,
    Mooncake replay, `benchmarks/results/plan/validate_1gpu_h200_long_context_2026-11-24/`): served decode steps
    of 2-17 rows of mixed contexts at 128 moments, median -28.4 % from the mean-context step and -1.0 % (p10-p90
    -5.2 % to +2.6 %) from this one (`scripts/plan_mixed_batch_steps.py`). False: the step is
    `decode_ms(batch, mean context)` alone.

    `decide_ms`: the host time from an iteration's start to the choice of the next (`ReplicaSim.arrive`); 0: at its
    start.

    `release_share`: where a prefill forward of more than `release_min_ms` follows another back to back, the share of
    it (0 to 1) that passes before the first tokens the one before sampled reach the tokenizer manager. SGLang's
    overlap scheduler processes a batch's results only once it has launched the next batch
    (`Scheduler.event_loop_overlap`: `run_batch`, then `pop_and_process` of the last), and on a replica of several
    GPUs a prefill's launch returns only when the GPU has run part of it, unless the forward is short enough that
    the host's launch is the slower. 0: every first token leaves as its forward ends (one GPU a replica; see
    `technique.PREFILL_QUEUE_LAYERS`)."""

    def __init__(self, decode_ms: Callable[[int, float], float],
                 prefill_ms: Callable[[Sequence[tuple[int, int]]], float],
                 decode_run: Callable[[int, float], tuple[float, int]] | None = None, longest_row: bool = False,
                 decide_ms: float = 0.0, release_share: float = 0.0,
                 release_min_ms: float = 0.0):
        self.decode_ms, self.prefill_ms, self.decode_run = decode_ms, prefill_ms, decode_run
        self.longest_row = longest_row
        #: ms from an iteration's start to SGLang's choice of the next (its overlap scheduler chooses the next batch
        #: once it has prepared and launched this one): a request that arrives in between still joins the next
        self.decide_ms = decide_ms
        #: the share of a back-to-back prefill forward (of more than `release_min_ms`) run before the last prefill's
        #: first tokens are released
        self.release_share, self.release_min_ms = release_share, release_min_ms


class RadixBlocks:
    """The radix cache at block granularity: block id -> last use, least recently used evicted first.

    `blocks` holds a block id per block, except for a request's private blocks (`SimRequest.private_blocks`), which
    no lookup ever asks for: one entry for all of them, a run (a key of its own -> their ids), which stays in one
    piece in the LRU order since nothing touches its blocks, so evicting from its front is evicting them one by one
    (a planning run on the Mooncake trace inserts and evicts some 4 million blocks, two thirds of them private).
    `size` counts the blocks.

    `live` counts, per block id, the running requests whose prefill has put that block's KV in the tree: SGLang
    inserts a request's prompt once its prefill forward is done (`maybe_cache_unfinished_req` in
    `process_batch_result_prefill`), so a later request finds it while the first still decodes. Those tokens are
    the running request's (`SimRequest.held`), locked, not the cache's: a `hit` counts them, `evict` cannot drop them.
    Left out: SGLang inserts each chunk of a chunked prompt too (here the blocks go live when the whole prompt is
    in), and keeps a block locked while any running request reads it (here, once the request that put it in
    finishes, it is the cache's and may be evicted under another that still reads it).

    `version` counts the changes to the blocks, their order or the live ones, so that a caller can tell that a `hit`
    repeated with nothing changed in between would find the same tokens and leave the cache as it is."""

    def __init__(self):
        #: block id -> None, or a run's key -> its blocks' ids; least recently used first
        self.blocks: collections.OrderedDict[object, tuple[int, ...] | None] = collections.OrderedDict()
        self.size = 0  # blocks held
        self.live: dict[int, int] = {}  # block id -> running requests whose prefill put it in the tree
        self.version = 0

    @property
    def tokens(self) -> int:
        return self.size * BLOCK_TOKENS

    def ids(self) -> list[int]:
        """The blocks' ids, least recently used first (a new list)."""
        return [h for key, run in self.blocks.items() for h in ((key,) if run is None else run)]

    def hit(self, hash_ids: Sequence[int] | None) -> int:
        """Cached prompt tokens: the leading blocks present or live (those present touched as used)."""
        n, blocks, touch, live = 0, self.blocks, self.blocks.move_to_end, self.live
        for h in hash_ids or ():
            if h in blocks:
                touch(h)
            elif h not in live:
                break
            n += 1
        if n:
            self.version += 1
        return n * BLOCK_TOKENS

    def share(self, hash_ids: Sequence[int] | None, private: int = 0) -> None:
        """A running request's prefill is done: its blocks, but the last `private` (which nothing looks up), go live."""
        if not hash_ids:
            return
        live = self.live
        for h in hash_ids[:-private] if private else hash_ids:
            live[h] = live.get(h, 0) + 1
        self.version += 1

    def unshare(self, hash_ids: Sequence[int] | None, private: int = 0) -> None:
        """The request `share` named leaves the running batch (finished, before its `insert`, or retracted)."""
        if not hash_ids:
            return
        live = self.live
        for h in hash_ids[:-private] if private else hash_ids:
            k = live[h] - 1
            if k:
                live[h] = k
            else:
                del live[h]
        self.version += 1

    def insert(self, hash_ids: Sequence[int] | None, private: int = 0) -> None:
        """Add the blocks, or touch those present: they become the most recently used, in their order. The last
        `private` of them (`SimRequest.private_blocks`: not present, and never looked up) go in as one run."""
        if not hash_ids:
            return
        blocks, touch = self.blocks, self.blocks.move_to_end
        entries = len(blocks)
        for h in hash_ids[:-private] if private else hash_ids:
            if h in blocks:
                touch(h)
            else:
                blocks[h] = None  # a new key goes last
        if private:
            blocks[object()] = hash_ids[-private:]
        self.size += len(blocks) - entries + (private - 1 if private else 0)
        self.version += 1

    def evict(self, tokens: int) -> None:
        """Drop the least recently used blocks that hold `tokens` (all of them if they hold fewer)."""
        if tokens <= 0 or not self.size:
            return
        self.version += 1
        k = -(-tokens // BLOCK_TOKENS)  # ceil(tokens / BLOCK_TOKENS) blocks
        if k > self.size:
            k = self.size
        self.size -= k
        blocks = self.blocks
        pop = blocks.popitem
        while k:
            key, run = pop(False)  # the least recently used
            if run is None:
                k -= 1
            elif len(run) <= k:
                k -= len(run)
            else:  # the run's first k blocks: the rest stays least recently used
                blocks[key] = run[k:]
                blocks.move_to_end(key, last=False)
                k = 0


def _binade(clock: float) -> tuple[float, float, float]:
    """(low, room, u): the binade [low, 2 low) of floats that holds `clock` (s), u the spacing of its floats (its ulp),
    and room = 2 low - 16 u; (inf, -inf, 0) below 2^-1000 s (no closed form there).

    Within a binade, k decode steps of dt >= 0 s each add up in closed form to the float that adding dt k times, one
    step at a time, gives (`_decodes` moves the clock by a run of equal steps so: a few operations instead of k
    additions, some 8 million of them in a planning run). The clock is X u (X a whole number) and dt = q u: the exact
    sum X u + dt, if below 2 low, lies between floats u apart and rounds to the nearer, (X + d) u with d = round(q),
    unless q is a whole number and a half (a tie, which rounds to the even float: left to the additions). So after k
    steps the clock is clock + k d u, exactly (a whole number of u below 2 low, k d below 2^52), as long as every
    exact sum on the way stays below 2 low - u / 2, where the floats are still u apart: the last and largest is at
    most clock + k dt + (k - 1) u / 2 < clock + k (dt + u), which a float test `clock + k * (dt + u) < room` bounds
    below 2 low - 13 u (its three roundings are within 3 u)."""
    if not clock >= 2.0 ** -1000:  # (normal floats only, well away from the bottom of the range)
        return math.inf, -math.inf, 0.0
    u = math.ulp(clock)
    low = u * 2.0 ** 52
    return low, 2.0 * low - 16.0 * u, u


class ReplicaSim:
    """One DP replica: its queue, running batch, KV cache and clock.

    Args:
        limits: `ReplicaLimits`.
        times: `StepTimes`.
        log_tokens: keep `tokens_log`, when its tokens were sampled (`deliver` needs it).

    Every iteration costs O(1) besides the requests it admits, finishes or retracts: the running batch's sums
    (contexts, remaining outputs clipped at 4,096) are kept up to date, the running requests' `decoded` and `held`
    are written when they finish, are retracted or `running` is read, and a waiting request that did not fit is not
    looked up in the radix cache again while the cache is unchanged. `step` runs one iteration; `advance` runs them
    up to a time, the decode steps between two events many at a time (`_decodes`, `_quiet_decodes`).
    """

    def __init__(self, limits: ReplicaLimits, times: StepTimes, log_tokens: bool = False):
        self.limits, self.times = limits, times
        #: with `log_tokens`: (start s, end s, tokens) of every forward's sampled tokens, a run of decode steps as one
        #: entry (its tokens spread evenly over it), for `deliver`; else None
        self.tokens_log: list[tuple[float, float, int]] | None = [] if log_tokens else None
        self.clock = 0.0
        #: seconds of prefill forwards run, and of waiting idle for an arrival: the rest of `clock` is decode steps
        #: (`busy_s`)
        self.prefill_s = self.idle_s = 0.0
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.chunked: SimRequest | None = None
        self.cache = RadixBlocks()
        self.used = 0  # KV tokens held by running (and chunked) requests
        self.ratio = INIT_NEW_TOKEN_RATIO
        self._prefills = self._decodes_run = 0  # iterations run (`iterations`)
        # join number -> (running request, the decode step count at which its `decoded` and `held` were last brought
        # up to date: every decode step adds one to both, for every running request, so they are written when read),
        # in the order they joined
        self._running: dict[int, tuple[SimRequest, int]] = {}
        self._joins = 0  # join numbers handed out
        self._steps = 0  # decode steps run
        self._ctx_sum = 0  # tokens: sum of the running requests' input_len + decoded
        self._out_sum = 0  # tokens: sum of the running requests' min(output_len - decoded, CLIP_MAX_NEW_TOKENS)
        self._clipped = 0  # running requests with more than CLIP_MAX_NEW_TOKENS output tokens left
        self._finish: list[tuple[int, int]] = []  # heap of (decode step after which it finishes, join number)
        self._unclip: list[tuple[int, int]] = []  # heap of (decode step after which CLIP are left, join number)
        self._hit_memo: tuple[SimRequest, int, int] | None = None  # (request, cache version after its hit, tokens)
        self._decode_memo: dict[tuple[int, float], float] = {}  # (batch, mean context) -> decode_ms
        self._binade = _binade(self.clock)  # the clock's binade, as `_decodes` last saw it (`_binade`)
        self._longest: list[tuple[int, int]] = []  # heap of (-(context - decode steps run), join number) (`_top`)
        self.decided_s = -math.inf  # when SGLang's scheduler chose the iteration that starts at `clock` (`arrive`)
        self._decide_s = times.decide_ms / 1e3  # from an iteration's start to the choice of the next (`StepTimes`)
        #: the requests whose first token the last prefill sampled, the clock at its end and its `tokens_log` entry's
        #: index: released into the next forward where that is a prefill right after it (`_release`)
        self._unreleased: tuple[list[SimRequest], float, int] = ([], -math.inf, -1)
        # (batch, total context, longest context) -> (ms, steps): the decode step's time and for how many steps it
        # stays the same (`StepTimes.longest_row`)
        self._decode_run = self._step_run(times.decode_run or self._decode_one, times.longest_row)

    @property
    def iterations(self) -> collections.Counter:
        """Iterations run, by kind: "prefill", "decode" (a new Counter, without kinds not run)."""
        return +collections.Counter(prefill=self._prefills, decode=self._decodes_run)

    @property
    def running(self) -> list[SimRequest]:
        """The running requests, in the order they joined the batch (a new list; its `decoded` and `held` up to
        date)."""
        running, steps = self._running, self._steps
        for j, (req, since) in running.items():
            req.decoded += steps - since
            req.held += steps - since
            running[j] = (req, steps)
        return [req for req, _ in running.values()]

    # ------------------------------------------------------------------ KV
    # A forward takes its tokens from the free pool (kv_tokens - used - cached blocks' tokens), evicting cached blocks
    # where that is short: `short = tokens - free; if short > 0: cache.evict(short); used += tokens`, written out
    # where it runs. Takes with no lookup or insert between them evict as one take of their sum: each eviction drops
    # the least recently used ceil(short / BLOCK_TOKENS) blocks, leaving 0 to BLOCK_TOKENS - 1 tokens free, so k takes
    # drop the oldest ceil((their tokens - free) / BLOCK_TOKENS) blocks in all (or every block, if there are fewer),
    # the blocks one eviction of their tokens - free drops. (Free may be below 0 after an insert, the finished
    # request's blocks counted in tokens it did not hold: no take, no eviction, and the next take's covers it.)
    def _reserved(self) -> float:
        """The running requests' reserved decode tokens, summed one request at a time as `PrefillAdder` does."""
        return sum(min(r.output_len - r.decoded, CLIP_MAX_NEW_TOKENS) * self.ratio for r in self.running)

    # ------------------------------------------------------------------ running batch
    # (a request joins the batch at the end of its prefill, in `_prefill`)
    def _leave(self, j: int) -> SimRequest:
        """Take running request `j` out of the batch and its sums, its `decoded` and `held` up to date."""
        req, since = self._running.pop(j)
        req.decoded += self._steps - since
        req.held += self._steps - since
        self._ctx_sum -= req.input_len + req.decoded
        left = req.output_len - req.decoded
        if left > CLIP_MAX_NEW_TOKENS:
            self._out_sum -= CLIP_MAX_NEW_TOKENS
            self._clipped -= 1
        else:
            self._out_sum -= left
        return req

    # ------------------------------------------------------------------ iterations
    def _admission_need(self, req: SimRequest) -> int:
        """KV tokens `req` needs to be admitted: its uncached prompt + min(output, 4,096) + 1 (its cached prefix looked
        up, and set as its `cached` and `prefilled`).

        The lookup is `self.cache.hit(req.hash_ids)`, but a repeat for the same request with the cache unchanged
        since is skipped (it would find the same blocks and leave their order as it is)."""
        memo, cache = self._hit_memo, self.cache
        if memo is not None and memo[0] is req and memo[1] == cache.version:
            tokens = memo[2]
        else:
            tokens = cache.hit(req.hash_ids)
            self._hit_memo = (req, cache.version, tokens)
        # (comparisons, not min(): a builtin call costs several times more, and this runs for every admission)
        cached = req.cached = req.prefilled = tokens if tokens < req.input_len - 1 else req.input_len - 1
        out = req.output_len
        return req.input_len - cached + (out if out < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS) + 1

    def _prefill_batch(self) -> list[tuple[SimRequest, int]]:
        """(request, new tokens) of the next prefill batch, admitted as `PrefillAdder` does; [] if none fits."""
        limits, chunked = self.limits, self.chunked
        chunk, budget = limits.chunked_prefill, limits.max_prefill_tokens
        room = limits.max_running - len(self._running)  # requests the batch may take
        if room <= 0 or chunk <= 0 or budget <= 0:
            return []
        batch = []
        if chunked is not None:  # the chunked prompt goes on first, admitted already
            take = chunked.input_len - chunked.prefilled
            if take >= chunk:
                return [(chunked, chunk)]  # still chunked (or just done), last in its batch
            batch.append((chunked, take))
            chunk -= take
            budget -= take
        base = limits.kv_tokens - self.used  # free + evictable KV tokens
        reserved = self.ratio * self._out_sum
        # rem_total as PrefillAdder computes it, but with the reserved tokens as one product instead of a sum of one
        # product per running request: they differ in the last bits only, so where an admission is that close to
        # the line the per-request sum is taken and the admissions so far are replayed on it.
        rem_total, margin = base - reserved, _TIE * (abs(base) + reserved + 1.0)
        for req in self.waiting:
            if len(batch) >= room or chunk <= 0 or budget <= 0:
                break
            need = self._admission_need(req)
            if abs(need - rem_total) <= margin:  # (once replayed, margin is -1: no more)
                rem_total, margin = base - self._reserved(), -1.0
                for r, _ in batch:
                    if r is not chunked:  # its need, as `_admission_need` computed it
                        rem_total -= r.input_len - r.cached + min(r.output_len, CLIP_MAX_NEW_TOKENS) + 1
            if need >= rem_total:
                break
            rem_total -= need
            left = req.input_len - req.prefilled
            if left > chunk:
                batch.append((req, chunk))
                break  # one chunked request at a time, last in its batch
            batch.append((req, left))
            chunk -= left
            budget -= left
        return batch

    def step(self) -> bool:
        """Run one iteration at the current clock; False when there was nothing to run."""
        batch = self._prefill_batch() if (self.waiting or self.chunked) else []
        if batch:
            self._prefill(batch)
            return True
        if not self._running:
            if self.chunked or not self.waiting:
                return False
            self.waiting.popleft().rejected = True  # it can never fit, even alone
            return True
        self._decode()
        return True

    def _prefill(self, batch: list[tuple[SimRequest, int]]) -> None:
        """Run the prefill forward of `batch` (`_prefill_batch`'s); a request whose prompt it completes samples its
        first token and joins the running batch (its sums and heaps), or finishes there with a one-token output.

        (The replica's KV count is kept in a local through the loop, and the join written out, not a method of its
        own: this runs for some 150,000 batches a planning run.)"""
        ms = self.times.prefill_ms([(t, r.prefilled) for r, t in batch])
        share = self.times.release_share
        if share and self._unreleased[1] == self.clock and ms > self.times.release_min_ms:
            self._release(self.clock + share * ms / 1e3)
        clock = self.clock = self.clock + ms / 1e3
        self.prefill_s += ms / 1e3
        self._prefills += 1
        chunked, self.chunked = self.chunked, None
        kv, cache, waiting, running = self.limits.kv_tokens, self.cache, self.waiting, self._running
        steps, used, first_tokens, unreleased = self._steps, self.used, 0, []
        # the free tokens, and the tokens taken since, whose evictions are made as one (see KV above)
        free, taken = kv - used - cache.size * BLOCK_TOKENS, 0
        for req, take in batch:
            if req is not chunked:
                waiting.popleft()  # the batch's waiting requests are the head of the queue, in order
            taken += take  # take `take` tokens
            used += take
            req.held += take
            prefilled = req.prefilled = req.prefilled + take
            if prefilled < req.input_len:
                self.chunked = req
                continue
            req.decoded = 1  # the prefill forward samples the first token
            first_tokens += 1
            cache.share(req.hash_ids, req.private_blocks)  # its prompt is in the tree (`RadixBlocks.live`)
            if not req.first_token_s:
                req.first_token_s = clock
                if share:
                    unreleased.append(req)
            if req.output_len <= 1:
                if taken > free:  # the takes' evictions, before its blocks go in
                    cache.evict(taken - free)
                self.used = used
                self._finished(req)
                used = self.used
                free, taken = kv - used - cache.size * BLOCK_TOKENS, 0
                continue
            j = self._joins  # it joins the running batch, `decoded` 1
            self._joins = j + 1
            running[j] = (req, steps)
            heapq.heappush(self._longest, (steps - req.input_len - 1, j))
            self._ctx_sum += req.input_len + 1
            left = req.output_len - 1
            if left > CLIP_MAX_NEW_TOKENS:
                self._out_sum += CLIP_MAX_NEW_TOKENS
                self._clipped += 1
                heapq.heappush(self._unclip, (steps + left - CLIP_MAX_NEW_TOKENS, j))
            else:
                self._out_sum += left
            heapq.heappush(self._finish, (steps + left, j))
        if taken and taken > free:  # (none since a finish: its insert may leave fewer free tokens than 0)
            cache.evict(taken - free)
        self.used = used
        if first_tokens and self.tokens_log is not None:
            self.tokens_log.append((clock, clock, first_tokens))
        if share:
            self._unreleased = (unreleased, clock, len(self.tokens_log) - 1 if self.tokens_log and first_tokens else -1)

    def _release(self, at_s: float) -> None:
        """Move the first token of each request the last prefill sampled (`_unreleased`) to `at_s` (s), the finish
        of one whose only token it was, and their `tokens_log` entry (`StepTimes.release_share`)."""
        reqs, _, entry = self._unreleased
        for req in reqs:
            if req.finish_s == req.first_token_s:
                req.finish_s = at_s
            req.first_token_s = at_s
        if entry >= 0:
            self.tokens_log[entry] = (at_s, at_s, self.tokens_log[entry][2])
        self._unreleased = ([], -math.inf, -1)

    @staticmethod
    def _step_run(run: Callable[[int, float], tuple[float, int]], longest_row: bool):
        """`_decode_run(n, total, longest) -> (ms, steps)`: the decode step of `n` rows whose contexts add up to `total`
        tokens, the longest of `longest`, and for how many steps it stays the same (every context growing by a token
        a step), from `run(batch, mean context)` (`StepTimes.decode_run`, or `_decode_one`): with `longest_row` at
        least the longest row's step (`StepTimes.longest_row`), for the steps both stay the same.

        `run` is asked again only where its last answer does not say: it promises `decode_ms(batch, mean + i) == ms`
        for every 0 <= i < steps, so its last answer for the mean holds for `n` rows of `first + i x n` tokens in all
        and its last answer for the longest row for a longest context of `first + i` tokens, i below its steps (the
        steps move both along their runs, and a run of equal steps ends where either side's run does: half the asks
        of a planning run were of the side whose run went on)."""
        mean_run = [0, 0, 0, 0.0]  # the mean's last answer: [n, first total, end total, ms]

        def plain(n: int, total: int, longest: int) -> tuple[float, int]:
            n_was, first, end, ms = mean_run
            if n == n_was and first <= total < end and not (total - first) % n:
                return ms, (end - total) // n
            ms, steps = run(n, total / n)
            mean_run[:] = n, total, total + steps * n, ms
            return ms, steps

        if not longest_row:
            return plain
        rows = {}  # batch -> what its other rows add: decode_ms(n, 0) - decode_ms(1, 0)
        long_run = [0, 0, 0.0]  # the longest row's last answer: [first context, end context, ms]

        def floored(n: int, total: int, longest: int) -> tuple[float, int]:
            n_was, first, end, ms = mean_run  # `plain`, written out (it runs half a million times a planning run)
            if n == n_was and first <= total < end and not (total - first) % n:
                steps = (end - total) // n
            else:
                ms, steps = run(n, total / n)
                mean_run[:] = n, total, total + steps * n, ms
            if n == 1:
                return ms, steps
            extra = rows.get(n)
            if extra is None:
                extra = rows[n] = run(n, 0)[0] - run(1, 0)[0]
            first, end, one = long_run
            if first <= longest < end:
                one_steps = end - longest
            else:
                one, one_steps = run(1, longest)
                long_run[:] = longest, longest + one_steps, one
            one += extra
            return (one if one > ms else ms), (one_steps if one_steps < steps else steps)
        return floored

    def _top(self) -> int:
        """The running requests' largest context less the decode steps run (their contexts grow together): the top
        of `_longest`, whose entries of requests gone are dropped on the way; 0 if none runs."""
        heap, running = self._longest, self._running
        while heap and heap[0][1] not in running:
            heapq.heappop(heap)
        return -heap[0][0] if heap else 0

    def _decode_one(self, n: int, ctx: float) -> tuple[float, int]:
        """(`decode_ms(n, ctx)`, 1), each (batch, mean context) asked once: `_decode_run` of step times without
        `decode_run`."""
        key = (n, ctx)
        ms = self._decode_memo.get(key)
        if ms is None:
            ms = self._decode_memo[key] = self.times.decode_ms(n, ctx)
        return ms, 1

    def _decode(self, ms: float | None = None) -> None:
        """One decode step of every running request (retracting first where the KV cache is short); `ms`, if given,
        its time for the running batch as it is."""
        running = self._running
        while self.limits.kv_tokens - self.used < len(running) and len(running) > 1:
            self._retract()  # fewer free and evictable tokens than running requests
            ms = None
        n, steps, ctx_sum = len(running), self._steps, self._ctx_sum
        if ms is None:
            ms = self._decode_run(n, ctx_sum, self._top() + steps)[0]
        self.clock += ms / 1e3
        if self.tokens_log is not None:
            self.tokens_log.append((self.clock - ms / 1e3, self.clock, n))
        self._decodes_run += 1
        short = n - (self.limits.kv_tokens - self.used - self.cache.size * BLOCK_TOKENS)  # take n tokens
        if short > 0:
            self.cache.evict(short)
        self.used += n
        steps = self._steps = steps + 1
        self._ctx_sum = ctx_sum + n
        self._out_sum -= n - self._clipped  # a request with more than CLIP output tokens left reserves CLIP still
        if self._unclip and self._unclip[0][0] <= steps:
            self._pop_unclipped()
        finish = self._finish
        while finish and finish[0][0] <= steps:
            j = heapq.heappop(finish)[1]
            if j in running:  # else retracted since
                self._finished(self._leave(j))
        self.ratio = max(MIN_NEW_TOKEN_RATIO, self.ratio - _RATIO_DECAY)

    def _pop_unclipped(self) -> None:
        """Count out of `_clipped` the running requests left with CLIP_MAX_NEW_TOKENS output tokens by now."""
        while self._unclip and self._unclip[0][0] <= self._steps:
            if heapq.heappop(self._unclip)[1] in self._running:  # else finished or retracted since
                self._clipped -= 1

    def _finished(self, req: SimRequest) -> None:
        req.finish_s = self.clock
        self.used -= req.held
        req.held = 0
        self.cache.unshare(req.hash_ids, req.private_blocks)
        self.cache.insert(req.hash_ids, req.private_blocks)  # its prompt blocks stay cached (evictable)

    def _retract(self) -> None:
        """Send the running request with the most output (the first of them to join) back to the queue."""
        steps = self._steps
        j = max(self._running, key=lambda k: self._running[k][0].decoded + steps - self._running[k][1])
        victim = self._leave(j)
        self.cache.unshare(victim.hash_ids, victim.private_blocks)
        self.used -= victim.held
        victim.prefilled = victim.decoded = victim.held = 0
        victim.retractions += 1
        self.waiting.appendleft(victim)
        self.ratio = INIT_NEW_TOKEN_RATIO

    def load(self) -> tuple[int, int]:
        """(tokens, requests) as this replica's SGLang scheduler reports them to the DP controller (`LoadSnapshot.
        num_total_tokens`: KV tokens in use plus the waiting requests' prompts; running plus waiting requests)."""
        chunked = [self.chunked] if self.chunked is not None and self.chunked not in self.waiting else []
        tokens = self.used + sum(r.input_len for r in self.waiting)
        return tokens, len(self._running) + len(self.waiting) + len(chunked)

    def arrive(self, req: SimRequest) -> None:
        """Queue `req` once this replica has run every iteration SGLang's scheduler chose before `req` arrived.

        SGLang 0.5.17's overlap scheduler (`Scheduler.event_loop_overlap`) chooses and launches the next batch before
        it waits for the current forward's results, so the batch that runs after a forward is chosen when that forward
        starts. A request that arrives while a forward runs is first scheduled in the iteration after the next one
        (the next one runs without it); one that arrives while the replica has nothing to run is scheduled at once.
        The choice comes `StepTimes.decide_ms` after the forward's start (the host prepares and launches it first):
        the iterations chosen before `a` are those that start before `a` less that, and the one after them.
        `decided_s` keeps when the iteration at `clock` was chosen where that matters: `decide_ms` after the start of
        the iteration before it (any time before the arrival will do), or when an arrival found the replica idle."""
        a, decide = req.arrival_s, self._decide_s
        if self.clock < a:
            self.advance(a - decide)
        if not (self.waiting or self._running or self.chunked):  # idle: taken at `a`, or as the last forward ends
            if self.clock < a:
                self.idle_s += a - self.clock
                self.clock = a
            self.decided_s = self.clock
        elif self.decided_s < a:  # the iteration at `clock` was chosen before `a`
            start = self.clock
            while self.clock <= start and self.step():  # it runs without `req` (after any rejection: no time)
                pass
            self.decided_s = start + decide
        self.waiting.append(req)

    def advance(self, until_s: float = math.inf) -> None:
        """Run every iteration that starts before `until_s` (s, on this replica's clock), or until there is nothing
        left to run.

        Every iteration runs as `step` would run it. Where no prefill can run, decode steps run many at a time:
        `_decodes` while no request may be admitted (none waits, or there is no room for one), `_quiet_decodes` while
        the head of the queue waits for KV tokens (the steps that finish or retract requests through `_decode`)."""
        limits, running = self.limits, self._running
        kv, max_running = limits.kv_tokens, limits.max_running
        prefills = limits.chunked_prefill > 0 and limits.max_prefill_tokens > 0
        chunk = limits.chunked_prefill
        while self.clock < until_s:
            n = len(running)
            chunked = self.chunked
            if chunked and n < max_running and prefills and chunked.input_len - chunked.prefilled > chunk:
                self._chunks(until_s)  # the chunked prompt's next chunk alone, not its last
            elif not n or (chunked and n < max_running and prefills):  # a prefill, a rejection, or nothing to run
                if not (self.waiting or running or self.chunked) or not self.step():
                    return
            elif self.waiting and n < max_running and prefills:  # the head of the queue may be admitted
                batch = self._prefill_batch()  # [] where the head of the queue waits (`step` would decode)
                if batch:
                    self._prefill(batch)
                elif n > kv - self.used or self._finish[0][0] <= self._steps + 1:  # retracts or finishes a request
                    self._decode()
                else:
                    self._quiet_decodes(until_s)
            else:
                self._decodes(until_s)

    def _chunks(self, until_s: float) -> None:
        """`advance`'s iterations from the next one while each is a prefill of the chunked prompt's next chunk alone,
        not its last (`_prefill_batch` gives [(chunked, chunked_prefill)] while more than a chunk of it is left,
        whoever waits): up to `until_s`. What `_prefill` does with such a batch, in one loop over the chunks of a
        long prompt (half the prefills of a planning run on the Mooncake trace) instead of a round of `advance`,
        `step`, `_prefill_batch` and `_prefill` for each."""
        req, chunk, kv, cache = self.chunked, self.limits.chunked_prefill, self.limits.kv_tokens, self.cache
        prefill_ms, share, min_ms = self.times.prefill_ms, self.times.release_share, self.times.release_min_ms
        clock, used, ran = self.clock, self.used, 0
        start = clock
        while clock < until_s and req.input_len - req.prefilled > chunk:
            ms = prefill_ms([(chunk, req.prefilled)])
            if share and self._unreleased[1] == clock and ms > min_ms:  # the first chunk, right after a prefill
                self._release(clock + share * ms / 1e3)
            clock += ms / 1e3
            used += chunk  # take `chunk` tokens (the takes' evictions as one, below: see KV above)
            req.held += chunk
            req.prefilled += chunk
            ran += 1
        short = used - self.used - (kv - self.used - cache.size * BLOCK_TOKENS)
        if ran and short > 0:
            cache.evict(short)
        self.prefill_s += clock - start
        self.clock, self.used = clock, used
        self._prefills += ran

    def busy_s(self) -> dict[str, float]:
        """Seconds of forwards run so far, {"extend": prefills, "decode": decode steps} (SGLang's categories of
        `sglang:forward_execution_seconds_total`), for a replica not in lockstep (in `simulate_lockstep` a replica's
        clock also waits for the others)."""
        return {"extend": self.prefill_s, "decode": self.clock - self.prefill_s - self.idle_s}

    def _decodes(self, until_s: float) -> None:
        """`advance`'s iterations from the next one while they are decode steps and no request may be admitted (none
        waiting, or no room for one): up to `until_s`, or until a prefill may run (a finish made room for a waiting
        request, a retraction queued one) or nothing runs.

        What `_decode` does, step after step, in one loop that keeps the replica's sums in locals (written back on
        the way out): from one step that finishes a request to the next, the steps in between (quiet: they admit,
        finish and retract nothing) run as a pass per run of equal step times (`_decode_run`), their sums moved by
        whole steps at its end; a step that finishes requests runs as `_decode` runs it (`_leave` and `_finished`
        written out); one that retracts goes through `_decode` itself.

        The clock ends each run where `_decode`'s additions of each step's time, one at a time, would leave it (in
        closed form while it stays in its binade, `_binade`; else one addition per step, in C), and the ratio is
        `_RATIOS`' entry for the steps since its reset, so the floats are `_decode`'s. The quiet steps' evictions and the next
        finishing step's are made at once: each step evicts the least recently used blocks that cover what the free
        tokens lack for it (`ceil(short / BLOCK_TOKENS)`), and with no lookup or insert in between, that is the
        oldest ceil((k x n - free) / BLOCK_TOKENS) blocks for k steps, as one eviction of k x n - free tokens takes."""
        limits, running, waiting, cache = self.limits, self._running, self.waiting, self.cache
        kv, max_running = limits.kv_tokens, limits.max_running
        prefills = limits.chunked_prefill > 0 and limits.max_prefill_tokens > 0
        finish, unclip, decode_run, heappop = self._finish, self._unclip, self._decode_run, heapq.heappop
        reduce, add, repeat, log = functools.reduce, operator.add, itertools.repeat, self.tokens_log
        last_ratio = len(_RATIOS) - 1
        clock, used, steps, ctx_sum, out, clipped = (self.clock, self.used, self._steps, self._ctx_sum, self._out_sum,
                                                     self._clipped)
        decays, ran = _RATIO_STEPS[self.ratio], 0  # decode steps since the ratio's reset; run here
        low, room, u = self._binade
        while clock < until_s:
            n = len(running)
            if not n or ((self.chunked or waiting) and n < max_running and prefills):
                break
            if n > kv - used:  # retracts first: through `_decode`, the sums written back and read again
                self.clock, self.used, self._steps, self._ctx_sum, self._out_sum, self._clipped = (
                    clock, used, steps, ctx_sum, out, clipped)
                self.ratio = _RATIOS[decays if decays < last_ratio else last_ratio]
                self._decode()
                clock, used, steps, ctx_sum, out, clipped = (self.clock, self.used, self._steps, self._ctx_sum,
                                                             self._out_sum, self._clipped)
                decays = _RATIO_STEPS[self.ratio]  # (`_decode` counted its iteration)
                continue
            top = self._top()  # the longest row's context less `steps`, until a request finishes
            # quiet steps, up to the step after which a request finishes or comes down to CLIP_MAX_NEW_TOKENS output
            # tokens left (the heaps' first entries), the last one the KV pool covers without retracting, until_s
            # (comparisons, not min(): a builtin call costs several times more, and this runs for every event)
            limit, covered = finish[0][0] - steps - 1, (kv - used - n) // n + 1
            if covered < limit:
                limit = covered
            if unclip and unclip[0][0] - steps < limit:
                limit = unclip[0][0] - steps
            done, run_end, free, start = 0, 0, kv - used - cache.size * BLOCK_TOKENS, clock
            while done < limit and clock < until_s:  # a pass per run of equal step times
                ms, run = decode_run(n, ctx_sum + done * n, top + steps + done)
                dt, run_end = ms / 1e3, done + run
                last = run_end if run_end < limit else limit
                k = last - done  # the pass's steps
                if (clock + k * dt) * (1.0 + (k + 4) * _ULP) < until_s:
                    # no step of the run reaches until_s (each sum is within (steps) x ulp of the exact one): the
                    # floats of its k additions, in closed form while the clock stays in its binade (`_binade`), else
                    # one addition at a time, in C (and the binade looked up again once the clock has left it)
                    done = last
                    if low <= clock and 0.0 <= dt and clock + k * (dt + u) < room:
                        q = dt / u
                        d = _round(q)  # each step adds d u: dt rounded to the clock's spacing u (unless on a tie)
                        if q - d != 0.5 and d - q != 0.5:
                            clock += k * d * u
                            continue
                    clock = reduce(add, repeat(dt, k), clock)
                    if not low <= clock < room:
                        low, room, u = self._binade = _binade(clock)
                    continue
                for done in range(done + 1, last + 1):
                    clock += dt
                    if clock >= until_s:
                        break
            if done:
                used += done * n
                steps += done
                ctx_sum += done * n
                out -= done * (n - clipped)  # a request with more than CLIP output tokens left reserves CLIP still
                decays += done
                ran += done
                while unclip and unclip[0][0] <= steps:  # `_pop_unclipped`
                    if heappop(unclip)[1] in running:
                        clipped -= 1
            # next, unless it is time, more quiet steps come first (an unclip) or a retraction: the step after which
            # a request finishes (or a retracted one's entry is dropped)
            finishing = clock < until_s and finish[0][0] <= steps + 1 and n <= kv - used
            if (done + finishing) * n > free:  # the steps' evictions (see above)
                cache.evict((done + finishing) * n - free)
            if not finishing:
                if log is not None and done:
                    log.append((start, clock, done * n))
                continue
            if not (done and done < run_end):  # (else it is in the run of equal times the quiet steps were in)
                ms = decode_run(n, ctx_sum, top + steps)[0]
            clock += ms / 1e3
            if log is not None:
                log.append((start, clock, (done + 1) * n))
            used += n
            steps += 1
            ctx_sum += n
            out -= n - clipped
            decays += 1
            ran += 1
            while unclip and unclip[0][0] <= steps:  # `_pop_unclipped`
                if heappop(unclip)[1] in running:
                    clipped -= 1
            while finish and finish[0][0] <= steps:
                j = heappop(finish)[1]
                if j not in running:  # retracted since
                    continue
                req, since = running.pop(j)  # `_leave`
                req.decoded += steps - since
                req.held += steps - since
                ctx_sum -= req.input_len + req.decoded
                left = req.output_len - req.decoded
                if left > CLIP_MAX_NEW_TOKENS:
                    out -= CLIP_MAX_NEW_TOKENS
                    clipped -= 1
                else:
                    out -= left
                req.finish_s = clock  # `_finished`
                used -= req.held
                req.held = 0
                cache.unshare(req.hash_ids, req.private_blocks)
                cache.insert(req.hash_ids, req.private_blocks)
        self.clock, self.used, self._steps, self._ctx_sum, self._out_sum, self._clipped = (
            clock, used, steps, ctx_sum, out, clipped)
        self.ratio = _RATIOS[decays if decays < last_ratio else last_ratio]
        self._decodes_run += ran

    def _quiet_decodes(self, until_s: float) -> None:
        """Decode steps that admit, finish and retract nothing while the head of the queue waits for KV tokens (with
        room for it in the batch), from the next one, which `advance` found to be one: what `_decode` would do, step
        after step (evicting cached blocks where the free tokens fall short), without its checks.

        They run up to the first of: the step after which a request finishes or comes down to CLIP_MAX_NEW_TOKENS
        output tokens left (the heaps' first entries); the last step the free and evictable KV tokens cover without
        retracting; a clock at or past `until_s`; a step before which the head of the queue fits (`_prefill_batch`'s
        test of the head, redone before each step from the running sums, the head looked up in the cache again
        after an eviction, as `_prefill_batch` would; a test within the tie margin stops them too, for `advance` to
        decide exactly). The floats are `_decode`'s, as in `_decodes`."""
        n, steps, kv, cache = len(self._running), self._steps, self.limits.kv_tokens, self.cache
        used, ctx_sum, out = self.used, self._ctx_sum, self._out_sum
        limit = min(self._finish[0][0] - steps - 1,  # a request finishes after step limit + 1
                    (kv - used - n) // n + 1)  # the KV pool, free and evictable, covers `limit` steps
        if self._unclip:
            limit = min(limit, self._unclip[0][0] - steps)  # ends on the step after which it is popped
        dec = n - self._clipped  # reserved tokens one step takes off `_out_sum`
        since_reset, last_ratio = _RATIO_STEPS[self.ratio], len(_RATIOS) - 1
        free = kv - used - cache.size * BLOCK_TOKENS  # free tokens before the next step
        head = self.waiting[0]
        need, version = self._admission_need(head), cache.version
        clock, done, run, top = self.clock, 0, 0, self._top()  # run: steps left at the decode time `dt`
        while done < limit and clock < until_s:
            if done:  # `_prefill_batch`'s test of the head (`advance` ran it before the first step)
                if cache.version != version:  # evicted since the head's lookup
                    need, version = self._admission_need(head), cache.version
                base = kv - (used + done * n)
                decays = since_reset + done
                reserved = _RATIOS[decays if decays < last_ratio else last_ratio] * (out - done * dec)
                rem_total = base - reserved
                if need < rem_total or abs(need - rem_total) <= _TIE * (abs(base) + reserved + 1.0):
                    break
            if free < n:  # as a step taking its tokens evicts
                cache.evict(n - free)
                free = kv - (used + done * n) - cache.size * BLOCK_TOKENS
            if not run:
                ms, run = self._decode_run(n, ctx_sum + done * n, top + steps + done)
                dt = ms / 1e3
            clock += dt
            done += 1
            run -= 1
            free -= n
        if self.tokens_log is not None and done:
            self.tokens_log.append((self.clock, clock, done * n))
        self.clock, self.ratio = clock, _RATIOS[min(since_reset + done, last_ratio)]
        self._decodes_run += done
        self.used = used + done * n
        self._steps = steps + done
        self._ctx_sum = ctx_sum + done * n
        self._out_sum = out - done * dec
        if self._unclip and self._unclip[0][0] <= self._steps:
            self._pop_unclipped()


def simulate(requests: Sequence[SimRequest], replicas: Sequence[ReplicaSim],
             route: Callable[[SimRequest, Sequence[ReplicaSim]], int] | None = None,
             lockstep: bool = False) -> Sequence[SimRequest]:
    """Run `requests` (sorted by arrival) through `replicas` (SGLang's DP replicas) until every one finished; each
    request goes to `route(request, replicas)` at its arrival (default: round robin, SGLang's default). Returns the
    requests with their times filled in.

    A request is routed once every replica has run each iteration that starts before it arrives, and queued once its
    replica has run the iterations chosen before it arrived (`ReplicaSim.arrive`: a `route` that reads the replicas'
    state sees that replica after the iteration that runs without the request); replicas share nothing else, so
    each runs on its own between arrivals. Round robin reads no replica's state: there each replica runs through its
    own requests on its own, one replica after the other (running a replica up to an arrival that is not its own and
    on from there is the same as running it on without stopping).

    With `lockstep` the replicas step together (`simulate_lockstep`).

    Python's cyclic garbage collector is paused while it runs (`no_cycle_collection`)."""
    with no_cycle_collection():
        if lockstep:
            return simulate_lockstep(requests, replicas, route)
        return _simulate(requests, replicas, route)


def simulate_lockstep(requests: Sequence[SimRequest], replicas: Sequence[ReplicaSim],
                      route: Callable[[SimRequest, Sequence[ReplicaSim]], int] | None = None) -> Sequence[SimRequest]:
    """`simulate` for DP replicas that run each scheduler iteration together: SiDP's CaS and auto (an all-gather of
    every rank's token counts per iteration, `control.lockstep.Lockstep`) and SGLang's DP attention (its MLP sync
    per iteration, `scheduler_components/dp_attn.py`). Each replica runs its own iteration (`ReplicaSim.step`: its
    own batch, prefill or decode, at its own step time) from the same start; its tokens come out when its forward
    ends, and the next iteration starts when the slowest replica's has ended: a replica that decodes while another
    prefills waits for that prefill. Requests join their replica's queue at the first iteration that starts after
    they arrive, round robin unless `route` says otherwise.

    Left out: SiDP's mode is one for all ranks (a decoding rank runs WaS while another prefills), here each
    replica's own step time; the overlap scheduler's look-ahead (`ReplicaSim.arrive`); and the many-steps-at-once
    paths of `ReplicaSim.advance` (each iteration runs as one `step`: a burst of a few hundred requests in well
    under a second).

    Replicas given the same requests at the same moments run the same schedule in phase. The planner's offline jobs
    send the first request alone and the rest 1 us later (`planner.BURST_REST_S`), as the GPUs' logs show them
    arriving: one rank's first prefill holds that one request while another waits for it, as measured on 2 x H100
    (Qwen3-32B, SiDP auto, 128 x (4,096 in, 16 out): DP1's first prefill one request alone), which took SiDP's
    burst from 11.3 % over the measured throughput to 3.9 % (Llama-3.1-70B on 4 x H100: 8.3 % to 5.5 %). Replicas
    that start one iteration apart stay so for the whole burst here; a server's may start in phase (Llama-3.1-70B,
    SiDP DP4, 512 x (2,048 in, 16 out): every rank's first prefill held two requests), so the planner simulates a
    lockstep burst both ways (`planner.PlanRow.in_phase_tok_s`)."""
    pending = collections.deque(sorted(requests, key=lambda r: r.arrival_s))
    clock, sent = 0.0, 0
    while True:
        while pending and pending[0].arrival_s <= clock:
            req = pending.popleft()
            replicas[route(req, replicas) if route is not None else sent % len(replicas)].waiting.append(req)
            sent += 1
        for rep in replicas:
            rep.clock = clock
        ran = [rep.step() for rep in replicas]
        if any(ran):
            clock = max(rep.clock for rep in replicas)
        elif pending:
            clock = max(clock, pending[0].arrival_s)
        else:
            return requests


@contextlib.contextmanager
def no_cycle_collection():
    """Pause Python's cyclic garbage collector, where it runs, for the block: a schedule allocates millions of tuples
    (heap entries, memo keys, log entries) and makes no reference cycles, so the collector frees nothing, but the
    allocations trigger its passes, among them some over every object alive (the planner's requests, blocks and
    memos). Paused, it makes one pass over what the schedule left when it resumes: about 0.13 s less of a planning
    run of 16 schedules. Nothing is left uncollected: reference counting frees what a schedule drops, and the
    collector runs on afterwards. A caller that runs several schedules pauses it around all of them (the planner:
    one pass when it is done, instead of passes over every object alive after each schedule and among the copies
    of the trace it makes for the next)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _simulate(requests: Sequence[SimRequest], replicas: Sequence[ReplicaSim],
              route: Callable[[SimRequest, Sequence[ReplicaSim]], int] | None) -> Sequence[SimRequest]:
    """`simulate`, the collector paused."""
    pending = sorted(requests, key=lambda r: r.arrival_s)
    if route is None:
        for i, rep in enumerate(replicas):
            for req in pending[i::len(replicas)]:
                rep.arrive(req)
            rep.advance()
        return requests
    for req in pending:
        for rep in replicas:
            if rep.clock < req.arrival_s:  # else it has nothing to run before the arrival
                rep.advance(req.arrival_s - rep._decide_s)  # as `arrive` would: the iterations chosen before it
        replicas[route(req, replicas)].arrive(req)
    for rep in replicas:
        rep.advance()
    return requests


class PrivateBlocks:
    """Each request's private blocks: how many of its last prompt blocks (`hash_ids`) no other request of its replica
    has, `replicas` DP replicas taking `requests` round robin (`simulate`'s default routing), as
    `PrivateBlocks(requests)(replicas)` (a list in the order of `requests`): its `SimRequest.private_blocks` in a
    `simulate` of these requests on replicas that serve nothing else. Where they are set, the radix cache keeps a
    finished request's private blocks as one entry (`RadixBlocks`), the schedule unchanged.

    In numpy, each block id numbered once (a planning run asks for 1, 2, 4 and 8 replicas of the same trace of some
    300,000 blocks): a block is shared on its replica where its number and replica occur twice or more."""

    def __init__(self, requests: Sequence[SimRequest]):
        import numpy as np

        self._n = len(requests)
        # each request's place in arrival order (`_simulate` gives the i-th replica the places i, i + replicas...)
        self._place = np.empty(self._n, np.int64)
        self._place[sorted(range(self._n), key=lambda i: requests[i].arrival_s)] = np.arange(self._n)
        self._lengths = np.fromiter((len(r.hash_ids or ()) for r in requests), np.int64, self._n)
        ids = list(itertools.chain.from_iterable(r.hash_ids for r in requests if r.hash_ids))
        try:  # each block id's number: its rank among the ids (two ids that numpy reads as one count as shared)
            self._blocks = np.unique(np.array(ids, np.int64), return_inverse=True)[1]
        except (OverflowError, TypeError, ValueError):  # ids that are not 64-bit integers: numbered in order
            numbers: dict = {}
            self._blocks = np.array([numbers.setdefault(h, len(numbers)) for h in ids], np.int64)
        self._memo: dict[int, list[int]] = {}

    def __call__(self, replicas: int) -> list[int]:
        import numpy as np

        private = self._memo.get(replicas)
        if private is None:
            lengths, blocks = self._lengths, self._blocks
            key = blocks * replicas + np.repeat(self._place % replicas, lengths)  # (block, replica) as one number
            shared = np.bincount(key)[key] > 1 if len(key) else np.zeros(0, bool)
            ends = np.cumsum(lengths)
            starts = ends - lengths
            some = lengths > 0
            last_shared = np.full(self._n, -1)  # the index of each request's last shared block, if any
            if len(key):
                last_shared[some] = np.maximum.reduceat(np.where(shared, np.arange(len(key)), -1), starts[some])
            private = self._memo[replicas] = (ends - np.maximum(last_shared + 1, starts)).tolist()
        return private


def deliver(requests: Sequence[SimRequest], logs: Sequence[Sequence[tuple[float, float, int]]], tokens_per_s: float,
            bin_s: float = 0.01) -> Sequence[SimRequest]:
    """Delay each request's first token and finish by the wait of its tokens for SGLang's one tokenizer manager,
    which streams at most `tokens_per_s` tokens to the clients whatever the number of DP replicas sampling them (its
    detokenizer and HTTP side are one process each; `--stream-interval 1`). `logs` are the replicas' `tokens_log`.

    A fluid queue in `bin_s` bins: each log entry's tokens arrive evenly over its interval, the manager serves
    `tokens_per_s`, and a token sampled in bin k reaches the client the backlog at the end of bin k later
    (`backlog[k] = max(0, backlog[k - 1] + arrived[k] - tokens_per_s x bin_s)`). The scheduler is not slowed (nothing
    pushes back on it): only what the client sees moves. Returns `requests`, their times moved in place.

    In numpy, with no loop in Python: the log entries become one (entries, 3) array of (start s, end s, tokens) and
    the requests' times one (requests, 2) array of (first token s, finish s), read and written back with the loops in
    C; each entry's tokens per bin go in at its first bin and out past its last through one `bincount` over both
    index lists (which adds the weights in their order: the floats of `np.add.at` on each list in turn); the n_bins
    floats (360,000 for an hour) are one array, summed and minimized in place, and the backlog and the delays are
    taken at the (requests, 2) bins of the requests' times only. The floats are those of a bin by bin, request by
    request computation, in half the time of the per-request loop it replaces (0.3 s of a planning run, not 0.6 s).

    Raises:
        ValueError: `tokens_per_s` or `bin_s` is not positive.
    """
    import numpy as np

    if tokens_per_s <= 0 or bin_s <= 0:
        raise ValueError(f"deliver needs a positive rate and bin, got {tokens_per_s} tokens/s and {bin_s} s")
    n_entries = sum(map(len, logs))
    done = [r for r in requests if r.finish_s is not None]
    if not n_entries or not done:
        return requests
    chain = itertools.chain.from_iterable
    entries = np.fromiter(chain(chain(logs)), float, 3 * n_entries).reshape(n_entries, 3)  # (start s, end s, tokens)
    start, end, tokens = entries.T
    times = np.fromiter(chain(map(operator.attrgetter("first_token_s", "finish_s"), done)), float,
                        2 * len(done)).reshape(len(done), 2)  # (requests, 2): first token s, finish s
    t0 = float(start.min())
    n_bins = int((max(float(end.max()), float(times[:, 1].max())) - t0) / bin_s) + 2
    first, last = ((start - t0) / bin_s).astype(int), ((end - t0) / bin_s).astype(int)
    per_bin = tokens / (last - first + 1)  # spread evenly over the bins the entry touches
    at = ((times - t0) / bin_s).astype(int)  # (requests, 2): the bins of each one's first token and finish
    # one array of n_bins + 1 floats, worked in place: arrival rate, tokens arrived, net of the service, its minimum
    bins = np.bincount(np.concatenate((first, last + 1)), np.concatenate((per_bin, -per_bin)), n_bins + 1)
    np.cumsum(bins, out=bins)
    net = bins[:n_bins]
    np.subtract(net, tokens_per_s * bin_s, out=net)
    np.cumsum(net, out=net)
    backlog = net[at]  # Lindley's recursion in closed form: net less its running minimum (or 0)
    np.minimum.accumulate(net, out=net)
    backlog -= np.minimum(net[at], 0.0)
    times += backlog / tokens_per_s
    for name, column in (("first_token_s", times[:, 0]), ("finish_s", times[:, 1])):  # setattr over them, in C
        collections.deque(map(setattr, done, itertools.repeat(name), column.tolist()), maxlen=0)
    return requests


def goodput(requests: Sequence[SimRequest], slo) -> dict:
    """Finished requests that meet `slo` (`sgl_sidp.bench.metrics.SLO`, judged by its `met_by` as a replay's requests
    are: a one-token request has TPOT 0), as a count ("good_requests") and per second of the makespan
    ("request_goodput"), as `sgl_sidp.bench.metrics.compute_metrics` counts a replay's (first dispatch to last
    completion)."""
    done = [r for r in requests if r.finish_s is not None]
    if not done:
        return {"good_requests": 0, "request_goodput": 0.0}
    makespan = max(r.finish_s for r in done) - min(r.arrival_s for r in requests)
    good = sum(1 for r in done if slo.met_by(
        r.first_token_s - r.arrival_s,
        (r.finish_s - r.first_token_s) / (r.output_len - 1) if r.output_len > 1 else 0.0, r.finish_s - r.arrival_s))
    return {"good_requests": good, "request_goodput": good / makespan if makespan > 0 else 0.0}


def summarize(requests: Sequence[SimRequest]) -> dict:
    """Predicted throughput (tokens/s over the makespan) and TTFT/TPOT/E2E p50 and p99 (ms) of finished requests."""
    import numpy as np

    done = [r for r in requests if r.finish_s is not None]
    if not done:
        return {"requests": 0, "rejected": sum([r.rejected for r in requests])}
    start = min([r.arrival_s for r in requests])
    arrival, first = np.array([r.arrival_s for r in done]), np.array([r.first_token_s for r in done])
    finish, out = np.array([r.finish_s for r in done]), np.array([r.output_len for r in done])
    makespan = float(finish.max()) - start
    ttft = (first - arrival) * 1e3  # SimRequest.ttft_s, element by element (the same floats)
    several = out > 1
    tpot = ((finish - first)[several] / (out[several] - 1) if several.any() else np.zeros(1)) * 1e3  # .tpot_s
    e2e = (finish - arrival) * 1e3
    out_tokens, prompt_tokens = int(out.sum()), sum([r.input_len for r in done])
    p50, p99 = (lambda a: float(np.percentile(a, 50))), (lambda a: float(np.percentile(a, 99)))
    return {"requests": len(done), "makespan_s": makespan,
            "total_tok_s": (out_tokens + prompt_tokens) / makespan, "output_tok_s": out_tokens / makespan,
            "ttft_ms_p50": p50(ttft), "ttft_ms_p99": p99(ttft), "tpot_ms_p50": p50(tpot), "tpot_ms_p99": p99(tpot),
            "e2e_ms_p50": p50(e2e), "e2e_ms_p99": p99(e2e),
            "retractions": sum([r.retractions for r in requests]), "rejected": sum([r.rejected for r in requests])}
