"""The Python API's boundary: every argument of :func:`kvplan.estimate`, :func:`kvplan.sweep` and
:func:`kvplan.check` is type-checked here, before any work, so a wrong-typed argument is an
:class:`~kvplan.errors.InputError` naming the function and the argument, never a ``TypeError`` from deep
inside (the docs promise :class:`~kvplan.errors.KvplanError` subclasses for all bad input).

Only types are checked here; values (``context="lots"``, an unknown GPU) are checked by the same parsers
the CLI and the YAML files use. Imports nothing heavy (``import kvplan`` stays cheap).

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits, kvplan.io, kvplan.options
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from kvplan.errors import InputError

PATH = (str, os.PathLike)
# What the Python API takes for each kind of option (kvplan.options.KINDS): the parsed spelling (``"8k"``,
# ``"24GiB"``) or the value itself. A test keeps this in step with KINDS.
KIND_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    **{kind: ((str,), "a string") for kind in ("text", "revision", "version", "gpu", "dtype", "kv_dtype",
                                               "weights_dtype", "ssm_dtype", "engine", "usage", "speculative")},
    **{kind: ((int, str), "an integer or a string such as '8k'") for kind in ("count", "tokens", "tokens_or_zero",
                                                                              "max_model_len")},
    **{kind: ((int, float, str), "a number of GiB or a string such as '24GiB'") for kind in ("size", "size_device",
                                                                                                 "size_or_zero")},
    "fraction": ((int, float, str), "a number such as 0.9"),
    "flag": ((bool,), "True or False"),
    "switch": ((bool,), "True or False"),
    "calibration": (PATH, "a calibration file path or a loaded Calibration"),
}
# Options fields given in base units (``gpu_count=2``, ``kv_budget_bytes=...``): the dataclass field's type.
FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"), "float": ((int, float), "a number"), "bool": ((bool,), "True or False"),
    "str": ((str,), "a string"),
}
YAML_SCALARS = (str, int, float, bool, type(None))


def require(function: str, name: str, value: Any, types: tuple[type, ...], expected: str) -> None:
    """Raise :class:`InputError` unless ``value`` is one of ``types`` (a bool is not a number here).

    The message names the call and the argument: ``kvplan.check(): capacity must be ..., got int 42``.
    """
    numeric = any(t in (int, float) for t in types) and bool not in types
    if isinstance(value, types) and not (numeric and isinstance(value, bool)):
        if isinstance(value, str) and "\x00" in value:
            raise InputError(f"kvplan.{function}(): {name} contains a NUL character")
        return
    from kvplan.io.yamldoc import short

    raise InputError(f"kvplan.{function}(): {name} must be {expected}, got {type(value).__name__} {short(value)}")


def refuse_unknown(function: str, given: Mapping[str, Any], known: Any) -> None:
    """Raise :class:`InputError` for the first keyword of ``given`` not in ``known``, naming the closest known
    one in the message itself (a Python caller sees ``str(error)``): ``kvplan.estimate(): unknown option
    'contxt'; did you mean 'context'?``."""
    import difflib

    known = sorted(known)
    for key in given:
        if key in known:
            continue
        near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        shown = ", ".join(known) if len(known) <= 8 else "the CLI flags with underscores: gpu, context, kv_dtype, ..."
        raise InputError(f"kvplan.{function}(): unknown option {key!r}" + (f"; did you mean {near[0]!r}?" if near else ""),
                         f"its options: {shown}")


def estimate_options() -> set[str]:
    """Every keyword :func:`kvplan.estimate` takes: the estimate options, :class:`~kvplan.options.Options`
    field names, and ``token``."""
    from dataclasses import fields

    from kvplan.options import OPTIONS, Options

    return {o.name for o in OPTIONS if o.in_options} | {f.name for f in fields(Options)} | {"token"}


def check_estimate(model: Any, token: Any, options: Mapping[str, Any]) -> None:
    """``kvplan.estimate(model, token=..., **options)``: each argument's type (``None`` = the option's default)."""
    refuse_unknown("estimate", options, estimate_options() - {"model"})
    require("estimate", "model", model, PATH, "a model id or a path (str or os.PathLike)")
    require("estimate", "token", token, (str, type(None)), "a string or None")
    _check_options("estimate", options)


def check_size(model: Any, concurrency: Any, context: Any, gpus: Any, tp: Any, at: Any, prices: Any, token: Any,
               options: Mapping[str, Any]) -> None:
    """``kvplan.size(model, concurrency=..., ...)``: each argument's type."""
    require("size", "model", model, PATH, "a model id or a path (str or os.PathLike)")
    require("size", "concurrency", concurrency, (int, str), "an integer or a string such as '200'")
    for name, value in (("context", context),):
        if value is not None:
            require("size", name, value, (int, str), "an integer or a string such as '8k'")
    for name, value in (("gpus", gpus), ("tp", tp)):
        if value is not None:
            require("size", name, value, (str, list, tuple), "a list or a comma-separated string")
    require("size", "at", at, (str,), "'low' or 'estimate'")
    if prices is not None:
        require("size", "prices", prices, PATH, "a price file path (str or os.PathLike)")
    require("size", "token", token, (str, type(None)), "a string or None")
    _check_options("size", options)


