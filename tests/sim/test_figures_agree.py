"""Every figure ``kvplan simulate`` derives agrees with what it derives from, over many random runs.

Before: a saturated run cut off at ``duration_s`` printed a time-to-first-token p99 below the queue-delay
p99 (202.8 vs 203.8 s): the queue delay was taken over every request scheduled, the time to first token
only over those whose prefill had finished, and the requests scheduled last (the longest waits) were in
the first set only. Both are now over the requests that got their first token (``first_tokens``).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.paged.allocator import FULL, GroupSpec
from kvplan.sim.metrics import Metrics
from kvplan.sim.simulate import ClosedLoop, Pool, Request, SimConfig, Timing, simulate


@st.composite
def runs(draw):  # noqa: ANN201 - (config, requests, duration, closed loop)
    bs = draw(st.sampled_from([2, 4, 8]))
    mml = draw(st.sampled_from([16, 32, 64]))
    groups = draw(st.sampled_from([(FULL,), (FULL, GroupSpec("sliding", window_tokens=8))]))
    need = -(-mml // bs) * len(groups)
    pool = Pool(draw(st.integers(need + 1, need * 4)), bs, groups, mml, draw(st.integers(1, 8)),
                draw(st.sampled_from([4, 16, 64])))
    timing = Timing(draw(st.sampled_from([0, 100])), 100.0, draw(st.sampled_from([0, 1, 5])) or 1,
                    prefill_s_per_token=draw(st.sampled_from([0.0, 0.01, 0.1])),
                    decode_step_s=draw(st.sampled_from([None, 0.05])))
    n = draw(st.integers(1, 60))
    gaps = draw(st.lists(st.floats(0.0, 3.0), min_size=n, max_size=n))
    reqs, at = [], 0.0
    for i in range(n):
        at += gaps[i]
        prompt = draw(st.integers(1, mml + 2))
        shared = draw(st.booleans()) and prompt >= 4
        reqs.append(Request(prompt, draw(st.integers(1, 40)), at, 0 if shared else -1, min(prompt, 12) if shared else 0))
    closed = draw(st.sampled_from([None, ClosedLoop(3, 0.0), ClosedLoop(5, 1.0)]))
    if closed is not None:
        reqs = [Request(r.prompt_tokens, r.output_tokens, None, r.prefix_id, r.prefix_tokens) for r in reqs]
    duration = draw(st.sampled_from([None, 2.0, 10.0, 40.0]))
    return SimConfig(pool, timing), reqs, duration, closed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(runs())
def test_every_derived_figure_agrees_with_what_it_derives_from(run):
    config, reqs, duration, closed = run
    res = simulate(config, reqs, duration_s=duration, closed_loop=closed)
    for r in res.results:
        # latencies: the same requests, and per request arrival <= first scheduled < first token
        assert (r.queue_delay_p50_s is None) == (r.ttft_p50_s is None) == (r.first_tokens == 0)
        if r.first_tokens:
            assert 0 <= r.queue_delay_p50_s <= r.queue_delay_p99_s
            assert r.ttft_p50_s <= r.ttft_p99_s
            assert r.queue_delay_p50_s <= r.ttft_p50_s and r.queue_delay_p99_s <= r.ttft_p99_s
        assert r.finished <= r.first_tokens <= r.finished + r.running + r.queued
        # counts: every arrival is somewhere; rates are the counts over the simulated time
        assert r.arrived == r.finished + r.queued + r.running + r.rejected
        assert r.output_tokens >= r.finished
        if r.duration_s > 0:
            assert r.requests_per_s == pytest.approx(r.finished / r.duration_s)
            assert r.output_tokens_per_s == pytest.approx(r.output_tokens / r.duration_s)
        # time-weighted figures stay within what was seen
        assert r.concurrency_p50 <= r.concurrency_p99 <= r.concurrency_max <= config.pool.max_num_seqs
        assert r.concurrency_mean <= r.concurrency_max + 1e-9
        assert 0 <= r.usage_mean <= r.usage_peak + 1e-12 <= 1 + 1e-12
        assert 0 <= r.fragmentation_mean <= 1
        # prefix cache: lookups only with it; the hit rate is what was found over what was looked up, and
        # each lookup's misses are computed at most once (less when it was preempted or cut off first)
        if r.policy != "prefix_caching":
            assert r.prefill_tokens_saved == r.prefix_query_tokens == 0 and r.prefix_hit_rate == 0
        else:
            assert r.prefix_hit_rate == (r.prefill_tokens_saved / r.prefix_query_tokens if r.prefix_query_tokens else 0)
            assert r.prefill_tokens + r.prefill_tokens_saved <= r.prefix_query_tokens
            if duration is None and not r.preemptions:  # drained, nothing abandoned: every miss computed
                assert r.prefill_tokens + r.prefill_tokens_saved == r.prefix_query_tokens


def test_a_run_cut_off_mid_prefill_takes_both_latencies_over_the_same_requests():
    # 1 s steps, one seat, 8 prompt tokens per step. Request 0 (4 prompt, 40 output tokens) holds the seat
    # for 40 steps (first token at 1 s); request 1 (24 prompt tokens) arrives at 0.5 s, is scheduled at 40 s
    # and would get its first token at 43 s, but the run stops at 41 s. Before, its 39.5 s queue delay was
    # in the queue-delay p99 (39.5 s) and not in the time-to-first-token p99 (1 s).
    pool = Pool(200, 4, (FULL,), 64, 1, 8)
    reqs = [Request(4, 40, 0.0), Request(24, 5, 0.5)]
    r = simulate(SimConfig(pool, Timing(100, 100.0, 0)), reqs, duration_s=41.0, policies=["paged"]).results[0]
    assert (r.finished, r.running, r.first_tokens) == (1, 1, 1)
    assert r.queue_delay_p99_s == 0.0 and r.ttft_p99_s == pytest.approx(1.0)


def test_sketched_latencies_never_invert():
    # past the exact limit a percentile is a bucket's largest value: two populations whose values share a
    # bucket may come out inverted (the queue delay's largest value in it above the ttft's); the ttft shown
    # is at least the queue delay
    m = Metrics(False, None)
    m.queue_delay._limit = m.ttft._limit = 4
    for delay, ttft in [(1.0, 1.0000001), (1.0, 1.0000001), (1.0, 1.0000001), (1.0, 1.0000001), (1.0004, 1.0004),
                        (5.0, 6.0), (5.0, 6.0), (5.0, 6.0)]:
        m.first_token(delay, ttft)
    for q in (10, 50, 99):
        delay, ttft = m.latency_quantiles(q)
        assert delay <= ttft


def test_the_deployment_credits_the_shared_prefix_with_prefix_caching_and_says_so():
    """The deployment line credits the system prompt's blocks as ``kvplan estimate --prefix-tokens`` does
    (one rule: memory.prefix_sharing), and only when a policy runs prefix caching."""
    from dataclasses import replace
    from pathlib import Path

    import kvplan
    from kvplan.render.simulate import simulate_to_dict
    from kvplan.sim.workload import load_workload
    from kvplan.sim.workload_run import run_workload

    wl = load_workload(Path(__file__).resolve().parents[2] / "docs" / "examples" / "shared_prompt.yaml")
    wl = replace(wl, duration_s=5.0)
    run = run_workload(wl, record_series=False)
    c = run.capacity
    assert c.at_tokens == 2000 + 125 + 200  # the mean prompt (prefix + uniform 50-200) + the mean output
    plan = kvplan.estimate("meta-llama/Llama-3.1-8B-Instruct", gpu="H100", kv_budget="10GiB", max_model_len=4096,
                           max_num_seqs=256, context=c.at_tokens, prefix_tokens=2000)
    assert (c.unshared, c.shared) == (plan.prefix.max_requests_unshared, plan.prefix.max_requests_shared)
    assert c.shared_blocks == 2000 // 16 == plan.prefix.shared_blocks and c.shared > c.unshared
    fits = simulate_to_dict(run)["deployment"]["fits"]
    assert fits["credited"] and fits["requests_prefix_caching"] == c.shared and fits["requests"] == c.unshared
    assert "125 blocks are stored once" in c.describe(True) and "stored once" not in c.describe(False)
    paged = run_workload(replace(wl, policies=("paged",)), record_series=False)
    off = simulate_to_dict(paged)["deployment"]["fits"]
    assert not off["credited"] and off["requests_prefix_caching"] is None
