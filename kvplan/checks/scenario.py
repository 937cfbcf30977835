"""YAML scenario files -> validated, frozen scenarios (capacity checks and what-if reports).

The schemas are pydantic models (``extra="forbid"``: a typo is an error, never a silently ignored key),
their fields built from the option table (:mod:`kvplan.checks.fields`); files are read and every mistake
located (file:line:col) by :mod:`kvplan.io.yamldoc`.

Only the ``check``, ``report`` and ``schema`` commands import this module (pydantic is not imported by
``import kvplan.cli.app``).
"""

from __future__ import annotations

import difflib
from dataclasses import field
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, create_model

from kvplan.errors import KvplanError, ScenarioError
from kvplan.options import AXIS_ORDER
from kvplan.io.kinds import CAPACITY, WHATIF
from kvplan.io.yamldoc import (ScenarioFileError, Where, YamlDoc, combine_errors, expect_kind, option_locations, read_yaml,
                               validate_doc)
from kvplan.checks.fields import (
    OPTION_FIELDS, Bool, Engine, GpuName, KvDType, Percent, PositiveInt, RequiredTokens, Requests, Text, Tokens,
    TokensOrZero, expect_type, finish_values, option_fields,
    option_values, set_fields,
)
from kvplan.frozen import frozen


def model_error(where: Where, prefix: str, name: str, exc: KvplanError) -> ScenarioFileError:
    """A model that cannot be resolved, located at its ``model:`` line, with the closest bundled ids."""
    from kvplan.model.sources import closest_bundled

    hint = exc.hint
    near = closest_bundled(str(name).split("/")[-1]) if not (hint and "closest" in hint) else []
    if near:
        hint = (f"{hint}; " if hint else "") + "closest bundled: " + ", ".join(near)
    return ScenarioFileError(where, f"{prefix}model {name!r}: {exc.message}", hint)


# ---------------------------------------------------------------------------------------------
# the schemas

_FORBID = ConfigDict(extra="forbid")
OptionsModel = create_model("Options", __config__=_FORBID, __doc__="Estimate options (any subset).", **option_fields())


class RequireModel(BaseModel):
    """What must hold for a check to pass (at least one key)."""

    model_config = _FORBID
    concurrency: Requests = Field(None, description="at least this many requests fit at once at the scenario's context")
    context: RequiredTokens = Field(None, description="at least this context fits at the scenario's batch (default: concurrency, else 1)")
    kv_tokens: RequiredTokens = Field(None, description="vLLM's 'GPU KV cache size' is at least this many tokens")
    headroom_pct: Percent = Field(None, description="at least this % of the KV pool is free after batch x context")
    fits: Bool = Field(None, description="batch x context fits (true) / does not fit (false)")
    engine_starts: Bool = Field(None, description="the engine starts at max_model_len (one request fits)")


CheckModel = create_model(
    "Check", __config__=_FORBID, __doc__="One named capacity check: options overriding defaults, plus require.",
    name=(Text, Field(..., description="unique name (one JUnit test case)")),
    description=(Text, Field(None, description="free text")),
    require=(RequireModel, Field(..., description="what must hold")),
    conservative=(Bool, Field(None, description="judge at the low end of kvplan's range (default: the file's)")),
    **option_fields(),
)


class CapacityModel(BaseModel):
    """A capacity file: `kvplan check capacity.yaml`."""

    model_config = _FORBID
    defaults: OptionsModel = Field(default_factory=OptionsModel, description="options shared by every check")  # type: ignore[valid-type]
    conservative: Bool = Field(None, description="judge every check at the low end of kvplan's range: the KV "
                               "budget less the spread measured on real start-ups (a check's own key wins)")
    checks: list[CheckModel] = Field(..., min_length=1, description="the checks (each a scenario with require)")  # type: ignore[valid-type]


SweepModel = create_model("Sweep", __config__=_FORBID, __doc__="Axes: any option as a non-empty list (cartesian product).",
                          **option_fields(lambda t: list[t], min_length=1))  # type: ignore[misc, valid-type]
ScenarioRowModel = create_model("Scenario", __config__=_FORBID, __doc__="One explicit row (options overriding defaults).",
                                name=(Text, Field(None, description="row label")), **option_fields())

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


OutputPath = expect_type("a file path ending in .md, .html, .csv or .json", _output, {"type": "string", "pattern": r"\.(md|html|csv|json)$"})
Plots = expect_type("true, false or a list of: concurrency, memory", _plots,
                    {"anyOf": [{"type": "boolean"}, {"type": "array", "items": {"enum": list(PLOTS)}, "minItems": 1}]})


