"""`kvplan observe`: pages in vLLM V1 / V0 and SGLang formats replayed by a loopback server, every number
of --json checked against the pages, each fault case, the plan comparison and the --require gates."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvplan
from kvplan.cli.app import app
from kvplan.errors import InputError
from kvplan.observe.gates import evaluate, parse_gate
from kvplan.observe.metrics import PageError, parse_page
from kvplan.observe.scrape import endpoint
from kvplan.observe.session import Session, run
from kvplan.observe.track import Tracker
from kvplan.render.observe import csv_text, observation_to_dict, render_observation

try:
    from tests.metrics_pages import MODEL, ReplayServer, Reply, sglang_page, vllm_v0_page, simulate_observe_time, vllm_v1_page
except ImportError:  # pragma: no cover - depends on how pytest was started
    from metrics_pages import MODEL, ReplayServer, Reply, sglang_page, vllm_v0_page, simulate_observe_time, vllm_v1_page  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_waiting_between_polls(monkeypatch):
    """Every ``kvplan observe`` here keeps simulated time between its polls (tests/metrics_pages.py): the polls
    its flags ask for, without sleeping through the interval (real time: tests/observe/test_real_server.py and
    the subprocess run below)."""
    simulate_observe_time(monkeypatch)


def observe(*args: str):
    return runner.invoke(app, ["observe", *args])


class FakeClock:
    """Monotonic time that only sleep() advances: the loop polls at exactly 0, interval, 2 x interval, ..."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def observe_fake_time(url: str, polls: int, interval: float = 1.0, timeout: float = 2.0):
    clock = FakeClock()
    session = Session(endpoint(url), interval_s=interval, duration_s=interval * (polls - 1), timeout_s=timeout,
                      clock=clock, wall=lambda: 1.7e9 + clock.now)
    return run(session, sleep=clock.sleep)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A vLLM V1 run: traffic builds up, the server restarts before poll 3 (every counter drops), then goes on.
V1_RUN = [
    dict(usage=0.10, running=2, waiting=0, preemptions=3, queries=1000, hits=250, prompt=5000, generation=2000),
    dict(usage=0.35, running=6, waiting=1, preemptions=4, queries=1800, hits=650, prompt=9000, generation=2600),
    dict(usage=0.80, running=9, waiting=4, preemptions=6, queries=2600, hits=1050, prompt=13000, generation=3400),
    dict(usage=0.05, running=1, waiting=0, preemptions=0, queries=200, hits=50, prompt=400, generation=100),
    dict(usage=0.20, running=3, waiting=0, preemptions=1, queries=600, hits=250, prompt=2400, generation=700),
]


# ---------------------------------------------------------------------------------------------
# pages -> readings


def test_v1_page_reads_every_field_and_the_cache_config():
    page = parse_page(vllm_v1_page(V1_RUN[0]))
    (s,) = page.series
    assert s.engine == "vLLM V1" and dict(s.labels) == {"engine": "0", "model_name": MODEL}
    assert dict(s.values) == {"usage": 0.10, "running": 2, "waiting": 0, "preemptions": 3, "prefix_queries": 1000,
                              "prefix_hits": 250, "prompt_tokens": 5000, "generation_tokens": 2000}
    assert s.names["usage"] == "vllm:kv_cache_usage_perc" and s.names["preemptions"] == "vllm:num_preemptions_total"
    assert (s.num_gpu_blocks, s.block_size) == (27732, 16)
    assert s.missing() == ()


def test_v1_prefers_the_new_usage_name_over_the_deprecated_one():
    (s,) = parse_page(vllm_v1_page({**V1_RUN[0], "gpu_usage": 0.99}, deprecated_names=True)).series
    assert s.values["usage"] == 0.10 and s.names["usage"] == "vllm:kv_cache_usage_perc"


def test_v1_two_engines_and_two_models_are_separate_series_with_their_own_cache_config():
    page = parse_page(vllm_v1_page({**V1_RUN[0], "engine": "0", "config": {"num_gpu_blocks": 1000}},
                                   {**V1_RUN[1], "engine": "1", "config": {"num_gpu_blocks": 2000}}))
    by_engine = {dict(s.labels)["engine"]: s for s in page.series}
    assert by_engine["0"].values["running"] == 2 and by_engine["0"].num_gpu_blocks == 1000
    assert by_engine["1"].values["running"] == 6 and by_engine["1"].num_gpu_blocks == 2000
    two_models = parse_page(vllm_v1_page(V1_RUN[0], {**V1_RUN[2], "model_name": "Qwen/Qwen3-8B", "engine": "1"}))
    assert sorted(s.name for s in two_models.series) == ["Qwen/Qwen3-8B engine=1", f"{MODEL} engine=0"]


def test_v0_page_uses_the_v0_names_and_the_hit_rate_gauge():
    (s,) = parse_page(vllm_v0_page(dict(usage=0.42, running=7, waiting=2, swapped=0, cpu_usage=0.0, hit_rate=0.31,
                                        preemptions=5, prompt=100, generation=50), num_gpu_blocks=8000)).series
    assert s.engine == "vLLM V0" and dict(s.labels) == {"model_name": MODEL}
    assert dict(s.values) == {"usage": 0.42, "running": 7, "waiting": 2, "prefix_hit_rate": 0.31, "preemptions": 5,
                              "prompt_tokens": 100, "generation_tokens": 50}
    assert s.names["usage"] == "vllm:gpu_cache_usage_perc"
    assert s.num_gpu_blocks == 8000 and s.missing() == ()


def test_sglang_page_folds_model_level_counters_into_the_rank_series():
    (s,) = parse_page(sglang_page(dict(usage=0.28, running=162, waiting=3, hit_rate=0.0075, max_tokens=400_000,
                                       retracted=2, prompt=8_128_902, generation=7_557_572), ranks=True)).series
    assert s.engine == "SGLang" and dict(s.labels)["tp_rank"] == "0"
    assert dict(s.values) == {"usage": 0.28, "running": 162, "waiting": 3, "prefix_hit_rate": 0.0075,
                              "max_total_tokens": 400_000, "preemptions": 2, "prompt_tokens": 8_128_902,
                              "generation_tokens": 7_557_572}


