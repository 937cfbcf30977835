"""The YAML projection of the option table: each kind of option value (:data:`kvplan.options.KINDS`) as
a pydantic field type with one validator (its message says what was expected) and a JSON-Schema
description, and every estimate option a scenario file may set (:data:`OPTION_FIELDS`).

Option keys come from the option table (:data:`kvplan.options.OPTIONS`: the CLI flag names with
underscores; ``gpus`` for ``--gpus``) and take the same spellings (``8k``, ``24GiB``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Callable, Mapping

from pydantic import AfterValidator, BaseModel, Field, PlainValidator, WithJsonSchema

from kvplan.errors import InputError, KvplanError
from kvplan.limits import MAX_COUNT, MAX_TOKENS
from kvplan.options import ENGINE_NAMES, SPECULATIVE_METHODS, USAGE_CONTEXTS, YAML_OPTIONS, Opt

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


def _gpu_count(value: Any) -> int:
    """``gpus``: a number of GPUs; a GPU's name here is the ``gpu`` key mistyped."""
    if isinstance(value, str) and value.strip():
        from kvplan.errors import GpuNotFoundError
        from kvplan.gpus import find_gpu

        try:
            find_gpu(value)
        except GpuNotFoundError:
            raise ValueError from None
        raise InputError("a GPU's name, not a number of GPUs", "did you mean gpu? gpus is how many")
    return _positive_int(value)


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


def _speculative(value: Any) -> str:
    if value not in SPECULATIVE_METHODS:
        raise ValueError
    return value


def expect_type(kind: str, check: Callable[[Any], Any], schema: dict[str, Any]) -> Any:
    """A field type: ``check`` validates (raising ValueError/TypeError/KvplanError), ``kind`` says what was
    expected (in the error and in the JSON Schema's description)."""
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
PositiveInt = expect_type("a positive integer", _positive_int, {"type": "integer", "minimum": 1})
Tokens = expect_type("a token count such as 8192, 8k or 128k", _tokens(False), _TOKENS_SCHEMA)
TokensOrZero = expect_type("a token count (0 or more) such as 0, 512 or 2k", _tokens(True), _TOKENS_SCHEMA)
Size = expect_type("a positive size: GiB as a number (24) or with a unit (24GiB, 80GB)", _size(False), _SIZE_SCHEMA)
SizeOrZero = expect_type("a size of 0 or more: GiB as a number or with a unit (0, 1.5GiB)", _size(True), _SIZE_SCHEMA)
Fraction = expect_type("a number in (0, 1], e.g. 0.9", _fraction, {"type": "number", "exclusiveMinimum": 0, "maximum": 1})
Percent = expect_type("a percentage in [0, 100), e.g. 10", _percent, {"type": "number", "minimum": 0, "exclusiveMaximum": 100})
Text = expect_type("a non-empty string", _text, {"type": "string", "minLength": 1})
Revision = expect_type("a Hub revision (branch, tag or commit)", _revision, {"type": "string", "minLength": 1})
Bool = expect_type("true or false", _bool, {"type": "boolean"})
ModelDType = expect_type("a dtype: auto, fp32, bf16, fp16", _dtype(True), {"type": "string"})
KvDType = expect_type("a KV dtype: auto, bf16, fp16, fp8, fp8_e5m2, int8, int4", _dtype(True), {"type": "string"})
WeightsDType = expect_type("a weights dtype: bf16, fp16, fp8, int8, int4", _dtype(False, weights=True), {"type": "string"})
GpuName = expect_type("a GPU from the catalogue (`kvplan gpus`)", _gpu, {"type": "string"})
Engine = expect_type("an engine: " + " or ".join(ENGINE_NAMES), _engine, {"type": "string", "enum": list(ENGINE_NAMES)})
UsageContext = expect_type("serve (`vllm serve`) or llm (the LLM class)", _usage, {"type": "string", "enum": list(USAGE_CONTEXTS)})
Speculative = expect_type("a speculative decoding method: " + ", ".join(SPECULATIVE_METHODS), _speculative,
                          {"type": "string", "enum": list(SPECULATIVE_METHODS)})

def at_most(typ: Any, high: int, size: bool = False) -> Any:
    """``typ`` that also holds its value to at most ``high`` (base units: a size is parsed to bytes), the bound
    the CLI flag has (:attr:`kvplan.options.Opt.limit`): a YAML value past it is reported at its own key."""
    def check(value: Any) -> Any:
        from kvplan.units import fmt_bytes, parse_gib

        n = parse_gib(value) if size else value
        if isinstance(n, (int, float)) and not isinstance(n, bool) and n > high:
            most = fmt_bytes(high) if size else f"{high:,}"
            raise ValueError(f"must be at most {most} (a value this large is a typo or a unit mix-up)")
        return value

    return Annotated[typ, AfterValidator(check)]


def option_type(opt: Opt) -> Any:
    """The YAML type of one option: its kind's (:data:`KIND_TYPES`, ``gpus``: :data:`NAMED_TYPES`), bounded by
    the option's limit where it has one."""
    typ = NAMED_TYPES.get(opt.name, KIND_TYPES[opt.kind])
    return typ if opt.limit is None else at_most(typ, opt.limit, size=opt.kind.startswith("size"))