class SizeModel(BaseModel):
    """One sizing question of a what-if file (``kvplan size``): the smallest deployments that hold it."""

    model_config = _FORBID
    name: Text = Field(None, description="label of this question in the report")
    model: Text = Field(None, description="model (default: defaults.model)")
    concurrency: PositiveInt = Field(..., description="requests that must run at once")
    context: Tokens = Field(None, description="tokens per request (default: defaults.context, else 8192)")
    prefix_tokens: TokensOrZero = Field(None, description="tokens of a prefix every request shares")
    gpus: list[GpuName] = Field(None, min_length=1, description="GPUs to search (default: the datacenter GPUs)")
    tp: list[PositiveInt] = Field(None, min_length=1, description="tp sizes to try (default: all within a node)")
    at: Literal["low", "estimate"] = Field(None, description="judge at the range's low end (default) or the estimate")
    prices: Text = Field(None, description="price file (GPU -> price per GPU-hour), relative to this file")
    kv_dtype: KvDType = Field(None, description="KV dtype (default: defaults.kv_dtype)")
    engine: Engine = Field(None, description="engine (default: defaults.engine)")
    engine_version: Text = Field(None, description="engine release (default: defaults.engine_version)")


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
    size: list[SizeModel] = Field(None, min_length=1, description="sizing questions (`kvplan size`): the smallest "  # type: ignore[valid-type]
                                  "deployments that hold N requests, in the report's size section")


SCHEMAS: dict[str, type[BaseModel]] = {"capacity": CapacityModel, "whatif": WhatIfModel}


SCHEMA_KINDS = ("capacity", "whatif", "workload")  # every YAML file kvplan reads (workload: kvplan simulate's)


def json_schema(kind: str, model: type[BaseModel] | None = None) -> dict[str, Any]:
    """The JSON Schema of a capacity or what-if file (for editors: yaml-language-server), or of ``model``
    (the workload file's, which :mod:`kvplan.sim.workload` owns) under ``kind``."""
    if kind not in SCHEMA_KINDS or (model is None and kind not in SCHEMAS):
        raise ScenarioError(f"unknown schema {kind!r}", "use one of: " + ", ".join(SCHEMA_KINDS))
    schema = (model or SCHEMAS[kind]).model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"kvplan {({'whatif': 'what-if'}).get(kind, kind)} file"
    return schema


# ---------------------------------------------------------------------------------------------
# the frozen results


@frozen
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


@frozen
class CheckScenario:
    """One capacity check: merged option values (``options_from_values`` keys) and its requirement.

    ``batch_given``: the scenario set ``batch`` (else the batch is the required concurrency, or 1).
    ``where``: the check's entry; ``locations``: key -> where that key's value was written.
    ``conservative``: judge the requirements at the low end of the plan's range.
    """

    name: str
    description: str | None
    values: Mapping[str, Any]
    require: Requirement
    batch_given: bool
    where: Where
    locations: Mapping[str, Where] = field(default_factory=dict)
    conservative: bool = False

    def where_of(self, key: str) -> Where:
        return self.locations.get(key, self.where)


@frozen
class CapacityFile:
    """A validated capacity file."""

    path: Path
    display: str
    checks: tuple[CheckScenario, ...]
    mistakes: tuple[ScenarioFileError, ...] = ()  # load_capacity(keep_going=True): the file's mistakes, to list
    # with those planning finds (:func:`kvplan.checks.capacity.run_checks`); ``checks`` are then the valid ones


def load_capacity(path: str | Path | YamlDoc, *, keep_going: bool = False) -> CapacityFile:
    """Read and validate a capacity file; raises :class:`ScenarioFileError` (file:line:col) listing every
    mistake of the file (up to :data:`kvplan.io.yamldoc.MAX_FILE_ERRORS`), not only the first.

    ``keep_going``: return the valid checks and the mistakes (``CapacityFile.mistakes``) instead, so that
    :func:`kvplan.checks.capacity.run_checks` lists them together with what only planning finds (an unknown model,
    contradicting options). A file that is not YAML, or whose defaults are invalid, still raises."""
    doc = path if isinstance(path, YamlDoc) else read_yaml(path)
    expect_kind(doc, CAPACITY)
    errors = _duplicate_names(doc)  # on the file as written: found even when other keys are invalid
    try:
        model = validate_doc(doc, CapacityModel)
        defaults, valid = set_fields(model.defaults), list(enumerate(model.checks))  # type: ignore[attr-defined]
    except ScenarioFileError as exc:
        errors.append(exc)
        defaults, valid = _valid_parts(doc)  # the checks the schema accepts are still checked below
        if valid is None:  # invalid defaults: no check can be read without them
            raise combine_errors(errors) from None
    checks: list[CheckScenario] = []
    raw = doc.data if isinstance(doc.data, dict) else {}
    conservative = raw.get("conservative") is True
    for i, check in valid:
        try:
            checks.append(_check_scenario(doc, i, check, defaults, conservative))
        except ScenarioFileError as exc:
            errors.append(exc)
    if errors and not keep_going:
        raise combine_errors(errors)
    return CapacityFile(doc.path, doc.display, tuple(checks), tuple(errors))


