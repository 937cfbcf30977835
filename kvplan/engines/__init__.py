"""Budget models of serving engines: how much of a GPU's memory an engine gives the KV cache.

An engine model turns (spec, GPU, options) into a :class:`Budget` whose every term is shown and can
be overridden, plus the engine's defaults (utilisation, block size, batching limits).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """One budget term in bytes and where it came from (``computed: ...`` or ``--weights-gib``)."""

    name: str
    bytes: int
    source: str


@dataclass(frozen=True)
class Budget:
    """Per-GPU memory budget (bytes).

    ``usable = ceil(total x gpu_util)``; ``kv_budget = usable - weights - activation - overhead - cudagraph``,
    or the explicit ``--kv-budget`` when given (then the other terms are informational).
    """

    total_bytes: int
    gpu_util: float
    usable_bytes: int
    weights: Term
    activation: Term
    overhead: Term
    cudagraph: Term
    kv_budget_bytes: int
    kv_budget_source: str

    @property
    def terms(self) -> tuple[Term, ...]:
        return (self.weights, self.activation, self.overhead, self.cudagraph)


@dataclass(frozen=True)
class EngineDefaults:
    """Engine settings that change capacity: utilisation, block size, batching limits."""

    engine: str
    version: str
    gpu_util: float
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
