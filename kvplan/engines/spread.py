"""How sure kvplan is: the spread of the KV budget per release family, tp and engine, measured on real start-ups.

``benchmarks/corpus_agreement.py --write-spread`` plans every start of the *calibration* part of the corpus of
real start-up logs (benchmarks/corpus/) from its inputs and records, per class, how far the engine's KV budget
per GPU fell below and rose above kvplan's (GiB): the 90th percentiles of the shortfall (``over``: kvplan
promised more) and of the excess (``under``). A plan's range is its KV budget less ``over`` and plus ``under``
(:mod:`kvplan.planning.kv_range`); the validation part of the corpus checks that the range holds the logged
value (docs/engines.md). A class with fewer than :data:`MIN_LOGS` logs falls back to its release family, then
to the engine.

The data lives in ``kvplan/data/kv_spread.yaml``; this module only reads it (once, lazily).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvplan.engines import release_tuple
from kvplan.units import GiB

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "kv_spread.yaml"
MIN_LOGS = 8
MIN_ENGINE_LOGS = 3  # an engine with fewer calibration logs than MIN_LOGS still gets its engine-wide spread
# A weights term counted from the parameters and a weights dtype (no checkpoint size: --weights-dtype on a 16-bit
# spec) is rough: calibration logs load 13 - 17% more than that estimate (vllm-f33676930891, an fp8 Qwen3-Next;
# vllm-f51900802258, an NVFP4 Qwen3.6): the low end allows this much more of it.
ROUGH_WEIGHTS_FRACTION = 0.15
FLOOR_BYTES = round(0.05 * GiB)  # the narrowest spread kept on either side (printed GiB figures are 0.01 precise)

# release families: the releases whose budget arithmetic is alike (first release, name)
FAMILIES: dict[str, tuple[tuple[tuple[int, int, int], str], ...]] = {
    "vllm": (((0, 6, 0), "V0 0.6 - 0.7"), ((0, 8, 0), "V1 0.8 - 0.10"), ((0, 11, 0), "V1 0.11 - 0.19"),
             ((0, 20, 0), "V1 0.20+")),
    "sglang": (((0, 3, 0), "0.3 - 0.4.7"), ((0, 4, 8), "0.4.8 - 0.5.2"), ((0, 5, 3), "0.5.3+")),
}


def family(engine: str, version: str) -> str:
    """The release family of ``version`` (a modelled release or any version it covers)."""
    release = release_tuple(version, engine)
    return next(name for first, name in reversed(FAMILIES[engine]) if release >= first) if release >= \
        FAMILIES[engine][0][0] else FAMILIES[engine][0][1]


def tp_bucket(tp: int) -> str:
    """``tp 1``, ``tp 2``, ``tp 4 - 8`` or ``tp 16+``: where non-torch memory differs most."""
    return "tp 1" if tp == 1 else "tp 2" if tp == 2 else "tp 4 - 8" if tp <= 8 else "tp 16+"


@dataclass(frozen=True)
class Spread:
    """How far the engine's KV budget per GPU may fall below (``over_bytes``) or rise above (``under_bytes``)
    kvplan's, and the class and number of logs it was measured on."""

    over_bytes: int
    under_bytes: int
    logs: int
    basis: str

    @property
    def source(self) -> str:
        """``-1.98 / +0.63 GiB: 90th percentiles of 20 real start-up logs (vllm, tp 1)`` (the logs: the calibration
        part of benchmarks/corpus; docs/engines.md)."""
        return (f"-{self.over_bytes / GiB:.2f} / +{self.under_bytes / GiB:.2f} GiB: 90th percentiles of "
                f"{self.logs} real start-up logs ({self.basis})")


@lru_cache(maxsize=1)
def _table() -> tuple[dict[str, Any], ...]:
    from kvplan.io.files import parse_bundled_yaml, read_text

    doc = parse_bundled_yaml(read_text(DATA_FILE), DATA_FILE)
    return tuple(doc.get("classes") or ())


def rough_weights(source: str) -> bool:
    """Whether a weights term's source says it was counted from parameters x a dtype, not a checkpoint's size."""
    return "parameters x" in source and "checkpoint" not in source


def spread(engine: str, version: str, tp: int) -> Spread | None:
    """The spread of the class (engine, release family, tp), else of (engine, tp), else the engine's (None: no
    data); classes of fewer than :data:`MIN_LOGS` logs are skipped (the engine-wide row needs
    :data:`MIN_ENGINE_LOGS`)."""
    fam, bucket = family(engine, version), tp_bucket(tp)
    rows = [r for r in _table() if r.get("engine") == engine]
    for want_family, want_tp in ((fam, bucket), (None, bucket), (None, None)):
        least = MIN_LOGS if want_tp else MIN_ENGINE_LOGS  # the engine's own row: whatever it has, if anything
        row = next((r for r in rows if r.get("family") == want_family and r.get("tp") == want_tp
                    and int(r.get("logs") or 0) >= least), None)
        if row is not None:
            basis = ", ".join(x for x in (engine, want_family, want_tp) if x)
            return Spread(max(FLOOR_BYTES, round(float(row["over_gib"]) * GiB)),
                          max(FLOOR_BYTES, round(float(row["under_gib"]) * GiB)), int(row["logs"]), basis)
    return None


__all__ = ["FAMILIES", "ROUGH_WEIGHTS_FRACTION", "Spread", "family", "rough_weights", "spread", "tp_bucket"]
