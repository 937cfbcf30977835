"""Rich rendering of ``kvplan validate``: estimate vs measured, side by side, with the difference.

Also the fill progress bar (stderr, only on a terminal) and the JSON payloads.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from rich.console import Group
from rich.text import Text

from kvplan.render.fit import Col, fitted_table, terminal_width
from kvplan.units import fmt_bytes, plural

if TYPE_CHECKING:  # pragma: no cover
    from kvplan.paged.validate import ValidationResult
    from kvplan.planning.plan import Plan

PROGRESS_MIN_REQUESTS = 64  # below this, filling is instant: no bar


def _diff(measured: int, estimate: int) -> str:
    diff = measured - estimate
    pct = 100.0 * diff / estimate if estimate else 0.0
    return f"{diff:+,} B ({pct:+.2f}%)" if diff else "0 B (0.00%)"


def _verdict(ok: bool) -> Text:
    return Text("PASS", style="bold green") if ok else Text("FAIL", style="bold red")


def render_result(result: "ValidationResult", plan: "Plan", width: int | None = None) -> Group:
    """One device's validation: pool bytes, requests, attention, probe, verdict. The tables are framed and fit
    ``width`` (default: the terminal's) without cutting a figure (:mod:`kvplan.render.fit`)."""
    r = result
    width = width or terminal_width()
    head = Text.assemble((r.model_id, "bold"), f" on {r.device}",
                         f" (rank {r.rank} of {r.world_size}, pp stage {r.pp_stage})" if r.world_size > 1 else "", "\n",
                         f"{plural(r.num_layers, 'layer')} in {r.num_groups} group(s) of {r.group_size}, block {plural(r.block_size, 'token')}, "
                         f"page {r.page_bytes:,} B, block id {r.block_bytes:,} B, {plural(r.num_blocks, 'block')}, "
                         f"KV {r.kv_dtype} (torch {r.torch_kv_dtype})")
    parts: list[Any] = [head]
    if r.measure is not None:
        parts.extend(_measure_parts(r, width))
    if r.fill is not None:
        parts.extend(_fill_table(r, width))
    if r.attention:
        parts.extend(_attention_table(r, width))
    if r.probe is not None:
        p = r.probe
        parts.append(Text(f"probe: {plural(p.blocks_fit, 'block')} of {p.block_bytes:,} B fit in {fmt_bytes(p.free_bytes)} free "
                          f"(free // block = {p.blocks_by_free_memory:,}); the plan budgets {p.planned_blocks:,} "
                          f"({p.blocks_fit - p.planned_blocks:+,} blocks: weights, activations and graphs are not loaded here)"))
    for note in r.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    if r.error:
        parts.append(Text(f"error: {r.error}", style="red"))
    verdict = Text.assemble(_verdict(r.ok), "  ")
    verdict.append("estimate matches the real pool" if r.ok else "; ".join(r.failures))
    parts.append(verdict)
    return Group(*parts)


def _table(title: str, cols: list[Col], width: int) -> list[Any]:
    """A framed table of ``cols`` fitted to ``width`` (no figure cut), and a line naming the columns left out."""
    table, dropped = fitted_table(cols, width, title=title, title_justify="left")
    return [table] + ([Text(f"({', '.join(dropped)} not shown at this width: see --json)", style="grey62")]
                      if dropped else [])


def _rows(cols: list[Col], *rows: tuple[Any, ...]) -> list[Col]:
    for row in rows:
        for col, cell in zip(cols, row):
            col.cells.append(cell)
    return cols


def _measure_parts(r: "ValidationResult", width: int) -> list[Any]:
    """Pool bytes, estimate vs each measurement, and where each measurement comes from."""
    m = r.measure
    assert m is not None
    rows = [("tensor storages", f"{m.estimate_bytes:,} B", f"{m.storage_bytes:,} B", _diff(m.storage_bytes, m.estimate_bytes)),
            ("device accounting", f"{m.expected_device_bytes:,} B", f"{m.device_bytes:,} B",
             _diff(m.device_bytes, m.estimate_bytes))]
    if m.driver_bytes is not None:
        rows.append(("driver free (info)", f"{m.estimate_bytes:,} B", f"{m.driver_bytes:,} B",
                     _diff(m.driver_bytes, m.estimate_bytes)))
    if m.rss_bytes is not None:
        rows.append(("RSS delta (info)", f"{m.estimate_bytes:,} B", f"{m.rss_bytes:,} B", _diff(m.rss_bytes, m.estimate_bytes)))
    if m.released_bytes is not None:
        rows.append(("held after release", "0 B", f"{m.released_bytes:,} B", _diff(m.released_bytes, 0)))
    cols = _rows([Col("what", wrap=True), Col("estimate", justify="right"), Col("measured", justify="right"),
                  Col("difference", wrap=True, justify="right")], *rows)
    sources = [f"device accounting = {m.device_source}"]
    if m.driver_bytes is not None:
        sources.append("driver = torch.cuda.mem_get_info free-memory delta (2 MiB segments)")
    if m.rss_bytes is not None:
        sources.append("RSS = /proc/self/statm resident delta after zero-filling")
    return _table("pool bytes: estimate vs measured", cols, width) + [
        Text(f"  {fmt_bytes(m.estimate_bytes)} estimated = {plural(r.num_blocks, 'block')} x {r.block_bytes:,} B "
             f"in {m.num_tensors} tensor(s); " + "; ".join(sources), style="grey62")]


def _fill_table(r: "ValidationResult", width: int) -> list[Any]:
    """Requests the plan promises vs what the allocator held."""
    f = r.fill
    assert f is not None
    one_more = "n/a" if f.one_more_fits is None else ("fits" if f.one_more_fits else "does not fit")
    cols = _rows([Col("what", wrap=True), Col("plan", wrap=True, justify="right"),
                  Col("allocator", wrap=True, justify="right")],
                 ("concurrent requests", f"{f.planned_requests:,}", f"{f.filled_requests:,}"),
                 ("blocks per request (peak)", f"{f.planned_blocks_per_request:,}", f"{f.peak_blocks:,}"),
                 ("blocks per request (resident)", f"{f.planned_blocks_per_request:,}", f"{f.resident_blocks_per_request:,}"),
                 ("free blocks after filling", "", f"{f.free_blocks:,}"),
                 (f"request {f.planned_requests + 1:,}", "does not fit", one_more))
    return _table(f"requests at {plural(f.context_tokens, 'token')} (prefill chunks of {f.chunk_tokens:,})", cols, width)


def _attention_table(r: "ValidationResult", width: int) -> list[Any]:
    """Decode attention over the scattered blocks vs a contiguous copy, case by case."""
    cols = [Col("case", wrap=True), Col("request", wrap=True, justify="right"), Col("tokens", justify="right"),
            Col("heads\nq/kv", justify="right"), Col("dim", justify="right", drop=2), Col("cache", drop=1),
            Col("max\n|diff|", justify="right"), Col("atol", justify="right"), Col("")]
    filled = r.fill.filled_requests if r.fill else 0
    for c in r.attention:
        which = f"{c.request:,} of {filled:,}" if c.request and filled else "-"
        _rows(cols, (c.case, which, f"{c.num_tokens:,}", f"{c.q_heads}/{c.kv_heads}", str(c.head_dim), c.cache_dtype,
                     f"{c.max_abs_error:.2e}", f"{c.atol:g}", _verdict(c.ok)))
    return _table("decode attention: scattered blocks vs contiguous copy", cols, width)


def render_ranks(results: list["ValidationResult"], width: int | None = None) -> Group:
    """Per-rank rows and the total, for ``torchrun ... kvplan validate`` (framed, fitted to ``width``)."""
    from kvplan.paged.distributed import totals

    cols = [Col("rank", justify="right"), Col("pp", justify="right", drop=2), Col("blocks", justify="right", drop=3),
            Col("estimate B", justify="right"), Col("measured B", justify="right"),
            Col("difference", wrap=True, justify="right"), Col("reqs", justify="right", drop=1),
            Col("attn", justify="right", drop=1), Col("")]
    for r in results:
        m, f = r.measure, r.fill
        _rows(cols, (str(r.rank), str(r.pp_stage), f"{r.num_blocks:,}",
                     f"{m.estimate_bytes:,}" if m else "-", f"{m.device_bytes:,}" if m else "-",
                     _diff(m.device_bytes, m.estimate_bytes) if m else "-",
                     f"{f.filled_requests:,}/{f.planned_requests:,}" if f else "-",
                     f"{sum(c.ok for c in r.attention)}/{len(r.attention)}", _verdict(r.ok)))
    tot = totals(results)
    _rows(cols, ("all", "", "", f"{tot.estimate_bytes:,}", f"{tot.device_bytes:,}",
                 _diff(tot.device_bytes, tot.estimate_bytes), "", "", _verdict(tot.ok)))
    parts: list[Any] = _table(f"{len(results)} ranks (tp innermost): pool bytes per rank", cols, width or terminal_width())
    for r in results:
        for failure in r.failures:
            parts.append(Text(f"rank {r.rank}: {failure}", style="red"))
    return Group(*parts)


def result_json(result: "ValidationResult", plan: "Plan") -> dict[str, Any]:
    return {"ok": result.ok, "plan": _plan_summary(plan), "validation": result.to_dict()}


def ranks_json(results: list["ValidationResult"], plan: "Plan") -> dict[str, Any]:
    from kvplan.paged.distributed import totals

    tot = totals(results)
    return {"ok": tot.ok, "plan": _plan_summary(plan), "ranks": [r.to_dict() for r in results],
            "total": {"estimate_bytes": tot.estimate_bytes, "device_bytes": tot.device_bytes,
                      "storage_bytes": tot.storage_bytes, "difference_bytes": tot.difference_bytes}}


def _plan_summary(plan: "Plan") -> dict[str, Any]:
    """The numbers validate checks, from the plan (the full plan is ``kvplan estimate --json``)."""
    a, o = plan.answer, plan.options
    return {"model": plan.spec.model_id, "gpu": plan.gpu.name, "tp": o.tp, "pp": o.pp, "kv_dtype": plan.kv_dtype,
            "block_size": plan.layout.block_size, "kv_budget_bytes": plan.budget.kv_budget_bytes,
            "num_blocks": a.num_blocks, "context": a.context, "blocks_per_request": a.blocks_per_request,
            "max_requests": a.max_requests}


@contextmanager
def fill_progress(stderr_console: Any = None) -> Iterator[Any]:
    """A progress callback ``(filled, planned)`` drawing a rich bar on stderr for big pools (terminal only)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kvplan.render import console

    out = stderr_console or console(stderr=True)
    bar = Progress(TextColumn("filling the pool"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=out, transient=True, disable=not out.is_terminal)
    task = None

    def update(filled: int, planned: int) -> None:
        nonlocal task
        if planned < PROGRESS_MIN_REQUESTS:
            return
        if task is None:
            task = bar.add_task("fill", total=planned)
        bar.update(task, completed=filled)

    with bar:
        yield update
