"""kvplan.render.styled draws ``kvplan estimate``'s table in the bytes rich writes for it.

- over every bundled model and several deployments, at widths from 40 to 200 columns, :func:`draw` of the
  source line, the panels, ``--brief`` equals what rich's console prints without colour (the console
  :func:`kvplan.render.console` makes, at that width, writing to a file);
- word wrap and folding match rich's on arbitrary text (a hypothesis property), grid columns squeezed to
  their wrapping column too;
- :func:`plain_width` is rich's own reading of the environment (``FORCE_COLOR``, ``TTY_COMPATIBLE``,
  ``COLUMNS``, a terminal): a width exactly where rich would write no colour, at the width it would use;
- what is not drawn here (colour, markup, wide characters, tabs) is printed by rich, unchanged.
"""

from __future__ import annotations

import io
from functools import lru_cache

import pytest
from hypothesis import given, settings, strategies as st
from rich.cells import cell_len
from rich.console import Console

from kvplan.errors import KvplanError
from kvplan.model.sources import bundled_ids, load_bundled
from kvplan.model.spec import build_spec
from kvplan.planning.plan import Options, plan_for_spec
from kvplan.render import styled
from kvplan.render.estimate import render_brief, render_plan, source_line
from kvplan.render.styled import Grid, Group, Panel, Text, Unsupported, draw, plain_width, show

WIDTHS = (40, 57, 80, 123, 200)
DEPLOYMENTS = ({"gpu": "H100", "context": 8192}, {"gpu": "L4", "context": 32768, "batch": 4, "kv_dtype": "fp8"},
               {"gpu": "H100", "engine": "sglang", "context": 4096, "batch": 64, "tp": 2},
               {"gpu": "H200", "context": 8192, "batch": 1500, "prefix_tokens": 2048})


def _rich(width: int, *items: object) -> str:
    """What rich's console prints for ``items`` at ``width`` columns into a file (no colour)."""
    out = io.StringIO()
    console = Console(file=out, width=width, highlight=False, soft_wrap=False, emoji=False)
    assert console.color_system is None and not console.is_terminal
    for item in items:
        console.print(item)
    return out.getvalue()


@lru_cache(maxsize=None)
def _spec(model_id: str):  # noqa: ANN202
    return build_spec(load_bundled(model_id))


def test_the_characters_drawn_are_one_cell_each_as_rich_counts_them():
    assert all(cell_len(ch) == 1 for ch in styled.SINGLE_CELL)
    assert all(cell_len(chr(c)) == 1 for c in range(0x20, 0x7F))


@pytest.mark.parametrize("model_id", bundled_ids())
def test_every_bundled_models_table_is_drawn_in_riches_bytes(model_id):
    drawn = tried = 0
    for values in DEPLOYMENTS:
        try:
            plan = plan_for_spec(_spec(model_id), Options(model=model_id, **values))
        except KvplanError:  # a deployment this model cannot have (tp 2 over 71 heads)
            continue
        tried += 1
        items = (source_line(plan.source), render_plan(plan))
        for width in WIDTHS:
            expected = _rich(width, *items)
            try:
                got = "".join(draw(item, width) for item in items)
            except Unsupported:
                continue
            assert got == expected, (model_id, values, width)
            drawn += 1
        for width in (80, 200):  # --brief as a terminal and a log show it (tests/render/test_estimate.py reads 200)
            assert draw(render_brief(plan), width) == _rich(width, render_brief(plan)), (model_id, values, width)
    assert tried and drawn >= tried * (len(WIDTHS) - 1)  # what is left to rich is the exception


_TEXT = st.text(alphabet="ab █·-\n", max_size=120)


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, width=st.integers(min_value=1, max_value=30))
def test_wrap_and_fold_are_riches(text, width):
    assert draw(Text(text), width) == _rich(width, Text(text))


@settings(max_examples=200, deadline=None)
@given(cells=st.lists(st.tuples(st.text(alphabet="ab -", max_size=12), st.text(alphabet="0123456789. ", max_size=8),
                                _TEXT), min_size=1, max_size=4),
       width=st.integers(min_value=12, max_value=70), title=st.text(alphabet="abc ()", min_size=1, max_size=12))
def test_a_panel_of_a_grid_and_text_is_riches(cells, width, title):
    """The memory panel's layout: a grid (no_wrap, right-justified no_wrap, folding) and a text below it."""
    grid = Grid(padding=2)
    grid.add_column(no_wrap=True)
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(style="grey62", overflow="fold", ratio=1)
    for a, b, c in cells:
        grid.add_row(a, Text(b, style="bold"), Text(c))
    panel = Panel(Group(grid, Text.assemble(("x" * 30, "green"), "\n  ■ legend")), title)
    try:
        got = draw(panel, width)
    except Unsupported:
        return  # a layout rich squeezes past the wrapping column, or a title wider than the panel
    assert got == _rich(width, panel)


def test_text_builds_riches_spans():
    """The same spans rich's Text builds (so a colour console prints the same bytes as before)."""
    from rich.text import Text as RichText

    ours = Text.assemble(("at 8 ", "bold"), ("54", "bold cyan"), " x")
    ours.append(Text("tail  ", style="grey62"))
    ours.rstrip()
    theirs = RichText.assemble(("at 8 ", "bold"), ("54", "bold cyan"), " x")
    theirs.append(RichText("tail  ", style="grey62"))
    theirs.rstrip()
    joined, rich_joined = Text("\n").join([ours, Text("b", style="red")]), RichText("\n").join(
        [theirs, RichText("b", style="red")])
    assert ours.__rich__() == theirs and list(ours.__rich__().spans) == list(theirs.spans)
    assert joined.__rich__() == rich_joined and joined.plain == rich_joined.plain


@pytest.mark.parametrize("env", [{}, {"FORCE_COLOR": "1"}, {"FORCE_COLOR": ""}, {"TTY_COMPATIBLE": "1"},
                                 {"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}, {"COLUMNS": "133"},
                                 {"COLUMNS": "20"}, {"COLUMNS": "x"}, {"COLUMNS": "0"}])
@pytest.mark.parametrize("tty", [False, True])
def test_plain_width_is_riches_reading_of_the_environment(monkeypatch, env, tty):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS", "LINES", "NO_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    class Out(io.StringIO):
        encoding = "utf-8"

        def isatty(self) -> bool:
            return tty

    monkeypatch.setattr("sys.stdout", Out())
    console = Console(highlight=False, soft_wrap=False, emoji=False)
    plain = console.color_system is None and not console.is_terminal
    expected = console.size.width if plain and console.size.width >= styled.MIN_WIDTH else None
    assert plain_width() == expected


def test_what_is_not_drawn_here_is_printed_by_rich(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "60")
    for item in ("[grey62]source: models/[v2]/config.json[/]", Text("中文 model"), Text("a\tb"),
                 Panel(Text("body"), "[bold]title[/]")):
        with pytest.raises(Unsupported):
            draw(item, 60)
        show(item)
        assert capsys.readouterr().out == _rich(60, item)
    assert source_line("models/[v2]") == "[grey62]source: models/[v2][/]"  # markup, as it always was


def test_show_draws_where_rich_writes_plain_text(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "72")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    plan = plan_for_spec(_spec("meta-llama/Llama-3.1-8B"), Options(model="meta-llama/Llama-3.1-8B", gpu="H100"))
    items = (source_line(plan.source), render_plan(plan))
    show(*items)
    assert capsys.readouterr().out == _rich(72, *items)
    monkeypatch.setenv("FORCE_COLOR", "1")  # colour: rich prints it, as before
    show(*items)
    assert "\x1b[" in capsys.readouterr().out
