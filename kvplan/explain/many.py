"""Many start-up logs at once (``kvplan explain logs/*.log`` or a folder): each explained on its own, one result
per log, a bad log a row with its one-line error rather than the end of the run.

The caller reads the files (the CLI: :func:`kvplan.io.files.read_bytes`); this module only explains texts.
"""

from __future__ import annotations

from typing import Any, Iterable

from kvplan.errors import KvplanError
from kvplan.explain.account import Explanation
from kvplan.explain.reconcile import explain
from kvplan.frozen import frozen


@frozen
class LogResult:
    """One log of many: its name, its explanation, or the one-line error that it is not a log kvplan reads."""

    name: str
    explanation: Explanation | None
    error: str | None = None


def explain_many(logs: Iterable[tuple[str, str]], overrides: dict[str, Any] | None = None,
                 token: str | None = None) -> tuple[LogResult, ...]:
    """``explain`` each ``(name, text)``; a log that is bad input (no KV lines, garbled numbers) becomes a result with
    its error. The user's own mistakes (an unknown ``--gpu``) still raise: they would fail every log."""
    from kvplan.planning.plan import options_from_values

    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    options_from_values({"model": "-", **given})
    if given.get("gpu"):
        from kvplan.gpus import find_gpu

        find_gpu(given["gpu"])
    out = []
    for name, text in logs:
        try:
            out.append(LogResult(name, explain(text, overrides, token=token)))
        except KvplanError as exc:
            out.append(LogResult(name, None, exc.one_line()))
    return tuple(out)


__all__ = ["LogResult", "explain_many"]
