"""`kvplan explain LOG`: the parser, the reconciliation, the calibration loop, and what a bad log does.

The fixtures are the real logs of the corpus's earliest entries (benchmarks/corpus/, ``origin: engine_reports.yaml``:
V0 and V1, INFO and DEBUG, tp > 1, pp > 1, hybrids, refusals, SGLang), planned as their curated ``kvplan:`` blocks
say. The capacity from the logged terms must reproduce every capacity line of each log exactly: that checks the
block and token rules of each release.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.errors import KvplanError
from kvplan.explain.account import ExplainError
from kvplan.explain.facts import log_values
from kvplan.explain.reconcile import explain
from kvplan.explain.logparse import parse_log
from kvplan.units import GiB

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import corpus  # noqa: E402  (benchmarks/corpus.py: the entries and their kvplan blocks)
import corpus_agreement  # noqa: E402  (the GPU a kvplan block plans with)

ENTRIES = {e.id: e for e in corpus.entries()}
LOG = {eid: e.log for eid, e in ENTRIES.items()}
runner = CliRunner()

# Logs whose lines cannot be reproduced from the log alone, and why.
NOT_SELF_CONTAINED = {
    "vllm-21348-qwen3-235b-fp8-4xh100": "tp 4: the logged 8.11 GiB is rank 0's, vLLM sizes the pool by the smallest "
                                        "rank's (178,880 tokens = 11,180 blocks, 11,301 - 11,315 from rank 0's budget)",
}


def overrides(entry_id: str) -> dict:
    """What a user would pass for this start: the model (bundled id), GPU, release and options its corpus entry's
    ``kvplan:`` block plans it with, and the settings its log omits."""
    entry = ENTRIES[entry_id]
    out = corpus.explain_flags(entry.meta, parse_log(entry.log))
    gpu, memory = corpus_agreement.planned_gpu(entry.meta)  # neither: planned from the logged budget, any memory
    out["gpu" if gpu else "gpu_memory"] = gpu or f"{memory or corpus_agreement.NOMINAL_GPU_BYTES}B"
    return out


def fixtures() -> list[str]:
    """The earlier evidence file's starts (``origin: engine_reports.yaml``) that a kvplan block plans and whose log
    prints a capacity line."""
    ids = []
    for eid, entry in ENTRIES.items():
        block = entry.meta.get("kvplan") or {}
        if not corpus.from_earlier_file(entry.meta):
            continue
        if not block.get("model") or block.get("skip") or eid in NOT_SELF_CONTAINED:
            continue
        if parse_log(entry.log).has_capacity:
            ids.append(eid)
    return ids


FIXTURES = fixtures()


def test_the_fixtures_cover_the_formats():
    logs = {rid: parse_log(LOG[rid]) for rid in FIXTURES}
    assert len(logs) >= 20
    assert {lg.mode for lg in logs.values()} >= {"V0", "V1"}
    assert any(lg.engine == "sglang" for lg in logs.values())
    assert any(lg.refusal is not None for lg in logs.values())
    assert any((lg.tp or 1) > 1 for lg in logs.values()) and any((lg.pp or 1) > 1 for lg in logs.values())
    assert any(lg.padding_layers for lg in logs.values())  # a hybrid (sliding + full groups)
    assert any(lg.activation_gib is not None for lg in logs.values())  # a DEBUG / V0 term-by-term log


@pytest.mark.parametrize("report_id", FIXTURES)
def test_the_logged_terms_reproduce_the_log_exactly(report_id):
    log = parse_log(LOG[report_id])
    ex = explain(LOG[report_id], overrides(report_id))
    got = ex.from_logged
    assert ex.matches, ex.mismatches
    if log.kv_cache_tokens is not None:
        assert got.kv_cache_tokens == log.kv_cache_tokens
    if log.num_gpu_blocks is not None:
        assert got.num_blocks == log.num_gpu_blocks
    if log.max_concurrency is not None:
        assert f"{got.max_concurrency:.2f}" == f"{log.max_concurrency:.2f}"
    if log.refusal is not None:
        assert not got.starts
        if log.refusal.estimated_max_model_len is not None:
            assert got.longest_startable_len == log.refusal.estimated_max_model_len
        if log.refusal.kv_tokens is not None:  # V0 names the pool in tokens
            assert got.num_blocks * ex.plan.layout.block_size == log.refusal.kv_tokens


def test_a_rule_change_is_caught():
    # eole-gemma-3-1b (vLLM 0.13.0): 950,864 = num_blocks // 5 groups x 16; the 0.20.1+ rule (concurrency x length)
    # would print 950,832 +- a few tokens: with 0.20.1's rules the logged terms cannot reproduce the log.
    text = LOG["eole-gemma-3-1b-it-v0130-llm"]
    good = explain(text, overrides("eole-gemma-3-1b-it-v0130-llm"))
    assert good.matches and good.from_logged.kv_cache_tokens == 950_864
    bad = explain(text, {**overrides("eole-gemma-3-1b-it-v0130-llm"), "engine_version": "0.20.1"})
    assert bad.matches is False and any("KV cache tokens" in m for m in bad.mismatches)


def test_the_reconciliation_is_term_by_term():
    # vllm-12330 (V0 on an A100-40GB): every term printed. kvplan's activation is 8.15 GiB under the logged 9.37
    # (a 0.6.5/0.6.6 profiling artefact, docs/engines.md).
    ex = explain(LOG["vllm-12330-a100-40-llama3-8b"], overrides("vllm-12330-a100-40-llama3-8b"))
    rows = {row.name: row for row in ex.terms}
    assert rows["total"].logged_bytes == round(39.50 * GiB) == rows["total"].kvplan_bytes
    assert rows["activation"].logged_bytes == round(9.37 * GiB)
    assert abs(rows["activation"].difference_bytes / GiB + 8.15) < 0.01
    assert rows["kv_budget"].logged_bytes == round(11.12 * GiB)
    assert ex.from_logged.num_blocks == 5691 and ex.from_kvplan.num_blocks != 5691


def test_the_term_notes_say_what_each_release_charges_there():
    # the weights row is "Model loading took" (kvplan counts the rotary cache there too, not in the overhead); a
    # 0.27+ log's overhead is consumed memory: what stays allocated after the profile run (the V2 runner's sampler
    # states among it), and kvplan's overhead holds them
    v0 = {row.name: row for row in explain(LOG["vllm-12330-a100-40-llama3-8b"],
                                             overrides("vllm-12330-a100-40-llama3-8b")).terms}
    assert "Model loading took" in v0["weights"].note and "overhead" not in v0["weights"].note
    assert v0["overhead"].note.startswith("non-torch memory") and "0.27+" not in v0["overhead"].note
    rid = "vllm-f57905766703-2xrtxpro6000-qwen3-32b-tp2-util0426"
    v2 = {row.name: row for row in explain(LOG[rid], overrides(rid)).terms}
    assert "stays allocated after the profile run (0.27+)" in v2["overhead"].note
    assert v2["overhead"].kvplan_bytes > round(0.9 * GiB)  # 0.30 non-torch + 0.63 sampler states


def test_json_has_the_log_and_the_reconciliation():
    rid = "dennislee-2xa100-80-qwen2-7b-tp2"
    o = overrides(rid)
    args = ["explain", "-", "--model", o["model"], "--gpu", o["gpu"], "--json"]
    r = runner.invoke(app, args, input=LOG[rid])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["log"]["kv_cache_tokens"] == 1_192_160 and d["log"]["max_concurrency"] == 72.76
    assert d["log"]["version"] is None and d["log"]["tp"] == 2
    rec = d["reconciled"]
    assert rec["kv_cache_tokens_from_logged_terms"] == 1_192_160 == rec["kv_cache_tokens"]["log"]
    assert rec["kv_cache_tokens_from_kvplan_terms"] == rec["kv_cache_tokens"]["from_kvplan_terms"]
    assert rec["matches_log"] is True and rec["mismatches"] == []
    w = rec["terms"]["weights"]
    assert w["logged_bytes"] == round(7.1217 * GiB) and w["difference_bytes"] == w["kvplan_bytes"] - w["logged_bytes"]
    assert d["planned"]["tp"] == 2 and d["planned"]["engine"] == "vllm"


def test_terminal_output_ends_with_both_capacities():
    rid = "eole-gemma-3-1b-it-v0130-llm"
    o = overrides(rid)
    r = runner.invoke(app, ["explain", "-", "--model", o["model"], "--gpu-memory", o["gpu_memory"],
                            "--usage-context", "llm"], input=LOG[rid])
    assert r.exit_code == 0, r.output
    assert "950,864" in r.output and "reproduce every capacity line" in r.output
    assert "from kvplan's terms" in r.output


# --------------------------------------------------------------------------------- calibration


def test_calibrate_then_plan_exactly(tmp_path):
    # vllm-12330's terms, written to a calibration file, give the next plan of that deployment the logged budget
    rid = "vllm-12330-a100-40-llama3-8b"
    log = tmp_path / "vllm.log"
    log.write_text(LOG[rid])
    cal = tmp_path / "calib.yaml"
    r = runner.invoke(app, ["explain", str(log), "--model", "meta-llama/Meta-Llama-3-8B", "--calibrate", str(cal)])
    assert r.exit_code == 0, r.output
    entry = yaml.safe_load(cal.read_text())["calibrations"][0]
    assert {k: v for k, v in entry["terms"].items() if k != "overhead_bytes"} == {
        "activation_bytes": round(9.37 * GiB), "weights_bytes": round(14.96 * GiB)}
    assert abs(entry["terms"]["overhead_bytes"] - round(0.10 * GiB)) <= 0.02 * GiB
    assert (entry["release"], entry["gpu"], entry["max_num_batched_tokens"]) == ("0.6", "custom", 8192)
    args = ["estimate", "meta-llama/Meta-Llama-3-8B", "--gpu-memory", "39.5GiB", "--engine-version", "0.6",
            "--context", "8192", "--calibration", str(cal), "--json"]
    d = json.loads(runner.invoke(app, args).output)
    assert d["budget"]["activation_bytes"] == round(9.37 * GiB)
    assert any("calibration" in n and "used" in n for n in d["notes"])
    # floor(39.5 GiB x 0.9) - 14.96 - 9.37 - 0.10 GiB = 11.12 GiB of 2 MiB blocks: the logged 5,691 exactly (the
    # printed terms are fitted to it within their 0.01 GiB precision when they would give another count)
    assert d["pool"]["num_blocks"] == 5691
    # the same run again replaces the entry; another tp matches nothing and says so
    runner.invoke(app, ["explain", str(log), "--model", "meta-llama/Meta-Llama-3-8B", "--calibrate", str(cal)])
    assert len(yaml.safe_load(cal.read_text())["calibrations"]) == 1
    other = json.loads(runner.invoke(app, args[:-1] + ["--tp", "2", "--json"]).output)
    assert any("no entry for this deployment" in n for n in other["notes"])


def _prints_a_term(report_id: str) -> bool:
    log = parse_log(LOG[report_id])
    return any(v is not None for v in (log.weights_gib, log.activation_gib, log.peak_torch_memory_gib, log.non_torch_gib))


@pytest.mark.parametrize("report_id", [rid for rid in FIXTURES if _prints_a_term(rid)])
def test_a_calibrated_plan_reproduces_the_logs_blocks(report_id):
    # explain --calibrate, then a plan of the same deployment with that file: the log's block count, exactly
    # (the logs that print no budget term at all have nothing to calibrate: --calibrate says so)
    from kvplan.io.calibration import Calibration
    from kvplan.explain.calibrate import calibration_entry
    from kvplan.planning.plan import estimate, options_from_values

    ex = explain(LOG[report_id], overrides(report_id))
    entry = calibration_entry(ex, "log")
    plan = estimate(options_from_values({**ex.values, "calibration": Calibration("c.yaml", (entry,))}))
    assert any(n.startswith("calibration c.yaml: measured") for n in plan.budget.notes)
    if report_id in CANNOT_CALIBRATE:  # stored as printed, and the entry says why
        assert "stored as printed" in entry.note and plan.answer.num_blocks != ex.from_logged.num_blocks
        return
    assert plan.answer.num_blocks == ex.from_logged.num_blocks, entry.note


# Logs whose capacity no non-negative terms reproduce at the GPU total kvplan plans them with.
CANNOT_CALIBRATE = {
    "vllm-13061-2x4090-r1-distill-qwen-14b-refused": "the refusal is the driver rank's minimum, the weights line another "
                                                     "worker's: 5,096 blocks of 1.5 MiB + 13.95 GiB exceed 0.9 x the "
                                                     "catalogue 4090's 23.52 GiB",
}


def test_calibration_round_trip_on_vllm_10517_and_a_named_mismatch(tmp_path):
    # The RTX 3090 log prints 23.58 GiB total, 14.9888 GiB weights, peak 17.06 (activation 2.07), non-torch 0.35:
    # 23.58 x 0.9 - 14.9888 - 2.0712 - 0.35 = 3.8120 GiB = 1,951.7 blocks of 2 MiB, where the engine made 1,952
    # (its unrounded figures). The entry's overhead is fitted (-1.6 MB) so the calibrated plan gives 1,952.
    log = tmp_path / "vllm.log"
    log.write_text(LOG["vllm-10517-3090-llama31-8b-20k"])
    cal = tmp_path / "cal.yaml"
    model = ["meta-llama/Llama-3.1-8B-Instruct"]
    assert runner.invoke(app, ["explain", str(log), "--model", *model, "--calibrate", str(cal)]).exit_code == 0
    entry = yaml.safe_load(cal.read_text())["calibrations"][0]
    assert "fitted within their 0.01 GiB precision to the log's 1,952 blocks" in entry["note"]
    args = ["estimate", *model, "--max-model-len", "20000", "--context", "20000", "--engine-version", "0.6",
            "--calibration", str(cal), "--json"]
    d = json.loads(runner.invoke(app, args + ["--gpu-memory", "23.58GiB"]).output)
    assert d["pool"]["num_blocks"] == 1952
    # the catalogue's RTX 3090 reports another total: the note names the fields that differ and the fix
    other = json.loads(runner.invoke(app, args + ["--gpu", "rtx3090"]).output)
    note = next(n for n in other["notes"] if "no entry for this deployment" in n)
    assert "gpu custom (plan: RTX-3090-24GB)" in note and "gpu_memory_bytes 25,318,832,210 (plan: " in note
    assert "--gpu-memory 23.58GiB plans the logged total" in note and "max_num_seqs" not in note


def test_check_and_report_take_a_calibration(tmp_path):
    cal = tmp_path / "c.yaml"
    cal.write_text("calibrations: []\n")
    for cmd in ("check", "report"):
        example = ROOT / "docs" / "examples" / ("capacity.yaml" if cmd == "check" else "whatif.yaml")
        r = runner.invoke(app, [cmd, str(example), "--offline", "--calibration", str(cal), "--json"])
        assert r.exit_code in (0, 1), r.output
        assert "calibration" in r.output and ("no entry for this deployment" in r.output or
                                              "measured terms used in 0 of" in r.output)
    cal.write_text("calibrations:\n  - model: x\n")
    bad = runner.invoke(app, ["estimate", "meta-llama/Meta-Llama-3-8B", "--calibration", str(cal)])
    assert bad.exit_code == 2 and "calibrations[0]: field 'gpu' is missing" in bad.output


# --------------------------------------------------------------------------------- bad logs


def test_an_unknown_log_says_what_it_found_and_what_is_missing():
    with pytest.raises(ExplainError, match="found nothing kvplan recognises; missing the model"):
        log_values(parse_log("hello\nworld\n"))
    r = runner.invoke(app, ["explain", "-"], input="INFO 01-13 model_runner.py] Loading model weights took 14.9595 GB\n")
    assert r.exit_code == 2 and "found weights_gib" in r.output and "missing the model" in r.output
    assert "Traceback" not in r.output


V1_HEAD = ("INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.10.1.1\n"
           "INFO 05-01 10:00:05 [gpu_model_runner.py:1] Model loading took 14.99 GiB and 5.1 seconds\n")
NEGATIVE_BUDGET = V1_HEAD + ("INFO 05-01 10:00:10 [gpu_worker.py:1] Available KV cache memory: -5.00 GiB\n"
                             "INFO 05-01 10:00:10 [kv_cache_utils.py:1] GPU KV cache size: 0 tokens\n"
                             "INFO 05-01 10:00:10 [kv_cache_utils.py:1] Maximum concurrency for 8,192 tokens per request: 0.00x\n")
NO_MEMORY = V1_HEAD + ("ERROR 05-01 10:00:10 [core.py:1] ValueError: No available memory for the cache blocks. Try "
                       "increasing `gpu_memory_utilization` when initializing the engine.\n")
MODEL_8B = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192"]


@pytest.mark.parametrize("text, reason", [
    (NEGATIVE_BUDGET, "available KV cache memory -5.0 GiB: no memory for the cache blocks"),
    (NO_MEMORY, "no available memory for the cache blocks (line 3)"),
    (LOG["qwen-295-qwen15-7b-refused"],
     "max_model_len 32,768 is larger than the 7,344 tokens the KV cache holds"),
    (V1_HEAD + "ERROR 05-01 10:00:09 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
     "out of GPU memory (line 3) before the KV cache was sized"),  # in the profile run (was: 'missing the KV lines')
    (LOG["vllm-12330-a100-40-llama3-8b"] + "ERROR torch.OutOfMemoryError: CUDA out of memory\n",
     None),  # after the KV cache was sized (graph capture): the KV lines still reconcile; a warning shows it
    ("[2025-05-01 10:00:00] RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n",
     "no available memory for the cache blocks (line 1)"),  # SGLang's
])
def test_a_log_whose_engine_did_not_start_says_so(text, reason):
    """was: the log's column said the engine started (no max_model_len refusal line), and the verdict was
    'the logged terms reproduce every capacity line of the log exactly' with nothing about the start."""
    log = parse_log(text)
    assert (log.starts, log.not_started) == (reason is None, reason)


def test_explain_compares_the_logs_failed_start_with_kvplans_start_verdict():
    r = runner.invoke(app, ["explain", "-", *MODEL_8B, "--gpu", "H100", "--json"], input=NEGATIVE_BUDGET)
    assert r.exit_code == 0, r.output
    starts = json.loads(r.stdout)["reconciled"]["starts"]
    assert starts["log"] is False and starts["from_logged_terms"] is False  # -5 GiB: 0 blocks
    assert starts["log_reason"] == "available KV cache memory -5.0 GiB: no memory for the cache blocks"
    assert starts["from_kvplan_terms"] is True and starts["kvplan_reason"] is None  # an 8B fits an H100
    r = runner.invoke(app, ["explain", "-", *MODEL_8B, "--gpu", "H100"], input=NEGATIVE_BUDGET, env={"COLUMNS": "200"})
    assert "the engine did not start: available KV cache memory -5.0 GiB" in r.stdout
    assert "kvplan's own terms start it with" in r.stdout and "kvplan's plan is more optimistic" in r.stdout
    assert "reproduce every capacity line" not in r.stdout
    # a 70B on one H100: kvplan does not start it either, and says why
    r = runner.invoke(app, ["explain", "-", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--max-model-len", "8192",
                            "--gpu", "H100"], input=NO_MEMORY, env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "the engine did not start: no available memory for the cache blocks (line 3); kvplan's own terms do not " \
           "start it either (no memory left for the KV cache" in r.stdout


def test_calibrating_from_a_failed_start_keeps_its_negative_budget(tmp_path):
    """0 blocks is a floor, not the measurement: was an activation of 60 GB implied by '0 blocks', which a
    calibrated plan turned into a budget of +0.0 GiB instead of the logged -5.00 GiB."""
    cal = tmp_path / "calib.yaml"
    r = runner.invoke(app, ["explain", "-", *MODEL_8B, "--gpu", "H100", "--calibrate", str(cal)], input=NEGATIVE_BUDGET)
    assert r.exit_code == 0, r.output
    entry = yaml.safe_load(cal.read_text())["calibrations"][0]
    assert "implied by the log's KV budget of -5.00 GiB (the engine did not start)" in entry["note"]
    d = json.loads(runner.invoke(app, ["estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100",
                                       "--max-model-len", "8192", "--engine-version", "0.10.1.1", "--calibration",
                                       str(cal), "--json"]).output)
    assert abs(d["budget"]["kv_budget_bytes"] - (-5 * GiB)) <= 0.005 * GiB  # the logged budget, to its print precision
    assert d["answer"]["limited_by"] == "refused" and d["engine_report"]["refusal"]


@pytest.mark.parametrize("line, number", [
    ("GPU KV cache size: 409,6001234567890123456789 tokens", "409,6001234567890123456789"),  # misplaced commas
    ("GPU KV cache size: 99999999999999999999 tokens", "99999999999999999999"),  # was read as 1e20 (float)
    ("Available KV cache memory: 1,2.34 GiB", "1,2.34"),
    ("Maximum concurrency for 8,19 tokens per request: 5.00x", "8,19"),
    ("max_seq_len=" + "9" * 5000 + ",", "9" * 40),  # was: int() of 5,000 digits, a ValueError traceback
    ("non-default args: {'max_model_len': 10**30}", None),  # not a literal: the dict is skipped as garbled
    ("non-default args: {'max_model_len': " + "1" * 31 + "}", "1" * 31),  # was: max_model_len 10^30 planned
    ("vllm serve x --max-model-len 12ab", "12ab"),  # was: silently dropped
])
def test_numbers_no_engine_prints_are_errors_naming_the_line(line, number):
    text = NEGATIVE_BUDGET.replace("Available KV cache memory: -5.00 GiB", "Available KV cache memory: 50.00 GiB")
    text = text.replace("GPU KV cache size: 0 tokens", "x") + f"INFO 05-01 10:00:11 [x.py:1] {line}\n"
    log = parse_log(text)  # the parser flags, never raises
    if number is None:
        assert log.unreadable == () and log.max_model_len == 8192  # from the concurrency line
        return
    (flag,) = log.unreadable
    assert flag.startswith(f"line 6: cannot read the number {number!r}")
    r = runner.invoke(app, ["explain", "-", *MODEL_8B, "--gpu", "H100"], input=text)
    assert r.exit_code == 2 and "Traceback" not in r.output
    (err,) = r.stderr.strip().splitlines()
    assert err.startswith("kvplan: error: the log has numbers no engine prints: line 6: cannot read the number")


LOGS = [LOG[rid] for rid in ("eole-gemma-3-1b-it-v0130-llm", "vllm-12330-a100-40-llama3-8b",
                             "rocm-blog-r1-distill-qwen-14b-tp2-v0111")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(LOGS) - 1), cut=st.floats(0, 1),
       noise=st.text(max_size=40) | st.text(alphabet="0123456789,.-", max_size=5000),  # garbled numbers too
       at=st.floats(0, 1), drop=st.booleans())
def test_truncated_or_garbled_logs_never_crash(which, cut, noise, at, drop):
    text = LOGS[which][: int(len(LOGS[which]) * cut)]
    pos = int(len(text) * at)
    text = text[:pos] + noise + text[pos + (len(noise) if drop else 0):]
    log = parse_log(text)  # the parser never raises
    assert isinstance(log.to_dict(), dict)
    numbers = [v for v in log.to_dict().values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert all(abs(v) <= 1 << 32 for v in numbers), numbers  # what it cannot read is flagged, not misread
    try:
        ex = explain(text, {"model": "google/gemma-3-1b-it", "gpu": "H100", "offline": True})
    except KvplanError as exc:
        assert exc.exit_code == 2 and exc.message
    else:
        assert ex.from_kvplan.num_blocks >= 0


def test_the_logs_warnings_are_shown():
    rid = "eole-gemma-3-1b-it-v0130-llm"
    o = overrides(rid)
    r = runner.invoke(app, ["explain", "-", "--gpu-memory", o["gpu_memory"]], input=LOG[rid])
    assert r.exit_code == 0 and "! log:" in r.output and "Add 2 padding layers" in r.output


def test_a_long_warning_wraps_whole_at_80_columns():
    """A warning longer than a line is wrapped at word boundaries, never cut ("... or P2P t" was)."""
    rid = "dennislee-2xa100-80-qwen2-7b-tp2"
    warning = next(line.strip() for line in LOG[rid].splitlines() if "WARNING" in line)
    assert len(warning) > 160 and warning.endswith("P2P test failed.")
    r = runner.invoke(app, ["explain", "-", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "A100-PCIe-80GB",
                            "--engine-version", "0.10.1.1"], input=LOG[rid], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    start = next(i for i, line in enumerate(lines) if line.startswith("! log:"))
    shown = " ".join(line.strip() for line in lines[start:start + 4])
    assert "! log: " + warning in shown


def test_vllm_human_readable_integers_on_a_serve_line_are_read():
    # vLLM takes --max-model-len 32k (10^3) and 1K (2^10); they were dropped, now read, not flagged
    log = parse_log("vllm serve meta-llama/Llama-3.1-8B --max-model-len 32k --max-num-seqs 1K\n")
    assert (log.max_model_len, log.max_num_seqs, log.unreadable) == (32_000, 1_024, ())
