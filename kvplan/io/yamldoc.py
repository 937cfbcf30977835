"""YAML files with positions: the one reader of kvplan's YAML files (capacity, what-if, workload), and the
located errors it raises.

Files are read with PyYAML's ``SafeLoader``, composing the node tree first so that every error can name
the file, line and column of the offending key or value::

    capacity.yaml:14:18: checks[1].require.concurency: unknown key (did you mean 'concurrency'?) ...

:func:`read_yaml` / :func:`parse_yaml` bound the nesting and the alias expansion and reject duplicate keys;
:func:`validate_doc` validates the data against a pydantic schema and locates every mistake (pydantic is
imported only there). The schemas themselves are :mod:`kvplan.checks.scenario`'s and :mod:`kvplan.sim.workload`'s.
"""

from __future__ import annotations

import difflib
import reprlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import yaml

from kvplan.errors import ScenarioError
from kvplan.frozen import frozen

if TYPE_CHECKING:  # pragma: no cover
    from pydantic import BaseModel

# ---------------------------------------------------------------------------------------------
# located errors

@frozen
class Where:
    """A place in a YAML file (1-based line and column)."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


MAX_FILE_ERRORS = 20  # mistakes of one file reported at once (in file order); past that, a count


class ScenarioFileError(ScenarioError):
    """A :class:`ScenarioError` that knows where in the file it is (for CI annotations).

    ``more``: the file's other mistakes (each a ScenarioFileError), ``hidden``: how many were not kept.
    """

    def __init__(self, where: Where, message: str, hint: str | None = None,
                 more: tuple["ScenarioFileError", ...] = (), hidden: int = 0) -> None:
        super().__init__(f"{where}: {message}", hint)
        self.where = where
        self.detail = message
        self.more = more
        self.hidden = hidden

    @property
    def errors(self) -> tuple["ScenarioFileError", ...]:
        """This mistake and the file's others, in file order."""
        return (self, *self.more)

    def lines(self) -> list[str]:
        out = [e.one_line() for e in self.errors]
        if self.hidden:
            out.append(f"{self.where.file}: {self.hidden:,} more mistakes not shown (fix these first)")
        return out



# ---------------------------------------------------------------------------------------------
# YAML with node marks

class YamlDoc:
    """A parsed YAML file: its data plus the node tree that knows each value's line and column."""

    def __init__(self, path: Path, display: str, data: Any, root: yaml.Node) -> None:
        self.path = path
        self.display = display
        self.data = data
        self.root = root

    def node(self, loc: tuple[Any, ...], key: bool = False) -> yaml.Node:
        """The deepest node along ``loc`` (the key node of the last step when ``key``)."""
        node, key_node = self.root, None
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                hit = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None)
                if hit is None:
                    continue  # pydantic adds union/validator tags to loc: skip what the file lacks
                key_node, node = hit
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                key_node, node = None, node.value[part]
        return key_node if key and key_node is not None else node

    def where(self, loc: tuple[Any, ...], key: bool = False) -> Where:
        mark = self.node(loc, key).start_mark
        return Where(self.display, mark.line + 1, mark.column + 1)

    def error(self, loc: tuple[Any, ...], message: str, hint: str | None = None, key: bool = False) -> ScenarioFileError:
        return ScenarioFileError(self.where(loc, key), f"{key_path(loc, self.data)}: {message}" if loc else message, hint)


def key_path(loc: tuple[Any, ...], data: Any = None) -> str:
    """``('checks', 1, 'require', 'context')`` -> ``checks[1].require.context``."""
    out = ""
    node = data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part not in node and i < len(loc) - 1:
            continue  # a validator's tag in pydantic's loc (a union branch), not a key of the file
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isprintable() and part.strip() == part and part:
            out += ("." if out else "") + part
        else:  # a key with a newline, spaces around it, or not a string: shown quoted, on one line
            out += f"[{str(part)!r}]"
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            node = None
    return out


