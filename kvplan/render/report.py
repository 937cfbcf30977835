"""Rendering of what-if reports: rich table, Markdown, self-contained HTML, CSV, JSON (the plots: report_plots).

Every renderer returns text or bytes; the command writes them (atomically, all at once).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from kvplan.render.report_cells import cell as _fmt, label_shown as _shown, title as _title
from kvplan.units import GiB, plural

if TYPE_CHECKING:
    from kvplan.checks.report import Report
    from kvplan.checks.rows import Row

TERMINAL_ROWS = 40  # rows shown in the terminal before truncating (head + tail)
DOCUMENT_ROWS = 2000  # rows in the Markdown / HTML table (CSV and JSON hold them all)

# figure columns: (title, getter, formatter, right-aligned)
_FIGURES: list[tuple[str, str]] = [
    ("KV/token/GPU", "kv_bytes_per_token"),
    ("weights/GPU", "weights_bytes"),
    ("KV budget", "kv_budget_bytes"),
    ("KV tokens", "kv_tokens"),
    ("max req @ctx", "max_requests"),
    ("max ctx @batch", "max_context_at_batch"),
    ("fits", "fits"),
    ("req range", "requests_range"),
    ("decode tok/s ≤", "decode_tokens_per_s"),
]


def columns(report: "Report") -> list[str]:
    """Label columns shown in tables: those that vary (max_model_len only when it differs from context)."""
    cols = [c for c in report.varying if c not in ("max_model_len", "gpus") and _shown(report, c)]  # gpus = tp x pp
    if "max_model_len" in report.varying and report.mml_differs:
        cols.append("max_model_len")
    return cols or ["model"]


def constants(report: "Report") -> list[tuple[str, str]]:
    """(title, value) of the label columns that are the same in every row."""
    if not report.digest.head:
        return []
    first = report.digest.head[0].to_dict()
    shown = set(columns(report))
    out = []
    from kvplan.checks.rows import LABEL_FIELDS

    for key in LABEL_FIELDS:
        if key in shown or key in report.varying or (key == "max_model_len" and "context" in report.varying):
            continue
        if key != "name" and _shown(report, key):
            out.append((_title(key), _fmt(key, first[key])))
    return out


def _shown_values(row: "Row") -> dict[str, Any]:
    """A row's values as the tables show them: ``max_model_len`` the context's when it follows it, and
    ``requests_range``, the requests at the low and high end of kvplan's range (``52 - 55``; one number when
    they are the same; the CSV / JSON hold ``max_requests_low`` / ``max_requests_high``)."""
    d = row.to_dict()
    d["max_model_len"] = d["max_model_len"] or d["context"]  # None: it follows the context
    lo, hi = d["max_requests_low"], d["max_requests_high"]
    d["requests_range"] = f"{lo:,}" if lo == hi else f"{lo:,} - {hi:,}"
    if d["why"]:  # not memory: the fits cell says why
        d["fits"] = f"no: {d['why']}"
    return d


def _table_rows(report: "Report", cols: list[str], limit: int) -> tuple[list[list[str]], int]:
    """Formatted cells for at most ``limit`` rows (head and tail); returns (rows, number hidden)."""
    chosen = report.digest.sample(limit)
    out = []
    for row in chosen:
        if row is None:
            out.append(["…"] * (len(cols) + len(_FIGURES)))
            continue
        d = _shown_values(row)
        out.append([_fmt(c, d[c]) for c in cols] + [_fmt(k, d[k]) for _, k in _FIGURES])
    return out, max(0, report.num_rows - limit)


_SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8_e5m2"}
_TERMINAL_TITLES = {
    "kv_bytes_per_token": "KiB\n/tok", "weights_bytes": "wts\nGiB", "kv_budget_bytes": "KV\nGiB",
    "kv_tokens": "KV\ntokens", "max_requests": "reqs\n@ctx", "requests_range": "reqs\nrange",
    "max_context_at_batch": "ctx\n@batch",
    "fits": "fits", "decode_tokens_per_s": "tok/s\n≤",
    "kv_dtype": "KV\ndtype", "weights_dtype": "wts\ndtype", "context": "ctx", "max_model_len": "max\nlen",
    "block_size": "block", "gpu_util": "util",
}


def _tokens_short(n: int) -> str:
    return f"{n // 1024:,}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def _terminal_cell(key: str, value: Any) -> str:
    """Compact cells for the terminal (the documents and CSV keep full figures)."""
    if value is None:
        return _fmt(key, value)
    if key in ("dtype", "kv_dtype", "weights_dtype"):
        return _SHORT_DTYPES.get(value, value)
    if key == "model":
        return str(value).split("/")[-1]
    if key == "fits" and isinstance(value, str):  # "no: over the model's maximum length ..."
        return "no (len)"
    if key in ("context", "max_model_len"):
        return _tokens_short(value)
    if key == "kv_bytes_per_token":
        return f"{value / 1024:,.4g}"
    if key in ("weights_bytes", "kv_budget_bytes"):
        return f"{value / GiB:,.1f}" if value > 0 else ("none" if key == "kv_budget_bytes" else "0")
    return _fmt(key, value)


# figure columns dropped first when the terminal is narrow (the label columns, the row's identity, never are)
_DROP_ORDER = ("decode_tokens_per_s", "requests_range", "weights_bytes", "kv_bytes_per_token", "kv_budget_bytes",
               "max_context_at_batch",
               "kv_tokens", "fits", "max_requests")
# the results a row is read for: when one table row cannot show them beside its labels, the pool's labels
# move to a line above its rows (:func:`_grouped_table`)
_RESULT_FIGURES = ("kv_tokens", "max_requests", "max_context_at_batch", "fits")
_ROW_LABELS = ("name", "context", "batch", "max_model_len")  # the per-row labels (the others are the pool's)
_RIGHT = ("context", "batch", "tp", "gpus", "pp", "max_model_len")


def _label_col(key: str) -> Any:
    from kvplan.render.fit import Col

    return Col(_TERMINAL_TITLES.get(key, _title(key)), wrap=key == "name",
               justify="right" if key in _RIGHT else "left")


def _table_cols(labels: list[str], chosen: "list[Row | None]") -> list[Any]:
    """Columns for ``labels`` and every figure, filled with the cells of ``chosen`` (``None``: the gap)."""
    from rich.text import Text

    from kvplan.render.fit import Col

    cols = [_label_col(c) for c in labels]
    cols += [Col(_TERMINAL_TITLES[key], justify="right", drop=_DROP_ORDER.index(key)) for _, key in _FIGURES]
    for row in chosen:
        if row is None:
            cells: list[Any] = ["…"] * len(cols)
        else:
            d = _shown_values(row)
            cells = [_terminal_cell(c, d[c]) for c in labels]
            for _, key in _FIGURES:
                text = _terminal_cell(key, d[key])
                cells.append(Text(text, style="green" if text == "yes" else "red") if key == "fits" else text)
        for col, cell in zip(cols, cells):
            col.cells.append(cell)
    return cols


def _pool_line(row: "Row", keys: list[str]) -> tuple[str, ...]:
    """The pool labels of ``row`` as items that are never broken: the model's full id, the GPU, ``tp 2``..."""
    d = row.to_dict()
    items = []
    for key in keys:
        value = d[key] if key == "model" else _terminal_cell(key, d[key])
        items.append(str(value) if key in ("model", "gpu", "engine") else f"{_title(key)} {value}")
    return tuple(items)


