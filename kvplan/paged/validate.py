"""Check a :class:`~kvplan.planning.plan.Plan` against a real paged KV cache on a real device.

:func:`validate_plan` allocates the pool the plan says (torch tensors shaped like an engine's), measures
it with the device's own accounting, fills it through the plain-Python allocator with requests at the
planned context until the planned concurrency, tries one more, runs paged-vs-contiguous attention on a
sample, optionally probes how many blocks really fit in free memory, and releases everything (also on
error, Ctrl-C or out of memory). It never prints: progress goes to a callback, results are data.

This module imports torch only inside functions, so ``import kvplan.paged.validate`` works without it;
:func:`require_torch` raises :class:`~kvplan.errors.TorchMissingError` with the install line.
"""

from __future__ import annotations

import gc
from dataclasses import field, replace
from typing import TYPE_CHECKING, Any, Callable

from kvplan import memory
from kvplan.errors import InputError, TorchMissingError
from kvplan.paged import accounting
from kvplan.paged.allocator import BlockAllocator
from kvplan.paged.groups import exact_layout, plan_allocator
from kvplan.model.spec import LayerKind
from kvplan.planning.suggest import NOTHING_FITS
from kvplan.units import GiB, fmt_bytes, round_up, plural
from kvplan.frozen import frozen

if TYPE_CHECKING:  # pragma: no cover
    from kvplan.planning.plan import Plan

Progress = Callable[[int, int], None]  # (requests filled, requests planned)

CUDA_ROUNDING_BYTES = 512  # the CUDA caching allocator rounds every allocation up to 512 B
MLA_ROPE_DIM = 64  # qk_rope_head_dim of every released MLA model: the latent's last 64 elements are rope keys
PROBE_CHUNK_BYTES = 1 * GiB
MEMORY_HEADROOM = 0.95  # refuse pools above this fraction of the device's available memory


def require_torch() -> Any:
    """``import torch``, or a one-line :class:`TorchMissingError` saying how to install it."""
    try:
        import torch
    except ImportError:
        raise TorchMissingError("kvplan validate needs torch", "pip install 'kvplan[torch]'") from None
    return torch


