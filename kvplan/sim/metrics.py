"""Metrics of one simulated policy, kept as running sums and bounded sketches.

Nothing here grows with the number of requests or steps: time-weighted means are running trapezoid
sums, the running-requests distribution is a histogram over at most ``max_num_seqs + 1`` values,
latency percentiles come from :class:`QuantileSketch` (exact up to 65,536 values, then within 0.1%),
and the time series keeps at most :data:`SERIES_POINTS` samples.
"""

from __future__ import annotations

import math
from array import array

from kvplan.sim.model import Series

SERIES_POINTS = 4096  # samples kept for plots and JSON (the last sample of each equal time bin)
EXACT_QUANTILES = 65_536  # values kept exactly before the quantile sketch switches to buckets
_SUB_BUCKETS = 1024  # buckets per power of two: relative width <= 1 / 1024 (about 0.1%)


class QuantileSketch:
    """Nearest-rank percentiles of non-negative values in bounded memory.

    Exact (every value kept) up to :data:`EXACT_QUANTILES` values; past that, values go to logarithmic
    buckets (1,024 per power of two) that keep their count and largest value, and a percentile is the
    largest value of the bucket holding that rank: an observed value within 0.1% of the exact answer.
    """

    def __init__(self, exact_limit: int = EXACT_QUANTILES) -> None:
        self._values: array | None = array("d")
        self._limit = exact_limit
        self._buckets: dict[int, list] = {}  # key -> [count, max]
        self.count = 0

    @staticmethod
    def _key(x: float) -> int:
        if x <= 0:
            return -(1 << 40)  # zero (and -0.0) sort first
        m, e = math.frexp(x)  # x = m * 2**e, 0.5 <= m < 1
        return e * _SUB_BUCKETS + int((m - 0.5) * 2 * _SUB_BUCKETS)

    def _bucket(self, x: float) -> None:
        b = self._buckets.get(k := self._key(x))
        if b is None:
            self._buckets[k] = [1, x]
        else:
            b[0] += 1
            if x > b[1]:
                b[1] = x

    def add(self, x: float) -> None:
        self.count += 1
        values = self._values
        if values is not None:
            values.append(x)
            if len(values) > self._limit:
                for v in values:
                    self._bucket(v)
                self._values = None
            return
        self._bucket(x)

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q``-th percentile (None when empty)."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q / 100 * self.count))
        if self._values is not None:
            return sorted(self._values)[rank - 1]
        acc = 0
        for key in sorted(self._buckets):
            count, largest = self._buckets[key]
            acc += count
            if acc >= rank:
                return largest
        raise AssertionError("rank beyond the count")


class SeriesRecorder:
    """At most ``points`` samples (time, usage, running): the last sample of each equal time bin.

    Bins start ``bin_s`` wide (``duration / points`` when the duration is known) and double, merging
    pairs, whenever a sample falls past the last bin, so the kept samples cover the whole run.
    """

    def __init__(self, points: int = SERIES_POINTS, duration_s: float | None = None) -> None:
        self.points = points
        self.bin_s = duration_s / points if duration_s else 1e-3
        self._bins: dict[int, tuple[float, float, int]] = {}

    def add(self, t: float, usage: float, running: int) -> None:
        b = int(t / self.bin_s)
        while b >= self.points:
            self.bin_s *= 2
            merged: dict[int, tuple[float, float, int]] = {}
            for key in sorted(self._bins):
                merged[key // 2] = self._bins[key]  # the later sample of a pair wins
            self._bins = merged
            b = int(t / self.bin_s)
        self._bins[b] = (t, usage, running)

    def series(self) -> Series:
        samples = [self._bins[k] for k in sorted(self._bins)]
        return Series(tuple(s[0] for s in samples), tuple(s[1] for s in samples), tuple(s[2] for s in samples))


class Metrics:
    """Counters, time-weighted sums and latency sketches of one policy (times in seconds)."""

    def __init__(self, record_series: bool, duration_s: float | None) -> None:
        self.finished = self.preemptions = self.generated = self.prefill_tokens = 0
        self.num_steps = self.num_events = 0
        self.conc_hist: dict[int, float] = {}  # running requests -> seconds
        self.usage_area = self.frag_area = 0.0
        self.usage_peak = 0.0
        self.last_usage = self.last_frag = 0.0
        self.queue_delay = QuantileSketch()  # both over the same requests: those that got their first token
        self.ttft = QuantileSketch()
        self.recorder = SeriesRecorder(duration_s=duration_s) if record_series else None

    def mark_start(self, usage: float, frag: float) -> None:
        """The state at the start of the next interval (after frees and allocations)."""
        self.last_usage, self.last_frag = usage, frag

    def sample(self, t: float, dt: float, usage: float, frag: float, n_running: int) -> None:
        """Account an interval of ``dt`` seconds that ends at ``t`` (trapezoids between the marks)."""
        self.usage_area += (self.last_usage + usage) * 0.5 * dt
        self.frag_area += (self.last_frag + frag) * 0.5 * dt
        if usage > self.usage_peak:
            self.usage_peak = usage
        self.conc_hist[n_running] = self.conc_hist.get(n_running, 0.0) + dt
        if self.recorder is not None:
            self.recorder.add(t, usage, n_running)

    def first_token(self, queue_delay_s: float, ttft_s: float) -> None:
        """A request's first output token: its queue delay (arrival -> first scheduled) and its time to
        first token (arrival -> first token), recorded together so both figures are over the same requests
        (a request scheduled before the run stopped but not yet through its prefill counts in neither)."""
        assert 0 <= queue_delay_s <= ttft_s, (queue_delay_s, ttft_s)
        self.queue_delay.add(queue_delay_s)
        self.ttft.add(ttft_s)

    def latency_quantiles(self, q: float) -> tuple[float | None, float | None]:
        """(queue delay, time to first token) at the ``q``-th percentile. Each request's time to first token
        is at least its queue delay, so exact percentiles keep that order; past :data:`EXACT_QUANTILES`
        values two buckets' largest values may invert it by less than 0.1%, so the time to first token
        shown is never below the queue delay it includes."""
        delay, ttft = self.queue_delay.quantile(q), self.ttft.quantile(q)
        if delay is not None and ttft is not None and ttft < delay:
            ttft = delay
        return delay, ttft

    def idle(self, t: float, dt: float) -> None:
        """``dt`` seconds with nothing running, ending at ``t``."""
        if dt > 0:
            self.last_usage = self.last_frag = 0.0
            self.sample(t, dt, 0.0, 0.0, 0)
            self.num_events += 1

    @property
    def total_time(self) -> float:
        return sum(self.conc_hist.values())

    def concurrency_mean(self) -> float:
        total = self.total_time
        return sum(v * w for v, w in self.conc_hist.items()) / total if total else 0.0

    def concurrency_percentile(self, q: float) -> int:
        """Smallest running count whose cumulative time share reaches ``q`` percent (counts held for no
        time are left out, so a percentile is never above :meth:`concurrency_max`)."""
        hist = {v: w for v, w in self.conc_hist.items() if w > 0}
        total = sum(hist.values())
        if total <= 0:
            return 0
        acc = 0.0
        for value in sorted(hist):
            acc += hist[value]
            if acc >= q / 100 * total * (1 - 1e-12):
                return value
        return max(hist)

    def concurrency_max(self) -> int:
        return max((v for v, w in self.conc_hist.items() if w > 0), default=0)

    def time_mean(self, area: float) -> float:
        total = self.total_time
        return area / total if total else 0.0
