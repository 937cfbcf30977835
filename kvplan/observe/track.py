"""Running aggregation over polls: gauges (now / mean / peak) and counters across server restarts.

A counter that goes down between two polls was reset (the server restarted). As Prometheus's
``increase()`` does, the new value then counts in full as the increase since the reset, and the
*adjusted* counter (``first value + increase``) goes on rising: the total the server would show had it
never restarted. Summaries report:

- ``preemptions``: the adjusted total at the last poll (what the page says when nothing reset);
  ``preemptions_during_run``: the increase between the first and the last poll; per minute over the run;
- ``prefix_hit_rate``: hits / queries of the adjusted counters (vLLM V1), or the last value of the
  engine's hit-rate gauge (vLLM V0, SGLang); ``prefix_hit_rate_during_run``: increase of hits / increase
  of queries over the run, or the mean of the gauge over the polls;
- ``*_tokens_per_s``: increase over the run / seconds between the first and the last poll that read it;
- ``requests_per_s``, ``mean_prompt_tokens``, ``mean_output_tokens``: the requests that finished during the
  run (vLLM V1's ``request_prompt_tokens`` / ``request_generation_tokens`` histograms' counts and sums);
- ``counter_resets``: the polls at which counters went down (a server restart drops them all at once: one
  reset, however many counters it drops; each poll's row names the counters).

Times are seconds; usage and hit rates are fractions 0..1; requests and tokens are counts.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, Mapping

from kvplan.observe.metrics import COUNTERS, GAUGES
from kvplan.frozen import frozen


@frozen
class Summary:
    """One series (or the whole endpoint) over the run; ``None``: the server did not report it."""

    polls: int
    kv_cache_usage_now: float | None
    kv_cache_usage_mean: float | None
    kv_cache_usage_peak: float | None
    running_now: float | None
    running_mean: float | None
    running_peak: float | None
    waiting_now: float | None
    waiting_peak: float | None
    preemptions: float | None
    preemptions_during_run: float | None
    preemptions_per_min: float | None
    prefix_hit_rate: float | None
    prefix_hit_rate_during_run: float | None
    prefix_hit_rate_source: str | None  # "counters" or "gauge"
    prompt_tokens_per_s: float | None
    generation_tokens_per_s: float | None
    requests_per_s: float | None  # requests finished per second over the run (vLLM V1's request histograms)
    mean_prompt_tokens: float | None  # of the requests that finished during the run (prefix included)
    mean_output_tokens: float | None
    num_gpu_blocks: int | None
    block_size: int | None
    max_total_num_tokens: int | None
    counter_resets: int  # polls at which counters went down (restarts), not counters x restarts

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _clean(getattr(self, f.name)) for f in fields(self)}


def _clean(value: Any) -> Any:
    """Whole floats as ints (requests, tokens), others rounded to 6 places; never NaN or an infinity (not JSON:
    the page values are checked on the way in, so this is the last guard, ``None`` = not known)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return int(value) if value.is_integer() else round(value, 6)
    return value


class _Gauge:
    def __init__(self) -> None:
        self.n, self.total, self.peak, self.last = 0, 0.0, None, None  # type: ignore[assignment]

    def add(self, value: float) -> None:
        self.n += 1
        self.total += value
        self.peak = value if self.peak is None else max(self.peak, value)
        self.last = value

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None


