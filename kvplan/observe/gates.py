"""``--require`` gates on an observation: ``'usage_peak < 0.95'``, ``'preemptions == 0'``, ``'prefix_hit_rate > 0.5'``.

An expression is ``NAME OP NUMBER``: OP one of ``< <= > >= == !=``; NUMBER may end in ``%`` (``95%``
is 0.95 for fractions, 10 for ``headroom_pct``). NAME is a key of the summary (``kv_cache_usage_peak``,
``running_peak``, ``preemptions``, ...), a short alias (``usage_peak``), or ``headroom_pct`` — the
``kvplan check`` requirement, here the % of the pool still free at the observed peak. Each gate becomes a
:class:`kvplan.checks.capacity.Outcome`, as ``kvplan check``'s requirements do; a metric the server did not
report fails its gate (a CI gate must not pass on nothing).
"""

from __future__ import annotations

import difflib
import operator
import re
from typing import Any, Callable

from kvplan.errors import InputError
from kvplan.observe.track import Summary
from kvplan.frozen import frozen

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt,
}
_EXPR = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|==|!=|<|>)\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(%?)\s*$")

ALIASES = {"usage_now": "kv_cache_usage_now", "usage_mean": "kv_cache_usage_mean", "usage_peak": "kv_cache_usage_peak"}
FRACTIONS = frozenset({"kv_cache_usage_now", "kv_cache_usage_mean", "kv_cache_usage_peak", "prefix_hit_rate",
                       "prefix_hit_rate_during_run"})
NUMERIC = tuple(name for name in Summary.__dataclass_fields__ if name not in ("prefix_hit_rate_source",))


def headroom_pct(summary: Summary) -> float | None:
    """% of the pool free at the observed usage peak (``kvplan check``'s headroom, measured)."""
    peak = summary.kv_cache_usage_peak
    return None if peak is None else 100.0 * (1.0 - peak)


def _measure(name: str) -> Callable[[Summary], Any]:
    if name == "headroom_pct":
        return headroom_pct
    return lambda s: getattr(s, name)


@frozen
class Gate:
    """One parsed ``--require`` expression; ``name``: the summary key it reads."""

    text: str
    name: str
    op: str
    value: float

    def unit(self) -> str:
        return "%" if self.name == "headroom_pct" else ""


def parse_gate(text: str) -> Gate:
    """Parse ``NAME OP NUMBER``; raises :class:`InputError` (exit 2) naming what is wrong."""
    m = _EXPR.match(text)
    if not m:
        raise InputError(f"invalid --require {text!r}", "write NAME OP NUMBER, e.g. 'usage_peak < 0.95' or 'preemptions == 0'")
    raw, op, number, pct = m.groups()
    name = ALIASES.get(raw, raw)
    known = (*NUMERIC, *ALIASES, "headroom_pct")
    if name not in NUMERIC and name != "headroom_pct":
        close = difflib.get_close_matches(raw, known, n=1)
        raise InputError(f"unknown --require metric {raw!r}",
                         f"did you mean {close[0]!r}?" if close else "use one of: " + ", ".join(sorted(known)))
    value = float(number)
    if pct and name != "headroom_pct":
        if name not in FRACTIONS:
            raise InputError(f"invalid --require {text!r}: {raw} is not a fraction, so it takes no %")
        value /= 100.0
    return Gate(text.strip(), name, op, value)


def evaluate(gate: Gate, summary: Summary, failed_polls: int = 0, polls: int = 0):  # noqa: ANN201 - kvplan.checks.capacity.Outcome
    """The gate against the run's summary, as a :class:`kvplan.checks.capacity.Outcome`. ``failed_polls``
    of ``polls`` did not read the endpoint: then the gate fails whatever the summary says (the figure is
    not known for those polls: a server that stopped answering must not pass a gate on what came before)."""
    from kvplan.checks.capacity import Outcome, format_value

    actual = _measure(gate.name)(summary)
    unit = gate.unit()
    if failed_polls:
        shown = "not reported" if actual is None else format_value(
            round(actual, 6) if isinstance(actual, float) else actual, unit)
        return Outcome(gate.text, gate.value, actual, None, unit, False,
                       f"{gate.text}: failed: {failed_polls:,} of {polls:,} polls did not read the endpoint, so "
                       f"{gate.name} ({shown} over the polls that did) is not known for the run")
    if actual is None:
        return Outcome(gate.text, gate.value, None, None, unit, False,
                       f"{gate.text}: failed: the server did not report {gate.name} (see the events)")
    if isinstance(actual, float):  # decimal page values carry binary noise (100 x (1 - 0.9) = 9.999...98)
        actual = round(actual, 9)
    passed = _OPS[gate.op](actual, gate.value)
    if isinstance(actual, float):
        actual = int(actual) if actual.is_integer() and unit != "%" else round(actual, 6)
    shown = format_value(actual, unit)
    return Outcome(gate.text, gate.value, actual, round(actual - gate.value, 6), unit, passed,
                   f"{gate.text}: {'ok' if passed else 'failed'}: {gate.name} is {shown}")
