"""How the CLI reports errors: a :class:`~kvplan.errors.KvplanError` becomes one line on stderr
(``kvplan: error: ...``) and its exit code (2: bad input); ``KVPLAN_DEBUG=1`` shows the traceback.

Shared by :mod:`kvplan.cli.app` and the commands in ``kvplan/cli/commands/`` (which import this module, never
:mod:`kvplan.cli.app`, so the CLI and its commands form no import cycle).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from kvplan.errors import KvplanError

if TYPE_CHECKING:  # pragma: no cover
    import typer

F = TypeVar("F", bound=Callable[..., Any])


def _typer_exit(code: int) -> "typer.Exit":
    import typer  # imported when a command fails: the plain estimate path runs without typer

    return typer.Exit(code)


def fail(message: str, code: int = 2) -> "typer.Exit":
    """Print ``kvplan: error: message`` on stderr and return the Exit to raise."""
    sys.stderr.write(f"kvplan: error: {message}\n")
    return _typer_exit(code)


def handle_errors(fn: F, exit_with: Callable[[int], BaseException] = _typer_exit) -> F:
    """Turn kvplan errors into one line on stderr + exit code; KVPLAN_DEBUG=1 re-raises.

    ``exit_with(code)`` is the exception raised with the code: typer's Exit inside a typer command (the
    default), :class:`SystemExit` where no typer runs (:func:`kvplan.cli.entry.main`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KvplanError as exc:
            if os.environ.get("KVPLAN_DEBUG"):
                raise
            lines = [" ".join(line.splitlines()) for line in exc.lines()]  # a value with a newline stays on its line
            for line in lines:  # a file with several mistakes: one line each
                sys.stderr.write(f"kvplan: error: {line}\n")
            raise exit_with(exc.exit_code) from None
        except KeyboardInterrupt:
            sys.stderr.write("kvplan: error: interrupted\n")
            raise exit_with(130) from None

    return wrapper  # type: ignore[return-value]
