"""The torch block pool: one GPU's KV cache as real tensors, laid out the way vLLM v1 lays it out.

A :class:`~kvplan.memory.PoolLayout` has ``group_size`` layer *slots*; layer ``i`` of every KV-cache group
shares slot ``i`` (vLLM's ``KVCacheTensor(shared_by=[...])``), so one block id backs one page in each of
the ``group_size`` slots. This module allocates one tensor per slot, shaped from the slot's first layer
(its *owner*), and gives every real layer a typed view into its slot:

* full / sliding / chunked: ``[2, num_blocks, block_size, kv_heads, head_dim]`` (K and V);
* MLA: ``[num_blocks, block_size, latent_dim]`` (one latent, no V);
* state (Mamba, linear attention): ``conv [num_blocks, conv_elements]`` in the model dtype and
  ``ssm [num_blocks, ssm_elements]`` in the SSM dtype;
* int4 KV: ``uint8`` data with two values a byte plus ``float16`` scales, one per 32 elements of head_dim;
* fp8 KV: ``torch.float8_e4m3fn`` / ``float8_e5m2`` where the build has them, else ``uint8`` storage.

The byte count is never computed here: the tensors come from their shapes and dtypes, and
:func:`allocate_pool` asserts that their storage equals :func:`kvplan.memory.pool_bytes` (the oracle).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from kvplan import memory
from kvplan.model.spec import LayerCache, LayerKind
from kvplan.units import DType, cdiv, parse_dtype
from kvplan.frozen import frozen

INT4_SCALE_GROUP = 32  # elements of head_dim per float16 scale (kvplan.units.INT4)


def torch_dtype(dtype: DType) -> torch.dtype:
    """The torch dtype that stores ``dtype`` (fp8 falls back to uint8 storage on old builds; int4 is packed uint8)."""
    if dtype.bits == 4:
        return torch.uint8
    name = dtype.torch_name or dtype.name
    return getattr(torch, name, torch.uint8)


@frozen
class Part:
    """One tensor of a layer's cache: its name, shape and dtype (e.g. ``kv`` ``[2, nb, bs, h, d]`` bf16)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def layer_parts(cache: LayerCache, num_blocks: int, block_size: int, kv_dtype: DType, model_dtype: DType) -> tuple[Part, ...]:
    """The tensors one layer's cache is made of, for a pool of ``num_blocks`` blocks (shapes, not bytes)."""
    if cache.is_state:
        ssm_dtype = parse_dtype(cache.ssm_dtype) if cache.ssm_dtype else model_dtype
        return (Part("conv", (num_blocks, cache.conv_elements), torch_dtype(model_dtype)),
                Part("ssm", (num_blocks, cache.ssm_elements), torch_dtype(ssm_dtype)))
    if cache.kind is LayerKind.MLA:
        lead: tuple[int, ...] = (num_blocks, block_size) + ((cache.kv_heads,) if cache.kv_heads > 1 else ())
        name = "latent"
    elif cache.caches_tokens:
        lead = (2, num_blocks, block_size, cache.kv_heads)
        name = "kv"
    else:
        return ()
    if kv_dtype.bits == 4:
        return (Part(name, lead + (cdiv(cache.head_dim, 2),), torch.uint8),
                Part(name + "_scales", lead + (cdiv(cache.head_dim, INT4_SCALE_GROUP),), torch.float16))
    if kv_dtype.bits not in (8, 16, 32):
        raise NotImplementedError(f"no torch storage for a {kv_dtype.bits}-bit KV cache ({kv_dtype.name})")
    return (Part(name, lead + (cache.head_dim,), torch_dtype(kv_dtype)),)


@dataclass
class LayerView:
    """One real layer's cache: which group and slot it sits in, and typed views into the slot's storage."""

    group: int
    slot: int
    cache: LayerCache
    block_size: int  # tokens per block of this layer's group
    tensors: dict[str, torch.Tensor]

    @property
    def k(self) -> torch.Tensor:
        """``[num_blocks, block_size, kv_heads, head_dim]`` keys (MLA: the latent)."""
        return self.tensors["kv"][0] if "kv" in self.tensors else self.tensors["latent"]

    @property
    def v(self) -> torch.Tensor:
        """``[num_blocks, block_size, kv_heads, head_dim]`` values (MLA: the latent; slice it yourself)."""
        return self.tensors["kv"][1] if "kv" in self.tensors else self.tensors["latent"]


@dataclass
class KVPool:
    """A block pool of ``num_blocks`` block ids on ``device``: ``slots`` hold the storage, ``layers`` view it."""

    layout: memory.PoolLayout
    num_blocks: int
    device: torch.device
    slots: list[torch.Tensor]
    layers: list[LayerView] = field(default_factory=list)

    @property
    def storage_bytes(self) -> int:
        """Bytes of the storages behind the pool, as torch counts them (``untyped_storage().nbytes()``)."""
        seen: dict[int, int] = {}
        for t in self.slots:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
        return sum(seen.values())

    def group_layers(self, group: int) -> list[LayerView]:
        return [view for view in self.layers if view.group == group]

    def release(self) -> None:
        """Drop every tensor reference (the caller then empties the CUDA cache)."""
        self.layers.clear()
        self.slots.clear()


Member = tuple[int, LayerCache, int]  # (group index, layer cache, tokens per block of its group)


