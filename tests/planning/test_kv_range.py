"""The plan's range (issue 19): the answer at the ends of the KV budget's spread measured on real start-ups, and
capacity checks that gate on its low end."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import kvplan
from kvplan.cli.app import app
from kvplan.units import MiB
from kvplan.engines import spread
from kvplan.planning.plan import plan_for_spec

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_the_range_brackets_the_answer_and_comes_from_the_same_deployment():
    p = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192, batch=32)
    r = p.kv_range
    assert r is not None and r.kv_budget_low_bytes < p.budget.kv_budget_bytes < r.kv_budget_high_bytes
    assert r.low.num_blocks <= p.answer.num_blocks <= r.high.num_blocks
    assert r.low.max_requests <= p.answer.max_requests <= r.high.max_requests
    assert r.low.kv_tokens <= p.answer.kv_tokens <= r.high.kv_tokens
    # each end is the deployment's own answer at that many blocks (the same rules, not a scaled figure)
    low = p.deployment.__class__(p.spec, p.engine, p.rules, p.demand, r.low.num_blocks, p.options.max_num_seqs)
    assert low.answer(8192, 32, p.max_model_len_fixed) == r.low
    doc = p.to_dict()["range"]
    assert doc["low"]["max_requests"] == r.low.max_requests and "real start-up logs" in doc["source"]


def test_the_ends_are_answered_once_when_read_and_the_plans_own_answer_where_its_blocks_are_theirs(monkeypatch):
    from kvplan.planning.answer import Deployment

    p = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192, batch=32)
    r = p.kv_range
    asked = []
    real = Deployment.answer
    monkeypatch.setattr(Deployment, "answer", lambda self, *a: asked.append(self.blocks) or real(self, *a))
    assert r.low is r.low and r.high is r.high and asked == [r.low.num_blocks, r.high.num_blocks]
    assert r.low == real(r.low_deployment, 8192, 32, None) and r.low.context == 8192 and r.low.batch == 32
    assert r.deployment == p.deployment and r.estimate is p.answer
    same = replace(r, low_deployment=r.deployment)  # an end with the plan's own blocks: the plan's answer
    assert same.low is p.answer and len(asked) == 2
    assert same != r and replace(r, source=r.source) == r


def test_a_given_kv_budget_has_no_spread():
    p = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", kv_budget="20GiB")
    assert p.kv_range.low == p.kv_range.high == p.answer
    assert "given" in p.kv_range.source


def test_the_spread_falls_back_from_class_to_family_to_engine():
    s = spread.spread("vllm", "0.12", 1)
    assert s is not None and s.logs >= spread.MIN_LOGS and s.over_bytes >= spread.FLOOR_BYTES
    assert spread.family("vllm", "0.6.6") == "V0 0.6 - 0.7" and spread.family("vllm", "0.33.0") == "V1 0.20+"
    assert spread.tp_bucket(8) == "tp 4 - 8" and spread.tp_bucket(16) == "tp 16+"


def test_the_spread_file_is_what_the_calibration_part_gives():
    """kvplan/data/kv_spread.yaml is generated from the corpus' calibration part; an edit by hand, a changed
    engine rule or a new calibration log without regenerating it fails here."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    module = importlib.util.spec_from_file_location("corpus_agreement", ROOT / "benchmarks" / "corpus_agreement.py")
    ca = importlib.util.module_from_spec(module)
    sys.modules["corpus_agreement"] = ca
    module.loader.exec_module(ca)
    done, _ = ca.rows("calibration")
    written = yaml.safe_load((ROOT / "kvplan" / "data" / "kv_spread.yaml").read_text())
    again = "regenerate: PYTHONPATH=. python3 benchmarks/corpus_agreement.py --write-spread --write-docs"
    assert written["classes"] == ca.spread_table(done), again
    assert written["terms"] == ca.term_table(done), again
    assert not any(r.split == "validation" for r in done)


def _agreement():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    module = importlib.util.spec_from_file_location("corpus_agreement", ROOT / "benchmarks" / "corpus_agreement.py")
    ca = importlib.util.module_from_spec(module)
    sys.modules["corpus_agreement"] = ca
    module.loader.exec_module(ca)
    return ca