def display_path(path: Path) -> str:
    """The path as the user would recognise it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


MAX_YAML_DEPTH = 64  # nesting of mappings and lists: real files nest 4-5 levels
MAX_YAML_VALUES = 1_000_000  # values after aliases are expanded (a "billion laughs" file expands to 10^9)


def read_yaml(path: str | Path) -> YamlDoc:
    """Read a YAML file with SafeLoader, keeping the node tree (duplicate keys are errors).

    The bytes go through :func:`kvplan.io.files.read_text` (size bound, binary / NUL and invalid UTF-8 are
    one-line errors); :func:`parse_yaml` bounds the nesting and the alias expansion.
    """
    from kvplan.io.files import read_text

    path = Path(path)
    display = display_path(path)
    text = read_text(path, "YAML file", display=display, error=ScenarioError)
    return parse_yaml(text, path, display)


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses nesting deeper than :data:`MAX_YAML_DEPTH` (PyYAML composes
    recursively: 5,000 levels would be a RecursionError)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: ANN401 - PyYAML's signature
        if self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent):
            self.depth += 1
            try:
                if self.depth > MAX_YAML_DEPTH:
                    mark = self.peek_event().start_mark
                    raise _TooDeep(mark)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1
        return super().compose_node(parent, index)


class _TooDeep(Exception):
    def __init__(self, mark: Any) -> None:
        super().__init__()
        self.mark = mark


def _expanded_size(root: yaml.Node) -> int:
    """How many values ``root`` holds once aliases are expanded (each shared node counted per use)."""
    sizes: dict[int, int] = {}
    order: list[yaml.Node] = []  # post-order without recursion
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else \
            (node.value if isinstance(node, yaml.SequenceNode) else [])
        if done or not children:
            total = 1
            for c in children:
                total += sizes.get(id(c), 1)
                if total > MAX_YAML_VALUES:
                    return total
            sizes[id(node)] = total
            order.append(node)
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def parse_yaml(text: str, path: Path, display: str) -> YamlDoc:
    """Parse YAML ``text`` (named ``display`` in errors; ``path`` anchors relative outputs)."""
    loader = None
    try:
        loader = _BoundedLoader(text)  # the reader rejects control characters here, before parsing
        root = loader.get_single_node()
        if root is None:
            raise ScenarioFileError(Where(display, 1, 1), "the file is empty",
                                    "see docs/examples/ for a complete file; `kvplan schema` prints the schema")
        size = _expanded_size(root)
        if size > MAX_YAML_VALUES:
            raise ScenarioFileError(Where(display, 1, 1), f"the file expands to more than {MAX_YAML_VALUES:,} values "
                                    "through its aliases (&anchor / *alias)", "write the values out, without nested aliases")
        _reject_duplicates(root, display)
        data = loader.construct_document(root)
    except _TooDeep as exc:
        raise ScenarioFileError(Where(display, exc.mark.line + 1, exc.mark.column + 1),
                                f"nested more than {MAX_YAML_DEPTH} levels deep", "a kvplan file nests a few levels") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Where(display, mark.line + 1, mark.column + 1) if mark else Where(display, 1, 1)
        problem = " ".join(str(exc.problem or exc.context or "syntax error").split())
        raise ScenarioFileError(where, f"not valid YAML: {problem}", "check the indentation and quoting near this line") from None
    except yaml.YAMLError as exc:
        raise ScenarioFileError(Where(display, 1, 1), f"not valid YAML: {' '.join(str(exc).split())[:200]}") from None
    except RecursionError:  # a backstop: the composer bounds the nesting first
        raise ScenarioFileError(Where(display, 1, 1), "nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict):
        mark = root.start_mark
        got = "a list" if isinstance(data, list) else short(data)
        raise ScenarioFileError(Where(display, mark.line + 1, mark.column + 1),
                                f"expected a mapping of keys (defaults, ...), got {got}",
                                "see docs/examples/ for a complete file")
    return YamlDoc(path, display, data, root)


def _reject_duplicates(node: yaml.Node, display: str, seen_nodes: set[int] | None = None) -> None:
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if id(node) in seen_nodes:  # aliases share nodes
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys: dict[str, yaml.Node] = {}
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                if k.value in keys:
                    first = keys[k.value].start_mark.line + 1
                    mark = k.start_mark
                    raise ScenarioFileError(Where(display, mark.line + 1, mark.column + 1),
                                            f"duplicate key {k.value!r} (first at line {first})", "keep one of them")
                keys[k.value] = k
            _reject_duplicates(v, display, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _reject_duplicates(item, display, seen_nodes)


def expect_kind(doc: YamlDoc, expected: Any) -> None:
    """Raise a located error when ``doc`` is another kvplan file kind than ``expected`` (a
    :class:`kvplan.io.kinds.YamlKind`): ``simulate capacity.yaml`` says it is a capacity file that kvplan
    check reads, instead of listing the keys a workload allows."""
    from kvplan.io.kinds import other_kind

    found = other_kind(doc.data, expected)
    if found is not None:
        raise ScenarioFileError(Where(doc.display, 1, 1), *found)


def validate_doc(doc: YamlDoc, model: type[BaseModel]) -> BaseModel:
    """Validate ``doc.data`` against ``model``; every error (up to :data:`MAX_FILE_ERRORS`, in file order),
    each a located line: the raised error is the first, its ``more`` the others."""
    from pydantic import ValidationError

    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        located = sorted(((doc.where(tuple(e["loc"]), key=e["type"] == "extra_forbidden"), e) for e in errors),
                         key=lambda we: (we[0].line, we[0].col))
        seen: set[tuple[int, int]] = set()
        unique = []
        for where, err in located:  # a union reports each branch at the same place: keep its first
            if (where.line, where.col) not in seen:
                seen.add((where.line, where.col))
                unique.append((where, err))
        located = unique
        found = []
        for where, err in located[:MAX_FILE_ERRORS]:
            message, hint = _describe(err, model)
            found.append(ScenarioFileError(where, f"{key_path(tuple(err['loc']), doc.data)}: {message}", hint))
        first = found[0]
        raise ScenarioFileError(first.where, first.detail, first.hint, tuple(found[1:]),
                                max(0, len(located) - MAX_FILE_ERRORS)) from None


def combine_errors(errors: list[ScenarioFileError]) -> ScenarioFileError:
    """One error holding every mistake of ``errors`` (each with its own ``more``) in file order: the first
    raised, the others its ``more``, at most :data:`MAX_FILE_ERRORS` kept and the rest counted in ``hidden``."""
    assert errors, "no mistakes to combine"
    found = sorted((e for err in errors for e in err.errors), key=lambda e: (e.where.line, e.where.col))
    hidden = sum(err.hidden for err in errors) + max(0, len(found) - MAX_FILE_ERRORS)
    first = found[0]
    return ScenarioFileError(first.where, first.detail, first.hint, tuple(found[1:MAX_FILE_ERRORS]), hidden)


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed in the mapping at ``loc`` (for 'did you mean')."""
    from pydantic import BaseModel
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        info = current.model_fields.get(part) if isinstance(current, type) and issubclass(current, BaseModel) else None
        if info is None:
            return []
        ann = info.annotation
        args = getattr(ann, "__args__", ())
        current = args[0] if getattr(ann, "__origin__", None) is list and args else ann
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 6, 6, 58, 58


