"""Where a GPU's KV cache lives: bytes per layer, the tensor/pipeline-parallel slice, and vLLM's KV-cache
groups (:class:`PoolLayout`). Pure functions over exact integers of bytes; :mod:`kvplan.memory` re-exports them.

Vocabulary (vLLM v1's, see DESIGN.md section 4a): a *page* is one block of one layer (``block_size``
tokens x bytes per token per layer); layers are bucketed by kind into *KV-cache groups* of ``group_size``
layers; one *block id* costs ``group_size x page`` bytes and backs one page in every group.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from functools import lru_cache

from kvplan.errors import InputError
from kvplan.memory.stages import PipelineStage, pipeline_stages, stage_caches
from kvplan.model.spec import LayerCache, LayerKind, ModelSpec
from kvplan.units import DType, cdiv, parse_dtype, plural
from kvplan.frozen import frozen

DEFAULT_BLOCK_SIZE = 16

# ---------------------------------------------------------------------------------------------
# per layer


def layer_token_bytes(layer: LayerCache, kv_dtype: DType) -> int:
    """Bytes one token costs in one layer (0 for state layers and layers that cache nothing).

    Full / sliding / chunked: ``2 (K and V) x kv_heads x bytes(head_dim)``;
    MLA: ``bytes(kv_lora_rank + qk_rope_head_dim)`` (one latent, no separate V).
    Quantized KV with group scales (int4) pays its scales per head.
    """
    if layer.kind is LayerKind.MLA:
        return layer.kv_heads * kv_dtype.nbytes(layer.head_dim)
    if layer.caches_tokens:
        return 2 * layer.kv_heads * kv_dtype.nbytes(layer.head_dim)
    return 0


def layer_state_bytes(layer: LayerCache, model_dtype: DType) -> int:
    """Bytes of the fixed per-request state of a state layer (0 for attention layers).

    conv state in the model dtype + SSM/recurrent state in ``layer.ssm_dtype`` (default: model dtype).
    """
    if not layer.is_state:
        return 0
    ssm_dtype = parse_dtype(layer.ssm_dtype) if layer.ssm_dtype else model_dtype
    return model_dtype.nbytes(layer.conv_elements) + ssm_dtype.nbytes(layer.ssm_elements)


def layer_page_bytes(layer: LayerCache, block_size: int, kv_dtype: DType, model_dtype: DType) -> int:
    """Bytes of one block of one layer: ``block_size x token bytes``; a state layer's page is its state."""
    if layer.is_state:
        return layer_state_bytes(layer, model_dtype)
    return block_size * layer_token_bytes(layer, kv_dtype)


def kv_bytes_per_token(layers: tuple[LayerCache, ...] | ModelSpec, kv_dtype: DType) -> int:
    """Bytes one token of context costs across ``layers`` if every layer kept it (no window applied;
    cross-attention layers cache encoder tokens, a fixed amount per request: :func:`cross_bytes_per_request`)."""
    if isinstance(layers, ModelSpec):
        layers = layers.layers
    counts = Counter(layers)  # a model repeats a few kinds of layer: each kind's bytes once
    return sum(n * layer_token_bytes(layer, kv_dtype) for layer, n in counts.items() if layer.grows_with_context)


def cross_bytes_per_request(layers: tuple[LayerCache, ...] | ModelSpec, kv_dtype: DType) -> int:
    """Fixed bytes per request of the cross-attention layers: encoder tokens x their token bytes."""
    if isinstance(layers, ModelSpec):
        layers = layers.layers
    return sum((layer.window_tokens or 0) * layer_token_bytes(layer, kv_dtype)
               for layer in layers if layer.kind is LayerKind.CROSS)


def state_bytes_per_request(layers: tuple[LayerCache, ...] | ModelSpec, model_dtype: DType) -> int:
    """Fixed bytes per request of all state layers."""
    if isinstance(layers, ModelSpec):
        layers = layers.layers
    return sum(layer_state_bytes(layer, model_dtype) for layer in layers)