def test_the_printed_terms_of_a_0_27_log_subtract_its_graphs_once():
    """vLLM 0.27+ print the peak activation with the CUDA-graph estimate in it and, beside it, the graphs captured
    after the KV cache: the terms the spread is measured on take the estimate out of the activation once (the
    log's own "(estimated)" figure where it prints one, else kvplan's, which then counts as not printed)."""
    ca = _agreement()
    meta = {"engine": "vllm", "reported": {"weights_gib": 55.19, "activation_gib": 0.76, "non_torch_gib": 1.70,
                                            "cudagraph_gib": 0.32}}
    assert ca._activation_holds_graphs("vllm", "0.27") and not ca._activation_holds_graphs("vllm", "0.26")
    apart = ca.logged_terms(meta, 4)  # 0.20 - 0.26: the terms as printed
    assert apart["activation_gib"] == "0.76GiB" and apart["cudagraph_gib"] == "0.32GiB"
    folded = ca.logged_terms(meta, 4, True, 0.44)  # kvplan's estimate 0.44 GiB: out of the activation
    assert float(folded["activation_gib"].removesuffix("GiB")) == pytest.approx(0.32) and "cudagraph_gib" not in folded
    printed = {**meta, "reported": {**meta["reported"], "cudagraph_estimate_gib": 0.5}}
    both = ca.logged_terms(printed, 4, True, 0.44)  # the log's own estimate wins and is a printed term
    assert float(both["activation_gib"].removesuffix("GiB")) == pytest.approx(0.26) and both["cudagraph_gib"] == "0.5GiB"


def test_one_log_does_not_set_an_activation_classs_spread():
    """In a class of OUTLIER_MIN_LOGS logs or more, one activation log far above the others is set aside (and
    named); two such logs, a smaller class, a log not far above the rest, or a non-torch term keep every log."""
    ca = _agreement()
    n = spread.OUTLIER_MIN_LOGS
    tame = [(f"log{i}", 0.01 * i, 0.0) for i in range(n - 1)]  # the others' 95th percentile: about 0.06
    wild = ("wild", 6.66, 0.0)
    kept, aside = ca._set_aside_outlier("activation", tame + [wild])
    assert aside == wild and kept == tame
    assert ca._set_aside_outlier("activation", tame[1:] + [wild]) == (tame[1:] + [wild], None)  # n - 1 logs
    assert ca._set_aside_outlier("overhead", tame + [wild])[1] is None  # non-torch memory: every log counts
    second = tame[1:] + [wild, ("wild2", 6.0, 0.0)]  # two far logs: the second sets the rest's quantile
    assert ca._set_aside_outlier("activation", second)[1] is None
    near = tame + [("near", 3 * 0.06, 0.0)]  # within OUTLIER_FACTOR of the rest, or under OUTLIER_MIN_OVER
    assert ca._set_aside_outlier("activation", near)[1] is None
    # the shipped file: a set-aside log is one of its class's logs, above its spread, and the basis names it
    for r in spread._terms():
        if "set_aside" in r:
            assert r["term"] in spread.OUTLIER_TERMS and r["logs"] >= n and r["set_aside"]["log"] in r["from"]
            assert float(r["set_aside"]["over"]) > spread.OUTLIER_FACTOR * float(r["over"])
            got = spread.term_spread(r["term"], r["engine"], r["class"], spread.GiB)
            assert r["set_aside"]["log"] in got.basis
            # and no class that borrows from it inherits the set-aside log: unseen classes stay at the robust width
            for cls in spread._neighbours(r["term"], r["engine"], r["class"]):
                near = spread.term_spread(r["term"], r["engine"], cls, spread.GiB)
                assert near.over_bytes < float(r["set_aside"]["over"]) * spread.GiB, cls


def test_v0_on_rocm_pays_the_widest_unexplained_memory():
    """vLLM V0 on an AMD GPU: hipBLASLt's memory is not modelled and no calibration log prints V0's non-torch memory
    there, so the low end's non-torch spread is the widest of every unexplained-memory class, never its board's."""
    widest = max(float(r["over"]) for r in spread._terms()
                 if r["engine"] == "vllm" and r["term"] in spread.UNEXPLAINED_TERMS)
    v0 = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="MI300X", context=8192, engine_version="0.6.5")
    overhead = next(t for t in v0.kv_range.terms if t.term == "overhead")
    assert overhead.over_bytes == round(widest * spread.GiB) > 0 and "ROCm" in overhead.basis
    v1 = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="MI300X", context=8192, engine_version="0.11.0")
    assert "ROCm" not in next(t for t in v1.kv_range.terms if t.term == "overhead").basis
    cuda = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192, engine_version="0.6.5")
    assert next(t for t in cuda.kv_range.terms if t.term == "overhead").over_bytes < overhead.over_bytes


