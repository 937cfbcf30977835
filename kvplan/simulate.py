"""The KV pool under a workload: a step-level continuous-batching simulator over the real allocator.

Every policy runs the SAME block allocator as ``kvplan validate`` (:mod:`kvplan.paged.allocator`):

* ``contiguous``: each admitted request reserves ``ceil(max_model_len / block_size)`` blocks at once
  (per attention group) and never grows: what a worst-case contiguous reservation holds;
* ``paged``: a request allocates the blocks of its prompt and one more block each time decoding fills one;
* ``prefix_caching``: paged, with token ids passed to the allocator so full prompt blocks are shared and
  freed blocks stay cached until evicted (LRU, inside the allocator).

The scheduler follows vLLM v1 (FCFS, chunked prefill): each step, running requests go first (decoders
take one token each, in admission order; one that needs a block when the pool is empty preempts the
newest running request: free it and put it back at the front of the queue, to be recomputed), then
partial prefills continue, then, if nothing was preempted, waiting requests are admitted in order while
a seat (``max_num_seqs``), the token budget (``max_num_batched_tokens``) and the blocks of the whole
prompt are available (``allocate``; the head of the queue blocks the rest).

Token accounting: a prefill of P tokens samples the first output token; each later decode step writes
the KV of the previous token and samples the next, so a request of O output tokens holds ``P + O - 1``
tokens when it finishes. A preempted request that had generated g tokens is readmitted as a prompt of
``P + g`` tokens (recompute). Requests are clamped to ``max_model_len`` as vLLM does (output stops at
the limit; a prompt of ``max_model_len`` tokens or more is rejected).

Step time (seconds): ``(weights + KV read) / HBM bandwidth + prefill tokens x prefill_s_per_token``,
where a decoder at L tokens reads ``L + 1`` tokens of every layer that keeps them (windowed layers at most
their window, state layers their state); ``decode_step_s`` replaces the bandwidth term when given.

Speed: between events the clock advances ``k`` decode steps at once (exactly: the step times are summed
in closed form) when no admission, finish or preemption can happen in between; the allocator is told
about a request's new tokens only when they need a new block (``append_tokens(req, n)``), so the work is
proportional to blocks allocated, not to tokens generated. A sliding-window group therefore releases
blocks that left its window at the request's next block boundary (vLLM: at its next step).

Library code: never prints, never exits.
"""

from __future__ import annotations

import heapq
import math
import random
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from operator import mul
from dataclasses import dataclass, field

from kvplan.errors import InputError
from kvplan.paged.allocator import BlockAllocator, GroupSpec
from kvplan.units import cdiv

POLICIES = ("contiguous", "paged", "prefix_caching")
POLICY_LABELS = {"contiguous": "contiguous", "paged": "paged", "prefix_caching": "paged + prefix cache"}
DEFAULT_PREFILL_EFFICIENCY = 0.5  # fraction of the GPU's dense fp16 peak a prefill reaches

_PREFIX_ID_BASE = 1 << 24  # prefix group g uses token ids [g * 2^24, g * 2^24 + prefix_tokens)
_UNIQUE_ID_BASE = 1 << 44  # request i's own tokens: [2^44 + i * 2^22, ...)
_UNIQUE_ID_STRIDE = 1 << 22


# ---------------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class Request:
    """One request: ``prompt_tokens`` (prefix included), ``output_tokens``; ``prefix_id`` >= 0 names
    a shared prefix whose first ``prefix_tokens`` prompt tokens are the same token ids in every request
    of that id. ``arrival_s``: None when a closed loop decides it."""

    prompt_tokens: int
    output_tokens: int
    arrival_s: float | None = None
    prefix_id: int = -1
    prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise InputError(f"a request needs at least one prompt and one output token, got "
                             f"{self.prompt_tokens} and {self.output_tokens}")
        if not 0 <= self.prefix_tokens <= self.prompt_tokens:
            raise InputError(f"prefix_tokens {self.prefix_tokens} must be within the prompt's {self.prompt_tokens} tokens")


@dataclass(frozen=True)
class Pool:
    """The block pool and the scheduler limits (tokens, blocks)."""

    num_blocks: int  # block ids, null block included
    block_size: int
    groups: tuple[GroupSpec, ...]
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    prefix_state_blocks: tuple[int, ...] = ()  # state groups' blocks with prefix caching on (default: same)

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"invalid {name} {getattr(self, name)}: must be positive")


