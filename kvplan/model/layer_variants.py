"""Layers that differ from a config's uniform description: per-layer overrides, shared and doubled caches.

Called by :mod:`kvplan.model.spec` once the per-layer caches are built from the config's uniform keys:

- ``per_layer_config`` (transformers' heterogeneous configs: ``{"05": {"head_dim": 512}}``) and Gemma 4's
  ``global_head_dim`` / ``num_global_key_value_heads`` give some layers another head_dim, KV-head count or
  window (the full-attention layers of Gemma 4 use head_dim 512);
- ``num_kv_shared_layers`` (Gemma 3n, Gemma 4): the last N layers reuse an earlier layer's cache and own none
  (transformers' ``kv_sharing_modes`` "reuse", vLLM's ``kv_sharing_target_layer_name``);
- LongCat-Flash: every decoder layer holds two attention sublayers, each with its own cache.
"""

from __future__ import annotations

from dataclasses import replace

from kvplan.model.config_reader import ConfigReader
from kvplan.errors import ConfigError
from kvplan.model.modelspec import LayerCache, LayerKind

# fields of a per-layer override that change a layer's cache in ways kvplan does not model
_UNMODELLED_OVERRIDES = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "attention_chunk_size",
                         "layer_types")
_CACHES_PER_DECODER_LAYER = {"longcat_flash": 2}


def per_layer(r: ConfigReader, layers: list[LayerCache], model_type: str, hidden: int) -> list[LayerCache]:
    """``layers`` with per-layer overrides, shared layers and doubled layers applied (see the module doc)."""
    layers = _overrides(r, list(layers), hidden)
    shared = r.int("num_kv_shared_layers", ("num_kv_shared_layers",), required=False, minimum=0) or 0
    if shared:
        if shared > len(layers):
            raise r.fail("num_kv_shared_layers", shared, f"at most num_hidden_layers ({len(layers)})")
        layers = layers[: len(layers) - shared] + [LayerCache(LayerKind.NONE)] * shared
        r.provenance["shared_layers"] = f"{r.prefix}num_kv_shared_layers {shared} (the last layers reuse earlier caches)"
    copies = _CACHES_PER_DECODER_LAYER.get(model_type, 1)
    if copies > 1:
        layers = [layer for layer in layers for _ in range(copies)]
        r.provenance["layer_pattern"] = f"{model_type}: {copies} attention sublayers, each with its cache, per layer"
    if all(layer.kind is LayerKind.NONE for layer in layers):
        raise ConfigError(f"{r.where}: no layer of model_type {model_type!r} keeps a cache of its own (every layer reuses "
                          "another model's KV cache)", "plan the model whose cache it reuses")
    return layers


def _override_table(r: ConfigReader, num_layers: int) -> dict[int, dict]:
    """Layer index -> fields that differ, from ``per_layer_config`` or Gemma 4's global-layer keys."""
    table = r.raw("per_layer_config")
    if table is None:
        if not r.has("global_head_dim") and not r.has("num_global_key_value_heads"):
            return {}
        fields = {"head_dim": r.int("global_head_dim", ("global_head_dim",), required=False)}
        if r.bool("attention_k_eq_v"):  # transformers: the global KV heads apply only with attention_k_eq_v
            fields["num_key_value_heads"] = r.int("num_global_key_value_heads", ("num_global_key_value_heads",),
                                                  required=False)
        r.provenance["per_layer"] = f"{r.prefix}global_head_dim (full-attention layers)"
        return {-1: {k: v for k, v in fields.items() if v is not None}}  # -1: every full-attention layer
    if not isinstance(table, dict):
        raise r.fail("per_layer_config", table, "a mapping of layer index to the fields that differ")
    out: dict[int, dict] = {}
    for key, fields in table.items():
        index = int(key) if isinstance(key, str) and key.isdigit() else None
        if index is None or index >= num_layers or not isinstance(fields, dict):
            raise r.fail(f"per_layer_config.{key}", fields, f"a mapping of fields for a layer index below {num_layers}")
        unmodelled = [k for k in _UNMODELLED_OVERRIDES if k in fields]
        if unmodelled:
            raise ConfigError(f"{r.where}: field {r.prefix}per_layer_config.{key}.{unmodelled[0]} varies per layer, "
                              "which kvplan does not model")
        out[index] = fields
    r.provenance["per_layer"] = f"{r.prefix}per_layer_config"
    return out


def _overrides(r: ConfigReader, layers: list[LayerCache], hidden: int) -> list[LayerCache]:
    table = _override_table(r, len(layers))
    for index, fields in table.items():
        targets = [i for i, layer in enumerate(layers) if layer.kind is LayerKind.FULL] if index < 0 else [index]
        view = ConfigReader(fields, r.where, f"{r.prefix}per_layer_config.{index}.")
        for i in targets:
            layer = layers[i]
            if not layer.caches_tokens or layer.kind is LayerKind.MLA:
                continue
            heads = view.int("num_attention_heads", ("num_attention_heads",), required=False)
            kv = view.int("kv_heads", ("num_key_value_heads",), required=False) or layer.kv_heads
            head_dim = view.int("head_dim", ("head_dim",), required=False)
            if head_dim is None and heads is not None and not r.has("head_dim"):
                head_dim = hidden // heads
            window = view.int("sliding_window", ("sliding_window",), required=False) if layer.window_tokens else None
            layers[i] = replace(layer, kv_heads=kv, head_dim=head_dim or layer.head_dim,
                                window_tokens=window or layer.window_tokens)
    return layers
