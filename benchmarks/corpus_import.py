"""Bring collected start-up logs into the corpus (benchmarks/corpus/), one ``.log`` + ``.yaml`` pair per start.

The collection format is benchmarks/corpus/README.md's. This script only adds: an entry already in the corpus
is left as it is (its curated ``kvplan:`` block included), so it can be run again as more logs are collected.
The split is not chosen here: ``corpus.split_of`` derives it from the entry's source.

    python3 benchmarks/corpus_import.py DIR [DIR ...]     # folders of <id>.yaml + <id>.log

The earlier evidence file (benchmarks/engine_reports.yaml) came in once this way (``origin: engine_reports.yaml
(fitted before the split)``, all calibration); it is retired, the corpus holds its starts.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _dump(entry: dict, path: Path) -> None:
    path.write_text(yaml.safe_dump(entry, sort_keys=False, allow_unicode=True, width=110), encoding="utf-8")


def add(entry: dict, log: str, origin: str) -> str:
    """Add one entry; returns what happened (``added``, ``kept`` or a reason it was refused)."""
    eid = str(entry.get("id", ""))
    if not ID.match(eid):
        return f"refused: id {eid!r}"
    engine = entry.get("engine")
    if engine not in ("vllm", "sglang"):
        return f"refused: engine {engine!r}"
    folder = CORPUS / engine
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / f"{eid}.yaml").exists():
        return "kept"
    log = ANSI.sub("", log).rstrip() + "\n"
    if not log.strip():
        return "refused: empty log"
    entry = {**entry, "origin": origin}
    (folder / f"{eid}.log").write_text(log, encoding="utf-8")
    _dump(entry, folder / f"{eid}.yaml")
    return "added"


def from_folder(folder: Path) -> list[tuple[str, str]]:
    out = []
    for path in sorted(folder.glob("*.yaml")):
        entry = yaml.safe_load(path.read_text(encoding="utf-8"))
        log_path = path.with_suffix(".log")
        if not isinstance(entry, dict) or not log_path.exists():
            out.append((path.name, "refused: no .log beside it or not a mapping"))
            continue
        out.append((path.stem, add(entry, log_path.read_text(encoding="utf-8", errors="replace"),
                                   f"collected ({folder.name})")))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path)
    args = parser.parse_args(argv)
    results: list[tuple[str, str]] = []
    for folder in args.folders:
        results += from_folder(folder)
    for eid, what in results:
        if what != "added":
            print(f"{eid}: {what}")
    print(f"{sum(1 for _, w in results if w == 'added')} added, {sum(1 for _, w in results if w == 'kept')} kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
