"""A helper the source-reading tests share: each kvplan module parsed once per test process.

The import graph, the plural-noun and the tracker-number checks each walked every module's syntax tree (the
graph four times, ~150 modules each): ~4 s of the suite's CPU in parsing and walking the same files. A file is
re-read when it changes (its modification time is part of the key). The trees are shared: read them, never edit.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kvplan"


@lru_cache(maxsize=None)
def _nodes(path: str, mtime_ns: int) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))))


def nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the module at ``path``, the module first (``ast.walk``'s order)."""
    return _nodes(str(path), path.stat().st_mtime_ns)


def tree(path: Path) -> ast.Module:
    """The module at ``path``, parsed."""
    module = nodes(path)[0]
    assert isinstance(module, ast.Module)
    return module
