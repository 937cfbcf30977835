"""The step time as a function of the batch: a fit from observed runs, the timing file, and simulate using it.

Before: a CPU target asked for ``prefill_s_per_token``, then ``decode_step_s``, one error at a time (and said
"no parameter count" for a model with 41.7 M parameters), and a fixed decode step could not follow a step
that grows from 4.1 ms at batch 1 to 33.6 ms at batch 96; closed-loop users with no think time all started
at 0 and stayed in step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.errors import InputError
from kvplan.io.yamldoc import ScenarioFileError
from kvplan.paged.allocator import FULL
from kvplan.sim.simulate import ClosedLoop, Pool, RequestSource, Scheduler, SimConfig, Timing, config_from_plan
from kvplan.sim.streams import Arrivals
from kvplan.sim.timing import StepFit, TimingRun, add_run, fit_runs, read_timing
from kvplan.sim.workload import load_workload
from kvplan.sim.workload_run import run_workload

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "benchmarks" / "real_server_model"  # the tiny Llama the real-server benchmark serves
runner = CliRunner()
# 4 ms a step, 110 us a sequence, 0.2 us a KV token read, 70 us a prompt token, 0.1 us a KV token held
TRUE = StepFit(0.004, 1.1e-4, 2.0e-7, 7.0e-5, 1.0e-7)


def run_of(fit: StepFit, steps: int, seqs: float, context: float, prefill: int, held: float = 0.0) -> TimingRun:
    """The run a server with step time ``fit`` makes in ``steps`` steps of ``seqs`` decoders at ``context``,
    the pool holding ``held`` KV tokens."""
    decode = int(steps * seqs)
    busy = fit.step_base_s * steps + fit.step_s_per_seq * decode + fit.step_s_per_kv_token * decode * context \
        + fit.prefill_s_per_token * prefill + fit.step_s_per_held_token * steps * held
    return TimingRun(busy, steps, decode, prefill, context, held_tokens=held)


# ---------------------------------------------------------------------------------------------
# the fit


# the calibration loads of benchmarks/real_server.py: caching off (each request holds its own 9-10 blocks of
# 128) and on (the 1,024-token prefix held once), one with a 256-token prefix
CALIBRATION = [(1000, 2, 1120, 17_000, 2_300), (500, 9, 1120, 50_000, 11_000), (450, 21, 1120, 90_000, 25_000),
               (1000, 2, 1120, 500, 1_400), (400, 32, 1120, 3000, 6_500), (900, 16, 352, 3500, 2_600)]


def test_runs_that_vary_every_term_give_back_the_step_time():
    runs = [run_of(TRUE, *c) for c in CALIBRATION]
    fit, notes = fit_runs(runs)
    for name in ("step_base_s", "step_s_per_seq", "step_s_per_kv_token", "prefill_s_per_token", "step_s_per_held_token"):
        assert getattr(fit, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert fit.rms_relative_error < 1e-9 and notes == ()
    # the step grows with the batch: 4 ms + 1 x (0.11 + 0.2 x 1,120 / 1000) ms at batch 1; 96 sequences: 4 + 96 x 0.334 ms
    assert fit.step_s(1, 1120) == pytest.approx(0.004 + 1.1e-4 + 2.24e-4)
    assert fit.step_s(96, 96 * 1120) == pytest.approx(0.004 + 96 * 3.34e-4)
    # and with what the pool holds: 96 requests sharing a 1,024-token prefix hold 1,024 + 96 x 160 tokens
    assert fit.step_s(96, 96 * 1120, held_tokens=1024 + 96 * 160) == pytest.approx(
        0.004 + 96 * 3.34e-4 + 1e-7 * (1024 + 96 * 160))


def test_runs_at_one_context_leave_the_per_token_cost_out_and_say_so():
    truth = StepFit(0.004, 1.1e-4, 2.0e-7, 7.0e-5)
    runs = [run_of(truth, 1000, 2, 1120, 17_000), run_of(truth, 500, 9, 1120, 50_000), run_of(truth, 400, 32, 1120, 3000)]
    fit, notes = fit_runs(runs)
    assert any("step_s_per_held_token not fitted" in n for n in notes)  # the runs do not say what the pool held
    assert fit.step_s_per_kv_token == 0 and "step_s_per_kv_token" not in fit.fitted
    assert any("too close to tell the per-token cost" in n for n in notes)
    # the per-sequence cost absorbs the per-token cost at that context: 110 us + 1,120 x 0.2 us
    assert fit.step_s_per_seq == pytest.approx(1.1e-4 + 1120 * 2.0e-7, rel=1e-6)


def test_runs_that_cannot_tell_two_costs_apart_say_which():
    # prefix caching on only, one request shape: prefill tokens are a fixed share of the decode tokens
    truth = StepFit(0.004, 1.1e-4, 2.0e-7, 7.0e-5)
    runs = [run_of(truth, 1000, 2, 1120, 500), run_of(truth, 500, 12, 1120, 1500)]
    fit, notes = fit_runs(runs)
    assert len(fit.fitted) == 2
    assert any("do not tell these costs apart" in n for n in notes), notes


def test_a_fit_never_has_a_negative_term():
    # noisy runs whose unconstrained least squares would give a negative per-sequence cost
    runs = [TimingRun(10.0, 2000, 4000, 0, 1000), TimingRun(10.0, 1000, 16000, 0, 1000), TimingRun(10.5, 2100, 4200, 0, 1000)]
    fit, _ = fit_runs(runs)
    assert all(getattr(fit, t) >= 0 for t in ("step_base_s", "step_s_per_seq", "step_s_per_kv_token", "prefill_s_per_token"))


def test_a_step_that_takes_no_time_is_refused():
    with pytest.raises(InputError, match="takes no time"):
        StepFit(0.0, prefill_s_per_token=1e-5)
    with pytest.raises(InputError):
        StepFit(float("nan"))


# ---------------------------------------------------------------------------------------------
# the file


def test_runs_accumulate_in_one_file_and_refit(tmp_path):
    path = tmp_path / "timing.yaml"
    runs = [run_of(TRUE, *c) for c in CALIBRATION]
    for run in runs:
        written = add_run(path, run, "tiny-llama")
    back = read_timing(path)
    assert back.model == "tiny-llama" and len(back.runs) == 6 and written.fit.fitted == back.fit.fitted
    assert back.fit.step_base_s == pytest.approx(TRUE.step_base_s, rel=1e-3)  # refit on busy_s kept to the ms
    assert back.runs[5].mean_context_tokens == 352 and back.runs[0].steps == 1000 and back.runs[2].held_tokens == 25_000
    with pytest.raises(InputError, match="holds timing runs of model 'tiny-llama', not 'other'"):
        add_run(path, runs[0], "other")
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically


@pytest.mark.parametrize("text, where, needle", [
    ("kvplan_timing: 1\nfit: {step_base_s: 0.004, step_s_per_sec: 1}\n", ":2:", "step_s_per_sec"),
    ("kvplan_timing: 2\nfit: {step_base_s: 0.004}\n", ":1:", "format version 2 is not 1"),
    ("kvplan_timing: 1\nfit: {step_base_s: -1}\n", ":2:", "step_base_s"),
    ("kvplan_timing: 1\nfit: {step_base_s: 0, step_s_per_seq: 0}\n", ":2:", "takes no time"),
    ("kvplan_timing: 1\nfit: {step_base_s: 0.004}\nruns: [{busy_s: 0, steps: 1, decode_tokens: 1, prefill_tokens: 0, "
     "mean_context_tokens: 5}]\n", ":3:", "busy_s"),
])
def test_a_bad_timing_file_is_one_line_with_its_place(tmp_path, text, where, needle):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioFileError) as err:
        read_timing(path)
    line = err.value.one_line()
    assert where in line and needle in line and "\n" not in line


# ---------------------------------------------------------------------------------------------
# simulate with it


def test_spans_of_steps_with_a_held_token_cost_are_exact():
    """k steps at once add up the blocks decoders take as they go: the same schedule and clock as one step at a time."""
    from kvplan.sim.simulate import Request, simulate

    fit = StepFit(0.004, 1e-4, 2e-7, 5e-5, 3e-7)
    pool = Pool(400, 16, (FULL,), 1024, 64, 256)
    reqs = [Request(40 + 7 * i % 90, 30 + 11 * i % 200, 0.05 * i, 0 if i % 2 else -1, 32 if i % 2 else 0) for i in range(60)]
    config = SimConfig(pool, Timing(0, 0.0, 0, fit=fit, prefill_s_per_token=fit.prefill_s_per_token))
    fast = simulate(config, reqs, record_series=False)
    import kvplan.sim.scheduler as sched

    original = sched.Scheduler._span
    try:
        sched.Scheduler._span = lambda self: False
        slow = simulate(config, reqs, record_series=False)
    finally:
        sched.Scheduler._span = original
    for a, b in zip(fast.results, slow.results):
        assert (a.finished, a.preemptions, a.num_steps, a.output_tokens) == (b.finished, b.preemptions, b.num_steps, b.output_tokens)
        assert a.duration_s == pytest.approx(b.duration_s, rel=1e-9) and a.num_events < b.num_events
    # the held-token cost makes a run slower than the same fit without it
    plain = simulate(SimConfig(pool, Timing(0, 0.0, 0, fit=StepFit(0.004, 1e-4, 2e-7, 5e-5), prefill_s_per_token=5e-5)),
                     reqs, record_series=False)
    assert plain.result("paged").duration_s < fast.result("paged").duration_s


def test_a_fitted_step_grows_with_the_batch_in_the_simulator():
    fit = StepFit(0.004, 1e-4, 2e-7, 5e-5)
    pool = Pool(2000, 16, (FULL,), 4096, 256, 4096)
    run = Scheduler(SimConfig(pool, Timing(0, 0.0, 0, fit=fit, prefill_s_per_token=fit.prefill_s_per_token)), "paged",
                    RequestSource.of([]), None, None, 0, False)
    for n in (1, 8, 96):
        run.book.n_dec, run.D, run.book.s_off = n, 100, n * (1000 - 100)  # n decoders at 1,000 tokens: they read 1,001
        assert run._decode_seconds(1) == pytest.approx(fit.step_s(n, n * 1001), rel=1e-12)
        # k steps at once: each decoder reads one token more each step
        assert run._decode_seconds(5) == pytest.approx(sum(fit.step_s(n, n * (1001 + j)) for j in range(5)), rel=1e-12)


def _cpu_workload(tmp_path, timing: str = "", arrivals: str = "{users: 8, think_s: 0}") -> Path:
    path = tmp_path / "wl.yaml"
    path.write_text(f"model: {TINY}\ngpu: cpu\nkv_budget: 75497472B\nmax_model_len: 2048\nmax_num_batched_tokens: 4096\n"
                    f"arrivals: {arrivals}\nprefixes: [{{tokens: 1024, share: 1.0}}]\nprompt_tokens: 32\noutput_tokens: 128\n"
                    f"duration_s: 30\npolicies: [prefix_caching]\n{timing}")
    return path


def test_a_cpu_target_names_every_missing_timing_input_at_once(tmp_path):
    r = runner.invoke(app, ["simulate", str(_cpu_workload(tmp_path))])
    assert r.exit_code == 2
    err = " ".join(r.stderr.split())
    assert "prefill_s_per_token (GPU 'cpu' has no FP16 peak in the catalogue)" in err
    assert "the decode step (GPU 'cpu' has no memory bandwidth in the catalogue)" in err
    assert "no parameter count" not in err and "kvplan observe URL --fit-timing" in err
    assert "set timing.prefill_s_per_token and timing.decode_step_s" in err
    one = runner.invoke(app, ["simulate", str(_cpu_workload(tmp_path, "timing: {decode_step_s: 0.01}\n"))])
    assert one.exit_code == 2 and "lacks prefill_s_per_token" in one.stderr and "decode step (" not in one.stderr


def test_simulate_reads_the_timing_file(tmp_path):
    (tmp_path / "t.yaml").write_text("kvplan_timing: 1\nmodel: tiny-llama\nfit: {step_base_s: 0.004, step_s_per_seq: 0.0002, "
                                      "prefill_s_per_token: 0.00002}\n")
    by_file = runner.invoke(app, ["simulate", str(_cpu_workload(tmp_path, "timing: {file: t.yaml}\n")), "--json"])
    by_flag = runner.invoke(app, ["simulate", str(_cpu_workload(tmp_path)), "--timing", str(tmp_path / "t.yaml"), "--json"])
    assert by_file.exit_code == 0 and by_flag.exit_code == 0, by_file.output + by_flag.output
    a, b = json.loads(by_file.stdout), json.loads(by_flag.stdout)
    assert a["policies"][0]["finished"] == b["policies"][0]["finished"] > 0
    assert a["timing"]["fit"]["step_s_per_seq"] == 0.0002 and a["timing"]["prefill_s_per_token"] == 0.00002
    assert any("step time from" in n and "tiny-llama" in n for n in a["notes"])
    # 8 users, each request ~4 ms + 8 x 0.2 ms a step: 128 steps of 5.6 ms + 32 prompt tokens x 20 us ~ 0.72 s
    assert a["timing"]["closed_loop_start_spread_s"] == pytest.approx(128 * (0.004 + 8 * 0.0002) + 1056 * 0.00002)
    assert a["policies"][0]["requests_per_s"] == pytest.approx(8 / 0.72, rel=0.15)


def test_a_timing_file_and_a_fixed_decode_step_are_exclusive(tmp_path):
    (tmp_path / "t.yaml").write_text("kvplan_timing: 1\nfit: {step_base_s: 0.004}\n")
    path = _cpu_workload(tmp_path, "timing: {file: t.yaml, decode_step_s: 0.01}\n")
    r = runner.invoke(app, ["simulate", str(path)])
    assert r.exit_code == 2 and "wl.yaml:12:" in r.stderr and "exclusive" in r.stderr
    flag = runner.invoke(app, ["simulate", str(_cpu_workload(tmp_path, "timing: {decode_step_s: 0.01}\n")), "--timing",
                               str(tmp_path / "t.yaml")])
    assert flag.exit_code == 2 and "exclusive" in flag.stderr


def test_a_missing_timing_file_is_one_line(tmp_path):
    r = runner.invoke(app, ["simulate", str(_cpu_workload(tmp_path, "timing: {file: nope.yaml}\n"))])
    assert r.exit_code == 2 and "nope.yaml" in r.stderr and "Traceback" not in r.output


# ---------------------------------------------------------------------------------------------
# closed-loop users with no think time


def test_users_with_no_think_time_start_spread_over_a_request():
    arrivals = Arrivals(RequestSource.of([]), ClosedLoop(8, 0.0, spread_s=2.0), 0, 2048)
    # a source of 8 requests: one first request per user
    from kvplan.sim.simulate import Request

    arrivals = Arrivals(RequestSource.of([Request(10, 10)] * 8), ClosedLoop(8, 0.0, spread_s=2.0), 0, 2048)
    arrivals.start()
    starts = sorted(t for t, _ in arrivals._heap)
    assert len(set(starts)) == 8 and 0 <= starts[0] and starts[-1] <= 2.0 and starts[-1] - starts[0] > 1.0
    still = Arrivals(RequestSource.of([Request(10, 10)] * 8), ClosedLoop(8, 0.0), 0, 2048)
    still.start()
    assert {t for t, _ in still._heap} == {0.0}  # the API's ClosedLoop without a spread: as given


def test_a_workload_spreads_its_users_and_stays_spread(tmp_path):
    (tmp_path / "t.yaml").write_text("kvplan_timing: 1\nfit: {step_base_s: 0.004, step_s_per_seq: 0.0002, "
                                      "prefill_s_per_token: 0.00002}\n")
    wl = load_workload(_cpu_workload(tmp_path, "timing: {file: t.yaml}\n", arrivals="{users: 48, think_s: 0}"))
    run = run_workload(wl, record_series=True)
    r = run.result.results[0]
    assert run.result.closed_loop.start_spread_s > 0.5
    # in step, all 48 would prefill together, then decode together: the pool would swing between two levels;
    # spread, the running count stays near 48 and the pool's peak near its mean
    assert r.concurrency_p50 >= 44 and r.usage_peak < 1.5 * r.usage_mean


def test_config_from_plan_with_a_fit_needs_no_bandwidth():
    from kvplan.planning.plan import estimate, options_from_values

    plan = estimate(options_from_values({"model": str(TINY), "gpu": "cpu", "kv_budget": "75497472B", "max_model_len": 2048,
                                          "context": 2048}))
    config, _ = config_from_plan(plan, fit=TRUE)
    assert config.timing.fit == TRUE and config.timing.prefill_s_per_token == TRUE.prefill_s_per_token
    assert config.pool.num_blocks == 288 and config.pool.block_size == 128
    with pytest.raises(InputError, match="lacks prefill_s_per_token .* the decode step"):
        config_from_plan(plan)