def test_missing_metrics_are_named_with_the_names_looked_for():
    (s,) = parse_page(sglang_page(dict(usage=0.5, running=1, waiting=0, hit_rate=0.2, prompt=1, generation=1))).series
    assert s.missing() == ("preemptions (sglang:num_retracted_requests_total)", "max_total_tokens (sglang:max_total_num_tokens)")
    (v,) = parse_page(vllm_v1_page({"usage": 0.5, "running": 1, "waiting": 0}, cache_config=False)).series
    assert "preemptions (vllm:num_preemptions_total)" in v.missing()
    assert "num_gpu_blocks (vllm:cache_config_info)" in v.missing()


@pytest.mark.parametrize("body, says", [
    ("<html><body><h1>Welcome</h1></body></html>", "not a Prometheus text page"),
    ('{"status": "ok"}', "not a Prometheus text page"),
    ("", "no vLLM or SGLang metric"),
    ("# TYPE process_open_fds gauge\nprocess_open_fds 12.0\n", "no vLLM or SGLang metric on the page (1 other"),
])
def test_pages_kvplan_cannot_use_say_why(body, says):
    with pytest.raises(PageError, match=None) as exc:
        parse_page(body)
    assert says in exc.value.message


# ---------------------------------------------------------------------------------------------
# values a server can send that kvplan cannot use


def strict_json(text: str):
    """json.loads that refuses NaN / Infinity (Python's json writes and reads them; JSON has no such thing)."""
    def refuse(name: str):
        raise AssertionError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("field, value, why", [
    ("usage", "NaN", "invalid vllm:kv_cache_usage_perc nan: not a finite number"),
    ("usage", 1.5, "invalid vllm:kv_cache_usage_perc 1.5: must be <= 1"),
    ("usage", -0.1, "invalid vllm:kv_cache_usage_perc -0.1: must be >= 0"),
    ("running", "+Inf", "invalid vllm:num_requests_running inf: not a finite number"),
    ("waiting", -1, "invalid vllm:num_requests_waiting -1.0: must be >= 0"),
    ("preemptions", -3, "invalid vllm:num_preemptions_total -3.0: must be >= 0"),
    ("prompt", "-Inf", "invalid vllm:prompt_tokens_total -inf: not a finite number"),
    ("generation", 2.0**60, "invalid vllm:generation_tokens_total 1.152921504606847e+18: must be <= 9,007,199,254,740,992"),
    ("hits", 2000, "invalid vllm:prefix_cache_hits_total 2000.0: more hits than vllm:prefix_cache_queries_total 1000.0"),
])
def test_a_value_no_server_can_mean_is_left_out_and_named(field, value, why):
    (s,) = parse_page(vllm_v1_page({**V1_RUN[0], field: value})).series
    fld = {"prompt": "prompt_tokens", "generation": "generation_tokens", "hits": "prefix_hits"}.get(field, field)
    assert fld not in s.values and dict(s.rejected) == {fld: why}
    assert not any(m.startswith(fld) for m in s.missing())  # it was there: rejected, not missing
    assert len(s.values) == 7  # the other seven fields of V1_RUN[0] are read


def test_sglang_fractions_and_vllm_v0_hit_rate_off():
    (g,) = parse_page(sglang_page(dict(usage=0.5, running=1, waiting=0, hit_rate=1.2, max_tokens="NaN",
                                       retracted=0, prompt=1, generation=1))).series
    assert dict(g.rejected) == {"prefix_hit_rate": "invalid sglang:cache_hit_rate 1.2: must be <= 1",
                                "max_total_tokens": "invalid sglang:max_total_num_tokens nan: not a finite number"}
    # vLLM V0 sends -1 when prefix caching is off ("-1 means not supported or disabled"): no hit rate, not missing
    (v,) = parse_page(vllm_v0_page(dict(usage=0.4, running=1, waiting=0, hit_rate=-1, preemptions=0, prompt=1,
                                        generation=1))).series
    assert "prefix_hit_rate" not in v.values and v.missing() == ()
    assert v.rejected["prefix_hit_rate"].startswith("vllm:gpu_prefix_cache_hit_rate is -1: prefix caching is off")


def test_bad_values_never_reach_the_json():
    """The tester's page: usage NaN, running +Inf, waiting -1, hits above queries: --json is strict JSON, the
    figures come from the valid polls only, and each bad value is one event line naming metric and value."""
    bad = dict(usage="NaN", running="+Inf", waiting=-1, preemptions=3, queries=1000, hits=2000, prompt=5000,
               generation=2000)
    pages = [vllm_v1_page(bad), vllm_v1_page(bad), vllm_v1_page(V1_RUN[1])]
    with ReplayServer(pages) as srv:
        r = observe(srv.url, "--duration", "0.2", "--interval", "0.1", "--json")
    assert r.exit_code == 0, r.output
    doc = strict_json(r.stdout)  # was: "kv_cache_usage_peak": NaN, "running_peak": Infinity
    s = doc["summary"]
    polls = doc["polls"]
    assert polls >= 3
    # only polls 2.. read V1_RUN[1] (usage 0.35, running 6, waiting 1, hits 650 of 1800)
    assert (s["kv_cache_usage_peak"], s["running_peak"], s["waiting_peak"]) == (0.35, 6, 1)
    assert s["prefix_hit_rate"] == pytest.approx(650 / 1800, abs=1e-6)  # was: 2 (hits above queries)
    assert [x["kv_cache_usage"] for x in doc["samples"][:2]] == [None, None]
    assert [x["running"] for x in doc["samples"][:2]] == [None, None]
    assert doc["samples"][0]["prefix_hit_rate"] is None and doc["samples"][0]["prefix_cache_queries"] == 1000
    assert doc["series"][0]["rejected_values"] == {
        "vllm:kv_cache_usage_perc": 2, "vllm:num_requests_running": 2, "vllm:num_requests_waiting": 2,
        "vllm:prefix_cache_hits_total": 2}
    messages = [e["message"] for e in doc["events"]]
    who = f"{MODEL} engine=0"
    assert messages == [  # one line per metric when it turns bad (page order), not again while it stays so
        f"{who}: invalid vllm:num_requests_running inf: not a finite number: value left out",
        f"{who}: invalid vllm:num_requests_waiting -1.0: must be >= 0: value left out",
        f"{who}: invalid vllm:kv_cache_usage_perc nan: not a finite number: value left out",
        f"{who}: invalid vllm:prefix_cache_hits_total 2000.0: more hits than vllm:prefix_cache_queries_total "
        "1000.0: value left out"]
    assert all(e["poll"] == 0 for e in doc["events"])


