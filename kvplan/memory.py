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
    """Bytes one token of context costs across ``layers`` if every layer kept it (no window applied;
    cross-attention layers cache encoder tokens, a fixed amount per request: :func:`cross_bytes_per_request`)."""
    if isinstance(layers, ModelSpec):
        layers = layers.layers
    return sum(layer_token_bytes(layer, kv_dtype) for layer in layers if layer.grows_with_context)


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
    """One tensor-parallel rank's share of a layer's cache.

    Attention: ``max(1, kv_heads // tp)`` heads; MLA latents are replicated; state layers as vLLM's
    ``MambaStateShapeCalculator`` (Mamba2 groups replicated up to tp when tp does not divide them).
    """
    if tp == 1 or not layer.tp_shardable or layer.kind is LayerKind.NONE:
        return layer
    if layer.is_state:
        if layer.state_dims:
            from kvplan.hybrid import state_elements

            conv, ssm = state_elements(layer.state_kind, layer.state_dims, tp)
            return replace(layer, conv_elements=conv, ssm_elements=ssm)
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

    ``num_layers`` real layers; the group is padded to the pool's ``group_size``. ``block_size``: tokens
    per block of this group when it differs from the pool's (0 = the pool's ``block_size``).
    ``page_bytes``: one block of one layer of this group, summed over its layers when they differ
    (vLLM's UniformTypeKVCacheSpecs: one group of full-attention layers with different KV heads).
    """

    cache: LayerCache
    num_layers: int
    block_size: int = 0
    page_bytes: int = 0


@dataclass(frozen=True)
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
    max_page = max(pages.values())
    block_sizes: dict[LayerCache, int] = {}
    for kind in kinds:  # vLLM's unify_kv_cache_spec_page_size
        if pages[kind] == max_page or kind.is_state:
            block_sizes[kind] = 0
        elif max_page % pages[kind] == 0:
            block_sizes[kind] = block_size * (max_page // pages[kind])
        else:
            block_sizes[kind] = 0  # padded up to the largest page
    size = group_size_for([counts[k] for k in kinds])
    groups: list[KVGroup] = []
    for kind in kinds:
        n = counts[kind]
        num_groups = cdiv(n, size)
        # vLLM slices layers[i::num_groups]: the groups differ by at most one layer
        for i in range(num_groups):
            groups.append(KVGroup(kind, len(range(i, n, num_groups)), block_sizes[kind]))
    return PoolLayout(block_size, max_page, size, tuple(groups), kv_dtype, model_dtype, **extra)


def _uniform_type(kinds: list[LayerCache]) -> bool:
    """All layers need the same token slots: all full/MLA, or all sliding (one window), or all chunked."""
    first = kinds[0]
    if first.kind in (LayerKind.FULL, LayerKind.MLA):
        return all(k.kind is first.kind for k in kinds)
    return all(k.kind is first.kind and k.window_tokens == first.window_tokens for k in kinds)


def num_blocks(kv_budget_bytes: int, layout: PoolLayout) -> int:
    """Block ids that fit in ``kv_budget_bytes``: ``budget // (group_size x page)`` (0 when negative)."""
    return max(0, kv_budget_bytes // layout.block_bytes)


def pool_bytes(blocks: int, layout: PoolLayout) -> int:
    """Bytes the pool of ``blocks`` block ids occupies (what the torch pool must allocate)."""
    return blocks * layout.block_bytes


def group_blocks_per_request(group: KVGroup, tokens: int, block_size: int, inflight_tokens: int,
                             prefix_caching: bool = False) -> int:
    """Blocks one request of ``tokens`` tokens needs in one group (vLLM's max_memory_usage_bytes / page).

    full / MLA: ``ceil(L / bs)``; sliding(W): ``ceil(min(W - 1 + T, L) / bs) + 1``; cross-attention(E
    encoder tokens): ``ceil(E / bs)`` whatever L;
    chunked(C): ``ceil(min(C + T, L) / bs)`` where T = ``inflight_tokens`` is the tokens scheduled but
    not yet computed (vLLM: max_num_batched_tokens x concurrent batches; 2 x with async scheduling on
    GPUs, 1 x on CPU); state: 1 block, or with prefix caching (vLLM's mamba "align" mode) 2 + prefill
    checkpoint blocks: 3 for Mamba2, 2 for Mamba1 and gated delta net.
    Callers go through :class:`Demand`, which fixes T and the prefix-caching flag once per plan.
    """
    cache = group.cache
    bs = group.block_size or block_size
    if cache.kind in (LayerKind.FULL, LayerKind.MLA):
        return cdiv(tokens, bs)
    if cache.kind is LayerKind.SLIDING:
        assert cache.window_tokens
        return cdiv(min(cache.window_tokens - 1 + inflight_tokens, tokens), bs) + 1
    if cache.kind is LayerKind.CHUNKED:
        assert cache.window_tokens
        return cdiv(min(cache.window_tokens + inflight_tokens, tokens), bs)
    if cache.kind is LayerKind.CROSS:  # vLLM's CrossAttentionSpec: ceil(encoder tokens / bs), any length
        return cdiv(cache.window_tokens or 0, bs)
    if cache.is_state:
        if not prefix_caching:
            return 1
        return 3 if cache.state_kind == "mamba2" else 2
    return 0


@dataclass(frozen=True)
class Demand:
    """What one request holds in each group of ``layout`` under one engine's rules (built once per plan).

    ``inflight_tokens``: tokens scheduled but not yet computed, which sliding and chunked groups hold
    on top of their window (the engine's ``inflight_tokens`` rule). ``prefix_caching``: whether the
    engine runs with prefix caching, which makes state groups keep checkpoint blocks. Every consumer
    (the answer, max context, the engine's start-up check, paging, prefix sharing, the roofline,
    reports, simulate, validate) asks this one object, so they all count the same blocks.
    """

    layout: PoolLayout
    inflight_tokens: int
    prefix_caching: bool = False

    def group_blocks(self, group: KVGroup, tokens: int) -> int:
        """Blocks a request of ``tokens`` tokens holds in ``group`` (see :func:`group_blocks_per_request`)."""
        return group_blocks_per_request(group, tokens, self.layout.block_size, self.inflight_tokens,
                                        self.prefix_caching)

    def blocks(self, tokens: int) -> int:
        """Block ids one request of ``tokens`` tokens holds, summed over the pool's groups."""
        return sum(self.group_blocks(g, tokens) for g in self.layout.groups)

    def bytes(self, tokens: int) -> int:
        """Pool bytes one request of ``tokens`` tokens holds (paged: window, padding and state slack included)."""
        return self.blocks(tokens) * self.layout.block_bytes

    def state_blocks(self, group: KVGroup) -> int:
        """Blocks a request holds in a state group, whatever its length (0 for attention groups)."""
        return self.group_blocks(group, 1) if group.cache.is_state else 0

    def fixed_blocks(self, group: KVGroup) -> int:
        """Blocks a request holds whatever its length: state groups and cross-attention groups (the
        encoder tokens); 0 for groups that grow with the request."""
        fixed = group.cache.is_state or group.cache.kind is LayerKind.CROSS
        return self.group_blocks(group, 1) if fixed else 0

    def with_layout(self, layout: PoolLayout) -> "Demand":
        """The same engine rules over another layout (another pipeline stage's pool)."""
        return replace(self, layout=layout)


def raw_request_bytes(layers: tuple[LayerCache, ...], tokens: int, kv_dtype: DType, model_dtype: DType) -> int:
    """Bytes one request at ``tokens`` tokens needs without paging (windows applied, no block slack)."""
    total = 0
    for layer in layers:
        held = min(tokens, layer.window_tokens) if layer.window_tokens else tokens
        if layer.kind is LayerKind.CROSS:
            held = layer.window_tokens or 0
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
    """vLLM's "GPU KV cache size: N tokens" = ``int(max_concurrency x max_model_len)``.

    Computed in floating point exactly as vLLM does (``int(num_blocks / per_request * L)``), so the
    last digit agrees even where the float product falls just below an integer.
    """
    if per_request_blocks <= 0:
        return 0
    return int(blocks / per_request_blocks * max_model_len)


def grouped_kv_tokens(blocks: int, num_groups: int, block_size: int) -> int:
    """vLLM 0.9.1 - 0.20.0's "GPU KV cache size": ``num_blocks // num_groups x block_size`` (tokens).

    Every group is assumed to get an equal share of the block ids, whatever its need per request:
    Gemma-3-27B (52 sliding + 10 full layers in 7 groups) with 15,999 blocks prints
    15,999 // 7 x 16 = 36,560. A single-group model prints ``num_blocks x block_size``.
    """
    return blocks // max(1, num_groups) * block_size



UNBOUNDED_TOKENS = 1 << 40  # a context beyond any model's; returned when only windows are cached


def max_context(blocks: int, demand: Demand, batch: int, limit_tokens: int = UNBOUNDED_TOKENS,
                null_blocks: int = NULL_BLOCKS) -> int:
    """Longest context (tokens, at most ``limit_tokens``) such that ``batch`` requests fit in
    ``num_blocks - null_blocks`` blocks.

    Binary search over the non-decreasing ``demand.blocks``; 0 when not even one token fits;
    ``limit_tokens`` when everything up to it fits (always, when only windows and state are cached).
    Below the limit the result is block-aligned by construction (demand steps at block boundaries).
    """
    if batch < 1:
        raise InputError(f"invalid batch {batch}: must be at least 1")
    usable = blocks - null_blocks

    def ok(tokens: int) -> bool:
        return batch * demand.blocks(tokens) <= usable

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


def prefix_sharing(blocks: int, demand: Demand, tokens: int, prefix_tokens: int,
                   parameters: int | None) -> PrefixSharing:
    """N requests of ``tokens`` tokens sharing a ``prefix_tokens`` prefix store its full blocks once.

    Only groups that keep every token (full attention, MLA) share; windowed groups keep their own.
    Prefill FLOPs saved ~ 2 x parameters per token not recomputed.
    """
    if prefix_tokens > tokens:
        raise InputError(f"--prefix-tokens {prefix_tokens:,} exceeds the context {tokens:,}")
    layout = demand.layout
    per_full = prefix_tokens // layout.block_size
    growing = sum(1 for g in layout.groups if g.cache.kind in (LayerKind.FULL, LayerKind.MLA))
    shared = per_full * growing
    per_req = demand.blocks(tokens)
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


def contiguous_vs_paged(kv_budget_bytes: int, blocks: int, demand: Demand, layers: tuple[LayerCache, ...],
                        tokens: int, max_model_len: int) -> Fragmentation:
    """Compare a worst-case contiguous reservation of ``max_model_len`` per request with paging.

    The paged side is the engine's own demand (the answer's ``max_requests``); the contiguous side
    reserves the raw bytes of ``max_model_len`` tokens (windows applied) plus one unpadded state.
    """
    layout = demand.layout
    raw = raw_request_bytes(layers, tokens, layout.kv_dtype, layout.model_dtype)
    contiguous = raw_request_bytes(layers, max_model_len, layout.kv_dtype, layout.model_dtype)
    per_req = demand.blocks(tokens)
    paged = per_req * layout.block_bytes
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