def _valid_parts(doc: YamlDoc) -> tuple[dict[str, Any], list[tuple[int, Any]] | None]:
    """In a file the schema rejects: the defaults and the checks that are valid alone (``None`` when the
    defaults are not valid: every check depends on them)."""
    from pydantic import ValidationError

    data = doc.data if isinstance(doc.data, dict) else {}
    try:
        defaults = set_fields(OptionsModel.model_validate(data.get("defaults") or {}))
    except ValidationError:
        return {}, None
    valid = []
    for i, raw in enumerate(data.get("checks") if isinstance(data.get("checks"), list) else []):
        try:
            valid.append((i, CheckModel.model_validate(raw)))
        except ValidationError:
            continue
    return defaults, valid


def _duplicate_names(doc: YamlDoc) -> list[ScenarioFileError]:
    """A mistake per check whose name an earlier check has (names as validated: stripped)."""
    checks = doc.data.get("checks") if isinstance(doc.data, dict) else None
    first: dict[str, int] = {}
    errors = []
    for i, check in enumerate(checks if isinstance(checks, list) else []):
        name = check.get("name") if isinstance(check, dict) else None
        if not isinstance(name, str) or not name.strip():
            continue
        name = name.strip()
        if name in first:
            errors.append(doc.error(("checks", i, "name"), f"duplicate check name {name!r} (first at checks[{first[name]}], "
                                    f"line {doc.where(('checks', first[name], 'name')).line})", "check names must be unique"))
        else:
            first[name] = i
    return errors


def _check_scenario(doc: YamlDoc, i: int, check: Any, defaults: dict[str, Any],
                    conservative: bool = False) -> CheckScenario:
    """The validated ``checks[i]`` merged with the defaults; ScenarioFileError for what the schema cannot say."""
    require = Requirement(**{k: getattr(check.require, k) for k in check.require.model_fields_set
                             if getattr(check.require, k) is not None})
    if not require.items():
        raise doc.error(("checks", i, "require"), "nothing required",
                        "add one of: concurrency, context, kv_tokens, headroom_pct, fits, engine_starts")
    values = option_values({**defaults, **set_fields(check)})
    if not values.get("model"):
        raise doc.error(("checks", i), f"check {check.name!r} names no model", "set model in defaults or in the check")
    return CheckScenario(
        name=check.name,
        description=check.description,
        values=finish_values(values),
        require=require,
        batch_given="batch" in values,
        where=doc.where(("checks", i)),
        locations=option_locations(doc, [("defaults",), ("checks", i)], OPTION_FIELDS),
        conservative=conservative if check.conservative is None else bool(check.conservative),
    )


@frozen
class Axis:
    """One sweep group: option names that vary together and their values (one tuple per step)."""

    names: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]
    where: Where


@frozen
class ExplicitRow:
    """An explicit ``scenarios`` row: its label and merged values."""

    name: str | None
    values: Mapping[str, Any]
    where: Where


@frozen
class SizeQuestion:
    """A ``size:`` entry: :func:`kvplan.planning.size.size_model`'s arguments (defaults filled in) and where it
    is."""

    name: str
    model: str
    concurrency: int
    context: Any
    arguments: Mapping[str, Any]
    where: Where


