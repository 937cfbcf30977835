"""``kvplan simulate`` output: a rich table (one column per policy), JSON, and a time-series plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvplan.render import PLOT_SUFFIXES, plot_path  # noqa: F401 - part of this module's API (commands, tests)
from kvplan.units import GiB, fmt_seconds, plural

SCHEMA_VERSION = 1


def simulate_to_dict(run: Any) -> dict[str, Any]:
    """JSON-ready numbers of a :class:`kvplan.sim.workload_run.WorkloadRun` (times in s, fractions in [0, 1])."""
    wl, plan, res = run.workload, run.plan, run.result
    pool, timing = res.config.pool, res.config.timing
    return {
        "schema_version": SCHEMA_VERSION,
        "workload": {"file": wl.display, "name": wl.name, "traffic": wl.describe_traffic(), "seed": wl.seed,
                     "duration_s": wl.duration_s, "num_requests": wl.num_requests},
        "deployment": {"model": plan.spec.model_id, "gpu": plan.gpu.name, "gpus": plan.options.gpu_count,
                       "kv_dtype": plan.kv_dtype, "kv_budget_bytes": plan.budget.kv_budget_bytes,
                       "num_blocks": pool.num_blocks, "block_size": pool.block_size,
                       "groups": [g.kind for g in pool.groups], "max_model_len": pool.max_model_len,
                       "max_num_seqs": pool.max_num_seqs, "max_num_batched_tokens": pool.max_num_batched_tokens,
                       "fits": _fits(run)},
        "timing": {"weights_bytes": timing.weights_bytes, "bandwidth_bytes_per_s": timing.bandwidth_bytes_per_s,
                   "kv_bytes_per_token": timing.full_token_bytes, "prefill_s_per_token": timing.prefill_s_per_token,
                   "decode_step_s": timing.decode_step_s,
                   "fit": None if timing.fit is None else {
                       "file": str(wl.timing_file) if wl.timing_file else None, "step_base_s": timing.fit.step_base_s,
                       "step_s_per_seq": timing.fit.step_s_per_seq, "step_s_per_kv_token": timing.fit.step_s_per_kv_token,
                       "step_s_per_held_token": timing.fit.step_s_per_held_token,
                       "prefill_s_per_token": timing.fit.prefill_s_per_token, "fitted": list(timing.fit.fitted)},
                   "closed_loop_start_spread_s": None if res.closed_loop is None else res.closed_loop.start_spread_s},
        "policies": [r.to_dict() for r in res.results],
        "notes": list(run.notes),
    }


def _fits(run: Any) -> dict[str, Any] | None:
    """What the deployment fits of the workload's requests, and what prefix caching credits."""
    c = run.capacity
    if c is None:
        return None
    caching = "prefix_caching" in run.workload.policies
    return {"at_tokens": c.at_tokens, "requests": c.unshared,
            "requests_prefix_caching": (c.shared if c.shared is not None else c.unshared) if caching else None,
            "prefix_tokens": c.prefix_tokens, "prefix_share": c.prefix_share, "shared_blocks": c.shared_blocks,
            "credited": caching and c.shared is not None}


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return fmt_seconds(x)


ROWS: list[tuple[str, Any]] = [
    ("requests/s", lambda r: f"{r.requests_per_s:,.2f}"),
    ("output tokens/s", lambda r: f"{r.output_tokens_per_s:,.0f}"),
    ("running (mean / p50 / p99)", lambda r: f"{r.concurrency_mean:,.1f} / {r.concurrency_p50} / {r.concurrency_p99}"),
    ("pool used (mean / peak)", lambda r: f"{r.usage_mean:.0%} / {r.usage_peak:.0%}"),
    ("unused slots in used blocks", lambda r: f"{r.fragmentation_mean:.1%}"),
    ("prefix hit rate (cached / looked up)",
     lambda r: f"{r.prefix_hit_rate:.0%} ({r.prefill_tokens_saved:,} / {r.prefix_query_tokens:,})"),
    ("prefill tokens computed", lambda r: f"{r.prefill_tokens:,}"),
    ("preemptions", lambda r: f"{r.preemptions:,}"),
    ("requests with a first token", lambda r: f"{r.first_tokens:,}"),
    ("queue delay p50 / p99", lambda r: f"{_s(r.queue_delay_p50_s)} / {_s(r.queue_delay_p99_s)}"),
    ("time to first token p50 / p99", lambda r: f"{_s(r.ttft_p50_s)} / {_s(r.ttft_p99_s)}"),
    ("finished / queued / running", lambda r: f"{r.finished:,} / {r.queued:,} / {r.running:,}"),
    ("rejected (prompt >= max_model_len)", lambda r: f"{r.rejected:,}"),
    ("simulated time", lambda r: f"{fmt_seconds(r.duration_s)} ({r.num_steps:,} steps)"),
]


