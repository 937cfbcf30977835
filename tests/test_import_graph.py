"""The package's import graph has no cycles (STYLE.md: data flows one way), lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kvplan"

# Cycles still open elsewhere in issue 11 (delete an entry when it is fixed; never add one).
KNOWN_CYCLES: list[set[str]] = []


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the kvplan modules it imports anywhere in its body (top level, functions, TYPE_CHECKING).

    ``from kvplan import hub`` is an edge to ``kvplan.hub``; the package root itself is not a node an
    import can close a cycle through (its API functions import lazily, by design).
    """
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("kvplan"):
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                deps |= subs or {node.module}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("kvplan")}
        graph[name] = {d for d in deps if d in modules and d not in (name, "kvplan")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    """hub<->sources and spec<->hybrid were cycles (lazy imports both ways) before kvplan.model_source,
    kvplan.modelspec and kvplan.config_reader took the shared types."""
    unexpected = [c for c in cycles(import_graph()) if c not in KNOWN_CYCLES]
    assert unexpected == []


def test_the_source_layer_imports_nothing_downstream() -> None:
    graph = import_graph()
    downstream = {"kvplan.memory", "kvplan.plan", "kvplan.engines", "kvplan.render", "kvplan.report", "kvplan.cli"}
    for module in ("kvplan.files", "kvplan.model_source", "kvplan.hub", "kvplan.modelspec", "kvplan.config_reader",
                   "kvplan.hybrid", "kvplan.params", "kvplan.quant", "kvplan.checkpoint", "kvplan.spec",
                   "kvplan.sources"):
        assert not {d for d in graph[module] if any(d == x or d.startswith(x + ".") for x in downstream)}, module
