"""Typed reads from a Hugging Face config dict, with provenance and one-line errors.

:class:`ConfigReader` is what :mod:`kvplan.model.spec`, :mod:`kvplan.model.hybrid` and :mod:`kvplan.model.params` read config
values through: each read checks the type and range (a sizing field must be a finite integer; ``Infinity``
and ``NaN`` are only acceptable in fields kvplan does not read), records which key the value came from, and
raises :class:`~kvplan.errors.ConfigError` naming the file, the field and the value.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from kvplan.errors import ConfigError
from kvplan.limits import CONFIG_MAXIMA, MAX_CONFIG_INT
from kvplan.frozen import frozen

KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num", "n_kv_heads")


class ConfigReader:
    """Reads typed values from a config dict, recording provenance, raising ConfigError on bad values."""

    def __init__(self, config: Mapping[str, Any], where: str, prefix: str = "",
                 defaulted: frozenset[str] = frozenset()) -> None:
        self.config = config
        self.where = where
        self.prefix = prefix
        self.defaulted = defaulted  # keys the file leaves out, filled with the model type's class default
        self.provenance: dict[str, str] = {}

    def source(self, key: str) -> str:
        """Where ``key``'s value comes from: ``text_config.head_dim`` or ``head_dim (gemma default)``."""
        model_type = self.config.get("model_type")
        return f"{self.prefix}{key}" + (f" ({model_type} default)" if key in self.defaulted else "")

    def fail(self, key: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"{self.where}: field {self.prefix}{key} = {short_repr(value)} is invalid: expected {expected}")

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def raw(self, key: str) -> Any:
        return self.config.get(key)

    def int(self, name: str, keys: tuple[str, ...], *, default: int | None = None, minimum: int = 1,
            required: bool = True) -> int | None:
        # a key the file gives wins over one the model type's defaults filled in (a Qwen3-MoE file's
        # num_experts over the class default of num_local_experts)
        for key in [k for k in keys if k not in self.defaulted] + [k for k in keys if k in self.defaulted]:
            value = self.config.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.fail(key, value, f"an integer >= {minimum}")
            if not math.isfinite(value):  # Infinity / NaN: fine in fields kvplan ignores, never in a size
                raise self.fail(key, value, f"a finite integer >= {minimum} (this field sizes the cache or weights)")
            most = CONFIG_MAXIMA.get(name, MAX_CONFIG_INT)
            if value != int(value) or value < minimum or value > most:
                raise self.fail(key, value, f"an integer from {minimum} to {most:,}")
            self.provenance[name] = self.source(key)
            return int(value)
        if default is not None or not required:
            if default is not None:
                self.provenance[name] = "default"
            return default
        raise ConfigError(
            f"{self.where}: config is missing {name} (looked for {', '.join(self.prefix + k for k in keys)})",
            f"pass --{_OVERRIDABLE[name]} to override" if name in _OVERRIDABLE else
            "describe the cache with --layers, --kv-heads and --head-dim",
        )

    def bool(self, key: str, default: bool = False) -> bool:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, value, "true or false")
        return value

    def str(self, key: str, default: str | None = None) -> str | None:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.fail(key, value, "a string")
        return value

    def int_list(self, key: str, length: int | None = None) -> list[int] | None:
        value = self.config.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.fail(key, value, "a list of integers")
        if length is not None and len(value) != length:
            raise self.fail(key, f"<list of {len(value)}>", f"a list of {length} entries (one per layer)")
        return value

    def str_list(self, key: str, length: int | None = None) -> list[str] | None:
        value = self.config.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, value, "a list of strings")
        if length is not None and len(value) != length:
            raise self.fail(key, f"<list of {len(value)}>", f"a list of {length} entries (one per layer)")
        return value


def derived_head_dim(r: ConfigReader, hidden: int, num_heads: int) -> int:
    """``hidden_size // num_attention_heads`` when a config gives no head_dim (floor division, as transformers'
    attention modules and vLLM's ``get_head_size`` compute it), with its provenance. More heads than
    hidden units (a head_dim of 0) is an error naming the fields."""
    if hidden < num_heads:
        raise ConfigError(f"{r.where}: {r.prefix}hidden_size {hidden} // {r.prefix}num_attention_heads {num_heads} "
                          "gives a head_dim of 0", "give head_dim explicitly or fix the two fields")
    if hidden % num_heads:
        r.provenance["head_dim"] = (f"{r.prefix}hidden_size // {r.prefix}num_attention_heads = {hidden} // {num_heads} "
                                    "(rounded down, as transformers and vLLM do)")
    else:
        r.provenance["head_dim"] = f"{r.prefix}hidden_size // {r.prefix}num_attention_heads = {hidden} // {num_heads}"
    return hidden // num_heads


def first_int(r: ConfigReader, name: str, keys: tuple[str, ...], *, minimum: int = 1) -> int | None:
    """An optional integer that some configs give per layer or per modality as a list (Gemma 3n's
    ``intermediate_size``, ERNIE 4.5 VL's ``moe_intermediate_size`` [text, vision]): the first entry."""
    for key in keys:
        value = r.raw(key)
        if isinstance(value, list) and value:
            view = ConfigReader({key: value[0]}, r.where, r.prefix)
            out = view.int(name, (key,), minimum=minimum)
            r.provenance[name] = f"{r.prefix}{key}[0] (first of a list)"
            return out
        if value is not None:
            return r.int(name, (key,), minimum=minimum)
    return None


# Layer types transformers knows that kvplan does not size, and why (the error says so).
UNMODELLED_LAYER_TYPES = {
    "indexed_attention": "sparse attention with an indexer key cache (DeepSeek sparse attention) outside MLA",
    "compressed_sparse_attention": "compressed sparse attention (DeepSeek V4)",
    "heavily_compressed_attention": "compressed attention (DeepSeek V4)",
    "hybrid": "attention and a linear-attention state in one layer",
    "hybrid_sliding": "sliding attention and a linear-attention state in one layer",
    "reference_sliding_attention": "sliding attention over reference tokens",
    "conv": "short-convolution state layers (LFM)",
}


def unmodelled_layer_type(r: ConfigReader, key: str, value: str, known: list[str]) -> ConfigError:
    """The error for a per-layer type kvplan cannot size: why, when transformers knows the type."""
    why = UNMODELLED_LAYER_TYPES.get(value)
    if why is None:
        return r.fail(key, value, "one of " + ", ".join(known))
    return ConfigError(f"{r.where}: field {r.prefix}{key} has {value!r} layers: {why}, which kvplan does not model",
                       "kvplan plans full, sliding, chunked and MLA attention, Mamba and gated-delta-net states")


_OVERRIDABLE = {"num_layers": "layers", "kv_heads": "kv-heads", "head_dim": "head-dim"}


@frozen
class Overrides:
    """``--layers/--kv-heads/--head-dim``: replace what the config says (or supply what it lacks)."""

    num_layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None

    def any(self) -> bool:
        return any(v is not None for v in (self.num_layers, self.kv_heads, self.head_dim))


def short_repr(value: Any) -> str:
    """``repr`` of a config value, cut to a readable length for error messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
