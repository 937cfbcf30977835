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


def test_a_single_gpu_class_does_not_borrow_a_tensor_parallel_board_s_nccl_spread(monkeypatch):
    """No NCCL communicator exists at tp 1: a thin tp-1 class takes the widest of the tp-1 classes (0.40 GiB), not
    a Blackwell NVSwitch board's 1.05 GiB of NCCL buffers; a thin tensor-parallel class still takes the widest of
    every class, the tp-1 ones included (it holds what one GPU holds, and NCCL's buffers besides)."""
    rows = [_row("tp 1", 1, 0.40), _row("tp 1, infinity-fabric", 1, 0.01), _row("tp 4 - 8, nvlink-switch", 3, 1.05),
            _row("tp 2, pcie", 1, 0.0)]
    monkeypatch.setattr(spread, "_doc", lambda: {"terms": rows, "classes": []})
    single = spread.term_spread("overhead", "sglang", "tp 1", 0)
    assert single.over_bytes == round(0.40 * spread.GiB) and "every class" in single.basis, single
    assert spread.term_spread("overhead", "sglang", "tp 2, pcie", 0).over_bytes == round(1.05 * spread.GiB)
    rows[2] = _row("tp 4 - 8, nvlink-switch", 3, 0.06)  # the tp-1 spread is the widest there is: a tp-2 class takes it
    assert spread.term_spread("overhead", "sglang", "tp 2, pcie", 0).over_bytes == round(0.40 * spread.GiB)


def test_one_well_measured_neighbour_still_sets_the_spread(monkeypatch):
    """Where a neighbour has MIN_TERM_LOGS logs of its own, the widest of the neighbours stands (no wider)."""
    rows = [_row("tp 1", 1, 0.40), _row("tp 4 - 8, pcie", spread.MIN_TERM_LOGS, 0.2),
            _row("tp 4 - 8, nvlink-switch", 1, 0.06)]
    monkeypatch.setattr(spread, "_doc", lambda: {"terms": rows, "classes": []})
    s = spread.term_spread("overhead", "sglang", "tp 4 - 8, nvlink", 0)
    assert s.over_bytes == round(0.2 * spread.GiB) and "its neighbours" in s.basis


def _vllm(term, cls, logs, over, under=0.0):
    unit = spread.TERM_UNITS[term]
    return {"engine": "vllm", "term": term, "class": cls, "unit": unit, "logs": logs, "over": over, "under": under,
            "median": 0.0}


COVERED = [{"engine": "vllm", "platform": "cuda", "family": "V0 0.6 - 0.7"},
           {"engine": "vllm", "platform": "cuda", "family": "V1 0.11 - 0.19"},
           {"engine": "vllm", "platform": "rocm", "family": "V1 0.11 - 0.19"}]


def test_coverage_is_read_from_the_file_and_a_file_without_it_leaves_rocm_v0_unseen(monkeypatch):
    monkeypatch.setattr(spread, "_doc", lambda: {"terms": [], "classes": []})
    assert not spread.covered("vllm", "rocm", "V0 0.6 - 0.7")
    assert spread.covered("vllm", "rocm", "V1 0.11 - 0.19") and spread.covered("vllm", "cuda", "V0 0.6 - 0.7")
    monkeypatch.setattr(spread, "_doc", lambda: {"terms": [], "classes": [], "covered": COVERED})
    assert spread.covered("vllm", "rocm", "V1 0.11 - 0.19") and spread.covered("vllm", "cuda", "V0 0.6 - 0.7")
    assert not spread.covered("vllm", "rocm", "V0 0.6 - 0.7") and not spread.covered("vllm", "rocm", "V1 0.20+")
    assert not spread.covered("sglang", "cuda", "0.5.3+")  # the file lists no SGLang family here
    # a family beside a covered one of the same engine mode borrows; a mode never seen on the platform does not
    assert spread.mode_covered("vllm", "rocm", "V1 0.20+") and not spread.mode_covered("vllm", "rocm", "V0 0.6 - 0.7")


def test_an_unseen_platform_takes_the_widest_of_its_neighbours_never_its_own_narrow_class(monkeypatch):
    """vLLM V0 on ROCm: its own activation class ("dense, V0", from CUDA logs) is narrow; unseen, it takes the widest
    of its neighbours. Non-torch memory takes at least the widest unexplained memory of every class where the
    platform's whole engine mode is unseen, and only its neighbours where another family of the mode is covered."""
    rows = [_vllm("activation", "dense, V0", 12, 0.01), _vllm("activation", "moe, V0", 3, 0.30),
            _vllm("activation", "vision, V1", 5, 0.90),  # not a neighbour of "dense, V0"
            _vllm("overhead", "tp 4 - 8, nvlink-switch", 6, 0.5), _vllm("overhead", "tp 4 - 8, infinity-fabric", 1, 0.02),
            _vllm("rest", "V0 0.6 - 0.7", 13, 0.58), _vllm("unified memory", "unified", 3, 6.4)]
    monkeypatch.setattr(spread, "_doc", lambda: {"terms": rows, "classes": [], "covered": COVERED})
    narrow = spread.term_spread("activation", "vllm", "dense, V0", 10 * spread.GiB)
    unseen = spread.unseen_spread("activation", "vllm", "dense, V0", 10 * spread.GiB, "dense, V0 on ROCm")
    assert narrow.over_bytes == round(0.1 * spread.GiB)
    assert unseen.over_bytes == round(3.0 * spread.GiB) and "unseen" in unseen.basis and "moe, V0" in unseen.basis
    cls = "tp 4 - 8, infinity-fabric"
    v0 = spread.unseen_spread("overhead", "vllm", cls, 0, f"{cls} on ROCm", mode_seen=False)
    v1 = spread.unseen_spread("overhead", "vllm", cls, 0, f"{cls} on ROCm", mode_seen=True)
    assert v0.over_bytes == round(6.4 * spread.GiB) and "widest unexplained" in v0.basis
    assert v1.over_bytes == round(0.5 * spread.GiB) and "neighbours" in v1.basis
    # never narrower than the class's own term_spread
    assert v1.over_bytes >= spread.term_spread("overhead", "vllm", cls, 0).over_bytes
    assert spread.unseen_spread("cudagraph", "vllm", "V0 0.6 - 0.7", 0, "x") is None  # no log prints it here


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