def _slot_members(layout: memory.PoolLayout, layers: tuple[LayerCache, ...] | None) -> list[list[Member]]:
    """For each slot, the real layers sharing it: layer ``i`` of every group sits in slot ``i``.

    A layout whose one group mixes page sizes (``bytes_per_block``: full-attention layers with different
    KV heads, vLLM's UniformTypeKVCacheSpecs) has one tensor per layer; it needs the real ``layers``.
    """
    if layout.bytes_per_block:
        if layers is None:
            raise ValueError("a layout with per-layer page sizes needs its layers to build the pool")
        cached = [layer for layer in layers if layer.kind is not LayerKind.NONE]
        assert len(cached) == layout.num_layers, f"{len(cached)} layers for a layout of {layout.num_layers}"
        return [[(0, layer, layout.block_size)] for layer in cached]
    slots: list[list[Member]] = [[] for _ in range(layout.group_size)]
    for g, group in enumerate(layout.groups):
        for i in range(group.num_layers):
            slots[i].append((g, group.cache, layout.group_block_size(group)))
    return slots


def allocate_pool(layout: memory.PoolLayout, num_blocks: int, device: str | torch.device = "cpu",
                  zero: bool = True, check: bool = True, layers: tuple[LayerCache, ...] | None = None) -> KVPool:
    """Allocate the pool of ``num_blocks`` block ids for ``layout`` on ``device``.

    One tensor per slot, its shape and dtype taken from the slot's first layer; ``zero`` writes zeros so
    every page is touched (the OS then counts it in the resident set). Asserts that the storage bytes
    equal :func:`kvplan.memory.pool_bytes` (``check=False``: the caller compares and reports) and that every
    sharing layer's views fit the slot exactly. ``layers``: the GPU's layers, needed only when one group
    mixes page sizes. May raise ``torch.cuda.OutOfMemoryError`` / ``RuntimeError`` (out of memory);
    nothing stays allocated then.
    """
    device = torch.device(device)
    pool = KVPool(layout, num_blocks, device, [])
    try:
        for members in _slot_members(layout, layers):
            _, owner, owner_bs = members[0]
            parts = _owner_parts(owner, owner_bs, layout, num_blocks)
            nbytes = sum(p.nbytes for p in parts)
            buf = (torch.zeros if zero else torch.empty)(nbytes, dtype=torch.uint8, device=device)
            pool.slots.append(buf)
            for g, cache, bs in members:
                pool.layers.append(LayerView(g, len(pool.slots) - 1, cache, bs, _views(buf, cache, bs, layout, num_blocks)))
        storage = pool.storage_bytes
        expected = memory.pool_bytes(num_blocks, layout)
        assert not check or storage == expected, f"torch pool holds {storage:,} B but memory.pool_bytes says {expected:,} B"
        return pool
    except BaseException as exc:
        exc.kvplan_allocated_bytes = pool.storage_bytes  # type: ignore[attr-defined]  # how far it got
        pool.release()
        raise


def _owner_parts(owner: LayerCache, block_size: int, layout: memory.PoolLayout, num_blocks: int) -> tuple[Part, ...]:
    """The parts of a slot's owner; a state page smaller than the pool's page is padded up (hybrid pools
    raise the attention block size so one page holds a state; the padding is pool memory too)."""
    parts = layer_parts(owner, num_blocks, block_size, layout.kv_dtype, layout.model_dtype)
    if owner.is_state:
        one_block = sum(p.nbytes for p in layer_parts(owner, 1, block_size, layout.kv_dtype, layout.model_dtype))
        if layout.page_bytes > one_block:
            parts += (Part("pad", (num_blocks, layout.page_bytes - one_block), torch.uint8),)
    return parts


def _views(buf: torch.Tensor, cache: LayerCache, block_size: int, layout: memory.PoolLayout,
           num_blocks: int) -> dict[str, torch.Tensor]:
    """Typed views of ``cache``'s parts over the flat byte buffer ``buf`` (parts laid end to end)."""
    parts = layer_parts(cache, num_blocks, block_size, layout.kv_dtype, layout.model_dtype)
    total = sum(p.nbytes for p in parts)
    assert total <= buf.numel(), f"{cache.describe()} needs {total:,} B but its slot holds {buf.numel():,} B"
    if not cache.is_state:
        assert total == buf.numel(), f"{cache.describe()} needs {total:,} B but its slot holds {buf.numel():,} B"
    out, offset = {}, 0
    for p in parts:
        assert offset % p.dtype.itemsize == 0, f"{cache.describe()}: part {p.name} is not aligned to {p.dtype}"
        out[p.name] = buf[offset:offset + p.nbytes].view(p.dtype).view(p.shape)
        offset += p.nbytes
    return out


def used_blocks(pool: KVPool, group: int = 0) -> int:
    """Block ids of ``pool`` holding any non-zero byte in ``group``'s first layer: what has been written.

    Measured on the tensors themselves (the pool starts zeroed), independent of the allocator's counters.
    """
    view = pool.group_layers(group)[0]
    hits = torch.zeros(pool.num_blocks, dtype=torch.bool, device=pool.device)
    for name, t in view.tensors.items():
        if name == "pad":
            continue
        per_block = t.movedim(1, 0) if name.startswith("kv") else t  # [num_blocks, ...]
        raw = per_block.contiguous().view(torch.uint8).reshape(pool.num_blocks, -1)
        hits |= raw.ne(0).any(dim=1)
    return int(hits.sum())
