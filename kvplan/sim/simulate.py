"""The KV pool under a workload: a step-level continuous-batching simulator over the real allocator.

Every policy runs the SAME block allocator as ``kvplan validate`` (:mod:`kvplan.paged.allocator`):

* ``contiguous``: each admitted request reserves ``ceil(max_model_len / block_size)`` blocks at once
  (per attention group) and never grows: what a worst-case contiguous reservation holds;
* ``paged``: a request allocates the blocks of its prompt and one more block each time decoding fills one;
* ``prefix_caching``: paged, with token ids passed to the allocator so full prompt blocks are shared and
  freed blocks stay cached until evicted (LRU, inside the allocator).

The scheduler follows vLLM v1 (FCFS, chunked prefill): each step, running requests go first (decoders
take one token each, in admission order; one that needs a block when the pool is empty preempts the
newest running request: free it and put it back at the front of the queue, to be recomputed), then
partial prefills continue, then, if nothing was preempted, waiting requests are admitted in order while
a seat (``max_num_seqs``), the token budget (``max_num_batched_tokens``) and the blocks of the whole
prompt are available (``allocate``; the head of the queue blocks the rest).

Token accounting: a prefill of P tokens samples the first output token; each later decode step writes
the KV of the previous token and samples the next, so a request of O output tokens holds ``P + O - 1``
tokens when it finishes. A preempted request that had generated g tokens is readmitted as a prompt of
``P + g`` tokens (recompute). Requests are clamped to ``max_model_len`` as vLLM does (output stops at
the limit; a prompt of ``max_model_len`` tokens or more is rejected).

Step time (seconds): ``(weights + KV read) / HBM bandwidth + prefill tokens x prefill_s_per_token``,
where a decoder at L tokens reads ``L + 1`` tokens of every layer that keeps them (windowed layers at most
their window, state layers their state); a step time fitted on a running server (:mod:`kvplan.sim.timing`:
per step + per decoding sequence + per KV token read) or a fixed ``decode_step_s`` replaces the bandwidth
term when given.

Speed: between events the clock advances ``k`` decode steps at once (exactly: the step times are summed
in closed form) when no admission, finish or preemption can happen in between; the allocator is told
about a request's new tokens only when they need a new block (``append_tokens(req, n)``), so the work is
proportional to blocks allocated, not to tokens generated. A sliding-window group therefore releases
blocks that left its window at the request's next block boundary (vLLM: at its next step).

Work: :func:`estimate_work` counts a run's work before it starts (requests x steps, every policy) and
:func:`simulate` refuses past :data:`MAX_WORK` without ``force`` (and stops a run that goes past twice
the bound); memory stays proportional to the live requests (:mod:`kvplan.sim`).

The pieces live in :mod:`kvplan.sim` (model, streams, blocks, metrics, scheduler); this module is the API.
Library code: never prints, never exits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from kvplan.errors import InputError
from kvplan.sim.model import (
    DEFAULT_PREFILL_EFFICIENCY, POLICIES, POLICY_LABELS, ClosedLoop, PolicyResult, Pool, Request, Series, SimConfig,
    SimResult, Timing, window_sum,
)
from kvplan.sim.scheduler import Scheduler
from kvplan.sim.streams import RequestSource
from kvplan.sim.timing import StepFit
from kvplan.units import cdiv, check_number, plural
from kvplan.frozen import frozen

__all__ = [
    "DEFAULT_PREFILL_EFFICIENCY", "MAX_POOL_BLOCKS", "MAX_WORK", "POLICIES", "POLICY_LABELS", "ClosedLoop", "PolicyResult", "Pool",
    "Request", "RequestSource", "Scheduler", "Series", "SimConfig", "SimResult", "Timing", "Work", "active_parameters",
    "config_from_plan", "estimate_work", "simulate", "window_sum",
]

MAX_WORK = 200_000_000
"""Request-steps (requests x engine steps each, plus one per arrival, summed over policies) a run may
take without ``force``: a few minutes of one core at the density of docs/examples/shared_prompt.yaml (an hour
of it, three policies, is 2.2e7 and takes ~17 s: the median CPU time of 3 runs on a shared 2-core machine, so
2e8 is ~2.5 min); spans of decode steps make most runs cheaper."""

MAX_POOL_BLOCKS = 2_000_000
"""Blocks a simulated pool may have without ``force``: the allocator keeps ~163 B per block (325 MB at the
bound); real GPU pools have up to a few hundred thousand (an 8B model on an H200: ~66,000)."""

Progress = Callable[[float, float], None]
"""``progress(done, total)`` in request-steps, every few thousand loop iterations."""


def _count(x: float) -> str:
    return f"{x:,.0f}" if x < 1e9 else f"{x:.2g}"


@frozen
class Work:
    """What a run will take, counted before it starts: ``requests`` per policy (an upper estimate),
    ``steps_per_request`` (engine steps a request is part of: prefill chunks + output tokens), and
    ``basis``, how the requests were counted (for messages)."""

    requests: float
    steps_per_request: float
    policies: int
    basis: str

    @property
    def units(self) -> float:
        """Request-steps over every policy (one more per request for its arrival)."""
        return self.policies * self.requests * (1 + self.steps_per_request)

    def describe(self) -> str:
        return (f"~{_count(self.requests)} requests ({self.basis}) x ~{_count(self.steps_per_request)} steps each x "
                f"{self.policies} polic{'y' if self.policies == 1 else 'ies'} = {_count(self.units)} request-steps")


def estimate_work(requests: float, mean_prompt: float, mean_output: float, pool: Pool, policies: int,
                  basis: str) -> Work:
    """The :class:`Work` of ``requests`` requests of ``mean_prompt`` / ``mean_output`` tokens on ``pool``
    (outputs clamped to ``max_model_len``; a prompt of ``max_num_batched_tokens`` tokens or more takes
    several prefill steps)."""
    for name, value in (("requests", requests), ("mean prompt", mean_prompt), ("mean output", mean_output)):
        check_number(value, name, low=0)
    output = min(mean_output, pool.max_model_len)
    steps = math.ceil(max(1.0, mean_prompt) / pool.max_num_batched_tokens) + max(0.0, output - 1)
    return Work(float(requests), float(steps), policies, basis)


def check_work(work: Work, force: bool) -> None:
    """Raise InputError when ``work`` is past :data:`MAX_WORK` (unless ``force``), naming the numbers."""
    if not force and not work.units <= MAX_WORK:
        raise InputError(f"this simulation is too big to run without --force: {work.describe()}, past the bound of "
                         f"{_count(MAX_WORK)} (a few minutes on a laptop)",
                         "use --force to run it anyway, or lower the rate, duration_s or num_requests")


def _ticker(work: Work | None, force: bool, progress: Progress | None, policy_index: int):  # noqa: ANN202
    """The scheduler's tick: progress over every policy, and the runtime stop at twice the bound."""
    done_before = policy_index * (work.units / work.policies) if work else 0.0
    total = work.units if work else 0.0

    def tick(_t: float, done: int) -> None:
        so_far = done_before + done
        if not force and so_far > 2 * MAX_WORK:
            raise InputError(f"stopped a simulation after {_count(so_far)} request-steps, twice the bound of "
                             f"{_count(MAX_WORK)}" + (f" (it was estimated at {_count(total)})" if work else ""),
                             "use --force to run it anyway, or lower the rate, duration_s or num_requests")
        if progress is not None:
            progress(min(so_far, total) if total else so_far, total)

    return tick


