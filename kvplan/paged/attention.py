"""Attention over scattered blocks: write K/V through a block table, decode one token, compare.

What a paged-attention kernel does, in plain torch: a token at position ``p`` of a request lives in slot
``block_table[p // block_size] x block_size + p % block_size`` of the pool; a decode step gathers the
request's slots and attends over them. :func:`check_decode` runs that against attention over a contiguous
copy of the same K/V computed another way (explicit float32 softmax, per-head loop, a window mask instead
of a gather that skips dropped blocks), so both the gather and the head grouping are checked.

Cases: GQA / MHA / MQA (``kv_heads`` divides the query heads; grouped by ``repeat_interleave``), sliding
window (only the last ``window`` tokens are gathered; blocks the allocator dropped are never read), and
MLA-shaped caches (one latent per token is the key, its first ``value_dim`` elements the value).
"""

from __future__ import annotations

import math
from kvplan.frozen import frozen
from typing import Sequence

import torch
import torch.nn.functional as F

# float32 reference vs the cache's dtype: tolerances by compute dtype (torch.testing's defaults, loosened
# for the reduced-precision softmax over thousands of tokens)
_TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def compute_dtype(cache_dtype: torch.dtype) -> torch.dtype:
    """The dtype attention runs in for a cache of ``cache_dtype`` (1-byte caches are upcast to bfloat16)."""
    return cache_dtype if cache_dtype in _TOLERANCE else torch.bfloat16


