"""Hybrid models: attention layers interleaved with state layers (Mamba, gated delta net, ...).

Called by :mod:`kvplan.spec` with its config reader; returns per-layer caches, or ``None`` when the
config describes an attention-only model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from kvplan.errors import ConfigError

if TYPE_CHECKING:
    from kvplan.spec import LayerCache, Overrides, _Reader

_HYBRID_MARKERS = ("attn_layer_period", "hybrid_override_pattern", "mamba_d_state", "mamba_d_ssm", "layers_block_type",
                   "linear_num_value_heads", "full_attention_interval", "ssm_cfg", "mamba_n_heads")


def hybrid_layers(r: "_Reader", config: Mapping[str, Any], num_layers: int, model_type: str, num_heads: int,
                  hidden: int, overrides: "Overrides") -> "list[LayerCache] | None":
    """Per-layer caches of a hybrid model, or ``None`` when no state layers are described."""
    types = r.raw("layer_types")
    has_state_types = isinstance(types, list) and any(t in ("linear_attention", "mamba", "mamba2") for t in types)
    if not has_state_types and not any(r.has(key) for key in _HYBRID_MARKERS):
        return None
    raise ConfigError(f"{r.where}: hybrid model_type {model_type!r} (state layers) is not supported yet")