def option_type(key: str) -> tuple[tuple[type, ...], str]:
    """The types :func:`kvplan.estimate` takes for option ``key`` (an unknown key: anything, so that
    :func:`kvplan.options.options_from_values` names it)."""
    from dataclasses import fields

    from kvplan.options import BY_NAME, Options

    if key in BY_NAME:
        types, expected = KIND_TYPES[BY_NAME[key].kind]
        if BY_NAME[key].kind == "calibration":
            from kvplan.io.calibration import Calibration

            types = (*types, Calibration)
        return types, expected
    field_type = {f.name: str(f.type).removesuffix(" | None") for f in fields(Options)}.get(key)
    return FIELD_TYPES.get(field_type or "", ((object,), "anything"))


def check_run(function: str, offline: Any, token: Any, unknown: Mapping[str, Any] | None = None) -> None:
    """The keyword arguments :func:`kvplan.sweep` and :func:`kvplan.check` share (``unknown``: any others)."""
    refuse_unknown(function, unknown or {}, ("offline", "token"))
    require(function, "offline", offline, (bool,), "True or False")
    require(function, "token", token, (str, type(None)), "a string or None")


def document(function: str, name: str, source: Any) -> Any:
    """A what-if / capacity argument: a path (returned as given) or a mapping, returned as plain YAML data
    (dicts with string keys, lists, scalars). Anything else, nesting past the YAML reader's bound, or more
    values than it accepts is an :class:`InputError` naming where in ``source`` the bad value is."""
    from kvplan.io.yamldoc import MAX_YAML_DEPTH, MAX_YAML_VALUES

    require(function, name, source, (*PATH, Mapping), "a YAML file path (str or os.PathLike) or a mapping")
    if not isinstance(source, Mapping):
        return source
    count = 0
    done: dict[int, tuple[Any, int, int]] = {}  # id of a list / mapping met before -> (its plain copy, values, height)

    def counted(values: int) -> None:
        nonlocal count
        count += values
        if count > MAX_YAML_VALUES:
            raise InputError(f"kvplan.{function}(): {name} holds more than {MAX_YAML_VALUES:,} values")

    def plain(value: Any, where: tuple[Any, ...], depth: int) -> tuple[Any, int]:
        """``value`` as plain data, and how many levels it nests below itself. ``where`` is the path to ``value``
        as ``(parent's where, key)`` pairs, written out (:func:`_where`) only for an error: a million-value document
        made a million strings of its paths. A list or mapping met again (shared, as YAML's aliases share) counts
        its values again without another walk, unless it would nest past the bound here (the walk then says where)."""
        seen = done.get(id(value)) if isinstance(value, (Mapping, list, tuple)) else None
        if seen is not None and depth + seen[2] <= MAX_YAML_DEPTH:
            counted(seen[1])
            return seen[0], seen[2]
        start = count
        counted(1)
        if depth > MAX_YAML_DEPTH:
            raise InputError(f"kvplan.{function}(): {_where(where)} is nested more than {MAX_YAML_DEPTH} levels deep")
        height = 0
        if isinstance(value, Mapping):
            out: Any = {}
            for key, item in value.items():
                if not _plain_scalar(key, str):
                    require(function, f"a key of {_where(where)}", key, (str,), "a string")
                out[key], below = plain(item, (where, repr(key)), depth + 1)
                height = max(height, below + 1)
        elif isinstance(value, (list, tuple)):
            out = []
            for i, item in enumerate(value):
                copy, below = plain(item, (where, i), depth + 1)
                out.append(copy)
                height = max(height, below + 1)
        else:
            if not _plain_scalar(value, YAML_SCALARS):
                require(function, _where(where), value, YAML_SCALARS, "a string, number, bool, None, list or mapping")
            return value, 0
        done[id(value)] = out, count - start, height
        return out, height

    return plain(source, (None, name), 0)[0]


def _plain_scalar(value: Any, types: type | tuple[type, ...]) -> bool:
    """What :func:`require` accepts of ``types`` (ones that list ``bool`` or no number) without a word: one of them,
    and no NUL character in a string."""
    return isinstance(value, types) and not (isinstance(value, str) and "\x00" in value)


def _where(path: tuple[Any, ...]) -> str:
    """``(((None, 'doc'), "'sweep'"), 0)`` -> ``doc['sweep'][0]``: the argument's name, then each key or index."""
    parts = []
    while path[0] is not None:
        path, key = path
        parts.append(f"[{key}]")
    return path[1] + "".join(reversed(parts))


def _check_options(function: str, options: Mapping[str, Any]) -> None:
    """Each of ``kvplan.<function>()``'s option keywords has its option's type (``None`` = the option's default)."""
    for key, value in options.items():
        if value is not None:
            types, expected = option_type(key)
            require(function, key, value, types, expected)
