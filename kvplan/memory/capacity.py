"""What requests hold in a pool and how many fit: :class:`Demand` (one request's blocks per group under an
engine's rules), concurrency, the longest context, prefix sharing, paged vs contiguous, the decode roofline.
Pure functions over exact integers of bytes; :mod:`kvplan.memory` re-exports them.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kvplan.errors import InputError
from kvplan.model.spec import LayerCache, LayerKind, ModelSpec
from kvplan.units import DType, cdiv

from kvplan.memory.layout import KVGroup, PoolLayout, layer_state_bytes, layer_token_bytes
from kvplan.frozen import frozen

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


@frozen
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
        """Block ids one request of ``tokens`` tokens holds, summed over the pool's groups. In a split sliding-window
        pool (``layout.swa_ratio``, SGLang's hybrid SWA pool) the full pool's pages it holds or, where its window
        binds first, the sliding pool's over the ratio: ``max(full, ceil(sliding / ratio))``, so ``batch`` requests
        fit when both pools hold them."""
        if self.layout.swa_ratio:
            full = sum(self.group_blocks(g, tokens) for g in self.layout.groups if g.cache.kind is not LayerKind.SLIDING)
            swa = sum(self.group_blocks(g, tokens) for g in self.layout.groups if g.cache.kind is LayerKind.SLIDING)
            return max(full, math.ceil(swa / self.layout.swa_ratio))
        return sum(self.group_blocks(g, tokens) for g in self.layout.groups)

    def bytes(self, tokens: int) -> int:
        """Pool bytes one request of ``tokens`` tokens holds (paged: window, padding and state slack included)."""
        return self.blocks(tokens) * self.layout.block_bytes

    def reserved_blocks(self, max_model_len: int) -> int:
        """Block ids one request holds when it reserves ``max_model_len`` tokens up front (a contiguous
        reservation): every token-caching group (full, MLA, sliding, chunked) sized for all ``max_model_len``
        tokens, no window applied, and never less than the engine itself holds there; state and
        cross-attention groups what the engine keeps (with prefix caching, the state checkpoints too).
        At least :meth:`blocks` of any length up to ``max_model_len``."""
        total = 0
        for group in self.layout.groups:
            held = self.group_blocks(group, max_model_len)
            if group.cache.kind in (LayerKind.FULL, LayerKind.MLA, LayerKind.SLIDING, LayerKind.CHUNKED):
                held = max(held, cdiv(max_model_len, group.block_size or self.layout.block_size))
            total += held
        return total

    def state_blocks(self, group: KVGroup) -> int:
        """Blocks a request holds in a state group, whatever its length (0 for attention groups)."""
        return self.group_blocks(group, 1) if group.cache.is_state else 0

    def fixed_blocks(self, group: KVGroup) -> int:
        """Blocks a request holds whatever its length: state groups and cross-attention groups (the
        encoder tokens); 0 for groups that grow with the request."""
        fixed = group.cache.is_state or group.cache.kind is LayerKind.CROSS
        return self.group_blocks(group, 1) if fixed else 0

    def shared_blocks(self, tokens: int, prefix_tokens: int) -> int:
        """Block ids of a ``prefix_tokens``-token prefix that requests of ``tokens`` tokens store once (prefix
        caching): the prefix's full blocks in each group that keeps every token (full attention, MLA;
        windowed, cross-attention and state groups keep their own). At most ``tokens - 1`` tokens of it: the
        engine recomputes a prompt's last token (vLLM caps a cache hit at the prompt less one token), so each
        request holds at least one block of its own in such a group."""
        shared_tokens = max(0, min(prefix_tokens, tokens - 1))
        if not shared_tokens:
            return 0
        return sum(shared_tokens // (g.block_size or self.layout.block_size) for g in self.layout.groups
                   if g.cache.kind in (LayerKind.FULL, LayerKind.MLA))

    def batch_blocks(self, batch: int, tokens: int, prefix_tokens: int = 0) -> int:
        """Block ids ``batch`` requests of ``tokens`` tokens hold at once, a prefix of ``prefix_tokens`` tokens
        that they all share stored once (0: nothing shared): ``batch x blocks - (batch - 1) x shared``.

        The one rule for a shared prefix in the pool: the answer's requests, fits, margin and max context
        (:class:`kvplan.planning.answer.Deployment`), prefix sharing and paging all count with it. Non-decreasing
        in ``tokens`` (a request shorter than the prefix shares its first ``tokens - 1`` tokens)."""
        if batch <= 0:
            return 0
        per_request = self.blocks(tokens)
        if batch == 1 or not prefix_tokens:
            return batch * per_request
        return batch * per_request - (batch - 1) * self.shared_blocks(tokens, prefix_tokens)

    def with_layout(self, layout: PoolLayout) -> "Demand":
        """The same engine rules over another layout (another pipeline stage's pool)."""
        return replace(self, layout=layout)


def raw_request_bytes(layers: tuple[LayerCache, ...], tokens: int, kv_dtype: DType, model_dtype: DType, *,
                      windows: bool = True) -> int:
    """Bytes one request at ``tokens`` tokens needs without paging (no block slack); sliding and chunked
    layers hold at most their window unless ``windows`` is False (a contiguous reservation that sizes every
    layer for all ``tokens``)."""
    total = 0
    for layer in layers:
        held = min(tokens, layer.window_tokens) if layer.window_tokens and windows else tokens
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


def max_sharing_requests(blocks: int, demand: Demand, tokens: int, prefix_tokens: int = 0) -> int:
    """Requests of ``tokens`` tokens that fit at once when they share a ``prefix_tokens``-token prefix: the
    largest n with :meth:`Demand.batch_blocks` ``(n) <= num_blocks - 1 null block`` (no prefix:
    :func:`max_requests`). The first request holds the shared blocks, each other only its own."""
    per_request = demand.blocks(tokens)
    usable = max(0, blocks - NULL_BLOCKS)
    if per_request <= 0 or usable < per_request:
        return 0
    own = per_request - demand.shared_blocks(tokens, prefix_tokens)
    return 1 + (usable - per_request) // own


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
                null_blocks: int = NULL_BLOCKS, prefix_tokens: int = 0) -> int:
    """Longest context (tokens, at most ``limit_tokens``) such that ``batch`` requests fit in
    ``num_blocks - null_blocks`` blocks, sharing a ``prefix_tokens``-token prefix (0: none).

    Binary search over the non-decreasing :meth:`Demand.batch_blocks`; 0 when not even one token fits;
    ``limit_tokens`` when everything up to it fits (always, when only windows and state are cached).
    Below the limit the result is block-aligned by construction (demand steps at block boundaries).
    """
    if batch < 1:
        raise InputError(f"invalid batch {batch}: must be at least 1")
    usable = blocks - null_blocks

    def ok(tokens: int) -> bool:
        return demand.batch_blocks(batch, tokens, prefix_tokens) <= usable

    if not ok(1):
        return 0
    if ok(limit_tokens):
        return limit_tokens
    lo, hi = 1, limit_tokens  # ok(lo), not ok(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


