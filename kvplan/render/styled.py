"""Styled text, panels and grids for ``kvplan estimate``'s terminal output, drawn without importing rich where
rich would print them without colour, else printed by rich.

The objects mirror the part of rich's API the estimate's renderer uses (:class:`Text`: ``append``,
``assemble``, ``join``, ``rstrip``, ``plain``; :class:`Panel`; :class:`Grid`, rich's ``Table.grid``;
:class:`Group`), and each is a rich renderable through ``__rich__`` (the same rich objects the renderer built
before), so a rich console prints them as ever. :func:`show` prints them: where rich would write plain text
(:func:`plain_width`: output that is not a terminal, no ``FORCE_COLOR`` / ``TTY_COMPATIBLE``, a UTF-8 stream,
not Windows or Jupyter) it draws them itself (:func:`draw`) in the bytes rich would write, following rich's
rules (word wrap, folding a word longer than a line, a grid's column widths, a panel's title); anything else
goes to rich: colour, a text outside the characters drawn here (tabs, control codes, wide or combining
characters), markup to read (a ``[`` in a title or a plain cell), a console too narrow for the simple layout.
tests/render/test_styled.py holds the drawing to rich's bytes over every bundled model at many widths.

Why: rich's console, table and panel imports and its layout are ~35 ms, about a third of the whole estimate
run (benchmarks/startup.py); drawing the same text here takes ~1 ms.
"""

from __future__ import annotations

import builtins
import os
import re
import sys
from typing import Any, Iterable, Iterator

MIN_WIDTH = 40  # narrower consoles go to rich (its last-resort column squeezing is not drawn here)
_STRIP = {7: None, 8: None, 11: None, 12: None, 13: None}  # what rich's Text removes (rich.control)
# characters drawn here: printable ASCII, the newline, and these, one terminal cell each (as rich counts them;
# tests/render/test_styled.py checks it)
SINGLE_CELL = frozenset("·−–—×≈≤≥→←↑↓…█■─│╭╮╰╯µ°±")
_WORD = re.compile(r"\s*\S+\s*")
_TRAILING_SPACE = re.compile(r"\s+$")


class Unsupported(Exception):
    """The drawing here does not cover this output: rich prints it."""


class Text:
    """Text with styled spans, as :class:`rich.text.Text` builds them (the same spans, in the same order)."""

    __slots__ = ("_chunks", "style", "spans", "_length")

    def __init__(self, text: str = "", style: str = "") -> None:
        text = text.translate(_STRIP)
        self._chunks = [text]
        self.style = style
        self.spans: list[tuple[int, int, str]] = []
        self._length = len(text)

    def __len__(self) -> int:
        return self._length

    def __str__(self) -> str:
        return self.plain

    @property
    def plain(self) -> str:
        """The text without its styles."""
        if len(self._chunks) > 1:
            self._chunks[:] = ["".join(self._chunks)]
        return self._chunks[0]

    def append(self, text: "str | Text", style: str | None = None) -> "Text":
        """Add ``text`` (a str, styled ``style``, or a Text with its own spans); returns self."""
        if not len(text):
            return self
        offset = self._length
        if isinstance(text, str):
            text = text.translate(_STRIP)
            self._chunks.append(text)
            if style:
                self.spans.append((offset, offset + len(text), style))
        else:
            if text.style:
                self.spans.append((offset, offset + len(text), text.style))
            self._chunks.append(text.plain)
            self.spans.extend((s + offset, e + offset, st) for s, e, st in text.spans)
        self._length += len(text)
        return self

    @classmethod
    def assemble(cls, *parts: "str | Text | tuple[str, str]") -> "Text":
        """A Text of ``parts``: strs, Texts and ``(text, style)`` pairs."""
        out = cls()
        for part in parts:
            if isinstance(part, (str, Text)):
                out.append(part)
            else:
                out.append(*part)
        return out

    def join(self, lines: Iterable["Text"]) -> "Text":
        """``lines`` with this text between them (each line's own style becomes a span)."""
        out = Text(style=self.style)
        lines = list(lines)
        for i, line in enumerate(lines):
            if i and self.plain:
                out._add_whole(self)
            out._add_whole(line)
        return out

    def _add_whole(self, text: "Text") -> None:
        offset = self._length
        self._chunks.append(text.plain)
        if text.style:
            self.spans.append((offset, offset + len(text), text.style))
        self.spans.extend((s + offset, e + offset, st) for s, e, st in text.spans)
        self._length += len(text)

    def rstrip(self) -> None:
        """Strip whitespace from the end (spans past it are cut, as rich's are)."""
        plain = self.plain
        new = plain.rstrip()
        if new == plain:
            return
        self._chunks[:] = [new]
        self._length = end = len(new)
        self.spans[:] = [span if span[1] < end else (span[0], min(end, span[1]), span[2])
                         for span in self.spans if span[0] < end]

    def __rich__(self) -> Any:
        from rich.text import Span, Text as RichText

        return RichText(self.plain, style=self.style, spans=[Span(*span) for span in self.spans])


