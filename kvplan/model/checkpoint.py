"""The weights an engine loads from a checkpoint, as :class:`~kvplan.model.source.WeightFacts`.

- Weight facts (safetensors metadata or index, a bundled spec's numbers) describe the whole checkpoint. A
  checkpoint with multi-token-prediction (MTP) layers (``num_nextn_predict_layers``, DeepSeek-V3/R1, GLM-4.5)
  stores them after the decoder layers, but vLLM does not load them unless speculative decoding uses them:
  its ``load_weights`` (``vllm/model_executor/models/deepseek_v2.py`` and the models built like it) skips every
  weight ``get_spec_layer_idx_from_weight_name`` places in an MTP layer. Their bytes, as the checkpoint stores
  them (:mod:`kvplan.model.quant`), are subtracted, with a note.
- A config without weight facts that declares a ``quantization_config`` is estimated the way the checkpoint
  stores it (:mod:`kvplan.model.quant`), MTP layers left out; a quantization method kvplan does not model gets a note
  that the weights are sized unquantized, and how to give the real size.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from kvplan.model.source import WeightFacts
from kvplan.model.params import Tensors
from kvplan.units import GiB

if TYPE_CHECKING:
    from kvplan.model.quant import Quantization

# the model dtype's safetensors name: what unquantized tensors are stored as
_SAFETENSORS = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def engine_weights(config: Mapping[str, Any], where: str, facts: WeightFacts | None, tensors: tuple[Tensors, ...],
                   dtype: str) -> tuple[WeightFacts | None, tuple[str, ...]]:
    """The weights an engine loads (None when neither facts nor a quantization estimate say) and the notes
    that explain them. ``tensors``: :func:`kvplan.model.params.inventory`; ``dtype``: the checkpoint's dtype."""
    mtp = [t for t in tensors if t.mtp]
    if not mtp and config.get("quantization_config") is None and config.get("compression_config") is None:
        return facts, ()  # nothing to estimate or subtract (kvplan.model.quant is not even imported)
    from kvplan.model import quant

    model_dtype = _SAFETENSORS.get(dtype, "BF16")
    q = quant.read(config, where, model_dtype)
    main = [t for t in tensors if not t.mtp]
    kv = _kv_note(q, dtype) if q is not None else ()
    if facts is not None and facts.total_bytes:
        return (_without_mtp(facts, mtp, q, model_dtype) if mtp else facts), kv
    if q is None:
        return facts, ()
    if not q.rules:
        size = f"{sum(t.parameters for t in main):,} parameters x {dtype}" if main else "the parameter count"
        note = (f"quantization_config quant_method {q.method!r} is not modelled: the weights are estimated unquantized "
                f"({size}); pass --weights-gib SIZE (the checkpoint's size) or --weights-dtype")
        return facts, (note,) + kv
    if not main:
        return facts, (f"quantization_config ({q.method}) read, but the config has no vocab_size to count the "
                       "weights from; pass --weights-gib SIZE",) + kv
    elements = quant.stored_elements(main, q, model_dtype)
    parameters = sum(t.parameters for t in main)
    quantized = quant.quantized_parameters(main, q)
    estimate = WeightFacts(
        total_bytes=quant.stored_bytes(elements),
        parameters=facts.parameters if facts is not None and facts.parameters else parameters,
        dtype=max(elements, key=lambda d: elements[d]),
        params_by_dtype=MappingProxyType(dict(sorted(elements.items()))),
        source=f"estimated from quantization_config ({q.method}: {q.labels})",
    )
    note = (f"weights estimated from config.json's quantization_config (quant_method {q.method}), as the checkpoint "
            f"stores them: {quantized:,} parameters as {q.labels}; the other {parameters - quantized:,} (embeddings, "
            f"LM head, norms, routers, what the config leaves unquantized) in {dtype}. No safetensors index or "
            "metadata was read: --weights-gib SIZE gives the real size")
    return estimate, (note,) + kv


def weights_format(config: Mapping[str, Any], where: str, dtype: str) -> str:
    """The format a quantized checkpoint stores its quantized weights in (``fp8_e4m3``, ``mxfp4``, ``nvfp4``,
    ``int4``, ...: :attr:`kvplan.model.quant.Quantization.weights_format`), "" when the config declares no
    quantization (its tensors are in ``dtype``)."""
    if config.get("quantization_config") is None and config.get("compression_config") is None:
        return ""
    from kvplan.model import quant

    q = quant.read(config, where, _SAFETENSORS.get(dtype, "BF16"))
    return q.weights_format if q is not None else ""


def _without_mtp(facts: WeightFacts, mtp: list[Tensors], q: Quantization | None,
                 model_dtype: str) -> WeightFacts:
    """``facts`` less the MTP layers' tensors as the checkpoint stores them."""
    from kvplan.model import quant

    elements = quant.stored_elements(mtp, q, model_dtype)
    mtp_bytes = quant.stored_bytes(elements)
    params = sum(t.parameters for t in mtp)
    assert facts.total_bytes is not None
    if mtp_bytes >= facts.total_bytes:  # facts that cannot hold the MTP layers: leave them as they are
        return facts
    by_dtype = {d: max(0, n - elements.get(d, 0)) for d, n in facts.params_by_dtype.items()}
    return WeightFacts(
        total_bytes=facts.total_bytes - mtp_bytes,
        parameters=facts.parameters - params if facts.parameters and facts.parameters > params else facts.parameters,
        dtype=facts.dtype,
        params_by_dtype=MappingProxyType(by_dtype),
        source=f"{facts.source or 'total_bytes'}, less the MTP layers' {mtp_bytes / GiB:,.2f} GiB (not loaded)",
    )


def _kv_note(q: Quantization, dtype: str) -> tuple[str, ...]:
    """What the quantization config says about the KV cache, and what vLLM makes of it."""
    if q.kv_cache == "scales":
        return (f"quantization_config has a kv_cache_scheme (calibrated fp8 KV scales): vLLM uses them only with "
                f"--kv-cache-dtype fp8; under auto the KV cache stays {dtype} (pass --kv-dtype fp8 to plan it in fp8)",)
    if q.kv_cache == "fp8":
        return (f"quantization_config asks for an fp8 KV cache (ModelOpt kv_cache_quant_algo FP8): vLLM releases since "
                f"December 2025 use it when --kv-cache-dtype is not given; planned in {dtype}: pass --kv-dtype fp8 to "
                "plan it as vLLM runs it",)
    return ()