def _capacity(tmp_path: Path, file_key: str = "", check_key: str = "") -> Path:
    path = tmp_path / "capacity.yaml"
    path.write_text(f"""{file_key}
defaults: {{model: meta-llama/Llama-3.1-8B, gpu: H100, context: 8k}}
checks:
  - name: at-the-estimate
    {check_key}
    require: {{concurrency: 54}}
""")
    return path


def test_a_check_gates_on_the_low_end_when_asked(tmp_path):
    p = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192)
    assert p.answer.max_requests == 54 > p.kv_range.low.max_requests  # passes at the estimate, not at the low end
    assert runner.invoke(app, ["check", str(_capacity(tmp_path))]).exit_code == 0
    for path, args in ((_capacity(tmp_path), ["--conservative"]), (_capacity(tmp_path, "conservative: true"), []),
                       (_capacity(tmp_path, check_key="conservative: true"), [])):
        result = runner.invoke(app, ["check", str(path), *args])
        assert result.exit_code == 1, result.output
        assert "at the low end of kvplan's range" in " ".join(result.output.split())
    # a check's own key wins over the file's
    result = runner.invoke(app, ["check", str(_capacity(tmp_path, "conservative: true", "conservative: false"))])
    assert result.exit_code == 0, result.output


def test_the_low_end_plan_is_the_same_deployment_with_the_low_budget():
    from kvplan.checks.capacity import low_end

    p = kvplan.estimate("Qwen/Qwen3-8B", gpu="L40S", context=16384)
    low = low_end(p, p.spec)
    assert low.budget.kv_budget_bytes == max(0, p.kv_range.kv_budget_low_bytes)
    assert low.answer.max_requests == p.kv_range.low.max_requests
    assert plan_for_spec(p.spec, p.options).answer == p.answer


def test_the_engine_docs_state_the_modelled_releases_and_the_current_agreement():
    """docs/engines.md's release tables are the engines' own, and its generated agreement section is what the
    corpus gives today (regenerate: PYTHONPATH=. python3 benchmarks/corpus_agreement.py --write-docs)."""
    from kvplan.engines import sglang, vllm

    text = (ROOT / "docs" / "engines.md").read_text()
    for key, profile in vllm.PROFILES.items():
        assert f"| `{key}`{' (default)' if key == vllm.DEFAULT_VERSION else ''} | {vllm.RANGES[key]} | {profile.change} |" in text
    for key, release in sglang.RELEASES.items():
        assert f"| `{key}`{' (default)' if key == sglang.DEFAULT_VERSION else ''} | {sglang.RANGES[key]} | {release.change} |" in text
    sys.path.insert(0, str(ROOT / "benchmarks"))
    module = importlib.util.spec_from_file_location("corpus_agreement_docs", ROOT / "benchmarks" / "corpus_agreement.py")
    ca = importlib.util.module_from_spec(module)
    sys.modules["corpus_agreement_docs"] = ca
    module.loader.exec_module(ca)
    done, skipped = ca.rows()
    begin, end = text.index(ca.BEGIN), text.index(ca.END)
    section = text[begin:end]
    assert ca.summary_table(done)[2] in section, "regenerate docs/engines.md's agreement section"
    for line in ca.off_rows(done):
        assert line in section, line


# --------------------------------------------------------------------------------- the low end from the terms