def _grouped_table(report: "Report", chosen: "list[Row | None]", width: int, title: str) -> tuple[list[Any], list[str]]:
    """The narrow layout: per run of rows on one pool, a line naming the pool (full model id, GPU,
    parallelism, dtypes; wrapped between items only), then its rows with the per-row labels and the figures,
    every group's table at the same column widths. Returns (renderables, columns dropped)."""
    from rich.text import Text

    from kvplan.render.fit import COMPACT, fit_columns, wrap_items

    cols = columns(report)
    keys = [c for c in cols if c not in _ROW_LABELS]
    fit = fit_columns(_table_cols([c for c in cols if c in _ROW_LABELS], chosen), width, **COMPACT)
    parts: list[Any] = [Text(title, style="italic")]
    start, first = 0, True
    for i in range(len(chosen) + 1):
        row, prev = (chosen[i] if i < len(chosen) else None), (chosen[i - 1] if i else None)
        new_group = i == len(chosen) or row is None or prev is None or _pool_line(row, keys) != _pool_line(prev, keys)
        if not new_group or i == start:
            continue
        head = chosen[start]
        if head is not None:
            parts.append(Text(wrap_items(_pool_line(head, keys), width, " · "), style="bold"))
        if head is None:
            parts.append(Text("…"))
        else:
            parts.append(fit.table(range(start, i), show_header=first))
            first = False
        start = i
    return parts, fit.dropped


