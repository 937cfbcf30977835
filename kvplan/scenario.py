"""YAML scenario files -> validated, frozen scenarios (capacity checks and what-if reports).

The schemas are pydantic models (``extra="forbid"``: a typo is an error, never a silently ignored key).
Files are read with PyYAML's ``SafeLoader``, composing the node tree first so that every error can name
the file, line and column of the offending key or value::

    capacity.yaml:14:18: checks[1].require.concurency: unknown key (did you mean 'concurrency'?) ...

Option keys come from the option table (:data:`kvplan.options.OPTIONS`: the CLI flag names with
underscores; ``gpus`` for ``--gpus``) and take the same spellings (``8k``, ``24GiB``).

Only the ``check``, ``report`` and ``schema`` commands import this module (pydantic is not imported by
``import kvplan.cli``).
"""

from __future__ import annotations

import difflib
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, WithJsonSchema, create_model

from kvplan.errors import KvplanError, ScenarioError
from kvplan.options import AXIS_ORDER, ENGINE_NAMES, USAGE_CONTEXTS, YAML_OPTIONS

# ---------------------------------------------------------------------------------------------
# located errors


@dataclass(frozen=True)
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


def model_error(where: Where, prefix: str, name: str, exc: KvplanError) -> ScenarioFileError:
    """A model that cannot be resolved, located at its ``model:`` line, with the closest bundled ids."""
    from kvplan.sources import closest_bundled

    hint = exc.hint
    near = closest_bundled(str(name).split("/")[-1]) if not (hint and "closest" in hint) else []
    if near:
        hint = (f"{hint}; " if hint else "") + "closest bundled: " + ", ".join(near)
    return ScenarioFileError(where, f"{prefix}model {name!r}: {exc.message}", hint)


# ---------------------------------------------------------------------------------------------
# value types (one validator each; the message says what was expected)


