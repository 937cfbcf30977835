"""``kvplan estimate MODEL --gpu H100,H200,MI300X``: one plan per value of a listed option (never prints, never
exits).

The options :data:`COMPARED` (``--gpu``, ``--tp``, ``--kv-dtype``, ``--context``) take a comma-separated list;
the other options stay as given. Every combination of the listed values (axes in that order, at most
:data:`MAX_ROWS`) is planned through :func:`kvplan.planning.plan.estimate`, the model resolved once; a combination
the options or the engine reject is a row with its one-line error instead of a plan, so one bad value does not
hide the others.
"""

from __future__ import annotations

from itertools import product
from typing import Any

from kvplan.errors import InputError, KvplanError
from kvplan.options import OPTIONS
from kvplan.planning.plan import Plan, estimate, options_from_values
from kvplan.frozen import frozen

COMPARED = tuple(o.name for o in OPTIONS if o.compare)  # the options a list of values compares (the table's)
MAX_ROWS = 64


@frozen
class Row:
    """One combination: the listed options' values as typed, and its plan or why there is none."""

    values: tuple[tuple[str, str], ...]
    plan: Plan | None
    error: str | None = None


@frozen
class Comparison:
    """The rows of a comparison, in the order of the values given (the first axis outermost)."""

    axes: tuple[str, ...]
    rows: tuple[Row, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": 1, "axes": list(self.axes),
                "rows": [{"values": dict(r.values), "plan": r.plan.to_dict() if r.plan else None, "error": r.error}
                         for r in self.rows]}


def listed_axes(values: dict[str, Any]) -> dict[str, list[str]]:
    """The :data:`COMPARED` options given a comma-separated list, with their values (``{}``: a single plan)."""
    out: dict[str, list[str]] = {}
    for name in COMPARED:
        value = values.get(name)
        if isinstance(value, str) and "," in value:
            items = [v.strip() for v in value.split(",")]
            if any(not v for v in items):
                raise InputError(f"invalid --{name.replace('_', '-')} {value!r}: an empty value in the list",
                                 "separate values with commas: --gpu H100,H200")
            out[name] = list(dict.fromkeys(items))
    return out


def compare(values: dict[str, Any], token: str | None = None) -> Comparison:
    """Plan every combination of the listed values of ``values`` (option name -> as typed, ``model`` included)."""
    axes = listed_axes(values)
    if not axes:
        raise InputError("nothing to compare: no option holds a comma-separated list",
                         "e.g. --gpu H100,H200 or --tp 1,2,4 (" + ", ".join(f"--{n.replace('_', '-')}" for n in COMPARED)
                         + " take lists)")
    count = 1
    for items in axes.values():
        count *= len(items)
    if count > MAX_ROWS:
        raise InputError(f"{count:,} combinations to compare, past the bound of {MAX_ROWS}",
                         "list fewer values, or use a what-if file (kvplan report) for a sweep")
    rows = []
    for combo in product(*axes.values()):
        chosen = tuple(zip(axes, combo))
        try:
            plan = estimate(options_from_values({**values, **dict(chosen)}), token=token)
        except KvplanError as exc:
            if not rows and _model_error(exc):
                raise  # the model itself: every row would say the same
            rows.append(Row(chosen, None, exc.one_line()))
            continue
        rows.append(Row(chosen, plan))
    return Comparison(tuple(axes), tuple(rows))


def _model_error(exc: KvplanError) -> bool:
    from kvplan.errors import ConfigError, HubError, ModelNotFoundError

    return isinstance(exc, (ModelNotFoundError, HubError, ConfigError))
