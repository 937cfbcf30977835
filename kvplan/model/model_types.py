"""What transformers' config class for a ``model_type`` implies, without importing transformers.

A config.json written by ``save_pretrained`` leaves out every field equal to its class default, and
vLLM reads configs through those classes, so a missing field means "that class's default" (PaliGemma's
``text_config`` with ``model_type: gemma`` and no ``head_dim`` has Gemma's head_dim 256, not
hidden // heads). ``kvplan/data/model_type_defaults.json`` holds, per model_type transformers knows:
its role (decoder, encoder, encoder-decoder, vision, audio, ...), its class's declared defaults for the
fields kvplan reads, its ``attribute_map`` aliases (``n_head`` is ``num_attention_heads`` for gpt2), and
where a composite model keeps its language model. The file is generated from transformers by
``benchmarks/gen_model_type_defaults.py``; ``benchmarks/transformers_sweep.py`` checks kvplan against it.
"""

from __future__ import annotations

import json
from dataclasses import field
from kvplan.frozen import frozen
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "model_type_defaults.json"

# Why kvplan refuses a model type, by the role transformers gives it (decoders are planned).
REFUSALS = {
    "recurrent": ("an attention-free recurrent model (Mamba, RWKV, xLSTM...): it keeps a fixed state per "
                  "request, no KV cache, and kvplan plans paged attention caches"),
    "encoder": "an encoder-only (bidirectional) model: it keeps no KV cache while serving",
    "encoder-decoder": "an encoder-decoder model; kvplan plans decoder-only KV caches",
    "vision": "a vision model with no text decoder: it keeps no KV cache",
    "audio": "an audio model with no text decoder: it keeps no KV cache",
    "time-series": "a time-series model with no text decoder: it keeps no KV cache",
    "other": "not a text decoder (transformers has no causal-LM class for it): it keeps no KV cache",
}


@frozen
class TextConfig:
    """Where a composite (multimodal) config keeps its language model."""

    key: str  # "text_config", or a dotted path ("thinker_config.text_config")
    model_type: str  # the model_type a nested dict without one takes
    init: Mapping[str, Any] = field(default_factory=dict)  # what transformers builds when the key is absent
    flat: bool = False  # without the key, the language model's fields sit at the top level (pre-v5 saves)


@frozen
class ModelType:
    """One model_type's entry (see the module docstring)."""

    name: str
    role: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)  # standard name -> the class's field name
    text: TextConfig | None = None
    layer_pattern: Mapping[str, str] | None = None  # {"pattern": "SSSSSF", "from": "start"}: kinds without layer_types


@lru_cache(maxsize=1)
def _table() -> Mapping[str, Any]:
    return json.loads(DATA_FILE.read_text(encoding="utf-8"))["model_types"]


@lru_cache(maxsize=None)
def lookup(model_type: str) -> ModelType | None:
    """The entry for ``model_type``, or ``None`` when transformers does not know it (custom code)."""
    entry = _table().get(model_type)
    if entry is None:
        return None
    text, pattern = entry.get("text"), entry.get("layer_pattern")
    return ModelType(
        name=model_type,
        role=entry["role"],
        defaults=MappingProxyType(entry.get("defaults", {})),
        aliases=MappingProxyType(entry.get("aliases", {})),
        text=TextConfig(text["key"], text["model_type"], MappingProxyType(text.get("init", {})),
                        bool(text.get("flat"))) if text else None,
        layer_pattern=MappingProxyType(pattern) if pattern else None,
    )


def role(model_type: str) -> str | None:
    """``decoder``, ``encoder``, ``encoder-decoder``, ``vision``, ``audio``, ``time-series``, ``other``; None if unknown."""
    entry = lookup(model_type)
    return entry.role if entry else None


def refusal(model_type: str) -> str | None:
    """Why kvplan cannot plan this model type (its transformers role), or ``None`` when it can."""
    entry = lookup(model_type)
    return REFUSALS.get(entry.role) if entry else None


_PATTERN_KINDS = {"F": "full", "S": "sliding", "C": "chunked", "L": "linear"}


