"""What kind of file a path holds: kvplan's own YAML kinds (capacity, what-if, workload, calibration, timing)
and the formats kvplan writes (JUnit XML, HTML, JSON, CSV, Markdown, images).

Two uses, one table:

- a command given another command's file says what the file is and which command reads it
  (:func:`other_kind`: ``kvplan simulate capacity.yaml`` -> "this is a capacity file: kvplan check
  reads it"), instead of listing the keys its own schema allows;
- a command about to write a file the user named refuses one that holds something else
  (:func:`check_replaceable`: ``--junit-xml capacity.yaml``, ``--calibrate cap.yaml``, a report output over
  a what-if file), so a typo never destroys a file. A file of the kind being written (kvplan's own earlier
  output), an empty file and a missing one may be replaced.

Each YAML kind is told by keys only it has, one of which its schema requires (a capacity file's ``checks``,
a what-if file's ``sweep`` / ``scenarios``, a workload's traffic, a calibration file's ``calibrations``,
a timing file's ``kvplan_timing``), so a file of one kind is never taken for another.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvplan.errors import InputError
from kvplan.frozen import frozen

SNIFF_BYTES = 1 << 20  # how much of an existing file is read to tell its kind


@frozen
class YamlKind:
    """One of kvplan's YAML file kinds: its name, the command that reads it, and the top-level keys only it has."""

    name: str
    reader: str
    markers: frozenset[str]


CAPACITY = YamlKind("capacity file", "kvplan check", frozenset({"checks"}))
WHATIF = YamlKind("what-if file", "kvplan report", frozenset({"sweep", "scenarios", "zip", "outputs", "plots"}))
WORKLOAD = YamlKind("workload file", "kvplan simulate", frozenset(
    {"arrivals", "prompt_tokens", "output_tokens", "prefixes", "trace", "policies", "duration_s", "num_requests"}))
CALIBRATION = YamlKind("calibration file", "the --calibration option", frozenset({"calibrations"}))
TIMING = YamlKind("timing file", "kvplan simulate --timing", frozenset({"kvplan_timing"}))
YAML_KINDS = (CAPACITY, WHATIF, WORKLOAD, CALIBRATION, TIMING)


def yaml_kind(data: Any) -> YamlKind | None:
    """The kvplan kind whose keys ``data`` (a parsed YAML document) has most of, or ``None``."""
    if not isinstance(data, dict):
        return None
    keys = {k for k in data if isinstance(k, str)}
    best = max(YAML_KINDS, key=lambda k: len(k.markers & keys))
    return best if best.markers & keys else None


def other_kind(data: Any, expected: YamlKind) -> tuple[str, str] | None:
    """When ``data`` is another kvplan file kind and not ``expected``: the message and hint that say what the
    file is and which command reads it (:func:`kvplan.io.yamldoc.expect_kind` raises them, located)."""
    if not isinstance(data, dict) or expected.markers & {k for k in data if isinstance(k, str)}:
        return None
    kind = yaml_kind(data)
    if kind is None or kind == expected:
        return None
    return (f"this is a {kind.name}, which {kind.reader} reads, not a {expected.name}",
            f"{expected.reader} reads a {expected.name}")


# ---------------------------------------------------------------------------------------------
# formats kvplan writes

FORMATS = {  # what check_replaceable's ``writes`` may be -> the sniffed kind that may be replaced
    "junit": "JUnit XML", "html": "an HTML page", "json": "JSON", "csv": "CSV", "markdown": "Markdown",
    "png": "a PNG image", "svg": "an SVG image", "pdf": "a PDF document",
    "timing": TIMING.name,
}
SUFFIX_FORMATS = {".xml": "junit", ".html": "html", ".htm": "html", ".json": "json", ".csv": "csv", ".md": "markdown",
                  ".png": "png", ".svg": "svg", ".pdf": "pdf"}


def sniff(head: bytes, whole: bool = True) -> str:
    """What the first bytes of a file are, in words ("" for an empty file); ``whole``: ``head`` is the whole
    file (a cut JSON document still counts as JSON)."""
    if not head.strip():
        return ""
    if head.startswith(b"\x89PNG"):
        return "a PNG image"
    if head.startswith(b"%PDF"):
        return "a PDF document"
    if b"\0" in head:
        return "binary data"
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff").strip()
    low = text[:4096].lower()
    if text.startswith("<"):
        if "<svg" in low:
            return "an SVG image"
        if "<html" in low or low.startswith("<!doctype html"):
            return "an HTML page"
        if "<testsuite" in low:
            return "JUnit XML"
        return "an XML document"
    if text[0] in "{[":
        try:
            json.loads(text)
            return "JSON"
        except ValueError:
            if not whole:
                return "JSON"
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict):
        kind = yaml_kind(data)
        return kind.name if kind else "a YAML mapping (" + ", ".join(map(str, list(data)[:4])) + ")"
    first = text.splitlines()[0]
    if first.startswith("#"):
        return "Markdown"
    fields = first.split(",")
    if len(fields) > 1 and all(f and f == f.strip() for f in fields):  # a header row: name,model,gpu,...
        return "CSV"
    return "text"


def check_replaceable(path: str | Path, what: str, writes: str) -> None:
    """Raise :class:`InputError` when ``path`` exists and holds something other than ``writes`` (a key of
    :data:`FORMATS`): an existing file of another kind is never replaced. An unreadable file is refused too; a missing or empty file passes (:func:`kvplan.io.atomic.check_writable` calls this, and
    checks the folder)."""
    path = Path(path)
    if not path.exists() or path.is_dir():
        return
    try:
        with path.open("rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError as exc:
        raise InputError(f"cannot write {what} {path}: it exists and cannot be read ({exc.strerror or exc}), "
                         "so it is not replaced", "give another file name") from None
    kind = sniff(head, whole=len(head) < SNIFF_BYTES)
    if kind and kind != FORMATS[writes]:
        raise InputError(f"not writing {what} {path}: it holds {_article(kind)}, not {_article(FORMATS[writes])}",
                         "give another file name, or remove the file first")


def _article(kind: str) -> str:
    return f"a {kind}" if kind.endswith(" file") else kind


__all__ = ["YamlKind", "YAML_KINDS", "yaml_kind", "other_kind", "check_replaceable", "sniff", "SUFFIX_FORMATS"]