class Panel:
    """A panel as :func:`kvplan.render.estimate._panel` draws it: rounded, the title at its left (``title`` is
    markup, read without emoji codes), the full width, one space of padding at each side."""

    __slots__ = ("body", "title")

    def __init__(self, body: Any, title: str) -> None:
        self.body, self.title = body, title

    def __rich__(self) -> Any:
        from rich.panel import Panel as RichPanel
        from rich.text import Text as RichText

        return RichPanel(_to_rich(self.body), title=RichText.from_markup(self.title, emoji=False), title_align="left")


class Column:
    """One grid column: rich's ``Table.add_column`` options (only those given are passed on)."""

    __slots__ = ("options",)

    def __init__(self, **options: Any) -> None:
        self.options = options

    @property
    def no_wrap(self) -> bool:
        return bool(self.options.get("no_wrap"))

    @property
    def justify(self) -> str:
        return self.options.get("justify", "left")

    @property
    def overflow(self) -> str:
        return self.options.get("overflow", "ellipsis")


class Grid:
    """rich's ``Table.grid(padding=(0, padding))``: columns side by side, ``padding`` spaces between them."""

    __slots__ = ("padding", "columns", "rows")

    def __init__(self, padding: int) -> None:
        self.padding = padding
        self.columns: list[Column] = []
        self.rows: list[tuple[Any, ...]] = []

    def add_column(self, **options: Any) -> None:
        self.columns.append(Column(**options))

    def add_row(self, *cells: "str | Text") -> None:
        self.rows.append(cells)

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table.grid(padding=(0, self.padding))
        for column in self.columns:
            table.add_column(**column.options)
        for row in self.rows:
            table.add_row(*(_to_rich(cell) for cell in row))
        return table


class Group:
    """Renderables one below the other."""

    __slots__ = ("parts",)

    def __init__(self, *parts: Any) -> None:
        self.parts = parts

    def __rich__(self) -> Any:
        from rich.console import Group as RichGroup

        return RichGroup(*(_to_rich(part) for part in self.parts))


def _to_rich(item: Any) -> Any:
    return item.__rich__() if isinstance(item, (Text, Panel, Grid, Group)) else item


def show(*items: Any) -> None:
    """Print ``items`` (each as one ``Console.print`` would) on stdout: drawn here where rich would write plain
    text (:func:`plain_width`) and the items are drawn here, else by rich."""
    width = plain_width()
    if width is not None:
        try:
            text = "".join(draw(item, width) for item in items)
        except Unsupported:
            pass
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
            return
    from kvplan.render import console

    out = console()
    for item in items:
        out.print(item)


def plain_width() -> int | None:
    """The width rich's console (:func:`kvplan.render.console`) would lay stdout out at, where it would write
    it without colour or control codes; None where it would not, or where its choice is not followed here."""
    out = sys.stdout
    if out is None or sys.platform == "win32" or hasattr(out, "rich_proxied_file"):
        return None
    if hasattr(builtins, "get_ipython") or (getattr(sys.stdin, "__module__", "") or "").startswith("idlelib"):
        return None  # Jupyter and IDLE: rich's own cases
    if not (getattr(out, "encoding", "utf-8") or "utf-8").lower().startswith("utf"):
        return None  # rich draws ASCII boxes
    env = os.environ
    compatible = env.get("TTY_COMPATIBLE", "")
    if compatible == "1":
        return None
    if compatible != "0":
        force = env.get("FORCE_COLOR")
        if force is not None and force != "":
            return None
        if force is None:
            try:
                if out.isatty():
                    return None
            except (AttributeError, ValueError):
                pass
    columns = env.get("COLUMNS")
    if columns is not None and columns.isdigit():
        width = int(columns)
    else:
        width = None
        for fd in (0, 1, 2):
            try:
                width = os.get_terminal_size(fd)[0]
            except (AttributeError, ValueError, OSError):
                continue
            break
        width = width or 80
    return width if width >= MIN_WIDTH else None


def draw(item: Any, width: int) -> str:
    """``item`` as rich's ``Console.print`` writes it at ``width`` columns without colour; :class:`Unsupported`
    where the drawing here does not follow rich's."""
    if isinstance(item, Panel):
        return "".join(line + "\n" for line in _panel_lines(item, width))
    if isinstance(item, Text):
        return "".join(line + "\n" for line in _wrap(_checked(item.plain), width))
    if isinstance(item, Group):
        return "".join(draw(part, width) for part in item.parts)
    raise Unsupported(type(item).__name__)


def _checked(text: str, markup: bool = False) -> str:
    """``text`` when every character is drawn here (and, for markup, holds no tag)."""
    for ch in text:
        if not (" " <= ch <= "~" or ch == "\n" or ch in SINGLE_CELL) or (markup and ch == "["):
            raise Unsupported(repr(ch))
    return text


def _panel_lines(panel: Panel, width: int) -> list[str]:
    """rich's Panel (rounded box, expanded, padding (0, 1), title at the left) as lines of ``width`` cells."""
    title = _checked(panel.title, markup=True)
    if "\n" in title or len(title) + 2 > width - 4:
        raise Unsupported("title")
    inner = width - 4
    body = [line + " " * (inner - len(line)) for line in _body_lines(panel.body, inner)]
    top = "╭─" + f" {title} ".ljust(width - 4, "─") + "─╮"
    return [top, *(f"│ {line} │" for line in body), "╰" + "─" * (width - 2) + "╯"]


