"""Regenerate ``kvplan/data/bundled_index.json``: every YAML file kvplan ships (the bundled model specs in
``model_specs/`` and the GPU catalogue ``kvplan/data/gpus.yaml``), parsed, keyed by a digest of its text.

``kvplan.io.files.parse_bundled_yaml`` answers a shipped file from this index when the text's digest is in it
(``json`` is already loaded; importing PyYAML and parsing took about a tenth of ``kvplan estimate``'s start-up),
and parses the YAML itself otherwise, so a stale index costs time, never a wrong number. A test
(tests/cli/test_startup.py) keeps the committed index current: it holds exactly the shipped files, each the same
data PyYAML reads.

    python3 benchmarks/gen_bundled_index.py           # rewrite the index
    python3 benchmarks/gen_bundled_index.py --check   # exit 1 when the committed index is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvplan.io.files import BUNDLED_INDEX, bundled_index_text  # noqa: E402


def shipped_files() -> list[Path]:
    """The YAML files kvplan ships, in a stable order."""
    data = REPO / "kvplan" / "data"
    return sorted((REPO / "model_specs").rglob("*.yaml")) + [data / "gpus.yaml", data / "kv_spread.yaml"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed index is stale")
    args = parser.parse_args()
    text = bundled_index_text([p.read_text(encoding="utf-8") for p in shipped_files()])
    current = BUNDLED_INDEX.read_text(encoding="utf-8") if BUNDLED_INDEX.exists() else ""
    if args.check:
        if text != current:
            print(f"{BUNDLED_INDEX.relative_to(REPO)} is stale: run python3 benchmarks/gen_bundled_index.py")
            return 1
        return 0
    if text != current:
        BUNDLED_INDEX.write_text(text, encoding="utf-8")
        print(f"wrote {BUNDLED_INDEX.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
