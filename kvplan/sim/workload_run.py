"""A workload run: its requests replayed under each policy on the plan's pool (kvplan.sim.simulate), and the capacity
its figures are read against.
"""

from __future__ import annotations

from typing import Any

from kvplan.errors import ScenarioError
from kvplan.io.yamldoc import ScenarioFileError, display_path
from kvplan.sim.workload import Workload
from kvplan.units import plural
from kvplan.frozen import frozen


@frozen
class Capacity:
    """What the deployment fits of this workload's requests (``at_tokens``: prompt + output, on average,
    at most max_model_len): ``unshared`` without prefix caching; with it, ``shared`` when the most common
    prefix (``prefix_name``, ``prefix_tokens``, carried by ``prefix_share`` of the requests) has full blocks
    to store once (``shared_blocks``) - :func:`kvplan.memory.prefix_sharing`, the rule the verdict uses."""

    at_tokens: int
    unshared: int
    shared: int | None = None
    prefix_name: str | None = None
    prefix_tokens: int = 0
    prefix_share: float = 0.0
    shared_blocks: int = 0

    def describe(self, caching: bool) -> str:
        text = f"fits {plural(self.unshared, 'request')} of {plural(self.at_tokens, 'token')} (this traffic's mean)"
        if caching and self.shared is not None:
            who = "" if self.prefix_share >= 1 else f", for the {self.prefix_share:.0%} of requests that carry it"
            text += (f"; with prefix caching the {self.prefix_tokens:,}-token {self.prefix_name}'s "
                     f"{plural(self.shared_blocks, 'block')} are stored once: {self.shared:,}{who}")
        return text


def capacity(workload: Workload, plan: Any) -> Capacity:
    """The deployment's requests at the workload's mean length, without and with its shared prefix."""
    from kvplan import memory

    prompt, output = workload.mean_lengths()
    at = max(1, min(plan.max_model_len, round(prompt + output)))
    cap = plan.answer.max_num_seqs
    unshared = min(memory.max_requests(plan.answer.num_blocks, plan.demand.blocks(at)), cap)
    if not workload.prefixes:
        return Capacity(at, unshared)
    top = max(workload.prefixes, key=lambda p: p.share)
    tokens = min(top.tokens, at)
    sharing = memory.prefix_sharing(plan.answer.num_blocks, plan.demand, at, tokens, plan.spec.parameters_read(1), cap)
    if not sharing.shared_blocks:
        return Capacity(at, unshared, None, top.name, tokens, top.share)
    return Capacity(at, unshared, sharing.max_requests_shared, top.name, tokens, top.share, sharing.shared_blocks)


@frozen
class WorkloadRun:
    """A simulated workload: the plan it ran on, what the deployment fits of its requests, the per-policy
    results."""

    workload: Workload
    plan: Any  # kvplan.planning.plan.Plan
    result: Any  # kvplan.sim.simulate.SimResult
    notes: tuple[str, ...] = ()
    capacity: Capacity | None = None


def run_workload(workload: Workload, token: str | None = None, record_series: bool = True, *, force: bool = False,
                 progress: Any = None) -> WorkloadRun:
    """Plan the deployment (as ``kvplan estimate`` would), then simulate every policy.

    The run's work is counted first (:meth:`Workload.work`) and refused past
    :data:`kvplan.sim.simulate.MAX_WORK` unless ``force``; ``progress(done, total)`` hears how far it got.
    """
    from kvplan.errors import KvplanError
    from kvplan.planning.plan import estimate, options_from_values
    from kvplan.sim.simulate import config_from_plan, simulate

    timing = None
    if workload.timing_file is not None:
        from kvplan.sim.timing import read_timing

        timing = read_timing(workload.timing_file)
    try:
        plan = estimate(options_from_values(dict(workload.values)), token=token)
        config, notes = config_from_plan(plan, prefill_s_per_token=workload.prefill_s_per_token,
                                         decode_step_s=workload.decode_step_s,
                                         prefill_efficiency=workload.prefill_efficiency,
                                         fit=timing.fit if timing is not None else None)
        if timing is not None:
            runs = f", {plural(len(timing.runs), 'observed run')}" if timing.runs else ""
            notes = (*notes, f"step time from {display_path(workload.timing_file)}"
                     f"{' (model ' + timing.model + runs + ')' if timing.model else runs}: {timing.fit.describe()}")
        closed = workload.spread_closed_loop(config)
        work = workload.work(config.pool, config.timing.min_step_s)
        result = simulate(config, workload.source(), policies=workload.policies, duration_s=workload.duration_s,
                          closed_loop=closed, seed=workload.seed, record_series=record_series,
                          work=work, force=force, progress=progress)
    except ScenarioError:
        raise
    except KvplanError as exc:  # in the file's words, at the key it names first (else the file)
        from kvplan.checks.fields import first_key, in_file_words

        key = first_key(exc.message)
        raise ScenarioFileError(workload.where_of(key) if key else workload.where, in_file_words(exc.message),
                                in_file_words(exc.hint)) from None
    return WorkloadRun(workload, plan, result, notes + result.notes, capacity(workload, plan))
