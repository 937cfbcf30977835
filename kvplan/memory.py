"""The memory math: pure functions over exact integers of bytes.

Every formula kvplan uses lives here, once. ``estimate``, ``check``, ``report``, ``simulate`` and the
torch validator all call these functions; nobody multiplies heads by layers a second time.

Vocabulary (vLLM v1's, see DESIGN.md section 4a):
- a *page* is one block of one layer: ``block_size`` tokens x bytes per token per layer;
- layers are bucketed by kind into *KV-cache groups* of ``group_size`` layers; one *block id* costs
  ``group_size x page`` bytes and backs one page in every group;
- a request at length L needs, per group, ``ceil(L / block_size)`` blocks (full attention) or fewer
  (sliding window, chunked attention, fixed state).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache

from kvplan.errors import InputError
from kvplan.spec import LayerCache, LayerKind, ModelSpec
from kvplan.units import DType, cdiv, parse_dtype

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
    """Bytes one token of context costs across ``layers`` if every layer kept it (no window applied)."""
    if isinstance(layers, ModelSpec):
        layers = layers.layers
    return sum(layer_token_bytes(layer, kv_dtype) for layer in layers)


def state_bytes_per_request(layers: tuple[LayerCache, ...] | ModelSpec, model_dtype: DType) -> int:
    """Fixed bytes per request of all state layers."""
    if isinstance(layers, ModelSpec):
        layers = layers.layers
    return sum(layer_state_bytes(layer, model_dtype) for layer in layers)


# ---------------------------------------------------------------------------------------------
# tensor / pipeline parallel slices


def pp_layer_counts(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage as vLLM's ``get_pp_indices`` splits them.

    ``num_layers // pp`` each; the remainder goes one each to the stages before the last
    (the last stage also holds the LM head). 61 layers over 4 stages -> ``[15, 15, 16, 15]``.
    """
    if pp < 1:
        raise InputError(f"invalid --pp {pp}: must be at least 1")
    if pp > num_layers:
        raise InputError(f"--pp {pp} exceeds the model's {num_layers} layers")
    counts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        counts[-i] += 1
    return counts


def pp_stages(layers: tuple[LayerCache, ...], pp: int) -> list[tuple[LayerCache, ...]]:
    """The layers of each pipeline stage, in order."""
    out, start = [], 0
    for count in pp_layer_counts(len(layers), pp):
        out.append(layers[start : start + count])
        start += count
    return out


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
    """One tensor-parallel rank's share of a layer's cache (MLA latents are replicated)."""
    if tp == 1 or not layer.tp_shardable or layer.kind is LayerKind.NONE:
        return layer
    if layer.is_state:
        return replace(layer, conv_elements=cdiv(layer.conv_elements, tp), ssm_elements=cdiv(layer.ssm_elements, tp))
    return replace(layer, kv_heads=tp_kv_heads(layer.kv_heads, tp))


def kv_heads_replicated(spec: ModelSpec, tp: int) -> bool:
    """True when tp exceeds a layer's KV heads, so heads are copied across ranks."""
    return any(layer.caches_tokens and layer.tp_shardable and layer.kv_heads < tp for layer in spec.layers)


def rank_layers(spec: ModelSpec, tp: int = 1, pp: int = 1) -> tuple[LayerCache, ...]:
    """The layers one GPU caches: the pipeline stage with the most KV bytes, sliced for one tp rank."""
    stages = pp_stages(spec.layers, pp)
    sharded = [tuple(shard_layer(layer, tp) for layer in stage) for stage in stages]
    # the largest stage decides (ties: the earliest), measured in bf16 bytes per token + state
    return max(sharded, key=lambda s: (sum(layer_token_bytes(x, _BF16) for x in s) + sum(x.conv_elements + x.ssm_elements for x in s), len(s)))


_BF16 = parse_dtype("bf16")


# ---------------------------------------------------------------------------------------------
# KV-cache groups and the block pool (vLLM v1)


@dataclass(frozen=True)
class KVGroup:
    """One KV-cache group: up to ``group_size`` layers of one kind that share block ids.

    ``num_layers`` real layers; the group is padded to the pool's ``group_size``.
    """

    cache: LayerCache
    num_layers: int


@dataclass(frozen=True)
class PoolLayout:
    """How one GPU's KV pool is laid out.

    ``page_bytes``: one block of one layer. ``group_size``: layers per group (padded).
    ``block_bytes`` = ``group_size x page_bytes``: what one block id costs.
    ``padding_layers``: layer slots added to fill the last group of each kind (wasted pages).
    """

    block_size: int
    page_bytes: int
    group_size: int
    groups: tuple[KVGroup, ...]
    kv_dtype: DType
    model_dtype: DType

    @property
    def block_bytes(self) -> int:
        return self.group_size * self.page_bytes

    @property
    def num_layers(self) -> int:
        return sum(g.num_layers for g in self.groups)

    @property
    def padding_layers(self) -> int:
        return len(self.groups) * self.group_size - self.num_layers