def test_a_gate_on_a_value_only_ever_bad_fails():
    with ReplayServer([vllm_v1_page({**V1_RUN[0], "usage": "NaN"})]) as srv:
        r = observe(srv.url, "--duration", "0.1", "--interval", "0.1", "--require", "usage_peak < 0.95", "--json")
    assert r.exit_code == 1, r.output
    doc = strict_json(r.stdout)
    assert doc["summary"]["kv_cache_usage_peak"] is None and doc["passed"] is False


# ---------------------------------------------------------------------------------------------
# counters across restarts


def test_counter_reset_counts_the_new_value_as_the_increase():
    t = Tracker()
    for i, value in enumerate([2, 5, 1, 4]):  # restart after 5: increase 3 + 1 + 3 = 7
        row = t.add(float(i), {"preemptions": value})
    s = t.summary()
    assert s.preemptions_during_run == 7 and s.preemptions == 2 + 7 and s.counter_resets == 1
    assert s.preemptions_per_min == 7 * 60 / 3
    assert row["preemptions"] == 9 and row["resets"] == []


def test_two_engines_restarting_in_one_poll_are_one_restart():
    a = dict(usage=0.3, running=4, waiting=1, preemptions=5, queries=100, hits=50, prompt=10, generation=10)
    low = dict(a, preemptions=0, queries=10, hits=5, prompt=1, generation=1)
    pages = [vllm_v1_page(a, {**a, "engine": "1"}), vllm_v1_page(low, {**low, "engine": "1"})]
    with ReplayServer(pages) as srv:
        obs = observe_fake_time(srv.url, polls=2)
    assert obs.summary.counter_resets == 1  # was: 10, one per counter per engine
    assert [s.summary.counter_resets for s in obs.series] == [1, 1]
    assert [e.poll for e in obs.events] == [1, 1]  # each engine's line names its counters
    assert all("counters went down (generation_tokens, preemptions, prefix_hits, prefix_queries, prompt_tokens)"
               in e.message for e in obs.events)


# ---------------------------------------------------------------------------------------------
# bounds on what a long run keeps


def test_a_long_run_keeps_every_nth_sample_and_the_last_events(monkeypatch):
    from kvplan.observe import session as session_mod

    monkeypatch.setattr(session_mod, "MAX_SAMPLES", 4)
    monkeypatch.setattr(session_mod, "MAX_EVENTS", 3)
    clock = FakeClock()
    pages = iter([vllm_v1_page({**V1_RUN[0], "running": i}) for i in range(20)])
    s = Session(endpoint("127.0.0.1:1"), interval_s=1.0, duration_s=19.0, timeout_s=1.0, clock=clock,
                fetcher=lambda where, timeout: next(pages))
    obs = run(s, sleep=clock.sleep)
    # 20 polls, at most 4 kept: 0-4 (5) -> every 2nd (0 2 4); + 6 8 (5) -> every 4th (0 4 8); + 12 16 (5) ->
    # every 8th (0 8 16); polls 17-19 fall between
    assert [p.index for p in obs.polls] == [0, 8, 16] and obs.sample_stride == 8
    assert obs.num_polls == 20 and obs.summary.polls == 20 and obs.summary.running_peak == 19  # every poll counted
    assert obs.summary.running_mean == sum(range(20)) / 20
    thinned = [e for e in obs.events if e.message.startswith("over 4 samples")]
    assert [e.poll for e in thinned] == [4, 8, 16]
    assert "one poll in 8 is kept for the samples, evenly since the start" in thinned[-1].message
    doc = observation_to_dict(obs)
    assert (doc["sample_stride"], len(doc["samples"]), doc["events_dropped"]) == (8, 3, 0)
    many = Session(endpoint("127.0.0.1:1"), interval_s=1.0, duration_s=None, timeout_s=1.0, clock=clock,
                   fetcher=lambda where, timeout: "gone" if len(many.events) % 2 else vllm_v1_page(V1_RUN[0]))
    for _ in range(10):  # fail, recover, fail, ...: an event every poll
        many.poll()
    snap = many.snapshot()
    assert len(snap.events) == 3 and snap.events_dropped == many.num_events - 3 > 0


def test_session_refuses_timing_no_run_can_use():
    for kwargs in (dict(interval_s=float("nan")), dict(duration_s=float("inf")), dict(timeout_s=1e300),
                   dict(interval_s=0.01)):
        with pytest.raises(InputError):
            Session(endpoint("127.0.0.1:1"), **{"interval_s": 1.0, "duration_s": 1.0, "timeout_s": 1.0, **kwargs})


# ---------------------------------------------------------------------------------------------
# the polling loop against the replay server (fake clock: polls at 0, 1, 2, 3, 4 s)


def test_v1_run_with_a_restart_every_number_checked():
    with ReplayServer([vllm_v1_page(p) for p in V1_RUN]) as srv:
        obs = observe_fake_time(srv.url, polls=5)
    doc = observation_to_dict(obs)
    assert doc["polls"] == 5 and doc["failed_polls"] == 0 and doc["stopped"] == "duration"
    # samples: gauges as the pages say; counters reset-adjusted (poll 3 restarts from 0)
    assert [x["kv_cache_usage"] for x in doc["samples"]] == [p["usage"] for p in V1_RUN]
    assert [x["running"] for x in doc["samples"]] == [p["running"] for p in V1_RUN]
    assert [x["waiting"] for x in doc["samples"]] == [p["waiting"] for p in V1_RUN]
    assert [x["preemptions"] for x in doc["samples"]] == [3, 4, 6, 6 + 0, 6 + 1]
    assert [x["prefix_cache_queries"] for x in doc["samples"]] == [1000, 1800, 2600, 2600 + 200, 2600 + 600]
    assert [x["prompt_tokens_per_s"] for x in doc["samples"]] == [None, 4000, 4000, 400, 2000]
    assert doc["samples"][3]["counter_resets"] == ["generation_tokens", "preemptions", "prefix_hits",
                                                   "prefix_queries", "prompt_tokens"]
    assert [x["elapsed_s"] for x in doc["samples"]] == [0, 1, 2, 3, 4]
    s = doc["summary"]
    assert s["kv_cache_usage_now"] == 0.20 and s["kv_cache_usage_peak"] == 0.80
    assert s["kv_cache_usage_mean"] == pytest.approx((0.10 + 0.35 + 0.80 + 0.05 + 0.20) / 5)
    assert (s["running_now"], s["running_peak"], s["running_mean"]) == (3, 9, (2 + 6 + 9 + 1 + 3) / 5)
    assert (s["waiting_now"], s["waiting_peak"]) == (0, 4)
    assert s["preemptions_during_run"] == 1 + 2 + 0 + 1 and s["preemptions"] == 3 + 4
    assert s["preemptions_per_min"] == 4 * 60 / 4
    # hits 250 + 400 + 400 + 50 + 200 = 1300 of queries 1000 + 800 + 800 + 200 + 400 = 3200
    assert s["prefix_hit_rate"] == pytest.approx(1300 / 3200) and s["prefix_hit_rate_source"] == "counters"
    assert s["prefix_hit_rate_during_run"] == pytest.approx((400 + 400 + 50 + 200) / (800 + 800 + 200 + 400))
    assert s["prompt_tokens_per_s"] == (4000 + 4000 + 400 + 2000) / 4
    assert s["generation_tokens_per_s"] == (600 + 800 + 100 + 600) / 4
    # one restart dropped all five counters at poll 3: one reset (the sample names the five)
    assert (s["num_gpu_blocks"], s["block_size"], s["counter_resets"]) == (27732, 16, 1)
    assert [e["poll"] for e in doc["events"]] == [3] and "the server restarted" in doc["events"][0]["message"]
    assert doc["series"][0]["summary"] == s and doc["series"][0]["engine"] == "vLLM V1"


