"""Hybrid models: attention layers interleaved with state layers (Mamba, gated delta net, ...).

Called by :mod:`kvplan.model.spec` with its config reader; returns per-layer caches, or ``None`` when the
config describes an attention-only model. State sizes follow vLLM's ``MambaStateShapeCalculator``:

- Mamba1 (Jamba): conv ``(k - 1) x inner``, SSM ``inner x state`` with ``inner = mamba_expand x hidden``;
- Mamba2 (Nemotron-H, Granite 4, Falcon-H1): conv ``(k - 1) x (inner + 2 x n_groups x state)``,
  SSM ``heads x head_dim x state``;
- gated delta net (Qwen3-Next): conv ``(k - 1) x (2 x k_heads x k_dim + v_heads x v_dim)``,
  SSM ``v_heads x v_dim x k_dim``.

The conv state is kept in the model dtype; the SSM state's dtype recorded here is the config's own
(``mamba_ssm_cache_dtype`` / ``mamba_ssm_dtype``), ``None`` when it names none. Which dtype an engine stores
it in (whether it reads that key, its defaults per release, ``--ssm-dtype``) is the engine's rule
(``Engine.ssm_dtype``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping

from kvplan.model import model_types
from kvplan.model.config_reader import KV_HEAD_KEYS, ConfigReader, Overrides, derived_head_dim, unmodelled_layer_type
from kvplan.errors import ConfigError, InputError
from kvplan.model.modelspec import LayerCache, LayerKind

_HYBRID_MARKERS = ("attn_layer_period", "attn_layer_indices", "hybrid_override_pattern", "mamba_d_state", "mamba_d_ssm", "layers_block_type",
                   "linear_num_value_heads", "full_attention_interval", "ssm_cfg", "mamba_n_heads", "mamba_num_heads")
_STATE_TYPES = {"linear_attention", "mamba", "mamba2"}
_SSM_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def state_elements(state_kind: str, dims: tuple[int, ...], tp: int = 1) -> tuple[int, int]:
    """``(conv_elements, ssm_elements)`` one tensor-parallel rank holds for one request.

    Mirrors vLLM: Mamba2 groups that tp does not divide are replicated up to tp groups
    (``extra_groups_for_head_shards``); every sharded dimension must divide by tp.
    """

    def div(value: int, what: str) -> int:
        if value % tp:
            raise InputError(f"--tp {tp} does not divide the {state_kind} layers' {what} ({value})",
                             "use a tp that divides it: the engine splits it over the tp ranks")
        return value // tp

    if state_kind == "mamba1":
        inner, state, kernel, _dt_rank = dims
        return (kernel - 1) * div(inner, "inner size"), div(inner, "inner size") * state
    if state_kind == "mamba2":
        heads, head_dim, groups, state, kernel, inner = dims
        if groups % tp:
            groups = tp  # n_groups + (tp - n_groups): each rank gets a copy of the groups its heads need
        return (kernel - 1) * div(inner + 2 * groups * state, "conv width"), div(heads, "heads") * head_dim * state
    if state_kind == "gated_delta_net":
        k_heads, v_heads, k_dim, v_dim, kernel = dims
        conv = 2 * k_heads * k_dim + v_heads * v_dim
        return (kernel - 1) * div(conv, "conv width"), div(v_heads, "value heads") * v_dim * k_dim
    raise AssertionError(f"unknown state kind {state_kind!r}")


def hybrid_layers(r: ConfigReader, config: Mapping[str, Any], num_layers: int, model_type: str, num_heads: int,
                  hidden: int, overrides: Overrides) -> list[LayerCache] | None:
    """Per-layer caches of a hybrid model, or ``None`` when no state layers are described."""
    types = r.raw("layer_types")
    if types is None:
        types = r.raw("layers_block_type")
    has_state_types = isinstance(types, list) and any(isinstance(t, str) and t in _STATE_TYPES for t in types)
    derived = model_types.layer_pattern(model_type, num_layers) if types is None else None
    if not has_state_types and not any(r.has(key) for key in _HYBRID_MARKERS) and "linear" not in (derived or ()):
        return None

    kinds = _layer_kinds(r, num_layers, model_type)  # "attention" / "mamba1" / "mamba2" / "gdn" / "none" / "both"
    state = _state_cache(r, model_type, hidden, {k for k in kinds if k not in ("attention", "sliding", "none")})
    attention = (_attention_cache(r, num_heads, hidden, overrides) if {"attention", "sliding", "both"} & set(kinds)
                 else None)
    layers: list[LayerCache] = []
    for kind in kinds:
        if kind == "attention":
            layers.append(attention)
        elif kind == "sliding":  # a sliding-window attention layer of a hybrid (its window from sliding_window)
            window = r.int("sliding_window", ("sliding_window",))
            layers.append(replace(attention, kind=LayerKind.SLIDING, window_tokens=window))
        elif kind == "none":
            layers.append(LayerCache(LayerKind.NONE))
        elif kind == "both":  # parallel hybrid (Falcon-H1): attention and mamba in every decoder layer
            layers.extend((attention, state))
        else:
            layers.append(state)
    if not any(layer.kind is not LayerKind.NONE and not layer.is_state for layer in layers):
        raise ConfigError(f"{r.where}: model_type {model_type!r} has no attention layer (attention-free state model)",
                          "kvplan plans paged attention caches; pure Mamba/linear models are not modelled")
    return layers


def _layer_kinds(r: ConfigReader, num_layers: int, model_type: str) -> list[str]:
    """Per-layer kinds from the config's pattern keys (see the module docstring for the families)."""
    if model_type == "falcon_h1":
        r.provenance["layer_pattern"] = "falcon_h1: attention and mamba2 side by side in every layer"
        return ["both"] * num_layers
    pattern = r.raw("hybrid_override_pattern")
    if pattern is not None:
        if not isinstance(pattern, str) or set(pattern) - set("M*-E") or len(pattern) != num_layers:
            raise r.fail("hybrid_override_pattern", pattern,
                          f"a string of {num_layers} characters from M (mamba2), * (attention), - (MLP), E (MoE)")
        r.provenance["layer_pattern"] = r.prefix + "hybrid_override_pattern"
        return [{"M": "mamba2", "*": "attention"}.get(c, "none") for c in pattern]
    for key in ("layer_types", "layers_block_type"):
        types = r.raw(key)
        if types is None:
            continue
        names = r.str_list(key, num_layers)
        assert names is not None
        state = _state_kind(r, model_type)
        mapping = {"attention": "attention", "full_attention": "attention", "sliding_attention": "sliding",
                   "mamba": state, "mamba2": "mamba2",
                   "linear_attention": state, "mlp": "none", "moe": "none", "dummy": "none"}
        unknown = sorted({t for t in names if t not in mapping})
        if unknown:
            raise unmodelled_layer_type(r, key, unknown[0], sorted(mapping))
        r.provenance["layer_pattern"] = r.prefix + key
        return [mapping[t] for t in names]
    if r.has("attn_layer_indices") or model_type == "bamba":  # Bamba: attention at these indices, mamba2 elsewhere
        indices = r.int_list("attn_layer_indices") or []
        r.provenance["layer_pattern"] = r.prefix + "attn_layer_indices"
        return ["attention" if i in indices else "mamba2" for i in range(num_layers)]
    if r.has("attn_layer_period"):
        period = r.int("attn_layer_period", ("attn_layer_period",))
        offset = r.int("attn_layer_offset", ("attn_layer_offset",), default=0, minimum=0)
        assert period is not None and offset is not None
        r.provenance["layer_pattern"] = r.prefix + f"attn_layer_period {period} / attn_layer_offset {offset}"
        state = "mamba1" if model_type == "jamba" or not r.has("mamba_n_heads") else "mamba2"
        return ["attention" if i % period == offset else state for i in range(num_layers)]
    derived = model_types.layer_pattern(model_type, num_layers)
    if derived is not None and "linear" in derived and not r.has("full_attention_interval"):
        state = _state_kind(r, model_type)
        r.provenance["layer_pattern"] = f"{model_type} default pattern (transformers' config class)"
        return [{"full": "attention", "sliding": "sliding", "linear": state}.get(k, k) for k in derived]
    if r.has("full_attention_interval") or r.has("linear_num_value_heads"):
        interval = r.int("full_attention_interval", ("full_attention_interval",), default=4)
        assert interval is not None
        r.provenance["layer_pattern"] = r.prefix + f"full_attention_interval {interval} (every {interval}th layer full)"
        return ["attention" if (i + 1) % interval == 0 else "gdn" for i in range(num_layers)]
    raise ConfigError(f"{r.where}: model_type {model_type!r} has state-layer keys but no layer pattern",
                      "expected layer_types, layers_block_type, hybrid_override_pattern or attn_layer_period")