def test_the_low_end_pays_every_estimated_terms_spread_and_names_the_dominant_one():
    for model, gpu, tp in (("meta-llama/Llama-3.1-8B", "H100", 1), ("meta-llama/Llama-3.1-70B", "H100", 4),
                           ("Qwen/Qwen3-30B-A3B", "A100", 2), ("Qwen/Qwen3-8B", "RTX-4090", 1)):
        p = kvplan.estimate(model, gpu=gpu, tp=tp, context=8192)
        r = p.kv_range
        assert {t.term for t in r.terms} >= {"weights", "activation", "overhead"}, (model, r.terms)
        # one object: the low and high budgets are the plan's less / plus the terms' sums
        assert r.kv_budget_low_bytes == p.budget.kv_budget_bytes - sum(t.over_bytes for t in r.terms)
        assert r.kv_budget_high_bytes == p.budget.kv_budget_bytes + sum(t.under_bytes for t in r.terms)
        assert r.dominant == max(r.terms, key=lambda t: t.over_bytes).term
        assert r.source.endswith(f"{r.dominant} dominates")
        doc = p.to_dict()["range"]
        assert doc["dominant"] == r.dominant and set(doc["terms"]) == {t.term for t in r.terms}
        assert doc["low"]["kv_budget_bytes"] == r.kv_budget_low_bytes
    args = ["estimate", "meta-llama/Llama-3.1-70B", "--gpu", "H100", "--tp", "4"]
    text = " ".join(runner.invoke(app, args).output.replace("│", " ").split())
    r = kvplan.estimate("meta-llama/Llama-3.1-70B", gpu="H100", tp=4).kv_range
    worst = max(r.terms, key=lambda t: t.over_bytes)
    assert f"{r.dominant} dominates (-{worst.over_bytes / spread.GiB:.2f} GiB)" in text


def test_a_term_the_user_gives_has_no_spread():
    p = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192, activation_gib=2, overhead_gib=1)
    names = {t.term for t in p.kv_range.terms}
    assert "activation" not in names and "overhead" not in names and "weights" in names


def test_a_calibrated_plan_keeps_only_what_the_calibration_leaves_uncertain(tmp_path):
    # vllm-10517's RTX 3090 log prints weights, activation and non-torch memory; the calibrated plan reproduces
    # its 1,952 blocks, so its range is the logs' printed precision (0.01 GiB per term), not the generic spread
    log = ROOT / "benchmarks" / "corpus" / "vllm" / "vllm-10517-3090-llama31-8b-20k.log"
    cal = tmp_path / "cal.yaml"
    model = ["meta-llama/Llama-3.1-8B-Instruct"]
    assert runner.invoke(app, ["explain", str(log), "--model", *model, "--calibrate", str(cal)]).exit_code == 0
    args = ["estimate", *model, "--max-model-len", "20000", "--context", "20000", "--engine-version", "0.6",
            "--gpu-memory", "23.58GiB", "--json"]
    import json

    plain = json.loads(runner.invoke(app, args).output)
    calibrated = json.loads(runner.invoke(app, args + ["--calibration", str(cal)]).output)
    assert calibrated["pool"]["num_blocks"] == 1952

    def width(d: dict) -> int:
        return d["range"]["high"]["kv_budget_bytes"] - d["range"]["low"]["kv_budget_bytes"]

    from kvplan.engines.spread import PRINTED_PRECISION_BYTES

    terms = calibrated["range"]["terms"]
    assert set(terms) == {"weights", "activation", "overhead", "rest"}, terms
    assert all(t["over_bytes"] == PRINTED_PRECISION_BYTES for t in terms.values())
    assert width(calibrated) == 8 * PRINTED_PRECISION_BYTES < width(plain) / 4


def _table(monkeypatch, rows):
    monkeypatch.setattr(spread, "_doc", lambda: {"terms": rows, "classes": []})