def test_sglang_run_uses_the_gauges():
    pages = [sglang_page(dict(usage=u, running=r, waiting=w, hit_rate=h, max_tokens=400_000, retracted=x,
                              prompt=p, generation=g))
             for u, r, w, h, x, p, g in [(0.2, 10, 0, 0.5, 0, 1000, 100), (0.6, 40, 5, 0.7, 2, 3000, 900)]]
    with ReplayServer(pages) as srv:
        obs = observe_fake_time(srv.url, polls=3, interval=0.5)
    s = observation_to_dict(obs)["summary"]
    assert (s["kv_cache_usage_now"], s["kv_cache_usage_peak"]) == (0.6, 0.6)
    assert s["kv_cache_usage_mean"] == pytest.approx((0.2 + 0.6 + 0.6) / 3)
    assert (s["running_peak"], s["waiting_peak"], s["preemptions"], s["preemptions_during_run"]) == (40, 5, 2, 2)
    assert s["prefix_hit_rate"] == 0.7 and s["prefix_hit_rate_source"] == "gauge"
    assert s["prefix_hit_rate_during_run"] == pytest.approx((0.5 + 0.7 + 0.7) / 3)
    assert s["generation_tokens_per_s"] == (900 - 100) / 1.0 and s["max_total_num_tokens"] == 400_000


def test_two_models_are_shown_separately_and_added_up():
    a = dict(usage=0.30, running=4, waiting=1, preemptions=0, queries=100, hits=50, prompt=10, generation=10)
    b = dict(usage=0.70, running=6, waiting=0, preemptions=2, queries=300, hits=30, prompt=20, generation=20)
    page = vllm_v1_page(a, {**b, "model_name": "Qwen/Qwen3-8B", "engine": "1"})
    with ReplayServer([page]) as srv:
        obs = observe_fake_time(srv.url, polls=2)
    doc = observation_to_dict(obs)
    by_name = {s["name"]: s["summary"] for s in doc["series"]}
    assert by_name[f"{MODEL} engine=0"]["running_peak"] == 4 and by_name["Qwen/Qwen3-8B engine=1"]["running_peak"] == 6
    s = doc["summary"]  # the fullest pool; requests and counters summed; hits pooled
    assert (s["kv_cache_usage_peak"], s["running_peak"], s["waiting_peak"], s["preemptions"]) == (0.70, 10, 1, 2)
    assert s["prefix_hit_rate"] == (50 + 30) / (100 + 300)
    assert set(doc["samples"][0]["series"]) == {f"{MODEL} engine=0", "Qwen/Qwen3-8B engine=1"}
    assert doc["samples"][0]["series"]["Qwen/Qwen3-8B engine=1"]["kv_cache_usage"] == 0.70
    assert doc["events"] == []  # both were there from the first poll


def test_a_series_that_appears_later_is_an_event():
    a = dict(usage=0.30, running=4, waiting=1, preemptions=0, queries=100, hits=50, prompt=10, generation=10)
    pages = [vllm_v1_page(a), vllm_v1_page(a, {**a, "engine": "1"})]
    with ReplayServer(pages) as srv:
        clock = FakeClock()
        session = Session(endpoint(srv.url), interval_s=1.0, duration_s=2.0, timeout_s=2.0, clock=clock)
        obs = run(session, sleep=clock.sleep)
        live = session.snapshot(with_polls=False)
    assert [(e.poll, e.message) for e in obs.events] == [(1, f"new series: {MODEL} engine=1 (vLLM V1)")]
    assert obs.summary.running_peak == 8 and obs.summary.polls == 3
    assert (live.num_polls, live.failed_polls, live.polls, live.summary) == (3, 0, (), obs.summary)


def test_faults_each_a_line_and_the_run_goes_on():
    good = vllm_v1_page(V1_RUN[0])
    pages = [good, Reply("not found", 404), Reply("<html><body>login</body></html>", 200, "text/html"),
             Reply("this is not a metrics page", 200), Reply(good, delay_s=4.0), good,
             vllm_v1_page({k: v for k, v in V1_RUN[1].items() if k != "preemptions"}), good]
    with ReplayServer(pages) as srv:
        # the timeout is long enough that a loaded machine answers the other polls in time, the delay far
        # past it (a 0.25 s timeout failed a healthy poll once under load)
        obs = observe_fake_time(srv.url, polls=8, timeout=1.5)
    errors = [p.error for p in obs.polls]
    assert errors[0] is None and errors[5] is None and errors[6] is None and errors[7] is None
    assert errors[1].endswith("HTTP 404 Not Found (is the path right? vLLM and SGLang serve /metrics; SGLang needs --enable-metrics)")
    assert "got an HTML page (text/html), not Prometheus metrics" in errors[2]
    assert "not a Prometheus text page" in errors[3]
    assert "no answer within 1.5 s (--timeout)" in errors[4]
    messages = [e.message for e in obs.events]
    assert messages[:4] == errors[1:5]
    assert "metrics readable again after 4 failed poll(s)" in messages[4]
    assert "does not report: preemptions (vllm:num_preemptions_total)" in messages[5]
    assert obs.summary.polls == 4 and obs.summary.running_peak == 6  # polls 0, 5, 6, 7 were read
    assert obs.summary.preemptions == 3


