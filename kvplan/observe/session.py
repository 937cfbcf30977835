"""The polling loop: fetch, parse, track, every ``interval_s`` until ``duration_s`` or Ctrl-C.

A poll never raises for what the server does: an unreachable or slow endpoint, an HTTP error, a page
that is not Prometheus text or has no engine metric is recorded as that poll's error, reported once as
an :class:`Event` (again only when it changes, and when the endpoint recovers), and the run goes on. A
metric the server does not export, a series that appears, and counters that go down (a restart) are
events too. Clock, wall clock, sleep and fetch are parameters so tests can run the loop without waiting.

The endpoint-wide view (``Observation.summary`` and each poll's ``total``) with several series: usage is
the fullest pool's (max), running and waiting are summed, counters are the sums of each series'
reset-adjusted counters, hit rates pool the counters (or average the gauges). With one series it is
that series' own summary.

Bounded: the timing (:func:`check_timing`: interval, duration, timeout within :data:`INTERVAL_S`,
:data:`DURATION_S`, :data:`TIMEOUT_S`), the samples kept (every poll up to :data:`MAX_SAMPLES`, then every
2nd, 4th, ... poll, evenly over the whole run; summaries still count every poll) and the events kept (the
last :data:`MAX_EVENTS`; each is still passed to ``on_event`` as it happens).
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from dataclasses import field, replace
from typing import Any, Callable, Mapping

from kvplan.observe.metrics import COUNTERS, PageError, SeriesReading, parse_page
from kvplan.observe.scrape import Endpoint, ScrapeError, fetch
from kvplan.observe.track import Summary, Tracker, finished_requests
from kvplan.units import check_number, plural
from kvplan.frozen import frozen

# (lowest, highest) seconds; the lowest of --duration is exclusive (any positive time)
INTERVAL_S = (0.05, 86_400.0)  # at most 20 polls a second, at least one a day
DURATION_S = (0.0, 30 * 86_400.0)  # 30 days
TIMEOUT_S = (0.05, 600.0)
MAX_SAMPLES = 20_000  # polls kept for --json / --csv / --plot before thinning to every 2nd (~1.4 KB each)
MAX_EVENTS = 1_000


def check_timing(interval_s: float, duration_s: float | None, timeout_s: float,
                 names: tuple[str, str, str] = ("interval_s", "duration_s", "timeout_s")) -> None:
    """Raise :class:`~kvplan.errors.InputError` unless the seconds are finite and within the bounds above
    (``names``: what the message calls them, e.g. the CLI flags)."""
    check_number(interval_s, names[0], low=INTERVAL_S[0], high=INTERVAL_S[1])
    if duration_s is not None:
        check_number(duration_s, names[1], low=DURATION_S[0], low_open=True, high=DURATION_S[1])
    check_number(timeout_s, names[2], low=TIMEOUT_S[0], high=TIMEOUT_S[1])


@frozen
class Event:
    """Something worth one line: a fault, a recovery, a missing metric, a counter reset, a new series."""

    poll: int
    elapsed_s: float
    message: str


@frozen
class Poll:
    """One poll: when (unix ``t``, seconds since the start), its error, the endpoint-wide row, and a row
    per series name (see :meth:`kvplan.observe.track.Tracker.add`)."""

    index: int
    t: float
    elapsed_s: float
    error: str | None
    total: Mapping[str, Any]
    series: Mapping[str, Mapping[str, Any]]


@frozen
class Outage:
    """Polls in a row that did not read the endpoint: from ``start_s`` (the first failed poll) to
    ``end_s`` (the poll that read it again; None: it never did), ``failed_polls`` of them, the last error."""

    start_s: float
    failed_polls: int
    end_s: float | None
    error: str


MAX_OUTAGES = 100  # outages kept (the earliest and the last ones); the count goes on


@frozen
class SeriesResult:
    """One series over the run: who it is, which metric names it used, what it lacks, its summary."""

    name: str
    family: str  # kvplan's engine name: a key of kvplan.observe.metrics.FAMILIES
    labels: tuple[tuple[str, str], ...]
    engine: str
    metrics: Mapping[str, str]
    missing: tuple[str, ...]
    cache_config: Mapping[str, str]
    summary: Summary
    rejected_values: Mapping[str, int] = field(default_factory=dict)  # metric name -> polls its value was left out


@frozen
class Observation:
    """Everything one run measured. ``stopped``: ``duration``, ``interrupted`` or ``running``.
    ``num_polls`` / ``failed_polls`` count every poll; ``polls`` holds every ``sample_stride``-th of them in
    a finished run (every one up to :data:`MAX_SAMPLES`), and is empty in the live view's snapshots (which
    must not copy a long run's history every poll). ``events``: the last :data:`MAX_EVENTS`;
    ``events_dropped``: how many earlier ones are not kept."""

    endpoint: str
    interval_s: float
    duration_s: float | None
    timeout_s: float
    started_at: float
    elapsed_s: float
    stopped: str
    num_polls: int
    failed_polls: int
    polls: tuple[Poll, ...]
    series: tuple[SeriesResult, ...]
    summary: Summary
    events: tuple[Event, ...]
    sample_stride: int = 1
    events_dropped: int = 0
    outages: tuple[Outage, ...] = ()  # runs of failed polls, in order (at most MAX_OUTAGES kept)
    num_outages: int = 0

    @property
    def read_polls(self) -> int:
        return self.num_polls - self.failed_polls

    def outage_findings(self) -> list[str]:
        """One line per outage worth a finding: the endpoint stopping (never read again), or polls failing
        in the middle of the run; failed polls before the first read are the server starting (named, as
        the run's summary starts later). No finding when every poll read the endpoint."""
        out = []
        for o in self.outages:
            if o.end_s is None and o.start_s == 0 and not self.read_polls:
                continue  # nothing ever read: the command fails with that error instead
            span = f"{plural(o.failed_polls, 'poll')} failed"
            if o.end_s is None:
                out.append(f"the endpoint stopped answering at {o.start_s:,.1f} s: the last {o.failed_polls:,} of "
                           f"{self.num_polls:,} polls failed ({o.error}); the summary covers the polls before")
            elif o.start_s == 0 and o is self.outages[0] and self.polls and self.polls[0].error is not None:
                out.append(f"the endpoint answered from {o.end_s:,.1f} s on: the first {span} ({o.error})")
            else:
                out.append(f"the endpoint did not answer from {o.start_s:,.1f} to {o.end_s:,.1f} s: {span} ({o.error})")
        if self.num_outages > len(self.outages):
            out.append(f"{self.num_outages - len(self.outages):,} more outages not listed")
        return out


class Session:
    """The state of one observation; :meth:`poll` once per interval, :meth:`snapshot` any time."""

    def __init__(self, where: Endpoint, *, interval_s: float, duration_s: float | None, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 fetcher: Callable[[Endpoint, float], str] = fetch,
                 on_event: Callable[[Event], None] | None = None) -> None:
        check_timing(interval_s, duration_s, timeout_s)
        self.where, self.interval_s, self.duration_s, self.timeout_s = where, interval_s, duration_s, timeout_s
        self.clock, self.wall, self.fetcher, self.on_event = clock, wall, fetcher, on_event
        self.start = clock()
        self.started_at = wall()
        self.polls: list[Poll] = []  # every ``stride``-th poll
        self.stride = 1
        self.num_polls = 0
        self.events: deque[Event] = deque(maxlen=MAX_EVENTS)
        self.num_events = 0
        self.restarts = 0  # polls at which some series' counters went down
        self.rejected: dict[tuple[str, Any], Mapping[str, str]] = {}  # the last poll's rejected values per series
        self.rejected_polls: dict[tuple[str, Any], Counter[str]] = {}
        self.trackers: dict[tuple[str, Any], Tracker] = {}
        self.latest: dict[tuple[str, Any], SeriesReading] = {}
        self.missing: dict[tuple[str, Any], tuple[str, ...]] = {}
        self.total = Tracker()
        self._error: str | None = None
        self._failed = 0  # failed polls in a row
        self._failed_total = 0
        self._first_read = -1  # index of the first poll that read the endpoint
        self.outages: list[Outage] = []
        self.num_outages = 0
        self._outage_start: float | None = None

    def _event(self, poll: int, elapsed: float, message: str) -> None:
        event = Event(poll, round(elapsed, 3), message)
        self.events.append(event)
        self.num_events += 1
        if self.on_event:
            self.on_event(event)

    def poll(self) -> Poll:
        """Fetch and record one page; errors become the poll's ``error`` (and an event when new)."""
        index, elapsed, t = self.num_polls, self.clock() - self.start, self.wall()
        try:
            page = parse_page(self.fetcher(self.where, self.timeout_s))
        except (ScrapeError, PageError) as exc:
            error = exc.one_line()
            if error != self._error:
                self._event(index, elapsed, error)
            if not self._failed:
                self._outage_start = elapsed
            self._error, self._failed, self._failed_total = error, self._failed + 1, self._failed_total + 1
            return self._keep(Poll(index, t, elapsed, error, {}, {}))
        if self._failed:
            self._event(index, elapsed, f"{self.where.display}: metrics readable again after {self._failed} failed poll(s)")
            self._close_outage(elapsed)
        self._error, self._failed = None, 0
        self._first_read = index if self._first_read < 0 else self._first_read
        rows = {}
        for reading in page.series:
            rows[reading.name] = self._track(index, elapsed, reading)
        self.restarts += any(row["resets"] for row in rows.values())
        return self._keep(Poll(index, t, elapsed, None, self._total_row(elapsed, rows), rows))

    def _close_outage(self, end_s: float | None) -> None:
        """Record the failed polls in a row that end now (``end_s`` None: the run ended in them)."""
        outage = Outage(round(self._outage_start or 0.0, 3), self._failed, None if end_s is None else round(end_s, 3),
                        self._error or "")
        self.num_outages += 1
        if len(self.outages) < MAX_OUTAGES:
            self.outages.append(outage)
        else:  # keep the earliest ones and the latest
            self.outages[-1] = outage

    def _outages(self) -> tuple[tuple[Outage, ...], int]:
        """The outages so far, the one still going included (its ``end_s`` None)."""
        if not self._failed:
            return tuple(self.outages), self.num_outages
        going = Outage(round(self._outage_start or 0.0, 3), self._failed, None, self._error or "")
        return (*self.outages[: MAX_OUTAGES - 1], going), self.num_outages + 1

    def _keep(self, poll: Poll) -> Poll:
        """Count the poll; keep it if it falls on the stride; past MAX_SAMPLES, keep every 2nd of those kept."""
        self.num_polls += 1
        if poll.index % self.stride == 0:
            self.polls.append(poll)
            if len(self.polls) > MAX_SAMPLES:
                self.polls, self.stride = self.polls[::2], self.stride * 2
                self._event(poll.index, poll.elapsed_s, f"over {MAX_SAMPLES:,} samples: one poll in {self.stride} "
                            "is kept for the samples, evenly since the start (memory stays bounded); the summary "
                            "counts every poll")
        return poll

    def _track(self, index: int, elapsed: float, reading: SeriesReading) -> dict[str, Any]:
        key = reading.key
        if key not in self.trackers:
            self.trackers[key] = Tracker()
            if index > self._first_read:  # not on the first poll that read the endpoint
                self._event(index, elapsed, f"new series: {reading.name} ({reading.engine})")
        missing = reading.missing()
        if missing != self.missing.get(key, ()):
            if missing:
                self._event(index, elapsed, f"{reading.name} ({reading.engine}) does not report: {'; '.join(missing)}")
            self.missing[key] = missing
        self._reject(index, elapsed, reading)
        self.latest[key] = reading
        row = self.trackers[key].add(elapsed, {**reading.values, **reading.timing}, reading.num_gpu_blocks,
                                     reading.block_size)
        if row["resets"]:
            self._event(index, elapsed, f"{reading.name}: counters went down ({', '.join(row['resets'])}): "
                                        "the server restarted; counting on from the new values")
        return row

    def _reject(self, index: int, elapsed: float, reading: SeriesReading) -> None:
        """One event when a metric's value turns unusable (not again while it stays so); count the polls."""
        before = self.rejected.get(reading.key, {})
        counts = self.rejected_polls.setdefault(reading.key, Counter())
        for fld, why in reading.rejected.items():
            counts[reading.names[fld]] += 1
            if fld not in before:
                self._event(index, elapsed, f"{reading.name}: {why}: value left out")
        self.rejected[reading.key] = reading.rejected

    def _total_row(self, elapsed: float, rows: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
        if len(self.trackers) == 1:
            return next(iter(rows.values()))
        values: dict[str, float] = {}
        present = list(rows.values())
        for name, combine in (("usage", max), ("running", sum), ("waiting", sum)):
            got = [r[name] for r in present if name in r]
            if got:
                values[name] = combine(got)
        gauges = [r["prefix_hit_rate"] for r in present if "prefix_queries" not in r and r.get("prefix_hit_rate") is not None]
        if gauges:
            values["prefix_hit_rate"] = sum(gauges) / len(gauges)
        self.total.add(elapsed, values)
        row: dict[str, Any] = dict(values)
        for name in COUNTERS:
            adjusted = [tr.counters[name].adjusted for tr in self.trackers.values() if tr.counters[name].first is not None]
            if adjusted:
                row[name] = sum(adjusted)
        for name in ("prompt_tokens_per_s", "generation_tokens_per_s"):
            got = [r[name] for r in present if r.get(name) is not None]
            row[name] = sum(got) if got else None
        if "prefix_queries" in row:
            row["prefix_hit_rate"] = row["prefix_hits"] / row["prefix_queries"] if row.get("prefix_hits") is not None \
                and row["prefix_queries"] else None
        row["resets"] = sorted({n for r in present for n in r["resets"]})
        return row

    def snapshot(self, stopped: str = "running", with_polls: bool = True) -> Observation:
        """The observation so far; summaries come from running sums, so ``with_polls=False`` is cheap."""
        series = []
        for key, tracker in self.trackers.items():
            r = self.latest[key]
            series.append(SeriesResult(r.name, r.family, r.labels, r.engine, dict(r.names), self.missing.get(key, ()),
                                       dict(r.cache_config), tracker.summary(),
                                       dict(sorted(self.rejected_polls.get(key, Counter()).items()))))
        if len(series) == 1:
            summary = series[0].summary
        else:
            summary = combine(self.total.summary(), list(self.trackers.values()), self.num_polls - self._failed_total,
                              self.restarts)
        outages, num_outages = self._outages()
        return Observation(self.where.display, self.interval_s, self.duration_s, self.timeout_s, self.started_at,
                           round(self.clock() - self.start, 3), stopped, self.num_polls, self._failed_total,
                           tuple(self.polls) if with_polls else (), tuple(series), summary, tuple(self.events),
                           self.stride, self.num_events - len(self.events), outages, num_outages)


def combine(gauges: Summary, trackers: list[Tracker], polls: int, restarts: int = 0) -> Summary:
    """The endpoint-wide summary of several series: pooled gauges (``gauges``) and summed counters;
    ``restarts``: the polls at which any series' counters went down."""
    if not trackers:
        return replace(gauges, polls=polls)
    counters = {name: [t.counters[name] for t in trackers if t.counters[name].first is not None] for name in COUNTERS}
    firsts = [t.t_first for t in trackers if t.t_first is not None]
    lasts = [t.t_last for t in trackers if t.t_last is not None]
    elapsed = max(lasts) - min(firsts) if firsts and lasts else 0.0

    def total(name: str, attr: str = "adjusted") -> float | None:
        got = counters[name]
        return sum(getattr(c, attr) for c in got) if got else None

    def per_s(name: str) -> float | None:
        inc = total(name, "increase")
        return inc / elapsed if inc is not None and elapsed > 0 else None

    pre_run = total("preemptions", "increase")
    hits, queries = total("prefix_hits"), total("prefix_queries")
    hit_fields: dict[str, Any] = {}
    if queries is not None:
        run_q = total("prefix_queries", "increase")
        hit_fields = {"prefix_hit_rate": hits / queries if hits is not None and queries else None,
                      "prefix_hit_rate_during_run": (total("prefix_hits", "increase") or 0) / run_q if run_q else None,
                      "prefix_hit_rate_source": "counters"}
    blocks = {t.num_gpu_blocks for t in trackers}
    sizes = {t.block_size for t in trackers}
    done = finished_requests(total("finished_requests", "increase"), total("finished_prompt_tokens", "increase") or 0.0,
                             total("finished_generation_tokens", "increase") or 0.0, elapsed)
    return replace(
        gauges, polls=polls, preemptions=total("preemptions"), preemptions_during_run=pre_run, **done,
        preemptions_per_min=pre_run * 60 / elapsed if pre_run is not None and elapsed > 0 else None,
        prompt_tokens_per_s=per_s("prompt_tokens"), generation_tokens_per_s=per_s("generation_tokens"),
        num_gpu_blocks=blocks.pop() if len(blocks) == 1 else None, block_size=sizes.pop() if len(sizes) == 1 else None,
        counter_resets=restarts, **hit_fields,
    )


def run(session: Session, *, sleep: Callable[[float], None] = time.sleep,
        on_poll: Callable[[Session], None] | None = None) -> Observation:
    """Poll at ``start + k x interval`` (skipping slots a slow poll overran) until the duration has passed
    or Ctrl-C; returns the observation either way (``stopped`` says which)."""
    interval, duration = session.interval_s, session.duration_s
    k = 0
    try:
        while True:
            session.poll()
            if on_poll:
                on_poll(session)
            k += 1
            now = session.clock() - session.start
            if k * interval < now:
                k = math.floor(now / interval) + 1
            if duration is not None and k * interval > duration + 1e-9:
                break
            sleep(max(0.0, k * interval - (session.clock() - session.start)))
    except KeyboardInterrupt:
        return session.snapshot("interrupted")
    return session.snapshot("duration")