@dataclass(frozen=True)
class Timing:
    """How long a step takes (one GPU of the deployment; all GPUs work in parallel).

    ``weights_bytes`` and every ``*_bytes`` are per GPU; ``full_token_bytes``: KV bytes per token of the
    layers that keep every token; ``window_token_bytes``: ``(window_tokens, bytes per token)`` per window
    size; ``state_bytes``: fixed state read per request per step.
    """

    weights_bytes: int
    bandwidth_bytes_per_s: float
    full_token_bytes: int
    window_token_bytes: tuple[tuple[int, int], ...] = ()
    state_bytes: int = 0
    prefill_s_per_token: float = 0.0
    decode_step_s: float | None = None

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0 and self.decode_step_s is None:
            raise InputError("the GPU has no HBM bandwidth", "set decode_step_s in the workload's timing")
        if self.prefill_s_per_token < 0 or (self.decode_step_s is not None and self.decode_step_s <= 0):
            raise InputError("prefill_s_per_token must be >= 0 and decode_step_s > 0")


@dataclass(frozen=True)
class SimConfig:
    pool: Pool
    timing: Timing


def window_sum(first: int, k: int, window: int) -> int:
    """``sum(min(first + j, window) for j in range(k))`` in O(1) (tokens a windowed layer reads)."""
    if k <= 0:
        return 0
    if first >= window:
        return k * window
    if first + k - 1 <= window:
        return k * first + k * (k - 1) // 2
    m = window - first + 1  # terms first..window
    return m * first + m * (m - 1) // 2 + (k - m) * window


# ---------------------------------------------------------------------------------------------
# outputs


@dataclass(frozen=True)
class Series:
    """Samples at the end of each step or span: time (s), used fraction of the pool, running requests."""

    time_s: tuple[float, ...]
    usage: tuple[float, ...]
    running: tuple[int, ...]

    def downsample(self, points: int = 400) -> "Series":
        """At most ``points`` samples: the last sample of each of ``points`` equal time bins."""
        n = len(self.time_s)
        if n <= points or not n:
            return self
        end = self.time_s[-1] or 1.0
        keep: dict[int, int] = {}
        for i, t in enumerate(self.time_s):
            keep[min(points - 1, int(t / end * points))] = i
        idx = sorted(keep.values())
        return Series(tuple(self.time_s[i] for i in idx), tuple(self.usage[i] for i in idx),
                      tuple(self.running[i] for i in idx))


@dataclass(frozen=True)
class PolicyResult:
    """What one policy achieved. Times in seconds; ``*_rate`` and fractions in [0, 1]."""

    policy: str
    duration_s: float
    arrived: int
    finished: int
    queued: int  # waiting at the end (preempted ones included)
    running: int  # admitted and unfinished at the end
    rejected: int  # prompt of max_model_len tokens or more
    requests_per_s: float
    output_tokens: int  # tokens sampled (finished and unfinished requests)
    output_tokens_per_s: float
    concurrency_mean: float  # time-weighted running requests
    concurrency_p50: int
    concurrency_p99: int
    concurrency_max: int
    usage_mean: float  # used blocks / usable blocks, time-weighted
    usage_peak: float
    fragmentation_mean: float  # unused token slots / slots of used blocks, time-weighted
    prefix_hit_rate: float  # prompt tokens found cached / prompt tokens looked up
    prefill_tokens: int  # prompt tokens computed (recomputes included)
    prefill_tokens_saved: int  # prompt tokens served from the prefix cache
    preemptions: int
    queue_delay_p50_s: float | None  # arrival -> first scheduled
    queue_delay_p99_s: float | None
    ttft_p50_s: float | None  # arrival -> first output token
    ttft_p99_s: float | None
    num_steps: int  # engine steps simulated
    num_events: int  # loop iterations (steps taken one at a time or k at once)
    blocks_per_reservation: int  # contiguous: blocks one request reserves; else 0
    series: Series = field(repr=False, default=Series((), (), ()))

    @property
    def label(self) -> str:
        return POLICY_LABELS.get(self.policy, self.policy)

    def to_dict(self, series_points: int = 200) -> dict:
        out = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "series"}
        s = self.series.downsample(series_points)
        out["label"] = self.label
        out["series"] = {"time_s": [round(x, 4) for x in s.time_s], "usage": [round(x, 5) for x in s.usage],
                         "running": list(s.running)}
        return out


@dataclass(frozen=True)
class SimResult:
    """All policies of one run, with the inputs that decided them."""

    config: SimConfig
    results: tuple[PolicyResult, ...]
    seed: int
    duration_s: float | None
    num_requests: int | None
    notes: tuple[str, ...] = ()

    def result(self, policy: str) -> PolicyResult:
        return next(r for r in self.results if r.policy == policy)


# ---------------------------------------------------------------------------------------------
# request streams