def render_report(report: "Report", written: list[str] | None = None, limit: int = TERMINAL_ROWS,  # noqa: ANN201
                  width: int | None = None):
    """The rich table (long sweeps truncated, and said so), constants and notes.

    No number or id is cut: at a narrow ``width`` (default: the terminal's) figure columns are dropped,
    least telling first; when that would drop a result (KV tokens, requests, max context, fits), the pool's
    labels move to a line above its rows instead (the model's full id). The table says what it left out
    (every figure is in the CSV / JSON outputs)."""
    from rich.console import Group
    from rich.text import Text

    from kvplan.render.fit import COMPACT, fit_columns, terminal_width

    width = width or terminal_width()
    num_rows = report.num_rows
    chosen = report.digest.sample(limit)
    title = f"{report.title} ({num_rows:,} scenarios)"
    fit = fit_columns(_table_cols(columns(report), chosen), width, **COMPACT)
    result_titles = {_TERMINAL_TITLES[k].replace("\n", " ") for k in _RESULT_FIGURES}
    if result_titles & set(fit.dropped):
        tables, dropped = _grouped_table(report, chosen, width, title)
    else:
        tables, dropped = [fit.table(title=title, title_justify="left")], fit.dropped
    parts: list[Any] = []
    const = constants(report)
    if const:
        parts.append(Text("for every row: " + ", ".join(f"{k} {v}" for k, v in const), style="grey62"))
    parts.extend(tables)
    parts.append(Text("KiB/tok: KV bytes per token per GPU · wts, KV: weights and KV budget per GPU · reqs@ctx: requests that "
                      "fit at the context · ctx@batch: longest context at the batch · reqs range: at the low and high "
                      "end of kvplan's range · tok/s: decode ceiling", style="grey62"))
    if dropped:
        parts.append(Text(f"not shown at this width: {', '.join(dropped)} (widen the terminal; every figure is in the "
                          "CSV / JSON outputs and --json)", style="yellow"))
    hidden = max(0, num_rows - limit)
    if hidden:
        parts.append(Text(f"… {hidden:,} of {plural(num_rows, 'row')} not shown (--rows N shows more); every row goes to the "
                          f"CSV/JSON outputs and --json", style="yellow"))
    for note in report.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    if report.sizes:  # each question's answer (its table is in the Markdown / HTML / JSON outputs)
        from kvplan.render.size import headline

        for name, sizing in report.sizes:
            parts.append(Text(f"size {name}: " + headline(sizing)[1]))
    for path in written or []:
        parts.append(Text(f"wrote {path}", style="grey62"))
    return Group(*parts)


# ---------------------------------------------------------------------------------------------
# CSV / JSON


class CsvRows:
    """Rows streamed to CSV: every figure of every row (bytes as integers, per GPU)."""

    def __init__(self, fh: IO[str]) -> None:
        from kvplan.checks.rows import ROW_FIELDS

        self._fields = ROW_FIELDS
        self._writer = csv.writer(fh, lineterminator="\n")
        self._writer.writerow(ROW_FIELDS)

    def add(self, row: dict[str, Any]) -> None:
        """One row's ``Row.to_dict()``."""
        self._writer.writerow([row[k] for k in self._fields])

    def close(self) -> None:
        pass


