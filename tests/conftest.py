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

try:  # run as a package (python -m pytest from the repo root) or with tests/ on sys.path
    from tests.entry_point import build_each_app_once
    from tests.hub_emulator import HubEmulator, point_huggingface_hub_at
except ImportError:  # pragma: no cover - depends on how pytest was started
    from entry_point import build_each_app_once  # type: ignore[no-redef]
    from hub_emulator import HubEmulator, point_huggingface_hub_at  # type: ignore[no-redef]

build_each_app_once()


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


# Test files whose tests run longest (a launch of torchrun, fresh interpreters, the fuzzers, regenerated docs, a
# rich oracle over every bundled model), longest single test first: run before the rest so that on the README's
# two workers (-n 2, xdist hands out tests in collection order) the many short tests fill in at the end and the
# workers finish together, not one worker alone on a long test after the other has run dry. Whole files move, in
# their own order (a module fixture is made once). The order only: every test still runs.
LONG_FIRST = (
    "tests/paged/test_distributed.py", "tests/project/test_packaging.py", "tests/e2e/test_fuzz.py",
    "tests/docs/test_docs.py", "tests/checks/test_report.py", "tests/paged/test_allocator.py",
    "tests/model/test_transformers_oracle.py", "tests/docs/test_doc_examples.py", "tests/model/test_spec.py",
    "tests/render/test_estimate.py", "tests/sim/test_figures_agree.py", "tests/project/test_benchmarks.py",
    "tests/sim/test_simulate.py", "tests/test_api.py", "tests/paged/test_validate.py", "tests/cli/test_app.py",
    "tests/planning/test_sections_agree.py", "tests/render/test_styled.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """:data:`LONG_FIRST`'s files first, in that order; the rest as collected (the same order on every worker)."""
    rank = {path: i for i, path in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(LONG_FIRST)))
