"""The weights a plan loads and the weights its launch command serves.

:func:`weights_bytes`: the total weight bytes (all GPUs) a plan counts and where the number came from (the
checkpoint's facts, ``--weights-dtype``, ``--weights-gib``). :func:`check_quantization`: ``--quantization`` as the
engine takes it. :func:`served_weights`: what the launch command loads against what was planned (the one rule:
estimate's engine panel, ``--json``'s ``engine_report.serve_note`` and the command's ``--quantization`` ask it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvplan import memory
from kvplan.errors import InputError
from kvplan.model.spec import ModelSpec
from kvplan.options import Options
from kvplan.units import DType, GiB, parse_dtype

Plan = Any  # a kvplan.planning.plan.Plan (plan imports this module, never the other way)


# quantization methods of one family: an engine takes one for a checkpoint of another (vLLM's awq_marlin for awq)
_QUANT_FAMILIES = ({"awq", "awq_marlin", "awq_triton"},
                   {"gptq", "gptq_marlin", "gptq_marlin_24", "marlin", "gptq_bitblas", "bitblas"},
                   {"fp8", "fbgemm_fp8", "ptpc_fp8"}, {"compressed-tensors", "compressed_tensors"})
# what a checkpoint quantized to each planned weights dtype is commonly stored as (the serve note names them)
_CHECKPOINTS_FOR = {"int4": "an AWQ or GPTQ 4-bit checkpoint", "int8": "a GPTQ 8-bit or compressed-tensors W8A8 "
                    "checkpoint", "fp8_e4m3": "an fp8 checkpoint", "fp8_e5m2": "an fp8 (e5m2) checkpoint"}


def _same_method(a: str, b: str) -> bool:
    a, b = a.strip().lower(), b.strip().lower()
    return a == b or any(a in family and b in family for family in _QUANT_FAMILIES)


def check_quantization(spec: ModelSpec, method: str, method_dtype: str | None, engine: str) -> None:
    """``--quantization`` as the engine takes it: a checkpoint format needs a checkpoint stored in it (the
    config's quantization_config), and a quantized checkpoint takes only its own method (vLLM's
    ``_verify_quantization``); an InputError otherwise."""
    held = spec.quant_method
    if held and not _same_method(method, held):
        raise InputError(f"--quantization {method} does not match {spec.model_id}'s quantization_config "
                         f"(quant_method {held}): {engine} refuses the pair",
                         f"drop --quantization: {engine} reads {held} from the checkpoint's config")
    if not held and method_dtype is None:
        raise InputError(f"--quantization {method}: {spec.model_id} is a {spec.dtype} checkpoint with no "
                         f"quantization_config, and {method} is a checkpoint format ({engine} loads only a checkpoint "
                         "stored in it)",
                         f"serve a checkpoint of the model stored as {method} instead of this one, or plan one here with "
                         "--weights-dtype int4 (or --weights-gib SIZE); --quantization fp8 quantizes this checkpoint "
                         "while it loads")


def served_weights(plan: "Plan") -> tuple[str | None, str | None]:
    """What the launch command serves against what was planned: ``(the --quantization it passes, a note when the
    weights it loads are not the ones planned)``.

    ``--quantization`` as given; a ``--weights-dtype fp8`` plan of a 16-bit checkpoint is served with vLLM's
    and SGLang's online ``--quantization fp8`` (linear layers quantized while loading, as planned). Any other
    ``--weights-dtype`` that the checkpoint does not store (int8, int4, or a quantized checkpoint planned in
    another dtype) is a checkpoint to serve in its place: the note says so, and what the named one holds."""
    o, spec = plan.options, plan.spec
    if o.quantization:
        return o.quantization, None
    if not o.weights_dtype or o.weights_bytes is not None:
        return None, None
    planned = plan.weights_dtype
    if spec.weights_format and planned == spec.weights_format:  # the checkpoint's own format: served as stored
        return None, None
    if not spec.quant_method and planned == "fp8_e4m3":  # what the engines' online fp8 stores
        return "fp8", None
    model_dtype = parse_dtype(plan.model_dtype)
    stored, _ = weights_bytes(spec, replace(o, weights_dtype=None), None, model_dtype)
    held = f"{spec.quant_method}-quantized" if spec.quant_method else spec.dtype
    instead = _CHECKPOINTS_FOR.get(planned, f"a {planned} checkpoint")
    return None, (f"the plan's weights are {planned} ({plan.weights_total_bytes / GiB:,.2f} GiB in all) but "
                  f"{plan.serve_model} is a {held} checkpoint ({stored / GiB:,.2f} GiB): this command loads it as "
                  f"stored; serve {instead} of the model in its place")


def weights_bytes(spec: ModelSpec, options: Options, weights_dtype: DType | None, model_dtype: DType) -> tuple[int, str]:
    """Total weight bytes (all GPUs) and where the number came from. A ``weights_dtype`` that is the dtype the
    model runs in (what a report row's column says when none was set) loads the checkpoint as it is."""
    if options.weights_bytes is not None:
        return options.weights_bytes, "--weights-gib"
    if weights_dtype is not None and weights_dtype.name == model_dtype.name and not spec.quant_method:
        weights_dtype = None
    w = spec.weights
    if weights_dtype is None:
        if w is not None and w.total_bytes:
            loaded = w.loaded_bytes(spec.dtype, model_dtype.name)
            if loaded is not None:
                return loaded, f"checkpoint: {w.source or 'total_bytes'}, its {spec.dtype} tensors loaded as {model_dtype.name}"
            return w.total_bytes, f"checkpoint: {w.source or 'total_bytes'}"
        if spec.parameters:
            return memory.weight_bytes(spec.parameters, model_dtype), f"{spec.parameters:,} parameters x {model_dtype.name}"
    elif spec.parameters:
        # GPTQ / AWQ / fp8 checkpoints quantize the decoder's linear layers; embeddings and the LM head stay 16-bit
        embed = min(spec.embedding_parameters, spec.parameters)
        quantized = spec.parameters - embed
        total = memory.weight_bytes(quantized, weights_dtype) + memory.weight_bytes(embed, model_dtype)
        return total, (f"{quantized:,} parameters x {weights_dtype.name} + {embed:,} embedding/LM-head "
                       f"parameters x {model_dtype.name}")
    raise InputError(f"{spec.source}: no weight facts (parameter count or checkpoint size)",
                     "pass --weights-gib SIZE")