def test_a_class_the_corpus_has_not_seen_takes_the_widest_of_its_neighbours(monkeypatch):
    def row(cls, logs, over):
        return {"engine": "vllm", "term": "overhead", "class": cls, "unit": "GiB", "logs": logs, "over": over,
                "under": 0.0, "median": 0.0}

    _table(monkeypatch, [row("tp 2, nvlink-switch", 6, 0.5), row("tp 2, pcie", 5, 0.2), row("tp 1, nvlink", 9, 0.1),
                         row("tp 4 - 8, pcie", 4, 1.5), row("tp 4 - 8, nvlink", 1, 0.05)])
    GIB = spread.GiB
    # a well-measured class: its own
    assert spread.term_spread("overhead", "vllm", "tp 2, nvlink-switch", 0).over_bytes == round(0.5 * GIB)
    # unseen (tp 4 - 8 on NVSwitch): the same tp on other boards (1.5, 0.05) and its board beside it (0.5)
    s = spread.term_spread("overhead", "vllm", "tp 4 - 8, nvlink-switch", 0)
    assert s.over_bytes == round(1.5 * GIB) and "no logs" in s.basis and "tp 4 - 8, pcie" in s.basis
    # thin (1 log, narrow): never narrower than its neighbours
    thin = spread.term_spread("overhead", "vllm", "tp 4 - 8, nvlink", 0)
    assert thin.over_bytes == round(1.5 * GIB) and "1 log, so the widest" in thin.basis
    # a neighbourhood with too few logs: every class of the term (tp 16+ has only tp 4 - 8 beside it)
    lone = spread.term_spread("overhead", "vllm", "tp 16+, infinity-fabric", 0)
    assert lone.over_bytes == round(1.5 * GIB)
    # a fraction term scales with kvplan's estimate of it
    _table(monkeypatch, [{"engine": "vllm", "term": "activation", "class": "dense", "unit": "fraction", "logs": 10,
                          "over": 0.1, "under": 0.0, "median": 0.0}])
    assert spread.term_spread("activation", "vllm", "dense", 3 * GIB).over_bytes == round(0.3 * GIB)
    assert spread.term_spread("activation", "vllm", "vision", 3 * GIB).over_bytes == round(0.3 * GIB)


def test_every_class_of_the_spread_file_falls_back_no_narrower_than_its_neighbours():
    rows = [r for r in spread._terms()]
    for r in rows:
        for cls in [r["class"]] + spread._neighbours(r["term"], r["engine"], r["class"]):
            got = spread.term_spread(r["term"], r["engine"], cls, spread.GiB)
            own = next((x for x in rows if x["term"] == r["term"] and x["class"] == cls and x["engine"] == r["engine"]), None)
            if own is None or own["logs"] < spread.MIN_TERM_LOGS:
                near = [x for x in rows if x["term"] == r["term"] and x["engine"] == r["engine"]
                        and x["class"] in spread._neighbours(r["term"], r["engine"], cls)]
                widest = max((float(x["over"]) for x in near), default=0.0)
                assert got.over_bytes >= round(widest * spread.GiB) - 1, (r["term"], cls)


def test_unified_memory_says_kvplan_cannot_know_and_widens_the_low_end():
    gb10 = kvplan.estimate("Qwen/Qwen3-8B", gpu="GB10", context=8192)
    assert any("shares its memory with the host" in n for n in gb10.notes)
    overhead = next(t for t in gb10.kv_range.terms if t.term == "overhead")
    assert "unified" in overhead.basis
    # no calibration log of a unified-memory device prints its non-torch memory: the widest of its neighbours
    # (the tp-1 class of the dedicated boards, and tp 2 on unified memory)
    near = [r for r in spread._terms() if r["engine"] == "vllm" and r["term"] == "overhead"
            and r["class"] in spread._neighbours("overhead", "vllm", "tp 1, unified")]
    assert near and overhead.over_bytes >= max(round(float(r["over"]) * spread.GiB) for r in near)
    assert "tp 1, unified" not in {r["class"] for r in spread._terms()} and "no logs" in overhead.basis
    # the estimate allows the logs' median for the host's use, and the low end pays the rest of what they lost
    host = next(t for t in gb10.kv_range.terms if t.term == "unified memory")
    row = next(r for r in spread._terms() if r["engine"] == "vllm" and r["term"] == "unified memory")
    assert gb10.budget.host_bytes == round(float(row["median"]) * spread.GiB) > 0
    assert host.over_bytes == max(0, round(float(row["over"]) * spread.GiB) - gb10.budget.host_bytes) > 0
    assert any("the estimate allows" in n and "median" in n for n in gb10.notes)
    dedicated = kvplan.estimate("Qwen/Qwen3-8B", gpu="RTX-5090", context=8192)
    assert not any("shares its memory" in n for n in dedicated.notes)