_MAMBA_KEYS = ("mamba_n_heads", "mamba_num_heads", "mamba_d_state", "ssm_state_size", "mamba_d_ssm", "mamba_expand")


def _state_kind(r: ConfigReader, model_type: str) -> str:
    """Which state a config's ``linear_attention`` / ``mamba`` layers keep; refuses kinds kvplan cannot size."""
    if model_type.startswith("qwen3_next") or r.has("linear_num_value_heads"):
        return "gdn"
    if model_type == "jamba":
        return "mamba1"
    if any(r.has(key) for key in _MAMBA_KEYS):
        return "mamba2"
    raise ConfigError(f"{r.where}: model_type {model_type!r} has linear-attention layers whose state kvplan cannot size",
                      "kvplan models Mamba1, Mamba2 and gated-delta-net (Qwen3-Next) states")


def _ssm_dtype(r: ConfigReader) -> str | None:
    for key in ("mamba_ssm_cache_dtype", "mamba_ssm_dtype"):
        value = r.raw(key)
        if value is None or value == "auto":
            continue
        if not isinstance(value, str) or value.removeprefix("torch.") not in _SSM_DTYPES:
            raise r.fail(key, value, "one of " + ", ".join(_SSM_DTYPES))
        r.provenance["ssm_dtype"] = r.prefix + key
        return _SSM_DTYPES[value.removeprefix("torch.")]
    return None