@frozen
class PrefixSharing:
    """What sharing a ``prefix_tokens``-token prefix across requests buys.

    ``shared_blocks``: block ids of the prefix stored once (:meth:`Demand.shared_blocks`: its full blocks in
    each group that keeps every token). ``credited``: whether the plan's answer counts with it (the engine
    runs with prefix caching); without prefix caching each request stores its own copy, and the ``shared``
    figures say what turning it on would give.
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
    credited: bool = True


def prefix_sharing(blocks: int, demand: Demand, tokens: int, prefix_tokens: int,
                   parameters: int | None, request_cap: int | None = None, credited: bool = True) -> PrefixSharing:
    """N requests of ``tokens`` tokens sharing a ``prefix_tokens`` prefix store its full blocks once
    (:func:`max_sharing_requests`, the same rule the answer counts with when ``credited``).

    Only groups that keep every token (full attention, MLA) share; windowed groups keep their own.
    Prefill FLOPs saved ~ 2 x ``parameters`` per token not recomputed (pass the parameters one token
    computes with: a MoE's active ones, :meth:`ModelSpec.parameters_read`). ``request_cap``: the most
    requests the engine runs at once whatever the pool (its ``max_num_seqs``; 0 when it does not start).
    """
    if prefix_tokens > tokens:
        raise InputError(f"--prefix-tokens {prefix_tokens} exceeds --context {tokens}")
    shared = demand.shared_blocks(tokens, prefix_tokens)
    per_req = demand.blocks(tokens)
    unshared_n = max_requests(blocks, per_req)
    shared_n = max_sharing_requests(blocks, demand, tokens, prefix_tokens)
    if request_cap is not None:
        unshared_n, shared_n = min(unshared_n, request_cap), min(shared_n, request_cap)
    bs = demand.layout.block_size  # a prefix hit is whole blocks: the tokens of a partial block are recomputed
    saved_tokens = max(0, shared_n - 1) * (max(0, min(prefix_tokens, tokens - 1)) // bs * bs) if shared else 0
    return PrefixSharing(
        prefix_tokens=prefix_tokens,
        shared_blocks=shared,
        blocks_per_request_unshared=per_req,
        blocks_per_request_shared=per_req - shared,
        max_requests_unshared=unshared_n,
        max_requests_shared=shared_n,
        blocks_saved=max(0, shared_n - 1) * shared,
        prefill_tokens_saved=saved_tokens,
        prefill_flops_saved=2 * (parameters or 0) * saved_tokens,
        credited=credited,
    )


@frozen
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


def contiguous_vs_paged(blocks: int, demand: Demand, layers: tuple[LayerCache, ...], tokens: int,
                        max_model_len: int, request_cap: int | None = None, prefix_tokens: int = 0) -> Fragmentation:
    """Compare a worst-case contiguous reservation of ``max_model_len`` per request with paging, in the same
    pool of ``blocks`` blocks under the same per-request rules (:class:`Demand`).

    The paged side is the engine's own demand (the answer's ``max_requests``: ``request_cap`` is the most
    requests the engine runs at once whatever the memory, 0 when it does not start); the contiguous side
    reserves :meth:`Demand.reserved_blocks` up front: ``max_model_len`` tokens in every layer that caches
    tokens (a sliding or chunked layer too: a contiguous reservation is sized before the request runs, not
    by its window) and the state and image blocks the engine keeps. So for ``tokens <= max_model_len`` the
    contiguous side never fits more requests than paging. The waste of each side is measured against the
    raw bytes at ``tokens`` (windows applied, no block slack). ``prefix_tokens``: a prefix the paged requests
    share (the engine's prefix caching, which needs paging: a contiguous reservation shares nothing).
    """
    layout = demand.layout
    raw = raw_request_bytes(layers, tokens, layout.kv_dtype, layout.model_dtype)
    reserved = demand.reserved_blocks(max_model_len)
    contiguous = reserved * layout.block_bytes
    per_req = demand.blocks(tokens)
    paged = per_req * layout.block_bytes
    cap = UNBOUNDED_TOKENS if request_cap is None else request_cap
    paged_n = max_sharing_requests(blocks, demand, tokens, prefix_tokens)
    return Fragmentation(
        tokens=tokens,
        max_model_len=max_model_len,
        contiguous_request_bytes=contiguous,
        paged_request_bytes=paged,
        raw_request_bytes=raw,
        contiguous_max_requests=min(max_requests(blocks, reserved), cap),
        paged_max_requests=min(paged_n, cap),
        contiguous_waste_bytes=contiguous - raw,
        paged_waste_bytes=paged - raw,
    )


# ---------------------------------------------------------------------------------------------
# weights and decode roofline


def weight_bytes(parameters: int, dtype: DType) -> int:
    """Bytes of ``parameters`` weights stored in ``dtype`` (int4: packed + fp16 scale per 128)."""
    return dtype.nbytes(parameters)


@frozen
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


def step_weight_bytes(weight_bytes_per_gpu: int, spec: ModelSpec, batch: int) -> int:
    """Weight bytes one decode step over ``batch`` requests reads (per GPU): all of them for a dense model;
    for a MoE, the share of parameters the batch's tokens route through (:meth:`ModelSpec.parameters_read`),
    so a step of one DeepSeek-V3 request reads its active experts, not all 671B parameters."""
    read, total = spec.parameters_read(batch), spec.parameters
    if not read or not total or read >= total:
        return weight_bytes_per_gpu
    return math.ceil(weight_bytes_per_gpu * read / total)


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
