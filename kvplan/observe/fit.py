"""One observed run as a step-time measurement (``kvplan observe --fit-timing FILE``).

Between two polls at which requests were running the engine was busy, and its counters say what it did
in that time: engine steps (vLLM's ``iteration_tokens_total`` histogram counts one per step), tokens
generated (less the first tokens, which prefill steps sample), prompt tokens computed (prompt tokens less
prefix-cache hits). Summed over those intervals they are one :class:`kvplan.sim.timing.TimingRun`; the
finished requests' prompt and generated tokens give the mean context a decoding sequence read (prompt +
half the output), and the pool's usage (mean of the interval's two polls x its blocks x block size) the KV
tokens it held per step. Intervals with an idle poll at either end are left out (the engine may have waited).

A run with preemptions is kept, with a note: vLLM does not count a preempted request's recomputed prompt
in its prompt tokens, so that work is in the busy seconds but not in the prefill tokens.
"""

from __future__ import annotations

from typing import Any

from kvplan.errors import InputError
from kvplan.sim.timing import TimingRun
from kvplan.frozen import frozen

_NEEDED = ("steps", "generation_tokens", "first_tokens", "prompt_tokens")


@frozen
class RunMeasure:
    """The run and what to say about it (``notes``)."""

    run: TimingRun
    notes: tuple[str, ...]
    busy_intervals: int
    intervals: int


def _delta(a: Any, b: Any, name: str) -> float | None:
    x, y = a.get(name), b.get(name)
    return None if x is None or y is None else y - x


def _series_rows(obs: Any, series: str | None) -> tuple[str, list[Any], list[dict[str, Any]]]:
    """The series measured (``series``, default the only one), its polls that read it and its rows in them; raises
    :class:`InputError` when the endpoint has several series and none is named, or the page lacks a counter the
    fit needs."""
    names = [s.name for s in obs.series]
    if series is None:
        if len(names) != 1:
            raise InputError(f"--fit-timing measures one engine; the endpoint has {len(names)} series ({', '.join(names)})",
                             "pass --served-model-name for the one to measure" if names else None)
        series = names[0]
    polls = [p for p in obs.polls if p.error is None and series in p.series]
    rows = [p.series[series] for p in polls]
    lacking = [n for n in _NEEDED if not any(n in r for r in rows)]
    if lacking:
        from kvplan.observe.metrics import VLLM_NAMES

        shown = ", ".join(VLLM_NAMES.get(n, (n,))[0] for n in lacking)
        raise InputError(f"--fit-timing needs counters {series} does not report: {shown}",
                         "vLLM V1 (0.9 and later) reports them on /metrics")
    return series, polls, rows


def timing_run(obs: Any, series: str | None = None, source: str = "") -> RunMeasure:
    """The run ``obs`` (a :class:`kvplan.observe.session.Observation`) measured, from the polls of one series
    (``series``: its name; default the only one). Raises :class:`InputError` when the page lacks a counter
    the fit needs or no interval had requests running."""
    series, polls, rows = _series_rows(obs, series)
    summary = next(x.summary for x in obs.series if x.name == series)
    pool_tokens = (summary.num_gpu_blocks * summary.block_size if summary.num_gpu_blocks and summary.block_size
                   else summary.max_total_num_tokens or 0)
    busy_s = 0.0
    totals = dict.fromkeys(("steps", "generation_tokens", "first_tokens", "prompt_tokens", "prefix_hits"), 0.0)
    running, busy, preempted, held_steps = [], 0, 0.0, 0.0
    for (pa, a), (pb, b) in zip(zip(polls, rows), zip(polls[1:], rows[1:])):
        if not (a.get("running") or 0) > 0 or not (b.get("running") or 0) > 0:
            continue
        deltas = {name: _delta(a, b, name) for name in totals}
        if deltas["steps"] is None or deltas["steps"] <= 0 or any(deltas[n] is None for n in _NEEDED):
            continue
        busy += 1
        busy_s += pb.elapsed_s - pa.elapsed_s
        for name, d in deltas.items():
            totals[name] += d or 0.0
        running.append((a["running"] + b["running"]) / 2)
        preempted += _delta(a, b, "preemptions") or 0.0
        if a.get("usage") is not None and b.get("usage") is not None:  # the KV the pool held in the interval
            held_steps += deltas["steps"] * (a["usage"] + b["usage"]) / 2 * pool_tokens
    if not busy:
        raise InputError(f"--fit-timing: no interval between two polls had requests running on {series}",
                         "observe while the server is loaded (a closed loop of users), for a few intervals")
    first, last = rows[0], rows[-1]
    finished = _delta(first, last, "finished_requests") or 0.0
    if finished > 0:
        prompt = (_delta(first, last, "finished_prompt_tokens") or 0.0) / finished
        output = (_delta(first, last, "finished_generation_tokens") or 0.0) / finished
        context = prompt + output / 2
    else:
        context = 0.0
    notes = []
    if finished <= 0:
        notes.append("no request finished during the run: the mean context is unknown (0), so the run cannot tell "
                     "the per-token cost apart")
    if preempted:
        notes.append(f"{preempted:,.0f} preemptions during the run: their recomputed prompts are in the busy time but "
                     "not in vLLM's prompt tokens (calibrate on loads without preemption)")
    if busy < len(polls) - 1:
        notes.append(f"{len(polls) - 1 - busy} of {len(polls) - 1} intervals left out (a poll with no request running, "
                     "or a failed poll)")
    run = TimingRun(busy_s=busy_s, steps=int(round(totals["steps"])),
                    decode_tokens=int(round(max(0.0, totals["generation_tokens"] - totals["first_tokens"]))),
                    prefill_tokens=int(round(max(0.0, totals["prompt_tokens"] - totals["prefix_hits"]))),
                    mean_context_tokens=context, running_mean=sum(running) / len(running), preemptions=int(preempted),
                    source=source, held_tokens=held_steps / totals["steps"] if totals["steps"] else 0.0)
    return RunMeasure(run, tuple(notes), busy, len(polls) - 1)
