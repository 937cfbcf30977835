"""Plan -> plain, stable JSON-ready dicts (the ``--json`` schema, documented in docs/cli.md).

Bytes stay integers of bytes; every object carries the assumptions it was computed under.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any

from kvplan import memory
from kvplan.model.spec import LayerCache, LayerKind
from kvplan.options import context_source
from kvplan.planning.weights import served_weights
from kvplan.units import DType, parse_dtype, plural

SCHEMA_VERSION = 1
Plan = Any  # a kvplan.planning.plan.Plan (not imported: plan imports this module, never the other way)


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, enums, tuples and mappings -> plain JSON types (floats made finite)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _finite(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None


def formula_lines(layers: tuple[LayerCache, ...], kv_dtype: DType, model_dtype: DType) -> list[str]:
    """The per-token formula with its numbers, one line per kind of layer.

    ``2 x 32 layers x 8 kv_heads x 128 head_dim x 2 B = 131,072 B/token``.
    """
    lines = []
    elem = kv_dtype.nbytes(1) if not kv_dtype.scale_group else None
    for cache, count in Counter(layers).items():
        per_token = memory.layer_token_bytes(cache, kv_dtype) * count
        size = f"{elem} B" if elem is not None else f"{kv_dtype.name}"
        if cache.kind is LayerKind.MLA:
            lines.append(f"{plural(count, 'layer')} x {cache.head_dim} latent x {size} = {per_token:,} B/token (MLA)")
        elif cache.kind is LayerKind.CROSS:
            fixed = memory.cross_bytes_per_request((cache,) * count, kv_dtype)
            lines.append(f"2 x {count} cross_attention layers x {cache.kv_heads} kv_heads x {cache.head_dim} head_dim x "
                         f"{size} x {cache.window_tokens or 0:,} image tokens = {fixed:,} B/request (fixed)")
        elif cache.caches_tokens:
            win = f" (window {cache.window_tokens:,})" if cache.window_tokens else ""
            lines.append(f"2 x {plural(count, 'layer')} x {cache.kv_heads} kv_heads x {cache.head_dim} head_dim x {size} = "
                         f"{per_token:,} B/token [{cache.kind.value}{win}]")
        elif cache.is_state:
            state = memory.layer_state_bytes(cache, model_dtype) * count
            lines.append(f"{count} {cache.kind.value} layers x {state // count:,} B state = {state:,} B/request (fixed)")
    return lines


def group_rows(layers: tuple[LayerCache, ...], kv_dtype: DType, model_dtype: DType) -> list[dict[str, Any]]:
    """One row per kind of layer: kind, layers, heads, head dim, window, bytes/token, state bytes."""
    rows = []
    for cache, count in Counter(layers).items():
        rows.append({
            "kind": cache.kind.value,
            "layers": count,
            "kv_heads": cache.kv_heads,
            "head_dim": cache.head_dim,
            "window_tokens": cache.window_tokens,
            "bytes_per_token": memory.layer_token_bytes(cache, kv_dtype) * count,
            "state_bytes_per_request": memory.layer_state_bytes(cache, model_dtype) * count,
        })
    return rows


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The ``--json`` document for one plan (schema_version 1)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "model": _model(plan),
        "assumptions": _assumptions(plan),
        "per_token": _per_token(plan),
        "budget": _budget(plan),
        "pool": _pool(plan),
        "answer": _answer(plan),
        "range": plan.kv_range.to_dict() if plan.kv_range else None,
        "engine_report": _engine_report(plan),
        "fragmentation": _plain(plan.fragmentation),
        "prefix": _plain(plan.prefix) if plan.prefix else None,
        "roofline": _plain(plan.roofline) if plan.roofline else None,
        "notes": list(plan.notes),
    }


def _dtypes(plan: Plan) -> tuple[DType, DType]:
    return parse_dtype(plan.kv_dtype), parse_dtype(plan.model_dtype)


def _model(plan: Plan) -> dict[str, Any]:
    spec = plan.spec
    return {
        "id": spec.model_id,
        "source": plan.source,
        "architecture": spec.architecture,
        "kind": spec.kind_summary,
        "num_layers": spec.num_layers,
        "parameters": spec.parameters,
        "groups": group_rows(spec.layers, *_dtypes(plan)),
        "provenance": dict(spec.provenance),
    }


def _assumptions(plan: Plan) -> dict[str, Any]:
    o = plan.options
    return {
        "gpu": plan.gpu.name,
        "gpu_memory_bytes": plan.gpu.memory_bytes,
        "gpu_memory_source": plan.gpu.memory_source,
        "gpu_count": o.gpu_count,
        "tp": o.tp,
        "pp": o.pp,
        "engine": plan.engine.engine,
        "engine_version": plan.engine.version,
        "engine_version_requested": plan.engine.requested_version or None,
        "engine_releases": plan.engine.release_range,
        "dtype": plan.model_dtype,
        "kv_dtype": plan.kv_dtype,
        "weights_dtype": plan.weights_dtype,
        "block_size": plan.layout.block_size,
        "gpu_util": plan.budget.gpu_util,
        "context_tokens": o.context,
        "context_source": context_source(o),
        "batch": o.batch,
        "max_model_len": plan.max_model_len,
        "max_num_batched_tokens": plan.max_num_batched_tokens,
        "inflight_tokens": plan.inflight_tokens,
        "prefix_caching": plan.prefix_caching,
        "usage_context": o.usage_context,
        "max_num_seqs": plan.answer.max_num_seqs,
        "prefix_tokens": o.prefix_tokens,
        "revision": o.revision,
    }


def _per_token(plan: Plan) -> dict[str, Any]:
    return {
        "kv_bytes_per_token_model": plan.kv_bytes_per_token_model,
        "kv_bytes_per_token_gpu": plan.kv_bytes_per_token_gpu,
        "state_bytes_per_request_gpu": plan.state_bytes_per_request_gpu,
        "cross_attention_bytes_per_request_gpu": memory.cross_bytes_per_request(plan.rank_layers, _dtypes(plan)[0]),
        "kv_bytes_per_request_gpu": plan.request_bytes,
        "formula": formula_lines(plan.rank_layers, *_dtypes(plan)),
        "heads_replicated": plan.heads_replicated,
    }


def _budget(plan: Plan) -> dict[str, Any]:
    b = plan.budget
    return {
        "total_bytes": b.total_bytes,
        "gpu_util": b.gpu_util,
        "usable_bytes": b.usable_bytes,
        "weights_total_bytes": plan.weights_total_bytes,
        **{f"{t.name}_bytes": t.bytes for t in b.terms},
        "host_bytes": b.host_bytes,  # unified memory: the host's use the estimate allows (0 elsewhere)
        "unmodelled_bytes": b.unmodelled_bytes,  # ROCm: non-torch memory the overhead includes, the logs' median
        "unlisted_weights_bytes": b.unlisted_weights_bytes,  # a quantized hybrid's 16-bit layers, the logs' median
        "state_pool_bytes": b.state_pool_bytes,
        "state_slots": b.state_slots,
        "kv_budget_bytes": b.kv_budget_bytes,
        "kv_budget_source": b.kv_budget_source,
        "sources": {t.name: t.source for t in b.terms},
    }


def _pool(plan: Plan) -> dict[str, Any]:
    lay, blocks = plan.layout, plan.answer.num_blocks
    return {
        "block_size": lay.block_size,
        "page_bytes": lay.page_bytes,
        "group_size": lay.group_size,
        "num_groups": len(lay.groups),
        "block_bytes": lay.block_bytes,
        "padding_layers": lay.padding_layers,
        "base_block_size": lay.base_block_size or lay.block_size,
        "state_page_bytes": lay.state_page_bytes,
        "state_padding_bytes": lay.state_padding_bytes,
        "num_blocks": blocks,
        "null_blocks": memory.NULL_BLOCKS,  # kept by the engine, never a request's: fits_margin_blocks leaves it out
        "pool_bytes": memory.pool_bytes(blocks, lay),
        "groups": [{"kind": g.cache.kind.value, "layers": g.num_layers, "window_tokens": g.cache.window_tokens}
                   for g in lay.groups],
    }


def _answer(plan: Plan) -> dict[str, Any]:
    a = plan.answer
    return {
        "kv_tokens": a.kv_tokens,
        "capacity_tokens": a.capacity_tokens,
        "context_tokens": a.context,
        "blocks_per_request": a.blocks_per_request,
        "max_requests": a.max_requests,
        "pool_requests": a.pool_requests,
        "max_num_seqs": a.max_num_seqs,
        "limited_by": a.limited_by,
        "max_concurrency": _finite(a.max_concurrency),
        "batch": a.batch,
        "max_context_at_batch": a.max_context_at_batch,
        "max_context_max_model_len": (plan.max_model_len_fixed or a.max_context_at_batch) or None,
        "fits": a.fits,
        "fits_margin_blocks": a.fits_margin_blocks,
        "fix": a.fix,
        "shared_prefix_tokens": a.shared_prefix_tokens,
        "shared_blocks": a.shared_blocks,
        "unshared_requests": a.unshared_requests,
    }


def _engine_report(plan: Plan) -> dict[str, Any]:
    a, engine = plan.answer, plan.engine
    return {
        "engine": engine.engine,
        "version": engine.version,
        "version_requested": engine.requested_version or None,
        "releases": engine.release_range,
        "token_rule": engine.kv_tokens_rule,
        "max_model_len": plan.max_model_len,
        "kv_cache_tokens": a.kv_tokens,
        "max_concurrency": _finite(a.max_concurrency),
        "starts": a.engine_starts,
        "refusal": a.refusal,
        "longest_startable_len": a.longest_startable_len,
        "model_max_len": a.model_max_len,
        "model_max_len_rule": a.model_max_len_rule or None,
        "idle_reason": a.idle_reason,
        "serve_command": plan.serve_command,
        "serve_note": None if a.refusal else served_weights(plan)[1],
    }


def _plain(obj: Any) -> dict[str, Any]:
    data = to_jsonable(obj)
    return {k: (_finite(v) if isinstance(v, float) else v) for k, v in data.items()}
