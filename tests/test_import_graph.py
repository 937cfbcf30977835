"""The package's import graph has no cycles (STYLE.md: data flows one way), lazy imports included."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

from source_trees import PACKAGE, nodes, tree

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

    ``from kvplan import hub`` is an edge to ``kvplan.model.hub``; the package root itself is not a node an
    import can close a cycle through (its API functions import lazily, by design). A copy: the graph is read
    once per test process.
    """
    return {name: set(deps) for name, deps in _graph().items()}


@lru_cache(maxsize=1)
def _graph() -> dict[str, frozenset[str]]:
    modules = _modules()
    graph: dict[str, frozenset[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in nodes(path):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("kvplan"):
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                deps |= subs or {node.module}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("kvplan")}
        graph[name] = frozenset(d for d in deps if d in modules and d not in (name, "kvplan"))
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
    """hub<->sources and spec<->hybrid were cycles (lazy imports both ways) before kvplan.model.source,
    kvplan.model.modelspec and kvplan.model.config_reader took the shared types."""
    unexpected = [c for c in cycles(import_graph()) if c not in KNOWN_CYCLES]
    assert unexpected == []


def test_the_source_layer_imports_nothing_downstream() -> None:
    graph = import_graph()
    downstream = {"kvplan.memory", "kvplan.planning.plan", "kvplan.engines", "kvplan.render", "kvplan.checks.report", "kvplan.cli.app"}
    for module in ("kvplan.io.files", "kvplan.model.source", "kvplan.model.hub", "kvplan.model.modelspec", "kvplan.model.config_reader",
                   "kvplan.model.hybrid", "kvplan.model.params", "kvplan.model.quant", "kvplan.model.checkpoint", "kvplan.model.spec",
                   "kvplan.model.sources"):
        assert not {d for d in graph[module] if any(d == x or d.startswith(x + ".") for x in downstream)}, module


# ---------------------------------------------------------------------------------------------------
# The stage order: each package (and each shared module kept flat in kvplan/) says in its docstring what
# it may import ("May import: ..."); an import against that order fails here, so the docstrings cannot drift.

FLAT_LIMIT = 8  # modules directly in kvplan/ besides __init__.py and __main__.py


def _stage(module: str) -> str:
    """``kvplan.model.hub.request`` -> ``kvplan.model``: the stage a module belongs to."""
    return ".".join(module.split(".")[:2])


def declared_imports() -> dict[str, set[str] | str]:
    """Stage -> the stages its docstring allows (a set), or ``"*"`` / ``"* but X"`` for the top stages."""
    import re

    out: dict[str, set[str] | str] = {}
    stages = {_stage(m) for m in _modules()}
    for stage in stages:
        path = _modules()[stage]
        doc = ast.get_docstring(tree(path)) or ""
        match = re.search(r"May import: (.+?)(?:\n\n|$)", doc, re.S)
        assert match, f"{path}: the docstring does not say what it may import ('May import: ...')"
        text = " ".join(match.group(1).split())
        text = re.sub(r"\s*\(.*\)$", "", text)
        if text == "nothing in kvplan":
            out[stage] = set()
        elif text == "anything in kvplan":
            out[stage] = "*"
        elif text.startswith("anything in kvplan but "):
            out[stage] = "* but " + text.removeprefix("anything in kvplan but ")
        else:
            names = {n.strip() for n in text.split(",")}
            unknown = names - stages
            assert not unknown, f"{path}: 'May import' names what does not exist: {sorted(unknown)}"
            out[stage] = names
    return out


def _allowed(declared: dict[str, set[str] | str], stage: str, target: str) -> bool:
    rule = declared[stage]
    if rule == "*":
        return True
    if isinstance(rule, str):
        return target != rule.removeprefix("* but ")
    return target in rule


def test_at_most_eight_flat_modules_and_every_package_documented() -> None:
    flat = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(flat) <= FLAT_LIMIT, flat
    for init in PACKAGE.rglob("__init__.py"):
        assert ast.get_docstring(tree(init)), f"{init} has no docstring"


def test_every_import_follows_the_declared_stage_order() -> None:
    declared = declared_imports()
    against = sorted(f"{module} imports {dep}" for module, deps in import_graph().items() for dep in deps
                     if _stage(module) != _stage(dep) and not _allowed(declared, _stage(module), _stage(dep)))
    assert against == []


def test_the_declared_order_has_no_cycle_and_packages_import_no_cycle() -> None:
    declared = declared_imports()
    stages = set(declared)
    graph = {s: ({t for t in stages if t != s and _allowed(declared, s, t)}) for s in stages}
    # the top stages ("anything") may import everything; the order below them must be acyclic
    bounded = {s: {t for t in deps if isinstance(declared[t], set)} for s, deps in graph.items()
               if isinstance(declared[s], set)}
    assert cycles(bounded) == []
    actual: dict[str, set[str]] = {}
    for module, deps in import_graph().items():
        actual.setdefault(_stage(module), set()).update(_stage(d) for d in deps if _stage(d) != _stage(module))
    assert cycles(actual) == []


def test_an_import_against_the_order_is_caught() -> None:
    declared = declared_imports()
    assert not _allowed(declared, "kvplan.model", "kvplan.planning")
    assert not _allowed(declared, "kvplan.render", "kvplan.cli")
    assert _allowed(declared, "kvplan.cli", "kvplan.render")