def test_unreachable_endpoint_fails_every_poll_with_one_line():
    url = f"http://127.0.0.1:{free_port()}/metrics"
    obs = observe_fake_time(url, polls=3)
    assert obs.read_polls == 0 and obs.failed_polls == 3
    assert [e.message for e in obs.events] == [f"{url}: connection refused (is the server up, and is this its port?)"]
    assert obs.summary.kv_cache_usage_peak is None


# ---------------------------------------------------------------------------------------------
# URLs, headers, gates


def test_endpoint_forms_and_credentials_never_shown():
    assert endpoint("127.0.0.1:8000").url == "http://127.0.0.1:8000/metrics"
    assert endpoint("http://host:30000/").url == "http://host:30000/metrics"
    assert endpoint("https://host/custom/metrics").url == "https://host/custom/metrics"
    e = endpoint("http://alice:s3cret@host:8000/metrics?token=abc", ["X-Api-Key: k3y"])
    assert "s3cret" not in e.display and "abc" not in e.display and "k3y" not in repr(e)
    assert dict(e.headers)["X-Api-Key"] == "k3y" and dict(e.headers)["Authorization"].startswith("Basic ")
    for bad in ("ftp://host/metrics", "", "http://:8000/metrics", "http://host:99999/metrics"):
        with pytest.raises(InputError):
            endpoint(bad)
    with pytest.raises(InputError, match="expected 'Name: value'"):
        endpoint("host:1", ["no colon here"])


def test_headers_are_sent():
    with ReplayServer([vllm_v1_page(V1_RUN[0])]) as srv:
        r = observe(srv.url, "--duration", "0.1", "--interval", "0.1", "--header", "Authorization: Bearer t0k3n", "--json")
        assert r.exit_code == 0, r.output
        assert srv.headers[0]["Authorization"] == "Bearer t0k3n"
    assert "t0k3n" not in r.stdout + r.stderr


def test_gate_vocabulary():
    g = parse_gate("usage_peak < 95%")
    assert (g.name, g.op, g.value) == ("kv_cache_usage_peak", "<", 0.95)
    assert parse_gate("headroom_pct >= 10%").value == 10 and parse_gate("preemptions==0").op == "=="
    with pytest.raises(InputError) as typo:
        parse_gate("preemption == 0")
    assert typo.value.one_line() == "unknown --require metric 'preemption' (did you mean 'preemptions'?)"
    with pytest.raises(InputError) as prose:
        parse_gate("usage_peak is low")
    assert "write NAME OP NUMBER" in prose.value.one_line()
    with pytest.raises(InputError, match="is not a fraction"):
        parse_gate("running_peak > 50%")


def test_gates_evaluate_on_the_summary_and_fail_on_what_is_not_reported():
    t = Tracker()
    t.add(0.0, {"usage": 0.9, "running": 5})
    s = t.summary()
    assert evaluate(parse_gate("usage_peak < 0.95"), s).passed
    assert not evaluate(parse_gate("usage_peak < 0.9"), s).passed
    h = evaluate(parse_gate("headroom_pct >= 10"), s)  # 100 x (1 - 0.9) = 10.0 %
    assert h.passed and h.actual == pytest.approx(10.0)
    missing = evaluate(parse_gate("preemptions == 0"), s)
    assert not missing.passed and "did not report preemptions" in missing.message


# ---------------------------------------------------------------------------------------------
# the command


def test_done_when_v1_page_json_with_the_plan():
    """`observe URL --duration 3 --interval 0.5 --json --model --gpu` reports what the page says, with the plan."""
    plan = kvplan.estimate(MODEL, gpu="H100", context=8192)
    page = vllm_v1_page(dict(usage=0.4375, running=12, waiting=3, preemptions=7, queries=4000, hits=3000,
                             prompt=52000, generation=9000), config={"num_gpu_blocks": plan.answer.num_blocks})
    with ReplayServer([page]) as srv:
        r = observe(srv.url, "--duration", "3", "--interval", "0.5", "--json", "--model", MODEL, "--gpu", "H100")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    s = doc["summary"]
    assert (s["kv_cache_usage_now"], s["kv_cache_usage_mean"], s["kv_cache_usage_peak"]) == (0.4375, 0.4375, 0.4375)
    assert (s["running_peak"], s["waiting_peak"], s["preemptions"], s["preemptions_during_run"]) == (12, 3, 7, 0)
    assert s["prefix_hit_rate"] == 3000 / 4000 and s["prefix_hit_rate_during_run"] is None
    assert (s["num_gpu_blocks"], s["block_size"]) == (plan.answer.num_blocks, 16)
    assert doc["polls"] == len(doc["samples"]) >= 2 and all(x["running"] == 12 for x in doc["samples"])
    (c,) = doc["plan"]["comparison"]
    assert (c["plan_num_blocks"], c["plan_max_requests"], c["running_peak"]) == (plan.answer.num_blocks, plan.answer.max_requests, 12)
    assert doc["findings"] == [] and "(equal)" in c["lines"][0]
    assert doc["plan"]["estimate"]["pool"]["num_blocks"] == plan.answer.num_blocks
    sources = {a["name"]: a["source"] for a in doc["plan"]["assumptions"]}
    assert sources["gpu_util"] == "endpoint: gpu_memory_utilization=0.92" and sources["gpu"] == "--gpu"


def test_blocks_mismatch_is_one_finding_and_the_endpoint_config_is_planned_with():
    page = vllm_v1_page(V1_RUN[0], config={"num_gpu_blocks": 20000, "gpu_memory_utilization": "0.8"})
    with ReplayServer([page]) as srv:
        r = observe(srv.url, "--duration", "0.2", "--interval", "0.1", "--json", "--model", MODEL, "--gpu", "H100")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    plan = kvplan.estimate(MODEL, gpu="H100", context=8192, gpu_util=0.8)  # the endpoint's utilisation
    assert doc["plan"]["estimate"]["pool"]["num_blocks"] == plan.answer.num_blocks
    (finding,) = doc["findings"]
    assert f"server 20,000 GPU blocks, plan {plan.answer.num_blocks:,}" in finding
    assert doc["plan"]["from_endpoint"] == {"gpu_util": "gpu_memory_utilization=0.8", "block_size": "block_size=16",
                                            "prefix_caching": "enable_prefix_caching=True"}


