"""kvplan/engines/spread.py: how a term class the calibration part has seen too little of borrows its spread."""

from __future__ import annotations

from kvplan.engines import spread


def _row(cls, logs, over):
    return {"engine": "sglang", "term": "overhead", "class": cls, "unit": "GiB", "logs": logs, "over": over,
            "under": 0.0, "median": 0.0}


def test_neighbours_each_measured_on_fewer_logs_than_a_class_needs_do_not_narrow_an_unseen_class(monkeypatch):
    """SGLang's calibration logs at tp 4 - 8 are one or two per board, each the log that sized its board's NCCL
    constant (gaps of 0.00 - 0.06 GiB by construction). Together they reach MIN_TERM_LOGS, but none alone does: an
    unseen class beside them (tp 8 on an NVLink board without NVSwitch, or a GPU given by its memory alone) takes the
    widest of every class (0.40 GiB here), not their 0.06."""
    rows = [_row("tp 1", 1, 0.40), _row("tp 4 - 8, nvlink-switch", 1, 0.06), _row("tp 4 - 8, pcie", 2, 0.0),
            _row("tp 4 - 8, infinity-fabric", 1, 0.01)]
    monkeypatch.setattr(spread, "_doc", lambda: {"terms": rows, "classes": []})
    for cls in ("tp 4 - 8, nvlink", "tp 4 - 8, unknown", "tp 4 - 8, nvlink-switch", "tp 16+, nvlink-switch"):
        s = spread.term_spread("overhead", "sglang", cls, 0)
        assert s.over_bytes == round(0.40 * spread.GiB) and "every class" in s.basis, (cls, s)


def test_one_well_measured_neighbour_still_sets_the_spread(monkeypatch):
    """Where a neighbour has MIN_TERM_LOGS logs of its own, the widest of the neighbours stands (no wider)."""
    rows = [_row("tp 1", 1, 0.40), _row("tp 4 - 8, pcie", spread.MIN_TERM_LOGS, 0.2),
            _row("tp 4 - 8, nvlink-switch", 1, 0.06)]
    monkeypatch.setattr(spread, "_doc", lambda: {"terms": rows, "classes": []})
    s = spread.term_spread("overhead", "sglang", "tp 4 - 8, nvlink", 0)
    assert s.over_bytes == round(0.2 * spread.GiB) and "its neighbours" in s.basis


def test_a_class_median_comes_with_its_spread_and_a_borrowed_spread_brings_none(monkeypatch):
    """``median_bytes`` is the class's own median gap (in the term's unit, scaled like the spread), read from the
    same rows; a class with no row of its own borrows its neighbours' spread but not a median."""
    rows = [{**_row("tp 1", 3, 0.40), "median": 0.25}, _row("tp 2, pcie", spread.MIN_TERM_LOGS, 0.1)]
    monkeypatch.setattr(spread, "_doc", lambda: {"terms": rows, "classes": []})
    assert spread.term_spread("overhead", "sglang", "tp 1", 0).median_bytes == round(0.25 * spread.GiB)
    assert spread.term_spread("overhead", "sglang", "tp 2, nvlink", 0).median_bytes == 0
    frac = [{**_row("dense, V1", 5, 0.1), "term": "activation", "unit": "fraction", "median": -0.02}]
    monkeypatch.setattr(spread, "_doc", lambda: {"terms": frac, "classes": []})
    assert spread.term_spread("activation", "sglang", "dense, V1", 1000).median_bytes == -20
