"""The budget's allowances for memory kvplan cannot know (kvplan.planning.budget): on ROCm the non-torch memory its
formula leaves out (hipBLASLt's loaded kernels) takes the calibration logs' median of its class, not NVIDIA's 0.

No calibration log of vLLM on ROCm prints non-torch memory yet (kv_spread.yaml has no infinity-fabric overhead
class for vLLM), so today nothing is added; the tests give the spread file such a class, as a regeneration would
write it from such logs, and check what the plan then does with it."""

from __future__ import annotations

import copy

import pytest

import kvplan
from kvplan.engines import spread
from kvplan.planning.budget import with_unmodelled_non_torch
from kvplan.units import GiB

LLAMA2 = {"model": "meta-llama/Llama-2-7b-hf", "context": 4096, "engine_version": "0.6.3"}
SPREAD_FILE = spread._doc  # the bundled file's reader, before any test replaces it


def _rocm_class(monkeypatch: pytest.MonkeyPatch, median: float, over: float = 1.9, under: float = 0.1,
                logs: int = 4) -> None:
    """The spread file with a vLLM 'tp 1, infinity-fabric' non-torch class of ``logs`` calibration logs, and ROCm's
    V0 family covered by them."""
    doc = copy.deepcopy(SPREAD_FILE())
    doc["terms"] = list(doc["terms"]) + [{
        "engine": "vllm", "term": "overhead", "class": "tp 1, infinity-fabric", "unit": "GiB", "logs": logs,
        "over": over, "under": under, "median": median, "from": [f"log-{i}" for i in range(logs)]}]
    doc["covered"] = list(doc["covered"]) + [{"engine": "vllm", "platform": "rocm", "family": "V0 0.6 - 0.7"}]
    monkeypatch.setattr(spread, "_doc", lambda: doc)


def test_today_no_rocm_class_is_measured_so_nothing_is_added():
    assert not [r for r in spread._terms() if r["engine"] == "vllm" and r["term"] == "overhead"
                and "infinity-fabric" in r["class"]]
    assert kvplan.estimate(gpu="MI300X-192GB", **LLAMA2).budget.unmodelled_bytes == 0


def test_rocm_point_estimate_takes_its_class_median_and_keeps_the_range_ends(monkeypatch):
    before = kvplan.estimate(gpu="MI300X-192GB", **LLAMA2)
    _rocm_class(monkeypatch, median=1.7)
    plan = kvplan.estimate(gpu="MI300X-192GB", **LLAMA2)
    b, median = plan.budget, round(1.7 * GiB)
    assert b.unmodelled_bytes == median
    assert b.overhead.bytes == before.budget.overhead.bytes + median and "median gap of tp 1, infinity-fabric" \
        in b.overhead.source
    assert b.kv_budget_bytes == before.budget.kv_budget_bytes - median
    assert b.kv_budget_bytes == b.usable_bytes - sum(t.bytes for t in b.terms)
    assert plan.answer.num_blocks < before.answer.num_blocks
    assert plan.to_dict()["budget"]["unmodelled_bytes"] == median
    # the class's spread was measured against the formula: the low end pays its over beyond the allowance, the
    # high end its under plus it, so both ends stay where the logs put them
    s = next(t for t in plan.kv_range.terms if t.term == "overhead")
    assert s.over_bytes == round(1.9 * GiB) - median and s.under_bytes == round(0.1 * GiB) + median
    others = sum(t.over_bytes for t in plan.kv_range.terms if t.term != "overhead")
    assert plan.kv_range.kv_budget_low_bytes == b.kv_budget_bytes + median - round(1.9 * GiB) - others
    assert "the estimate allows 1.70 GiB (the median)" in s.basis


def test_nvidia_a_given_term_and_a_non_positive_median_take_nothing(monkeypatch):
    _rocm_class(monkeypatch, median=1.7)
    h100 = kvplan.estimate(gpu="H100-SXM-80GB", **LLAMA2)
    assert h100.budget.unmodelled_bytes == 0
    assert with_unmodelled_non_torch(h100.budget, h100.engine, h100.gpu, 1) is h100.budget  # CUDA: the formula's
    given = kvplan.estimate(gpu="MI300X-192GB", overhead_gib="0.5GiB", **LLAMA2).budget
    assert given.unmodelled_bytes == 0 and given.overhead.bytes == round(0.5 * GiB)
    assert kvplan.estimate(gpu="MI300X-192GB", kv_budget="100GiB", **LLAMA2).budget.unmodelled_bytes == 0
    # SGLang's overhead is its memory before loading, when hipBLASLt has loaded nothing
    assert kvplan.estimate(gpu="MI300X-192GB", engine="sglang", model=LLAMA2["model"],
                           context=4096).budget.unmodelled_bytes == 0
    _rocm_class(monkeypatch, median=-0.2)  # the formula already holds more than the logs: it stands (the safe side)
    assert kvplan.estimate(gpu="MI300X-192GB", **LLAMA2).budget.unmodelled_bytes == 0


def test_the_allowance_is_read_from_the_class_of_the_plans_tp(monkeypatch):
    _rocm_class(monkeypatch, median=1.7)
    # tp 2 on MI300X is another class ('tp 2, infinity-fabric'), which the file does not measure
    assert kvplan.estimate(gpu="MI300X-192GB", tp=2, gpus=2, **LLAMA2).budget.unmodelled_bytes == 0
    assert spread.unmodelled_non_torch("vllm", "rocm", "tp 1, infinity-fabric").median_bytes == round(1.7 * GiB)
    assert spread.unmodelled_non_torch("vllm", "cuda", "tp 1, infinity-fabric") is None


def test_the_spread_writer_measures_rocm_non_torch_against_the_formula_not_the_allowance(monkeypatch):
    """benchmarks/corpus_agreement.py measures each printed term's gap against kvplan's formula: the allowance the
    point estimate takes from those gaps' median is taken back out, so regenerating the spread file does not shrink
    the median it was built from (the MI300X Llama-3.1-70B start prints its non-torch memory: its gap stays)."""
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    module = importlib.util.spec_from_file_location("corpus_agreement_budget", root / "benchmarks" / "corpus_agreement.py")
    ca = importlib.util.module_from_spec(module)
    sys.modules["corpus_agreement_budget"] = ca
    module.loader.exec_module(ca)
    entry = next(e for e in ca.corpus.entries("vllm") if e.id == "vllm-f43801487237-mi300x-llama31-70b-fp8-tp1")
    before = ca.run(entry)
    _rocm_class(monkeypatch, median=1.7)
    after = ca.run(entry)
    assert after.kvplan < before.kvplan  # the point estimate gives fewer blocks ...
    assert after.deltas["overhead"] == pytest.approx(before.deltas["overhead"], abs=1e-9)  # ... the gap is the formula's
