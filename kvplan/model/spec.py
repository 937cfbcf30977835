"""Hugging Face config -> :class:`ModelSpec`: what each decoder layer caches per request.

This module (with :mod:`kvplan.model.hybrid` for attention + state hybrids and :mod:`kvplan.model.params` for parameter
counts, all reading through :class:`~kvplan.model.config_reader.ConfigReader`) is where Hugging Face key names
(``num_key_value_heads``, ``n_head_kv``, ``layer_types``, ``kv_lora_rank``, ``text_config``...) are known.
It normalises a config once, at the boundary, and records where each value came from so output can say
"kv_heads 8 (num_key_value_heads)".

The data types (:class:`ModelSpec`, :class:`LayerCache`, :class:`LayerKind`) live in :mod:`kvplan.model.modelspec`
and are re-exported here. The byte formulas live in :mod:`kvplan.memory`, never here.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any, Mapping

from kvplan.model import checkpoint, hybrid, layer_variants, model_types, rope_vision
from kvplan.model.config_reader import (KV_HEAD_KEYS, ConfigReader, Overrides, derived_head_dim, first_int, short_repr,
                                  unmodelled_layer_type)
from kvplan.errors import ConfigError
from kvplan.limits import MAX_LAYERS, MAX_PARAMETERS
from kvplan.model.source import ModelSource, WeightFacts
from kvplan.model.modelspec import STATE_KINDS, TOKEN_KINDS, LayerCache, LayerGroup, LayerKind, ModelSpec
from kvplan.model.params import (TIED_BY_DEFAULT, expert_layer_ids, inventory, layer_parameters, mla_dims, mtp_layers,
                                 parameter_count, quant_method, shared_expert_size)
from kvplan.units import plural

__all__ = ["STATE_KINDS", "TOKEN_KINDS", "LayerCache", "LayerGroup", "LayerKind", "ModelSpec", "Overrides",
           "build_spec", "spec_from_config"]


# ---------------------------------------------------------------------------------------------
# reading configs


_DTYPE_KEYS = ("torch_dtype", "dtype")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")

# Defaults that transformers' config classes fill in when a config omits a key (absent, not null);
# vLLM loads configs through those classes and relies on them, so we must too. Keyed by model_type.
_MODEL_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
        "num_hidden_layers": 26, "num_attention_heads": 8, "hidden_size": 2304, "intermediate_size": 9216,
        "vocab_size": 262208, "max_position_embeddings": 131072, "tie_word_embeddings": True,
    },
    "gemma2": {"sliding_window": 4096, "head_dim": 256, "tie_word_embeddings": True},
    "mistral": {"sliding_window": 4096},  # MistralConfig's default: every layer slides unless null
    "gpt_oss": {"sliding_window": 128},
    "llama4_text": {"attention_chunk_size": 8192, "no_rope_layer_interval": 4, "head_dim": 128},
    "qwen3_next": {"full_attention_interval": 4},
    # Gemma 4's global (full-attention) layers: a keyword transformers pops with this default, not a field
    "gemma4_text": {"global_head_dim": 512}, "gemma4_unified_text": {"global_head_dim": 512},
    "diffusion_gemma_text": {"global_head_dim": 512},
}
# A nested text_config without its own model_type takes the text model type of its parent.
_NESTED_MODEL_TYPES = {"gemma3": "gemma3_text", "llama4": "llama4_text", "qwen2_5_vl": "qwen2_5_vl_text",
                       "mistral3": "mistral"}


_DTYPE_NAMES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}


def _text_config(config: Mapping[str, Any], where: str) -> tuple[dict[str, Any], str, frozenset[str]]:
    """The language model's config (following ``text_config``/``llm_config``) with model-type defaults.

    A missing field takes the default of that model type's transformers config class
    (:mod:`kvplan.model.model_types`); a nested config without a model_type takes its parent's default text
    model type, and a composite config without its language model's key gets the one transformers
    builds. An explicit ``null`` stays null (as in transformers, where ``sliding_window: null`` turns
    Mistral's default window off). Returns the merged config, the key prefix for messages, and the keys
    that came from defaults (provenance says so).
    """
    top = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    entry = model_types.lookup(top) if top else None
    composite = entry.text if entry else None
    text, prefix, init = config, "", None
    if composite is not None:
        text, prefix = _nested(config, composite.key, where)
        if not prefix:  # no language-model config: transformers builds its default (pre-v5: from the top level)
            text, init = ({} if not composite.flat else config), composite.init
    for key in ("text_config", "llm_config", "language_config"):
        if prefix or composite is not None:
            break
        text, prefix = _nested(config, key, where)
    model_type = text.get("model_type") if text is not config else None
    if text is config and composite is None:
        model_type = top
    if not isinstance(model_type, str) or not model_type:
        if composite is not None:
            model_type = composite.model_type
        elif prefix and top:
            model_type = _NESTED_MODEL_TYPES.get(top, top)
    merged = dict(_MODEL_TYPE_DEFAULTS.get(str(model_type or ""), {}))
    merged.update(model_types.with_defaults(text, str(model_type or ""), init))
    entry = model_types.lookup(str(model_type or ""))
    given = set(text) | {std for std, name in (entry.aliases.items() if entry else ()) if name in text}
    derived = model_types.derive(merged, str(model_type or ""))
    merged.update(derived)
    given -= set(derived)
    if isinstance(model_type, str) and model_type:
        merged["model_type"] = model_type
    if text is not config:
        for key in _DTYPE_KEYS:  # the checkpoint dtype usually sits at the top level
            if merged.get(key) is None and config.get(key) is not None:
                merged[key] = config[key]
                given.add(key)
    return merged, prefix, frozenset(merged) - given - {"model_type"}


def _nested(config: Mapping[str, Any], path: str, where: str) -> tuple[Mapping[str, Any], str]:
    """The sub-config at a dotted ``path`` (``thinker_config.text_config``) and its prefix, else the config."""
    node: Any = config
    for i, key in enumerate(path.split(".")):
        node = node.get(key) if isinstance(node, Mapping) else None
        if node is None:
            return config, ""
        if not isinstance(node, dict):
            name = ".".join(path.split(".")[: i + 1])
            raise ConfigError(f"{where}: field {name} = {short_repr(node)} is invalid: expected a mapping")
    return node, path + "."


def _pattern_length(r: ConfigReader) -> int | None:
    """The layer count a per-layer pattern implies when a config gives no count (transformers 5 writes
    Nemotron-H's ``layers_block_type`` and derives ``num_hidden_layers`` from it)."""
    for key in ("layer_types", "layers_block_type", "hybrid_override_pattern"):
        value = r.raw(key)
        if isinstance(value, (list, str)) and value:
            if len(value) > MAX_LAYERS:
                raise r.fail(key, f"<{len(value):,} entries>", f"at most {plural(MAX_LAYERS, 'layer')}")
            r.provenance["num_layers"] = f"len({r.prefix}{key})"
            return len(value)
    return None


_SAFETENSORS_FLOATS = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float32"}


def _model_dtype(r: ConfigReader, weights: WeightFacts | None) -> str:
    """The checkpoint's dtype: the config's ``torch_dtype``/``dtype``; else, as vLLM reads it, the one float
    dtype of the safetensors tensors (float32 when they mix dtypes or nothing says)."""
    for key in _DTYPE_KEYS:
        value = r.raw(key)
        if value is None:
            continue
        if not isinstance(value, str) or value.lower().removeprefix("torch.") not in _DTYPE_NAMES:
            raise r.fail(key, value, "one of float32, bfloat16, float16")
        r.provenance["dtype"] = r.prefix + key
        return _DTYPE_NAMES[value.lower().removeprefix("torch.")]
    stored = {_SAFETENSORS_FLOATS.get(d.upper(), "float32") for d in (weights.params_by_dtype if weights else {})}
    if len(stored) == 1:
        r.provenance["dtype"] = f"no torch_dtype in config: the safetensors tensors' dtype ({weights.source if weights else ''})"
        return stored.pop()
    r.provenance["dtype"] = "no torch_dtype in config: float32, as transformers and vLLM read it"
    return "float32"


def _pattern_layer_kinds(r: ConfigReader, num_layers: int, model_type: str) -> list[str]:
    """Per-layer ``"full"``/``"sliding"``/``"chunked"``/``"linear_attention"``/``"mamba"`` from the config's pattern keys."""
    types = r.str_list("layer_types", num_layers)
    if types is not None:
        mapping = {
            "full_attention": "full", "attention": "full", "global": "full", "global_attention": "full",
            "sliding_attention": "sliding", "sliding_window": "sliding", "local": "sliding", "local_attention": "sliding",
            "chunked_attention": "chunked", "mlp": "none", "moe": "none", "dummy": "none",
            "linear_attention": "linear_attention", "mamba": "mamba", "mamba2": "mamba",
        }
        unknown = sorted({t for t in types if t not in mapping})
        if unknown:
            raise unmodelled_layer_type(r, "layer_types", unknown[0], sorted(mapping))
        r.provenance["layer_pattern"] = r.prefix + "layer_types"
        return [mapping[t] for t in types]

    window = r.raw("sliding_window")
    if window == 0:  # vLLM: a window of 0 means no sliding window
        window = None
        r.provenance["layer_pattern"] = r.prefix + "sliding_window = 0 (off)"
        return ["full"] * num_layers
    if r.has("use_sliding_window") and not r.bool("use_sliding_window"):
        r.provenance["layer_pattern"] = r.prefix + "use_sliding_window = false"
        return ["full"] * num_layers

    kinds = _sliding_pattern(r, num_layers, model_type) if window is not None else None
    if kinds is not None:
        return kinds

    chunk = r.raw("attention_chunk_size")
    if chunk is not None:
        no_rope = r.int_list("no_rope_layers", num_layers)
        if no_rope is None:
            interval = r.int("no_rope_layer_interval", ("no_rope_layer_interval",), default=4)
            no_rope = [int((i + 1) % interval != 0) for i in range(num_layers)]
        r.provenance["layer_pattern"] = r.prefix + "attention_chunk_size + no_rope_layers (NoPE layers global)"
        return ["chunked" if flag else "full" for flag in no_rope]

    derived = model_types.layer_pattern(model_type, num_layers)
    if derived is not None and "linear" not in derived and (window is not None or "sliding" not in derived):
        r.provenance["layer_pattern"] = f"{model_type} default pattern (transformers' config class)"
        return derived
    if window is not None:
        r.provenance["layer_pattern"] = r.prefix + "sliding_window (every layer)"
        return ["sliding"] * num_layers
    r.provenance["layer_pattern"] = "every layer full attention"
    return ["full"] * num_layers


def _sliding_pattern(r: ConfigReader, num_layers: int, model_type: str) -> list[str] | None:
    """Which layers slide, for a config with a ``sliding_window`` (None: no pattern key says)."""
    pattern = r.raw("sliding_window_pattern")
    if isinstance(pattern, str):
        if not pattern or set(pattern.upper()) - {"L", "G"}:
            raise r.fail("sliding_window_pattern", pattern, "a string of L (local) and G (global)")
        r.provenance["layer_pattern"] = r.prefix + "sliding_window_pattern"
        p = pattern.upper()
        return ["sliding" if p[i % len(p)] == "L" else "full" for i in range(num_layers)]
    if pattern is not None:
        period = r.int("sliding_window_pattern", ("sliding_window_pattern",))
        r.provenance["layer_pattern"] = r.prefix + f"sliding_window_pattern (every {period}th layer global)"
        return ["sliding" if (i + 1) % period else "full" for i in range(num_layers)]

    if model_type == "gpt_oss":
        r.provenance["layer_pattern"] = "gpt_oss: even layers sliding, odd layers full"
        return ["sliding" if i % 2 == 0 else "full" for i in range(num_layers)]

    if model_type == "gemma2":
        r.provenance["layer_pattern"] = "gemma2: even layers sliding, odd layers global"
        return ["sliding" if i % 2 == 0 else "full" for i in range(num_layers)]

    if r.has("use_sliding_window") and r.bool("use_sliding_window"):
        max_window_layers = r.int("max_window_layers", ("max_window_layers",), default=0, minimum=0)
        r.provenance["layer_pattern"] = r.prefix + "use_sliding_window + max_window_layers"
        return ["sliding" if i >= max_window_layers else "full" for i in range(num_layers)]
    return None


def _mla_layers(r: ConfigReader, num_layers: int, overrides: Overrides) -> list[LayerCache]:
    """MLA (DeepSeek V2/V3, Kimi K2): one ``kv_lora_rank + qk_rope_head_dim`` latent per token in every layer."""
    rank = r.int("kv_lora_rank", ("kv_lora_rank",))
    rope = r.int("qk_rope_head_dim", ("qk_rope_head_dim",))
    r.provenance["kv_heads"] = "MLA: one latent per token (num_key_value_heads is not the cache width)"
    r.provenance["head_dim"] = f"MLA: {r.prefix}kv_lora_rank {rank} + {r.prefix}qk_rope_head_dim {rope}"
    dim = overrides.head_dim or rank + rope
    types = r.str_list("layer_types", num_layers) or ["full_attention"] * num_layers
    other = sorted(set(types) - {"full_attention", "attention", "indexed_attention"})
    if other:
        raise ConfigError(f"{r.where}: field {r.prefix}layer_types has {other[0]!r} layers next to MLA layers, "
                          "which kvplan does not model (it plans MLA models whose every layer caches the latent)")
    if r.has("per_layer_config"):
        raise ConfigError(f"{r.where}: field {r.prefix}per_layer_config varies the MLA layers, which kvplan does not "
                          "model")
    return [LayerCache(LayerKind.MLA, kv_heads=1, head_dim=dim, tp_shardable=False)] * num_layers


def _kv_heads(r: ConfigReader, model_type: str, num_heads: int, overrides: Overrides) -> int:
    """KV heads of the attention layers: ``--kv-heads``, Falcon's ``num_kv_heads``, ``multi_query``, the
    KV-head keys, else the attention heads (MHA); never more than the attention heads."""
    if overrides.kv_heads:
        kv_heads = overrides.kv_heads
        r.provenance["kv_heads"] = "--kv-heads"
    elif model_type in ("falcon", "RefinedWeb", "RefinedWebModel") and r.bool("new_decoder_architecture"):
        kv_heads = r.int("kv_heads", ("num_kv_heads", "n_head_kv", "num_key_value_heads"))
    elif r.bool("multi_query"):
        kv_heads = 1
        r.provenance["kv_heads"] = r.prefix + "multi_query = true"
    else:
        kv_heads = r.int("kv_heads", KV_HEAD_KEYS, required=False)
        if kv_heads is None:
            kv_heads = num_heads
            r.provenance["kv_heads"] = f"{r.provenance.get('num_attention_heads', 'num_attention_heads')} (no KV-head key: MHA)"
    if kv_heads > num_heads and not overrides.kv_heads:
        raise r.fail(r.provenance["kv_heads"].removeprefix(r.prefix), kv_heads, f"at most num_attention_heads ({num_heads})")
    return kv_heads


# Low-rank (MLA-style) attention whose K and V vLLM caches expanded, not as the latent: vLLM 0.32 treats only the
# DeepSeek family as MLA (ModelArchConfigConvertor.is_deepseek_mla) and runs MiniCPM3 as plain attention.
_EXPANDED_MLA_TYPES = {"minicpm3"}


def _expanded_mla_layers(r: ConfigReader, num_layers: int, num_heads: int, overrides: Overrides) -> list[LayerCache]:
    """MiniCPM3: every head's K and V of ``qk_nope_head_dim + qk_rope_head_dim`` (V padded to it) per token."""
    nope = r.int("qk_nope_head_dim", ("qk_nope_head_dim",))
    rope = r.int("qk_rope_head_dim", ("qk_rope_head_dim",))
    assert nope is not None and rope is not None
    r.provenance["kv_heads"] = f"{r.provenance.get('num_attention_heads', 'num_attention_heads')} (K and V expanded)"
    r.provenance["head_dim"] = (f"{r.prefix}qk_nope_head_dim {nope} + {r.prefix}qk_rope_head_dim {rope} (vLLM caches "
                                "MiniCPM3's K and V expanded, not the MLA latent)")
    return [LayerCache(LayerKind.FULL, num_heads, overrides.head_dim or nope + rope)] * num_layers


def _attention_layers(r: ConfigReader, num_layers: int, model_type: str, num_heads: int, hidden: int,
                      overrides: Overrides) -> list[LayerCache]:
    """Per-layer caches for attention-only (dense, GQA/MQA, sliding, chunked, MLA) models."""
    if r.raw("kv_lora_rank") is not None and model_type in _EXPANDED_MLA_TYPES and not overrides.kv_heads:
        return _expanded_mla_layers(r, num_layers, num_heads, overrides)
    if r.raw("kv_lora_rank") is not None and not overrides.kv_heads:
        return _mla_layers(r, num_layers, overrides)

    block_configs = r.raw("block_configs")
    if block_configs is not None and not overrides.kv_heads:
        return _nas_layers(r, block_configs, num_layers, num_heads, hidden, overrides)

    kv_heads = _kv_heads(r, model_type, num_heads, overrides)
    if overrides.head_dim:
        head_dim = overrides.head_dim
        r.provenance["head_dim"] = "--head-dim"
    elif r.has("head_dim"):
        head_dim = r.int("head_dim", ("head_dim",))
    else:
        head_dim = derived_head_dim(r, hidden, num_heads)

    kinds = _pattern_layer_kinds(r, num_layers, model_type)
    window = None
    if "sliding" in kinds:
        window = r.int("sliding_window", ("sliding_window",))
    chunk = r.int("attention_chunk_size", ("attention_chunk_size",)) if "chunked" in kinds else None
    unsupported = sorted(set(kinds) - {"full", "sliding", "chunked", "none"})
    if unsupported:
        raise ConfigError(
            f"{r.where}: layer kind {unsupported[0]!r} needs state-layer dims this config does not give",
            "hybrid state layers need their mamba_*/linear_* keys",
        )
    full = LayerCache(LayerKind.FULL, kv_heads, head_dim)
    sliding = LayerCache(LayerKind.SLIDING, kv_heads, head_dim, window_tokens=window)
    chunked = LayerCache(LayerKind.CHUNKED, kv_heads, head_dim, window_tokens=chunk)
    by_name = {"full": full, "sliding": sliding, "chunked": chunked, "none": LayerCache(LayerKind.NONE)}
    return [by_name[k] for k in kinds]


# transformers' MllamaVisionConfig defaults, for a vision_config that leaves them out
_VISION_DEFAULTS = {"image_size": 448, "patch_size": 14, "max_num_tiles": 4}


def _cross_attention(r: ConfigReader, config: Mapping[str, Any], layers: list[LayerCache]) -> str:
    """Turn the ``cross_attention_layers`` (Llama-3.2-Vision / mllama) into cross-attention caches, in place.

    They cache the request's image tokens, not its text tokens: per image, ``max_num_tiles`` tiles of
    ``(image_size // patch_size)^2 + 1`` tokens (patches and a class token), as vLLM's mllama processor
    counts them (``calc_token_per_chunk``). Returns the note that states the assumption.
    """
    indices = r.int_list("cross_attention_layers")
    assert indices is not None
    if not indices or any(i < 0 or i >= len(layers) for i in indices) or len(set(indices)) != len(indices):
        raise r.fail("cross_attention_layers", indices, f"distinct layer indices in 0..{len(layers) - 1}")
    vision = config.get("vision_config")
    if vision is not None and not isinstance(vision, dict):
        raise ConfigError(f"{r.where}: field vision_config = {short_repr(vision)} is invalid: expected a mapping")
    v = ConfigReader({**_VISION_DEFAULTS, **(vision or {})}, r.where, "vision_config.")
    size, patch, tiles = (v.int(k, (k,)) for k in ("image_size", "patch_size", "max_num_tiles"))
    assert size is not None and patch is not None and tiles is not None
    per_tile = (size // patch) ** 2 + 1
    per_image = tiles * per_tile
    for i in indices:
        self_layer = layers[i]
        layers[i] = LayerCache(LayerKind.CROSS, self_layer.kv_heads, self_layer.head_dim, window_tokens=per_image)
    r.provenance["cross_attention"] = (f"{r.prefix}cross_attention_layers ({plural(len(indices), 'layer')}); image tokens "
                                       f"{tiles} x ((vision_config.image_size {size} // patch_size {patch})^2 + 1)")
    return (f"cross-attention layers ({len(indices)} of {len(layers)}: cross_attention_layers) cache the request's "
            f"image tokens, not its text tokens: assumed 1 image x {tiles} tiles (vision_config.max_num_tiles) x "
            f"{plural(per_tile, 'token')} per tile ((image_size {size} / patch_size {patch})^2 + 1 class token) = "
            f"{plural(per_image, 'token')} per request; --images N for N cross-attended images. Engines: SGLang serves "
            "mllama; vLLM served it up to 0.10.2 (V0 engine) and dropped it in 0.11")


def _nas_layers(r: ConfigReader, block_configs: Any, num_layers: int, num_heads: int, hidden: int,
                overrides: Overrides) -> list[LayerCache]:
    """Nemotron-NAS (DeciLM) layers: ``block_configs[i].attention`` is a no-op (caches nothing) or keeps
    ``num_attention_heads // n_heads_in_group`` KV heads, so layers may differ in KV heads."""
    if not isinstance(block_configs, list) or len(block_configs) != num_layers:
        raise r.fail("block_configs", block_configs, f"a list of {num_layers} per-layer mappings")
    head_dim = overrides.head_dim or r.int("head_dim", ("head_dim",), required=False)
    if head_dim is None:
        head_dim = derived_head_dim(r, hidden, num_heads)
    layers: list[LayerCache] = []
    for i, block in enumerate(block_configs):
        attention = block.get("attention") if isinstance(block, dict) else None
        if not isinstance(attention, dict):
            raise r.fail(f"block_configs[{i}].attention", attention, "a mapping")
        no_op = attention.get("no_op", False)
        if not isinstance(no_op, bool):
            raise r.fail(f"block_configs[{i}].attention.no_op", no_op, "true or false")
        if no_op:
            layers.append(LayerCache(LayerKind.NONE))
            continue
        group = attention.get("n_heads_in_group")
        if isinstance(group, bool) or not isinstance(group, int) or group < 1 or num_heads % group:
            raise r.fail(f"block_configs[{i}].attention.n_heads_in_group", group,
                          f"a positive divisor of num_attention_heads ({num_heads})")
        layers.append(LayerCache(LayerKind.FULL, num_heads // group, head_dim))
    r.provenance["kv_heads"] = (f"{r.prefix}num_attention_heads // {r.prefix}block_configs[i].attention.n_heads_in_group "
                                "(no_op layers cache nothing)")
    r.provenance["layer_pattern"] = r.prefix + "block_configs"
    return layers


_ENCODER_DECODER_TYPES = {"t5", "mt5", "bart", "mbart", "pegasus", "marian", "whisper", "umt5", "longt5"}


def spec_from_config(
    config: Mapping[str, Any],
    *,
    model_id: str,
    where: str,
    weights: WeightFacts | None = None,
    overrides: Overrides = Overrides(),
) -> ModelSpec:
    """Normalise a Hugging Face ``config.json`` dict into a :class:`ModelSpec`.

    ``where`` names the file in error messages. Raises :class:`ConfigError` naming the field and value
    for anything it cannot interpret; never guesses silently.
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(config).__name__}")
    text, prefix, defaulted = _text_config(config, where)
    r = ConfigReader(text, where, prefix, defaulted)
    model_type = r.str("model_type", "") or ""
    _refuse_unplannable(r, config, model_type)
    architectures = config.get("architectures")
    arch = architectures[0] if isinstance(architectures, list) and architectures and isinstance(architectures[0], str) else model_type
    num_layers, num_heads, hidden = _shape(r, overrides)

    layers = hybrid.hybrid_layers(r, config, num_layers, model_type, num_heads, hidden, overrides)
    if layers is None:
        layers = _attention_layers(r, num_layers, model_type, num_heads, hidden, overrides)
    layers = layer_variants.per_layer(r, layers, model_type, hidden)
    cross_note = _cross_attention(r, config, layers) if r.has("cross_attention_layers") else None

    spec = ModelSpec(
        model_id=model_id,
        source=where,
        architecture=str(arch),
        model_type=model_type,
        layers=tuple(layers),
        dtype=_model_dtype(r, weights),
        hidden_size=hidden,
        num_attention_heads=num_heads,
        weights=weights,
        notes=tuple(_notes(r, config, layers, cross_note)),
        decoder_layers=num_layers if len(layers) != num_layers else 0,
        **_sizes(r, hidden),
    )
    tied = r.bool("tie_word_embeddings", default=model_type in TIED_BY_DEFAULT)
    tensors = inventory(spec, r)
    loaded, weight_notes = checkpoint.engine_weights(config, where, weights, tensors, spec.dtype)
    parameters = _bounded_parameters(r, parameter_count(loaded, tensors), spec)
    return replace(spec, weights=loaded, parameters=parameters, notes=spec.notes + weight_notes,
                   embedding_parameters=spec.vocab_size * hidden * (1 if tied else 2),
                   routed_expert_layers=len(expert_layer_ids(spec, r)), provenance=MappingProxyType(dict(r.provenance)),
                   rotary_caches=rope_vision.rotary_caches(r, layers, spec.max_position_embeddings),
                   rope_scaling=rope_vision.rope_scaling(r),
                   vision=rope_vision.vision_encoder(config, where),
                   mtp_layers=mtp_layers(r), mtp_parameters=sum(t.parameters for t in tensors if t.mtp),
                   shared_expert_size=shared_expert_size(spec, r), quant_method=quant_method(r), mla_dims=mla_dims(r),
                   weights_format=checkpoint.weights_format(config, where, spec.dtype),
                   layer_parameters=layer_parameters(tensors, spec.num_layers_decoder),
                   expert_layer_ids=expert_layer_ids(spec, r), tied_embeddings=tied)


def _bounded_parameters(r: ConfigReader, parameters: int | None, spec: ModelSpec) -> int | None:
    """The parameter count, or a ConfigError past :data:`~kvplan.limits.MAX_PARAMETERS` (fields each within
    their bound can still multiply to an absurd model)."""
    if parameters is not None and parameters > MAX_PARAMETERS:
        raise ConfigError(f"{r.where}: the config describes {parameters:,} parameters ({plural(len(spec.layers), 'layer')}, "
                          f"{r.prefix}hidden_size {spec.hidden_size:,}, intermediate_size {spec.intermediate_size:,}, "
                          f"vocab_size {spec.vocab_size:,}, {spec.num_experts:,} experts): at most {MAX_PARAMETERS:,}",
                          "check the sizes for a typo")
    return parameters


def _refuse_unplannable(r: ConfigReader, config: Mapping[str, Any], model_type: str) -> None:
    """ConfigError for what kvplan does not plan: encoders, encoder-decoders, recurrent (RG-LRU) blocks."""
    top_type = config.get("model_type") if isinstance(config.get("model_type"), str) else model_type
    role = model_types.role(top_type)
    if role not in (None, "decoder", "encoder-decoder"):
        raise ConfigError(f"{r.where}: model_type {top_type!r} is {model_types.REFUSALS[role]}",
                          "kvplan plans the KV cache of decoder (causal LM) models")
    if top_type in _ENCODER_DECODER_TYPES or role == "encoder-decoder" or r.bool("is_encoder_decoder"):
        raise ConfigError(
            f"{r.where}: model_type {top_type!r} is an encoder-decoder model; kvplan plans decoder-only KV caches",
            "its cross-attention cache depends on the encoder length, which kvplan does not model",
        )
    blocks = r.raw("block_types")
    if isinstance(blocks, list) and "recurrent" in blocks:
        raise ConfigError(f"{r.where}: model_type {model_type!r} has recurrent (RG-LRU) blocks in {r.prefix}block_types, "
                          "which kvplan does not model", "kvplan plans attention KV caches and Mamba / gated-delta-net states")


def _shape(r: ConfigReader, overrides: Overrides) -> tuple[int, int, int]:
    """``(decoder layers, attention heads, hidden size)``; ``--kv-heads`` and ``--head-dim`` together
    stand in for a config without heads or hidden size."""
    num_layers = overrides.num_layers or r.int("num_layers", _LAYER_KEYS, required=False) or _pattern_length(r)
    if overrides.num_layers:
        r.provenance["num_layers"] = "--layers"
    if num_layers is None:
        num_layers = r.int("num_layers", _LAYER_KEYS)  # raises: names the keys it looked for
    described = bool(overrides.kv_heads and overrides.head_dim)  # the overrides alone describe the cache
    num_heads = r.int("num_attention_heads", _HEAD_KEYS, required=not described) or overrides.kv_heads
    hidden = r.int("hidden_size", _HIDDEN_KEYS, required=not described) or (
        (overrides.kv_heads or 0) * (overrides.head_dim or 0))
    assert num_layers is not None and num_heads is not None and hidden is not None
    return num_layers, num_heads, hidden


def _sizes(r: ConfigReader, hidden: int) -> dict[str, Any]:
    """The MLP, vocabulary, position and expert sizes (the :class:`ModelSpec` fields of the same names)."""
    intermediate = first_int(r, "intermediate_size", ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")) \
        or 4 * hidden
    num_experts = r.int("num_experts", ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts"),
                        required=False, minimum=0) or 0
    top_k = r.int("num_experts_per_token", ("num_experts_per_tok", "moe_topk", "num_experts_per_token", "top_k"),
                  required=False, minimum=0) or 0
    if num_experts and top_k > num_experts:  # every engine's router refuses it (topk over fewer experts)
        raise ConfigError(f"{r.where}: field {r.provenance['num_experts_per_token']} = {top_k} is invalid: "
                          f"a token cannot be routed to more experts than the "
                          f"{r.provenance['num_experts']} = {num_experts} there are")
    return {
        "intermediate_size": intermediate,
        "vocab_size": r.int("vocab_size", ("vocab_size", "padded_vocab_size"), required=False) or 0,
        "max_position_embeddings": r.int("max_position_embeddings", ("max_position_embeddings", "n_positions",
                                                                     "max_sequence_length", "seq_length", "n_ctx"),
                                         required=False),
        "num_experts": num_experts,
        "num_experts_per_token": top_k,
        "moe_intermediate_size": first_int(r, "moe_intermediate_size", ("moe_intermediate_size",
                                                                        "expert_intermediate_size"), minimum=0)
        or (intermediate if num_experts else 0),
    }


def _notes(r: ConfigReader, config: Mapping[str, Any], layers: list[LayerCache], cross_note: str | None) -> list[str]:
    """What the reader should know about this config: multimodal parts, MTP, chunked and state layers."""
    notes: list[str] = []
    encoder = rope_vision.vision_encoder(config, r.where)
    if encoder is not None:
        where = f" ({r.prefix.rstrip('.')})" if r.prefix else ""
        batch = "a dummy image or video batch" if encoder.max_video_frames else "a dummy image batch"
        notes.append(f"multimodal config: the language model{where} is planned; the vision encoder's "
                     f"weights are in the checkpoint, and vLLM's profile run of it ({batch}) in the activation (SGLang keeps "
                     "it in 1 - mem_fraction_static)")
    elif r.prefix:
        notes.append(f"multimodal config: the language model ({r.prefix.rstrip('.')}) is planned; vision encoder memory "
                     "is not modelled")
    elif isinstance(config.get("vision_config"), dict):
        notes.append("multimodal config: the language model is planned; the vision encoder (vision_config) and its "
                     "memory are not modelled")
    if cross_note:
        notes.append(cross_note)
    if mtp_layers(r):
        notes.append(f"multi-token-prediction (MTP) layers ({r.provenance['num_mtp_layers']} = {mtp_layers(r)}): vLLM "
                     "and SGLang load them only for speculative decoding (as the draft; the model's own "
                     "load_weights skips them), so they are left out of the weights, the active parameters and the KV cache")
    if any(layer.kind is LayerKind.CHUNKED for layer in layers):
        notes.append("chunked local attention: in vLLM a request holds at most chunk + max_num_batched_tokens "
                     "tokens in the chunked layers (0.32 keeps its hybrid KV manager on for them by default; with "
                     "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0 they are allocated like full attention); "
                     "SGLang's pool holds every token of a request in them, as in full layers")
    if any(layer.is_state for layer in layers):
        ssm = {layer.ssm_dtype for layer in layers if layer.is_state}
        notes.append("state layers: conv state in the model dtype, SSM state in "
                     + ", ".join(sorted(d or "the model dtype" for d in ssm))
                     + (" (the config's)" if any(ssm) else " (the config sets none)"))
    return notes


def build_spec(source: ModelSource, overrides: Overrides = Overrides()) -> ModelSpec:
    """The :class:`ModelSpec` for a resolved model source."""
    return spec_from_config(
        source.config, model_id=source.model_id, where=source.location, weights=source.weights, overrides=overrides
    )