def slot_mapping(block_table: Sequence[int], positions: Sequence[int] | range, block_size: int) -> torch.Tensor:
    """Pool slots of token ``positions``: ``block_table[p // bs] x bs + p % bs`` (a long tensor)."""
    return torch.tensor([block_table[p // block_size] * block_size + p % block_size for p in positions], dtype=torch.long)


def _flat(cache: torch.Tensor) -> torch.Tensor:
    """``[num_blocks, block_size, ...]`` -> ``[num_blocks x block_size, ...]`` (a view); 1-byte dtypes as uint8."""
    flat = cache.reshape(cache.shape[0] * cache.shape[1], *cache.shape[2:])
    return flat.view(torch.uint8) if flat.dtype.itemsize == 1 else flat


def write_slots(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """Store ``values`` ``[T, ...]`` into ``cache`` ``[num_blocks, block_size, ...]`` at ``slots`` (cast to the cache dtype).

    fp8 caches are written through a uint8 view (index_put is not defined for float8 on every build).
    """
    stored = values.to(cache.dtype)
    if stored.dtype.itemsize == 1:
        stored = stored.view(torch.uint8)
    _flat(cache)[slots.to(cache.device)] = stored.to(cache.device)


def gather_slots(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The entries of ``cache`` at ``slots``: ``[T, ...]`` in the cache dtype."""
    out = _flat(cache)[slots.to(cache.device)]
    return out.view(cache.dtype) if cache.dtype.itemsize == 1 else out


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: Sequence[int],
                 num_tokens: int, block_size: int, window: int | None = None, value_dim: int | None = None,
                 scale: float | None = None) -> torch.Tensor:
    """One decode step of the query ``q`` ``[q_heads, head_dim]`` at position ``num_tokens - 1``.

    Gathers the request's slots (only the last ``window`` positions when windowed), upcasts 1-byte caches,
    groups query heads over KV heads with ``repeat_interleave`` and calls SDPA. MLA-shaped caches are
    ``[num_blocks, block_size, latent]``: pass the same tensor as ``k_cache`` and ``v_cache`` and
    ``value_dim`` (the value is the latent's first ``value_dim`` elements). Returns ``[q_heads, value_dim]``.
    """
    start = max(0, num_tokens - window) if window else 0
    slots = slot_mapping(block_table, range(start, num_tokens), block_size)
    dtype = compute_dtype(k_cache.dtype)
    k = gather_slots(k_cache, slots).to(dtype)
    v = gather_slots(v_cache, slots).to(dtype)
    if k.dim() == 2:  # MLA latent [T, latent]: one shared head
        k, v = k.unsqueeze(1), v.unsqueeze(1)
    if value_dim is not None:
        v = v[..., :value_dim]
    q_heads, kv_heads = q.shape[0], k.shape[1]
    k = k.transpose(0, 1).repeat_interleave(q_heads // kv_heads, dim=0)  # [q_heads, T, d]
    v = v.transpose(0, 1).repeat_interleave(q_heads // kv_heads, dim=0)
    out = F.scaled_dot_product_attention(q.to(dtype).unsqueeze(1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), scale=scale)
    return out[0, :, 0, :]


def contiguous_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None,
                      scale: float | None = None) -> torch.Tensor:
    """The reference: attention of ``q`` ``[q_heads, d]`` over contiguous ``k`` ``[T, kv_heads, d]`` and
    ``v`` ``[T, kv_heads, dv]`` in float32 with an explicit softmax; query head ``h`` reads KV head
    ``h x kv_heads // q_heads`` (an index, not repeat_interleave); positions outside the window masked."""
    num_tokens, kv_heads = k.shape[0], k.shape[1]
    q_heads = q.shape[0]
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    kv_index = torch.arange(q_heads, device=k.device) * kv_heads // q_heads
    k32, v32 = k.float()[:, kv_index], v.float()[:, kv_index]  # [T, q_heads, d]
    scores = torch.einsum("thd,hd->ht", k32, q.float()) * scale
    if window:
        scores[:, : max(0, num_tokens - window)] = float("-inf")
    return torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), v32)


@frozen
class AttentionCheck:
    """Paged vs contiguous decode for one request: the largest absolute difference and the tolerance used."""

    case: str
    num_tokens: int
    q_heads: int
    kv_heads: int
    head_dim: int
    window: int | None
    cache_dtype: str
    max_abs_error: float
    atol: float
    rtol: float
    ok: bool
    request: int = 0  # which filled request (1-based: 1 the first, the last filled), 0: not from a fill


def check_decode(case: str, k_cache: torch.Tensor, v_cache: torch.Tensor | None, block_table: Sequence[int],
                 num_tokens: int, block_size: int, q_heads: int, window: int | None = None,
                 value_dim: int | None = None, generator: torch.Generator | None = None,
                 null_block: int | None = None) -> AttentionCheck:
    """Write random K/V for one request through ``block_table``, decode its last token both ways, compare.

    ``v_cache`` None: an MLA-shaped cache (the latent is K; V is its first ``value_dim`` elements).
    Positions in ``null_block`` (blocks a sliding window dropped) are not written; the window hides them.
    """
    device = k_cache.device
    mla = v_cache is None
    tail = k_cache.shape[2:]  # [kv_heads, head_dim] or [latent]
    gen = generator or torch.Generator(device="cpu").manual_seed(0)
    dtype = compute_dtype(k_cache.dtype)

    def rand(*shape: int) -> torch.Tensor:  # drawn where the generator lives (CPU or the GPU itself)
        return torch.randn(*shape, generator=gen, device=gen.device).to(device)

    k = rand(num_tokens, *tail).to(k_cache.dtype)
    v = k if mla else rand(num_tokens, *v_cache.shape[2:]).to(v_cache.dtype)
    bs = block_size
    live = [p for p in range(num_tokens) if null_block is None or block_table[p // bs] != null_block]
    slots = slot_mapping(block_table, live, bs)
    index = torch.tensor(live, dtype=torch.long, device=device)
    write_slots(k_cache, slots, k[index])
    if not mla:
        write_slots(v_cache, slots, v[index])
    q = rand(q_heads, tail[-1])
    paged = paged_decode(q, k_cache, k_cache if mla else v_cache, block_table, num_tokens, bs, window, value_dim)
    k_ref = k.to(dtype)
    v_ref = v.to(dtype)
    if mla:
        k_ref = k_ref.unsqueeze(1)
        v_ref = v_ref.unsqueeze(1)[..., :value_dim] if value_dim else v_ref.unsqueeze(1)
    ref = contiguous_decode(q.to(dtype), k_ref, v_ref, window)
    atol, rtol = _TOLERANCE[dtype]
    err = float((paged.float() - ref).abs().max())
    ok = bool(torch.allclose(paged.float(), ref, atol=atol, rtol=rtol))
    kv_heads = 1 if mla else k_cache.shape[2]
    return AttentionCheck(case, num_tokens, q_heads, kv_heads, tail[-1], window, str(k_cache.dtype).removeprefix("torch."),
                          err, atol, rtol, ok)
