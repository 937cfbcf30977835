"""How the CLI reports errors: a :class:`~kvplan.errors.KvplanError` becomes one line on stderr
(``kvplan: error: ...``) and its exit code (2: bad input); ``KVPLAN_DEBUG=1`` shows the traceback.

Shared by :mod:`kvplan.cli.app` and the commands in ``kvplan/cli/commands/`` (which import this module, never
:mod:`kvplan.cli.app`, so the CLI and its commands form no import cycle).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, TypeVar

import typer

from kvplan.errors import KvplanError

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 2) -> "typer.Exit":
    """Print ``kvplan: error: message`` on stderr and return the Exit to raise."""
    sys.stderr.write(f"kvplan: error: {message}\n")
    return typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn kvplan errors into one line on stderr + exit code; KVPLAN_DEBUG=1 re-raises."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KvplanError as exc:
            if os.environ.get("KVPLAN_DEBUG"):
                raise
            lines = [" ".join(line.splitlines()) for line in exc.lines()]  # a value with a newline stays on its line
            for line in lines[:-1]:  # a file with several mistakes: one line each
                sys.stderr.write(f"kvplan: error: {line}\n")
            raise fail(lines[-1], exc.exit_code) from None
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None

    return wrapper  # type: ignore[return-value]