def short(value: Any) -> str:
    """A bounded repr (huge or deeply shared values are cut, never walked whole)."""
    text = _REPR.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(err: Mapping[str, Any], model: type[BaseModel]) -> tuple[str, str | None]:
    """One error as (message, hint): what was wrong, the bad value, what was expected."""
    kind, loc, value = err["type"], tuple(err["loc"]), err.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        near = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        guess = f" (did you mean {near[0]!r}?)" if near else ""
        return f"unknown key {str(loc[-1])!r}{guess}", ("allowed here: " + ", ".join(allowed)) if allowed else None
    if kind == "missing":
        return "required key missing", None
    if kind in ("too_short", "list_type") and loc and loc[0] == "sweep":
        return (f"got {short(value)}, expected a non-empty list of values",
                "write one value as a list ([8k]) or move it to defaults")
    if kind == "too_short":
        return f"got {short(value)}, expected at least one entry", None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "model_type" or kind == "model_attributes_type":
        return f"got {short(value)}, expected a mapping of keys", None
    if kind == "list_type":
        return f"got {short(value)}, expected a list", None
    return f"got {short(value)}: {msg}", None


def option_locations(doc: YamlDoc, prefixes: list[tuple[Any, ...]], keys: Any) -> dict[str, Where]:
    """Where each of ``keys`` was written in the mappings at ``prefixes`` (later prefixes win: a check's own
    value over the defaults). Keys are ``options_from_values`` keys (``gpus`` -> ``gpu_count``)."""
    out: dict[str, Where] = {}
    for prefix in prefixes:
        node = doc.node(prefix)
        if not isinstance(node, yaml.MappingNode):
            continue
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value in keys:
                out["gpu_count" if k.value == "gpus" else k.value] = Where(doc.display, v.start_mark.line + 1, v.start_mark.column + 1)
    return out
