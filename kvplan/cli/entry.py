"""The ``kvplan`` console entry point (and ``python -m kvplan``): a plain ``kvplan estimate`` command line
(:func:`kvplan.cli.flags.plain_estimate`) runs the estimate command without importing typer; every other
command line goes to the typer app (:func:`kvplan.cli.app.main`), which reads it whole.

Both paths run the one body of the command (:func:`kvplan.cli.estimate.estimate_command`) with the same
keyword arguments, so they print the same bytes and exit with the same codes.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from typing import Any

_AT_EXIT: list[Any] = []  # what main registered with atexit


def main(args: list[str] | None = None) -> None:
    """Console-script entry point: exits 0, 2 for bad input (one line on stderr), or typer's codes.

    A plain estimate runs with the cyclic garbage collector paused: it is one short run (a plan and its
    output) whose imports build ~40 dataclasses, and the collector's passes over the growing heap while they
    are built were ~10% of its time; it frees nothing such a run needs freed. At exit the heap is frozen
    (:func:`gc.freeze`, registered with :mod:`atexit`), so the interpreter's last collections skip it: another
    ~8%. Exit handlers, flushing and module teardown run as ever. Any other command collects as usual.
    """
    if args is None:
        args = sys.argv[1:]
    collecting = gc.isenabled()
    gc.disable()
    try:
        from kvplan.cli.flags import plain_estimate

        kwargs = plain_estimate(args)
        if kwargs is None:
            if collecting:
                gc.enable()
            from kvplan.cli.app import main as typer_main

            typer_main(args)
            return
        from kvplan.cli.errors import handle_errors

        if gc.freeze not in _AT_EXIT:  # once per process (tests call main many times)
            _AT_EXIT.append(gc.freeze)
            atexit.register(gc.freeze)
        try:
            handle_errors(_estimate, exit_with=SystemExit)(kwargs)
        except BrokenPipeError:  # the reader left (`| head`): quiet, exit 1, as typer's (click's) main does
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
    finally:
        if collecting:
            gc.enable()
    sys.exit(0)


def _estimate(kwargs: dict[str, Any]) -> None:
    """The estimate command for typer's keyword arguments, as the typer command runs it."""
    from kvplan.cli.estimate import estimate_command
    from kvplan.cli.flags import split_values

    values, token = split_values(kwargs)  # two spellings of one option that disagree: an InputError
    estimate_command(values=values, token=token, **kwargs)
