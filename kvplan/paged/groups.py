"""The one mapping from a plan's KV-cache groups onto the plain-Python allocator's groups.

:func:`kvplan.paged.validate.validate_plan` (filling a real pool) and :func:`kvplan.sim.simulate.config_from_plan`
(a scheduler over the allocator) both build their allocator from :func:`allocator_groups`, so they hold
the blocks the plan's :class:`~kvplan.memory.Demand` counts:

- full attention and MLA keep every token -> ``full``;
- sliding window W -> ``sliding`` of W tokens;
- chunked local attention C (Llama 4) -> ``sliding`` of C tokens: a chunked layer keeps the tokens since
  its chunk began, at most the last C, so a window of one chunk is the allocator's closest upper bound;
- state layers -> ``state`` holding the demand's state blocks (1, or the prefix-caching checkpoints);
- cross-attention layers (encoder / image tokens, a fixed amount per request) -> ``state`` holding
  ``ceil(encoder tokens / block size)`` blocks.

SGLang's hybrid SWA pool (``layout.swa_ratio``: a full pool and a sliding pool of their own) is one allocator here:
a request's sliding blocks are taken from the full pool's, so the allocator holds at most what the plan's
:class:`~kvplan.memory.Demand` counts (``max(full, sliding / ratio)``) and never more (the safe side).

:func:`plan_allocator` is the allocator validate fills; :func:`exact_layout` says when its demand is
exactly the plan's (so one request beyond the plan must not fit).

Plain Python, no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.memory import Demand, KVGroup, PoolLayout
from kvplan.paged.allocator import BlockAllocator, GroupSpec
from kvplan.model.spec import LayerKind

if TYPE_CHECKING:  # pragma: no cover
    from kvplan.planning.plan import Plan


def allocator_group(demand: Demand, group: KVGroup) -> GroupSpec:
    """The allocator's view of one KV-cache group under ``demand`` (see the module doc)."""
    cache = group.cache
    if cache.kind in (LayerKind.SLIDING, LayerKind.CHUNKED) and cache.window_tokens:
        return GroupSpec("sliding", window_tokens=cache.window_tokens)
    if cache.is_state or cache.kind is LayerKind.CROSS:
        return GroupSpec("state", state_blocks=demand.fixed_blocks(group))
    return GroupSpec("full")


def allocator_groups(demand: Demand) -> tuple[GroupSpec, ...]:
    """One allocator group per group of ``demand.layout``, in order."""
    return tuple(allocator_group(demand, g) for g in demand.layout.groups)


def exact_layout(layout: PoolLayout) -> bool:
    """True when every group keeps every token (full attention, MLA) or a fixed state: the allocator's
    demand then equals the plan's per-request blocks exactly, so one request beyond the plan must not fit."""
    return all(g.cache.kind in (LayerKind.FULL, LayerKind.MLA) or g.cache.is_state for g in layout.groups)


def plan_allocator(plan: "Plan", layout: PoolLayout, num_blocks: int) -> tuple[BlockAllocator, Demand]:
    """The allocator the fill runs on: the plan's demand over ``layout`` (this rank's), its groups from
    :func:`allocator_groups`, the null block reserved, no prefix hits."""
    demand = plan.demand.with_layout(layout)
    allocator = BlockAllocator(num_blocks, layout.block_size, allocator_groups(demand),
                               reserve_null_block=True, enable_prefix_caching=False)
    return allocator, demand