def group_size_for(counts: list[int], ratio: float = 1.5) -> int:
    """vLLM's group size: the smallest kind's layer count, or the largest's if below ``ratio`` x smallest."""
    smallest, largest = min(counts), max(counts)
    return largest if largest < smallest * ratio else smallest


def pool_layout(layers: tuple[LayerCache, ...], block_size: int, kv_dtype: DType, model_dtype: DType) -> PoolLayout:
    """Bucket one GPU's layers into vLLM KV-cache groups sharing one block pool.

    A uniform model is one group of all its layers. Mixed kinds (full + sliding, attention + state)
    are split into groups of ``group_size`` layers; each kind's last group is padded.
    Raises :class:`InputError` when the page sizes of the kinds differ (vLLM cannot pool them either).
    """
    if block_size < 1:
        raise InputError(f"invalid --block-size {block_size}: must be at least 1")
    cached = [layer for layer in layers if layer.kind is not LayerKind.NONE]
    if not cached:
        raise InputError("the model caches nothing on this GPU (no attention or state layers)")
    counts = Counter(cached)
    kinds = list(dict.fromkeys(cached))
    pages = {layer: layer_page_bytes(layer, block_size, kv_dtype, model_dtype) for layer in kinds}
    if len(set(pages.values())) > 1:
        sizes = ", ".join(f"{k.describe()}: {p:,} B" for k, p in pages.items())
        raise InputError(f"layer kinds have different page sizes ({sizes})", "kvplan pools only equal page sizes, as vLLM does")
    if len(kinds) == 1:
        return PoolLayout(block_size, pages[kinds[0]], counts[kinds[0]], (KVGroup(kinds[0], counts[kinds[0]]),), kv_dtype, model_dtype)
    size = group_size_for([counts[k] for k in kinds])
    groups: list[KVGroup] = []
    for kind in kinds:
        n = counts[kind]
        num_groups = cdiv(n, size)
        # vLLM slices layers[i::num_groups]: the groups differ by at most one layer
        for i in range(num_groups):
            groups.append(KVGroup(kind, len(range(i, n, num_groups))))
    return PoolLayout(block_size, pages[kinds[0]], size, tuple(groups), kv_dtype, model_dtype)