@frozen
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
    sizes: tuple[SizeQuestion, ...] = ()  # the ``size:`` questions

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
    expect_kind(doc, WHATIF)
    model: Any = validate_doc(doc, WhatIfModel)
    defaults = option_values(set_fields(model.defaults))
    axes_values = _sweep_values(doc, model.sweep)
    if model.sweep is None and not model.scenarios:
        raise doc.error((), "nothing to report: no sweep and no scenarios", "add `sweep:` axes or `scenarios:` rows")
    axes = _axes(doc, axes_values, model.zip or [])
    rows = tuple(
        ExplicitRow(row.name, finish_values({**defaults, **option_values(set_fields(row))}), doc.where(("scenarios", i)))
        for i, row in enumerate(model.scenarios or [])
    )
    if not (defaults.get("model") or "model" in axes_values):
        if axes_values:
            raise doc.error(("sweep",), "no model: set model in defaults or sweep it", "e.g. `defaults: {model: meta-llama/Llama-3.1-8B}`")
    for i, row in enumerate(rows):
        if not row.values.get("model"):
            raise doc.error(("scenarios", i), "no model for this row", "set model in defaults or in the row")
    return WhatIfFile(
        path=doc.path,
        display=doc.display,
        title=model.title or doc.path.stem,
        description=model.description,
        defaults=finish_values(dict(defaults)) if "gpu" not in axes_values and "gpu_memory" not in axes_values else dict(defaults),
        axes=axes,
        scenarios=rows,
        outputs=_outputs(doc, model.outputs or []),
        plots=PLOTS if model.plots is None else model.plots,
        where=doc.where(("sweep",)) if model.sweep is not None else doc.where(()),
        locations=option_locations(doc, [("defaults",), ("sweep",)], OPTION_FIELDS),
        sizes=tuple(_size_question(doc, i, q, defaults) for i, q in enumerate(model.size or [])),
    )


def _size_question(doc: YamlDoc, index: int, q: Any, defaults: Mapping[str, Any]) -> SizeQuestion:
    """A ``size:`` entry with the file's defaults for what it leaves out (model, context, dtype, engine)."""
    given = {k: getattr(q, k) for k in q.model_fields_set}
    model = given.get("model") or defaults.get("model")
    if not model:
        raise doc.error(("size", index), "no model for this sizing question", "set model here or in defaults")
    arguments: dict[str, Any] = {}
    for key in ("prefix_tokens", "kv_dtype", "engine", "engine_version", "revision", "offline"):
        value = given.get(key, defaults.get(key))
        if value is not None:
            arguments[key] = value
    if given.get("gpus"):
        arguments["gpus"] = list(given["gpus"])
    if given.get("tp"):
        arguments["tps"] = list(given["tp"])
    if given.get("at"):
        arguments["at"] = given["at"]
    if given.get("prices"):
        arguments["prices"] = str((doc.path.parent / given["prices"]).resolve())
    context = given.get("context", defaults.get("context"))
    name = given.get("name") or f"{given['concurrency']} x {model}"
    return SizeQuestion(name, str(model), given["concurrency"], context, arguments, doc.where(("size", index)))


def _sweep_values(doc: YamlDoc, sweep: Any) -> dict[str, list[Any]]:
    """The sweep's axes, in file order: option name -> its values (a ``sweep:`` with none is an error)."""
    if sweep is None:
        return {}
    values = {k: list(getattr(sweep, k)) for k in sweep.model_fields_set if getattr(sweep, k) is not None}
    if not values:
        raise doc.error(("sweep",), "empty sweep: no axes", "add an axis such as `context: [4k, 8k, 32k]`, or remove sweep")
    return values


def _axes(doc: YamlDoc, axes_values: dict[str, list[Any]], zips: list[list[str]]) -> tuple[Axis, ...]:
    """The sweep's axes: one per option, and one per ``zip`` group (options that advance together), in
    the canonical nesting (:data:`kvplan.options.AXIS_ORDER`)."""
    groups, used = _zip_groups(doc, axes_values, zips)
    axes = [Axis((name,), tuple((v,) for v in values), doc.where(("sweep", name)))
            for name, values in axes_values.items() if name not in used]
    for group in groups:
        axes.append(Axis(group, tuple(zip(*(axes_values[n] for n in group))), doc.where(("sweep", group[0]))))
    axes.sort(key=lambda a: max(AXIS_ORDER.index(n) for n in a.names))
    return tuple(axes)


def _zip_groups(doc: YamlDoc, axes_values: dict[str, list[Any]],
                zips: list[list[str]]) -> tuple[list[tuple[str, ...]], dict[str, int]]:
    """The ``zip`` groups, checked (two or more sweep axes each, each axis in one group, equal lengths),
    and which group each zipped axis is in."""
    groups: list[tuple[str, ...]] = []
    used: dict[str, int] = {}
    for gi, group in enumerate(zips):
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
    return groups, used


def _outputs(doc: YamlDoc, outputs: list[str]) -> tuple[Path, ...]:
    """The ``outputs`` paths, resolved against the file's folder (one listed twice is an error)."""
    base = doc.path.resolve().parent
    paths = tuple(base / p for p in outputs)
    seen: dict[Path, int] = {}
    for i, out in enumerate(paths):
        if out in seen:
            raise doc.error(("outputs", i), f"output {str(outputs[i])!r} listed twice")
        seen[out] = i
    return paths
