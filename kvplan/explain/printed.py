"""Numbers as a start-up log prints them: read with their bounds (a number no engine prints is Unreadable), and a
printed figure as the interval of +-half a unit in its last place.
"""

from __future__ import annotations

import re
from typing import Any

from kvplan.explain import lines as L
from kvplan.explain.startup_log import Unreadable
from kvplan.limits import MAX_SIZE_BYTES, MAX_TOKENS

_PRINTED_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]*)?")
MAX_LOGGED = MAX_TOKENS  # no count, length, size (GiB) or ratio a start-up log prints is larger
_MAX_DIGITS = 15  # a double holds 15 significant digits: more were not printed by the engine


def _checked(text: str, integer: bool, bound: int = MAX_LOGGED) -> str:
    """``text`` without its thousands separators, or :class:`Unreadable`: misplaced commas (``409,6001``),
    a fraction where a count belongs, more digits than a printed number has, past ``bound``."""
    plain = text.replace(",", "")
    digits = plain.lstrip("-").replace(".", "").lstrip("0")
    if (not _PRINTED_NUMBER.fullmatch(text) or (integer and "." in text) or len(digits) > _MAX_DIGITS
            or abs(float(plain)) > bound):
        raise Unreadable(text)
    return plain


def _num(text: str) -> float:
    return float(_checked(text, integer=False))


def _int(text: str) -> int:
    return int(_checked(text, integer=True))


def decimals(text: str) -> int:
    """Digits after the decimal point of a printed number (``"5.01"`` -> 2, ``"21.5"`` -> 1)."""
    return len(text.split(".", 1)[1]) if "." in text else 0


def printed_interval(value: float, digits: int = 2) -> tuple[float, float]:
    """The values that print as ``value`` with ``digits`` decimals: ``value +- 0.5 x 10**-digits``."""
    half = 0.5 * 10 ** -digits
    return value - half, value + half


_CONSTANT_KINDS = {"true": True, "false": False, "serve": "serve", "cpu": "cpu"}  # set by the line, read from no group


def _read(kind: str, text: str | None) -> Any:
    """One group of a :class:`kvplan.explain.lines.Line`, as its kind says."""
    if text is None:
        return None
    if kind == "word":
        return text
    if kind == "bool":
        return text == "True"
    if kind == "int":
        return _int(text)
    if kind == "bytes":
        return int(_checked(text, integer=True, bound=MAX_SIZE_BYTES)) / 2**30
    value = _num(text)
    return round(value / 1024, 4) if kind == "mib" else value


def _values(rule: L.Line, m: "re.Match[str]") -> list[Any]:
    out, group = [], 0
    for kind in rule.kinds:
        if kind in _CONSTANT_KINDS:
            out.append(_CONSTANT_KINDS[kind])
            continue
        group += 1
        out.append(_read(kind, m.group(group)))
    return out