def resolve_device(name: str | None, local_rank: int = 0) -> str:
    """``cuda`` (``cuda:N`` under torchrun) when available and not told otherwise, else ``cpu``."""
    torch = require_torch()
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    name = name.lower()
    if name not in ("cuda", "cpu"):
        raise InputError(f"unknown --device {name!r}", "use cuda or cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise InputError("--device cuda: this torch build sees no CUDA device", "use --device cpu with a small --kv-budget")
        return f"cuda:{local_rank % torch.cuda.device_count()}"
    return "cpu"


# ---------------------------------------------------------------------------------------------
# results


@frozen
class PoolMeasure:
    """The pool's bytes: the estimate and what the device says (``None``: not measured on this device).

    ``storage_bytes``: sum of the tensors' ``untyped_storage().nbytes()``. ``device_bytes``: the device's
    accounting (CUDA ``memory_allocated`` delta; CPU: the storages). ``expected_device_bytes``: the estimate
    plus the CUDA allocator's 512-byte rounding per tensor (0 extra on CPU).
    """

    estimate_bytes: int
    storage_bytes: int
    device_bytes: int
    device_source: str
    expected_device_bytes: int
    num_tensors: int
    driver_bytes: int | None = None  # CUDA mem_get_info free-memory delta (2 MiB segments)
    rss_bytes: int | None = None  # CPU: resident-set delta from /proc/self/statm after zero-filling
    released_bytes: int | None = None  # device bytes still held after release (0 expected)

    @property
    def difference_bytes(self) -> int:
        return self.device_bytes - self.estimate_bytes

    @property
    def difference_pct(self) -> float:
        return 100.0 * self.difference_bytes / self.estimate_bytes if self.estimate_bytes else 0.0


@frozen
class FillResult:
    """Filling the pool with requests at ``context_tokens`` (chunked prefill of ``chunk_tokens``).

    ``peak_blocks``: the most blocks any one request held at once (a sliding window drops old blocks).
    ``one_more_fits``: whether the allocator admitted request ``planned + 1`` to its full context.
    ``exact``: the layout keeps every token, so ``one_more_fits`` must be False.
    """

    context_tokens: int
    chunk_tokens: int
    planned_requests: int
    filled_requests: int
    planned_blocks_per_request: int
    peak_blocks: int
    resident_blocks_per_request: int
    free_blocks: int
    one_more_fits: bool | None
    exact: bool


@frozen
class ProbeResult:
    """CUDA only: block ids that really fit in the device's free memory, allocated in chunks until OOM."""

    free_bytes: int
    block_bytes: int
    blocks_fit: int
    blocks_by_free_memory: int  # free_bytes // block_bytes
    planned_blocks: int


@frozen
class ValidationResult:
    """One device's validation of one plan (``rank`` of ``world_size`` under torchrun)."""

    model_id: str
    device: str
    rank: int
    world_size: int
    pp_stage: int
    num_layers: int
    block_size: int
    num_blocks: int
    block_bytes: int
    page_bytes: int
    group_size: int
    num_groups: int
    kv_dtype: str
    torch_kv_dtype: str
    measure: PoolMeasure | None
    fill: FillResult | None
    attention: tuple[Any, ...] = ()  # AttentionCheck
    probe: ProbeResult | None = None
    error: str | None = None
    failures: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        from kvplan.planning.serialize import to_jsonable

        data = to_jsonable(self)
        data["ok"] = self.ok
        if self.measure is not None:
            data["measure"]["difference_bytes"] = self.measure.difference_bytes
            data["measure"]["difference_pct"] = self.measure.difference_pct
        return data


# ---------------------------------------------------------------------------------------------
# the validation


def rank_layout(plan: "Plan", rank: int) -> tuple[memory.PoolLayout, int, tuple[Any, ...]]:
    """The pool layout of global ``rank`` (tp innermost, as vLLM orders ranks), its pipeline stage and layers.

    A tp rank holds ``shard_layer`` of its stage's layers (the stages as the plan's engine splits them); the plan's
    own layout is the stage's with the fewest blocks.
    """
    tp, pp = plan.options.tp, plan.options.pp
    stage = rank // tp
    if pp == 1:
        return plan.layout, 0, plan.rank_layers
    layers = memory.stage_rank_layers(plan.spec, tp, memory.pipeline_stages(plan.spec.num_layers_decoder, pp,
                                                                            plan.engine.pp_partition)[stage])
    base = plan.layout.base_block_size or plan.layout.block_size
    layout = memory.pool_layout(layers, base, plan.layout.kv_dtype, plan.layout.model_dtype)
    return layout, stage, layers


def validate_plan(plan: "Plan", device: str | None = None, *, probe: bool = False, rank: int = 0,
                  world_size: int = 1, progress: Progress | None = None, attention_samples: int = 2) -> ValidationResult:
    """Allocate, measure, fill and check the pool ``plan`` describes on ``device`` (see the module doc).

    Raises :class:`InputError` when the plan has no blocks or the pool would not fit in the device's
    available memory (scale it with ``--kv-budget``); out of memory during the run becomes a failed result.
    """
    torch = require_torch()
    from kvplan.paged import pool as pool_mod

    device = device or resolve_device(None)
    if probe and not device.startswith("cuda"):
        raise InputError("--probe needs a CUDA device", "drop --probe, or run on a GPU")
    layout, stage, layers = rank_layout(plan, rank)
    num_blocks, estimate = plan.answer.num_blocks, _checked_estimate(torch, plan, layout, device)
    base: dict[str, Any] = dict(
        model_id=plan.spec.model_id, device=device, rank=rank, world_size=world_size, pp_stage=stage,
        num_blocks=num_blocks, **_layout_facts(layout))
    failures: list[str] = []
    notes: list[str] = []
    measure = fill = error = pool = None
    checks: tuple[Any, ...] = ()
    allocated_before = accounting.device_allocated(torch, device)
    try:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        free_before = accounting.free_bytes(torch, device)
        rss_before = accounting.rss_bytes() if device == "cpu" else None
        stage_name = "allocating the pool"
        pool = pool_mod.allocate_pool(layout, num_blocks, device, zero=True, check=False, layers=layers)
        measure = _measure(torch, device, pool, estimate, allocated_before, free_before, rss_before)
        failures.extend(_measure_failures(measure))

        stage_name = "filling the pool"
        if any(layout.group_block_size(g) != layout.block_size for g in layout.groups):
            notes.append("groups with different block sizes: the allocator has one block size, so the fill and "
                         "attention checks are skipped; the bytes are checked")
            raise _SkipFill
        fill, allocator = _fill(plan, layout, num_blocks, progress)
        _judge_fill(fill, layout, failures, notes)

        stage_name = "checking attention"
        checks = _attention_sample(plan, pool, allocator, fill, attention_samples)
        failures.extend(f"attention over scattered blocks differs from contiguous attention ({c.case}: max |diff| "
                        f"{c.max_abs_error:.3g} > {c.atol:g})" for c in checks if not c.ok)
    except _SkipFill:
        pass
    except Exception as exc:  # out of memory (or a broken device) mid-way: report how far it got
        if not accounting.is_oom(exc):
            raise
        got = pool.storage_bytes if pool is not None else getattr(exc, "kvplan_allocated_bytes", 0)
        error = f"out of memory while {stage_name}: {fmt_bytes(got)} of {fmt_bytes(estimate)} allocated"
        failures.append(error)
    finally:
        released = _release(torch, device, pool, allocated_before)
        pool = None
    if measure is not None:
        measure = replace(measure, released_bytes=released)
    probe_result = _probe(torch, device, layout.block_bytes, num_blocks) if probe and error is None else None
    return ValidationResult(**base, measure=measure, fill=fill, attention=checks, probe=probe_result, error=error,
                            failures=tuple(failures), notes=tuple(notes))


def _layout_facts(layout: memory.PoolLayout) -> dict[str, Any]:
    """The :class:`ValidationResult` fields that describe this rank's pool layout."""
    from kvplan.paged import pool as pool_mod

    return dict(num_layers=layout.num_layers, block_size=layout.block_size, block_bytes=layout.block_bytes,
                page_bytes=layout.page_bytes, group_size=layout.group_size, num_groups=len(layout.groups),
                kv_dtype=layout.kv_dtype.name,
                torch_kv_dtype=str(pool_mod.torch_dtype(layout.kv_dtype)).removeprefix("torch."))


def _checked_estimate(torch: Any, plan: "Plan", layout: memory.PoolLayout, device: str) -> int:
    """The pool's planned bytes on this rank; an :class:`InputError` when there is nothing to validate or the
    pool would not fit in the device's available memory."""
    num_blocks, a = plan.answer.num_blocks, plan.answer
    if num_blocks < 1 + memory.NULL_BLOCKS:
        raise InputError(f"the plan leaves {plural(num_blocks, 'KV block')} on this GPU: nothing to validate",
                         f"try {plan.answer.fix}" if plan.answer.fix else NOTHING_FITS)
    if a.max_requests < 1:  # nothing to fill: the concurrency check would check nothing, so it cannot pass or fail
        why = (f"{plan.engine.engine} does not start: {a.refusal}" if a.refusal else
               f"{plural(a.blocks_per_request, 'block')} each, {plural(num_blocks - memory.NULL_BLOCKS, 'usable block')}")
        raise InputError(f"the plan fits no request of {plural(a.context, 'token')} ({why}): nothing to validate",
                         f"try {a.fix}" if a.fix else "raise --kv-budget or lower --context")
    estimate = memory.pool_bytes(num_blocks, layout)
    available = accounting.available_bytes(torch, device)
    if available is not None and estimate > available * MEMORY_HEADROOM:
        raise InputError(f"the planned pool of {fmt_bytes(estimate)} does not fit in the {fmt_bytes(available)} "
                         f"available on {device}",
                         "scale it down with --kv-budget (e.g. --kv-budget 0.25GiB) or use a bigger device")
    return estimate


def _measure(torch: Any, device: str, pool: Any, estimate: int, allocated_before: int, free_before: int | None,
             rss_before: int | None) -> PoolMeasure:
    """The allocated pool as the device accounts it (CUDA allocator and driver; CPU storages and RSS)."""
    storage = pool.storage_bytes
    if device.startswith("cuda"):
        device_bytes = accounting.device_allocated(torch, device) - allocated_before
        driver = (free_before or 0) - (accounting.free_bytes(torch, device) or 0)
        expected = sum(round_up(t.untyped_storage().nbytes(), CUDA_ROUNDING_BYTES) for t in pool.slots)
        return PoolMeasure(estimate, storage, device_bytes, "torch.cuda.memory_allocated delta",
                           expected - storage + estimate, len(pool.slots), driver_bytes=driver)
    rss = accounting.rss_bytes()
    return PoolMeasure(estimate, storage, storage, "untyped_storage().nbytes()", estimate, len(pool.slots),
                       rss_bytes=None if rss is None or rss_before is None else rss - rss_before)


def _measure_failures(measure: PoolMeasure) -> list[str]:
    """The pool's bytes must equal the estimate, and the device must account what the tensors hold."""
    failures = []
    if measure.storage_bytes != measure.estimate_bytes:
        failures.append(f"the torch pool holds {measure.storage_bytes:,} B, the estimate is {measure.estimate_bytes:,} B")
    if measure.device_bytes != measure.expected_device_bytes:
        failures.append(f"the device accounts {measure.device_bytes:,} B for the pool, expected "
                        f"{measure.expected_device_bytes:,} B")
    return failures


def _judge_fill(fill: FillResult, layout: memory.PoolLayout, failures: list[str], notes: list[str]) -> None:
    """What the fill says about the plan: every planned request fits, none holds more than planned, and (when
    the allocator's demand is exactly the plan's) one more does not. A plan of no request checks nothing
    about concurrency, so it cannot pass."""
    if fill.planned_requests == 0:
        failures.append(f"the plan fits no request of {plural(fill.context_tokens, 'token')}, so the fill checked nothing "
                        "(raise --kv-budget or lower --context to validate the concurrency)")
    if fill.filled_requests < fill.planned_requests:
        failures.append(f"only {fill.filled_requests} of the planned {plural(fill.planned_requests, 'request')} at "
                        f"{plural(fill.context_tokens, 'token')} fit")
    if fill.peak_blocks > fill.planned_blocks_per_request:
        failures.append(f"a request held {plural(fill.peak_blocks, 'block')} at once, the plan allows "
                        f"{fill.planned_blocks_per_request}")
    if fill.exact and fill.one_more_fits:
        failures.append(f"request {fill.planned_requests + 1} also fits: the plan underestimates the concurrency")
    if not fill.exact and fill.one_more_fits and not exact_layout(layout):
        notes.append(f"request {fill.planned_requests + 1} fits once sliding windows have dropped old blocks "
                     f"({fill.resident_blocks_per_request} resident vs {fill.planned_blocks_per_request} planned "
                     f"blocks per request): the plan reserves the chunked-prefill peak, as vLLM does")


class _SkipFill(Exception):
    """The layout cannot be filled by the allocator (the bytes are still checked)."""


def _release(torch: Any, device: str, pool: Any, allocated_before: int) -> int | None:
    """Free the pool's tensors and the CUDA cache; returns the device bytes still held (CUDA), else None."""
    if pool is not None:
        pool.release()
    del pool
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        return accounting.device_allocated(torch, device) - allocated_before
    accounting.malloc_trim()
    return None


def _fill(plan: "Plan", layout: memory.PoolLayout, num_blocks: int,
          progress: Progress | None) -> tuple[FillResult, BlockAllocator]:
    """Admit ``plan.answer.max_requests`` requests at the planned context, chunk by chunk, then one more."""
    context = plan.answer.context
    chunk = plan.max_num_batched_tokens
    allocator, demand = plan_allocator(plan, layout, num_blocks)
    planned = plan.answer.max_requests
    per_request = demand.blocks(context)
    peak = filled = 0
    step = max(1, planned // 200)  # at most ~200 progress updates
    for i in range(planned):
        got = _prefill(allocator, i, context, chunk)
        if got is None:
            break
        peak = max(peak, got)
        filled += 1
        if progress is not None and (filled % step == 0 or filled == planned):
            progress(filled, planned)
    resident = allocator.num_blocks_of(0) if filled else 0
    one_more = None
    if filled == planned:
        one_more = _prefill(allocator, planned, context, chunk) is not None
        if planned in allocator:
            allocator.free(planned)
    # exact: the allocator's demand is the plan's (every token kept, and this rank's stage is the plan's largest)
    exact = exact_layout(layout) and per_request == plan.answer.blocks_per_request
    fill = FillResult(context, chunk, planned, filled, per_request, peak, resident, allocator.num_free_blocks,
                      one_more, exact)
    return fill, allocator


def _prefill(allocator: BlockAllocator, req_id: int, tokens: int, chunk: int) -> int | None:
    """Prefill ``tokens`` in chunks of ``chunk`` (vLLM's chunked prefill); the peak blocks held, or None
    (the request is removed) when it does not fit."""
    first = min(chunk, tokens)
    if allocator.allocate(req_id, first) is None:
        return None
    peak, done = allocator.num_blocks_of(req_id), first
    while done < tokens:
        step = min(chunk, tokens - done)
        if not allocator.append_tokens(req_id, step):
            allocator.free(req_id)
            return None
        done += step
        peak = max(peak, allocator.num_blocks_of(req_id))
    return peak


def _attention_sample(plan: "Plan", pool: Any, allocator: BlockAllocator, fill: FillResult, samples: int) -> tuple[Any, ...]:
    """Paged vs contiguous decode for up to ``samples`` filled requests, one layer of each distinct cache kind."""
    import torch

    from kvplan.paged.attention import check_decode

    if not fill.filled_requests:
        return ()
    tp = plan.options.tp
    requests = sorted({0, fill.filled_requests - 1})[:samples]
    seen, checks = set(), []
    gen = torch.Generator(device=pool.device).manual_seed(0)
    for g, group in enumerate(pool.layout.groups):
        cache = group.cache
        if cache in seen or not cache.caches_tokens:
            continue
        seen.add(cache)
        view = pool.group_layers(g)[0]
        kv_heads = 1 if cache.kind is LayerKind.MLA else cache.kv_heads
        q_heads = max(1, plan.spec.num_attention_heads // tp)
        q_heads = kv_heads * max(1, q_heads // kv_heads)
        for req in requests:
            table = allocator.block_table(req, g)
            tokens = allocator.num_tokens(req)
            window = None
            if cache.kind is LayerKind.SLIDING:
                window = cache.window_tokens
            elif cache.kind is LayerKind.CHUNKED:
                window = (tokens - 1) % cache.window_tokens + 1  # attends within the current chunk only
            case = _case_name(cache, kv_heads, q_heads)
            if cache.kind is LayerKind.MLA:
                check = check_decode(case, view.tensors["latent"], None, table, tokens, view.block_size,
                                     q_heads, value_dim=max(1, cache.head_dim - MLA_ROPE_DIM), generator=gen,
                                     null_block=allocator.null_block)
            else:
                check = check_decode(case, view.k, view.v, table, tokens, view.block_size, q_heads,
                                     window=window, generator=gen, null_block=allocator.null_block)
            checks.append(replace(check, request=req + 1))  # the rows of one case differ by their request
    return tuple(checks)


def _case_name(cache: Any, kv_heads: int, q_heads: int) -> str:
    if cache.kind is LayerKind.MLA:
        return "mla"
    if cache.kind in (LayerKind.SLIDING, LayerKind.CHUNKED):
        return f"{cache.kind.value}({cache.window_tokens})"
    return "mqa" if kv_heads == 1 else ("mha" if kv_heads == q_heads else "gqa")


def _probe(torch: Any, device: str, block_bytes: int, planned_blocks: int) -> ProbeResult:
    """Allocate blocks in chunks (1 GiB, halving on OOM down to one block) until nothing more fits; free all."""
    torch.cuda.empty_cache()
    free = int(torch.cuda.mem_get_info(torch.device(device))[0])
    held, blocks = [], 0
    chunk = max(1, PROBE_CHUNK_BYTES // block_bytes)
    try:
        while chunk >= 1:
            try:
                held.append(torch.empty(chunk * block_bytes, dtype=torch.uint8, device=device))
                blocks += chunk
            except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
                if not accounting.is_oom(exc):
                    raise
                chunk //= 2
    finally:
        held.clear()
        gc.collect()
        torch.cuda.empty_cache()
    return ProbeResult(free, block_bytes, blocks, free // block_bytes, planned_blocks)
