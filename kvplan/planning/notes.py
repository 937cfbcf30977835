"""What the reader of a plan should know: the spec's, the engine's and the budget's notes, plus the plan's own (the
dtypes, --gpu-memory, --gpus, an empty KV budget).
"""

from __future__ import annotations

import math

from kvplan.engines import Budget, kv_cache_dtype_spelling, what_if_kv_dtype
from kvplan.engines.registry import engine as engine_rules
from kvplan.model.spec import ModelSpec
from kvplan.options import Options
from kvplan.planning.gpu import GpuInfo
from kvplan.planning.pool import _Pool, checkpoint_label
from kvplan.units import GiB


def _notes(pool: _Pool, spec: ModelSpec, auto_note: str | None, replicated: bool) -> tuple[str, ...]:
    """What the reader should know: the spec's, the engine's and the budget's notes, plus the plan's own."""
    options, budget, layout = pool.options, pool.budget, pool.demand.layout
    state = _state_note(pool, spec)
    notes = [n for n in spec.notes if not (state and n.startswith(STATE_NOTE))] + list(pool.engine.notes)
    notes += list(budget.notes) + ([state] if state else [])
    if auto_note:
        notes.append(auto_note)
    if options.gpu_memory_bytes:
        notes.append(_gpu_memory_note(pool.gpu, options))
    if options.split_given:  # --gpus with --tp or --pp: the other took the rest
        given, other = ("tp", "pp") if options.split_given == "tp" else ("pp", "tp")
        kind = "pipeline" if other == "pp" else "tensor"
        notes.append(f"--gpus {options.gpu_count} with --{given} {getattr(options, given)}: {kind} parallelism over "
                     f"the rest ({other} {getattr(options, other)})")
    elif options.tp_from_gpus:
        notes.append(f"--gpus {options.gpu_count} without --tp/--pp: tensor parallelism over all of them (tp "
                     f"{options.tp}); pass --tp and --pp to split them otherwise")
    if replicated:
        notes.append(f"tp {options.tp} exceeds the KV heads: each rank holds a replicated copy of its head")
    if pool.model_dtype.name != spec.dtype:
        notes.append(_dtype_note(pool, spec))
    choices = engine_rules(pool.engine.engine).kv_cache_dtypes(pool.engine)
    if kv_cache_dtype_spelling(pool.kv_dtype.name, pool.model_dtype.name, choices) is None:
        notes.append(what_if_kv_dtype(pool.engine, pool.kv_dtype.name, choices))
    if budget.kv_budget_bytes <= 0:
        notes.append(_no_kv_memory_note(budget))
    if layout.padding_layers:
        notes.append(f"{layout.padding_layers} padded layer slot(s) in the last group of a kind waste "
                     f"{layout.padding_layers}/{len(layout.groups) * layout.group_size} of each block")
    return tuple(notes)


