"""The corpus of real start-up logs (benchmarks/corpus/): loading entries and their calibration/validation split.

Each entry is ``benchmarks/corpus/<engine>/<id>.yaml`` (what the log and its source say, in the format of
benchmarks/corpus/README.md) beside ``<id>.log`` (the log lines as the source shows them). The split is a
function of the source, never a choice: every start from one thread or file lands in the same part, and the
validation part is never used to fit a constant.
"""

from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
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

    Entries of the earlier evidence file (``origin: engine_reports.yaml ...``, retired since: the corpus holds its
    starts) were fitted before the split existed and state ``split: calibration``.
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
    for path, meta, log in _read():
        if engine and meta.get("engine") != engine:
            continue
        yield Entry(copy.deepcopy(meta), log, path)


def read_meta(path: Path) -> Any:
    """An entry's ``<id>.yaml`` as loaded (safe-loaded, read once per process; a copy each call)."""
    return copy.deepcopy(_load_yaml(Path(path).resolve()))


@lru_cache(maxsize=None)
def _load_yaml(path: Path) -> Any:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's safe loader where PyYAML has it: 8x faster
    return yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 - a safe loader


@lru_cache(maxsize=None)
def _read() -> tuple[tuple[Path, dict[str, Any], str], ...]:
    """Every entry's path, metadata and log, read once per process (the tests read the corpus in several files)."""
    return tuple((path, _load_yaml(path.resolve()), path.with_suffix(".log").read_text(encoding="utf-8"))
                 for path in sorted(CORPUS.glob("*/*.yaml")))


def from_earlier_file(meta: dict[str, Any]) -> bool:
    """Whether the entry came from the earlier evidence file (``origin: engine_reports.yaml ...``, retired: the
    corpus holds its 61 starts, their logs byte for byte): the starts tests/explain/test_reconcile.py reproduces term by term."""
    return str(meta.get("origin") or "").startswith("engine_reports.yaml")


def planned_as(meta: dict[str, Any]) -> dict[str, Any]:
    """How the curated ``kvplan:`` block plans this start, as kvplan option values (the names of
    ``kvplan.planning.plan.options_from_values``): ``model`` (the bundled stand-in), ``engine_version`` (the
    block's, else the logged one), ``usage_context`` and the block's further ``options``. What the block leaves
    open is absent. benchmarks/corpus_agreement.py plans with these; the explain tests pass them as flags."""
    block = meta.get("kvplan") or {}
    out: dict[str, Any] = {}
    if block.get("model"):
        out["model"] = str(block["model"])
    version = block.get("engine_version") or meta.get("engine_version")
    if version:
        out["engine_version"] = str(version)
    if block.get("usage_context"):
        out["usage_context"] = block["usage_context"]
    out.update(block.get("options") or {})
    return out


def explain_flags(meta: dict[str, Any], log: Any) -> dict[str, Any]:
    """What a user would pass ``kvplan explain`` for this start besides the GPU (``log``: its
    ``kvplan.explain.logparse.parse_log``): :func:`planned_as`'s values, the release only where the log prints
    none and is not a V0 log (whose own rules the parser picks), and the tp / pp / max_model_len / KV cache dtype
    the entry states (its source's command or thread) where the log does not."""
    out = planned_as(meta)
    if log.version or log.mode == "V0":
        out.pop("engine_version", None)
    flags = meta.get("flags") or {}
    kv_dtype = flags.get("kv_cache_dtype")
    stated = {"tp": ("tp", meta.get("tp")), "pp": ("pp", meta.get("pp")),
              "max_model_len": ("max_model_len", flags.get("max_model_len")),
              "kv_cache_dtype": ("kv_dtype", None if str(kv_dtype) in ("auto", "None") else kv_dtype)}
    for field, (option, value) in stated.items():
        if value and getattr(log, field) is None and option not in out:
            out[option] = value
    return out
