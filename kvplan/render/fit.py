"""Tables that fit the terminal without cutting a number or an id.

A column is either *rigid* (numbers, ids, names people copy: never wrapped, never cut) or *wrapping* (free
text, wrapped at spaces, never narrower than its longest word). A wrapping cell may also be a tuple of
*items* (aliases, labels that hold spaces, such as "H200 SXM 141GB"): it is joined with the column's
``sep`` and broken only between items (:func:`wrap_items`), never inside one. :func:`fitted_table` gives every column
an explicit width: rigid columns their full width, wrapping columns what is left (at least their longest
word); when even that does not fit, it drops columns in the order their ``drop`` priority says (lowest
first) and returns the titles it left out, so the caller can say so. Only when no droppable column is left
does a column fold (a name longer than the terminal), which is the one case a value is broken over lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.cells import cell_len

COMPACT: dict[str, Any] = {"box": box.SIMPLE_HEAD, "padding": (0, 1), "collapse_padding": True, "pad_edge": False,
                           "show_edge": False}
"""Table style for wide listings: a rule under the header, one space between columns, no outer border."""


@dataclass
class Col:
    """One column: ``title`` (may hold newlines), ``cells`` (str or rich Text), ``wrap`` for free text,
    ``drop`` priority (None: never dropped; lower numbers go first), rich column options in ``options``."""

    title: str
    cells: list[Any] = field(default_factory=list)
    wrap: bool = False
    drop: int | None = None
    justify: str = "left"
    options: dict[str, Any] = field(default_factory=dict)
    sep: str = ", "  # joins the items of a tuple cell

    def _lines(self) -> list[str]:
        out = [line for line in self.title.split("\n")]
        for c in self.cells:
            out.extend(self.sep.join(c).split("\n") if isinstance(c, tuple) else str(getattr(c, "plain", c)).split("\n"))
        return out

    def _words(self) -> list[str]:
        """The unbreakable pieces: items of tuple cells (with the separator they end a line with), else words."""
        words = [w for line in self.title.split("\n") for w in line.split()]
        tail = self.sep.rstrip()
        for c in self.cells:
            if isinstance(c, tuple):
                words.extend([item + tail for item in c[:-1]] + list(c[-1:]))
            else:
                words.extend(str(getattr(c, "plain", c)).split())
        return words

    @property
    def full_width(self) -> int:
        return max((cell_len(line) for line in self._lines()), default=1) or 1

    @property
    def min_width(self) -> int:
        """Rigid: the full width. Wrapping: the longest word (titles wrap too)."""
        if not self.wrap:
            return self.full_width
        return max((cell_len(w) for w in self._words()), default=1) or 1


def _chrome(n: int, table_kwargs: dict[str, Any]) -> int:
    """Columns of borders and padding a table with ``n`` columns takes (measured, so every box style works)."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    if n == 0:
        return 0
    probe = Table(**{k: v for k, v in table_kwargs.items() if k not in ("title", "caption")})
    for _ in range(n):
        probe.add_column("", width=1)
    probe.add_row(*["x"] * n)
    console = Console(width=10_000)
    return Measurement.get(console, console.options, probe).maximum - n


def wrap_items(items: tuple[str, ...] | list[str], width: int, sep: str = ", ") -> str:
    """``items`` joined with ``sep`` in lines of at most ``width`` cells, broken only between items (an item
    wider than ``width`` gets a line of its own)."""
    lines: list[str] = []
    line = ""
    tail = sep.rstrip()
    for i, item in enumerate(items):
        piece = item + (tail if i < len(items) - 1 else "")
        if line and cell_len(line + sep[len(tail):] + piece) > width:
            lines.append(line)
            line = piece
        else:
            line = line + sep[len(tail):] + piece if line else piece
    if line:
        lines.append(line)
    return "\n".join(lines)


@dataclass
class Fit:
    """Columns fitted to a width: those kept, their widths, and the titles of those dropped."""

    kept: list[Col]
    widths: list[int]
    dropped: list[str]
    table_kwargs: dict[str, Any]

    def table(self, rows: range | list[int] | None = None, sections: set[int] | frozenset[int] = frozenset(),
              **overrides: Any) -> Any:
        """A rich Table of the kept columns at their widths, with the cells of ``rows`` (default: all);
        ``sections``: row indices after which a section line is drawn; ``overrides``: table options
        (``show_header=False`` for a continuation)."""
        from rich.table import Table

        table = Table(**{**self.table_kwargs, **overrides})
        for c, w in zip(self.kept, self.widths):
            table.add_column(c.title, width=w, no_wrap=not c.wrap and w >= c.full_width, overflow="fold",
                             justify=c.justify, **c.options)
        n = max((len(c.cells) for c in self.kept), default=0)
        for r in rows if rows is not None else range(n):
            cells = [c.cells[r] if r < len(c.cells) else "" for c in self.kept]
            cells = [wrap_items(cell, w, c.sep) if isinstance(cell, tuple) else cell
                     for c, w, cell in zip(self.kept, self.widths, cells)]
            table.add_row(*cells, end_section=r in sections)
        return table


def fit_columns(cols: list[Col], width: int, **table_kwargs: Any) -> Fit:
    """Fit ``cols`` into ``width`` cells: drop columns in ``drop`` order until the rest fit, give the
    wrapping columns what is left, fold the widest only when nothing droppable is left."""
    kept = list(cols)
    dropped: list[str] = []
    while True:
        need = sum(c.min_width for c in kept) + _chrome(len(kept), table_kwargs)
        if need <= width:
            break
        droppable = [c for c in kept if c.drop is not None]
        if not droppable:
            break
        victim = min(droppable, key=lambda c: c.drop)  # type: ignore[arg-type, return-value]
        kept.remove(victim)
        dropped.append(victim.title.replace("\n/", "/").replace("\n", " "))
    spare = width - _chrome(len(kept), table_kwargs) - sum(c.min_width for c in kept)
    widths = [c.min_width for c in kept]
    wrapping = [i for i, c in enumerate(kept) if c.wrap]
    for i in wrapping:  # give the wrapping columns what they would like, left to right
        extra = min(max(0, spare), kept[i].full_width - widths[i])
        widths[i] += extra
        spare -= extra
    if spare < 0:  # nothing left to drop: the widest columns fold (a value longer than the terminal)
        for i in sorted(range(len(kept)), key=lambda i: -widths[i]):
            cut = min(-spare, widths[i] - 8)
            if cut > 0:
                widths[i] -= cut
                spare += cut
            if spare >= 0:
                break
    return Fit(kept, widths, dropped, table_kwargs)


def fitted_table(cols: list[Col], width: int, *, sections: set[int] | frozenset[int] = frozenset(),
                 **table_kwargs: Any) -> tuple[Any, list[str]]:
    """A rich Table of ``cols`` at most ``width`` cells wide, and the titles of the columns dropped.

    ``sections``: row indices after which a section line is drawn."""
    fit = fit_columns(cols, width, **table_kwargs)
    return fit.table(sections=sections), fit.dropped


def terminal_width() -> int:
    """The width output is rendered at: the terminal's (``COLUMNS`` when set), 80 when not a terminal."""
    from kvplan.render import console

    return console().width