def _state_cache(r: ConfigReader, model_type: str, hidden: int, kinds: set[str]) -> LayerCache | None:
    """The one state-layer cache of this model (hybrids use a single state layout)."""
    if not kinds:
        return None
    if len(kinds - {"both"}) > 1:
        raise ConfigError(f"{r.where}: mixed state-layer kinds {sorted(kinds)} in one model are not supported")
    kind = next(iter(kinds))
    need = lambda name, keys: r.int(name, keys)  # noqa: E731 - raises naming the missing key
    ssm_dtype = _ssm_dtype(r)
    if kind == "mamba1":
        expand = need("mamba_expand", ("mamba_expand", "expand"))
        state = need("mamba_d_state", ("mamba_d_state", "state_size"))
        kernel = need("mamba_d_conv", ("mamba_d_conv", "conv_kernel"))
        dt_rank = r.raw("mamba_dt_rank")  # "auto" (or absent): ceil(hidden / 16), as in transformers
        dt = math.ceil(hidden / 16) if dt_rank in (None, "auto") else r.int("mamba_dt_rank", ("mamba_dt_rank",))
        dims = (expand * hidden, state, kernel, dt)
        name, layer_kind = "mamba1", LayerKind.MAMBA
    elif kind == "gdn":
        dims = (need("linear_num_key_heads", ("linear_num_key_heads",)),
                need("linear_num_value_heads", ("linear_num_value_heads",)),
                need("linear_key_head_dim", ("linear_key_head_dim",)),
                need("linear_value_head_dim", ("linear_value_head_dim",)),
                need("linear_conv_kernel_dim", ("linear_conv_kernel_dim",)))
        name, layer_kind = "gated_delta_net", LayerKind.LINEAR
    else:  # mamba2 (Nemotron-H, Granite 4, Falcon-H1, Bamba)
        heads = need("mamba_n_heads", ("mamba_n_heads", "mamba_num_heads"))
        groups = need("mamba_n_groups", ("mamba_n_groups", "n_groups"))
        state = need("mamba_d_state", ("mamba_d_state", "ssm_state_size"))
        kernel = need("mamba_d_conv", ("mamba_d_conv", "conv_kernel"))
        if model_type.startswith("nemotron_h"):
            head_dim = need("mamba_d_head", ("mamba_head_dim", "mamba_d_head"))
            inner = heads * head_dim  # vLLM: mamba_num_heads x mamba_head_dim
        else:
            d_ssm = r.int("mamba_d_ssm", ("mamba_d_ssm",), required=False) if model_type == "falcon_h1" else None
            expand = r.int("mamba_expand", ("mamba_expand",), default=2)
            assert expand is not None
            inner = d_ssm or expand * hidden  # vLLM: mamba_expand x hidden_size (Falcon-H1: mamba_d_ssm if set)
            head_dim = r.int("mamba_d_head", ("mamba_d_head",), required=False) if r.raw("mamba_d_head") != "auto" else None
            head_dim = head_dim or inner // heads
        dims = (heads, head_dim, groups, state, kernel, inner)
        name, layer_kind = "mamba2", LayerKind.MAMBA
    conv, ssm = state_elements(name, dims)
    if conv <= 0 or ssm <= 0:
        raise ConfigError(f"{r.where}: {name} state dims {dims} give an empty state")
    return LayerCache(layer_kind, conv_elements=conv, ssm_elements=ssm, state_kind=name, ssm_dtype=ssm_dtype,
                      state_dims=dims)


def _attention_cache(r: ConfigReader, num_heads: int, hidden: int, overrides: Overrides) -> LayerCache:
    """The full-attention layer of a hybrid (GQA; head_dim from the config or hidden // heads)."""
    kv_heads = overrides.kv_heads or r.int("kv_heads", KV_HEAD_KEYS, required=False) or num_heads
    if overrides.head_dim:
        head_dim = overrides.head_dim
    else:
        head_dim = r.int("head_dim", ("head_dim", "attention_head_dim"), required=False)
        if head_dim is None:
            head_dim = derived_head_dim(r, hidden, num_heads)
    if kv_heads > num_heads and not overrides.kv_heads:
        raise r.fail("num_key_value_heads", kv_heads, f"at most num_attention_heads ({num_heads})")
    return LayerCache(LayerKind.FULL, kv_heads, head_dim)