class RequestSource:
    """Requests by index, generated lazily (so every policy sees the same requests).

    ``make(rng, i) -> Request | None`` draws request ``i`` (None: no more). ``limit``: at most this many.
    """

    def __init__(self, make: Callable[[random.Random, int], Request | None], seed: int, limit: int | None = None) -> None:
        self._make, self._rng, self.limit = make, random.Random(seed), limit
        self._items: list[Request] = []
        self._done = False

    @classmethod
    def of(cls, requests: Sequence[Request]) -> "RequestSource":
        items = list(requests)
        return cls(lambda rng, i: items[i] if i < len(items) else None, 0)

    def get(self, i: int) -> Request | None:
        while len(self._items) <= i and not self._done:
            if self.limit is not None and len(self._items) >= self.limit:
                self._done = True
                break
            req = self._make(self._rng, len(self._items))
            if req is None:
                self._done = True
                break
            self._items.append(req)
        return self._items[i] if i < len(self._items) else None


@dataclass(frozen=True)
class ClosedLoop:
    """``users`` users, each sending its next request a think time (exponential, mean ``think_s``) after
    the previous one finishes; the first requests start spread uniformly over ``[0, think_s]``."""

    users: int
    think_s: float = 0.0


# ---------------------------------------------------------------------------------------------
# the engine


def _percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _weighted_percentile(hist: dict[int, float], q: float) -> int:
    """Smallest value whose cumulative time share reaches ``q`` percent."""
    total = sum(hist.values())
    if total <= 0:
        return 0
    acc = 0.0
    for value in sorted(hist):
        acc += hist[value]
        if acc >= q / 100 * total * (1 - 1e-12):
            return value
    return max(hist)


