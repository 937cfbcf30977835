"""The memory math: pure functions over exact integers of bytes.

Every formula kvplan uses lives here, once. ``estimate``, ``check``, ``report``, ``simulate`` and the
torch validator all call these functions; nobody multiplies heads by layers a second time.

- :mod:`kvplan.memory.layout`: bytes per layer, the tensor/pipeline-parallel slice one GPU holds, and
  how its layers share one block pool (vLLM's KV-cache groups: :class:`PoolLayout`, :func:`pool_layout`,
  :func:`num_blocks`);
- :mod:`kvplan.memory.stages`: the pipeline stages (layers per stage as each engine splits them, the weight bytes
  each stage loads: :class:`PipelineStage`, :func:`pipeline_stages`, :func:`stage_weight_bytes`);
- :mod:`kvplan.memory.capacity`: what one request holds in that pool (:class:`Demand`), how many fit,
  the longest context, prefix sharing, paged vs contiguous, the decode roofline.

Vocabulary (vLLM v1's, see DESIGN.md section 4a):
- a *page* is one block of one layer: ``block_size`` tokens x bytes per token per layer;
- layers are bucketed by kind into *KV-cache groups* of ``group_size`` layers; one *block id* costs
  ``group_size x page`` bytes and backs one page in every group;
- a request at length L needs, per group, ``ceil(L / block_size)`` blocks (full attention) or fewer
  (sliding window, chunked attention, fixed state).

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits, kvplan.model
"""

from kvplan.memory.capacity import (
    NULL_BLOCKS, UNBOUNDED_TOKENS, Demand, Fragmentation, PrefixSharing, Roofline, contiguous_vs_paged,
    decode_roofline, step_weight_bytes, group_blocks_per_request, grouped_kv_tokens, kv_cache_tokens, max_context, max_requests,
    max_sharing_requests, prefix_sharing, raw_request_bytes, vllm_max_concurrency, weight_bytes,
)
from kvplan.memory.layout import (
    DEFAULT_BLOCK_SIZE, GROUP_RATIO, KVGroup, PoolLayout, cached_pool_layout, cross_bytes_per_request,
    group_size_for, hybrid_block_size,
    kv_bytes_per_token, kv_heads_replicated, layer_page_bytes, layer_state_bytes, layer_token_bytes, num_blocks,
    pool_bytes, pool_layout, full_length_layers, split_swa_layout, pp_stages, rank_layers, shard_layer, stage_rank_layers,
    state_bytes_per_request, tp_kv_heads,
)
from kvplan.memory.stages import (
    PARTITIONS, PipelineStage, pipeline_stages, pp_layer_counts, stage_caches, stage_weight_bytes,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE", "GROUP_RATIO", "KVGroup", "PoolLayout", "cached_pool_layout", "cross_bytes_per_request",
    "group_size_for",
    "hybrid_block_size", "kv_bytes_per_token", "kv_heads_replicated", "layer_page_bytes", "layer_state_bytes",
    "layer_token_bytes", "num_blocks", "pool_bytes", "pool_layout", "pp_layer_counts", "pp_stages", "rank_layers",
    "shard_layer", "stage_rank_layers", "state_bytes_per_request", "PARTITIONS", "PipelineStage", "pipeline_stages",
    "stage_caches", "stage_weight_bytes", "tp_kv_heads", "full_length_layers", "split_swa_layout",
    "NULL_BLOCKS", "UNBOUNDED_TOKENS", "Demand", "Fragmentation", "PrefixSharing", "Roofline", "contiguous_vs_paged",
    "decode_roofline", "step_weight_bytes", "group_blocks_per_request", "grouped_kv_tokens", "kv_cache_tokens", "max_context",
    "max_requests", "max_sharing_requests", "prefix_sharing", "raw_request_bytes", "vllm_max_concurrency", "weight_bytes",
]