def test_unified_memory_estimate_takes_the_host_use_median_and_keeps_the_low_end():
    """Item 3 of #27: the host's use on unified memory is unknown, so the point estimate takes its calibration
    median (kv_spread.yaml, through spread.term_spread), not 0; the low end stays where the logs' widest gap puts
    it, and the high end moves up by the same allowance. The budget adds up with it; a given KV budget, a
    calibration and a dedicated GPU take none."""
    gb10 = kvplan.estimate("Qwen/Qwen3-8B", gpu="GB10", context=8192)
    b, rng = gb10.budget, gb10.kv_range
    row = next(r for r in spread._terms() if r["engine"] == "vllm" and r["term"] == "unified memory")
    median, over = round(float(row["median"]) * spread.GiB), round(float(row["over"]) * spread.GiB)
    assert b.host_bytes == median and b.kv_budget_bytes == b.usable_bytes - sum(t.bytes for t in b.terms) - median
    others = sum(t.over_bytes for t in rng.terms if t.term != "unified memory")
    assert rng.kv_budget_low_bytes == b.kv_budget_bytes + median - over - others  # the low end without an allowance
    assert gb10.to_dict()["budget"]["host_bytes"] == median
    assert kvplan.estimate("Qwen/Qwen3-8B", gpu="GB10", context=8192, kv_budget="40GiB").budget.host_bytes == 0
    assert kvplan.estimate("Qwen/Qwen3-8B", gpu="RTX-5090", context=8192).budget.host_bytes == 0
    sglang = kvplan.estimate("Qwen/Qwen3-8B", gpu="GB10", context=8192, engine="sglang")
    assert sglang.budget.host_bytes == 0  # no SGLang calibration log on unified memory measures the host's use
    assert not any("the estimate allows" in n for n in sglang.notes)


def test_no_well_measured_term_is_estimated_below_the_logs_median():
    """The point estimate is not biased toward more KV: for every term class of the calibration part with enough
    logs, the logged term's median is not above kvplan's estimate (by more than 1% of a fraction term or 0.05 GiB)."""
    for r in spread._terms():
        if r["logs"] >= spread.MIN_TERM_LOGS:
            bound = 0.01 if r["unit"] == "fraction" else 0.05
            assert float(r["median"]) <= bound, r


def test_a_fallback_is_said_where_the_range_comes_from():
    s = spread.spread("sglang", "0.5.5", 2)
    assert s is not None and "fell back from sglang, 0.5.3+, tp 2" in s.source


def test_the_overhead_note_says_the_tables_number():
    from kvplan.units import GiB

    for tp in (2, 4, 8):
        p = kvplan.estimate("meta-llama/Llama-3.1-70B", gpu="H100", tp=tp, context=8192)
        note = next(n for n in p.notes if n.startswith(f"non-torch memory at tp {tp}"))
        assert f"{p.budget.overhead.bytes / GiB:.2f} GiB per GPU" in note, note


def test_a_desktop_card_under_a_release_that_charges_other_processes_says_so():
    from kvplan.planning.kv_range import DESKTOP_ALLOWANCE_BYTES

    for engine, version, charged in (("vllm", "0.6.4", True), ("vllm", "0.8.5", True), ("vllm", "0.6.6", False),
                                     ("vllm", "0.12", False), ("sglang", "0.4.3", True), ("sglang", "0.5.10", True)):
        p = kvplan.estimate("Qwen/Qwen3-8B", gpu="RTX-4090", context=8192, engine=engine, engine_version=version)
        desk = [t for t in p.kv_range.terms if t.term == "desktop"]
        assert bool(desk) == charged == any("other processes hold on the GPU" in n for n in p.notes), version
        if charged:  # the non-torch spread and the desktop together allow at least the allowance, no more
            paid = sum(t.over_bytes for t in p.kv_range.terms if t.term == "overhead")
            assert desk[0].over_bytes + paid == max(DESKTOP_ALLOWANCE_BYTES, paid), version
    # a datacenter card under the same release: no desktop
    h100 = kvplan.estimate("Qwen/Qwen3-8B", gpu="H100", context=8192, engine_version="0.8.5")
    assert not any(t.term == "desktop" for t in h100.kv_range.terms)


