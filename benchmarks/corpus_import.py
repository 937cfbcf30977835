"""Bring collected start-up logs into the corpus (benchmarks/corpus/), one ``.log`` + ``.yaml`` pair per start.

The collection format is benchmarks/corpus/README.md's. This script only adds: an entry already in the corpus
is left as it is (its curated ``kvplan:`` block included), so it can be run again as more logs are collected.
The split is not chosen here: ``corpus.split_of`` derives it from the entry's source.

    python3 benchmarks/corpus_import.py DIR [DIR ...]     # folders of <id>.yaml + <id>.log
    python3 benchmarks/corpus_import.py --engine-reports   # the earlier evidence file (all calibration)
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


_FLAG_KEYS = ("gpu_memory_utilization", "mem_fraction_static", "dtype", "kv_cache_dtype", "quantization",
              "max_model_len", "max_num_seqs", "max_num_batched_tokens", "enforce_eager", "block_size",
              "chunked_prefill_size")


def from_engine_reports() -> list[tuple[str, str]]:
    """The earlier evidence file: fitted before the split existed, so every entry is calibration."""
    reports = yaml.safe_load((HERE / "engine_reports.yaml").read_text(encoding="utf-8"))
    out = []
    for r in reports:
        flags = {k: r[k] for k in _FLAG_KEYS if r.get(k) not in (None, "unknown", "auto")}
        entry = {
            "id": r["id"], "source": r["source"], "engine": r["engine"],
            "engine_version": None if r.get("engine_version") in (None, "unknown") else str(r["engine_version"]),
            "engine_mode": None if r.get("engine_mode") in (None, "unknown") else r["engine_mode"],
            "model": None if str(r.get("model", "unknown")).startswith("unknown") else r["model"],
            "gpu": None if str(r.get("gpu", "unknown")).startswith("unknown") else r["gpu"],
            "gpu_count": r.get("gpu_count"), "tp": r.get("tp") or 1, "pp": r.get("pp") or 1,
            "dp": r.get("data_parallel") or 1, "flags": flags, "reported": r.get("reported") or {},
            "notes": r.get("notes", ""), "split": "calibration",
        }
        out.append((r["id"], add(entry, r.get("log_excerpt") or "", "engine_reports.yaml (fitted before the split)")))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path)
    parser.add_argument("--engine-reports", action="store_true")
    args = parser.parse_args(argv)
    results = from_engine_reports() if args.engine_reports else []
    for folder in args.folders:
        results += from_folder(folder)
    for eid, what in results:
        if what != "added":
            print(f"{eid}: {what}")
    print(f"{sum(1 for _, w in results if w == 'added')} added, {sum(1 for _, w in results if w == 'kept')} kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
