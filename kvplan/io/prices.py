"""The price file ``kvplan size --prices FILE`` reads: GPU -> price per GPU-hour, with the user's own source and
date (kvplan ships no price as truth; docs/examples/prices.yaml is a documented example of the format)::

    currency: USD
    source: my cloud's on-demand list, us-east-1     # where the prices below came from
    date: 2026-11-30                                 # when they were read
    prices:
      H100: 2.99                                     # per GPU-hour
      H200: {per_gpu_hour: 3.79, source: reserved quote, date: 2026-11-02}   # an entry's own source / date

Every mistake is one located line (``prices.yaml:6:7: prices.H100: must be a positive number of currency per
GPU-hour, got 'cheap'``). GPU names are resolved by the caller (:mod:`kvplan.planning.size`), which knows the
catalogue; each entry keeps where it is for that error.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from kvplan.io.yamldoc import ScenarioFileError, Where, read_yaml
from kvplan.frozen import frozen

TOP_KEYS = ("currency", "source", "date", "prices")
ENTRY_KEYS = ("per_gpu_hour", "source", "date")


@frozen
class Price:
    """One GPU's price: ``per_gpu_hour`` in ``currency`` per GPU per hour, where it came from and when."""

    gpu: str  # the name as the file spells it (resolved against the catalogue by the caller)
    per_gpu_hour: float
    source: str
    date: str
    where: Where


@frozen
class Prices:
    """A price file: its entries in file order."""

    path: str
    currency: str
    source: str
    date: str
    entries: tuple[Price, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "currency": self.currency, "source": self.source, "date": self.date,
                "prices": {p.gpu: {"per_gpu_hour": p.per_gpu_hour, "source": p.source, "date": p.date}
                           for p in self.entries}}


def _text(value: Any) -> str | None:
    if isinstance(value, (_dt.date, _dt.datetime)):
        return value.isoformat()
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
        return str(value).strip()
    return None


def _price(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        return None
    return float(value)


def load_prices(path: str | Path) -> Prices:
    """Read and check a price file (:data:`TOP_KEYS`; each entry a number or a mapping of :data:`ENTRY_KEYS`).
    ``source`` and ``date`` are required, at the top or on every entry."""
    doc = read_yaml(path)
    data = doc.data
    if not isinstance(data, dict):
        raise ScenarioFileError(doc.where(()), "a price file is a mapping with currency, source, date and prices",
                                "see docs/examples/prices.yaml")
    for key in data:
        if key not in TOP_KEYS:
            raise doc.error((key,), f"unknown key (a price file has {', '.join(TOP_KEYS)})", key=True)
    top = {}
    for key in ("currency", "source", "date"):
        if key in data:
            top[key] = _text(data[key])
            if top[key] is None:
                raise doc.error((key,), f"must be a non-empty text, got {data[key]!r}")
    prices = data.get("prices")
    if not isinstance(prices, dict) or not prices:
        raise ScenarioFileError(doc.where(("prices",)) if "prices" in data else doc.where(()),
                                "prices: must map each GPU to its price per GPU-hour (e.g. H100: 2.99)",
                                "see docs/examples/prices.yaml")
    entries = []
    for name, raw in prices.items():
        loc = ("prices", name)
        fields = raw if isinstance(raw, dict) else {"per_gpu_hour": raw}
        for key in fields:
            if key not in ENTRY_KEYS:
                raise doc.error((*loc, key), f"unknown key (an entry has {', '.join(ENTRY_KEYS)})", key=True)
        value = _price(fields.get("per_gpu_hour"))
        if value is None:
            raise doc.error(loc if not isinstance(raw, dict) else (*loc, "per_gpu_hour"),
                            f"must be a positive number of {top.get('currency') or 'currency'} per GPU-hour, "
                            f"got {fields.get('per_gpu_hour')!r}")
        said = {}
        for key in ("source", "date"):
            said[key] = _text(fields[key]) if key in fields else top.get(key)
            if said[key] is None:
                raise doc.error(loc, f"no {key}: give the price's {key} (at the top of the file or on the entry)",
                                "kvplan ships no prices: say where yours came from and when", key=True)
        entries.append(Price(str(name), value, said["source"], said["date"], doc.where(loc, key=True)))
    return Prices(doc.display, top.get("currency") or "", top.get("source") or "", top.get("date") or "",
                  tuple(entries))


__all__ = ["Price", "Prices", "load_prices"]
