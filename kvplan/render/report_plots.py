"""The what-if report's plots (PNG bytes): max concurrency vs context, and the memory per GPU.

matplotlib is an optional extra, imported when a plot is drawn: without it :class:`PlotsUnavailable` says so
and the reports are written without plots.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Callable

from kvplan.render.report_cells import cell as _fmt, label_shown as _shown
from kvplan.units import GiB

if TYPE_CHECKING:
    from kvplan.checks.report import Report
    from kvplan.checks.rows import Pool

MAX_SERIES = 12  # lines in the concurrency plot (in each model's panel when there are more)
MAX_PANELS = 12  # models in the concurrency plot, one panel each, when one panel would not hold every line
MAX_BARS = 24  # bars in the memory plot



class PlotsUnavailable(Exception):
    """matplotlib is not installed (the reports are written without plots)."""


def _pyplot():  # noqa: ANN202 - the pyplot module
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable("matplotlib is not installed: reports written without plots "
                               "(pip install 'kvplan[plot]' to add them)") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _series_label(pool: "Pool", keys: list[str]) -> str:
    labels = pool.labels()
    parts = []
    for k in keys:
        v = labels[k]
        parts.append(str(v).split("/")[-1] if k == "model" else (f"{k} {v}" if k in ("tp", "pp", "gpus", "block_size", "gpu_util") else _fmt(k, v)))
    return " · ".join(parts) or labels["model"].split("/")[-1]


def _pool_keys(report: "Report") -> list[str]:
    from kvplan.checks.rows import Pool

    return [k for k in report.varying if k in Pool.LABELS and k != "gpus" and _shown(report, k)]  # gpus = tp x pp


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def plot_concurrency(report: "Report") -> tuple[bytes | None, str | None]:
    """Max concurrent requests vs context, one line per pool (model/GPU/dtype...). (png, caption note).

    Up to :data:`MAX_SERIES` lines share one panel; past that, each model has its own panel (small multiples,
    at most :data:`MAX_PANELS`, :data:`MAX_SERIES` lines each) so every model appears; what is left out is
    named in the note."""
    keys = _pool_keys(report)
    panels, note = concurrency_panels(report)
    if not panels:
        return None, note
    if panels[0][0] is not None:
        keys = [k for k in keys if k != "model"]  # each panel's title
    plt = _pyplot()
    ncols = 1 if len(panels) == 1 else min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    size = (10, 5.2) if len(panels) == 1 else (5.2 * ncols, 3.6 * nrows)
    fig, axes = plt.subplots(nrows, ncols, figsize=size, squeeze=False)
    for ax, (model, shown) in zip(axes.flat, panels):
        colors = plt.get_cmap("tab20").colors if len(shown) > 10 else plt.get_cmap("tab10").colors
        for i, (pool, points) in enumerate(shown):
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], marker="o", markersize=3, linewidth=1.6, color=colors[i % len(colors)],
                    linestyle="-" if i < len(colors) else "--", label=_series_label(pool, keys))
        ax.set_xscale("log", base=2)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("context (tokens per request)")
        ax.set_ylabel("max concurrent requests (0 = none fits)")
        ax.set_title("Max concurrency vs context" if model is None else str(model).split("/")[-1], fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: f"{x / 1024:g}k" if x >= 1024 else f"{x:g}"))
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda y, _: f"{y:,.0f}"))
        if model is None:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        else:
            ax.legend(fontsize=6, loc="best", frameon=False)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if len(panels) > 1:
        fig.suptitle("Max concurrency vs context, one panel per model")
        fig.tight_layout()
    data = _png(fig)
    plt.close(fig)
    return data, note


Line = tuple["Pool", dict[int, int]]


def concurrency_panels(report: "Report") -> tuple[list[tuple[str | None, list[Line]]], str | None]:
    """The concurrency plot's panels, each (model or ``None`` for one shared panel, its lines), and the note that
    names what is left out (``None`` when every configuration is plotted)."""
    lines = list(report.digest.lines.values())
    num_lines = report.digest.num_lines
    if not lines:
        return [], "the concurrency plot needs more than one context (sweep context)"
    by_model: dict[str, list[Line]] = {}
    for pool, points in lines:
        by_model.setdefault(pool.labels()["model"], []).append((pool, points))
    panels: list[tuple[str | None, list[Line]]]
    if num_lines <= MAX_SERIES or len(by_model) == 1:
        panels = [(None, lines[:MAX_SERIES])]
    else:
        panels = [(m, ls[:MAX_SERIES]) for m, ls in list(by_model.items())[:MAX_PANELS]]
    plotted = sum(len(s) for _, s in panels)
    if plotted >= num_lines:
        return panels, None
    left = [m.split("/")[-1] for m in list(by_model)[MAX_PANELS:]] if len(panels) > 1 else []
    short = [f"{m.split('/')[-1]} ({len(ls) - MAX_SERIES} of {len(ls)})" for m, ls in list(by_model.items())[:len(panels)]
             if len(ls) > MAX_SERIES] if len(panels) > 1 else []
    parts = ([f"models not plotted: {', '.join(left)}"] if left else []) + \
            ([f"lines not plotted: {', '.join(short)}"] if short else [])
    unseen = num_lines - len(lines)  # past the digest's bound: not even counted per model
    return panels, (f"{plotted} of {num_lines} configurations plotted" + (f" ({'; '.join(parts)})" if parts else "")
                  + (f"; {unseen:,} more not kept for the plot" if unseen > 0 else "") + "; the CSV and JSON hold every row")


def plot_memory(report: "Report") -> tuple[bytes | None, str | None]:
    """Per-GPU memory breakdown as stacked bars, one per configuration. (png, caption note)."""
    plt = _pyplot()
    fig, note = memory_figure(report)
    data = _png(fig)
    plt.close(fig)
    return data, note


def memory_figure(report: "Report") -> tuple[Any, str | None]:
    """The memory plot's figure: one stacked bar per distinct breakdown, a segment per budget term (each its
    own, as the estimate's rows), the legend beside the bars, clear of the axis label."""
    # the KV dtype and block size change no budget term: one bar per distinct breakdown
    keys = [k for k in _pool_keys(report) if k not in ("kv_dtype", "block_size")]
    pools, seen = [], set()
    for pool in report.pools:
        b = pool.plan.budget
        key = (tuple(pool.labels()[k] for k in keys), b.total_bytes, b.usable_bytes, b.weights.bytes, b.activation.bytes,
               b.overhead.bytes, b.cudagraph.bytes, b.state_pool_bytes, b.kv_budget_bytes)
        if key not in seen:
            seen.add(key)
            pools.append(pool)
    shown = pools[:MAX_BARS]
    plt = _pyplot()
    parts = [
        ("weights", lambda b: b.weights.bytes, "#8e44ad"),
        ("activation", lambda b: b.activation.bytes, "#f39c12"),
        ("overhead", lambda b: b.overhead.bytes, "#c0392b"),
        ("cudagraph", lambda b: b.cudagraph.bytes, "#e6735c"),
        ("state pool (SGLang's Mamba slots)", lambda b: b.state_pool_bytes, "#16a085"),
        ("KV cache budget", lambda b: max(0, b.kv_budget_bytes), "#27ae60"),
        ("not used (1 - gpu_util)", lambda b: max(0, b.total_bytes - b.usable_bytes), "#bdc3c7"),
    ]
    height = max(2.5, 0.42 * len(shown) + 1.4)
    fig, ax = plt.subplots(figsize=(9, height))
    labels = [_series_label(p, keys) for p in shown]
    left = [0.0] * len(shown)
    for name, get, color in parts:
        values = [get(p.plan.budget) / GiB for p in shown]
        if name.startswith("state pool") and not any(values):  # only hybrids on SGLang have one
            continue
        ax.barh(labels, values, left=left, color=color, label=name, edgecolor="white", linewidth=0.5)
        left = [a + b for a, b in zip(left, values)]
    for i, p in enumerate(shown):
        if p.plan.budget.kv_budget_bytes <= 0:
            ax.text(left[i], i, "  no KV budget", va="center", fontsize=8, color="#c0392b")
    ax.invert_yaxis()
    ax.set_xlabel("GiB per GPU (as the runtime reports it)")
    ax.set_title("Memory per GPU")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside: never on the label
    ax.grid(True, axis="x", alpha=0.3)
    note = f"{len(shown)} of {len(pools)} configurations shown" if len(pools) > len(shown) else None
    return fig, note


_PLOTTERS: dict[str, Callable[["Report"], tuple[bytes | None, str | None]]] = {
    "concurrency": plot_concurrency, "memory": plot_memory,
}


def make_plots(report: "Report", which: tuple[str, ...]) -> tuple[dict[str, bytes], list[str]]:
    """PNG bytes per plot name, and notes (plots skipped or truncated). Raises PlotsUnavailable."""
    plots: dict[str, bytes] = {}
    notes: list[str] = []
    for name in which:
        data, note = _PLOTTERS[name](report)
        if data is not None:
            plots[name] = data
        if note:
            notes.append(note)
    return plots, notes