_FLAT = json.JSONEncoder(separators=(", ", ": ")).encode  # the C encoder (no indent)


class JsonRows:
    """Rows streamed into one JSON document, byte for byte ``json.dumps({**header, "rows": rows}, indent=indent)``,
    written one row at a time (a row is a flat object: the C encoder writes it, the indent is added here)."""

    def __init__(self, fh: IO[str], header: dict[str, Any], indent: int = 1) -> None:
        self._fh, self._indent, self._n = fh, indent, 0
        opening = json.dumps({**header, "rows": []}, indent=indent)
        assert opening.endswith("[]\n}")
        fh.write(opening[:-len("[]\n}")] + "[")
        self._open = "\n" + " " * (2 * indent) + "{\n" + " " * (3 * indent)
        self._sep = ",\n" + " " * (3 * indent) + '"'
        self._close = "\n" + " " * (2 * indent) + "}"

    def add(self, row: dict[str, Any]) -> None:
        """One row's ``Row.to_dict()`` (flat: scalars only)."""
        body = _FLAT(row)[1:-1].replace(', "', self._sep)  # inside a JSON string a quote is always escaped
        self._fh.write(("," if self._n else "") + self._open + body + self._close)
        self._n += 1

    def close(self) -> None:
        self._fh.write(("\n" + " " * self._indent + "]" if self._n else "]") + "\n}\n")


def to_csv(report: "Report") -> str:
    """Every row of a report that kept them, as CSV text."""
    buf = io.StringIO()
    out = CsvRows(buf)
    for row in _all_rows(report):
        out.add(row.to_dict())
    return buf.getvalue()


def to_json(report: "Report") -> str:
    """Every row of a report that kept them, as one JSON document."""
    buf = io.StringIO()
    out = JsonRows(buf, report.header())
    for row in _all_rows(report):
        out.add(row.to_dict())
    out.close()
    return buf.getvalue()


def _all_rows(report: "Report") -> "tuple[Row, ...]":
    if report.rows is None:
        from kvplan.errors import InputError

        raise InputError("a streamed report does not keep its rows", "write CSV / JSON while streaming (open_row_writers)")
    return report.rows


# ---------------------------------------------------------------------------------------------
# Markdown / HTML

PLOT_TITLES = {"concurrency": "Max concurrency vs context", "memory": "Memory per GPU"}  # (report_plots draws them)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(report: "Report", images: dict[str, str], notes: list[str]) -> str:
    """Markdown with a table (at most DOCUMENT_ROWS rows) and links to PNGs written beside it."""
    cols = columns(report)
    cells, hidden = _table_rows(report, cols, DOCUMENT_ROWS)
    lines = [f"# {report.title}", ""]
    if report.description:
        lines += [report.description, ""]
    lines += [f"{report.num_rows:,} scenarios from `{report.file}`, generated by kvplan.", ""]
    const = constants(report)
    if const:
        lines += ["For every row: " + ", ".join(f"**{k}** {v}" for k, v in const) + ".", ""]
    for name, path in images.items():
        lines += [f"![{PLOT_TITLES[name]}]({path})", ""]
    header = [_title(c) for c in cols] + [t for t, _ in _FIGURES]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" if i < len(cols) else "---:" for i in range(len(header))) + "|")
    for row in cells:
        lines.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    lines.append("")
    if hidden:
        lines += [f"*{plural(hidden, 'row')} not shown; the CSV and JSON outputs hold all {report.num_rows:,}.*", ""]
    for note in list(report.notes) + notes:
        lines.append(f"- note: {note}")
    lines += _markdown_sizes(report)
    lines += ["", _footnote(), ""]
    return "\n".join(lines)


