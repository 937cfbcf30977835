"""Shared pytest fixtures.

Hub emulator fixtures: ``hub`` starts a local Hugging Face Hub emulator (tests/hub_emulator.py) and points
huggingface_hub at it with a private HF_HOME under the test's tmp_path; everything is restored afterwards.

Bytecode: with ``PYTHONDONTWRITEBYTECODE`` set (CI and the dev machine set it) no ``.pyc`` is ever written, so every
interpreter the suite starts (each xdist worker, each of the ~80 spawned commands, each forked import) compiled
kvplan again, and each worker rewrote every test module's asserts again. The suite writes bytecode as Python does
by default (``__pycache__/`` folders beside the sources, which git ignores), for its own interpreters and the ones
they spawn. Not a ``PYTHONPYCACHEPREFIX``: a prefix hides the ``.pyc`` files installed beside site-packages, so the
first interpreter to import torch under it compiles torch again (a clean run measured slower with one).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def _write_bytecode() -> None:
    """Let this interpreter and every process it starts cache bytecode (see the module docstring)."""
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


_write_bytecode()


def _one_torch_thread() -> None:
    """torch's CPU ops in one thread (``OMP_NUM_THREADS=1``, unless set), here and in every process started from
    here: the suite runs one worker per core (``-n 2`` on two), and each worker's ops in as many threads as cores
    made them spin against each other (tests/paged: 19 - 23 s of CPU with a thread per core, 12 - 15 s with one).
    The tests' tensors are small; a count of threads changes no figure they check. Read when torch is imported,
    which no plugin does before this file."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")


_one_torch_thread()


def _build_each_app_once() -> None:
    """typer's ``CliRunner.invoke(app, ...)`` turns the Typer app into its click command on every call (~20 ms of
    CPU for kvplan's full app: every command's parameters from its signature), ~1,000 times a suite. The command is
    a pure function of the app, and no test changes an app after building it, so each app's command is built once
    (an app is held here, so its ``id`` names no other)."""
    import typer.testing

    if not callable(getattr(typer.testing, "_get_command", None)):  # pragma: no cover - another typer: build each time
        return
    build, built = typer.testing._get_command, {}

    def command(app: object) -> object:
        hit = built.get(id(app))
        if hit is None:
            hit = built[id(app)] = (app, build(app))
        return hit[1]

    typer.testing._get_command = command
    _build_each_entry_point_app_once(build, built)


def _build_each_entry_point_app_once(build: object, built: dict) -> None:
    """The entry point (``kvplan.cli.app.main``: tests/entry_point.py's ``kvplan(...)``, the typer side of
    tests/cli/test_app.py) builds the app of the command it runs and turns it into a click command, 2 - 5 ms a
    call, ~1,000 calls a suite. Each app is a pure function of the command's name (``build_app(only)``), so it
    is built once a name, and its click command once (with the apps above). What a command runs is looked up
    when it runs (``kvplan.cli.estimate.estimate_command``, which tests/cli/test_app.py replaces), not built in."""
    import functools

    import typer.main

    from kvplan.cli import app as cli_app

    def command(app: object) -> object:
        hit = built.get(id(app))
        if hit is None:
            hit = built[id(app)] = (app, build(app))
        return hit[1]

    cli_app.build_app = functools.lru_cache(maxsize=None)(cli_app.build_app)
    typer.main.get_command = command


_build_each_app_once()

try:  # run as a package (python -m pytest from the repo root) or with tests/ on sys.path
    from tests.hub_emulator import HubEmulator, point_huggingface_hub_at
except ImportError:  # pragma: no cover - depends on how pytest was started
    from hub_emulator import HubEmulator, point_huggingface_hub_at  # type: ignore[no-redef]


@pytest.fixture
def hf_home(tmp_path: Path) -> Path:
    """An empty HF_HOME for one test (the Hub cache is ``hf_home / "hub"``)."""
    home = tmp_path / "hf-home"
    home.mkdir()
    return home


@pytest.fixture
def hub(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubEmulator]:
    """A running Hub emulator with no repos; huggingface_hub points at it (HF_ENDPOINT, HF_HOME)."""
    emulator = HubEmulator().start()
    point_huggingface_hub_at(monkeypatch, emulator.url, str(hf_home))
    try:
        yield emulator
    finally:
        emulator.stop()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection built (every test module, item and parameter, torch and the rest imported) is in the
    workers' heap for the whole session: frozen out of the collector (``gc.freeze``), so a full collection walks
    only what the tests make. kvplan's validate collects twice per run to measure the memory a pool frees
    (kvplan.paged.validate), ~0.12 s each over a worker's heap against a few ms over a command's; pytest collects
    at the end of the session too. Nothing frozen is garbage: a collection first."""
    import gc

    gc.collect()
    gc.freeze()
