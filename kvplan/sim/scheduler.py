"""The continuous-batching step loop of one policy (see :mod:`kvplan.sim.simulate` for the model).

Each step: running requests go first (a decoder that needs a block when none is free preempts the
newest running request), partial prefills continue, then (if nothing was preempted) waiting requests are
admitted in order while a seat, the token budget and the blocks of the whole prompt are available.
Between events the clock advances ``k`` decode steps at once when nothing can happen in between (their
time summed in closed form), which is exact: a test runs the same workload one step at a time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from kvplan.errors import InputError
from kvplan.sim.blocks import BlockBook
from kvplan.sim.metrics import Metrics
from kvplan.sim.model import POLICIES, ClosedLoop, PolicyResult, Series, SimConfig, window_sum
from kvplan.sim.streams import Arrivals, Live, RequestSource, WaitQueue

Tick = Callable[[float, int], None]
"""``tick(simulated_seconds, work_done)``: called every :data:`TICK_EVENTS` events (progress, bounds)."""
TICK_EVENTS = 2048


class Scheduler:
    """One policy over one request stream."""

    def __init__(self, config: SimConfig, policy: str, source: RequestSource, closed: ClosedLoop | None,
                 stop_s: float | None, seed: int, record_series: bool, tick: Tick | None = None) -> None:
        if policy not in POLICIES:
            raise InputError(f"unknown policy {policy!r}", "use one of: " + ", ".join(POLICIES))
        self.pool, self.timing, self.policy, self.stop_s = config.pool, config.timing, policy, stop_s
        self.book = BlockBook(config.pool, policy)
        self.bs = config.pool.block_size
        self.reserve = policy == "contiguous"
        self.arrivals = Arrivals(source, closed, seed, config.pool.max_model_len)
        self.waiting = WaitQueue(source, config.pool.max_model_len)
        self.metrics = Metrics(record_series, stop_s)
        self.tick = tick
        self.running: dict[int, Live] = {}  # admission order: the last is the newest
        self.prefilling: dict[int, int] = {}  # request -> prompt tokens still to compute
        self.heap: list[tuple[int, int, int]] = []  # (finish D, request, epoch)
        self.D = 0  # decode step counter
        self.t = 0.0
        self.admit_ok = True  # the queue head may be admissible (something changed since it failed)
        self._windows = self.timing.window_token_bytes

    # ---- state helpers ------------------------------------------------------------------------
    def _prefill_tokens(self) -> int:
        running = self.running
        return sum(running[i].pf_tokens for i in self.prefilling)

    def _usage_and_frag(self) -> tuple[float, float]:
        prefill = self._prefill_tokens() if self.reserve else 0
        return self.book.usage_and_frag(self.D, len(self.running), prefill)

    def _mark_start(self) -> None:
        self.metrics.mark_start(*self._usage_and_frag())

    def _sample(self, dt: float, n_running: int) -> None:
        """Account an interval of ``dt`` seconds that ends now (before finishes are freed)."""
        usage, frag = self._usage_and_frag()
        self.metrics.sample(self.t, dt, usage, frag, n_running)

    def _preempt(self, r: Live) -> None:
        i = r.index
        self.book.free(r)
        del self.running[i]
        if i in self.prefilling:
            del self.prefilling[i]
            self.book.prefill_done(r)
        else:
            self.book.remove_decoder(r)
            r.gen = r.out - (r.fin_d - self.D)
        r.epoch += 1
        self.waiting.push_front(r)
        self.metrics.preemptions += 1
        self.admit_ok = True

    def _finish(self, r: Live) -> None:
        self.book.free(r)
        del self.running[r.index]
        r.gen = r.out
        self.metrics.finished += 1
        self.admit_ok = True
        self.arrivals.user_done(self.t)

    # ---- timing -------------------------------------------------------------------------------
    def _decode_seconds(self, k: int, grown: bool = False) -> float:
        """Seconds of ``k`` decode steps from counter D with the current decoders (closed form). ``grown``:
        the (one) step's decoders already took their blocks (a step; a span takes them as it goes)."""
        tm, book = self.timing, self.book
        if tm.decode_step_s is not None:
            return k * tm.decode_step_s
        n, D = book.n_dec, self.D
        # decoder i at step j reads L + 1 = D + j + off_i + 1 tokens; summed over j < k and decoders:
        tokens = n * k * (D + 1) + n * (k * (k - 1) // 2) + k * book.s_off
        if tm.fit is not None:
            f = tm.fit
            total = k * f.step_base_s + f.step_s_per_seq * k * n + f.step_s_per_kv_token * tokens
            if f.step_s_per_held_token:  # the blocks in use at each step, its own crossings taken
                held = k * book.alloc.num_used_blocks + (0 if grown else book.crossings_sum(D, k))
                total += f.step_s_per_held_token * held * self.bs
            return total
        total = k * tm.weights_bytes + tm.full_token_bytes * tokens + k * n * tm.state_bytes
        if self._windows and n:
            offs = book.offs()
            for window, per_token in self._windows:
                total += per_token * sum(window_sum(D + o + 1, k, window) for o in offs)
        return total / tm.bandwidth_bytes_per_s

    # ---- one step with scheduling -------------------------------------------------------------
    def _grow_decoders(self) -> bool:
        """The decoders crossing a block boundary this step take their block; True when one preempted."""
        book, D, preempted = self.book, self.D, False
        crossing = book.crossing(D)
        if self.reserve or not book.n_dec or not crossing:
            return False
        if len(crossing) * book.n_attn <= book.alloc.num_free_blocks:
            for r in list(crossing.values()):
                ok = book.sync(r, D + r.off + 1)
                assert ok
            return False
        # in running order; preempt the newest until each fits (vLLM v1)
        for r in [r for i, r in self.running.items() if i in crossing]:
            if r.index not in self.running:
                continue
            while not book.sync(r, D + r.off + 1):
                victim = next(reversed(self.running.values()))
                self._preempt(victim)
                preempted = True
                if victim is r:
                    break
        return preempted

    def _admit(self, budget: int, chunks: list[tuple[int, int]]) -> int:
        """Admit waiting requests in order while a seat, token budget and blocks allow; returns prefill tokens."""
        prefill, blocked, waiting = 0, False, self.waiting
        while waiting and budget > 0:
            if len(self.running) >= self.pool.max_num_seqs:
                blocked = True
                break
            r = waiting.head()
            n = r.prompt + r.gen
            hit = self.book.admit(r, n)
            if hit is None:
                blocked = True
                break
            waiting.pop_head()
            if r.first_sched < 0:
                r.first_sched = self.t
            self.running[r.index] = r
            left = n - hit
            self.prefilling[r.index] = left
            c = min(left, budget)
            budget -= c
            prefill += c
            chunks.append((r.index, c))
        self.admit_ok = not blocked
        return prefill

    def _step(self) -> None:
        preempted = self._grow_decoders()
        book, m = self.book, self.metrics
        budget = self.pool.max_num_batched_tokens - book.n_dec
        chunks: list[tuple[int, int]] = []  # (request, prompt tokens computed this step)
        for i, left in self.prefilling.items():
            if budget <= 0:
                break
            c = min(left, budget)
            budget -= c
            chunks.append((i, c))
        if not preempted and self.waiting:
            self._admit(budget, chunks)
        prefill = sum(c for _, c in chunks)
        n_running = len(self.running)
        assert n_running, "an empty pool admits the queue head (checked when the run starts)"
        self._mark_start()
        dt = self._decode_seconds(1, grown=True) + prefill * self.timing.prefill_s_per_token
        self.t += dt
        self.D = D = self.D + 1
        m.num_steps += 1
        m.num_events += 1
        m.prefill_tokens += prefill
        m.generated += book.n_dec
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
            r = self.running[i]
            book.prefill_done(r)
            r.gen += 1
            m.generated += 1
            if r.first_token < 0:
                r.first_token = self.t
                m.first_token(r.first_sched - r.arrival, self.t - r.arrival)
            if r.gen >= r.out:
                self._finish(r)
                continue
            r.off = r.pf_tokens - D
            r.fin_d = D + r.out - r.gen
            book.add_decoder(r)
            heapq.heappush(self.heap, (r.fin_d, i, r.epoch))
        self._finish_decoders()

    def _live_top(self) -> tuple[int, Live] | None:
        """The heap's first entry that is a current decoder: (finish D, request); stale entries dropped."""
        heap, running, prefilling = self.heap, self.running, self.prefilling
        while heap:
            d, i, e = heap[0]
            r = running.get(i)
            if r is None or e != r.epoch or i in prefilling:
                heapq.heappop(heap)
                continue
            return d, r
        return None

    def _finish_decoders(self) -> None:
        while (top := self._live_top()) is not None and top[0] <= self.D:
            heapq.heappop(self.heap)
            self.book.remove_decoder(top[1])
            self._finish(top[1])

    def _next_finish_steps(self) -> int:
        top = self._live_top()
        return top[0] - self.D if top is not None else 0

    # ---- k decode steps at once ---------------------------------------------------------------
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
        book = self.book
        if self.prefilling or not book.n_dec or (self.waiting and self.admit_ok):
            return False
        k = self._next_finish_steps()
        if k < 2:
            return False
        if not self.reserve:
            free = book.alloc.num_free_blocks
            if book.crossings(self.D, k) > free:
                lo, hi = 0, k  # crossings(lo) <= free < crossings(hi)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if book.crossings(self.D, mid) <= free:
                        lo = mid
                    else:
                        hi = mid
                k = lo
                if k < 2:
                    return False
        bounds = []
        nxt = self.arrivals.next_time()
        if not self.waiting and nxt is not None:
            bounds.append(nxt)
        if self.stop_s is not None:
            bounds.append(self.stop_s)
        if bounds:
            k = self._steps_before(min(bounds) - self.t, k)
            if k < 2:
                return False
        self._mark_start()
        dt = self._decode_seconds(k)
        book.advance(self.D, k)
        m = self.metrics
        self.t += dt
        self.D += k
        m.num_steps += k
        m.num_events += 1
        m.generated += k * book.n_dec
        self._sample(dt, len(self.running))
        self._finish_decoders()
        return True

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> PolicyResult:
        arrivals, waiting, stop, m, tick = self.arrivals, self.waiting, self.stop_s, self.metrics, self.tick
        arrivals.start()
        next_tick = m.num_events + TICK_EVENTS
        while True:
            if arrivals.pull(self.t, waiting) and waiting:
                self.admit_ok = True
            if stop is not None and self.t >= stop:
                break
            if tick is not None and m.num_events >= next_tick:
                tick(self.t, arrivals.num_arrived + m.generated)
                next_tick = m.num_events + TICK_EVENTS
            if not self.running and not waiting:
                nxt = arrivals.next_time()
                if nxt is None:
                    break
                if stop is not None and nxt >= stop:
                    m.idle(stop, stop - self.t)
                    self.t = stop
                    break
                m.idle(nxt, nxt - self.t)
                self.t = nxt
                continue
            if not self._span():
                self._step()
        return self._result()

    def _result(self) -> PolicyResult:
        t, m, arrivals = self.t, self.metrics, self.arrivals
        (delay_p50, ttft_p50), (delay_p99, ttft_p99) = m.latency_quantiles(50), m.latency_quantiles(99)
        return PolicyResult(
            policy=self.policy,
            duration_s=t,
            arrived=arrivals.num_arrived,
            finished=m.finished,
            queued=len(self.waiting),
            running=len(self.running),
            rejected=arrivals.rejected,
            requests_per_s=m.finished / t if t > 0 else 0.0,
            output_tokens=m.generated,
            output_tokens_per_s=m.generated / t if t > 0 else 0.0,
            concurrency_mean=m.concurrency_mean(),
            concurrency_p50=m.concurrency_percentile(50),
            concurrency_p99=m.concurrency_percentile(99),
            concurrency_max=m.concurrency_max(),
            usage_mean=m.time_mean(m.usage_area),
            usage_peak=m.usage_peak,
            fragmentation_mean=m.time_mean(m.frag_area),
            prefix_hit_rate=self.book.alloc.prefix_hit_rate,
            prefix_query_tokens=self.book.alloc.prefix_query_tokens,
            prefill_tokens=m.prefill_tokens,
            prefill_tokens_saved=self.book.alloc.prefix_hit_tokens,
            preemptions=m.preemptions,
            first_tokens=m.ttft.count,
            queue_delay_p50_s=delay_p50,
            queue_delay_p99_s=delay_p99,
            ttft_p50_s=ttft_p50,
            ttft_p99_s=ttft_p99,
            num_steps=m.num_steps,
            num_events=m.num_events,
            blocks_per_reservation=self.book.blocks_per_reservation,
            series=m.recorder.series() if m.recorder is not None else Series((), (), ()),
        )