def _markdown_sizes(report: "Report") -> list[str]:
    """The ``size:`` questions: each one's answer, then its table (:func:`kvplan.render.size.size_table`)."""
    if not report.sizes:
        return []
    from kvplan.render.size import headline, size_table

    lines = ["", "## Sizing", ""]
    for name, sizing in report.sizes:
        header, rows = size_table(sizing)
        lines += [f"### {_md_cell(name)}", ""] + [f"{_md_cell(line)}  " for line in headline(sizing)] + [""]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---" for _ in header) + "|")
        lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
        if sizing.unfit:
            lines += ["", "No deployment holds one request on: " + "; ".join(f"{g} ({why})" for g, why in sizing.unfit)]
        lines.append("")
    return lines


def _footnote() -> str:
    return ("Bytes are per GPU, GiB = 2^30 bytes. *max req @ctx*: whole requests of *context* tokens that fit at once; "
            "*max ctx @batch*: the longest context that fits *batch* requests; *KV tokens*: vLLM's \"GPU KV cache size\" at "
            "max_model_len; *decode tok/s*: HBM-bandwidth ceiling at the batch that fits.")


_CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:2rem auto;max-width:1400px;
padding:0 1rem;color:#1f2328;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}.meta{color:#57606a;margin-top:0}.const{background:#f6f8fa;border:1px solid #d0d7de;
border-radius:6px;padding:.5rem .8rem;font-size:.9rem}.plots{display:flex;flex-wrap:wrap;gap:1rem;margin:1rem 0}
figure{margin:0;flex:1 1 100%;border:1px solid #d0d7de;border-radius:6px;padding:.5rem;background:#fff}
figure img{display:block;margin:0 auto;max-width:100%;height:auto}figcaption{font-size:.85rem;color:#57606a;text-align:center}
.wrap{overflow-x:auto;max-height:75vh;border:1px solid #d0d7de;border-radius:6px}
table{border-collapse:collapse;font-size:.8rem;width:100%}th,td{padding:.28rem .45rem;border-bottom:1px solid #eaeef2;
white-space:nowrap}th{position:sticky;top:0;background:#f6f8fa;text-align:left;border-bottom:1px solid #d0d7de;
white-space:normal;vertical-align:bottom}th.n{text-align:right}td.name{white-space:normal;min-width:8rem;max-width:14rem}
td.n{text-align:right;font-variant-numeric:tabular-nums}tr:nth-child(even) td{background:#fbfcfd}
td.yes{color:#1a7f37;font-weight:600}td.no{color:#cf222e;font-weight:600}.note{color:#9a6700}
.foot{color:#57606a;font-size:.8rem;margin-top:1rem}
"""


def to_html(report: "Report", plots: dict[str, bytes], notes: list[str]) -> str:
    """One self-contained HTML file: inline CSS, plots as base64 PNG, no external resources."""
    esc = html.escape
    cols = columns(report)
    cells, hidden = _table_rows(report, cols, DOCUMENT_ROWS)
    numeric = {"context", "batch", "tp", "pp", "gpus", "max_model_len", "block_size", "gpu_util"}
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{esc(report.title)}</title><style>{_CSS}</style></head><body>",
           f"<h1>{esc(report.title)}</h1>",
           f'<p class="meta">{report.num_rows:,} scenarios from <code>{esc(report.file)}</code>, generated by kvplan.</p>']
    if report.description:
        out.append(f"<p>{esc(report.description)}</p>")
    const = constants(report)
    if const:
        out.append('<p class="const">For every row: ' + ", ".join(f"<b>{esc(k)}</b> {esc(v)}" for k, v in const) + "</p>")
    if plots:
        out.append('<div class="plots">')
        for name, data in plots.items():
            b64 = base64.b64encode(data).decode("ascii")
            out.append(f'<figure><img alt="{esc(PLOT_TITLES[name])}" src="data:image/png;base64,{b64}">'
                       f"<figcaption>{esc(PLOT_TITLES[name])}</figcaption></figure>")
        out.append("</div>")
    for note in list(report.notes) + notes:
        out.append(f'<p class="note">note: {esc(note)}</p>')
    out.append('<div class="wrap"><table><thead><tr>')
    out.extend(f'<th class="n">{esc(_title(c))}</th>' if c in numeric else f"<th>{esc(_title(c))}</th>"
               for c in cols)
    out.extend(f"<th>{esc(t)}</th>" if k == "fits" else f'<th class="n">{esc(t)}</th>' for t, k in _FIGURES)
    out.append("</tr></thead><tbody>")
    figure_keys = {k for _, k in _FIGURES}
    keys = cols + [k for _, k in _FIGURES]
    for row in cells:
        tds = []
        for key, cell in zip(keys, row):
            if key == "fits":
                cls = "no" if cell.startswith("no") else ("yes" if cell == "yes" else "")
            elif key == "name":
                cls = "name"
            else:
                cls = "n" if key in numeric or key in figure_keys else ""
            tds.append(f'<td class="{cls}">{esc(cell)}</td>' if cls else f"<td>{esc(cell)}</td>")
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</tbody></table></div>")
    if hidden:
        out.append(f'<p class="note">{plural(hidden, "row")} not shown; the CSV and JSON outputs hold all {report.num_rows:,}.</p>')
    out.extend(_html_sizes(report))
    out.append(f'<p class="foot">{esc(_footnote()).replace("*", "")}</p>')
    out.append("</body></html>\n")
    return "\n".join(out)


def _html_sizes(report: "Report") -> list[str]:
    """The ``size:`` questions as HTML: each one's answer, then its table."""
    if not report.sizes:
        return []
    from kvplan.render.size import headline, size_table

    esc = html.escape
    out = ["<h2>Sizing</h2>"]
    for name, sizing in report.sizes:
        header, rows = size_table(sizing)
        out.append(f"<h3>{esc(name)}</h3>")
        out.extend(f'<p class="meta">{esc(line)}</p>' for line in headline(sizing))
        out.append('<div class="wrap"><table><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in header)
                   + "</tr></thead><tbody>")
        out.extend("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
        out.append("</tbody></table></div>")
        if sizing.unfit:
            out.append('<p class="note">No deployment holds one request on: '
                       + esc("; ".join(f"{g} ({why})" for g, why in sizing.unfit)) + "</p>")
    return out


ROW_SUFFIXES = (".csv", ".json")  # outputs that hold every row (streamed)


def open_row_writers(files: Any, outputs: tuple[Path, ...], header: dict[str, Any]) -> list[Any]:
    """A streaming writer (``add(row)``, ``close()``) for each CSV / JSON output, writing into temporary
    files of ``files`` (a :class:`kvplan.io.atomic.AtomicFiles`) that replace the outputs on commit."""
    writers: list[Any] = []
    for path in outputs:
        suffix = path.suffix.lower()
        if suffix == ".csv":
            writers.append(CsvRows(files.open(path)))
        elif suffix == ".json":
            writers.append(JsonRows(files.open(path), header))
    return writers


def render_documents(report: "Report", outputs: tuple[Path, ...], plot_names: tuple[str, ...]) -> tuple[dict[Path, bytes | str], list[str]]:
    """The Markdown / HTML outputs (and the Markdown's PNGs): content only, nothing written here; and
    warnings to show (e.g. no matplotlib). CSV and JSON are streamed (:func:`open_row_writers`)."""
    files: dict[Path, bytes | str] = {}
    warnings: list[str] = []
    plots: dict[str, bytes] = {}
    plot_notes: list[str] = []
    if plot_names and any(p.suffix.lower() in (".md", ".html") for p in outputs):
        from kvplan.render import report_plots  # matplotlib is drawn only for a document with plots

        try:
            plots, plot_notes = report_plots.make_plots(report, plot_names)
        except report_plots.PlotsUnavailable as exc:
            warnings.append(str(exc))
    for path in outputs:
        suffix = path.suffix.lower()
        if suffix == ".html":
            files[path] = to_html(report, plots, plot_notes)
        elif suffix == ".md":
            images = {}
            for name, data in plots.items():
                png = path.with_name(f"{path.stem}-{name}.png")
                files[png] = data
                images[name] = png.name
            files[path] = to_markdown(report, images, plot_notes)
    return files, warnings
