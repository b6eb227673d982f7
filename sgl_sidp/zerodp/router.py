"""Capacity- and speed-aware DP routing: each request to the least full KV cache it fits in, among the replicas whose
decode step it would not make much slower than the fastest's; what fits nowhere queued by drain time.

A ZeroDP sink can hold several times the source's KV cache, and, where it pulls experts its forwards do not hide, take
several times as long per decode step. SGLang's `total_tokens` load-balance method sends each request to the replica
with the fewest tokens in use or queued (`DPBudget.dispatch`, fed from the schedulers' load snapshots);
`ZeroDPRuntime.around_dispatch` replaces that choice (`pick_rank`) using what every snapshot already carries: the
KV capacity (`max_total_num_tokens`), the decode steps the scheduler timed (`decode_moments`, fitted by
`decode_step_fit`) and its prefill time per token. Before every replica has reported a capacity, and for any other
method, SGLang's own choice stands.

Those hooks run in SGLang's DP controller process. SGLang does not load plugins there, so
`sgl_sidp.launch_server` loads them when multiprocessing's spawn re-imports it as the child's
main module (see the end of that module).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

#: seconds between two of the router's lines in the DP controller's log (`Router.log_split`)
LOG_EVERY_S = 10.0


#: a replica whose next decode step would be more than this fraction slower than the fastest one's takes no request
#: while that one has room (`pick_rank`); the fits of equal replicas differ by less (measured at different batches)
SLOWER = 0.25


def pick_rank(total_tokens, total_requests, capacity, estimated_tokens: int, seconds_per_token=None,
              step_fit=None) -> int:
    """The DP rank a new request goes to: the least full KV cache it fits in among the replicas whose decode step it
    would not make much slower than the fastest's; else the soonest drained.

    While the request fits in some replica's KV cache, the candidates are those whose decode step with it, `a + c x
    (requests + 1)` (`step_fit`, from the steps each scheduler timed), is within `SLOWER` of the shortest such step;
    it goes to the candidate whose cache would be least full after taking it (fractions of capacity: a sink holding
    7x its source's KV takes 7x the tokens). So a sink whose decode steps are copy-bound (issue 35: 157 ms at batch
    226 while its source ran batch 30 at a few ms) takes requests only once the source's steps grow about as long,
    or its cache is full; replicas of equal speed share by capacity while their steps stay within `SLOWER` of each
    other, so their batches grow apart no further (for a step linear in the batch, equal batches decode the most
    tokens per second); without every rank's fit yet, by capacity alone. Once the request fits nowhere, it queues
    wherever it goes, and a bigger cache no longer helps: it goes to the replica that would drain its tokens
    soonest, `(tokens + estimated) x seconds_per_token` (SGLang's own `total_tokens` rule where every replica is
    equally fast). In a burst this keeps the source busy while the sink still has work queued (issue 35: 106 of 128
    prompts of 8,192 tokens went to a sink, 20 to its source).

    Args:
        total_tokens: tokens in use or queued per DP rank (`DPBudget.total_tokens`).
        total_requests: running + waiting requests per DP rank.
        capacity: `max_total_num_tokens` per DP rank (> 0).
        estimated_tokens: the new request's prompt tokens.
        seconds_per_token: each rank's measured prefill time per token (`prefill_seconds_per_token`), or None
            (equal speeds) until every rank has one.
        step_fit: each rank's decode step `(a, c)` in seconds, a + c x batch (`decode_step_fit`), or None until
            every rank has one.
    """
    ranks = range(len(capacity))
    fits = [i for i in ranks if total_tokens[i] + estimated_tokens <= capacity[i]]
    if fits and step_fit is not None:
        step = {i: step_fit[i][0] + step_fit[i][1] * (total_requests[i] + 1) for i in fits}
        fastest = min(step.values())
        fits = [i for i in fits if step[i] <= (1 + SLOWER) * fastest]
    if fits:
        return min(fits, key=lambda i: ((total_tokens[i] + estimated_tokens) / capacity[i], total_requests[i]))
    spt = seconds_per_token or [1.0] * len(capacity)
    return min(ranks, key=lambda i: ((total_tokens[i] + estimated_tokens) * spt[i], total_requests[i]))


#: uncached prompt tokens a replica must have prefilled since the router's first snapshot of it before its prefill
#: time per token counts (`prefill_seconds_per_token`): two default chunks. SGLang's warm-up prefills (a few of
#: 1-300 tokens, mostly fixed cost) would otherwise set it, for the whole of a burst that is dispatched in its first
#: second: the likely cause of a 68 / 60 split between a source and its sink of equal speed (nothing offloaded) on
#: 2 x H100, 0.94x vanilla DP2's 64 / 64 (the DP controller logs no routing decisions to confirm it)
PREFILL_SPT_MIN_TOKENS = 16384


def prefill_counters(load) -> tuple[float, float]:
    """(busy microseconds, uncached prompt tokens) a replica prefilled since start: the cumulative counters SGLang's
    scheduler puts in every load snapshot (`LoadSnapshot.total_prefill_busy_us`, `total_prefill_uncached_tokens`);
    0 where absent."""
    return (float(getattr(load, "total_prefill_busy_us", 0) or 0),
            float(getattr(load, "total_prefill_uncached_tokens", 0) or 0))


def prefill_seconds_per_token(load, since: tuple[float, float] = (0.0, 0.0)) -> float | None:
    """A replica's measured prefill time per uncached prompt token (s) since the counters `since` (`prefill_counters`
    of an earlier snapshot), or None before `PREFILL_SPT_MIN_TOKENS` tokens were prefilled since then. A sink that
    pulls experts its forwards cannot hide shows it here."""
    busy_us, tokens = (now - then for now, then in zip(prefill_counters(load), since))
    return busy_us * 1e-6 / tokens if busy_us > 0 and tokens >= PREFILL_SPT_MIN_TOKENS else None


def decode_step_fit(load) -> tuple[float, float] | None:
    """A replica's decode step as `a + c x batch` seconds: the least-squares line through the decode steps its
    scheduler timed, from the moment sums SGLang puts in every load snapshot (`LoadSnapshot.decode_moments`: steps,
    sum of batch sizes, of step microseconds, of squared batch sizes, of batch x step, of tokens generated; cumulative
    since start, `Scheduler._accumulate_decode_moment`). All steps at one batch size give a flat line at their mean;
    a and c are never negative. None before two steps were timed."""
    m = getattr(load, "decode_moments", None)
    if not m or len(m) < 5 or m[0] < 2:
        return None
    n, sb, st, sbb, sbt = (float(x) for x in m[:5])
    den = n * sbb - sb * sb
    c = max((n * sbt - sb * st) / den, 0.0) if den > 1e-9 * n * n else 0.0
    a = max((st - c * sb) / n, 0.0)
    return a * 1e-6, c * 1e-6


class Router:
    """The DP controller's routing state: each replica's capacity, measured prefill speed and decode step fit, and the
    requests sent since its last load snapshot.

    SGLang's `DPBudget.update_budget` overwrites each replica's token and request counts with its scheduler's latest
    snapshot, which counts only the requests the scheduler had read when its iteration began: a scheduler reads its
    socket, runs a forward (a prefill of 8,192 tokens: 240 ms), then publishes (`Scheduler.process_batch_result`).
    What the controller sent after the previous snapshot of that replica is missing from it; in a burst those
    requests vanished from the counts and every snapshot restarted the fill of the caches (issue 35: a split
    simulated at 50/78 ran 33/94). `observe` adds back, to each replica's latest snapshot, what was sent to it after
    its previous one (a request read in the moment between a publish and the next read counts twice until the next
    snapshot; one published every few decode steps rather than each step widens that window); `dispatch` records
    each request it places.

    Attributes:
        capacity: `max_total_num_tokens` per DP rank (0: not reported yet).
        prefill_spt: measured prefill seconds per token per DP rank since the router's first snapshot of it (None:
            fewer than `PREFILL_SPT_MIN_TOKENS` prefilled since).
        step_fit: decode step (a, c) seconds per DP rank (`decode_step_fit`; None: fewer than two steps timed).
        routed: requests sent per DP rank so far (`log_split`: a line every `LOG_EVERY_S` after requests were sent,
            so that a split can be read off the server log).
    """

    def __init__(self, clock=None):
        import time

        self.clock = clock or time.time  # the schedulers stamp their snapshots with time.time() on the same host
        self.capacity: list[int] = []
        self.prefill_spt: list[float | None] = []
        self.step_fit: list[tuple[float, float] | None] = []
        self._snapshot: dict[int, tuple[float, float, int, int]] = {}  # rank -> (ts, previous ts, tokens, requests)
        self._prefill_base: dict[int, tuple[float, float]] = {}  # rank -> its prefill counters when first seen
        self.routed: list[int] = []  # requests sent per DP rank so far
        self._logged_at, self._logged_routed = float("-inf"), []  # when `log_split` last logged, and what
        self._sent: list[tuple[float, int, int]] = []  # (time, rank, tokens) after the oldest previous snapshot

    def observe(self, budget, loads) -> None:
        """After SGLang's `update_budget(loads)`: note capacities and speeds, then set each reported replica's counts
        to its latest snapshot plus what was sent to it after its previous snapshot (what the latest one may miss)."""
        n = budget.dp_size
        if len(self.capacity) != n:
            self.capacity, self.prefill_spt, self.step_fit, self.routed = [0] * n, [None] * n, [None] * n, [0] * n
        for load in loads:
            r = load.dp_rank
            cap = int(getattr(load, "max_total_num_tokens", 0) or 0)
            if cap > 0:
                self.capacity[r] = cap
            spt = prefill_seconds_per_token(load, self._prefill_base.setdefault(r, prefill_counters(load)))
            if spt is not None:
                self.prefill_spt[r] = spt
            fit = decode_step_fit(load)
            if fit is not None:
                self.step_fit[r] = fit
            ts = float(getattr(load, "timestamp", 0.0) or 0.0)
            if r not in self._snapshot or ts > self._snapshot[r][0]:
                prev = self._snapshot[r][0] if r in self._snapshot else 0.0
                self._snapshot[r] = (ts, prev, int(load.num_total_tokens),
                                     int(load.num_running_reqs + load.num_waiting_reqs))
        if len(self._snapshot) == n:  # forget what every replica's latest snapshot counts
            oldest = min(prev for _, prev, _, _ in self._snapshot.values())
            self._sent = [s for s in self._sent if s[0] > oldest]
        for r, (_, prev, tokens, requests) in self._snapshot.items():
            late = [t for when, rank, t in self._sent if rank == r and when > prev]
            budget.total_tokens[r] = tokens + sum(late)
            budget.total_requests[r] = requests + len(late)
        self.log_split()

    def ready(self) -> bool:
        """Every replica has reported a capacity."""
        return bool(self.capacity) and min(self.capacity) > 0

    def dispatch(self, budget, estimated_tokens: int) -> int:
        """The DP rank for a request of `estimated_tokens` prompt tokens (`pick_rank`), counted in `budget` and
        remembered until a snapshot of that rank covers it."""
        def every_rank(values: list) -> list | None:  # a rank's measurement, once every rank has one
            return values if len(values) == len(self.capacity) and None not in values else None

        target = pick_rank(budget.total_tokens, budget.total_requests, self.capacity, estimated_tokens,
                           every_rank(self.prefill_spt), every_rank(self.step_fit))
        budget.total_requests[target] += 1
        budget.total_tokens[target] += estimated_tokens
        now = self.clock()
        self._sent.append((now, target, estimated_tokens))
        self.routed[target] += 1
        return target

    def log_split(self) -> None:
        """One line of the requests sent per DP rank, the capacities and the prefill rates, where requests were sent
        since the last line and `LOG_EVERY_S` have passed (called with every load snapshot, which the schedulers keep
        publishing while they work: a burst dispatched within a second gets its line once it is all sent)."""
        now = self.clock()
        if not any(self.routed) or self.routed == self._logged_routed or now - self._logged_at < LOG_EVERY_S:
            return
        self._logged_at, self._logged_routed = now, list(self.routed)
        spt = ", ".join("-" if v is None else f"{v * 1e6:.1f}" for v in self.prefill_spt)
        logger.info("sgl-sidp zerodp router: requests sent per DP rank so far %s; KV capacity %s tokens; prefill us "
                    "per token %s (-: not yet %d tokens)", self._logged_routed, list(self.capacity), spt,
                    PREFILL_SPT_MIN_TOKENS)  # copies: a record formats its arguments when it is emitted
