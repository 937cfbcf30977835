"""kvplan simulate: hand-checked tiny runs, invariants over real workloads, workload files, the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan import memory
from kvplan.paged.allocator import FULL, GroupSpec
from kvplan.io.yamldoc import ScenarioFileError
from kvplan.sim.simulate import (
    Pool, Request, RequestSource, Scheduler, SimConfig, Timing, config_from_plan, simulate, window_sum,
)
from kvplan.sim.workload import load_workload
from kvplan.sim.workload_run import run_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
runner = CliRunner()

# a one-second step: 100 B of weights over 100 B/s, KV reads free unless a test says otherwise
ONE_SECOND = Timing(weights_bytes=100, bandwidth_bytes_per_s=100.0, full_token_bytes=0)


def tiny(num_blocks=11, block_size=4, max_model_len=16, seqs=8, mnbt=64, groups=(FULL,)) -> Pool:
    return Pool(num_blocks, block_size, groups, max_model_len, seqs, mnbt)


# ---------------------------------------------------------------------------------------------
# hand-checked tiny runs


def test_two_requests_by_hand():
    # 2 requests, 5-token prompts, 4 output tokens, blocks of 4, 1 s per step.
    # step 1 prefills both (5 tokens -> 2 blocks each) and samples token 1; steps 2-4 decode tokens 2-4,
    # writing KV for tokens 6, 7, 8 -> 8 tokens = 2 blocks each: nobody grows. Done at t = 4 s.
    reqs = [Request(5, 4, 0.0), Request(5, 4, 0.0)]
    res = simulate(SimConfig(tiny(), ONE_SECOND), reqs)
    c, p, pc = res.result("contiguous"), res.result("paged"), res.result("prefix_caching")
    for r in (c, p, pc):
        assert (r.finished, r.queued, r.running, r.preemptions) == (2, 0, 0, 0)
        assert r.duration_s == pytest.approx(4.0)
        assert r.output_tokens == 8 and r.num_steps == 4
        assert r.concurrency_mean == 2 and r.concurrency_p99 == 2
        assert r.prefill_tokens == 10
        assert r.queue_delay_p50_s == 0 and r.ttft_p50_s == pytest.approx(1.0)
    # 10 usable blocks (11 minus the null block): paged holds 2 x 2 = 4 -> 40%;
    # contiguous reserves ceil(16 / 4) = 4 blocks per request -> 8 = 80%
    assert p.usage_peak == pytest.approx(0.4) and p.usage_mean == pytest.approx(0.4)
    assert c.usage_peak == pytest.approx(0.8) and c.blocks_per_reservation == 4
    # unused slots in used blocks, sampled at the ends of [0,1] (5 of 8 slots filled: 3/8 each) and of
    # the 3-step span [1,4] (8 of 8 filled): trapezoid (0.375 + 0.375)/2 x 1 + (0.375 + 0)/2 x 3 = 0.9375 over 4 s
    assert p.fragmentation_mean == pytest.approx(0.9375 / 4)
    # contiguous: 16 slots reserved per request, 5 then 8 filled: (11/16 x 1 + (11/16 + 8/16)/2 x 3) / 4
    assert c.fragmentation_mean == pytest.approx((11 / 16 + (11 / 16 + 8 / 16) / 2 * 3) / 4)


def test_step_times_in_closed_form():
    # weights 100 B, 10 B of KV per token, 100 B/s, 0.1 s per prompt token. One request, P=5, O=3:
    # step 1 prefill: 100/100 + 5 x 0.1 = 1.5 s; step 2 reads 6 tokens: (100 + 60)/100 = 1.6 s;
    # step 3 reads 7 tokens: 1.7 s. Finished at 4.8 s with 3 output tokens.
    timing = Timing(100, 100.0, 10, prefill_s_per_token=0.1)
    r = simulate(SimConfig(tiny(), timing), [Request(5, 3, 0.0)], policies=["paged"]).results[0]
    assert r.duration_s == pytest.approx(4.8)
    assert r.output_tokens == 3 and r.num_steps == 3 and r.num_events == 2  # steps 2-3 taken at once
    assert r.output_tokens_per_s == pytest.approx(3 / 4.8)


def test_one_step_matches_the_decode_roofline():
    # the engine's decode step for a batch of equal requests is memory.decode_roofline's step time
    timing = Timing(16_000_000_000, 3.35e12, 131_072)
    run = Scheduler(SimConfig(tiny(num_blocks=2000, max_model_len=4096), timing), "paged", RequestSource.of([]), None, None, 0,
                    False)
    run.book.n_dec, run.D, run.book.s_off = 8, 100, 8 * (1000 - 100)  # 8 decoders at 1,000 tokens
    roof = memory.decode_roofline(16_000_000_000, 1001 * 131_072, 8, 3_350_000_000_000)  # they read 1,001 tokens
    assert run._decode_seconds(1) == pytest.approx(roof.step_seconds, rel=1e-12)


def test_window_sum():
    for first in range(1, 12):
        for k in range(0, 12):
            assert window_sum(first, k, 6) == sum(min(first + j, 6) for j in range(k))


def test_preemption_by_hand():
    # 4 usable blocks of 4 tokens; two requests of 4 prompt + 6 output tokens arrive together.
    # step 1: both prefill (1 block each); steps 2-5: each writes tokens 5..8 (a 2nd block each at step 2).
    # step 6: both need a 3rd block, none is free: the oldest (0) preempts the newest (1), takes a block,
    # samples its 6th token and finishes. step 7: request 1 returns with 4 + 5 generated = 9 prompt
    # tokens (recompute: 3 blocks), samples its 6th token and finishes.
    reqs = [Request(4, 6, 0.0), Request(4, 6, 0.0)]
    timing = Timing(100, 100.0, 0, decode_step_s=1.0)
    r = simulate(SimConfig(tiny(num_blocks=5, max_model_len=16), timing), reqs, policies=["paged"]).results[0]
    assert (r.finished, r.preemptions, r.output_tokens) == (2, 1, 12)
    assert r.prefill_tokens == 4 + 4 + 9
    assert r.duration_s == pytest.approx(7.0) and r.num_steps == 7
    assert r.usage_peak == 1.0
    # contiguous: each reserves all 4 blocks, so they run one after the other: 6 + 6 steps, no preemption
    c = simulate(SimConfig(tiny(num_blocks=5, max_model_len=16), timing), reqs, policies=["contiguous"]).results[0]
    assert (c.finished, c.preemptions, c.num_steps) == (2, 0, 12)
    assert c.queue_delay_p99_s == pytest.approx(6.0)


def test_long_prompts_clamp_and_reject():
    # max_model_len 16: a 16-token prompt is rejected; a 10-token prompt stops after 16 - 10 = 6 tokens
    reqs = [Request(16, 4, 0.0), Request(10, 50, 0.0)]
    r = simulate(SimConfig(tiny(), ONE_SECOND), reqs, policies=["paged"]).results[0]
    assert (r.rejected, r.finished, r.output_tokens) == (1, 1, 6)
    assert r.arrived == r.finished + r.queued + r.running + r.rejected


def test_pool_too_small_to_start():
    with pytest.raises(Exception, match="cannot hold one request at max_model_len"):
        simulate(SimConfig(tiny(num_blocks=4, max_model_len=16), ONE_SECOND), [Request(4, 4, 0.0)])


def test_sliding_window_releases_blocks():
    # a sliding group of window 4 next to a full group: a long decode keeps ~2 sliding blocks, not all
    pool = tiny(num_blocks=40, max_model_len=64, groups=(FULL, GroupSpec("sliding", window_tokens=4)))
    timing = Timing(100, 100.0, 10, window_token_bytes=((4, 10),))
    r = simulate(SimConfig(pool, timing), [Request(4, 40, 0.0)], policies=["paged", "contiguous"])
    p = r.result("paged")
    assert p.finished == 1
    # at the end: 43 tokens -> 11 full blocks + at most 2 sliding blocks (window 4, blocks of 4) of 39 usable
    assert p.usage_peak <= (11 + 2) / 39 + 1e-9
    assert r.result("contiguous").usage_peak == pytest.approx(2 * 16 / 39)


# ---------------------------------------------------------------------------------------------
# invariants on a real (small) workload


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """shared_prompt.yaml shortened to 120 s, with a 4 GiB pool (more contention)."""
    wl = load_workload(EXAMPLES / "shared_prompt.yaml")
    return replace(wl, duration_s=120.0, values={**wl.values, "kv_budget": "4GiB"})


@pytest.fixture(scope="module")
def shared_run(shared):
    return run_workload(shared)


def _core(r):
    return (r.finished, r.queued, r.running, r.preemptions, r.output_tokens, r.prefill_tokens, r.num_steps)


def test_deterministic_with_a_seed(shared, shared_run):
    again = run_workload(shared, record_series=False)
    assert [_core(r) for r in again.result.results] == [_core(r) for r in shared_run.result.results]
    other = run_workload(replace(shared, seed=1), record_series=False)
    assert [_core(r) for r in other.result.results] != [_core(r) for r in shared_run.result.results]


def test_conservation_and_bounds(shared_run):
    for r in shared_run.result.results:
        assert r.arrived == r.finished + r.queued + r.running + r.rejected
        assert r.arrived > 1000  # ~10 req/s for 120 s
        assert 0 <= r.usage_mean <= r.usage_peak <= 1.0
        assert max(r.series.usage) <= 1.0 and min(r.series.usage) >= 0.0
        assert 0 <= r.fragmentation_mean < 1
        assert r.concurrency_p50 <= r.concurrency_p99 <= r.concurrency_max <= 256
        assert r.prefill_tokens_saved == 0 or r.policy == "prefix_caching"


def test_contiguous_never_beats_paged(shared_run):
    c, p = shared_run.result.result("contiguous"), shared_run.result.result("paged")
    assert p.concurrency_mean >= c.concurrency_mean
    assert p.finished >= c.finished
    assert c.preemptions == 0  # it reserved max_model_len up front
    # contiguous holds at most (blocks - 1) // ceil(4096 / 16) requests
    plan = shared_run.plan
    assert c.concurrency_max <= (plan.answer.num_blocks - 1) // 256


def test_prefix_caching_shares_the_system_prompt(shared_run):
    p, pc = shared_run.result.result("paged"), shared_run.result.result("prefix_caching")
    # every prompt starts with the same 2,000 tokens: 125 full blocks hit after the first request
    assert pc.prefix_hit_rate > 0.9
    assert pc.prefill_tokens_saved % 16 == 0 and pc.prefill_tokens_saved > 1000 * 2000 * 0.9
    assert pc.finished > p.finished
    assert pc.queue_delay_p99_s < p.queue_delay_p99_s


def test_distinct_prompts_gain_nothing_from_prefix_caching():
    # no_sharing.yaml on a pool big enough that nobody is preempted (a preempted request would
    # re-hit its own blocks): paged and prefix caching then schedule identically
    wl = load_workload(EXAMPLES / "no_sharing.yaml")
    wl = replace(wl, duration_s=60.0, values={**wl.values, "kv_budget": "40GiB"}, policies=("paged", "prefix_caching"))
    res = run_workload(wl, record_series=False).result
    p, pc = res.result("paged"), res.result("prefix_caching")
    assert p.preemptions == pc.preemptions == 0
    assert pc.prefix_hit_rate == 0 and pc.prefill_tokens_saved == 0
    assert _core(pc) == _core(p)
    assert pc.requests_per_s == pytest.approx(p.requests_per_s, rel=1e-12)
    assert pc.output_tokens_per_s == pytest.approx(p.output_tokens_per_s, rel=1e-12)


def test_taking_k_steps_at_once_is_exact(shared, monkeypatch):
    # the same run one step at a time (spans off) must schedule identically
    short = replace(shared, duration_s=20.0)
    fast = run_workload(short, record_series=False).result
    monkeypatch.setattr(Scheduler, "_span", lambda self: False)
    slow = run_workload(short, record_series=False).result
    for a, b in zip(fast.results, slow.results):
        assert _core(a)[:-1] == _core(b)[:-1]  # num_steps counts the same steps either way
        assert a.num_steps == b.num_steps and a.num_events < b.num_events
        assert a.duration_s == pytest.approx(b.duration_s, rel=1e-9)
        assert a.usage_peak == b.usage_peak and a.concurrency_max == b.concurrency_max
        assert a.queue_delay_p99_s == pytest.approx(b.queue_delay_p99_s, rel=1e-9, abs=1e-12)


def test_closed_loop_keeps_users_busy():
    wl = load_workload(EXAMPLES / "shared_prompt.yaml")
    from kvplan.sim.simulate import ClosedLoop

    wl = replace(wl, rate=None, closed_loop=ClosedLoop(8, 0.5), duration_s=30.0, policies=("paged",))
    r = run_workload(wl, record_series=False).result.results[0]
    assert r.concurrency_max <= 8  # never more requests than users
    assert r.arrived == r.finished + r.queued + r.running
    assert r.finished > 8


def test_config_from_plan_maps_the_layout():
    from kvplan.planning.plan import estimate, options_from_values

    plan = estimate(options_from_values({"model": "google/gemma-2-9b-it", "gpu": "H100", "kv_budget": "4GiB", "context": 8192}))
    config, _ = config_from_plan(plan)
    kinds = [g.kind for g in config.pool.groups]
    assert set(kinds) == {"full", "sliding"}
    assert all(g.window_tokens == 4096 for g in config.pool.groups if g.kind == "sliding")
    assert config.pool.num_blocks == plan.answer.num_blocks and config.pool.block_size == plan.layout.block_size
    assert config.timing.weights_bytes == plan.budget.weights.bytes
    # half the layers slide: the full-token bytes are half the model's per-token bytes
    assert config.timing.full_token_bytes * 2 == plan.kv_bytes_per_token_gpu


def test_prefill_cost_from_flops():
    from kvplan.planning.plan import estimate, options_from_values

    plan = estimate(options_from_values({"model": "meta-llama/Llama-3.1-8B", "gpu": "H100", "kv_budget": "4GiB"}))
    config, _ = config_from_plan(plan, prefill_efficiency=0.5)
    # 2 x parameters FLOPs per token over 989 TFLOPS x 0.5
    assert config.timing.prefill_s_per_token == pytest.approx(2 * plan.spec.parameters / (989e12 * 0.5))


# ---------------------------------------------------------------------------------------------
# workload files


def test_examples_load():
    for name in ("shared_prompt.yaml", "no_sharing.yaml"):
        wl = load_workload(EXAMPLES / name)
        assert wl.rate == 10 and wl.duration_s == 3600 and wl.policies == ("contiguous", "paged", "prefix_caching")
    assert load_workload(EXAMPLES / "shared_prompt.yaml").prefixes[0].tokens == 2000


def _write(tmp_path, text, name="w.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


BASE = "model: meta-llama/Llama-3.1-8B\nkv_budget: 4GiB\narrivals: {rate: 2}\nduration_s: 10\n"


@pytest.mark.parametrize("extra,line,needle", [
    ("prompt_tokens: 100\noutput_tokens: 10\nprompt_token: 3\n", 7, "did you mean 'prompt_tokens'"),
    ("prompt_tokens: {dist: uniform, min: 50, max: 20}\noutput_tokens: 10\n", 5, "min 50 exceeds max 20"),
    ("prompt_tokens: {dist: gamma, mean: 3}\noutput_tokens: 10\n", 5, "prompt_tokens"),
    ("prompt_tokens: 100\noutput_tokens: 10\nprefixes: [{tokens: 10, share: 0.7}, {tokens: 5, share: 0.6}]\n", 7, "more than 1"),
    ("prompt_tokens: 100\noutput_tokens: 10\npolicies: [paged, magic]\n", 7, "policies"),
    ("output_tokens: 10\n", 1, "prompt_tokens is required"),
])
def test_bad_workloads_name_file_and_line(tmp_path, extra, line, needle):
    path = _write(tmp_path, BASE + extra)
    with pytest.raises(ScenarioFileError) as exc:
        load_workload(path)
    assert exc.value.where.line == line, str(exc.value)
    assert needle in exc.value.one_line()
    assert str(exc.value).startswith(f"{exc.value.where.file}:{line}:")


def test_trace_file(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt_tokens": 40, "output_tokens": 5, "prefix_id": "sys", "prefix_tokens": 32, "arrival_s": 0.5}\n'
                     '{"prompt_tokens": 40, "output_tokens": 5, "prefix_id": "sys", "prefix_tokens": 32, "arrival_s": 0.0}\n')
    path = _write(tmp_path, "model: meta-llama/Llama-3.1-8B\nkv_budget: 1GiB\nmax_model_len: 1024\ntrace: t.jsonl\n")
    wl = load_workload(path)
    assert [r.arrival_s for r in wl.trace] == [0.0, 0.5]  # sorted by arrival
    res = run_workload(wl, record_series=False).result
    pc = res.result("prefix_caching")
    assert pc.finished == 2 and pc.prefill_tokens_saved == 32  # the second hits 2 full blocks of 16
    trace.write_text('{"prompt_tokens": 40, "output_tokens": 5}\n{"prompt_tokens": -1, "output_tokens": 5}\n')
    with pytest.raises(ScenarioFileError, match=r"t\.jsonl:2:1: prompt_tokens"):
        load_workload(_write(tmp_path, "model: meta-llama/Llama-3.1-8B\ntrace: t.jsonl\narrivals: {rate: 1}\n"))


def test_plan_from_a_capacity_check(tmp_path):
    path = _write(tmp_path, f"plan: {EXAMPLES / 'capacity.yaml'}#chat-48-at-8k\nkv_budget: 2GiB\n"
                            "arrivals: {rate: 1}\nduration_s: 5\nprompt_tokens: 100\noutput_tokens: 10\n")
    wl = load_workload(path)
    assert wl.values["model"] == "meta-llama/Llama-3.1-8B" and wl.values["kv_budget"] == "2GiB"
    with pytest.raises(ScenarioFileError, match="no check named"):
        load_workload(_write(tmp_path, f"plan: {EXAMPLES / 'capacity.yaml'}#nope\narrivals: {{rate: 1}}\n"
                                       "duration_s: 5\nprompt_tokens: 100\noutput_tokens: 10\n", "x.yaml"))


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_json(tmp_path):
    from kvplan.cli.app import app

    path = _write(tmp_path, BASE + "prompt_tokens: 100\noutput_tokens: 20\nprefixes: [{tokens: 512, share: 0.5}]\n")
    r = runner.invoke(app, ["simulate", str(path), "--json", "--seed", "3"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["workload"]["seed"] == 3
    assert [p["policy"] for p in doc["policies"]] == ["contiguous", "paged", "prefix_caching"]
    for p in doc["policies"]:
        assert p["arrived"] == p["finished"] + p["queued"] + p["running"] + p["rejected"]
        assert len(p["series"]["time_s"]) == len(p["series"]["usage"]) <= 200
    assert doc["deployment"]["block_size"] == 16 and doc["deployment"]["num_blocks"] == 4 * 2**30 // (16 * 131072)


def test_cli_table_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from kvplan.cli.app import app

    path = _write(tmp_path, BASE + "prompt_tokens: 100\noutput_tokens: 20\n")
    png = tmp_path / "pool.png"
    r = runner.invoke(app, ["simulate", str(path), "--policy", "paged", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert "requests/s" in r.output and "paged" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_bad_file_exits_2_with_location(tmp_path):
    from kvplan.cli.app import app

    path = _write(tmp_path, BASE + "prompt_tokens: 100\noutput_tokens: lots\n")
    r = runner.invoke(app, ["simulate", str(path)])
    assert r.exit_code == 2
    err = r.stderr.strip()
    assert err.startswith("kvplan: error:") and "\n" not in err
    assert ":6:" in err and "output_tokens" in err
    r = runner.invoke(app, ["simulate", str(path), "--policy", "magic"])
    assert r.exit_code == 2


# ---------------------------------------------------------------------------------------------
# runaways: non-finite numbers, the work bound, bounded memory, the plot path checked first


def _one_line_error(r):
    err = r.stderr.strip()
    assert r.exit_code == 2, r.output
    assert err.startswith("kvplan: error:") and "\n" not in err, err
    return err


@pytest.mark.parametrize("value,needle", [("nan", "not a finite number"), ("inf", "not a finite number"),
                                          ("-inf", "not a finite number"), ("0", "must be > 0"), ("-5", "must be > 0")])
def test_cli_duration_must_be_finite_and_positive(value, needle):
    # nan used to pass "must be positive" (nan <= 0 is False) and ran forever at ~4 MB/s
    from kvplan.cli.app import app

    r = runner.invoke(app, ["simulate", str(EXAMPLES / "shared_prompt.yaml"), "--duration", value])
    assert needle in _one_line_error(r) and "--duration" in r.stderr


@pytest.mark.parametrize("value", [".inf", ".nan", "-.inf", "1.0e+400"])
def test_workload_duration_must_be_finite(tmp_path, value):
    path = _write(tmp_path, BASE.replace("duration_s: 10", f"duration_s: {value}") + "prompt_tokens: 100\noutput_tokens: 10\n")
    with pytest.raises(ScenarioFileError, match=r"w\.yaml:4:13: duration_s: got .*(not a finite number|must be >)"):
        load_workload(path)


@pytest.mark.parametrize("field", ["arrivals: {rate: .inf}", "arrivals: {rate: .nan}", "arrivals: {users: 4, think_s: .inf}"])
def test_workload_rates_must_be_finite(tmp_path, field):
    path = _write(tmp_path, BASE.replace("arrivals: {rate: 2}", field) + "prompt_tokens: 100\noutput_tokens: 10\n")
    with pytest.raises(ScenarioFileError, match="not a finite number|must be >"):
        load_workload(path)


def test_api_rejects_non_finite_numbers():
    from kvplan.errors import InputError

    with pytest.raises(InputError, match="duration"):
        simulate(SimConfig(tiny(), ONE_SECOND), [Request(5, 4, 0.0)], duration_s=float("nan"))
    with pytest.raises(InputError, match="decode_step_s"):
        Timing(100, 100.0, 0, decode_step_s=float("nan"))
    with pytest.raises(InputError, match="arrival_s"):
        Request(5, 4, float("inf"))
    with pytest.raises(InputError, match="no time"):  # a zero-second step would never advance the clock
        Timing(0, 100.0, 0)


def test_a_million_requests_per_second_for_an_hour_is_refused_with_the_numbers():
    # used to grow to 24 GB and be OOM-killed with nothing printed; now refused before any work:
    # 1,000,000 req/s x 3,600 s = 3.6e9 requests x (1 prefill + 199 decode steps) x 3 policies = 2.2e12
    from kvplan.cli.app import app

    text = BASE.replace("arrivals: {rate: 2}", "arrivals: {rate: 1000000}").replace("duration_s: 10", "duration_s: 3600")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bomb.yaml"
        path.write_text(text + "prompt_tokens: 100\noutput_tokens: 200\n")
        r = runner.invoke(app, ["simulate", str(path)])
    err = _one_line_error(r)
    assert "~3.6e+09 requests (rate 1,000,000/s x duration_s 3,600)" in err
    assert "~200 steps each x 3 policies = 2.2e+12 request-steps" in err
    assert "past the bound of 200,000,000" in err and "--force" in err


def test_work_estimate_by_hand():
    from kvplan.sim.simulate import MAX_WORK, estimate_work

    pool = tiny(max_model_len=4096, mnbt=2048)
    # 100 requests of 5,000-token prompts (3 prefill chunks of <= 2,048) and 10 output tokens (9 more steps)
    w = estimate_work(100, 5000, 10, pool, 2, "by hand")
    assert w.steps_per_request == 3 + 9 and w.units == 2 * 100 * (1 + 12)
    # outputs are clamped to max_model_len: 1e9 output tokens cost 4,096 steps
    assert estimate_work(1, 1, 1e9, pool, 1, "x").steps_per_request == 1 + 4095
    assert MAX_WORK == 200_000_000  # docs/simulate.md states this bound


def test_workload_work_counts_closed_loops_and_num_requests():
    wl = load_workload(EXAMPLES / "shared_prompt.yaml")
    from kvplan.sim.simulate import ClosedLoop

    pool = tiny(max_model_len=4096, mnbt=8192)
    w = wl.work(pool, 0.005)
    assert w.requests == pytest.approx(36_000) and "rate 10/s x duration_s 3,600" in w.basis
    # prompt: 2,000-token prefix + uniform 50-200 (mean 125); output uniform 100-300 (mean 200): 1 + 199 steps
    assert w.steps_per_request == 200
    # a closed loop of 8 users, think 0.5 s: a request takes >= 0.5 + 200 x 5 ms = 1.5 s -> <= 8 x (1 + 3600/1.5)
    closed = replace(wl, rate=None, closed_loop=ClosedLoop(8, 0.5))
    assert closed.work(pool, 0.005).requests == pytest.approx(8 * (1 + 3600 / 1.5))
    assert replace(wl, num_requests=50).work(pool, 0.005).requests == 50


def test_force_runs_past_the_bound_and_the_runtime_stop(monkeypatch):
    from kvplan.sim import simulate as sim
    from kvplan.errors import InputError
    from kvplan.sim import scheduler
    from kvplan.sim.simulate import Work

    monkeypatch.setattr(scheduler, "TICK_EVENTS", 16)

    reqs = [Request(5, 40, i * 0.01) for i in range(400)]
    config = SimConfig(tiny(num_blocks=200, max_model_len=64), ONE_SECOND)
    monkeypatch.setattr(sim, "MAX_WORK", 100)
    with pytest.raises(InputError, match="too big to run without --force"):
        simulate(config, reqs, policies=["paged"])
    assert simulate(config, reqs, policies=["paged"], force=True).results[0].finished == 400
    # an estimate that was too low: the run stops past twice the bound instead of running away
    monkeypatch.setattr(sim, "MAX_WORK", 2000)
    with pytest.raises(InputError, match="stopped a simulation after"):
        simulate(config, RequestSource(lambda: iter(reqs)), policies=["paged"], work=Work(1, 1, 1, "a guess"))


def test_progress_is_reported(monkeypatch):
    from kvplan.sim import scheduler

    monkeypatch.setattr(scheduler, "TICK_EVENTS", 16)
    seen = []
    reqs = [Request(5, 40, i * 0.01) for i in range(400)]
    simulate(SimConfig(tiny(num_blocks=200, max_model_len=64), ONE_SECOND), reqs, policies=["paged", "contiguous"],
             progress=lambda done, total: seen.append((done, total)))
    assert len(seen) > 2
    assert all(0 <= d <= t for d, t in seen) and seen[-1][0] > seen[0][0]


def test_an_overloaded_open_loop_keeps_memory_flat():
    # 100,000 req/s against a server that finishes a few hundred: ~200,000 requests queue up in 2 s.
    # The queue is a count plus a cursor that re-draws each request when it reaches the head, and finished
    # requests leave only sums behind, so memory does not grow with them (it used to: ~250 B per request).
    import random
    import tracemalloc

    def stream():
        rng, t = random.Random(0), 0.0
        while True:
            t += rng.expovariate(100_000)
            yield Request(100, 20, t)

    config = SimConfig(tiny(num_blocks=400, max_model_len=256, seqs=64, mnbt=2048), Timing(100, 100_000.0, 0))
    tracemalloc.start()
    r = simulate(config, RequestSource(stream), policies=["paged"], duration_s=2.0).results[0]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert r.arrived > 150_000 and r.queued > 100_000
    assert r.arrived == r.finished + r.queued + r.running + r.rejected
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_quantile_sketch_is_exact_then_within_a_tenth_of_a_percent():
    import random

    from kvplan.sim.metrics import QuantileSketch

    rng = random.Random(1)
    values = [rng.lognormvariate(0, 2) for _ in range(5000)] + [0.0] * 50
    exact, sketch = QuantileSketch(), QuantileSketch(exact_limit=100)
    for v in values:
        exact.add(v)
        sketch.add(v)
    ordered = sorted(values)
    for q in (1, 50, 90, 99, 100):
        truth = ordered[max(1, math.ceil(q / 100 * len(values))) - 1]
        assert exact.quantile(q) == truth
        got = sketch.quantile(q)
        assert truth <= got <= truth * (1 + 1 / 1024) and got in values  # an observed value, at most 0.1% above
    assert QuantileSketch().quantile(50) is None


def test_series_recorder_is_bounded_and_covers_the_run():
    from kvplan.sim.metrics import SeriesRecorder

    rec = SeriesRecorder(points=64)
    for i in range(10_000):
        rec.add(i * 0.37, (i % 100) / 100, i % 7)
    s = rec.series()
    assert len(s.time_s) <= 64 and s.time_s[-1] == pytest.approx(9_999 * 0.37)
    assert list(s.time_s) == sorted(s.time_s) and s.time_s[0] < 0.37 * 10_000 / 32


# ---------------------------------------------------------------------------------------------
# --plot: the path is checked before the simulation runs


@pytest.fixture
def no_simulation(monkeypatch):
    """Fail the test if the simulation runs (the path must be refused first)."""
    import kvplan.sim.workload_run

    def boom(*a, **k):
        raise AssertionError("the simulation ran before the plot path was checked")

    monkeypatch.setattr(kvplan.sim.workload_run, "run_workload", boom)


@pytest.mark.parametrize("name,needle", [("pool.txt", "unknown image format '.txt'"), (".", "it is a folder"),
                                         ("file/pool.png", "is not a folder")])
def test_plot_path_refused_before_the_work(tmp_path, no_simulation, name, needle):
    from kvplan.cli.app import app

    (tmp_path / "file").write_text("a file, not a folder")
    path = _write(tmp_path, BASE + "prompt_tokens: 100\noutput_tokens: 20\n")
    r = runner.invoke(app, ["simulate", str(path), "--plot", str(tmp_path / name)])
    assert needle in _one_line_error(r)


def test_plot_into_a_read_only_folder_is_refused_before_the_work(tmp_path, no_simulation):
    # root writes through file modes: as root the folder is made immutable (chattr +i), else /sys is used
    import os
    import shutil
    import subprocess

    from kvplan.cli.app import app

    path = _write(tmp_path, BASE + "prompt_tokens: 100\noutput_tokens: 20\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    immutable = False
    if os.geteuid() != 0:
        ro.chmod(0o555)
    elif shutil.which("chattr") and subprocess.run(["chattr", "+i", str(ro)], capture_output=True).returncode == 0:
        immutable = True
    else:
        ro = Path("/sys")
    try:
        r = runner.invoke(app, ["simulate", str(path), "--plot", str(ro / "pool.png")])
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(ro)], check=True)
        elif ro != Path("/sys"):
            ro.chmod(0o755)
    err = _one_line_error(r)
    assert err.startswith("kvplan: error: cannot write --plot") and "not writable" in err


def test_plot_without_a_suffix_writes_png_and_says_so(tmp_path):
    pytest.importorskip("matplotlib")
    from kvplan.cli.app import app

    path = _write(tmp_path, BASE + "prompt_tokens: 100\noutput_tokens: 20\n")
    r = runner.invoke(app, ["simulate", str(path), "--policy", "paged", "--plot", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "p").exists()
    assert f"plot: {tmp_path / 'p.png'}" in r.stdout.replace("\n", "")


@pytest.mark.parametrize("line,needle", [
    ('{"prompt_tokens": ' + "1" * 5000 + ', "output_tokens": 5}', "huge integer or deep nesting"),
    ("[" * 100_000 + "]" * 100_000, "huge integer or deep nesting"),
    ('{"prompt_tokens": 40, "output_tokens": 5, "arrival_s": 1e999}', "not a finite number"),
    ('{"prompt_tokens": 10000000000, "output_tokens": 5}', "expected an integer from 1 to 1,000,000,000"),
])
def test_broken_trace_lines_are_one_line_errors(tmp_path, line, needle):
    (tmp_path / "t.jsonl").write_text('{"prompt_tokens": 40, "output_tokens": 5, "arrival_s": 0}\n' + line + "\n")
    path = _write(tmp_path, "model: meta-llama/Llama-3.1-8B\ntrace: t.jsonl\n")
    with pytest.raises(ScenarioFileError, match=r"t\.jsonl:2:") as info:
        load_workload(path)
    assert needle in str(info.value)


def test_a_binary_trace_is_one_line(tmp_path):
    from kvplan.errors import ScenarioError

    (tmp_path / "t.jsonl").write_bytes(b"\0\1\2")
    with pytest.raises(ScenarioError, match="binary data"):
        load_workload(_write(tmp_path, "model: meta-llama/Llama-3.1-8B\ntrace: t.jsonl\n"))


# one duration format: "3600 s" sat beside "3,600.0 s" (simulate's traffic line and its table)


def test_every_duration_a_simulation_prints_has_one_format(tmp_path):
    from typer.testing import CliRunner

    from kvplan.cli.app import app

    (tmp_path / "s.yaml").write_text("model: meta-llama/Llama-3.1-8B\ngpu: H100\narrivals: {users: 2, think_s: 2}\n"
                                     "duration_s: 3600\nprompt_tokens: 100\noutput_tokens: 10\n")
    r = CliRunner().invoke(app, ["simulate", str(tmp_path / "s.yaml"), "--offline"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    import re

    durations = re.findall(r"([\d,.]+) (s|ms)\b", r.stdout)
    assert durations and all(re.fullmatch(r"\d{1,3}(,\d{3})*\.\d", n) for n, unit in durations if unit == "s"), durations
    assert "3,600.0 s" in r.stdout and "think 2.0 s" in r.stdout
