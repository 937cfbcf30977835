"""The budget's given terms: the user's (--activation-gib, ..., --enforce-eager) and a calibration entry's measured
ones, a given --kv-budget held to what the device has beside them, on a unified-memory device the host's use,
which kvplan cannot know (its corpus median), and on ROCm the non-torch memory kvplan's formula leaves out (its
corpus median, where calibration logs measured it).
"""

from __future__ import annotations

import math

from dataclasses import replace

from kvplan import memory
from kvplan.engines import Budget, EngineDefaults, Term, given
from kvplan.engines.spread import (ROUGH_WIDE_FAMILIES, board, model_family, rough_weights, term_class, term_spread,
                                   unmodelled_non_torch)
from kvplan.errors import InputError
from kvplan.model.spec import ModelSpec
from kvplan.options import Options
from kvplan.planning.gpu import GpuInfo
from kvplan.units import DType, GiB


def check_kv_budget(budget: Budget, gpu: GpuInfo, options: Options, engine: str, layout: memory.PoolLayout) -> None:
    """A given ``--kv-budget`` must fit on the device beside every other term the engine holds there (weights,
    activation, non-torch overhead, CUDA graphs): the engine allocates the cache it is told to and fails when the
    device has less, so a plan of more KV than the device holds is refused (one line with the device's figures),
    never answered "fits". The CPU backend's KV space must fit the host's total (the weights aside: the backend's
    own sizing ignores them); sized from the KV space alone, it has no host total to hold it to; a
    budget that holds no block besides the null block answers itself (nothing fits: the low end of a plan whose
    terms fill the device is planned so, :func:`kvplan.checks.capacity.low_end`)."""
    kv = options.kv_budget_bytes
    if kv is None or gpu.memory_source.startswith("--kv-budget"):
        return
    if memory.num_blocks(kv, layout) <= memory.NULL_BLOCKS:
        return
    # the CPU backend's KV space is host memory beside the weights, sized from the host's total alone (vLLM's own
    # default is a share of it, kvplan.engines.vllm.cpu_kv_budget): it must fit the host, the weights aside
    held = [] if gpu.is_cpu else [t for t in budget.terms if t.bytes]
    room = budget.total_bytes - sum(t.bytes for t in held)
    if kv <= room:
        return
    taken = "".join(f" {'-' if i == 0 else '+'} {t.name} {t.bytes / GiB:,.2f}" for i, t in enumerate(held))
    taken += " GiB" if held else ""
    what = "host" if gpu.is_cpu else "GPU"
    if options.gpu_memory_bytes:
        total = f"--gpu-memory {budget.total_bytes / GiB:,.2f} GiB"
    else:
        total = f"the {gpu.name}'s {budget.total_bytes / GiB:,.2f} GiB" + ("" if gpu.is_cpu else " (runtime-reported)")
    most = math.floor(room / GiB * 100) / 100
    hint = (f"give at most --kv-budget {most:.2f}GiB, or a {what} with more memory" if most > 0 else
            f"those terms alone fill the {what}: more tensor parallelism (--tp), or a {what} with more memory")
    raise InputError(f"--kv-budget {kv / GiB:,.2f} GiB does not fit: {total}{taken} leaves "
                     f"{room / GiB:,.2f} GiB for the KV cache, and {engine} would fail to allocate more", hint)


def _given_terms(spec: ModelSpec, options: Options, gpu: GpuInfo, engine: EngineDefaults, model_dtype: DType,
                 weights: Term) -> tuple[tuple[Term, Term | None, Term | None, Term | None], str]:
    """The terms the engine does not estimate: the user's (``--activation-gib``, ..., ``--enforce-eager``)
    and, under them, a matching calibration entry's measured ones; and the calibration note."""
    def given(name: str, value: int | None) -> Term | None:
        return None if value is None else Term(name, value, "--" + name.replace("_", "-") + "-gib")

    terms = {"weights": weights, "activation": given("activation", options.activation_bytes),
             "overhead": given("overhead", options.overhead_bytes), "cudagraph": given("cudagraph", options.cudagraph_bytes)}
    if terms["cudagraph"] is None and options.enforce_eager:
        terms["cudagraph"] = Term("cudagraph", 0, "--enforce-eager: no CUDA graphs are captured")
    note = ""
    if options.calibration is not None:
        cal = options.calibration
        key = dict(model=spec.model_id, gpu=gpu.name, gpu_memory_bytes=gpu.memory_bytes, engine=engine.engine,
                   release=engine.version, tp=options.tp, pp=options.pp, dtype=model_dtype.name,
                   max_num_batched_tokens=engine.max_num_batched_tokens, max_num_seqs=engine.max_num_seqs)
        entry = cal.match(**key)
        if entry is None:
            note = f"calibration {cal.path}: no entry for this deployment ({cal.mismatch(**key)}): kvplan's estimates used"
        else:
            used = []
            for key, value in entry.terms:
                name = key.removesuffix("_bytes")
                user_given = options.weights_bytes is not None if name == "weights" else terms[name] is not None
                if not user_given:
                    terms[name] = Term(name, value, f"calibration {cal.path}: measured ({entry.source or 'a log'})")
                    used.append(name)
            note = (f"calibration {cal.path}: measured {', '.join(used) or 'no'} term(s) of {entry.source or 'a log'} used"
                    + (f" ({entry.note})" if entry.note else ""))
    return (terms["weights"], terms["activation"], terms["overhead"], terms["cudagraph"]), note