# the YAML type of each kind of option (kvplan.options.KINDS)
KIND_TYPES: dict[str, Any] = {
    "text": Text, "revision": Revision, "version": Text, "gpu": GpuName, "dtype": ModelDType, "kv_dtype": KvDType,
    "weights_dtype": WeightsDType, "ssm_dtype": ModelDType, "engine": Engine, "usage": UsageContext,
    "count": PositiveInt, "tokens": Tokens, "tokens_or_zero": TokensOrZero, "max_model_len": Tokens, "size": Size,
    "size_device": Size, "size_or_zero": SizeOrZero, "fraction": Fraction, "flag": Bool, "switch": Bool, "calibration": Text,
    "speculative": Speculative,
}
# Every estimate option a scenario may set, from the option table: name -> (type, description). Keys are
# those of kvplan.options.options_from_values (the CLI flags with underscores; `gpus` = --gpus).
GpuCount = expect_type("a positive integer (the number of GPUs)", _gpu_count, {"type": "integer", "minimum": 1})
NAMED_TYPES: dict[str, Any] = {"gpus": GpuCount}  # options whose YAML type is not their kind's
OPTION_FIELDS: dict[str, tuple[Any, str]] = {o.name: (option_type(o), o.help) for o in YAML_OPTIONS}
# a requirement's bound is that of the option it becomes or is compared with (``concurrency`` is the batch)
Requests = at_most(PositiveInt, MAX_COUNT)
RequiredTokens = at_most(Tokens, MAX_TOKENS)


def option_fields(wrap: Callable[[Any], Any] = lambda t: t, min_length: int | None = None) -> dict[str, Any]:
    """:data:`OPTION_FIELDS` as ``create_model`` fields (each optional; ``wrap`` the type: ``list[t]`` for a sweep)."""
    return {name: (wrap(typ), Field(None, description=desc, min_length=min_length))
            for name, (typ, desc) in OPTION_FIELDS.items()}


# ---------------------------------------------------------------------------------------------
# scenario keys -> option values


def option_values(fields_set: Mapping[str, Any]) -> dict[str, Any]:
    """Scenario keys -> :func:`kvplan.planning.plan.options_from_values` keys (``gpus`` -> ``gpu_count``)."""
    return {("gpu_count" if k == "gpus" else k): v for k, v in fields_set.items()}


def set_fields(model: BaseModel) -> dict[str, Any]:
    """The estimate options a validated section of a file sets (its other keys left out)."""
    return {k: getattr(model, k) for k in model.model_fields_set if k in OPTION_FIELDS}


def finish_values(values: dict[str, Any]) -> dict[str, Any]:
    """Defaults that every scenario shares with ``kvplan estimate`` (the GPU defaults to H100)."""
    if values.get("gpu") is None and values.get("gpu_memory") is None:
        values["gpu"] = "H100"
    return values


# ---------------------------------------------------------------------------------------------
# a planning error in a file's words


def _flag_keys() -> list[tuple[re.Pattern[str], str]]:
    """Each CLI spelling of a file option (``--kv-budget``, ``--tensor-parallel-size``, ``--no-prefix-caching``) ->
    the file's key, longest first (so ``--gpu-memory`` is not read as ``--gpu``)."""
    pairs = []
    for opt in YAML_OPTIONS:
        for flag in opt.cli_flags:
            for spelling in flag.split("/"):
                if spelling.startswith("--"):
                    pairs.append((spelling, opt.name))
    pairs.sort(key=lambda p: -len(p[0]))
    return [(re.compile(rf"(?<![\w-]){re.escape(flag)}(?![\w-])"), key) for flag, key in pairs]


FLAG_KEYS = _flag_keys()


def in_file_words(text: str | None) -> str | None:
    """A planning message (or hint) of a file's scenario with each CLI flag written as the file's key
    (``--kv-budget 90.00 GiB does not fit`` -> ``kv_budget 90.00 GiB does not fit``): the file has no flags."""
    if not text:
        return text
    for pattern, key in FLAG_KEYS:
        text = pattern.sub(key, text)
    return text


# keys a message may name as they are (the engine's own names: ``max_num_batched_tokens 16 is below ...``); only
# those with an underscore, which no other word of a message is
_NAMED_KEYS = [(re.compile(rf"(?<![\w-]){o.name}(?![\w-])"), o.name) for o in YAML_OPTIONS if "_" in o.name]


def first_key(text: str) -> str | None:
    """The file key of the first CLI flag ``text`` names (else of the first key it names as it is), where the
    error is located, as the scenario's locations name it (``gpus`` -> ``gpu_count``), or None."""
    hits = [(m.start(), key) for pattern, key in FLAG_KEYS for m in [pattern.search(text)] if m]
    hits = hits or [(m.start(), key) for pattern, key in _NAMED_KEYS for m in [pattern.search(text)] if m]
    if not hits:
        return None
    key = min(hits)[1]
    return "gpu_count" if key == "gpus" else key