def simulate(config: SimConfig, source: RequestSource | Sequence[Request], *, policies: Sequence[str] = POLICIES,
             duration_s: float | None = None, closed_loop: ClosedLoop | None = None, seed: int = 0,
             record_series: bool = True, work: Work | None = None, force: bool = False,
             progress: Progress | None = None) -> SimResult:
    """Run each policy over the same requests; stop at ``duration_s`` (else when every request is done).

    ``source``: a :class:`RequestSource` or a list of requests (with ``arrival_s`` unless ``closed_loop``).
    ``work``: the run's estimate (:func:`estimate_work`; a list of requests is counted here): past
    :data:`MAX_WORK` the run is refused unless ``force``, and any run is stopped past twice the bound.
    """
    if not isinstance(source, RequestSource):
        source = RequestSource.of(source)
    if duration_s is not None:
        check_number(duration_s, "duration_s", low=0, low_open=True)
    pool = config.pool
    usable = pool.num_blocks - 1
    need = cdiv(pool.max_model_len, pool.block_size) * sum(1 for g in pool.groups if g.kind != "state") + \
        sum(g.state_blocks for g in pool.groups)
    if need > usable:
        raise InputError(f"the pool ({usable:,} usable blocks) cannot hold one request at max_model_len "
                         f"{pool.max_model_len:,} ({plural(need, 'block')}): no request that long would ever run",
                         "lower max_model_len or raise kv_budget")
    for p in policies:
        if p not in POLICIES:
            raise InputError(f"unknown policy {p!r}", "use one of: " + ", ".join(POLICIES))
    if pool.num_blocks > MAX_POOL_BLOCKS and not force:
        raise InputError(f"the pool has {plural(pool.num_blocks, 'block')}, past the {MAX_POOL_BLOCKS:,} the simulator holds "
                         f"without --force (~163 B of allocator state each)",
                         "use --force, or a smaller kv_budget or a larger block_size")
    if work is None and source.expected is not None:
        items = list(source.cursor())
        n = len(items)
        work = estimate_work(n, sum(r.prompt_tokens for r in items) / n if n else 0.0,
                             sum(r.output_tokens for r in items) / n if n else 0.0, pool, len(policies),
                             f"{n:,} given")
    if work is not None:
        check_work(work, force)
    results = tuple(Scheduler(config, p, source, closed_loop, duration_s, seed, record_series,
                              _ticker(work, force, progress, k)).run() for k, p in enumerate(policies))
    notes = []
    if any(g.kind == "state" for g in pool.groups) and "prefix_caching" in policies:
        notes.append("the model has state layers: the allocator makes no prefix hits for it (a cached prefix would "
                     "also need its saved state)")
    return SimResult(config, results, seed, duration_s, source.limit, tuple(notes), closed_loop)