# ---------------------------------------------------------------------------------------------
# tensor / pipeline parallel slices


def pp_stages(layers: tuple[LayerCache, ...], pp: int, partition: str = "before-last") -> list[tuple[LayerCache, ...]]:
    """The layers of each pipeline stage, in order (one cache entry per layer; ``partition``:
    :data:`kvplan.memory.stages.PARTITIONS`)."""
    return [layers[s.start:s.end] for s in pipeline_stages(len(layers), pp, partition)]


def tp_kv_heads(kv_heads: int, tp: int) -> int:
    """KV heads one tensor-parallel rank holds: ``max(1, kv_heads // tp)`` (replicated when tp > heads).

    vLLM requires tp to divide the heads or the heads to divide tp.
    """
    if tp < 1:
        raise InputError(f"invalid --tp {tp}: must be at least 1")
    if kv_heads >= tp and kv_heads % tp:
        raise InputError(f"--tp {tp} does not divide the model's {kv_heads} KV heads", "use a tp that divides the KV heads")
    if kv_heads < tp and tp % kv_heads:
        raise InputError(f"--tp {tp} is not a multiple of the model's {kv_heads} KV heads", "heads are replicated only when the heads divide tp")
    return max(1, kv_heads // tp)


def shard_layer(layer: LayerCache, tp: int) -> LayerCache:
    """One tensor-parallel rank's share of a layer's cache.

    Attention: ``max(1, kv_heads // tp)`` heads; MLA latents are replicated; state layers as vLLM's
    ``MambaStateShapeCalculator`` (Mamba2 groups replicated up to tp when tp does not divide them).
    """
    if tp == 1 or not layer.tp_shardable or layer.kind is LayerKind.NONE:
        return layer
    if layer.is_state:
        if layer.state_dims:
            from kvplan.model.hybrid import state_elements

            conv, ssm = state_elements(layer.state_kind, layer.state_dims, tp)
            return replace(layer, conv_elements=conv, ssm_elements=ssm)
        return replace(layer, conv_elements=cdiv(layer.conv_elements, tp), ssm_elements=cdiv(layer.ssm_elements, tp))
    return replace(layer, kv_heads=tp_kv_heads(layer.kv_heads, tp))


def kv_heads_replicated(spec: ModelSpec, tp: int) -> bool:
    """True when tp exceeds a layer's KV heads, so heads are copied across ranks."""
    return any(layer.caches_tokens and layer.tp_shardable and layer.kv_heads < tp for layer in spec.layers)


def stage_rank_layers(spec: ModelSpec, tp: int, stage: PipelineStage) -> tuple[LayerCache, ...]:
    """The layers one GPU of ``stage`` caches: the stage's layers sliced for one tp rank."""
    shards: dict[LayerCache, LayerCache] = {}  # a model repeats a few kinds of layer: each sliced once

    def shard(layer: LayerCache) -> LayerCache:
        hit = shards.get(layer)
        if hit is None:
            hit = shards[layer] = shard_layer(layer, tp)
        return hit

    caches = stage_caches(spec, stage)
    return caches if tp == 1 else tuple(shard(layer) for layer in caches)  # tp 1: the layers are their own shards


def rank_layers(spec: ModelSpec, tp: int = 1, pp: int = 1, partition: str = "before-last") -> tuple[LayerCache, ...]:
    """The layers one GPU caches: the pipeline stage with the most KV bytes, sliced for one tp rank (a plan sizes
    every stage: :func:`stage_rank_layers`)."""
    sharded = [stage_rank_layers(spec, tp, s) for s in pipeline_stages(spec.num_layers_decoder, pp, partition)]
    if len(sharded) == 1:  # pp 1: the one stage (sweeps ask thousands of times; no sizes to compare)
        return sharded[0]

    def stage_size(stage: tuple[LayerCache, ...]) -> tuple[int, int]:
        counts = Counter(stage)
        return sum(n * (layer_token_bytes(x, _BF16) + x.conv_elements + x.ssm_elements) for x, n in counts.items()), len(stage)

    # the largest stage decides (ties: the earliest), measured in bf16 bytes per token + state
    return max(sharded, key=stage_size)


_BF16 = parse_dtype("bf16")


# ---------------------------------------------------------------------------------------------
# KV-cache groups and the block pool (vLLM v1)


@frozen
class KVGroup:
    """One KV-cache group: up to ``group_size`` layers of one kind that share block ids.

    ``num_layers`` real layers; the group is padded to the pool's ``group_size``. ``block_size``: tokens
    per block of this group when it differs from the pool's (0 = the pool's ``block_size``).
    ``page_bytes``: one block of one layer of this group, summed over its layers when they differ
    (vLLM's UniformTypeKVCacheSpecs: one group of full-attention layers with different KV heads).
    """

    cache: LayerCache
    num_layers: int
    block_size: int = 0
    page_bytes: int = 0


@frozen
class PoolLayout:
    """How one GPU's KV pool is laid out.

    ``block_size``: tokens per block (raised for hybrids so one attention page holds a state page).
    ``page_bytes``: one block of one layer. ``group_size``: layers per group (padded).
    ``block_bytes`` = ``group_size x page_bytes``: what one block id costs (or the explicit
    ``bytes_per_block`` when layers of one group differ in page size).
    ``padding_layers``: layer slots added to fill the last group of each kind (wasted pages).
    ``base_block_size``: the block size asked for; ``state_page_bytes``: one state layer's unpadded state
    (0 without state layers) - padded up to ``page_bytes`` in the pool.
    """

    block_size: int
    page_bytes: int
    group_size: int
    groups: tuple[KVGroup, ...]
    kv_dtype: DType
    model_dtype: DType
    bytes_per_block: int = 0
    base_block_size: int = 0
    state_page_bytes: int = 0
    swa_ratio: float = 0.0  # > 0: the sliding groups live in a pool of their own with swa_ratio x the full pool's
    # token slots (SGLang's hybrid SWA pool); block ids count the full pool's slots (:func:`split_swa_layout`)

    @property
    def block_bytes(self) -> int:
        return self.bytes_per_block or self.group_size * self.page_bytes

    @property
    def num_layers(self) -> int:
        return sum(g.num_layers for g in self.groups)

    @property
    def padding_layers(self) -> int:
        if self.bytes_per_block:
            return 0
        return len(self.groups) * self.group_size - self.num_layers

    @property
    def state_padding_bytes(self) -> int:
        """Bytes each state page is padded by to match the attention page (0 without state layers)."""
        return self.page_bytes - self.state_page_bytes if self.state_page_bytes else 0

    def group_block_size(self, group: KVGroup) -> int:
        return group.block_size or self.block_size


GROUP_RATIO = 1.5  # vLLM 0.32 kv_cache_utils: max count < 1.5 x min count -> group size = max count


def group_size_for(counts: list[int], ratio: float = GROUP_RATIO) -> int:
    """vLLM's group size: the smallest kind's layer count, or the largest's if below ``ratio`` x smallest."""
    smallest, largest = min(counts), max(counts)
    return largest if largest < smallest * ratio else smallest


def hybrid_block_size(block_size: int, attention_token_bytes: int, state_bytes: int, is_mla: bool = False) -> int:
    """vLLM's attention block size for hybrids: the smallest multiple of ``block_size`` whose attention
    page (``block x attention bytes per token per layer``) holds one state page.

    ``block_size x ceil(state / (block_size x token bytes))``, never below ``block_size``
    (MLA hybrids align to at least 128 tokens).
    """
    base = max(block_size, 128) if is_mla else block_size
    raised = base * cdiv(state_bytes, base * attention_token_bytes)
    return max(block_size, raised)


def pool_layout(layers: tuple[LayerCache, ...], block_size: int, kv_dtype: DType, model_dtype: DType) -> PoolLayout:
    """Bucket one GPU's layers into vLLM KV-cache groups sharing one block pool (vLLM 0.32 rules).

    - a uniform model is one group of all its layers;
    - layers of one kind that differ only in KV heads (Nemotron-NAS) are one group whose block costs
      the sum of their pages;
    - hybrids with state layers raise the block size (:func:`hybrid_block_size`) and pad the state
      page up to the attention page;
    - mixed kinds are split into groups of ``group_size`` layers (``layers[i::num_groups]``), each
      kind's last group padded; a kind with a smaller page gets a proportionally larger block size.
    """
    if block_size < 1:
        raise InputError(f"invalid --block-size {block_size}: must be at least 1")
    cached = [layer for layer in layers if layer.kind is not LayerKind.NONE]
    if not cached:
        raise InputError("the model caches nothing on this GPU (no attention or state layers)")
    token_layers = [x for x in cached if x.caches_tokens]
    state_layers = [x for x in cached if x.is_state]
    if not token_layers:
        raise InputError("the model has no attention layer on this GPU (state layers only)",
                         "kvplan plans paged attention caches; attention-free models are not modelled")
    base = block_size
    state_page = max((layer_state_bytes(x, model_dtype) for x in state_layers), default=0)
    if state_layers:
        first = token_layers[0]  # vLLM sizes the block from the model-level attention shape
        block_size = hybrid_block_size(base, layer_token_bytes(first, kv_dtype), state_page, first.kind is LayerKind.MLA)
    counts = Counter(cached)
    kinds = list(dict.fromkeys(cached))

    def page(layer: LayerCache, bs: int) -> int:
        # a state page is padded up to the attention page (vLLM's mamba_page_size_padded)
        if layer.is_state:
            return block_size * layer_token_bytes(token_layers[0], kv_dtype)
        return bs * layer_token_bytes(layer, kv_dtype)

    extra = dict(base_block_size=base, state_page_bytes=state_page)
    if len(kinds) == 1:
        kind = kinds[0]
        p = page(kind, block_size)
        return PoolLayout(block_size, p, counts[kind], (KVGroup(kind, counts[kind]),), kv_dtype, model_dtype, **extra)
    if not state_layers and _uniform_type(kinds):
        # one group; each layer keeps its own page (vLLM's UniformTypeKVCacheSpecs)
        total = sum(page(k, block_size) * counts[k] for k in kinds)
        group = KVGroup(kinds[0], len(cached), page_bytes=total)
        return PoolLayout(block_size, page(kinds[0], block_size), len(cached), (group,), kv_dtype, model_dtype,
                          bytes_per_block=total, **extra)
    pages = {k: page(k, block_size) for k in kinds}
    size, groups = _mixed_groups(counts, pages, block_size)
    return PoolLayout(block_size, max(pages.values()), size, groups, kv_dtype, model_dtype, **extra)


def _mixed_groups(counts: Counter[LayerCache], pages: dict[LayerCache, int],
                  block_size: int) -> tuple[int, tuple[KVGroup, ...]]:
    """Group size and groups of a pool with several kinds of layers (``pages``: each kind's page bytes).

    vLLM's unify_kv_cache_spec_page_size: a kind whose page divides the largest gets a proportionally
    larger block size; each kind splits into ``ceil(n / group_size)`` groups, ``layers[i::num_groups]``
    (so they differ by at most one layer).
    """
    max_page = max(pages.values())
    block_sizes: dict[LayerCache, int] = {}
    for kind, kind_page in pages.items():
        if kind_page == max_page or kind.is_state or max_page % kind_page:
            block_sizes[kind] = 0  # the pool's block size (a page that does not divide is padded up)
        else:
            block_sizes[kind] = block_size * (max_page // kind_page)
    size = group_size_for([counts[k] for k in pages])
    groups: list[KVGroup] = []
    for kind in pages:
        n = counts[kind]
        num_groups = cdiv(n, size)
        groups.extend(KVGroup(kind, len(range(i, n, num_groups)), block_sizes[kind]) for i in range(num_groups))
    return size, tuple(groups)


def _uniform_type(kinds: list[LayerCache]) -> bool:
    """All layers need the same token slots: all full/MLA, or all sliding (one window), or all chunked."""
    first = kinds[0]
    if first.kind in (LayerKind.FULL, LayerKind.MLA):
        return all(k.kind is first.kind for k in kinds)
    return all(k.kind is first.kind and k.window_tokens == first.window_tokens for k in kinds)


def full_length_layers(layers: tuple[LayerCache, ...]) -> tuple[LayerCache, ...]:
    """``layers`` with every windowed (sliding, chunked) layer holding every token, as full attention: how an engine
    that keeps no window in its pool (SGLang outside its hybrid SWA pool) stores them."""
    return tuple(replace(x, kind=LayerKind.FULL, window_tokens=None)
                 if x.kind in (LayerKind.SLIDING, LayerKind.CHUNKED) else x for x in layers)


def split_swa_layout(layers: tuple[LayerCache, ...], page_size: int, kv_dtype: DType, model_dtype: DType,
                     ratio: float) -> PoolLayout:
    """A pool split into a full-attention pool and a sliding-window pool with ``ratio`` x its token slots
    (SGLang's hybrid SWA pool, ``--swa-full-tokens-ratio``): one group of the full (and MLA) layers and one of the
    sliding layers, each of all its layers; a block id is one page of the full pool, and it costs the full layers'
    page plus ``ratio`` x the sliding layers' page (``floor``), so ``num_blocks`` is the full pool's pages
    (SGLang: ``full_tokens = total_memory / (F x n_full + r x S x n_swa)``). A request holds its every token in the
    full pool and its window in the sliding one (:meth:`kvplan.memory.Demand.blocks`)."""
    full = tuple(x for x in layers if x.kind in (LayerKind.FULL, LayerKind.MLA))
    swa = tuple(x for x in layers if x.kind is LayerKind.SLIDING)
    if not full or not swa or len(full) + len(swa) != sum(1 for x in layers if x.kind is not LayerKind.NONE):
        raise InputError("a hybrid sliding-window pool needs full and sliding layers only")
    full_page = sum(page_size * layer_token_bytes(x, kv_dtype) for x in full)
    swa_page = sum(page_size * layer_token_bytes(x, kv_dtype) for x in swa)
    groups = (KVGroup(full[0], len(full), page_bytes=full_page), KVGroup(swa[0], len(swa), page_bytes=swa_page))
    return PoolLayout(page_size, page_size * layer_token_bytes(full[0], kv_dtype), len(full) + len(swa), groups,
                      kv_dtype, model_dtype, bytes_per_block=full_page + math.floor(ratio * swa_page),
                      base_block_size=page_size, swa_ratio=ratio)


def num_blocks(kv_budget_bytes: int, layout: PoolLayout) -> int:
    """Block ids that fit in ``kv_budget_bytes``: ``budget // (group_size x page)`` (0 when negative)."""
    return max(0, kv_budget_bytes // layout.block_bytes)


def pool_bytes(blocks: int, layout: PoolLayout) -> int:
    """Bytes the pool of ``blocks`` block ids occupies (what the torch pool must allocate)."""
    return blocks * layout.block_bytes


@lru_cache(maxsize=4096)
def _cached_layout(layers: tuple[LayerCache, ...], block_size: int, kv_dtype: DType, model_dtype: DType) -> PoolLayout:
    return pool_layout(layers, block_size, kv_dtype, model_dtype)


def cached_pool_layout(layers: tuple[LayerCache, ...], block_size: int, kv_dtype: DType, model_dtype: DType) -> PoolLayout:
    """:func:`pool_layout`, memoised (sweeps ask for the same layout many times)."""
    return _cached_layout(layers, block_size, kv_dtype, model_dtype)