def test_sglang_s_low_end_pays_its_terms_and_an_unseen_tp_takes_the_widest_spread(monkeypatch):
    """Once SGLang's calibration logs print its terms (the weights' "mem usage", the free memory before loading),
    its range is built from them like vLLM's, not from one spread of the whole budget: a tp the corpus has not seen
    (8, on NVSwitch) takes the widest overhead spread there is, never a narrow one; the dominant term is named."""
    def row(term, cls, logs, over, unit="GiB"):
        return {"engine": "sglang", "term": term, "class": cls, "unit": unit, "logs": logs, "over": over,
                "under": 0.0, "median": 0.0}

    _table(monkeypatch, [row("weights", "checkpoint", 4, 0.005, "fraction"), row("overhead", "tp 1", 1, 0.40),
                         row("overhead", "tp 2, pcie", 1, 0.03), row("overhead", "tp 4 - 8, pcie", 2, 0.0),
                         row("rest", "0.3 - 0.4.7", 2, 0.003)])
    p = kvplan.estimate("Qwen/Qwen3-8B", gpu="H100", tp=8, gpus=8, context=8192, engine="sglang",
                        engine_version="0.4.3")
    terms = {t.term: t for t in p.kv_range.terms}
    assert set(terms) == {"weights", "overhead", "rest"}, terms
    assert terms["overhead"].over_bytes == round(0.40 * spread.GiB) and "no logs" in terms["overhead"].basis
    assert terms["weights"].over_bytes == round(0.005 * p.budget.weights.bytes)
    assert p.kv_range.kv_budget_low_bytes == p.budget.kv_budget_bytes - sum(t.over_bytes for t in terms.values())
    assert p.kv_range.dominant == "overhead" and "overhead dominates" in p.kv_range.source


def test_an_unseen_platform_and_release_family_says_so_and_never_narrows():
    """vLLM V0 on ROCm has no calibration log: the range notes the class is unseen, every uncertain term's basis says
    so, and no term is narrower than the class's own spread; CUDA V0 and ROCm V1 0.11 (covered) say nothing of it."""
    from kvplan.engines.spread import UNSEEN_TERMS

    v0 = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="MI300X", context=8192, engine_version="0.6.5")
    assert any("no calibration log covers" in n and "ROCm" in n for n in v0.kv_range.notes)
    unseen = [t for t in v0.kv_range.terms if t.term in UNSEEN_TERMS]
    assert {t.term for t in unseen} >= {"activation", "overhead"}
    assert all("unseen" in t.basis for t in unseen)
    cuda = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192, engine_version="0.6.5")
    assert not any("no calibration log covers" in n for n in cuda.kv_range.notes)
    for t in cuda.kv_range.terms:
        if t.term in UNSEEN_TERMS:
            mine = next(u for u in unseen if u.term == t.term)
            assert "unseen" not in t.basis and mine.over_bytes >= t.over_bytes, (t, mine)
    v1 = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="MI300X", context=8192, engine_version="0.11.0")
    assert not any("no calibration log covers" in n for n in v1.kv_range.notes)


def test_the_spread_writer_records_which_platform_and_family_the_calibration_covers():
    """benchmarks/corpus_agreement.py --write-spread lists the platform x release family pairs its calibration logs
    with terms cover (kv_spread.yaml ``covered``): ROCm V1 is there, ROCm V0 is not (its logs are all validation)."""
    module = importlib.util.spec_from_file_location("corpus_agreement_cov", ROOT / "benchmarks" / "corpus_agreement.py")
    ca = importlib.util.module_from_spec(module)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.modules["corpus_agreement_cov"] = ca
    module.loader.exec_module(ca)
    done, _ = ca.rows("calibration")
    pairs = {(c["engine"], c["platform"], c["family"]) for c in ca.covered_table(done)}
    assert ("vllm", "cuda", "V0 0.6 - 0.7") in pairs and ("vllm", "rocm", "V1 0.11 - 0.19") in pairs
    assert not any(p[:2] == ("vllm", "rocm") and p[2].startswith("V0") for p in pairs)


def test_a_shared_device_says_what_the_others_may_hold_before_the_engine_starts():
    """Item 4 of #27: on unified memory (the host) and on a GeForce card (a desktop) kvplan cannot know what else
    holds memory. A vLLM V1 release that budgets from total x util gives the same KV, but its start-up check refuses
    to start when less than that is free (v1/worker/gpu_worker.py init_device); V0 from 0.6.5 allocates the cache
    anyway and runs out of memory; the releases that charge other processes' memory give less KV (the desktop note).
    The note gives the room: total - usable, per GPU."""
    from kvplan.units import GiB

    def notes(gpu, version=None, **kw):
        p = kvplan.estimate("Qwen/Qwen3-8B", gpu=gpu, context=8192, **({"engine_version": version} if version else {}),
                            **kw)
        room = f"{(p.budget.total_bytes - p.budget.usable_bytes) / GiB:.2f} GiB"
        return [n for n in p.notes if "refuses to start" in n or "runs out of memory" in n], room

    for gpu, who in (("GB10", "the host"), ("RTX-4090", "a desktop")):
        start, room = notes(gpu)
        assert len(start) == 1 and "refuses to start" in start[0] and who in start[0] and room in start[0], start
    v0, room = notes("RTX-4090", "0.6.6")
    assert len(v0) == 1 and "runs out of memory" in v0[0] and room in v0[0]
    assert notes("RTX-4090", "0.8.5")[0] == []  # charges the desktop as non-torch memory: the desktop note instead
    assert notes("H100")[0] == []
    start, room = notes("GB10", gpu_util=0.6)
    assert "48.68 GiB" in room and room in start[0]


