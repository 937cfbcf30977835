"""``kvplan size``: the answer first (the cheapest or smallest deployment, its launch line per replica), then
one row per GPU (its smallest deployment, what binds it), then why no smaller deployment of each GPU holds;
CSV with the JSON's deployment keys. Every figure is read from :class:`kvplan.planning.size.Sizing`."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Any

from kvplan.units import plural

if TYPE_CHECKING:  # pragma: no cover
    from kvplan.planning.size import Sized, Sizing

CSV_COLUMNS = ("gpu", "tp", "pp", "replicas", "gpus", "requests_per_replica_low", "requests_per_replica",
               "requests_low", "requests", "headroom_requests", "binds", "cost_per_hour",
               "cost_per_million_tokens_hour", "serve_command", "why_not_smaller")


def _shape(row: "Sized") -> str:
    shape = f"tp {row.tp}" + (f" pp {row.pp}" if row.pp > 1 else "")
    return f"{row.replicas} x {row.gpu} at {shape}"


def _end(sizing: "Sizing") -> str:
    """Where the requirement is judged, as a column says it: ``low`` or ``est``."""
    from kvplan.planning.size import LOW

    return "low" if sizing.requirement.at == LOW else "est"


def _deployment(row: "Sized") -> str:
    """``2 x tp 8`` / ``1 x tp 8 pp 3``: replicas x one replica's shape."""
    return f"{row.replicas} x tp {row.tp}" + (f" pp {row.pp}" if row.pp > 1 else "")


def _money(value: float | None, currency: str, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" + (f" {currency}" if currency else "")


def headline(sizing: "Sizing") -> list[str]:
    """The answer in words: the requirement, the best deployment, its figures and its launch line."""
    from kvplan.planning.size import AT_WORDS, LOW

    r, best = sizing.requirement, sizing.best
    prefix = f", {r.prefix_tokens:,} of them a shared prefix" if r.prefix_tokens else ""
    judged = "low end" if r.at == LOW else "estimate"
    which = "cheapest" if sizing.ranked_by == "cost" else "smallest"
    lines = [f"{plural(r.concurrency, 'request')} of {plural(r.context, 'token')}{prefix} of {sizing.model} on "
             f"{sizing.engine} {sizing.engine_version}, judged at {AT_WORDS[r.at]}:",
             f"{which}: {_shape(best)} = {plural(best.gpus, 'GPU')}, {plural(best.requests_per_replica_low, 'request')} per "
             f"replica at the low end ({best.requests_per_replica:,} at the estimate), "
             f"{best.requests_judged:,} in all at the {judged} (binds: {best.binds})"]
    if best.cost_per_hour is not None:
        currency = sizing.prices.currency if sizing.prices else ""
        lines.append(f"cost: {_money(best.cost_per_hour, currency)} per hour, "
                     f"{_money(best.cost_per_million_tokens_hour, currency, 4)} per million tokens of context held "
                     f"for an hour (price {best.price.per_gpu_hour:g}{' ' + currency if currency else ''} per GPU-hour: "
                     f"{best.price.source}, "
                     f"{best.price.date})")
    each = "each replica" if best.replicas > 1 else "the replica"
    plan = best.plan
    serve = best.serve_command or f"none: {plan.engine.label} cannot run --kv-dtype {plan.kv_dtype} (a what-if)"
    lines.append(f"serve ({each} on its own {plural(best.tp * best.pp, 'GPU')}): {serve}")
    return lines


def render_size(sizing: "Sizing", width: int | None = None) -> Any:
    """The answer, the table (one row per GPU, best first) and why no smaller deployment of each GPU holds."""
    from rich.console import Group
    from rich.text import Text

    from kvplan.render.fit import COMPACT, Col, fitted_table, terminal_width

    parts: list[Any] = []
    lines = headline(sizing)
    parts.append(Text(lines[0]))
    parts.extend(Text(line, style="bold" if i == 0 else "") for i, line in enumerate(lines[1:]))
    priced = sizing.prices is not None
    cols = [Col("GPU"), Col("deployment"), Col("GPUs", justify="right"),
            Col("req/replica\nlow (est)", justify="right"), Col(f"requests\n{_end(sizing)}", justify="right", drop=3),
            Col("headroom", justify="right", drop=2), Col("binds", wrap=True, drop=4)]
    if priced:
        cols += [Col("cost/h", justify="right"), Col("per Mtok-h", justify="right", drop=1)]
    currency = sizing.prices.currency if sizing.prices else ""
    for row in sizing.rows:
        cells = _cells(row, priced)
        for col, cell in zip(cols, cells):
            col.cells.append(cell)
    title = f"smallest deployment of each GPU ({'by cost per hour' if sizing.ranked_by == 'cost' else 'by GPUs'})"
    if priced and currency:
        title += f", costs in {currency}"
    table, dropped = fitted_table(cols, width or terminal_width(), title=title, title_justify="left", **COMPACT)
    parts.append(Text(""))
    parts.append(table)
    if dropped:
        parts.append(Text(f"({', '.join(dropped)} not shown at this width: see --json)", style="grey62"))
    parts.append(Text("why no smaller deployment of each GPU holds it:", style="grey62"))
    parts.extend(Text(f"  {row.gpu}: {row.why_not_smaller}", style="grey62") for row in sizing.rows)
    if sizing.unfit:
        parts.append(Text("no deployment holds one request on:", style="grey62"))
        parts.extend(Text(f"  {gpu}: {why}", style="grey62") for gpu, why in sizing.unfit)
    return Group(*parts)


TABLE_HEADER = ("GPU", "deployment", "GPUs", "req/replica low (est)", "requests low", "headroom", "binds",
                "why no smaller one holds it")


def size_table(sizing: "Sizing") -> tuple[list[str], list[list[str]]]:
    """A report's table of one sizing question (Markdown, HTML): header and cells, best first."""
    priced = sizing.prices is not None
    header = list(TABLE_HEADER[:-1]) + (["cost/h", "per Mtok-h"] if priced else []) + [TABLE_HEADER[-1]]
    header[4] = f"requests {_end(sizing)}"
    rows = []
    for row in sizing.rows:
        cells = _cells(row, priced)
        rows.append(cells + [row.why_not_smaller])
    return header, rows


def size_csv(sizing: "Sizing") -> str:
    """One line per deployment, the JSON's keys as columns (:data:`CSV_COLUMNS`)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in sizing.rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.to_dict().items()})
    return out.getvalue()


def _cells(row: "Sized", priced: bool) -> list[str]:
    """One deployment's cells, as the terminal table and a report's table show them (cost columns when priced)."""
    cells = [row.gpu, _deployment(row), str(row.gpus),
             f"{row.requests_per_replica_low:,} ({row.requests_per_replica:,})", f"{row.requests_judged:,}",
             f"{row.headroom:+,}", row.binds]
    if priced:
        cells += [_money(row.cost_per_hour, ""), _money(row.cost_per_million_tokens_hour, "", 4)]
    return cells
