"""Serving engines: how much of a GPU's memory an engine gives the KV cache, and its other rules.

An engine model turns (spec, GPU, options) into a :class:`Budget` whose every term is shown and can
be overridden, plus the engine's defaults (utilisation, block size, batching limits), plus the rules
that decide what a request holds and whether the engine starts.

Two engines are modelled: :mod:`kvplan.engines.vllm` (the default; several releases, selectable by
``--engine-version``) and :mod:`kvplan.engines.sglang`. Each module is an :class:`Engine` (the
interface below); :func:`kvplan.engines.registry.engine` finds one by name. Nothing outside this
package asks which engine it is: it asks the engine. Any PEP 440 version string (``0.19.0``,
``0.15.2rc1.dev93+g11a4c9d30``) maps to the modelled release whose range covers it
(:func:`resolve_release`). The derivations and their sources are in docs/engines.md.

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits, kvplan.io, kvplan.gpus, kvplan.options, kvplan.model, kvplan.memory
"""

from __future__ import annotations

from kvplan.options import USAGE_CONTEXTS as USAGE_CONTEXTS  # re-exported for the engine modules
from kvplan.engines.releases import (
    release_ranges as release_ranges,
    release_tuple as release_tuple,
    resolve_release as resolve_release,
)
from kvplan.engines.forward import (
    DEFAULT_SM_COUNT as DEFAULT_SM_COUNT,
    KEPT_MOE_RULES as KEPT_MOE_RULES,
    MLA_PREFILL_RULES as MLA_PREFILL_RULES,
    MOE_RULES as MOE_RULES,
    dense_forward_bytes_per_token as dense_forward_bytes_per_token,
    forward_bytes as forward_bytes,
    forward_parts as forward_parts,
    forward_bytes_per_token as forward_bytes_per_token,
    lora_stack_bytes as lora_stack_bytes,
    mla_prefill_bytes_per_token as mla_prefill_bytes_per_token,
    moe_forward_bytes as moe_forward_bytes,
    moe_workspace_elements as moe_workspace_elements,
    padded_vocab as padded_vocab,
    routes_experts as routes_experts,
    sampler_bytes as sampler_bytes,
    sampler_peak_bytes as sampler_peak_bytes,
)
from kvplan.engines.terms import (
    Budget as Budget,
    Device as Device,
    EngineDefaults as EngineDefaults,
    Features as Features,
    GIVEN_SOURCES as GIVEN_SOURCES,
    Term as Term,
    given as given,
)
from kvplan.engines.launch import (
    CHECKPOINT_QUANTIZATION as CHECKPOINT_QUANTIZATION,
    Launch as Launch,
    ONLINE_QUANTIZATION as ONLINE_QUANTIZATION,
    kv_cache_dtype_spelling as kv_cache_dtype_spelling,
    launch_flags as launch_flags,
    quantization_weights as quantization_weights,
    what_if_kv_dtype as what_if_kv_dtype,
)
from kvplan.engines.interface import (
    Engine as Engine,
    ModelLength as ModelLength,
    length_refusal as length_refusal,
    scaled_length as scaled_length,
)


# ---------------------------------------------------------------------------------------------
# engine versions -> modelled releases

# ---------------------------------------------------------------------------------------------
# the activation estimate shared by the engine models