def num_blocks(kv_budget_bytes: int, layout: PoolLayout) -> int:
    """Block ids that fit in ``kv_budget_bytes``: ``budget // (group_size x page)`` (0 when negative)."""
    return max(0, kv_budget_bytes // layout.block_bytes)


def pool_bytes(blocks: int, layout: PoolLayout) -> int:
    """Bytes the pool of ``blocks`` block ids occupies (what the torch pool must allocate)."""
    return blocks * layout.block_bytes


def group_blocks_per_request(group: KVGroup, tokens: int, block_size: int, max_num_batched_tokens: int,
                             prefix_caching: bool = False) -> int:
    """Blocks one request of ``tokens`` tokens needs in one group (vLLM's max_memory_usage_bytes / page).

    full / MLA: ``ceil(L / bs)``; sliding(W): ``ceil(min(W - 1 + max_num_batched_tokens, L) / bs) + 1``;
    chunked(C): ``ceil(min(C + max_num_batched_tokens, L) / bs)``; state: 1 block
    (with prefix caching: 3 for mamba2, 2 for gated delta net).
    """
    cache = group.cache
    if cache.kind in (LayerKind.FULL, LayerKind.MLA):
        return cdiv(tokens, block_size)
    if cache.kind is LayerKind.SLIDING:
        assert cache.window_tokens
        return cdiv(min(cache.window_tokens - 1 + max_num_batched_tokens, tokens), block_size) + 1
    if cache.kind is LayerKind.CHUNKED:
        assert cache.window_tokens
        return cdiv(min(cache.window_tokens + max_num_batched_tokens, tokens), block_size)
    if cache.is_state:
        if not prefix_caching:
            return 1
        return 2 if cache.kind is LayerKind.LINEAR else 3
    return 0


def blocks_per_request(layout: PoolLayout, tokens: int, max_num_batched_tokens: int,
                       prefix_caching: bool = False) -> int:
    """Block ids one request at ``tokens`` tokens needs, summed over the pool's groups."""
    return sum(group_blocks_per_request(g, tokens, layout.block_size, max_num_batched_tokens, prefix_caching) for g in layout.groups)


def request_kv_bytes(layout: PoolLayout, tokens: int, max_num_batched_tokens: int) -> int:
    """Pool bytes one request at ``tokens`` tokens holds (paged, including window and padding slack)."""
    return blocks_per_request(layout, tokens, max_num_batched_tokens) * layout.block_bytes


def raw_request_bytes(layers: tuple[LayerCache, ...], tokens: int, kv_dtype: DType, model_dtype: DType) -> int:
    """Bytes one request at ``tokens`` tokens needs without paging (windows applied, no block slack)."""
    total = 0
    for layer in layers:
        held = min(tokens, layer.window_tokens) if layer.window_tokens else tokens
        total += held * layer_token_bytes(layer, kv_dtype) + layer_state_bytes(layer, model_dtype)
    return total


# ---------------------------------------------------------------------------------------------
# capacity


NULL_BLOCKS = 1  # vLLM keeps block 0 as the null block: it never holds a request's tokens


def vllm_max_concurrency(blocks: int, per_request_blocks: int) -> float:
    """What vLLM logs as "Maximum concurrency": ``num_blocks / blocks per request`` (a float)."""
    return blocks / per_request_blocks if per_request_blocks else math.inf


def max_requests(blocks: int, per_request_blocks: int) -> int:
    """Requests that fit at once: ``(num_blocks - 1 null block) // blocks per request``."""
    if per_request_blocks <= 0:
        return 0
    return max(0, blocks - NULL_BLOCKS) // per_request_blocks


def kv_cache_tokens(blocks: int, per_request_blocks: int, max_model_len: int) -> int:
    """vLLM's "GPU KV cache size: N tokens" = ``floor(max_concurrency x max_model_len)``."""
    if per_request_blocks <= 0:
        return 0
    return blocks * max_model_len // per_request_blocks


def fits_one_request(blocks: int, layout: PoolLayout, tokens: int, max_num_batched_tokens: int) -> bool:
    """vLLM starts only if ``num_blocks - 1`` blocks hold one request at ``tokens`` tokens."""
    return blocks - NULL_BLOCKS >= blocks_per_request(layout, tokens, max_num_batched_tokens)


UNBOUNDED_TOKENS = 1 << 40  # a context beyond any model's; returned when only windows are cached


def max_context(blocks: int, layout: PoolLayout, batch: int, max_num_batched_tokens: int,
                limit_tokens: int = UNBOUNDED_TOKENS) -> int:
    """Longest context (tokens) such that ``batch`` requests fit in ``num_blocks - 1`` blocks.

    Binary search over the non-decreasing blocks-per-request function; 0 when not even one token
    fits; ``limit_tokens`` when the pool is bounded only by windows/state (no full-attention layer).
    """
    if batch < 1:
        raise InputError(f"invalid batch {batch}: must be at least 1")
    usable = blocks - NULL_BLOCKS

    def ok(tokens: int) -> bool:
        return batch * blocks_per_request(layout, tokens, max_num_batched_tokens) <= usable

    if not ok(1):
        return 0
    if ok(limit_tokens):
        return limit_tokens
    lo, hi = 1, limit_tokens  # ok(lo), not ok(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


@dataclass(frozen=True)
class PrefixSharing:
    """What sharing a ``prefix_tokens``-token prefix across requests buys.

    ``shared_blocks``: full blocks of the prefix stored once (``floor(P / bs)`` per growing group).
    """

    prefix_tokens: int
    shared_blocks: int
    blocks_per_request_unshared: int
    blocks_per_request_shared: int
    max_requests_unshared: int
    max_requests_shared: int
    blocks_saved: int
    prefill_tokens_saved: int
    prefill_flops_saved: int


def prefix_sharing(blocks: int, layout: PoolLayout, tokens: int, prefix_tokens: int, max_num_batched_tokens: int,
                   parameters: int | None) -> PrefixSharing:
    """N requests of ``tokens`` tokens sharing a ``prefix_tokens`` prefix store its full blocks once.

    Only groups that keep every token (full attention, MLA) share; windowed groups keep their own.
    Prefill FLOPs saved ~ 2 x parameters per token not recomputed.
    """
    if prefix_tokens > tokens:
        raise InputError(f"--prefix-tokens {prefix_tokens:,} exceeds the context {tokens:,}")
    per_full = prefix_tokens // layout.block_size
    growing = sum(1 for g in layout.groups if g.cache.kind in (LayerKind.FULL, LayerKind.MLA))
    shared = per_full * growing
    per_req = blocks_per_request(layout, tokens, max_num_batched_tokens)
    per_req_shared = per_req - shared
    usable = max(0, blocks - NULL_BLOCKS)
    unshared_n = usable // per_req if per_req else 0
    if usable < shared + per_req_shared or per_req_shared <= 0:
        shared_n = unshared_n if per_req_shared > 0 else (1 if usable >= per_req else 0)
    else:
        shared_n = (usable - shared) // per_req_shared
    saved_tokens = max(0, shared_n - 1) * per_full * layout.block_size
    return PrefixSharing(
        prefix_tokens=prefix_tokens,
        shared_blocks=shared,
        blocks_per_request_unshared=per_req,
        blocks_per_request_shared=per_req_shared,
        max_requests_unshared=unshared_n,
        max_requests_shared=shared_n,
        blocks_saved=max(0, shared_n - 1) * shared,
        prefill_tokens_saved=saved_tokens,
        prefill_flops_saved=2 * (parameters or 0) * saved_tokens,
    )


@dataclass(frozen=True)
class Fragmentation:
    """Contiguous (reserve ``max_model_len`` per request) vs paged (blocks as used) at length ``tokens``.

    ``*_waste_bytes``: reserved but unused bytes per request (internal fragmentation).
    """

    tokens: int
    max_model_len: int
    contiguous_request_bytes: int
    paged_request_bytes: int
    raw_request_bytes: int
    contiguous_max_requests: int
    paged_max_requests: int
    contiguous_waste_bytes: int
    paged_waste_bytes: int


def contiguous_vs_paged(kv_budget_bytes: int, blocks: int, layout: PoolLayout, layers: tuple[LayerCache, ...],
                        tokens: int, max_model_len: int, max_num_batched_tokens: int) -> Fragmentation:
    """Compare a worst-case contiguous reservation of ``max_model_len`` per request with paging."""
    raw = raw_request_bytes(layers, tokens, layout.kv_dtype, layout.model_dtype)
    contiguous = raw_request_bytes(layers, max_model_len, layout.kv_dtype, layout.model_dtype)
    paged = request_kv_bytes(layout, tokens, max_num_batched_tokens)
    per_req = blocks_per_request(layout, tokens, max_num_batched_tokens)
    return Fragmentation(
        tokens=tokens,
        max_model_len=max_model_len,
        contiguous_request_bytes=contiguous,
        paged_request_bytes=paged,
        raw_request_bytes=raw,
        contiguous_max_requests=max(0, kv_budget_bytes) // contiguous if contiguous else 0,
        paged_max_requests=max_requests(blocks, per_req),
        contiguous_waste_bytes=contiguous - raw,
        paged_waste_bytes=paged - raw,
    )


# ---------------------------------------------------------------------------------------------
# weights and decode roofline


def weight_bytes(parameters: int, dtype: DType) -> int:
    """Bytes of ``parameters`` weights stored in ``dtype`` (int4: packed + fp16 scale per 128)."""
    return dtype.nbytes(parameters)


@dataclass(frozen=True)
class Roofline:
    """Decode-step lower bound from HBM bandwidth: each step reads the weights and every live KV once.

    ``step_seconds(b) = (weight_bytes + b x request_bytes) / bandwidth``; tokens/s = b / step.
    ``knee_batch``: where KV reads equal weight reads (past it, batch buys less and less).
    """

    bandwidth_bytes_per_s: int
    weight_bytes: int
    request_bytes: int
    batch: int
    step_seconds: float
    tokens_per_s: float
    knee_batch: float
    tokens_per_s_limit: float


def decode_roofline(weight_bytes_per_gpu: int, request_bytes: int, batch: int, bandwidth_bytes_per_s: int) -> Roofline:
    """The decode roofline at ``batch`` live requests of ``request_bytes`` KV each (per GPU)."""
    step = (weight_bytes_per_gpu + batch * request_bytes) / bandwidth_bytes_per_s
    return Roofline(
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        weight_bytes=weight_bytes_per_gpu,
        request_bytes=request_bytes,
        batch=batch,
        step_seconds=step,
        tokens_per_s=batch / step if step else math.inf,
        knee_batch=weight_bytes_per_gpu / request_bytes if request_bytes else math.inf,
        tokens_per_s_limit=bandwidth_bytes_per_s / request_bytes if request_bytes else math.inf,
    )


@lru_cache(maxsize=4096)
def _cached_layout(layers: tuple[LayerCache, ...], block_size: int, kv_dtype: DType, model_dtype: DType) -> PoolLayout:
    return pool_layout(layers, block_size, kv_dtype, model_dtype)


def cached_pool_layout(layers: tuple[LayerCache, ...], block_size: int, kv_dtype: DType, model_dtype: DType) -> PoolLayout:
    """:func:`pool_layout`, memoised (sweeps ask for the same layout many times)."""
    return _cached_layout(layers, block_size, kv_dtype, model_dtype)