class _Counter:
    """A counter's first value, reset-aware increase, and when it was first / last read."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.increase = 0.0
        self.t_first: float | None = None
        self.t_last: float | None = None

    def add(self, t: float, value: float) -> tuple[float | None, float | None, bool]:
        """Record ``value`` read at ``t``; returns (increase since the last read, seconds since it, reset?)."""
        if self.last is None:
            self.first, self.last, self.t_first, self.t_last = value, value, t, t
            return None, None, False
        reset = value < self.last
        delta = value if reset else value - self.last
        dt = t - self.t_last  # type: ignore[operator]
        self.increase += delta
        self.last, self.t_last = value, t
        return delta, dt, reset

    @property
    def adjusted(self) -> float | None:
        return None if self.first is None else self.first + self.increase

    @property
    def rate(self) -> float | None:
        """Increase per second over the run (None before two reads)."""
        if self.t_first is None or self.t_last is None or self.t_last <= self.t_first:
            return None
        return self.increase / (self.t_last - self.t_first)


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def finished_requests(count: float | None, prompt_tokens: float, output_tokens: float, elapsed_s: float) -> dict[str, Any]:
    """``requests_per_s``, ``mean_prompt_tokens``, ``mean_output_tokens`` of ``count`` requests finished
    over ``elapsed_s`` seconds holding ``prompt_tokens`` / ``output_tokens`` in all (None: not reported)."""
    return {"requests_per_s": count / elapsed_s if count is not None and elapsed_s > 0 else None,
            "mean_prompt_tokens": _ratio(prompt_tokens, count), "mean_output_tokens": _ratio(output_tokens, count)}


class Tracker:
    """Aggregates one series' readings poll by poll; :meth:`add` returns the sample row for that poll."""

    def __init__(self) -> None:
        self.gauges = {name: _Gauge() for name in GAUGES}
        self.counters = {name: _Counter() for name in COUNTERS}
        self.polls = 0
        self.restarts = 0  # polls at which counters went down
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.num_gpu_blocks: int | None = None
        self.block_size: int | None = None

    def add(self, t: float, values: Mapping[str, float], num_gpu_blocks: int | None = None,
            block_size: int | None = None) -> dict[str, Any]:
        """Record one poll's values (read at ``t`` seconds); the row: gauges as read, counters adjusted,
        ``prefix_hit_rate`` (gauge, or adjusted hits / queries), tokens/s since the previous read and the
        counters that reset at this poll."""
        self.polls += 1
        self.t_first = t if self.t_first is None else self.t_first
        self.t_last = t
        self.num_gpu_blocks = num_gpu_blocks if num_gpu_blocks is not None else self.num_gpu_blocks
        self.block_size = block_size if block_size is not None else self.block_size
        row: dict[str, Any] = {}
        for name in GAUGES:
            if name in values:
                self.gauges[name].add(values[name])
                row[name] = values[name]
        resets = []
        for name in sorted(COUNTERS):
            if name not in values:
                continue
            delta, dt, reset = self.counters[name].add(t, values[name])
            row[name] = self.counters[name].adjusted
            if name.endswith("_tokens"):
                row[f"{name}_per_s"] = delta / dt if delta is not None and dt else None
            if reset:
                resets.append(name)
        if "prefix_hit_rate" not in row and "prefix_queries" in row:
            row["prefix_hit_rate"] = _ratio(row.get("prefix_hits"), row["prefix_queries"])
        self.restarts += bool(resets)
        row["resets"] = resets
        return row

    def summary(self) -> Summary:
        g, c = self.gauges, self.counters
        elapsed = (self.t_last - self.t_first) if self.t_first is not None and self.t_last is not None else 0.0
        pre = c["preemptions"]
        if c["prefix_queries"].first is not None:
            hit, hit_run, source = (_ratio(c["prefix_hits"].adjusted, c["prefix_queries"].adjusted),
                                    _ratio(c["prefix_hits"].increase if c["prefix_hits"].first is not None else None,
                                           c["prefix_queries"].increase), "counters")
        elif g["prefix_hit_rate"].n:
            hit, hit_run, source = g["prefix_hit_rate"].last, g["prefix_hit_rate"].mean, "gauge"
        else:
            hit = hit_run = source = None
        max_tokens = g["max_total_tokens"].last
        return Summary(
            polls=self.polls,
            kv_cache_usage_now=g["usage"].last, kv_cache_usage_mean=g["usage"].mean, kv_cache_usage_peak=g["usage"].peak,
            running_now=g["running"].last, running_mean=g["running"].mean, running_peak=g["running"].peak,
            waiting_now=g["waiting"].last, waiting_peak=g["waiting"].peak,
            preemptions=pre.adjusted,
            preemptions_during_run=pre.increase if pre.first is not None else None,
            preemptions_per_min=pre.increase * 60 / elapsed if pre.first is not None and elapsed > 0 else None,
            prefix_hit_rate=hit, prefix_hit_rate_during_run=hit_run, prefix_hit_rate_source=source,
            prompt_tokens_per_s=c["prompt_tokens"].rate, generation_tokens_per_s=c["generation_tokens"].rate,
            **finished_requests(c["finished_requests"].increase if c["finished_requests"].first is not None else None,
                                c["finished_prompt_tokens"].increase, c["finished_generation_tokens"].increase, elapsed),
            num_gpu_blocks=self.num_gpu_blocks, block_size=self.block_size,
            max_total_num_tokens=int(max_tokens) if max_tokens is not None else None,
            counter_resets=self.restarts,
        )
