"""The CLI's entry point as a user runs it, for tests of whole commands.

``kvplan(ARGS)`` runs ``kvplan.cli.app.main(ARGS)`` (the function ``python -m kvplan`` and the ``kvplan`` script
call, not typer's test runner) in this interpreter, as a fresh process would see it: its own stdout and stderr
(not terminals), ``COLUMNS=80``, the given environment and working folder; what it returns is what
``subprocess.run`` would: the exit code, stdout and stderr, and for an uncaught exception exit 1 with the
traceback on stderr, as Python prints it. A spawn costs ~0.5 s of CPU (importing kvplan, typer and rich) and adds
nothing to most tests; ``kvplan_process(ARGS)`` spawns ``python -m kvplan ARGS`` for the few that check the process
itself. ``script(PATH, ARGS)`` runs a script of the repository (benchmarks/) the same way, in this interpreter.
``assert_one_line`` checks the promise for bad input: exit 2, one line on stderr (``kvplan: error: ...``), never a
traceback. ``build_each_app_once`` caches the apps and click commands a suite's ~2,000 command runs rebuild
(tests/conftest.py and tests/fuzz_worker.py call it).
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_each_app_once() -> None:
    """Build each Typer app's click command once, and each of the entry point's apps once.

    typer's ``CliRunner.invoke(app, ...)`` turns the Typer app into its click command on every call (~20 ms of
    CPU for kvplan's full app: every command's parameters from its signature), and the entry point
    (``kvplan.cli.app.main``: ``kvplan(...)`` here, the typer side of tests/cli/test_app.py, the fuzzer's inputs)
    builds the app of the command it runs and turns that into a click command (2 - 5 ms a call): ~1,000 calls of
    each a suite. A command is a pure function of its app, and an app of its command's name (``build_app(only)``);
    no test changes an app after building it, so each is built once (an app is held here, so its ``id`` names no
    other). What a command runs is looked up when it runs (``kvplan.cli.estimate.estimate_command``, which
    tests/cli/test_app.py replaces), not built in."""
    import functools

    import typer.main
    import typer.testing

    from kvplan.cli import app as cli_app

    if not callable(getattr(typer.testing, "_get_command", None)):  # pragma: no cover - another typer: build each time
        return
    build, built = typer.testing._get_command, {}

    def command(app: object) -> object:
        hit = built.get(id(app))
        if hit is None:
            hit = built[id(app)] = (app, build(app))
        return hit[1]

    typer.testing._get_command = typer.main.get_command = command
    cli_app.build_app = functools.lru_cache(maxsize=None)(cli_app.build_app)


def kvplan_process(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """``python -m kvplan ARGS`` in a fresh interpreter, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "kvplan", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=kwargs.pop("cwd", ROOT), env={**os.environ, "COLUMNS": "80", **kwargs.pop("env", {})},
                          **kwargs)


class _Stream(io.TextIOWrapper):
    """A captured stdout / stderr with a ``buffer`` for bytes, never a terminal."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors="replace", newline="", write_through=True)

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        self.flush()
        return self.buffer.getvalue().decode("utf-8", errors="replace")  # type: ignore[attr-defined]


@contextlib.contextmanager
def _environment(env: dict[str, str], cwd: str | Path):
    saved, here = dict(os.environ), os.getcwd()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(saved)


def kvplan(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """``kvplan ARGS`` through the real entry point in this interpreter (see the module docstring).

    ``timeout`` is accepted for the callers of ``kvplan_process``; a hang fails the suite's own timeout instead.
    """
    from kvplan.cli.app import main

    if kwargs.keys() - {"cwd", "env"}:  # stdin and the like: a process of its own
        return kvplan_process(*args, timeout=timeout, **kwargs)
    out, err = _Stream(), _Stream()
    env = {"COLUMNS": "80", **kwargs.get("env", {})}
    code: int = 0
    with _environment(env, kwargs.get("cwd", ROOT)), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(["kvplan", *args], code, out.text(), err.text())


def script(path: str | Path, *args: str, cwd: str | Path = ROOT) -> subprocess.CompletedProcess:
    """``python PATH ARGS`` (a benchmark or docs script) run as ``__main__`` in this interpreter: what it returns is
    what ``subprocess.run`` would (its exit code, stdout and stderr; an uncaught exception is exit 1 with the
    traceback). The script's changes to ``sys.argv`` and ``sys.path`` are undone."""
    out, err = _Stream(), _Stream()
    argv, path_, code = sys.argv[:], sys.path[:], 0
    sys.argv = [str(path), *map(str, args)]
    with _environment({}, cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
        finally:
            sys.argv, sys.path[:] = argv, path_
    return subprocess.CompletedProcess([sys.executable, str(path), *args], code, out.text(), err.text())


def assert_one_line(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvplan: error: "), r.stderr
    assert "Traceback" not in r.stderr and "╭" not in r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