def with_host_use(budget: Budget, engine: EngineDefaults, gpu: GpuInfo) -> Budget:
    """``budget`` less the host's use on a unified-memory device (``gpu.memory_kind`` ``unified``: GB10 / DGX
    Spark; ``host_bytes``, which the range's note states, :data:`kvplan.planning.kv_range.UNIFIED_NOTE`), else
    ``budget`` itself. What the host takes from the memory the engine finds free is unknown to kvplan, so the point
    estimate takes the calibration logs' median of the ``unified memory`` term (:func:`kvplan.engines.spread.term_spread`, from kv_spread.yaml; bytes per GPU), not 0:
    an estimate that allowed nothing for it would promise the host's use as KV. Not where the KV budget is given,
    nor where a calibration entry measured a term (it was fitted to a log that already lost the host's use), nor
    for an engine whose calibration logs have no such term."""
    if gpu.memory_kind != "unified" or budget.kv_budget_source.startswith("--kv-budget") or \
            any(t.source.startswith("calibration") for t in budget.terms):
        return budget
    host = term_spread("unified memory", engine.engine, "unified", 0)
    if host is None or not host.median_bytes:
        return budget
    return replace(budget, host_bytes=host.median_bytes, kv_budget_bytes=budget.kv_budget_bytes - host.median_bytes,
                   kv_budget_source=budget.kv_budget_source + " - host's use")


def with_unlisted_weights(budget: Budget, engine: EngineDefaults, spec: ModelSpec) -> Budget:
    """``budget`` with the weights a quantized hybrid or multimodal checkpoint keeps in 16 bits added to a weights
    term counted from parameters x a dtype (``--weights-dtype`` on a 16-bit spec), else ``budget`` itself. Which
    layers its quantizer left (linear-attention and state projections, gates, the vision tower) a 16-bit spec does
    not say, so the point estimate takes the calibration logs' median of the class (``parameters x dtype, hybrid or
    vision`` in kv_spread.yaml, a fraction of the term; recorded in ``unlisted_weights_bytes``), not the lowest
    value, all layers quantized. Nothing where the weights were given or measured, or the KV budget given."""
    weights = budget.weights
    if budget.kv_budget_source.startswith("--kv-budget") or given(weights) or not rough_weights(weights.source) or \
            model_family(spec) not in ROUGH_WIDE_FAMILIES:
        return budget
    cls = term_class("weights", engine=engine.engine, version=engine.version, tp=1, board_name="",
                     family_name=model_family(spec), rough=True)
    median = term_spread("weights", engine.engine, cls, weights.bytes)
    if median is None or median.median_bytes <= 0:
        return budget
    added = median.median_bytes
    term = Term("weights", weights.bytes + added, f"{weights.source} + {added / GiB:.2f} GiB of layers the quantizer "
                f"keeps in 16 bits, which the spec cannot name (the median of {cls}, kv_spread.yaml)")
    return replace(budget, weights=term, unlisted_weights_bytes=added, kv_budget_bytes=budget.kv_budget_bytes - added)


def with_unmodelled_non_torch(budget: Budget, engine: EngineDefaults, gpu: GpuInfo, tp: int) -> Budget:
    """``budget`` with the non-torch memory kvplan's formula leaves out on the GPU's platform added to the overhead
    term (ROCm: hipBLASLt's loaded kernels, :data:`kvplan.engines.spread.UNMODELLED_NON_TORCH_PLATFORMS`), else
    ``budget`` itself. kvplan cannot know it (the installation's), so the point estimate takes the calibration logs'
    median gap of the deployment's non-torch class (:func:`kvplan.engines.spread.unmodelled_non_torch`; bytes per
    GPU, recorded in ``unmodelled_bytes``), not NVIDIA's 0: nothing where no calibration log of the class prints
    non-torch memory, where the user or a calibration entry gave the term, or where the KV budget is given."""
    overhead = budget.overhead
    if budget.kv_budget_source.startswith("--kv-budget") or given(overhead) or \
            any(t.source.startswith("calibration") for t in budget.terms):
        return budget
    cls = term_class("overhead", engine=engine.engine, version=engine.version, tp=tp,
                     board_name=board(gpu.interconnect, gpu.memory_kind), family_name="", rough=False)
    extra = unmodelled_non_torch(engine.engine, gpu.device.platform, cls)
    if extra is None:
        return budget
    added = extra.median_bytes
    term = Term("overhead", overhead.bytes + added, f"{overhead.source} + {gpu.device.platform.upper()}'s non-torch "
                f"memory kvplan's formula leaves out {added / GiB:.2f} GiB (the median gap of {extra.basis})")
    return replace(budget, overhead=term, unmodelled_bytes=added, kv_budget_bytes=budget.kv_budget_bytes - added)

