"""Shared pytest fixtures.

Hub emulator fixtures: ``hub`` starts a local Hugging Face Hub emulator (tests/hub_emulator.py) and points
huggingface_hub at it with a private HF_HOME under the test's tmp_path; everything is restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
