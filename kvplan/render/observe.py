"""``kvplan observe`` output: the rich live view and summary, JSON, CSV (one row per poll and series), plot.

Nothing here measures or plans: every number comes from the :class:`~kvplan.observe.session.Observation`,
the :class:`~kvplan.observe.compare.PlanView` (the ``kvplan estimate`` plan) and the gate outcomes.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from kvplan.units import fmt_seconds, plural

SCHEMA_VERSION = 1
# tracker row field -> JSON / CSV key
ROW_KEYS = {
    "usage": "kv_cache_usage", "running": "running", "waiting": "waiting", "preemptions": "preemptions",
    "prefix_queries": "prefix_cache_queries", "prefix_hits": "prefix_cache_hits", "prefix_hit_rate": "prefix_hit_rate",
    "prompt_tokens": "prompt_tokens", "generation_tokens": "generation_tokens",
    "prompt_tokens_per_s": "prompt_tokens_per_s", "generation_tokens_per_s": "generation_tokens_per_s",
    "max_total_tokens": "max_total_num_tokens", "resets": "counter_resets",
}


def _num(value: Any) -> Any:
    """Whole floats as ints, others to 6 places; NaN and infinities (not JSON) as ``None``."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return int(value) if value.is_integer() else round(value, 6)
    return value


def row_to_dict(row: Mapping[str, Any]) -> dict[str, Any]:
    """A tracker row under its JSON keys; keys the server did not report are ``null``."""
    return {key: _num(row.get(field)) if field != "resets" else list(row.get(field) or []) for field, key in ROW_KEYS.items()}


# ---------------------------------------------------------------------------------------------
# JSON and CSV


