"""The one mapping from a plan's KV-cache groups onto the plain-Python allocator's groups.

:func:`kvplan.paged.validate.validate_plan` (filling a real pool) and :func:`kvplan.simulate.config_from_plan`
(a scheduler over the allocator) both build their allocator from :func:`allocator_groups`, so they hold
the blocks the plan's :class:`~kvplan.memory.Demand` counts:

- full attention and MLA keep every token -> ``full``;
- sliding window W -> ``sliding`` of W tokens;
- chunked local attention C (Llama 4) -> ``sliding`` of C tokens: a chunked layer keeps the tokens since
  its chunk began, at most the last C, so a window of one chunk is the allocator's closest upper bound;
- state layers -> ``state`` holding the demand's state blocks (1, or the prefix-caching checkpoints);
- cross-attention layers (encoder / image tokens, a fixed amount per request) -> ``state`` holding
  ``ceil(encoder tokens / block size)`` blocks.

Plain Python, no torch.
"""

from __future__ import annotations

from kvplan.memory import Demand, KVGroup
from kvplan.paged.allocator import GroupSpec
from kvplan.spec import LayerKind


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