def test_plan_assumptions_say_default_for_what_the_user_did_not_pass():
    page = vllm_v1_page(V1_RUN[0], cache_config=False)
    with ReplayServer([page]) as srv:
        r = observe(srv.url, "--duration", "0.1", "--interval", "0.1", "--json", "--model", MODEL, "--gpu", "H100",
                    "--pp", "1")
        gpus = observe(srv.url, "--duration", "0.1", "--interval", "0.1", "--json", "--model", MODEL, "--gpus", "2")
    assert r.exit_code == 0 and gpus.exit_code == 0, r.output + gpus.output
    sources = {a["name"]: a["source"] for a in json.loads(r.stdout)["plan"]["assumptions"]}
    # was: "--tp", "--engine", "--context" although only --gpu and --pp were typed
    assert (sources["gpu"], sources["pp"]) == ("--gpu", "--pp")  # --pp 1 typed, though it is the default value
    assert sources["tp"] == sources["engine"] == sources["context_tokens"] == sources["dtype"] == "default"
    by_gpus = {a["name"]: (a["value"], a["source"]) for a in json.loads(gpus.stdout)["plan"]["assumptions"]}
    assert by_gpus["tp"] == (2, "--gpus") and by_gpus["pp"] == (1, "default")  # --gpus 2 alone means --tp 2


def test_sglang_endpoint_against_a_vllm_plan_says_so():
    page = sglang_page(dict(usage=0.2, running=3, waiting=0, hit_rate=0.1, retracted=0, prompt=1, generation=1,
                            max_tokens=123_456))
    with ReplayServer([page]) as srv:
        r = observe(srv.url, "--duration", "0.1", "--interval", "0.1", "--model", MODEL, "--gpu", "H100")
    assert r.exit_code == 0, r.output
    assert "the endpoint runs SGLang, the plan models vllm: pass --engine sglang" in " ".join(r.stdout.split())