def _gpu_memory_note(gpu: GpuInfo, options: Options) -> str:
    """What ``--gpu-memory`` means (the total the runtime reports, in GiB), in decimal units where it was given
    in them, and the catalogue GPU nearest to it with what that one reports (``--gpu-memory 80GB`` is 74.51 GiB;
    an H100 reports 79.20 GiB)."""
    from kvplan.gpus import load_gpus
    from kvplan.units import GB

    size = options.gpu_memory_bytes
    what = f"--gpu-memory: {size / GiB:,.2f} GiB ({size:,} B), planned as the total the runtime reports"
    if size % GB == 0 and size % GiB:
        what += f" (GB is 10^9 B: {size // GB:,} GB = {size / GiB:,.2f} GiB)"
    gpus = [g for g in load_gpus() if not g.is_cpu and g.memory_bytes]
    boxed = [g for g in gpus if g.marketing_gb and size in (round(g.marketing_gb * GB), round(g.marketing_gb * GiB))]
    near = boxed or [g for g in gpus if 0.8 <= g.memory_bytes / size <= 1.25]
    if options.gpu:  # the user's size, not the named GPU's: say what that one reports when it differs
        from kvplan.gpus import find_gpu

        named = find_gpu(options.gpu)
        if named.memory_bytes and named.memory_bytes != size:
            what += (f", not what the catalogue's {named.name} reports ({named.memory_bytes / GiB:,.2f} GiB; leave "
                     "--gpu-memory out to plan that)")
        return what
    if not near:
        return what
    # the size on a box names the first such GPU of the catalogue (H100 SXM for 80 GB), else the nearest in size
    best = near[0] if boxed else min(near, key=lambda g: abs(math.log(g.memory_bytes / size)))
    flag = min((best.name, *best.aliases), key=len).lower()
    return (f"{what}; the catalogue's {best.name} reports {best.memory_bytes / GiB:,.2f} GiB, not its box's "
            f"{best.marketing_gb:g} GB (--gpu {flag} plans that)" if boxed else
            f"{what}; the catalogue's {best.name} reports {best.memory_bytes / GiB:,.2f} GiB (--gpu {flag} plans that)")


def _no_kv_memory_note(budget: Budget) -> str:
    """Why the KV budget is empty: the weights alone, or the terms together (each named, GiB per GPU)."""
    usable = f"{budget.usable_bytes / GiB:.2f} GiB usable per GPU"
    if budget.weights.bytes >= budget.usable_bytes:
        return f"no memory left for the KV cache: weights alone take {budget.weights.bytes / GiB:.2f} GiB of {usable}"
    terms = [t for t in budget.terms if t.bytes]
    taken = sum(t.bytes for t in terms)
    listed = " + ".join(f"{t.name} {t.bytes / GiB:.2f}" for t in terms)
    return f"no memory left for the KV cache: {listed} = {taken / GiB:.2f} GiB of {usable}"


STATE_NOTE = "state layers:"  # how the spec's note on state layers begins (the plan's own replaces it)


def _state_note(pool: _Pool, spec: ModelSpec) -> str | None:
    """The dtypes state layers are planned in, when the engine changed the spec's (its CPU backend stores the
    SSM state in float32): one note that replaces the spec's, so they cannot disagree."""
    planned = sorted({x.ssm_dtype or "" for x in pool.layers if x.is_state})
    if not planned or planned == sorted({x.ssm_dtype or "" for x in spec.layers if x.is_state}):
        return None
    ssm = ", ".join(d or "the model dtype" for d in planned)
    why = f" ({pool.ssm_note})" if pool.ssm_note else ""
    return f"{STATE_NOTE} conv state in {pool.model_dtype.name}, SSM state in {ssm}{why}"


def _dtype_note(pool: _Pool, spec: ModelSpec) -> str:
    """Why the model runs in another dtype than its config's (KV, activations and weights follow); a quantized
    checkpoint is named by what it stores (:func:`checkpoint_label`), not by the config's dtype."""
    run, checkpoint = pool.model_dtype.name, spec.dtype
    stored = checkpoint_label(spec)
    prov = spec.provenance.get("dtype") or ""
    config_dtype = prov if prov and prov != "torch_dtype" else f"the config's torch_dtype {checkpoint}"
    what = f"the {stored} checkpoint" + (f" ({config_dtype})" if spec.weights_format else "")
    if pool.options.dtype and pool.options.dtype != "auto":
        why = f"--dtype {pool.options.dtype}: {what} is cast to {run}"
    else:
        no_bf16 = "" if pool.gpu.bf16 else f" ({pool.gpu.name} has no bfloat16: compute capability below 8.0)"
        why = f"dtype auto: {pool.engine.engine} runs {what} in {run}{no_bf16}"
    keep = f"; --dtype {checkpoint} keeps {checkpoint}" if checkpoint == "float32" and not spec.weights_format else ""
    return f"{why}; the KV cache, activations and weights are sized in {run}{keep}"