def render_simulation(run: Any):  # noqa: ANN201 - rich renderable
    """The header lines and one table column per policy."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    wl, plan, res = run.workload, run.plan, run.result
    pool = res.config.pool
    head = Text()
    head.append(f"{wl.name}", style="bold")
    head.append(f"  ({wl.display})\n", style="grey62")
    head.append(f"{plan.spec.model_id} on {plan.options.gpu_count}x {plan.gpu.name}: KV budget "
                f"{plan.budget.kv_budget_bytes / GiB:.2f} GiB = {plural(pool.num_blocks, 'block')} x {plural(pool.block_size, 'token')} "
                f"({plan.kv_dtype}), max_model_len {pool.max_model_len:,}, max_num_seqs {pool.max_num_seqs:,}, "
                f"max_num_batched_tokens {pool.max_num_batched_tokens:,}\n")
    if run.capacity is not None:
        head.append(f"deployment: {run.capacity.describe('prefix_caching' in wl.policies)}\n")
    head.append(f"traffic: {wl.describe_traffic()}", style="grey62")
    table = Table(show_header=True, header_style="bold")
    table.add_column("")
    for r in res.results:
        table.add_column(r.label, justify="right")
    for label, fn in ROWS:
        table.add_row(label, *(fn(r) for r in res.results))
    parts: list[Any] = [head, table]
    summary = compare_line(res)
    if summary:
        parts.append(Text(summary))
    for note in run.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    return Group(*parts)


def compare_line(res: Any) -> str | None:
    """One sentence on what paging and prefix caching bought in this run."""
    by = {r.policy: r for r in res.results}
    out = []
    base = by.get("paged")
    if base and "contiguous" in by and by["contiguous"].requests_per_s > 0:
        c = by["contiguous"]
        out.append(f"paging: {base.requests_per_s / c.requests_per_s:.2f}x the requests/s of contiguous "
                   f"({base.concurrency_mean:.1f} vs {c.concurrency_mean:.1f} running)")
    if base and "prefix_caching" in by and base.requests_per_s > 0:
        p = by["prefix_caching"]
        out.append(f"prefix caching: {p.requests_per_s / base.requests_per_s:.2f}x the requests/s of paged")
    return "; ".join(out) if out else None


def write_plot(run: Any, path: str | Path) -> Path:
    """Pool utilisation and running requests over time, one line per policy (PNG/SVG/PDF by suffix),
    written atomically; ``path`` as :func:`plot_path` resolves it. Returns the path written."""
    from kvplan.render import pyplot, save_figure

    path = plot_path(path)
    plt = pyplot()
    fig, (ax_u, ax_r) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for r in run.result.results:
        s = r.series.downsample(2000)
        ax_u.step(s.time_s, [u * 100 for u in s.usage], where="pre", label=r.label, linewidth=1)
        ax_r.step(s.time_s, s.running, where="pre", label=r.label, linewidth=1)
    ax_u.set_ylabel("KV pool used (%)")
    ax_u.set_ylim(0, 105)
    ax_r.set_ylabel("running requests")
    ax_r.set_xlabel("time (s)")
    ax_u.legend(loc="lower right", fontsize="small")
    ax_u.set_title(f"{run.workload.name}: {run.plan.spec.model_id} on {run.plan.gpu.name}", fontsize="medium")
    fig.tight_layout()
    save_figure(plt, fig, path)
    return path