# ---------------------------------------------------------------------------------------------
# from a Plan


def active_parameters(spec) -> int | None:  # noqa: ANN001 - kvplan.model.spec.ModelSpec
    """Parameters one token computes with (a MoE's active ones): :meth:`kvplan.model.modelspec.ModelSpec.parameters_read`."""
    return spec.parameters_read(1)


def _check_runs(plan) -> None:  # noqa: ANN001
    """A plan with nothing to simulate is refused (the engine does not start, a request of max_model_len never
    runs, fewer than 2 blocks), with the length that would."""
    if plan.answer.refusal:  # nothing would run: the engine does not start
        longest = plan.answer.longest_startable_len
        raise InputError(f"{plan.engine.engine} refuses to start this deployment: {plan.answer.refusal}",
                         f"use max_model_len {longest}" if longest else "see kvplan estimate for what would start")
    if plan.answer.idle_reason:  # it starts, but a request of max_model_len never runs: nothing to simulate
        longest = plan.deployment.longest_runnable_len()
        raise InputError(f"no request of max_model_len {plan.max_model_len:,} runs: {plan.answer.idle_reason}",
                         f"use max_model_len {longest}" if longest else "see kvplan estimate for what would run")
    if plan.answer.num_blocks < 2:
        raise InputError(f"the KV pool has {plural(plan.answer.num_blocks, 'block')}: nothing to simulate",
                         "raise kv_budget, use a bigger GPU or lower the weights")


def _token_bytes(plan) -> tuple[int, dict[int, int]]:  # noqa: ANN001
    """KV bytes per token of the rank's full-attention layers, and per window size of its windowed layers (cross
    layers hold a fixed amount per request: read with the state bytes)."""
    from kvplan import memory
    from kvplan.model.spec import LayerKind

    kv_dtype = plan.layout.kv_dtype
    full, windows = 0, {}
    for layer in plan.rank_layers:
        per_token = memory.layer_token_bytes(layer, kv_dtype)
        if layer.kind is LayerKind.CROSS:
            continue  # a fixed amount per request, read with the state bytes
        if layer.kind in (LayerKind.SLIDING, LayerKind.CHUNKED) and layer.window_tokens:
            windows[layer.window_tokens] = windows.get(layer.window_tokens, 0) + per_token
        else:
            full += per_token
    return full, windows