def observe_json(page: str, *args: str) -> dict:
    with ReplayServer([page]) as srv:
        r = observe(srv.url, "--duration", "0.1", "--interval", "0.1", "--json", "--gpu", "H100", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_a_series_serving_another_model_is_named_and_not_compared():
    """was: compared with the plan for --model anyway (and adopted its cache config), e.g. 'plan 0 (n/a)'."""
    doc = observe_json(vllm_v1_page({**V1_RUN[0], "model_name": "Qwen/Qwen3-8B"},
                                    config={"gpu_memory_utilization": "0.5"}), "--model", MODEL)
    (finding,) = doc["findings"]
    assert finding == (f"Qwen/Qwen3-8B engine=0: the endpoint serves model 'Qwen/Qwen3-8B', not the planned '{MODEL}': "
                       "not compared with the plan (pass --model Qwen/Qwen3-8B to plan it)")
    (c,) = doc["plan"]["comparison"]
    assert c["compared"] is False and c["plan_num_blocks"] is None and c["plan_max_requests"] is None
    assert c["server_num_gpu_blocks"] == 27732 and c["lines"] == []
    assert doc["plan"]["from_endpoint"] == {}  # another model's gpu_memory_utilization 0.5 is not adopted
    assert doc["plan"]["estimate"]["assumptions"]["gpu_util"] != 0.5


def test_two_models_only_the_planned_one_is_compared_and_its_cache_config_adopted():
    page = vllm_v1_page({**V1_RUN[0], "model_name": "Qwen/Qwen3-8B", "engine": "0", "config": {"gpu_memory_utilization": "0.5"}},
                        {**V1_RUN[1], "engine": "1", "config": {"gpu_memory_utilization": "0.8"}})
    doc = observe_json(page, "--model", MODEL)
    by_series = {c["series"]: c for c in doc["plan"]["comparison"]}
    plan = kvplan.estimate(MODEL, gpu="H100", context=8192, gpu_util=0.8)  # the served model's utilisation
    assert by_series[f"{MODEL} engine=1"]["compared"] is True
    assert by_series[f"{MODEL} engine=1"]["plan_num_blocks"] == plan.answer.num_blocks
    assert by_series["Qwen/Qwen3-8B engine=0"]["compared"] is False
    assert doc["plan"]["from_endpoint"]["gpu_util"] == "gpu_memory_utilization=0.8"
    assert sum("not compared with the plan" in f for f in doc["findings"]) == 1


@pytest.mark.parametrize("label, args, compared", [
    ("/models/Llama-3.1-8B-Instruct/", (), True),  # vLLM labels a local checkpoint with its path
    ("META-LLAMA/llama-3.1-8b-instruct", (), True),
    ("llama8b", (), False),  # an alias of --served-model-name: not the same name ...
    ("llama8b", ("--served-model-name", "llama8b"), True),  # ... unless the user says so
    (MODEL, ("--served-model-name", "llama8b"), False),  # then only that exact label is the planned model
])
def test_which_series_serves_the_planned_model(label, args, compared):
    doc = observe_json(vllm_v1_page({**V1_RUN[0], "model_name": label}), "--model", MODEL, *args)
    (c,) = doc["plan"]["comparison"]
    assert c["compared"] is compared
    assert any("not compared" in f for f in doc["findings"]) is not compared


def test_a_plan_whose_engine_does_not_start_says_so_never_plan_0():
    """was: 'blocks: server 27,732 GPU blocks, plan 0 (n/a)' and '4 requests ran at once, more than the 0 ...'."""
    big = "meta-llama/Llama-3.1-70B-Instruct"  # 141 GB of bf16 weights: no KV pool on one 80 GB H100
    page = vllm_v1_page({**V1_RUN[1], "model_name": big})
    doc = observe_json(page, "--model", big)
    (finding,) = doc["findings"]
    assert "does not start this deployment (no memory left for the KV cache" in finding
    assert "yet the server runs with 27,732 GPU blocks" in finding
    assert doc["plan"]["comparison"][0]["engine_starts"] is False
    with ReplayServer([page]) as srv:
        r = observe(srv.url, "--duration", "0.1", "--interval", "0.1", "--model", big, "--gpu", "H100")
    text = " ".join(r.stdout.split())
    assert r.exit_code == 0 and "the engine does not start (no memory left for the KV cache" in text
    assert "plan 0" not in text and "n/a" not in text and "0 blocks" not in text


@pytest.mark.parametrize("gate, code", [("usage_peak < 0.95", 0), ("usage_peak < 0.3", 1), ("preemptions == 0", 1),
                                        ("prefix_hit_rate > 0.5", 1), ("prefix_hit_rate > 0.2", 0)])
def test_gates_exit_0_or_1(gate, code):
    with ReplayServer([vllm_v1_page(V1_RUN[2])]) as srv:  # usage 0.8, preemptions 6, hits 1050 / 2600 = 0.40
        r = observe(srv.url, "--duration", "0.1", "--interval", "0.1", "--require", gate, "--json")
    assert r.exit_code == code, r.output
    doc = json.loads(r.stdout)
    assert doc["passed"] is (code == 0) and doc["gates"][0]["require"] == gate


@pytest.mark.parametrize("args, says", [
    (["--require", "usage_peak <"], "invalid --require"),
    (["--interval", "0"], "invalid --interval 0.0: must be >= 0.05"),
    # each number option through units.check_number, with the bounds docs/observe.md gives
    (["--interval", "1e300"], "invalid --interval 1e+300: must be <= 86,400"),  # was: sleep(1e300) OverflowError
    (["--interval", "nan"], "invalid --interval nan: not a finite number"),
    (["--timeout", "1e300"], "invalid --timeout 1e+300: must be <= 600"),  # was: settimeout OverflowError
    (["--timeout", "inf"], "invalid --timeout inf: not a finite number"),
    (["--timeout", "0"], "invalid --timeout 0.0: must be >= 0.05"),
    (["--duration", "inf"], "invalid --duration inf: not a finite number"),  # was: ran until killed
    (["--duration", "1e999"], "invalid --duration inf: not a finite number"),
    (["--duration", "nan"], "invalid --duration nan: not a finite number"),
    (["--duration", "-1"], "invalid --duration -1.0: must be > 0"),
    (["--duration", "2592001"], "invalid --duration 2592001.0: must be <= 2,592,000"),  # 30 days
    (["--plot", "out.txt"], "unknown image format '.txt'"),
    (["--plot", "README.md/out.png"], "README.md is not a folder"),
    (["--csv", "README.md/out.csv"], "README.md is not a folder"),
    (["--csv", "docs"], "it is a folder"),
    (["--model", "no-such-org/no-such-model", "--offline"], "no-such-org/no-such-model"),
    (["--served-model-name", "llama"], "--served-model-name names the series of --model: pass --model too"),
])
def test_bad_input_exits_2_before_polling(args, says):
    with ReplayServer([vllm_v1_page(V1_RUN[0])]) as srv:
        r = runner.invoke(app, ["observe", srv.url, "--duration", "0.1", *args])
        assert srv.requests == 0
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("kvplan: error: ") and says in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("url, says", [
    ("http://[::1", "invalid URL 'http://[::1': Invalid IPv6 URL"),  # was: a ValueError traceback, exit 1
    ("http://user:secret@[::1/metrics", "invalid URL 'http://[::1/metrics': Invalid IPv6 URL"),
    ("http://[zz]:8000/metrics", "invalid URL 'http://[zz]:8000/metrics'"),
    ("http://host:99999/metrics", "Port out of range 0-65535"),
    ("http://host:8000:1/metrics", "invalid URL 'http://host:8000:1/metrics'"),
    ("http://my host:8000/metrics", "it contains spaces or control characters"),
    ("http://host\n:8000/metrics", "it contains spaces or control characters"),
    ("http://a..b:8000/metrics", "invalid host in URL 'http://a..b:8000/metrics'"),
    ("http://" + "a" * 64 + ":8000/metrics", "invalid host in URL"),
])
def test_bad_urls_are_one_line_errors_exit_2(url, says):
    r = observe(url, "--duration", "0.1")
    assert r.exit_code == 2, (r.output, r.exception)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvplan: error: ") and says in lines[0], r.stderr
    assert "secret" not in r.stderr


def test_non_ascii_path_and_query_are_sent_percent_encoded():
    e = endpoint("http://127.0.0.1:8000/métrics?q=ü&a=b%20c")
    assert e.url == "http://127.0.0.1:8000/m%C3%A9trics?q=%C3%BC&a=b%20c"  # % escapes kept as typed


def test_unreachable_endpoint_exits_2_with_one_line_per_fault():
    url = f"http://127.0.0.1:{free_port()}/metrics"
    r = observe(url, "--duration", "0.2", "--interval", "0.1")
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert lines[0].endswith("connection refused (is the server up, and is this its port?)")
    assert lines[-1].startswith(f"kvplan: error: no metrics read from {url} in 3 poll(s)")
    assert "Traceback" not in r.stderr


def test_csv_and_plot(tmp_path):
    with ReplayServer([vllm_v1_page(p) for p in V1_RUN[:3]]) as srv:
        r = observe(srv.url, "--duration", "0.3", "--interval", "0.1", "--csv", str(tmp_path / "s.csv"),
                    "--plot", str(tmp_path / "s.png"))
    assert r.exit_code == 0, r.output
    rows = (tmp_path / "s.csv").read_text().splitlines()
    head = rows[0].split(",")
    assert head[:4] == ["t", "elapsed_s", "series", "error"] and "kv_cache_usage" in head
    first = dict(zip(head, rows[1].split(",")))
    assert (first["series"], first["kv_cache_usage"], first["running"], first["preemptions"]) == (f"{MODEL} engine=0", "0.1", "2", "3")
    polls = int(re.search(r"(\d+) polls every", r.stdout).group(1))
    assert len(rows) == 1 + polls and polls >= 2  # a header, then one row per poll (one series)
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # atomic writes left no temp file


def test_plot_without_a_suffix_says_the_file_it_wrote(tmp_path):
    with ReplayServer([vllm_v1_page(V1_RUN[0])]) as srv:
        r = observe(srv.url, "--duration", "0.1", "--interval", "0.1", "--plot", str(tmp_path / "p"),
                    "--csv", str(tmp_path / "s.csv"))
        j = observe(srv.url, "--duration", "0.1", "--interval", "0.1", "--plot", str(tmp_path / "q"), "--json")
    assert r.exit_code == 0 and j.exit_code == 0, r.output + j.output
    assert (tmp_path / "p.png").exists() and not (tmp_path / "p").exists()
    text = " ".join(r.stdout.split())  # was: nothing said, and p.png written for --plot p
    assert f"plot: {tmp_path / 'p.png'}" in text and f"csv: {tmp_path / 's.csv'}" in text
    assert json.loads(j.stdout)["files"] == {"plot": str(tmp_path / "q.png")} and (tmp_path / "q.png").exists()


def test_csv_marks_failed_polls():
    with ReplayServer([vllm_v1_page(V1_RUN[0]), Reply("gone", 503)]) as srv:
        obs = observe_fake_time(srv.url, polls=2)
    rows = csv_text(obs).splitlines()
    assert len(rows) == 3 and rows[2].split(",")[2:4] == ["", f"{srv.url}: HTTP 503 Service Unavailable"]


def test_summary_view_renders_the_numbers():
    from rich.console import Console

    with ReplayServer([vllm_v1_page(p) for p in V1_RUN]) as srv:
        obs = observe_fake_time(srv.url, polls=5)
    out = Console(width=160, record=True)
    out.print(render_observation(obs))
    text = " ".join(out.export_text().split())
    assert "20.0% / 30.0% / 80.0%" in text and "3 / 4.2 / 9" in text and "vLLM V1" in text
    assert "the server restarted" in text and "pass --model" in text


def test_ctrl_c_ends_cleanly_with_the_summary():
    with ReplayServer([vllm_v1_page(V1_RUN[1])]) as srv:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        # `python -m kvplan observe ...` with Ctrl-C raising KeyboardInterrupt, as at a terminal: a shell without job
        # control starts background commands with SIGINT ignored, and Python keeps an ignored SIGINT ignored
        argv = ["kvplan", "observe", srv.url, "--interval", "0.05", "--json"]
        code = ("import runpy, signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
                f"sys.argv = {argv!r}\nrunpy.run_module('kvplan', run_name='__main__', alter_sys=True)\n")
        proc = subprocess.Popen([sys.executable, "-c", code],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        deadline = time.monotonic() + 60
        # a 3rd request means the 2nd poll is done (at 2, the 2nd poll may still be reading when Ctrl-C comes)
        while srv.requests < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    doc = json.loads(out)
    assert doc["stopped"] == "interrupted" and doc["polls"] >= 2 and doc["summary"]["running_peak"] == 6


def test_estimate_start_up_does_not_import_prometheus_client():
    code = ("import sys\nfrom kvplan.cli.app import main\n"
            "sys.argv = ['kvplan', 'estimate', 'meta-llama/Llama-3.1-8B', '--json']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(str('prometheus_client' in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.stderr.strip().endswith("False"), r.stderr


def test_docs_example_plan_is_kvplans():
    """docs/observe.md's example plan line is what kvplan plans for it (gpu_util 0.9 read from the endpoint)."""
    plan = kvplan.estimate(MODEL, gpu="H100", context=8192, gpu_util=0.9)
    text = " ".join((REPO / "docs" / "observe.md").read_text().split())
    assert (f"plan ({MODEL} on 1x {plan.gpu.name}, vllm {plan.engine.version}): {plan.answer.num_blocks:,} blocks x 16 "
            f"tokens, {plan.answer.max_requests} requests of 8,192 tokens") in text
    assert f"the plan fits {plan.answer.max_requests} requests of 8,192 tokens (max concurrency {plan.answer.max_concurrency:.2f}x" in text
    assert f"plan {plan.answer.num_blocks:,} ({(26_862 - plan.answer.num_blocks) / plan.answer.num_blocks:+.1%})" in text
    assert f"{plan.answer.num_blocks - 26_862:,} blocks" in text and f"where the plan fits {plan.answer.max_requests} of" in text


@pytest.mark.parametrize("reply", ["refused", Reply("not found", 404), Reply("<html><body>login</body></html>", 200, "text/html"),
                                   Reply("this is not a metrics page", 200), Reply("gone", 503)])
def test_an_endpoint_that_never_answers_is_said_once(reply):
    # whatever fails every poll, its one line is printed once (not in the event lines, the summary and the error)
    if reply == "refused":
        url = f"http://127.0.0.1:{free_port()}/metrics"
        r = observe(url, "--duration", "0.2", "--interval", "0.1")
    else:
        with ReplayServer([reply]) as srv:
            r = observe(srv.url, "--duration", "0.2", "--interval", "0.1")
    assert r.exit_code == 2, r.output
    err = r.stderr.strip().splitlines()
    assert err[-1].endswith("every poll failed, as said above"), r.stderr
    failure = err[0].split("] ", 1)[1]  # the first event: the failure, as it happened
    assert r.output.count(failure) == 1, r.output


def test_without_model_the_bundled_model_the_endpoint_names_is_planned():
    # the series' model_name label names a bundled model: it is planned as if --model named it, and says so
    with ReplayServer([vllm_v1_page(V1_RUN[0])]) as srv:
        named = observe(srv.url, "--duration", "0.1", "--interval", "0.1", "--gpu", "H100", "--json")
        given = observe(srv.url, "--duration", "0.1", "--interval", "0.1", "--gpu", "H100", "--model", MODEL, "--json")
    assert named.exit_code == given.exit_code == 0, named.output
    a, b = json.loads(named.stdout), json.loads(given.stdout)
    assert a["plan"] is not None and a["plan"]["assumptions"][0]["value"] == MODEL
    assert a["plan"]["assumptions"][0]["source"] == f"endpoint: model_name={MODEL}"
    assert a["plan"]["comparison"] and a["plan"]["comparison"] == b["plan"]["comparison"]
    assert f"planning {MODEL}, the bundled model the endpoint names" in named.stderr
    # a label that names no bundled model (or a path to one: its last part is matched) leaves no plan / plans it
    from kvplan.observe.compare import served_bundled_model

    assert served_bundled_model([(("model_name", "my-private-model"),)]) is None
    assert served_bundled_model([(("model_name", "/models/Llama-3.1-8B-Instruct"),)])[0] == MODEL
    assert served_bundled_model([(("model_name", MODEL),), (("model_name", "other"),)]) is None  # two models
    assert served_bundled_model([(("engine", "0"),)]) is None  # no label
