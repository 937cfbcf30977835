"""Tables that fit the terminal without cutting a number or an id.

A column is either *rigid* (numbers, ids, names people copy: never wrapped, never cut) or *wrapping* (free
text, wrapped at spaces, never narrower than its longest word). :func:`fitted_table` gives every column
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

    def _lines(self) -> list[str]:
        out = [line for line in self.title.split("\n")]
        for c in self.cells:
            out.extend(str(getattr(c, "plain", c)).split("\n"))
        return out

    @property
    def full_width(self) -> int:
        return max((cell_len(line) for line in self._lines()), default=1) or 1

    @property
    def min_width(self) -> int:
        """Rigid: the full width. Wrapping: the longest word (titles wrap too)."""
        if not self.wrap:
            return self.full_width
        words = [w for line in self._lines() for w in line.split()]
        return max((cell_len(w) for w in words), default=1) or 1


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


def fitted_table(cols: list[Col], width: int, *, sections: set[int] | frozenset[int] = frozenset(),
                 **table_kwargs: Any) -> tuple[Any, list[str]]:
    """A rich Table of ``cols`` at most ``width`` cells wide, and the titles of the columns dropped.

    ``sections``: row indices after which a section line is drawn."""
    from rich.table import Table

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
    table = Table(**table_kwargs)
    for c, w in zip(kept, widths):
        table.add_column(c.title, width=w, no_wrap=not c.wrap and w >= c.full_width, overflow="fold",
                         justify=c.justify, **c.options)
    for r in range(max((len(c.cells) for c in kept), default=0)):
        table.add_row(*[c.cells[r] if r < len(c.cells) else "" for c in kept], end_section=r in sections)
    return table, dropped


def terminal_width() -> int:
    """The width output is rendered at: the terminal's (``COLUMNS`` when set), 80 when not a terminal."""
    from kvplan.render import console

    return console().width