def _body_lines(body: Any, width: int) -> list[str]:
    """A panel's body as lines of at most ``width`` cells (unpadded)."""
    if isinstance(body, Text):
        return _wrap(_checked(body.plain), width)
    if isinstance(body, Grid):
        return _grid_lines(body, width)
    if isinstance(body, Group):
        return [line for part in body.parts for line in _body_lines(part, width)]
    raise Unsupported(type(body).__name__)


def _words(text: str) -> Iterator[tuple[int, str]]:
    position = 0
    match = _WORD.match(text, position)
    while match is not None:
        yield match.start(), match.group(0)
        match = _WORD.match(text, match.end())


def _breaks(text: str, width: int) -> list[int]:
    """Where rich's word wrap (``rich._wrap.divide_line``, folding) breaks one line of single-cell text."""
    breaks: list[int] = []
    offset = 0
    for start, word in _words(text):
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:  # longer than a line: folded into pieces of ``width``
            pieces = [word[i:i + width] for i in range(0, len(word), width)]
            for i, piece in enumerate(pieces):
                if start:
                    breaks.append(start)
                if i == len(pieces) - 1:
                    offset = len(piece)
                else:
                    start += len(piece)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    return breaks


def _wrap(text: str, width: int) -> list[str]:
    """rich's ``Text.wrap`` (justify default, overflow fold) of single-cell text at ``width``: each line's words
    as rich breaks them, whitespace past the width dropped, then cut at the width."""
    lines: list[str] = []
    for line in text.split("\n"):
        cuts = [0, *_breaks(line, width), len(line)]
        for a, b in zip(cuts, cuts[1:]):
            piece = line[a:b]
            if len(piece) > width:
                match = _TRAILING_SPACE.search(piece)
                if match is not None:
                    piece = piece[:len(piece) - min(len(match.group(0)), len(piece) - width)]
            lines.append(piece[:width])
    return lines


def _cell_lines(cell: Any, column: Column, width: int) -> list[str]:
    """One grid cell in its column (``width`` cells, padding excluded), as rich lays it out, padded."""
    if isinstance(cell, Text):
        plain = _checked(cell.plain)
    elif isinstance(cell, str):
        plain = _checked(cell, markup=True)
    else:
        raise Unsupported(type(cell).__name__)
    if column.no_wrap:
        lines = plain.split("\n")
        if any(len(line) > width for line in lines):
            raise Unsupported("a no_wrap cell wider than its column")
    elif column.overflow == "fold":
        lines = _wrap(plain, width)
    else:
        raise Unsupported(f"overflow {column.overflow}")
    if column.justify == "right":
        return [line.rstrip().rjust(width) for line in lines]
    if column.justify != "left":
        raise Unsupported(f"justify {column.justify}")
    return [line.ljust(width) for line in lines]


def _column_widths(grid: Grid, width: int) -> list[int]:
    """rich's column widths for a grid (not expanded) of at most ``width`` cells: each column its widest line
    plus the padding after it; when they are too wide, the one wrapping column (the last) gives up the excess."""
    last = len(grid.columns) - 1
    widths = []
    for i, column in enumerate(grid.columns):
        pad = grid.padding if i < last else 0
        widest = 0  # rich measures each cell: its longest line, at most the width, plus the padding
        for row in grid.rows:
            plain = row[i].plain if isinstance(row[i], Text) else str(row[i])
            widest = max(widest, min(min(max((len(line) for line in plain.splitlines()), default=0), width) + pad,
                                     width))
        widths.append(widest or 1)
    excess = sum(widths) - width
    if excess > 0:
        if any(not c.no_wrap for c in grid.columns[:last]) or grid.columns[last].no_wrap or excess >= widths[last]:
            raise Unsupported("a grid squeezed past its wrapping column")
        widths[last] -= excess
    if any(w - (grid.padding if i < last else 0) < 1 for i, w in enumerate(widths)):
        raise Unsupported("a column narrower than its padding")
    return widths


def _grid_lines(grid: Grid, width: int) -> list[str]:
    """A grid's rows, each cell laid out in its column and the row as tall as its tallest cell."""
    if not grid.columns or not grid.rows:
        raise Unsupported("an empty grid")
    widths = _column_widths(grid, width)
    last = len(grid.columns) - 1
    lines: list[str] = []
    for row in grid.rows:
        if len(row) != len(grid.columns):
            raise Unsupported("a row of another length")
        cells = []
        for i, (cell, column, w) in enumerate(zip(row, grid.columns, widths)):
            pad = grid.padding if i < last else 0
            cells.append([line + " " * pad for line in _cell_lines(cell, column, w - pad)])
        height = max(len(c) for c in cells)
        for n in range(height):
            lines.append("".join(c[n] if n < len(c) else " " * w for c, w in zip(cells, widths)))
    return lines
