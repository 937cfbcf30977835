"""``kvplan estimate`` with listed values (:mod:`kvplan.checks.compare`): one compact row per combination, at
80 columns, each figure as the answer writes it (:func:`kvplan.render.estimate.answer_figures`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvplan.render.estimate import answer_figures

if TYPE_CHECKING:  # pragma: no cover
    from kvplan.checks.compare import Comparison

TITLES = {"gpu": "GPU", "tp": "tp", "kv_dtype": "KV dtype", "context": "context"}


def render_comparison(comparison: "Comparison", width: int | None = None) -> Any:
    """The rows (the listed values, KV budget, KV tokens, requests at the context and, in brackets, at the ends
    of kvplan's range, max context at the batch, the verdict) and, under them, each row's error in full."""
    from rich.console import Group
    from rich.text import Text

    from kvplan.render.fit import COMPACT, Col, fitted_table, terminal_width

    first = next((r.plan for r in comparison.rows if r.plan is not None), None)
    cols = [Col(TITLES[a]) for a in comparison.axes]
    figures = [Col("KV budget", justify="right"), Col("KV tokens", justify="right"),
               Col("requests", justify="right"), Col(f"max ctx\nat batch {first.options.batch if first else 1:,}",
                                                      justify="right", drop=1),
               Col("fits", wrap=True)]
    errors: list[str] = []
    for row in comparison.rows:
        for col, (_, value) in zip(cols, row.values):
            col.cells.append(value)
        if row.plan is None:
            errors.append(f"{', '.join(f'{TITLES[a]} {v}' for a, v in row.values)}: {row.error}")
            cells = ["", "", "", "", Text(f"error ({len(errors)})", style="bold red")]
        else:
            f = answer_figures(row.plan)
            style = "green" if row.plan.answer.fits else "bold red"
            requests = f"{f['requests']} ({f['requests_range']})" if f["requests_range"] else f["requests"]
            cells = [f["kv_budget"], f["kv_tokens"], requests, f["max_context"], Text(f["fits"], style=style)]
        for col, cell in zip(figures, cells):
            col.cells.append(cell)
    title = None
    if first is not None:
        o = first.options
        fixed = [f"batch {o.batch:,}"] + ([] if "context" in comparison.axes else [f"context {o.context:,}"])
        title = f"{first.spec.model_id}, {', '.join(fixed)}"
    table, dropped = fitted_table(cols + figures, width or terminal_width(), title=title, title_justify="left",
                                  **COMPACT)
    parts: list[Any] = [table]
    if dropped:
        parts.append(Text(f"({', '.join(dropped)} not shown at this width: see --json)", style="grey62"))
    for i, line in enumerate(errors, 1):
        parts.append(Text(f"({i}) {line}", style="red"))
    return Group(*parts)