def config_from_plan(plan, *, prefill_s_per_token: float | None = None, decode_step_s: float | None = None,  # noqa: ANN001
                     prefill_efficiency: float = DEFAULT_PREFILL_EFFICIENCY,
                     fit: StepFit | None = None) -> tuple[SimConfig, tuple[str, ...]]:
    """The pool, scheduler limits and step timing of a :class:`kvplan.planning.plan.Plan` (one GPU's view).

    Layout groups map onto allocator groups as :func:`kvplan.paged.groups.allocator_groups` maps them (the
    mapping validate uses): the ``paged`` policy runs the plan's demand without prefix caching, the
    ``prefix_caching`` policy with it (state groups then keep vLLM's checkpoint blocks).

    Step time: ``fit`` (a step time measured on a running server, :mod:`kvplan.sim.timing`) replaces the
    bandwidth roofline and gives the prefill cost; else the prefill cost per token is ``2 x active
    parameters / (GPUs x fp16 peak x prefill_efficiency)`` unless ``prefill_s_per_token`` is given. Inputs
    the plan cannot give (a target without a bandwidth or an FP16 peak: the ``cpu`` target) are named in
    one error, all at once.
    """
    from dataclasses import replace

    from kvplan import memory
    from kvplan.paged.groups import allocator_groups

    layout, notes = plan.layout, []
    bs, mnbt = layout.block_size, plan.max_num_batched_tokens
    notes.extend(f"a {g.cache.kind.value} group uses {g.block_size}-token blocks; simulated with {bs}-token blocks"
                 for g in layout.groups if g.block_size and g.block_size != bs)
    groups = allocator_groups(replace(plan.demand, prefix_caching=False))
    prefix_state = tuple(g.state_blocks for g in allocator_groups(replace(plan.demand, prefix_caching=True))
                         if g.kind == "state")
    _check_runs(plan)
    pool = Pool(plan.answer.num_blocks, bs, groups, plan.max_model_len, plan.answer.max_num_seqs, mnbt, prefix_state)
    kv_dtype, model_dtype = layout.kv_dtype, layout.model_dtype
    full, windows = _token_bytes(plan)
    if fit is not None and prefill_s_per_token is None:
        prefill_s_per_token = fit.prefill_s_per_token
    missing = []  # every timing input the plan cannot give, named at once
    tflops, active = plan.gpu.fp16_tflops, active_parameters(plan.spec)
    if prefill_s_per_token is None:
        if not tflops or not active:
            missing.append(("prefill_s_per_token", f"GPU {plan.gpu.name!r} has no FP16 peak in the catalogue" if not tflops
                            else f"{plan.spec.model_id} has no parameter count"))
        else:
            prefill_s_per_token = 2 * active / (plan.options.gpu_count * tflops * 1e12 * prefill_efficiency)
            if plan.spec.num_experts:
                notes.append(f"MoE prefill cost from the {active / 1e9:.1f}B parameters one token is routed through")
    bandwidth = plan.gpu.bandwidth_bytes_per_s or 0.0
    if not bandwidth and decode_step_s is None and fit is None:
        missing.append(("the decode step", f"GPU {plan.gpu.name!r} has no memory bandwidth in the catalogue"))
    if missing:
        raise InputError("the step-time model lacks " + "; ".join(f"{what} ({why})" for what, why in missing),
                         "fit it on a running server (kvplan observe URL --fit-timing timing.yaml under a few loads) and "
                         "give the file (timing: {file: timing.yaml} or --timing timing.yaml), or set "
                         + " and ".join(f"timing.{'decode_step_s' if what == 'the decode step' else what}" for what, _ in missing))
    timing = Timing(plan.budget.weights.bytes, float(bandwidth), full, tuple(sorted(windows.items())),
                    memory.state_bytes_per_request(plan.rank_layers, model_dtype)
                    + memory.cross_bytes_per_request(plan.rank_layers, kv_dtype), prefill_s_per_token, decode_step_s,
                    fit)
    return SimConfig(pool, timing), tuple(notes)