def test_weights_counted_from_parameters_spread_by_what_the_quantizer_leaves():
    """A dense or MoE transformer's quantized checkpoint quantizes every decoder linear layer: its weights counted
    as parameters x a dtype carry their class's measured spread (7 calibration logs, under 1%). A hybrid or
    multimodal model's keeps state projections, gates and the vision tower in 16 bits, which a 16-bit spec cannot
    name: its low end allows at least ROUGH_WEIGHTS_FRACTION more (its 2 logs loaded 13 - 20% more)."""
    def weights_spread(model):
        p = kvplan.estimate(model, gpu="H100", weights_dtype="int4")
        assert spread.rough_weights(p.budget.weights.source)
        return next(t for t in p.kv_range.terms if t.term == "weights"), p.budget.weights.bytes

    dense, dense_bytes = weights_spread("meta-llama/Llama-3.1-8B-Instruct")
    assert dense.basis.startswith("parameters x dtype,") and "hybrid" not in dense.basis
    assert 0 < dense.over_bytes < 0.02 * dense_bytes
    hybrid, hybrid_bytes = weights_spread("Qwen/Qwen3.6-35B-A3B")  # hybrid layers and a vision tower
    assert hybrid.basis.startswith("parameters x dtype, hybrid or vision")
    # the point estimate takes the class's calibration median of the 16-bit layers it cannot name (not the lowest
    # value, every layer quantized); the low end still pays at least 15% more than the formula
    p = kvplan.estimate("Qwen/Qwen3.6-35B-A3B", gpu="H100", weights_dtype="int4")
    added = p.budget.unlisted_weights_bytes
    formula = hybrid_bytes - added
    row = next(r for r in spread._terms() if r["class"] == "parameters x dtype, hybrid or vision")
    assert added == round(float(row["median"]) * formula) > 0 and "the quantizer keeps in 16 bits" in p.budget.weights.source
    assert hybrid.over_bytes + added >= round(spread.ROUGH_WEIGHTS_FRACTION * formula)
    assert p.to_dict()["budget"]["unlisted_weights_bytes"] == added
    dense_plan = kvplan.estimate("meta-llama/Llama-3.1-8B-Instruct", gpu="H100", weights_dtype="int4")
    assert dense_plan.budget.unlisted_weights_bytes == 0
    given = kvplan.estimate("Qwen/Qwen3.6-35B-A3B", gpu="H100", weights_gib=20)
    assert given.budget.unlisted_weights_bytes == 0 and given.budget.weights.bytes == 20 * 2**30


def test_v1_s_low_end_pays_v0_s_nvls_figure_above_nccl_s_own_sizes():
    """V1 plans NVLS from NCCL's code (0.5 GiB a communicator at 8 Hopper ranks with NCCL 2.26+); the low end still
    pays what V0's 288 MiB x tp would add (2.25 - 0.5 GiB), named; V0, planned with that figure, pays nothing more."""
    v1 = kvplan.estimate("meta-llama/Llama-3.1-70B-Instruct", gpu="H100", tp=8, gpus=8, context=8192,
                         engine_version="0.16.0")
    nvls = {t.term: t for t in v1.kv_range.terms}["NVLS buffers"]
    assert nvls.over_bytes == v1.budget.nvls_gap_bytes == 8 * 288 * MiB - 512 * MiB
    v0 = kvplan.estimate("meta-llama/Llama-3.1-70B-Instruct", gpu="H100", tp=8, gpus=8, context=8192,
                         engine_version="0.7.3")
    assert "NVLS buffers" not in {t.term for t in v0.kv_range.terms} and v0.budget.nvls_gap_bytes == 0
