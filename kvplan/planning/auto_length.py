"""``--max-model-len auto``: the longest max_model_len the engine starts with and one request that long runs.

The length is found on the deployment planned for ``--context`` (:meth:`Deployment.longest_runnable_len`, at
most the model's maximum). Where the pool itself follows max_model_len (vLLM's V0 engine batches
``max_model_len`` tokens below 32K, so its activation peak grows with the length), that length is checked on
its own pool; when that pool no longer runs it, the longest length whose own pool runs it is searched (a
shorter length's pool is never smaller, so the predicate holds up to one length and fails after it).
"""

from __future__ import annotations

from typing import Callable, TypeVar

from kvplan.planning.answer import Deployment
from kvplan.errors import InputError
from kvplan.units import plural

P = TypeVar("P")  # the planner's pool, carried through untouched


def settle(deployment: Deployment,
           runs_at: Callable[[int], tuple[P, Deployment] | None]) -> tuple[tuple[P, Deployment], int, str]:
    """``((pool, deployment) at the length, length in tokens, the plan's note)``.

    ``deployment`` is the one planned for ``--context``; ``runs_at(length)`` plans
    ``max_model_len = length`` and returns its pool and deployment, or None when the engine does not start
    there, refuses its batching, or runs no request that long. InputError when no length runs.
    """
    longest = deployment.longest_runnable_len()
    if longest < 1:
        why = deployment.refusal(1) or "not even one block fits in the KV budget"
        raise InputError(f"--max-model-len auto: the engine starts with no max_model_len: {why}")
    settled = runs_at(longest)
    if settled is None:
        low, high = 0, longest  # runs at low (0: none yet), not at high
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (low, mid) if runs_at(mid) is None else (mid, high)
        settled = runs_at(low) if low >= 1 else None
        if settled is None:
            raise InputError("--max-model-len auto: the engine starts with no max_model_len: the pool it sizes for "
                             "each length runs no request that long")
        longest = low
    final = settled[1]
    limit = final.model_length
    capped = f", capped at the model's maximum {limit.rule}" if limit.tokens and longest == limit.tokens else ""
    startable = final.longest_startable_len()
    idle = (f"; {final.engine.engine} would start with up to {startable:,}, but no request that long runs"
            if startable > longest else "")
    from kvplan.engines.registry import flag

    return settled, longest, (f"{flag(final.engine.engine, 'max_model_len')} auto: {plural(longest, 'token')} "
                              f"(the longest the engine starts "
                              f"with and one request that long runs{capped}{idle})")
