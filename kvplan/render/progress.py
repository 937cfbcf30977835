"""A progress bar for long work: on stderr, only on a terminal, and only once the work has taken a second.

Used by ``report`` (rows) and ``simulate`` (request-steps): short runs print nothing extra, long ones show
how far they got, and output meant for pipes (``--json``, CSV) is never touched (the bar is on stderr).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

SHOW_AFTER_S = 1.0  # seconds of work before the bar appears


@contextmanager
def delayed_progress(label: str, *, show_after_s: float = SHOW_AFTER_S, stderr_console: object = None,
                     ) -> Iterator[Callable[[float, float], None]]:
    """Yield ``update(done, total)``; a rich bar labelled ``label`` appears once ``show_after_s`` passed."""
    from kvplan.render import console

    out = stderr_console or console(stderr=True)
    start = time.monotonic()
    state: dict[str, object] = {}

    def update(done: float, total: float) -> None:
        if not getattr(out, "is_terminal", False):
            return
        bar = state.get("bar")
        if bar is None:
            if time.monotonic() - start < show_after_s:
                return
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

            bar = state["bar"] = Progress(TextColumn(label), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                                          console=out, transient=True)
            bar.start()  # type: ignore[attr-defined]
            state["task"] = bar.add_task(label, total=total or None)  # type: ignore[attr-defined]
        bar.update(state["task"], completed=done, total=total or None)  # type: ignore[attr-defined]

    try:
        yield update
    finally:
        bar = state.get("bar")
        if bar is not None:
            bar.stop()  # type: ignore[attr-defined]
