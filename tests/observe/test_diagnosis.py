"""observe's diagnosis from what the page says, and a server that stops answering (issue 22).

Before, on a real vLLM CPU server: with prefix caching on observe compared 96 running requests with the 28
its plan fits without sharing ("requests were shorter than --context": they were exactly as long, and
shared a prefix); with caching off it blamed shorter requests in runs with 47-57 preemptions and the pool
at 98-100%; with ``--gpu cpu`` it failed before the first poll although the endpoint reports
``kv_cache_memory_bytes``; its hint said ``--model tiny-llama`` for a ``--served-model-name`` alias; its
assumptions left out the prefix; a server killed mid-run (15 of 21 polls failed) was exit 0, no finding.

The pages here are written from vLLM's metric definitions (tests/metrics_pages.py) with the real server's
cache config; tests/observe/test_real_server.py replays the pages the real server served.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app

try:
    from tests.metrics_pages import ReplayServer, Reply, simulate_observe_time, vllm_v1_page
except ImportError:  # pragma: no cover - depends on how pytest was started
    from metrics_pages import ReplayServer, Reply, simulate_observe_time, vllm_v1_page  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "benchmarks" / "real_server_model")


@pytest.fixture(autouse=True)
def _no_waiting_between_polls(monkeypatch):
    """Every ``kvplan observe`` here keeps simulated time between its polls (tests/metrics_pages.py): the polls
    its flags ask for, without sleeping through the interval (real time: tests/observe/test_real_server.py)."""
    simulate_observe_time(monkeypatch)
SERVED = "tiny-llama"
# the real server's cache config: 72 MiB = 288 blocks of 128 tokens (2,048 B a token)
CPU_CONFIG = {"num_gpu_blocks": 288, "block_size": 128, "kv_cache_memory_bytes": 75497472,
              "enable_prefix_caching": "True"}
PLAN = ("--model", TINY, "--served-model-name", SERVED, "--gpu", "cpu", "--max-model-len", "2048", "--context", "1184")
runner = CliRunner()


def page(running: float, usage: float, preemptions: float, queries: float, hits: float, waiting: float = 0,
         config: dict | None = None) -> str:
    return vllm_v1_page(dict(model_name=SERVED, usage=usage, running=running, waiting=waiting, preemptions=preemptions,
                             queries=queries, hits=hits, prompt=queries, generation=queries / 8),
                        config={**CPU_CONFIG, **(config or {})})


def observe_json(pages: list, *args: str) -> tuple[int, dict, str]:
    with ReplayServer(pages) as srv:
        r = runner.invoke(app, ["observe", srv.url, "--duration", "0.3", "--interval", "0.1", "--json", *args])
    return r.exit_code, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}), r.stderr


def comparison(doc: dict) -> dict:
    (c,) = doc["plan"]["comparison"]
    return c


def test_sharing_is_credited_from_the_hit_rate_and_named():
    # 48 running, 97% of the prompt tokens hit the prefix cache during the run, no preemption, pool at 35%
    code, doc, err = observe_json([page(48, 0.35, 0, 10_000, 9_000), page(48, 0.35, 0, 110_000, 106_000)], *PLAN)
    assert code == 0, err
    c = comparison(doc)
    assert c["cause"] == "sharing" and c["fits_unshared"] == 28
    # hit rate 97% x --context 1,184 (the page has no request histograms) = 1,148 tokens: 8 full blocks stored once;
    # each request then holds 10 - 8 = 2 blocks of its own: (288 - 1 - 8) // 2 = 139
    assert c["prefix_tokens"] == 1148 and c["fits_shared"] == 139
    (finding,) = doc["findings"]
    assert "48 requests ran at once, more than the 28 the plan fits at 1,184 tokens without sharing" in finding
    assert "prefix-cache hits" in finding and "--prefix-tokens 1148" in finding and "shorter" not in finding
    sources = {a["name"]: (a["value"], a["source"]) for a in doc["plan"]["assumptions"]}
    assert sources["prefix_tokens"] == (1148, "endpoint: prefix hit rate 97.0% of --context 1,184")


def test_a_given_prefix_that_explains_the_peak_is_agreement_not_a_finding():
    code, doc, err = observe_json([page(96, 0.69, 0, 10_000, 9_000), page(96, 0.69, 0, 110_000, 106_000)], *PLAN,
                                  "--prefix-tokens", "1024")
    assert code == 0, err
    c = comparison(doc)
    assert c["cause"] == "sharing" and doc["findings"] == [] and c["fits_shared"] == 139
    assert any("agrees with the plan's prefix sharing: 96 running, more than the 28" in line for line in c["lines"])
    sources = {a["name"]: (a["value"], a["source"]) for a in doc["plan"]["assumptions"]}
    assert sources["prefix_tokens"] == (1024, "--prefix-tokens")


def test_preemptions_and_a_full_pool_name_the_pool_not_shorter_requests():
    # caching off: 31 running (more than the 28 that fit at 1,184 tokens: they are admitted at their prompt's
    # 9 blocks and grow), 50 preemptions in the run, the pool at 100%, requests waiting
    off = {"enable_prefix_caching": "False"}
    code, doc, err = observe_json([page(31, 0.98, 10, 0, 0, 17, off), page(31, 1.0, 60, 0, 0, 17, off)], *PLAN)
    assert code == 0, err
    c = comparison(doc)
    assert c["cause"] == "pool" and c["prefix_tokens"] == 0
    (finding,) = doc["findings"]
    assert finding.startswith(f"{SERVED} engine=0: the pool binds (50 preemptions in the run, pool peak 100%)")
    assert "shorter" not in finding


def test_a_full_pool_with_a_queue_binds_without_a_preemption():
    code, doc, _ = observe_json([page(28, 0.99, 0, 0, 0, 5), page(28, 1.0, 0, 0, 0, 9)], *PLAN)
    assert comparison(doc)["cause"] == "pool" and "the pool binds (pool peak 100%)" in doc["findings"][0]


def test_within_the_plan_is_agreement():
    code, doc, _ = observe_json([page(10, 0.2, 0, 1000, 950), page(12, 0.25, 0, 5000, 4800)], *PLAN)
    assert code == 0 and comparison(doc)["cause"] == "agreement" and doc["findings"] == []
    assert any(line.startswith("agrees with the plan: 12 running, within the") for line in comparison(doc)["lines"])


def test_more_running_with_no_sharing_and_no_full_pool_is_shorter_requests():
    code, doc, _ = observe_json([page(40, 0.6, 0, 1000, 0), page(40, 0.6, 0, 9000, 0)], *PLAN)
    assert comparison(doc)["cause"] == "shorter"
    assert "40 requests ran at once, more than the 28 the plan fits at 1,184 tokens: requests were shorter" in doc["findings"][0]


def test_gpu_cpu_plans_with_the_endpoints_kv_budget():
    """Before: 'GPU 'cpu' has no fixed memory' before the first poll, although the endpoint says the budget."""
    code, doc, err = observe_json([page(10, 0.2, 0, 1000, 950)], *PLAN)
    assert code == 0, err
    assert doc["plan"]["estimate"]["pool"]["num_blocks"] == 288
    assert doc["plan"]["from_endpoint"]["kv_budget"] == "kv_cache_memory_bytes=75497472"
    assert "(equal)" in comparison(doc)["lines"][0]


def test_gpu_cpu_with_no_budget_anywhere_is_one_error_after_the_run():
    code, doc, err = observe_json([page(10, 0.2, 0, 1000, 950, config={"kv_cache_memory_bytes": "None"})], *PLAN)
    assert code == 2 and doc["polls"] >= 1  # the observation is shown, then the error
    assert "no plan to compare with" in err and "kv_cache_memory_bytes" in err and "--kv-budget" in err
    with ReplayServer([page(10, 0.2, 0, 1000, 950, config={"kv_cache_memory_bytes": "None"})]) as srv:
        text = runner.invoke(app, ["observe", srv.url, "--duration", "0.1", "--interval", "0.1", *PLAN]).stdout
    text = " ".join(text.split())
    assert "plan: not yet (GPU 'cpu' has no fixed memory" in text and "waiting for the endpoint's kv_cache_memory_bytes" in text
    bad = runner.invoke(app, ["observe", "http://127.0.0.1:1/metrics", "--model", TINY, "--gpu", "cpu", "--tp", "0"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output  # other bad options still fail before polling


def test_an_alias_model_name_gets_the_served_model_name_hint():
    with ReplayServer([page(10, 0.2, 0, 1000, 950)]) as srv:
        planned = runner.invoke(app, ["observe", srv.url, "--duration", "0.1", "--interval", "0.1", "--json",
                                      "--model", TINY, "--gpu", "cpu", "--kv-budget", "72MiB"])
        waiting = runner.invoke(app, ["observe", srv.url, "--duration", "0.1", "--interval", "0.1", "--json",
                                      "--model", TINY, "--gpu", "cpu"])
        bare = runner.invoke(app, ["observe", srv.url, "--duration", "0.1", "--interval", "0.1"])
    assert planned.exit_code == 0, planned.output
    (finding,) = json.loads(planned.stdout)["findings"]
    # the plan waited for the endpoint's budget, but no series serves it: the finding, then one error line
    assert json.loads(waiting.stdout)["findings"] == [finding.replace("'real_server_model'", f"'{TINY}'")]
    assert waiting.exit_code == 2 and "no series serves the planned model" in waiting.stderr
    assert "'tiny-llama' may be a --served-model-name alias" in finding and "pass --served-model-name tiny-llama" in finding
    assert "pass --model tiny-llama" not in finding
    text = " ".join(bare.stdout.split())
    assert "--served-model-name tiny-llama" in text


# ---------------------------------------------------------------------------------------------
# a server that stops answering


def test_a_server_that_stops_answering_is_a_finding_and_fails_every_gate():
    pages = [page(8, 0.1, 0, 1000, 900), page(8, 0.1, 0, 2000, 1900)] + [Reply("", 503)] * 3
    with ReplayServer(pages) as srv:
        r = runner.invoke(app, ["observe", srv.url, "--duration", "0.4", "--interval", "0.1", "--json",
                                "--require", "preemptions_during_run == 0", "--require", "usage_peak < 0.95"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    failed = doc["failed_polls"]
    assert failed >= 2 and doc["outages"][-1]["end_s"] is None and doc["outages"][-1]["failed_polls"] == failed
    (finding,) = doc["findings"]
    assert finding.startswith("the endpoint stopped answering at ") and f"the last {failed} of {doc['polls']} polls failed" in finding
    assert doc["passed"] is False
    for gate in doc["gates"]:
        assert not gate["passed"] and f"{failed} of {doc['polls']} polls did not read the endpoint" in gate["message"]
    with ReplayServer(pages) as srv:
        text = runner.invoke(app, ["observe", srv.url, "--duration", "0.4", "--interval", "0.1"]).stdout
    assert "finding: the endpoint stopped answering at" in " ".join(text.split())


def test_an_outage_in_the_middle_says_when_and_recovers():
    pages = [page(8, 0.1, 0, 1000, 900), Reply("", 503), Reply("", 503), page(8, 0.1, 0, 3000, 2800)]
    with ReplayServer(pages) as srv:
        r = runner.invoke(app, ["observe", srv.url, "--duration", "0.5", "--interval", "0.1", "--json"])
    doc = json.loads(r.stdout)
    (o,) = doc["outages"]
    assert o["failed_polls"] == 2 and o["end_s"] is not None and o["end_s"] > o["start_s"]
    assert any(f.startswith("the endpoint did not answer from") and "2 polls failed" in f for f in doc["findings"])


def test_every_poll_read_means_no_outage_and_gates_judge_the_summary():
    with ReplayServer([page(8, 0.1, 0, 1000, 900)]) as srv:
        r = runner.invoke(app, ["observe", srv.url, "--duration", "0.2", "--interval", "0.1", "--json",
                                "--require", "usage_peak < 0.95"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["outages"] == [] and doc["findings"] == [] and doc["passed"] is True


@pytest.mark.parametrize("failed, polls", [(1, 5), (15, 21)])
def test_the_gate_message_counts_the_polls(failed, polls):
    from kvplan.observe.gates import evaluate, parse_gate
    from kvplan.observe.track import Tracker

    t = Tracker()
    t.add(0.0, {"usage": 0.5, "preemptions": 0})
    t.add(1.0, {"usage": 0.5, "preemptions": 0})
    ok = evaluate(parse_gate("preemptions_during_run == 0"), t.summary())
    assert ok.passed
    out = evaluate(parse_gate("preemptions_during_run == 0"), t.summary(), failed, polls)
    assert not out.passed and f"{failed} of {polls} polls did not read the endpoint" in out.message
