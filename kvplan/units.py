"""Units: byte sizes, token counts, dtypes and integer helpers.

Bytes are ``int`` everywhere inside kvplan. GiB (2**30) and GB (10**9) exist only at the edges:
parsing what a user typed and rendering what a user reads, always labelled.

May import: kvplan.errors, kvplan.frozen
"""

from __future__ import annotations

import math
import re

from kvplan.errors import InputError
from kvplan.frozen import frozen

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": KB, "kb": KB, "kib": KiB,
    "m": MB, "mb": MB, "mib": MiB,
    "g": GB, "gb": GB, "gib": GiB,
    "t": TB, "tb": TB, "tib": TiB,
}
_TOKEN_UNITS = {"": 1, "k": 1024, "m": 1024 * 1024}
_NUMBER = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e([+-]?[0-9]+))?\s*([a-zA-Z]*)\s*$")


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers (``-(-a // b)``)."""
    return -(-a // b)


def scaled(n: int, factor: float, *, ceil: bool = False) -> int:
    """``floor(n x factor)`` (or ``ceil``) exactly, for a finite ``factor``: the float's own ratio, so a
    factor of 1e300 is a huge integer, not an overflow, and 4 x 1.1 is 4.4, not 4.4000000000000004."""
    num, den = float(factor).as_integer_ratio()
    return cdiv(n * num, den) if ceil else n * num // den


def round_up(a: int, multiple: int) -> int:
    """``a`` rounded up to a multiple of ``multiple``."""
    return cdiv(a, multiple) * multiple


_SIZE_HINT = "write a size: a number with an optional unit, e.g. 80GB, 24GiB, 512MiB"
_TOKENS_HINT = "write a token count: a whole number, optionally with k or m (k = 1,024), e.g. 8192, 8k, 128k"


def _split_number(text: str, what: str, hint: str = _SIZE_HINT) -> tuple[float, str]:
    match = _NUMBER.match(str(text))
    if not match:
        raise InputError(f"invalid {what} {text!r}", hint)
    exponent = f"e{match.group(2)}" if match.group(2) else ""
    value = float(match.group(1) + exponent)  # 1e999 -> inf (checked below), not an OverflowError
    if not math.isfinite(value):
        raise InputError(f"invalid {what} {text!r}: not a finite number")
    return value, match.group(3).lower()


def check_number(value: object, name: str, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, integer: bool = False) -> int | float:
    """The one validator for numbers a user gives (CLI flags and YAML fields alike): ``value`` must be a
    finite number (an integer when ``integer``), ``>= low`` (``> low`` when ``low_open``) and ``<= high``.

    Returns it (an int stays an int); raises :class:`InputError` naming ``name`` and the value otherwise.
    NaN fails every check here (``nan <= 0`` is False, so a "must be positive" test alone lets it through).
    """
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise InputError(f"invalid {name} {shown}: expected {'an integer' if integer else 'a number'}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"invalid {name} {shown}: not a finite number")
    if low is not None and not (value > low if low_open else value >= low):
        raise InputError(f"invalid {name} {shown}: must be {'>' if low_open else '>='} {_bound(low)}")
    if high is not None and not value <= high:
        raise InputError(f"invalid {name} {shown}: must be <= {_bound(high)}")
    return value


def _bound(x: float) -> str:
    """A bound as people read it: ``2,592,000`` and ``9,007,199,254,740,992`` (not ``2.592e+06``), ``0.05``."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e18 else f"{x:,g}"


def parse_bytes(text: str | int | float, what: str = "size", shown: object = None) -> int:
    """Parse ``80GB`` (10**9), ``79.19GiB`` (2**30), ``512MiB``, ``1e9`` into a positive int of bytes.

    A bare number is bytes. Raises :class:`InputError` for garbage, zero or negative sizes; its message
    echoes ``shown`` (what the user typed) when given, else ``text``.
    """
    try:
        return _parse_bytes(text, what)
    except InputError as exc:
        if shown is None:
            raise
        raise InputError(exc.message.replace(f" {text!r}", f" {shown!r}", 1), exc.hint) from None


def _parse_bytes(text: str | int | float, what: str) -> int:
    if isinstance(text, bool):
        raise InputError(f"invalid {what} {text!r}")
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
        if not math.isfinite(value):
            raise InputError(f"invalid {what} {text!r}: not a finite number")
    else:
        value, unit = _split_number(text, what)
    if unit not in _SIZE_UNITS:
        raise InputError(f"invalid {what} {text!r}: unknown unit {unit!r}", "use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB")
    scaled = value * _SIZE_UNITS[unit]
    if not math.isfinite(scaled):  # 1e308 GiB overflows a float
        raise InputError(f"invalid {what} {text!r}: too large")
    result = math.ceil(scaled)
    if result <= 0:
        raise InputError(f"invalid {what} {text!r}: must be positive")
    return result


def parse_gib(text: str | int | float, what: str = "size") -> int:
    """Like :func:`parse_bytes`, but a bare number means GiB (for ``--weights-gib``, ``--kv-budget``)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return parse_bytes(f"{float(text)!r}GiB", what, shown=text)
    value, unit = _split_number(str(text), what)
    return parse_bytes(text if unit else f"{text}GiB", what, shown=text)


def parse_tokens(text: str | int, what: str = "token count") -> int:
    """Parse a token count: ``8192``, ``8k`` (= 8,192), ``128k`` (= 131,072), ``1m`` (= 1,048,576).

    ``k`` is 1024 for token counts, as context lengths are quoted (128k = 131,072). Must be positive.
    """
    if isinstance(text, bool):
        raise InputError(f"invalid {what} {text!r}")
    if isinstance(text, int):
        value, unit = float(text), ""
    else:
        value, unit = _split_number(str(text), what, _TOKENS_HINT)
    if unit not in _TOKEN_UNITS:
        raise InputError(f"invalid {what} {text!r}: unknown suffix {unit!r}", _TOKENS_HINT)
    result = value * _TOKEN_UNITS[unit]
    if result != int(result):
        raise InputError(f"invalid {what} {text!r}: not a whole number of tokens")
    if result <= 0:
        raise InputError(f"invalid {what} {text!r}: must be positive")
    return int(result)


def fmt_gib(n_bytes: int | float, digits: int = 2) -> str:
    """``1073741824`` -> ``'1.00 GiB'``."""
    return f"{n_bytes / GiB:,.{digits}f} GiB"


def rounded_parts(whole: int, parts: list[int], unit: int) -> list[int]:
    """``parts`` (bytes, summing to ``whole``) in units of ``unit`` bytes, each rounded down or up so that
    they sum to ``whole`` rounded (largest remainder): figures shown beside their total add up to it
    (``usable 72.87 = weights 14.96 + ... + KV budget 54.82``). Exact integer arithmetic."""
    assert sum(parts) == whole, "the parts must sum to the whole"
    target = (2 * whole + unit) // (2 * unit)  # round half up
    floors = [p // unit for p in parts]
    order = sorted(range(len(parts)), key=lambda i: parts[i] - floors[i] * unit, reverse=True)
    out = list(floors)
    for i in order[:max(0, target - sum(floors))]:
        out[i] += 1
    return out


def fmt_gb(n_bytes: int | float, digits: int = 2) -> str:
    """``80000000000`` -> ``'80.00 GB'``."""
    return f"{n_bytes / GB:,.{digits}f} GB"


def fmt_bytes(n_bytes: int | float) -> str:
    """Human binary size with its label: ``131072`` -> ``'128 KiB'``, ``1.5 * GiB`` -> ``'1.50 GiB'``."""
    sign = "-" if n_bytes < 0 else ""
    n = abs(n_bytes)
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            value = n / size
            text = f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"
            return f"{sign}{text} {unit}"
    return f"{sign}{int(n):,} B"


def plural(n: int | float, noun: str, plural_form: str | None = None) -> str:
    """``1 request``, ``2 requests``, ``1,024 blocks``: a count with its noun in the right number."""
    word = noun if n == 1 else (plural_form or noun + "s")
    return f"{n:,} {word}"


def fmt_seconds(seconds: float) -> str:
    """A duration as every output prints it: ``250 ms`` below a second, else ``3,600.0 s`` (one decimal, thousands
    separated), so two durations of one output never read in two formats."""
    return f"{seconds * 1000:,.0f} ms" if abs(seconds) < 1 else f"{seconds:,.1f} s"


def fmt_tokens(n: int) -> str:
    """``131072`` -> ``'131,072'``."""
    return f"{n:,}"


# ---------------------------------------------------------------------------------------------
# dtypes


@frozen
class DType:
    """A storage dtype for weights or the KV cache.

    ``bits`` per element; quantized formats with per-group scales add ``scale_bytes`` for every
    ``scale_group`` elements (``0`` = no per-group scales stored in the tensor).
    """

    name: str
    bits: int
    scale_group: int = 0
    scale_bytes: int = 0
    torch_name: str | None = None

    def nbytes(self, n_elements: int) -> int:
        """Exact bytes to store ``n_elements`` (packed bits rounded up, plus group scales)."""
        data = cdiv(n_elements * self.bits, 8)
        scales = cdiv(n_elements, self.scale_group) * self.scale_bytes if self.scale_group else 0
        return data + scales

    @property
    def is_quantized(self) -> bool:
        return self.bits < 16


FP32 = DType("float32", 32, torch_name="float32")
BF16 = DType("bfloat16", 16, torch_name="bfloat16")
FP16 = DType("float16", 16, torch_name="float16")
FP8_E4M3 = DType("fp8_e4m3", 8, torch_name="float8_e4m3fn")
FP8_E5M2 = DType("fp8_e5m2", 8, torch_name="float8_e5m2")
INT8 = DType("int8", 8, torch_name="int8")
# int4 KV: two values a byte plus one fp16 scale per 32 elements along head_dim (group quantisation).
INT4 = DType("int4", 4, scale_group=32, scale_bytes=2, torch_name="uint8")
# int4 weights (GPTQ/AWQ style): fp16 scale and packed zero per group of 128 -> modelled as 2 B / 128.
INT4_WEIGHTS = DType("int4", 4, scale_group=128, scale_bytes=2, torch_name="uint8")

# 4-bit float weight formats of quantized checkpoints (weights only, never a KV dtype): MXFP4 (e2m1 + one 8-bit
# exponent scale per 32 weights, gpt-oss' experts) and NVFP4 (e2m1 + one fp8 scale per 16 weights)
MXFP4 = DType("mxfp4", 4, scale_group=32, scale_bytes=1, torch_name="uint8")
NVFP4 = DType("nvfp4", 4, scale_group=16, scale_bytes=1, torch_name="uint8")
_WEIGHT_ALIASES: dict[str, DType] = {"mxfp4": MXFP4, "nvfp4": NVFP4}

_DTYPE_ALIASES: dict[str, DType] = {
    "float32": FP32, "fp32": FP32, "f32": FP32, "float": FP32,
    "bfloat16": BF16, "bf16": BF16,
    "float16": FP16, "fp16": FP16, "half": FP16, "f16": FP16,
    "fp8": FP8_E4M3, "fp8_e4m3": FP8_E4M3, "fp8_e4m3fn": FP8_E4M3, "float8_e4m3fn": FP8_E4M3, "e4m3": FP8_E4M3,
    "fp8_e5m2": FP8_E5M2, "float8_e5m2": FP8_E5M2, "e5m2": FP8_E5M2, "fp8_inc": FP8_E4M3,
    "int8": INT8, "i8": INT8,
    "int4": INT4, "i4": INT4,
}


def parse_dtype(name: str, what: str = "dtype", *, weights: bool = False) -> DType:
    """Look up a dtype by any common spelling (``bf16``, ``torch.bfloat16``, ``fp8_e4m3``...)."""
    key = str(name).strip().lower().removeprefix("torch.")
    if weights and key in _WEIGHT_ALIASES:
        return _WEIGHT_ALIASES[key]
    if key not in _DTYPE_ALIASES:
        raise InputError(f"unknown {what} {name!r}", "use one of fp32, bf16, fp16, fp8, fp8_e5m2, int8, int4")
    dtype = _DTYPE_ALIASES[key]
    return INT4_WEIGHTS if weights and dtype is INT4 else dtype