class _Run:
    """One policy over one request stream (see the module doc for the model)."""

    def __init__(self, config: SimConfig, policy: str, source: RequestSource, closed: ClosedLoop | None,
                 stop_s: float | None, seed: int, record_series: bool) -> None:
        if policy not in POLICIES:
            raise InputError(f"unknown policy {policy!r}", "use one of: " + ", ".join(POLICIES))
        pool, self.timing = config.pool, config.timing
        self.pool, self.policy, self.source, self.closed, self.stop_s = pool, policy, source, closed, stop_s
        self.bs = pool.block_size
        self.reserve = policy == "contiguous"
        self.caching = policy == "prefix_caching"
        groups = pool.groups
        if self.caching and pool.prefix_state_blocks:
            it = iter(pool.prefix_state_blocks)
            groups = tuple(GroupSpec("state", state_blocks=next(it)) if g.kind == "state" else g for g in groups)
        self.alloc = BlockAllocator(pool.num_blocks, pool.block_size, groups, enable_prefix_caching=self.caching)
        self.n_attn = sum(1 for g in groups if g.kind != "state")
        self.sliding = any(g.kind == "sliding" for g in groups)
        self.reserve_tokens = pool.max_model_len  # contiguous: what each request reserves (a count)
        self.reserve_slots = cdiv(pool.max_model_len, self.bs) * self.bs
        self.think_rng = random.Random(seed * 7919 + 17)
        self.record = record_series
        # per request (indexed by request id, grown on arrival)
        self.arrival: list[float] = []
        self.prompt: list[int] = []
        self.out: list[int] = []
        self.gen: list[int] = []  # tokens sampled so far (materialised on preemption/finish)
        self.first_sched: list[float] = []
        self.first_token: list[float] = []
        self.off: list[int] = []  # decoder: KV length = D + off
        self.fin_d: list[int] = []
        self.synced: list[int] = []  # tokens the allocator knows
        self.epoch: list[int] = []
        self.pf_tokens: list[int] = []  # tokens of the current prefill (prompt + generated)
        self.prefix_of: list[tuple[int, int]] = []
        # scheduler state
        self.running: dict[int, None] = {}
        self.prefilling: dict[int, int] = {}  # request -> prompt tokens still to compute
        self.waiting: deque[int] = deque()
        self.buckets: list[set[int]] = [set() for _ in range(self.bs)]  # decoders by off % bs
        self.bcount = [0] * self.bs  # len() of each bucket
        # _fill[p][b]: unused slots of a decoder in bucket b when D % bs == p
        self._fill = [[-(p + b) % self.bs for b in range(self.bs)] for p in range(self.bs)]
        self.heap: list[tuple[int, int, int]] = []  # (finish D, request, epoch)
        self.n_dec = 0
        self.s_off = 0
        self.pf_unused = 0  # unused slots of prefilling requests' last blocks (paged)
        self.D = 0
        self.t = 0.0
        self.admit_ok = True  # the queue head may be admissible (something changed since it failed)
        # arrivals
        self.next_index = 0
        self.arrivals: list[tuple[float, int]] = []  # heap of (time, request index) not yet arrived
        self.prefix_lists: dict[int, list[int]] = {}
        # metrics
        self.finished = self.rejected = self.preemptions = self.generated = self.num_arrived = 0
        self.prefill_tokens = 0
        self.num_steps = self.num_events = 0
        self.conc_hist: dict[int, float] = {}
        self.usage_area = self.frag_area = 0.0
        self.usage_peak = 0.0
        self.last_usage = self.last_frag = 0.0
        self.series_t, self.series_u, self.series_r = array("d"), array("d"), array("l")
        self._windows = self.timing.window_token_bytes

    # ---- arrivals -----------------------------------------------------------------------------
    def _schedule_initial_arrivals(self) -> None:
        if self.closed is None:
            self._push_open_arrival()
        else:
            for _ in range(self.closed.users):
                if not self._push_closed_arrival(self.think_rng.uniform(0.0, self.closed.think_s)):
                    break

    def _push_open_arrival(self) -> None:
        req = self.source.get(self.next_index)
        if req is None:
            return
        if req.arrival_s is None:
            raise InputError("an open-loop request stream needs arrival times")
        heapq.heappush(self.arrivals, (req.arrival_s, self.next_index))
        self.next_index += 1

    def _push_closed_arrival(self, at: float) -> bool:
        if self.source.get(self.next_index) is None:
            return False
        heapq.heappush(self.arrivals, (at, self.next_index))
        self.next_index += 1
        return True

    def _pull_arrivals(self) -> None:
        arrivals, t, mml = self.arrivals, self.t, self.pool.max_model_len
        while arrivals and arrivals[0][0] <= t:
            at, i = heapq.heappop(arrivals)
            if self.closed is None:
                self._push_open_arrival()
            req = self.source.get(i)
            assert req is not None
            grow = i + 1 - len(self.arrival)  # a closed loop's first requests arrive out of index order
            if grow > 0:
                for lst, value in ((self.arrival, -1.0), (self.prompt, 0), (self.out, 0), (self.gen, 0),
                                   (self.first_sched, -1.0), (self.first_token, -1.0), (self.off, 0), (self.fin_d, 0),
                                   (self.synced, 0), (self.epoch, 0), (self.pf_tokens, 0), (self.prefix_of, (-1, 0))):
                    lst.extend([value] * grow)  # type: ignore[attr-defined]
            self.num_arrived += 1
            self.arrival[i] = at
            self.prompt[i] = req.prompt_tokens
            self.out[i] = min(req.output_tokens, mml - req.prompt_tokens)
            self.prefix_of[i] = (req.prefix_id, req.prefix_tokens)
            if req.prompt_tokens >= mml:
                self.rejected += 1
                self._user_done(at)
                continue
            if not self.waiting:
                self.admit_ok = True
            self.waiting.append(i)

    def _user_done(self, at: float) -> None:
        if self.closed is not None:
            think = self.think_rng.expovariate(1.0 / self.closed.think_s) if self.closed.think_s > 0 else 0.0
            self._push_closed_arrival(at + think)

    # ---- the allocator ------------------------------------------------------------------------
    def _tokens_of(self, i: int, n: int) -> list[int] | int:
        """What to allocate for request ``i``'s prefill of ``n`` tokens: ids (prefix caching) or a count."""
        if self.reserve:
            return self.reserve_tokens
        if not self.caching:
            return n
        pid, plen = self.prefix_of[i]
        base = _UNIQUE_ID_BASE + i * _UNIQUE_ID_STRIDE
        if pid < 0 or plen == 0:
            return list(range(base, base + n))
        plist = self.prefix_lists.get(pid)
        if plist is None or len(plist) < plen:
            start = (pid + 1) * _PREFIX_ID_BASE
            plist = self.prefix_lists[pid] = list(range(start, start + max(plen, len(plist or ()))))
        plen = min(plen, n)
        return plist[:plen] + list(range(base, base + n - plen))

    def _remove_decoder(self, i: int) -> None:
        b = self.off[i] % self.bs
        self.buckets[b].discard(i)
        self.bcount[b] -= 1
        self.n_dec -= 1
        self.s_off -= self.off[i]

    def _preempt(self, i: int) -> None:
        self.alloc.free(i)
        del self.running[i]
        if i in self.prefilling:
            del self.prefilling[i]
            self.pf_unused -= -self.pf_tokens[i] % self.bs
        else:
            self._remove_decoder(i)
            self.gen[i] = self.out[i] - (self.fin_d[i] - self.D)
        self.epoch[i] += 1
        self.waiting.appendleft(i)
        self.preemptions += 1
        self.admit_ok = True

    def _finish(self, i: int) -> None:
        self.alloc.free(i)
        del self.running[i]
        self.gen[i] = self.out[i]
        self.finished += 1
        self.admit_ok = True
        self._user_done(self.t)

    def _sync(self, i: int, tokens: int) -> bool:
        """Tell the allocator request ``i`` now holds ``tokens`` tokens (False: no room for the next block).

        With sliding groups the tokens go in up to each block boundary first, so the blocks that left
        the window are released before the next block is taken (as vLLM does at that step)."""
        append, s = self.alloc.append_tokens, self.synced[i]
        if self.sliding:
            bs = self.bs
            edge = cdiv(s, bs) * bs  # appending token edge + 1 takes a new block
            while edge < tokens:
                if edge > s:
                    append(i, edge - s)
                    s = self.synced[i] = edge
                if not append(i, 1):
                    return False
                s = self.synced[i] = edge + 1
                edge += bs
        if tokens > s and not append(i, tokens - s):
            return False
        self.synced[i] = tokens
        return True

    # ---- metrics ------------------------------------------------------------------------------
    def _unused_slots(self) -> int:
        """Allocated but unfilled token slots (all attention groups)."""
        if self.reserve:
            live = self.n_dec * self.D + self.s_off + sum(self.pf_tokens[i] for i in self.prefilling)
            return self.n_attn * (len(self.running) * self.reserve_slots - live)
        return self.n_attn * (self.pf_unused + sum(map(mul, self.bcount, self._fill[self.D % self.bs])))

    def _sample(self, dt: float, n_running: int) -> None:
        """Account an interval of ``dt`` seconds that ends now (before finishes are freed)."""
        alloc = self.alloc
        used = alloc.num_used_blocks
        usage = used / alloc.num_usable_blocks
        frag = self._unused_slots() / (used * self.bs) if used else 0.0
        self.usage_area += (self.last_usage + usage) * 0.5 * dt
        self.frag_area += (self.last_frag + frag) * 0.5 * dt
        if usage > self.usage_peak:
            self.usage_peak = usage
        self.conc_hist[n_running] = self.conc_hist.get(n_running, 0.0) + dt
        if self.record:
            self.series_t.append(self.t)
            self.series_u.append(usage)
            self.series_r.append(n_running)

    def _mark_start(self) -> None:
        """The state at the start of the next interval (after frees and allocations)."""
        used = self.alloc.num_used_blocks
        self.last_usage = used / self.alloc.num_usable_blocks
        self.last_frag = self._unused_slots() / (used * self.bs) if used else 0.0

    # ---- timing -------------------------------------------------------------------------------
    def _decode_seconds(self, k: int) -> float:
        """Seconds of ``k`` decode steps from counter D with the current decoders (closed form)."""
        tm = self.timing
        if tm.decode_step_s is not None:
            return k * tm.decode_step_s
        n, D = self.n_dec, self.D
        # decoder i at step j reads L + 1 = D + j + off_i + 1 tokens; summed over j < k and decoders:
        tokens = n * k * (D + 1) + n * (k * (k - 1) // 2) + k * self.s_off
        total = k * tm.weights_bytes + tm.full_token_bytes * tokens + k * n * tm.state_bytes
        if self._windows and n:
            offs = [self.off[i] for members in self.buckets for i in members]
            for window, per_token in self._windows:
                total += per_token * sum(window_sum(D + o + 1, k, window) for o in offs)
        return total / tm.bandwidth_bytes_per_s

    # ---- one step with scheduling -------------------------------------------------------------
    def _step(self) -> None:
        bs, alloc, D = self.bs, self.alloc, self.D
        preempted = False
        if not self.reserve and self.n_dec:
            crossing = self.buckets[-D % bs]
            if crossing:
                if len(crossing) * self.n_attn <= alloc.num_free_blocks:
                    off = self.off
                    for i in list(crossing):
                        ok = self._sync(i, D + off[i] + 1)
                        assert ok
                else:  # in running order; preempt the newest until each fits (vLLM v1)
                    order = [i for i in self.running if i in crossing]
                    for i in order:
                        if i not in self.running:
                            continue
                        while not self._sync(i, D + self.off[i] + 1):
                            victim = next(reversed(self.running))
                            self._preempt(victim)
                            preempted = True
                            if victim == i:
                                break
        budget = self.pool.max_num_batched_tokens - self.n_dec
        prefill = 0
        chunks: list[tuple[int, int]] = []
        for i, left in self.prefilling.items():
            if budget <= 0:
                break
            c = min(left, budget)
            budget -= c
            prefill += c
            chunks.append((i, c))
        if not preempted and self.waiting:
            blocked = False
            seats = self.pool.max_num_seqs
            while self.waiting and budget > 0:
                if len(self.running) >= seats:
                    blocked = True
                    break
                i = self.waiting[0]
                n = self.prompt[i] + self.gen[i]
                hit = alloc.allocate(i, self._tokens_of(i, n))
                if hit is None:
                    blocked = True
                    break
                self.waiting.popleft()
                if self.first_sched[i] < 0:
                    self.first_sched[i] = self.t
                self.running[i] = None
                self.synced[i] = n
                self.pf_tokens[i] = n
                left = n - hit
                self.prefilling[i] = left
                if not self.reserve:
                    self.pf_unused += -n % bs
                c = min(left, budget)
                budget -= c
                prefill += c
                chunks.append((i, c))
            self.admit_ok = not blocked
        n_running = len(self.running)
        assert n_running, "an empty pool admits the queue head (checked when the run starts)"
        self._mark_start()
        dt = self._decode_seconds(1) + prefill * self.timing.prefill_s_per_token
        self.t += dt
        self.D = D = D + 1
        self.num_steps += 1
        self.num_events += 1
        self.prefill_tokens += prefill
        self.generated += self.n_dec
        # prefills that completed become decoders (or finish)
        done_prefill = []
        prefilling = self.prefilling
        for i, c in chunks:
            left = prefilling[i] - c
            if left:
                prefilling[i] = left
            else:
                done_prefill.append(i)
        self._sample(dt, n_running)
        for i in done_prefill:
            del prefilling[i]
            n = self.pf_tokens[i]
            if not self.reserve:
                self.pf_unused -= -n % bs
            self.gen[i] += 1
            self.generated += 1
            if self.first_token[i] < 0:
                self.first_token[i] = self.t
            if self.gen[i] >= self.out[i]:
                self._finish(i)
                continue
            o = self.off[i] = n - D
            self.fin_d[i] = D + self.out[i] - self.gen[i]
            self.buckets[o % bs].add(i)
            self.bcount[o % bs] += 1
            self.n_dec += 1
            self.s_off += o
            heapq.heappush(self.heap, (self.fin_d[i], i, self.epoch[i]))
        self._finish_decoders()

    def _finish_decoders(self) -> None:
        heap, D, epoch = self.heap, self.D, self.epoch
        while heap:
            d, i, e = heap[0]
            if e != epoch[i] or i not in self.running or i in self.prefilling:
                heapq.heappop(heap)
                continue
            if d > D:
                break
            heapq.heappop(heap)
            self._remove_decoder(i)
            self._finish(i)

    def _next_finish_steps(self) -> int:
        heap, epoch = self.heap, self.epoch
        while heap:
            d, i, e = heap[0]
            if e != epoch[i] or i not in self.running or i in self.prefilling:
                heapq.heappop(heap)
                continue
            return d - self.D
        return 0

    # ---- k decode steps at once ---------------------------------------------------------------
    def _crossings(self, k: int) -> int:
        """Blocks the decoders need over the next ``k`` steps."""
        if self.reserve:
            return 0
        bs, total = self.bs, 0
        for n, first in zip(self.bcount, self._fill[self.D % bs]):
            if n and first < k:
                total += n * ((k - 1 - first) // bs + 1)
        return total * self.n_attn

    def _steps_before(self, gap: float, k_max: int) -> int:
        """Largest k <= k_max such that the k-th step starts before ``gap`` seconds from now."""
        if gap <= 0:
            return 0
        lo, hi = 1, k_max  # step 0 starts now (< gap)
        if self._decode_seconds(hi - 1) < gap:
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._decode_seconds(mid - 1) < gap:
                lo = mid
            else:
                hi = mid
        return lo

    def _span(self) -> bool:
        """Take k >= 2 decode-only steps at once when nothing can happen in between. False: not possible."""
        if self.prefilling or not self.n_dec or (self.waiting and self.admit_ok):
            return False
        k = self._next_finish_steps()
        if k < 2:
            return False
        if not self.reserve:
            free = self.alloc.num_free_blocks
            if self._crossings(k) > free:
                lo, hi = 0, k  # crossings(lo) <= free < crossings(hi)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if self._crossings(mid) <= free:
                        lo = mid
                    else:
                        hi = mid
                k = lo
                if k < 2:
                    return False
        bounds = []
        if not self.waiting and self.arrivals:
            bounds.append(self.arrivals[0][0])
        if self.stop_s is not None:
            bounds.append(self.stop_s)
        if bounds:
            k = self._steps_before(min(bounds) - self.t, k)
            if k < 2:
                return False
        self._mark_start()
        dt = self._decode_seconds(k)
        bs, D = self.bs, self.D
        if not self.reserve:
            off = self.off
            end = D + k
            for b, members in enumerate(self.buckets):
                if members and -(D + b) % bs < k:
                    for i in members:
                        ok = self._sync(i, end + off[i])
                        assert ok
        self.t += dt
        self.D = D + k
        self.num_steps += k
        self.num_events += 1
        self.generated += k * self.n_dec
        self._sample(dt, len(self.running))
        self._finish_decoders()
        return True

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> PolicyResult:
        self._schedule_initial_arrivals()
        stop = self.stop_s
        while True:
            self._pull_arrivals()
            if stop is not None and self.t >= stop:
                break
            if not self.running and not self.waiting:
                if not self.arrivals:
                    break
                nxt = self.arrivals[0][0]
                if stop is not None and nxt >= stop:
                    self._idle(stop - self.t)
                    self.t = stop
                    break
                self._idle(nxt - self.t)
                self.t = nxt
                continue
            if not self._span():
                self._step()
        return self._result()

    def _idle(self, dt: float) -> None:
        if dt > 0:
            self.last_usage = self.last_frag = 0.0
            self.t += dt
            self._sample(dt, 0)
            self.t -= dt
            self.num_events += 1

    def _result(self) -> PolicyResult:
        t = self.t
        n = len(self.arrival)
        delays = sorted(self.first_sched[i] - self.arrival[i] for i in range(n) if self.first_sched[i] >= 0)
        ttft = sorted(self.first_token[i] - self.arrival[i] for i in range(n) if self.first_token[i] >= 0)
        hist = self.conc_hist
        total_time = sum(hist.values())
        return PolicyResult(
            policy=self.policy,
            duration_s=t,
            arrived=self.num_arrived,
            finished=self.finished,
            queued=len(self.waiting),
            running=len(self.running),
            rejected=self.rejected,
            requests_per_s=self.finished / t if t > 0 else 0.0,
            output_tokens=self.generated,
            output_tokens_per_s=self.generated / t if t > 0 else 0.0,
            concurrency_mean=sum(v * w for v, w in hist.items()) / total_time if total_time else 0.0,
            concurrency_p50=_weighted_percentile(hist, 50),
            concurrency_p99=_weighted_percentile(hist, 99),
            concurrency_max=max((v for v, w in hist.items() if w > 0), default=0),
            usage_mean=self.usage_area / total_time if total_time else 0.0,
            usage_peak=self.usage_peak,
            fragmentation_mean=self.frag_area / total_time if total_time else 0.0,
            prefix_hit_rate=self.alloc.prefix_hit_rate,
            prefill_tokens=self.prefill_tokens,
            prefill_tokens_saved=self.alloc.prefix_hit_tokens,
            preemptions=self.preemptions,
            queue_delay_p50_s=_percentile(delays, 50),
            queue_delay_p99_s=_percentile(delays, 99),
            ttft_p50_s=_percentile(ttft, 50),
            ttft_p99_s=_percentile(ttft, 99),
            num_steps=self.num_steps,
            num_events=self.num_events,
            blocks_per_reservation=cdiv(self.pool.max_model_len, self.bs) * self.n_attn if self.reserve else 0,
            series=Series(tuple(self.series_t), tuple(self.series_u), tuple(self.series_r)),
        )


def simulate(config: SimConfig, source: RequestSource | Sequence[Request], *, policies: Sequence[str] = POLICIES,
             duration_s: float | None = None, closed_loop: ClosedLoop | None = None, seed: int = 0,
             record_series: bool = True) -> SimResult:
    """Run each policy over the same requests; stop at ``duration_s`` (else when every request is done).

    ``source``: a :class:`RequestSource` or a list of requests (with ``arrival_s`` unless ``closed_loop``).
    """
    if not isinstance(source, RequestSource):
        source = RequestSource.of(source)
    if duration_s is not None and duration_s <= 0:
        raise InputError(f"invalid duration {duration_s}: must be positive")
    pool = config.pool
    usable = pool.num_blocks - 1
    need = cdiv(pool.max_model_len, pool.block_size) * sum(1 for g in pool.groups if g.kind != "state") + \
        sum(g.state_blocks for g in pool.groups)
    if need > usable:
        raise InputError(f"the pool ({usable:,} usable blocks) cannot hold one request at max_model_len "
                         f"{pool.max_model_len:,} ({need:,} blocks); vLLM would refuse to start",
                         "lower max_model_len or raise kv_budget")
    for p in policies:
        if p not in POLICIES:
            raise InputError(f"unknown policy {p!r}", "use one of: " + ", ".join(POLICIES))
    results = tuple(_Run(config, p, source, closed_loop, duration_s, seed, record_series).run() for p in policies)
    notes = []
    if any(g.kind == "state" for g in pool.groups) and "prefix_caching" in policies:
        notes.append("the model has state layers: the allocator makes no prefix hits for it (a cached prefix would "
                     "also need its saved state)")
    return SimResult(config, results, seed, duration_s, source.limit, tuple(notes))


# ---------------------------------------------------------------------------------------------
# from a Plan


def active_parameters(spec) -> int | None:  # noqa: ANN001 - kvplan.spec.ModelSpec
    """Parameters one token passes through: all of them, less the unrouted experts of a MoE
    (``(experts - experts per token) x 3 x hidden x moe_intermediate`` per layer; approximate)."""
    params = spec.parameters
    if not params:
        return None
    if spec.num_experts and spec.num_experts_per_token and spec.moe_intermediate_size:
        idle = (spec.num_experts - spec.num_experts_per_token) * 3 * spec.hidden_size * spec.moe_intermediate_size
        return max(params - idle * spec.num_layers_decoder, params // 20)
    return params


def config_from_plan(plan, *, prefill_s_per_token: float | None = None, decode_step_s: float | None = None,  # noqa: ANN001
                     prefill_efficiency: float = DEFAULT_PREFILL_EFFICIENCY) -> tuple[SimConfig, tuple[str, ...]]:
    """The pool, scheduler limits and step timing of a :class:`kvplan.plan.Plan` (one GPU's view).

    Layout groups map onto allocator groups as :func:`kvplan.paged.groups.allocator_groups` maps them (the
    mapping validate uses): the ``paged`` policy runs the plan's demand without prefix caching, the
    ``prefix_caching`` policy with it (state groups then keep vLLM's checkpoint blocks). The prefill cost per token is ``2 x active parameters / (GPUs x fp16 peak x
    prefill_efficiency)`` unless ``prefill_s_per_token`` is given.
    """
    from dataclasses import replace

    from kvplan import memory
    from kvplan.paged.groups import allocator_groups
    from kvplan.spec import LayerKind

    layout, notes = plan.layout, []
    bs, mnbt = layout.block_size, plan.max_num_batched_tokens
    notes.extend(f"a {g.cache.kind.value} group uses {g.block_size}-token blocks; simulated with {bs}-token blocks"
                 for g in layout.groups if g.block_size and g.block_size != bs)
    groups = allocator_groups(replace(plan.demand, prefix_caching=False))
    prefix_state = tuple(g.state_blocks for g in allocator_groups(replace(plan.demand, prefix_caching=True))
                         if g.kind == "state")
    if plan.answer.num_blocks < 2:
        raise InputError(f"the KV pool has {plan.answer.num_blocks} blocks: nothing to simulate",
                         "raise kv_budget, use a bigger GPU or lower the weights")
    pool = Pool(plan.answer.num_blocks, bs, groups, plan.max_model_len, plan.engine.max_num_seqs, mnbt, prefix_state)
    kv_dtype, model_dtype = layout.kv_dtype, layout.model_dtype
    full, windows = 0, {}
    for layer in plan.rank_layers:
        per_token = memory.layer_token_bytes(layer, kv_dtype)
        if layer.kind in (LayerKind.SLIDING, LayerKind.CHUNKED) and layer.window_tokens:
            windows[layer.window_tokens] = windows.get(layer.window_tokens, 0) + per_token
        else:
            full += per_token
    if prefill_s_per_token is None:
        tflops = plan.gpu.fp16_tflops
        active = active_parameters(plan.spec)
        if not tflops or not active:
            raise InputError(f"no FP16 peak for GPU {plan.gpu.name!r} or no parameter count for {plan.spec.model_id}",
                             "set timing.prefill_s_per_token in the workload")
        prefill_s_per_token = 2 * active / (plan.options.gpu_count * tflops * 1e12 * prefill_efficiency)
        if plan.spec.num_experts:
            notes.append(f"MoE prefill cost from ~{active / 1e9:.1f}B active parameters (approximate)")
    bandwidth = plan.gpu.bandwidth_bytes_per_s or 0.0
    if not bandwidth and decode_step_s is None:
        raise InputError(f"GPU {plan.gpu.name!r} has no HBM bandwidth in the catalogue",
                         "set timing.decode_step_s in the workload")
    timing = Timing(plan.budget.weights.bytes, float(bandwidth), full, tuple(sorted(windows.items())),
                    memory.state_bytes_per_request(plan.rank_layers, model_dtype), prefill_s_per_token, decode_step_s)
    return SimConfig(pool, timing), tuple(notes)
