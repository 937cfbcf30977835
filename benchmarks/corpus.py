"""The corpus of real start-up logs (benchmarks/corpus/): loading entries and their calibration/validation split.

Each entry is ``benchmarks/corpus/<engine>/<id>.yaml`` (what the log and its source say, in the format of
benchmarks/corpus/README.md) beside ``<id>.log`` (the log lines as the source shows them). The split is a
function of the source, never a choice: every start from one thread or file lands in the same part, and the
validation part is never used to fit a constant.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

CORPUS = Path(__file__).resolve().parent / "corpus"
SPLITS = ("calibration", "validation")
_GITHUB = re.compile(r"github\.com/([^/]+/[^/]+)/(issues|pull|discussions)/(\d+)")
_FILE_ID = re.compile(r"^code index file id (\d+)")


def source_key(source: str) -> str:
    """The thread or file a source address belongs to (comment anchors, query strings and paths below it dropped)."""
    text = str(source).strip()
    if m := _GITHUB.search(text):
        return f"github:{m[1].lower()}/{m[2]}/{m[3]}"
    if m := _FILE_ID.match(text):
        return f"file:{m[1]}"
    return re.split(r"[#?]", text, maxsplit=1)[0].rstrip("/").lower()


def split_of(entry: dict[str, Any]) -> str:
    """``calibration`` or ``validation``: half the sources each, by a hash of :func:`source_key`.

    Entries of the earlier evidence file (``origin: engine_reports.yaml ...``) were fitted before the split
    existed and state ``split: calibration``.
    """
    if entry.get("split"):
        return str(entry["split"])
    digest = hashlib.sha256(source_key(entry["source"]).encode()).digest()
    return SPLITS[digest[0] % 2]


@dataclass(frozen=True)
class Entry:
    """One engine start: its metadata (the YAML as a mapping), its log text, and where both are."""

    meta: dict[str, Any]
    log: str
    path: Path

    @property
    def id(self) -> str:
        return str(self.meta["id"])

    @property
    def split(self) -> str:
        return split_of(self.meta)


def entries(engine: str | None = None) -> Iterator[Entry]:
    """Every corpus entry (optionally of one engine), in id order."""
    for path in sorted(CORPUS.glob("*/*.yaml")):
        meta = yaml.safe_load(path.read_text(encoding="utf-8"))
        if engine and meta.get("engine") != engine:
            continue
        yield Entry(meta, path.with_suffix(".log").read_text(encoding="utf-8"), path)
