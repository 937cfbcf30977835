"""The plan's range: its answer at the low and the high end of the KV budget's spread.

The budget's terms are estimates; :func:`kvplan.engines.spread.spread` says how far real engines of the same
class (engine, release family, tp) strayed from kvplan's KV budget on the corpus of real start-up logs. The
range re-answers the same deployment (:class:`~kvplan.planning.answer.Deployment`, the same rules) with the
blocks that the budget less that shortfall, and plus that excess, hold. Where the engine's code path depends
on its installation (vLLM 0.8 - 0.11's sampler) the low end pays the costlier path too. A KV budget the user
gives (``--kv-budget``) has no spread.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvplan import memory
from kvplan.engines import Budget, EngineDefaults
from kvplan.engines.spread import ROUGH_WEIGHTS_FRACTION, rough_weights, spread
from kvplan.planning.answer import Answer, Deployment
from kvplan.units import GiB


@dataclass(frozen=True)
class KvRange:
    """The answer at the low and high end of the KV budget's spread (bytes per GPU), and where the spread came from."""

    low: Answer
    high: Answer
    kv_budget_low_bytes: int
    kv_budget_high_bytes: int
    source: str
    low_deployment: Deployment  # the plan's deployment with the low end's blocks (a report's rows ask it)
    high_deployment: Deployment

    def to_dict(self) -> dict:
        def end(a: Answer, kv: int) -> dict:
            return {"kv_budget_bytes": kv, "num_blocks": a.num_blocks, "kv_tokens": a.kv_tokens,
                    "max_requests": a.max_requests, "max_concurrency": round(a.max_concurrency, 6),
                    "max_context_at_batch": a.max_context_at_batch, "fits": a.fits}
        return {"low": end(self.low, self.kv_budget_low_bytes), "high": end(self.high, self.kv_budget_high_bytes),
                "source": self.source}


def kv_range(budget: Budget, engine: EngineDefaults, deployment: Deployment, answer: Answer, tp: int, context: int,
             batch: int, max_model_len: int | None, is_cpu: bool) -> KvRange:
    """The range of ``answer`` (the plan's, at ``batch`` x ``context``) for a deployment of ``tp`` GPUs."""
    kv = budget.kv_budget_bytes
    s = None if is_cpu or budget.kv_budget_source.startswith("--kv-budget") else spread(engine.engine, engine.version, tp)
    if s is None:
        why = ("the KV budget is given (--kv-budget)" if budget.kv_budget_source.startswith("--kv-budget") or is_cpu
               else "no measured spread for this engine")
        return KvRange(answer, answer, kv, kv, why, deployment, deployment)
    over = max(s.over_bytes, budget.path_gap_bytes)
    rough = round(ROUGH_WEIGHTS_FRACTION * budget.weights.bytes) if rough_weights(budget.weights.source) else 0
    low_kv, high_kv = kv - over - rough, kv + s.under_bytes

    low, high = deployment_at(deployment, low_kv), deployment_at(deployment, high_kv)

    def answer_of(d: Deployment) -> Answer:
        return answer if d is deployment else d.answer(context, batch, max_model_len)

    source = s.source
    if rough:
        source += (f"; the weights, counted from parameters and a dtype, may load {ROUGH_WEIGHTS_FRACTION:.0%} more "
                   f"({rough / GiB:.2f} GiB)")
    if budget.path_gap_bytes > s.over_bytes:
        source += f"; the low end pays the engine's costlier code path ({budget.path_gap_bytes / GiB:.2f} GiB)"
    return KvRange(answer_of(low), answer_of(high), low_kv, high_kv, source, low, high)


def deployment_at(deployment: Deployment, kv_budget_bytes: int) -> Deployment:
    """``deployment`` with the blocks a KV budget of ``kv_budget_bytes`` per GPU holds (itself when they are its own)."""
    blocks = memory.num_blocks(kv_budget_bytes, deployment.demand.layout) if kv_budget_bytes > 0 else 0
    return deployment if blocks == deployment.blocks else replace(deployment, blocks=blocks)


__all__ = ["KvRange", "deployment_at", "kv_range"]