def _expect(kind: str, check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def validate(value: Any) -> Any:
        if value is None:
            raise ValueError(f"no value; expected {kind}")
        try:
            out = check(value)
        except KvplanError as exc:
            hint = f" ({exc.hint})" if exc.hint else ""
            raise ValueError(f"{exc.message}; expected {kind}{hint}") from None
        except (TypeError, ValueError):
            raise ValueError(f"expected {kind}") from None
        return out

    return validate


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError
    return value


def _tokens(allow_zero: bool) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        from kvplan.units import parse_tokens

        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError
        if allow_zero and value in (0, "0"):
            return 0
        return parse_tokens(value)

    return parse


def _size(allow_zero: bool) -> Callable[[Any], Any]:
    def parse(value: Any) -> Any:
        from kvplan.units import parse_gib

        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        if isinstance(value, (int, float)) and value < 0:
            raise ValueError
        if isinstance(value, str) and value.strip().startswith("-"):
            raise ValueError
        zero = value == 0 or (isinstance(value, str) and value.strip() in ("0", "0GiB", "0GB"))
        if zero:
            if allow_zero:
                return 0
            raise ValueError
        parse_gib(value)
        return value  # kept as typed: options_from_values parses it again (same parser)

    return parse


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError
    return float(value)


def _percent(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 100:
        raise ValueError
    return float(value)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError
    return value.strip()


def _revision(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise ValueError
    return str(value).strip()  # a bare hex commit id may be read as an int by YAML


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError
    return value


def _dtype(kv: bool, weights: bool = False) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        from kvplan.units import parse_dtype

        if not isinstance(value, str):
            raise ValueError
        if kv and value.strip().lower() == "auto":
            return "auto"
        parse_dtype(value, "dtype", weights=weights)
        return value.strip()

    return parse


def _gpu(value: Any) -> str:
    from kvplan.gpus import find_gpu

    if not isinstance(value, str) or not value.strip():
        raise ValueError
    find_gpu(value)  # GpuNotFoundError names the closest catalogue entries
    return value.strip()


def _engine(value: Any) -> str:
    if value not in ENGINE_NAMES:
        raise ValueError
    return value


def _usage(value: Any) -> str:
    if value not in USAGE_CONTEXTS:
        raise ValueError
    return value


def _t(kind: str, check: Callable[[Any], Any], schema: dict[str, Any]) -> Any:
    return Annotated[Any, PlainValidator(_expect(kind, check)), WithJsonSchema({**schema, "description": kind})]


def number(kind: str, *, low: float | None = None, high: float | None = None, low_open: bool = False,
           integer: bool = False) -> Any:
    """A numeric field checked by :func:`kvplan.units.check_number` (finite, in range), described as ``kind``."""

    def check(value: Any) -> Any:
        from kvplan.units import check_number

        try:
            return check_number(value, "value", low=low, high=high, low_open=low_open, integer=integer)
        except KvplanError as exc:
            raise ValueError(f"{exc.message.partition(': ')[2]}; expected {kind}") from None

    schema: dict[str, Any] = {"type": "integer" if integer else "number"}
    if low is not None:
        schema["exclusiveMinimum" if low_open else "minimum"] = low
    if high is not None:
        schema["maximum"] = high
    return Annotated[Any, PlainValidator(check), WithJsonSchema({**schema, "description": kind})]


_TOKENS_SCHEMA = {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": r"^\s*[0-9.]+\s*[kKmM]?\s*$"}]}
_SIZE_SCHEMA = {"anyOf": [{"type": "number", "exclusiveMinimum": 0},
                          {"type": "string", "pattern": r"^\s*[0-9.]+(e[+-]?[0-9]+)?\s*[a-zA-Z]*\s*$"}]}
PositiveInt = _t("a positive integer", _positive_int, {"type": "integer", "minimum": 1})
Tokens = _t("a token count such as 8192, 8k or 128k", _tokens(False), _TOKENS_SCHEMA)
TokensOrZero = _t("a token count (0 or more) such as 0, 512 or 2k", _tokens(True), _TOKENS_SCHEMA)
Size = _t("a positive size: GiB as a number (24) or with a unit (24GiB, 80GB)", _size(False), _SIZE_SCHEMA)
SizeOrZero = _t("a size of 0 or more: GiB as a number or with a unit (0, 1.5GiB)", _size(True), _SIZE_SCHEMA)
Fraction = _t("a number in (0, 1], e.g. 0.9", _fraction, {"type": "number", "exclusiveMinimum": 0, "maximum": 1})
Percent = _t("a percentage in [0, 100), e.g. 10", _percent, {"type": "number", "minimum": 0, "exclusiveMaximum": 100})
Text = _t("a non-empty string", _text, {"type": "string", "minLength": 1})
Revision = _t("a Hub revision (branch, tag or commit)", _revision, {"type": "string", "minLength": 1})
Bool = _t("true or false", _bool, {"type": "boolean"})
ModelDType = _t("a dtype: auto, fp32, bf16, fp16", _dtype(True), {"type": "string"})
KvDType = _t("a KV dtype: auto, bf16, fp16, fp8, fp8_e5m2, int8, int4", _dtype(True), {"type": "string"})
WeightsDType = _t("a weights dtype: bf16, fp16, fp8, int8, int4", _dtype(False, weights=True), {"type": "string"})
GpuName = _t("a GPU from the catalogue (`kvplan gpus`)", _gpu, {"type": "string"})
Engine = _t("an engine: " + " or ".join(ENGINE_NAMES), _engine, {"type": "string", "enum": list(ENGINE_NAMES)})
UsageContext = _t("serve (`vllm serve`) or llm (the LLM class)", _usage, {"type": "string", "enum": list(USAGE_CONTEXTS)})

# the YAML type of each kind of option (kvplan.options.KINDS)
KIND_TYPES: dict[str, Any] = {
    "text": Text, "revision": Revision, "version": Text, "gpu": GpuName, "dtype": ModelDType, "kv_dtype": KvDType,
    "weights_dtype": WeightsDType, "ssm_dtype": ModelDType, "engine": Engine, "usage": UsageContext,
    "count": PositiveInt, "tokens": Tokens, "tokens_or_zero": TokensOrZero, "max_model_len": Tokens, "size": Size,
    "size_or_zero": SizeOrZero, "fraction": Fraction, "flag": Bool, "switch": Bool, "calibration": Text,
}
# Every estimate option a scenario may set, from the option table: name -> (type, description). Keys are
# those of kvplan.options.options_from_values (the CLI flags with underscores; `gpus` = --gpus).
OPTION_FIELDS: dict[str, tuple[Any, str]] = {o.name: (KIND_TYPES[o.kind], o.help) for o in YAML_OPTIONS}

_FORBID = ConfigDict(extra="forbid")


def _option_fields(wrap: Callable[[Any], Any] = lambda t: t, min_length: int | None = None) -> dict[str, Any]:
    return {name: (wrap(typ), Field(None, description=desc, min_length=min_length))
            for name, (typ, desc) in OPTION_FIELDS.items()}


OptionsModel = create_model("Options", __config__=_FORBID, __doc__="Estimate options (any subset).", **_option_fields())


class RequireModel(BaseModel):
    """What must hold for a check to pass (at least one key)."""

    model_config = _FORBID
    concurrency: PositiveInt = Field(None, description="at least this many requests fit at once at the scenario's context")
    context: Tokens = Field(None, description="at least this context fits at the scenario's batch (default: concurrency, else 1)")
    kv_tokens: Tokens = Field(None, description="vLLM's 'GPU KV cache size' is at least this many tokens")
    headroom_pct: Percent = Field(None, description="at least this % of the KV pool is free after batch x context")
    fits: Bool = Field(None, description="batch x context fits (true) / does not fit (false)")
    engine_starts: Bool = Field(None, description="the engine starts at max_model_len (one request fits)")


CheckModel = create_model(
    "Check", __config__=_FORBID, __doc__="One named capacity check: options overriding defaults, plus require.",
    name=(Text, Field(..., description="unique name (one JUnit test case)")),
    description=(Text, Field(None, description="free text")),
    require=(RequireModel, Field(..., description="what must hold")),
    **_option_fields(),
)


class CapacityModel(BaseModel):
    """A capacity file: `kvplan check capacity.yaml`."""

    model_config = _FORBID
    defaults: OptionsModel = Field(default_factory=OptionsModel, description="options shared by every check")  # type: ignore[valid-type]
    checks: list[CheckModel] = Field(..., min_length=1, description="the checks (each a scenario with require)")  # type: ignore[valid-type]


SweepModel = create_model("Sweep", __config__=_FORBID, __doc__="Axes: any option as a non-empty list (cartesian product).",
                          **_option_fields(lambda t: list[t], min_length=1))  # type: ignore[misc, valid-type]
ScenarioRowModel = create_model("Scenario", __config__=_FORBID, __doc__="One explicit row (options overriding defaults).",
                                name=(Text, Field(None, description="row label")), **_option_fields())

OUTPUT_SUFFIXES = (".md", ".html", ".csv", ".json")
PLOTS = ("concurrency", "memory")


def _output(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or Path(value).suffix.lower() not in OUTPUT_SUFFIXES:
        raise ValueError
    return value.strip()


def _plots(value: Any) -> tuple[str, ...]:
    if isinstance(value, bool):
        return PLOTS if value else ()
    if isinstance(value, list) and value and all(v in PLOTS for v in value):
        return tuple(dict.fromkeys(value))
    raise ValueError


OutputPath = _t("a file path ending in .md, .html, .csv or .json", _output, {"type": "string", "pattern": r"\.(md|html|csv|json)$"})
Plots = _t("true, false or a list of: concurrency, memory", _plots,
           {"anyOf": [{"type": "boolean"}, {"type": "array", "items": {"enum": list(PLOTS)}, "minItems": 1}]})


class WhatIfModel(BaseModel):
    """A what-if file: `kvplan report whatif.yaml`."""

    model_config = _FORBID
    title: Text = Field(None, description="report title")
    description: Text = Field(None, description="free text under the title")
    defaults: OptionsModel = Field(default_factory=OptionsModel, description="options shared by every row")  # type: ignore[valid-type]
    sweep: SweepModel = Field(None, description="axes to sweep (cartesian product)")  # type: ignore[valid-type]
    zip: list[list[Text]] = Field(None, description="groups of sweep axes that vary together (equal lengths)")
    scenarios: list[ScenarioRowModel] = Field(None, min_length=1, description="explicit rows, added after the sweep")  # type: ignore[valid-type]
    outputs: list[OutputPath] = Field(None, description="files to write (format from the suffix; relative to this file)")
    plots: Plots = Field(None, description="plots for HTML/Markdown outputs (default: both)")


SCHEMAS: dict[str, type[BaseModel]] = {"capacity": CapacityModel, "whatif": WhatIfModel}


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of a capacity or what-if file (for editors: yaml-language-server)."""
    if kind not in SCHEMAS:
        raise ScenarioError(f"unknown schema {kind!r}", "use one of: " + ", ".join(SCHEMAS))
    schema = SCHEMAS[kind].model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = {"capacity": "kvplan capacity file", "whatif": "kvplan what-if file"}[kind]
    return schema


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

    The bytes go through :func:`kvplan.files.read_text` (size bound, binary / NUL and invalid UTF-8 are
    one-line errors); :func:`parse_yaml` bounds the nesting and the alias expansion.
    """
    from kvplan.files import read_text

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
        got = "a list" if isinstance(data, list) else _short(data)
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


def validate_doc(doc: YamlDoc, model: type[BaseModel]) -> BaseModel:
    """Validate ``doc.data`` against ``model``; every error (up to :data:`MAX_FILE_ERRORS`, in file order),
    each a located line: the raised error is the first, its ``more`` the others."""
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


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed in the mapping at ``loc`` (for 'did you mean')."""
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


def _short(value: Any) -> str:
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
        return (f"got {_short(value)}, expected a non-empty list of values",
                "write one value as a list ([8k]) or move it to defaults")
    if kind == "too_short":
        return f"got {_short(value)}, expected at least one entry", None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "model_type" or kind == "model_attributes_type":
        return f"got {_short(value)}, expected a mapping of keys", None
    if kind == "list_type":
        return f"got {_short(value)}, expected a list", None
    return f"got {_short(value)}: {msg}", None


# ---------------------------------------------------------------------------------------------
# the frozen results


def option_values(fields_set: Mapping[str, Any]) -> dict[str, Any]:
    """Scenario keys -> :func:`kvplan.plan.options_from_values` keys (``gpus`` -> ``gpu_count``)."""
    return {("gpu_count" if k == "gpus" else k): v for k, v in fields_set.items()}


def _set_fields(model: BaseModel, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: getattr(model, k) for k in model.model_fields_set if k in OPTION_FIELDS and k not in exclude}


def finish_values(values: dict[str, Any]) -> dict[str, Any]:
    """Defaults that every scenario shares with ``kvplan estimate`` (the GPU defaults to H100)."""
    if values.get("gpu") is None and values.get("gpu_memory") is None:
        values["gpu"] = "H100"
    return values


@dataclass(frozen=True)
class Requirement:
    """What a check requires; ``None`` = not required."""

    concurrency: int | None = None
    context: int | None = None
    kv_tokens: int | None = None
    headroom_pct: float | None = None
    fits: bool | None = None
    engine_starts: bool | None = None

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in ("concurrency", "context", "kv_tokens", "headroom_pct", "fits", "engine_starts")
                if getattr(self, k) is not None]


@dataclass(frozen=True)
class CheckScenario:
    """One capacity check: merged option values (``options_from_values`` keys) and its requirement.

    ``batch_given``: the scenario set ``batch`` (else the batch is the required concurrency, or 1).
    ``where``: the check's entry; ``locations``: key -> where that key's value was written.
    """

    name: str
    description: str | None
    values: Mapping[str, Any]
    require: Requirement
    batch_given: bool
    where: Where
    locations: Mapping[str, Where] = field(default_factory=dict)

    def where_of(self, key: str) -> Where:
        return self.locations.get(key, self.where)


@dataclass(frozen=True)
class CapacityFile:
    """A validated capacity file."""

    path: Path
    display: str
    checks: tuple[CheckScenario, ...]


def _locations(doc: YamlDoc, prefixes: list[tuple[Any, ...]], keys: Any) -> dict[str, Where]:
    out: dict[str, Where] = {}
    for prefix in prefixes:  # later prefixes (the check itself) win over defaults
        node = doc.node(prefix)
        if not isinstance(node, yaml.MappingNode):
            continue
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value in keys:
                out["gpu_count" if k.value == "gpus" else k.value] = Where(doc.display, v.start_mark.line + 1, v.start_mark.column + 1)
    return out


def load_capacity(path: str | Path | YamlDoc) -> CapacityFile:
    """Read and validate a capacity file; raises :class:`ScenarioFileError` (file:line:col) on any mistake."""
    doc = path if isinstance(path, YamlDoc) else read_yaml(path)
    model = validate_doc(doc, CapacityModel)
    defaults = _set_fields(model.defaults)  # type: ignore[attr-defined]
    checks: list[CheckScenario] = []
    names: dict[str, int] = {}
    for i, check in enumerate(model.checks):  # type: ignore[attr-defined]
        if check.name in names:
            raise doc.error(("checks", i, "name"), f"duplicate check name {check.name!r} (first at checks[{names[check.name]}], "
                            f"line {doc.where(('checks', names[check.name], 'name')).line})", "check names must be unique")
        names[check.name] = i
        require = Requirement(**{k: getattr(check.require, k) for k in check.require.model_fields_set
                                 if getattr(check.require, k) is not None})
        if not require.items():
            raise doc.error(("checks", i, "require"), "nothing required",
                            "add one of: concurrency, context, kv_tokens, headroom_pct, fits, engine_starts")
        values = option_values({**defaults, **_set_fields(check)})
        if not values.get("model"):
            raise doc.error(("checks", i), f"check {check.name!r} names no model", "set model in defaults or in the check")
        checks.append(CheckScenario(
            name=check.name,
            description=check.description,
            values=finish_values(values),
            require=require,
            batch_given="batch" in values,
            where=doc.where(("checks", i)),
            locations=_locations(doc, [("defaults",), ("checks", i)], OPTION_FIELDS),
        ))
    return CapacityFile(doc.path, doc.display, tuple(checks))


@dataclass(frozen=True)
class Axis:
    """One sweep group: option names that vary together and their values (one tuple per step)."""

    names: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]
    where: Where


@dataclass(frozen=True)
class ExplicitRow:
    """An explicit ``scenarios`` row: its label and merged values."""

    name: str | None
    values: Mapping[str, Any]
    where: Where


@dataclass(frozen=True)
class WhatIfFile:
    """A validated what-if file. ``outputs`` are resolved against the file's folder."""

    path: Path
    display: str
    title: str
    description: str | None
    defaults: Mapping[str, Any]
    axes: tuple[Axis, ...]
    scenarios: tuple[ExplicitRow, ...]
    outputs: tuple[Path, ...]
    plots: tuple[str, ...]
    where: Where  # the sweep (or the file) for errors found while planning
    locations: Mapping[str, Where] = field(default_factory=dict)  # option -> where it was set (defaults/sweep)

    def where_of(self, key: str) -> Where:
        return self.locations.get(key, self.where)

    @property
    def num_rows(self) -> int:
        n = 1
        for axis in self.axes:
            n *= len(axis.values)
        return (n if self.axes else 0) + len(self.scenarios)




def load_whatif(path: str | Path | YamlDoc) -> WhatIfFile:
    """Read and validate a what-if file; raises :class:`ScenarioFileError` (file:line:col) on any mistake."""
    doc = path if isinstance(path, YamlDoc) else read_yaml(path)
    model = validate_doc(doc, WhatIfModel)
    defaults = option_values(_set_fields(model.defaults))  # type: ignore[attr-defined]
    axes_values: dict[str, list[Any]] = {}
    if model.sweep is not None:  # type: ignore[attr-defined]
        axes_values = {k: list(getattr(model.sweep, k)) for k in model.sweep.model_fields_set  # type: ignore[attr-defined]
                       if getattr(model.sweep, k) is not None}
        if not axes_values:
            raise doc.error(("sweep",), "empty sweep: no axes", "add an axis such as `context: [4k, 8k, 32k]`, or remove sweep")
    if model.sweep is None and not model.scenarios:  # type: ignore[attr-defined]
        raise doc.error((), "nothing to report: no sweep and no scenarios", "add `sweep:` axes or `scenarios:` rows")
    groups: list[tuple[str, ...]] = []
    used: dict[str, int] = {}
    for gi, group in enumerate(model.zip or []):  # type: ignore[attr-defined]
        if len(group) < 2:
            raise doc.error(("zip", gi), f"a zip group needs at least two axes, got {group!r}")
        for ai, name in enumerate(group):
            if name not in axes_values:
                near = difflib.get_close_matches(name, list(axes_values), n=1, cutoff=0.6)
                guess = f" (did you mean {near[0]!r}?)" if near else ""
                raise doc.error(("zip", gi, ai), f"{name!r} is not a sweep axis{guess}",
                                "sweep axes: " + (", ".join(axes_values) or "none"))
            if name in used:
                raise doc.error(("zip", gi, ai), f"axis {name!r} is already in zip group {used[name]}")
            used[name] = gi
        lengths = {name: len(axes_values[name]) for name in group}
        if len(set(lengths.values())) > 1:
            raise doc.error(("zip", gi), "zipped axes differ in length: " + ", ".join(f"{k} {v}" for k, v in lengths.items()),
                            "zipped axes advance together, so give them the same number of values")
        groups.append(tuple(group))
    axes: list[Axis] = []
    for name in axes_values:
        if name in used:
            continue
        axes.append(Axis((name,), tuple((v,) for v in axes_values[name]), doc.where(("sweep", name))))
    for group in groups:
        axes.append(Axis(group, tuple(zip(*(axes_values[n] for n in group))), doc.where(("sweep", group[0]))))
    axes.sort(key=lambda a: max(AXIS_ORDER.index(n) for n in a.names))
    rows = tuple(
        ExplicitRow(row.name, finish_values({**defaults, **option_values(_set_fields(row))}), doc.where(("scenarios", i)))
        for i, row in enumerate(model.scenarios or [])  # type: ignore[attr-defined]
    )
    if not (defaults.get("model") or "model" in axes_values):
        if axes_values:
            raise doc.error(("sweep",), "no model: set model in defaults or sweep it", "e.g. `defaults: {model: meta-llama/Llama-3.1-8B}`")
    for i, row in enumerate(rows):
        if not row.values.get("model"):
            raise doc.error(("scenarios", i), "no model for this row", "set model in defaults or in the row")
    base = doc.path.resolve().parent
    outputs = tuple(base / p for p in (model.outputs or []))  # type: ignore[attr-defined]
    seen: dict[Path, int] = {}
    for i, out in enumerate(outputs):
        if out in seen:
            raise doc.error(("outputs", i), f"output {str(model.outputs[i])!r} listed twice")  # type: ignore[attr-defined]
        seen[out] = i
    plots = PLOTS if model.plots is None else model.plots  # type: ignore[attr-defined]
    return WhatIfFile(
        path=doc.path,
        display=doc.display,
        title=model.title or doc.path.stem,  # type: ignore[attr-defined]
        description=model.description,  # type: ignore[attr-defined]
        defaults=finish_values(dict(defaults)) if "gpu" not in axes_values and "gpu_memory" not in axes_values else dict(defaults),
        axes=tuple(axes),
        scenarios=rows,
        outputs=outputs,
        plots=plots,
        where=doc.where(("sweep",)) if model.sweep is not None else doc.where(()),  # type: ignore[attr-defined]
        locations=_locations(doc, [("defaults",), ("sweep",)], OPTION_FIELDS),
    )
