"""The plan's range (issue 19): the answer at the ends of the KV budget's spread measured on real start-ups, and
capacity checks that gate on its low end."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

import kvplan
from kvplan.cli.app import app
from kvplan.engines import spread
from kvplan.planning.plan import plan_for_spec

ROOT = Path(__file__).resolve().parents[1]
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