def layer_pattern(model_type: str, num_layers: int) -> list[str] | None:
    """``full``/``sliding``/``chunked``/``linear`` per layer as the model type's class derives them when a
    config has no ``layer_types``, or ``None`` if it has no such rule.

    The rule repeats a pattern from the first layer (or from the last, ``"from": "end"``); ``head`` forces
    the first layers and ``last`` the last layer to other kinds (MiMo-V2-Flash: layer 0 full; Gemma 4:
    the last layer full).
    """
    entry = lookup(model_type)
    if entry is None or entry.layer_pattern is None:
        return None
    rule = entry.layer_pattern
    pattern, head, last = rule["pattern"], rule.get("head", ""), rule.get("last", "")
    at = (lambda i: i) if rule["from"] == "start" else (lambda i: num_layers - 1 - i)  # noqa: E731
    letters = [pattern[at(i) % len(pattern)] for i in range(num_layers)]
    letters[: len(head)] = head[:num_layers]
    if last and letters:
        letters[-1] = last
    return [_PATTERN_KINDS[c] for c in letters]


def _olmo_hybrid(c: Mapping[str, Any]) -> dict[str, Any]:
    heads, hidden = c["num_attention_heads"], c["hidden_size"]
    key_heads = c.get("linear_num_key_heads") or heads
    key_dim = c.get("linear_key_head_dim") or int(0.75 * hidden / key_heads)
    return {"linear_num_key_heads": key_heads, "linear_num_value_heads": heads, "linear_key_head_dim": key_dim,
            "linear_value_head_dim": 2 * key_dim}


def _hrm_text(c: Mapping[str, Any]) -> dict[str, Any]:
    if c.get("num_layers_per_stack") is not None:
        return {}
    per_stack = c["num_hidden_layers"]  # a config without num_layers_per_stack gives the per-stack count
    return {"num_layers_per_stack": per_stack,
            "num_hidden_layers": per_stack * c.get("H_cycles", 2) * (c.get("L_cycles", 3) + 1)}


# Fields transformers' classes compute in __post_init__ from others (a table of defaults cannot hold them).
_DERIVED: dict[str, Any] = {
    "dbrx": lambda c: {"num_key_value_heads": (c.get("attn_config") or {}).get("kv_n_heads", 1)},
    "jetmoe": lambda c: {"num_attention_heads": c["num_key_value_heads"] * c["num_experts_per_tok"]},
    "mllama_text_model": lambda c: {"cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38]},
    "modernbert-decoder": lambda c: {"sliding_window": c["local_attention"] // 2} if c.get("local_attention") else {},
    "olmo_hybrid": _olmo_hybrid,
}
_REWRITTEN = {"hrm_text": _hrm_text}  # these replace a given value (HRM: num_hidden_layers counts every cycle)


def derive(config: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """Fields the model type's class derives in ``__post_init__`` (DBRX's KV heads from ``attn_config``,
    JetMoE's query heads, OLMo-Hybrid's linear-attention dims, HRM's layers per cycle, mllama's
    cross-attention layers): the values to set,
    only for keys the config leaves out (HRM rewrites ``num_hidden_layers``). Malformed inputs derive
    nothing; the reader then names the bad field."""
    rule, rewrite = _DERIVED.get(model_type), _REWRITTEN.get(model_type)
    try:
        out = {k: v for k, v in (rule(config) if rule else {}).items() if config.get(k) is None}
        out.update(rewrite(config) if rewrite else {})
    except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError):
        return {}
    return out


def with_defaults(config: Mapping[str, Any], model_type: str, init: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``config`` as transformers' class for ``model_type`` reads it.

    Keys the config does not have at all take the class default (then ``init``, a composite's keyword
    arguments for an absent sub-config); an explicit ``null`` stays null. Aliased fields are readable
    under both names (gpt2: ``n_head`` and ``num_attention_heads``); a standard name in the file sets the
    class's field, as transformers' ``__setattr__`` does.
    """
    entry = lookup(model_type)
    if entry is None:
        return dict(config)
    given = {**(init or {}), **config}
    for standard, name in entry.aliases.items():
        if standard in given:
            given[name] = given.pop(standard)
    merged = {**entry.defaults, **given}
    for standard, name in entry.aliases.items():
        if name in merged:
            merged[standard] = merged[name]
    return merged