def observation_to_dict(obs: Any, view: Any = None, comparisons: Sequence[Any] = (),
                        outcomes: Sequence[Any] = (), files: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``--json`` document (schema in docs/observe.md); ``files``: what was written (``csv``, ``plot``)."""
    several = len(obs.series) > 1
    samples = []
    for p in obs.polls:
        sample = {"t": round(p.t, 3), "elapsed_s": round(p.elapsed_s, 3), "error": p.error, **row_to_dict(p.total)}
        if several:
            sample["series"] = {name: row_to_dict(row) for name, row in p.series.items()}
        samples.append(sample)
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "endpoint": obs.endpoint,
        "interval_s": obs.interval_s,
        "duration_s": obs.duration_s,
        "timeout_s": obs.timeout_s,
        "started_at": round(obs.started_at, 3),
        "elapsed_s": obs.elapsed_s,
        "stopped": obs.stopped,
        "polls": obs.num_polls,
        "failed_polls": obs.failed_polls,
        "sample_stride": obs.sample_stride,
        "summary": obs.summary.to_dict(),
        "series": [{"name": s.name, "labels": dict(s.labels), "engine": s.engine,
                    "metrics": {ROW_KEYS.get(k, k): name for k, name in s.metrics.items()},
                    "missing": list(s.missing), "rejected_values": dict(s.rejected_values),
                    "cache_config": dict(s.cache_config), "summary": s.summary.to_dict()}
                   for s in obs.series],
        "samples": samples,
        "events": [{"poll": e.poll, "elapsed_s": e.elapsed_s, "message": e.message} for e in obs.events],
        "events_dropped": obs.events_dropped,
        "files": dict(files or {}),
        "outages": [{"start_s": o.start_s, "end_s": o.end_s, "failed_polls": o.failed_polls, "error": o.error}
                    for o in obs.outages],
        "findings": [*obs.outage_findings(), *(f for c in comparisons for f in c.findings)],
    }
    if view is not None:
        out["plan"] = {
            "assumptions": [{"name": n, "value": v, "source": src} for n, v, src in view.assumptions(_prefix(comparisons))],
            "from_endpoint": dict(view.from_endpoint),
            "notes": list(view.notes),
            "comparison": [c.to_dict() for c in comparisons],
            "estimate": view.plan.to_dict(),
        }
    if outcomes:
        out["gates"] = [{"require": o.requirement, "passed": o.passed, "actual": _num(o.actual), "message": o.message}
                        for o in outcomes]
        out["passed"] = all(o.passed for o in outcomes)
    return out


def _prefix(comparisons: Sequence[Any]) -> tuple[int, str] | None:
    """The shared prefix the comparison of the planned series credited (for the assumptions), if any."""
    compared = [c for c in comparisons if c.compared and c.engine_starts and c.cause is not None]
    return (compared[0].prefix_tokens, compared[0].prefix_source) if compared else None


def csv_text(obs: Any) -> str:
    """One row per poll and series (a failed poll: one row with its error)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    keys = list(ROW_KEYS.values())
    writer.writerow(["t", "elapsed_s", "series", "error", *keys])
    for p in obs.polls:
        rows = p.series.items() if p.series else [("", {})]
        for name, row in rows:
            values = row_to_dict(row)
            values["counter_resets"] = " ".join(values["counter_resets"])
            writer.writerow([f"{p.t:.3f}", f"{p.elapsed_s:.3f}", name, p.error or "",
                             *("" if values[k] is None else values[k] for k in keys)])
    return buf.getvalue()


def write_csv(obs: Any, path: str | Path) -> None:
    from kvplan.io.atomic import write_atomic

    write_atomic(path, csv_text(obs))


def write_plot(obs: Any, path: str | Path) -> Path:
    """KV pool used, running / waiting and prefix hit rate over time, one line per series (PNG/SVG/PDF),
    written atomically; ``path`` as :func:`kvplan.render.plot_path` resolves it."""
    from kvplan.render import plot_path, pyplot, save_figure

    path = plot_path(path)
    plt = pyplot()
    fig, (ax_u, ax_r, ax_h) = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    for s in obs.series:
        pts = [(p.elapsed_s, p.series[s.name]) for p in obs.polls if s.name in p.series]
        t = [x for x, _ in pts]
        label = s.name if len(obs.series) > 1 else None

        def series(key: str, scale: float = 1.0) -> list[float]:
            return [float("nan") if r.get(key) is None else r[key] * scale for _, r in pts]

        ax_u.plot(t, series("usage", 100.0), marker=".", label=label)
        ax_r.plot(t, series("running"), marker=".", label=f"running {label or ''}".strip())
        ax_r.plot(t, series("waiting"), marker=".", linestyle="--", label=f"waiting {label or ''}".strip())
        ax_h.plot(t, series("prefix_hit_rate", 100.0), marker=".", label=label)
    ax_u.set_ylabel("KV pool used (%)")
    ax_u.set_ylim(0, 105)
    ax_r.set_ylabel("requests")
    ax_r.legend(loc="upper left", fontsize="small")
    ax_h.set_ylabel("prefix hit rate (%)")
    ax_h.set_ylim(0, 105)
    ax_h.set_xlabel("time since start (s)")
    if len(obs.series) > 1:
        ax_u.legend(loc="lower right", fontsize="small")
    ax_u.set_title(f"{obs.endpoint}: {obs.num_polls:,} polls every {fmt_seconds(obs.interval_s)}", fontsize="medium")
    fig.tight_layout()
    save_figure(plt, fig, path)
    return path


# ---------------------------------------------------------------------------------------------
# terminal


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _n(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _pool(s: Any) -> str:
    if s.num_gpu_blocks is not None:
        return f"{plural(s.num_gpu_blocks, 'block')}" + (f" x {s.block_size}" if s.block_size else "")
    return "-" if s.max_total_num_tokens is None else f"{plural(s.max_total_num_tokens, 'token')}"


ROWS: list[tuple[str, Any]] = [
    ("pool used now / mean / peak",
     lambda s: f"{_pct(s.kv_cache_usage_now)} / {_pct(s.kv_cache_usage_mean)} / {_pct(s.kv_cache_usage_peak)}"),
    ("running now / mean / peak", lambda s: f"{_n(s.running_now)} / {_n(s.running_mean, 1)} / {_n(s.running_peak)}"),
    ("waiting now / peak", lambda s: f"{_n(s.waiting_now)} / {_n(s.waiting_peak)}"),
    ("preemptions in the run (per min)", lambda s: f"{_n(s.preemptions_during_run)} ({_n(s.preemptions_per_min, 1)})"),
    ("preemptions, server total", lambda s: _n(s.preemptions)),
    ("prefix hit rate in the run / total", lambda s: f"{_pct(s.prefix_hit_rate_during_run)} / {_pct(s.prefix_hit_rate)}"),
    ("tokens/s prompt / generated", lambda s: f"{_n(s.prompt_tokens_per_s)} / {_n(s.generation_tokens_per_s)}"),
    ("pool (server)", _pool),
]


def render_observation(obs: Any, view: Any = None, comparisons: Sequence[Any] = (), outcomes: Sequence[Any] = (),
                       max_events: int = 8, pending: str | None = None):  # noqa: ANN201 - rich renderable
    """The live frame and the final summary: header, a table (one column per series), plan, findings,
    events, gates. ``pending``: why there is no plan yet (it waits for the endpoint's KV budget)."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    state = {"running": "observing", "duration": "done", "interrupted": "stopped (Ctrl-C)"}[obs.stopped]
    head = Text()
    head.append(obs.endpoint, style="bold")
    head.append(f"  {state} · {obs.num_polls:,} polls every {fmt_seconds(obs.interval_s)} ({obs.failed_polls:,} failed) · "
                f"{fmt_seconds(obs.elapsed_s)}", style="grey62")
    table = Table(show_header=True, header_style="bold")
    table.add_column("")
    columns = [(f"{escape(s.name)}\n[grey62]{s.engine}[/]", s.summary) for s in obs.series]
    if len(obs.series) > 1:
        columns.append(("all", obs.summary))
    for title, _ in columns:
        table.add_column(title, justify="right", overflow="fold")
    for label, cell in ROWS:
        table.add_row(label, *(cell(summary) for _, summary in columns))
    parts: list[Any] = [head, table] if columns else [head]
    for finding in obs.outage_findings():
        parts.append(Text(f"finding: {finding}", style="bold yellow"))
    if view is not None:
        parts.append(_plan_text(view, comparisons))
    elif pending is not None:
        parts.append(Text(f"plan: not yet ({pending}): waiting for the endpoint's kv_cache_memory_bytes", style="grey62"))
        for c in comparisons:
            for finding in c.findings:
                parts.append(Text(f"finding: {finding}", style="bold yellow"))
    elif obs.series:
        labels = sorted({dict(s.labels)["model_name"] for s in obs.series if "model_name" in dict(s.labels)})
        alias = (f"; the endpoint names its model {', '.join(repr(x) for x in labels)}: when that is a "
                 f"--served-model-name alias, pass --served-model-name {labels[0]} too" if labels else "")
        parts.append(Text("plan: none (pass --model, the checkpoint the server loads, and the estimate options, e.g. "
                          f"--gpu, to compare with the plan{alias})", style="grey62"))
    events = list(obs.events)
    if events and max_events > 0:  # 0: the events were written as they happened (kvplan observe when not a terminal)
        shown = events[-max_events:]
        text = Text()
        earlier = len(events) - len(shown) + obs.events_dropped
        if earlier:
            text.append(f"({earlier:,} earlier events)\n", style="grey62")
        for e in shown:
            text.append(f"[{e.elapsed_s:,.1f} s] {e.message}\n", style="yellow")
        text.rstrip()
        parts.append(text)
    for o in outcomes:
        parts.append(Text(f"require {o.message}", style="green" if o.passed else "bold red"))
    return Group(*parts)


def _plan_text(view: Any, comparisons: Sequence[Any]):  # noqa: ANN202
    from rich.text import Text

    plan = view.plan
    text = Text()
    text.append(f"plan ({plan.spec.model_id} on {plan.options.gpu_count}x {plan.gpu.name}, "
                f"{plan.engine.engine} {plan.engine.version}): ", style="bold")
    if plan.answer.refusal is not None:
        text.append(f"the engine does not start ({plan.answer.refusal})\n")
    else:
        text.append(f"{plural(plan.answer.num_blocks, 'block')} x {plural(plan.layout.block_size, 'token')}, "
                    f"{plural(plan.answer.max_requests, 'request')} of {plural(plan.answer.context, 'token')}\n")
    shown = ", ".join(f"{n} {v}{' (' + src + ')' if src.startswith('endpoint') else ''}"
                      for n, v, src in view.assumptions(_prefix(comparisons))[1:] if v is not None)
    text.append(f"assumes: {shown}\n", style="grey62")
    for note in view.notes:
        text.append(f"note: {note}\n", style="yellow")
    for c in comparisons:
        for line in c.lines:
            text.append(f"{c.series}: {line}\n" if len(comparisons) > 1 else f"{line}\n")
        for finding in c.findings:
            text.append(f"finding: {finding}\n", style="bold yellow")
    text.rstrip()
    return text


# ---------------------------------------------------------------------------------------------
# --fit-timing


def timing_to_dict(measure: Any, timing: Any) -> dict[str, Any]:
    """This run's step-time measurement and the timing file's fit after it (``--json``'s ``timing``)."""
    run, fit = measure.run, timing.fit
    return {"run": {k: _num(v) for k, v in run.__dict__.items()},
            "busy_intervals": measure.busy_intervals, "intervals": measure.intervals,
            "fit": {"step_base_s": fit.step_base_s, "step_s_per_seq": fit.step_s_per_seq,
                    "step_s_per_kv_token": fit.step_s_per_kv_token, "prefill_s_per_token": fit.prefill_s_per_token,
                    "step_s_per_held_token": fit.step_s_per_held_token,
                    "fitted": list(fit.fitted), "rms_relative_error": _num(fit.rms_relative_error)},
            "runs": len(timing.runs), "notes": [*measure.notes, *timing.notes]}


def render_timing(measure: Any, timing: Any):  # noqa: ANN201 - rich renderable
    """Two lines: what this run measured, the file's fit over its runs; then the notes."""
    from rich.text import Text

    run, fit = measure.run, timing.fit
    step_ms = run.busy_s / run.steps * 1e3
    text = Text()
    text.append("timing run: ", style="bold")
    text.append(f"{run.busy_s:,.1f} s busy, {run.steps:,} steps ({step_ms:.2f} ms each), {run.running_mean:,.1f} running, "
                f"{run.decode_tokens:,} decode + {run.prefill_tokens:,} prompt tokens computed, mean context "
                f"{plural(round(run.mean_context_tokens), 'token')}, {run.held_tokens:,.0f} KV tokens held\n")
    text.append(f"timing fit over {plural(len(timing.runs), 'run')}: ", style="bold")
    err = f" (rms error {fit.rms_relative_error:.1%})" if fit.rms_relative_error is not None else ""
    text.append(f"{fit.describe()}{err}\n")
    for note in (*measure.notes, *timing.notes):
        text.append(f"note: {note}\n", style="yellow")
    text.rstrip()
    return text
