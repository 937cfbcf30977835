"""Regenerate ``kvplan/data/model_type_defaults.json`` from transformers' config classes.

kvplan must not import transformers at runtime, yet a config field a ``config.json`` leaves out means
"the default of that model type's transformers config class" (and vLLM loads configs through those
classes). This script writes, for every ``model_type`` transformers knows (``CONFIG_MAPPING``):

- ``role``: ``decoder`` (a causal LM or a multimodal model with a text decoder), ``recurrent`` (a causal
  LM without attention heads: Mamba, RWKV, xLSTM), ``encoder`` (masked-LM / bidirectional encoders),
  ``encoder-decoder``, ``vision``, ``audio``, ``time-series`` or ``other``; kvplan plans only decoders and
  refuses the rest with the role as the reason;
- ``defaults``: the class's declared field defaults (``default_config_fields()``: what ``save_pretrained``
  leaves out of a config.json) for the fields kvplan reads;
- ``aliases``: the class's ``attribute_map`` entries for those fields (``n_head`` -> ``num_attention_heads``);
- ``layer_pattern``: the attention pattern the class derives when a config has no ``layer_types``;
- ``text``: for composite (multimodal) types, the (dotted) key holding the language model's config, its
  default model_type, the keyword arguments transformers uses when that key is absent, and ``flat`` when
  the class then reads the language model's fields from the top level (pre-v5 Qwen2-VL saves).

"The fields kvplan reads" are the quoted identifiers in kvplan's config readers (``kvplan/model/spec.py``,
``kvplan/model/hybrid.py``, ``kvplan/model/model_types.py``) that are a field of some config class, so the table grows
with the parser. Derived defaults (``num_key_value_heads`` = heads, ``head_dim`` = hidden // heads,
``layer_types`` from a pattern) stay kvplan's rules; ``benchmarks/transformers_sweep.py`` checks them.

    python3 benchmarks/gen_model_type_defaults.py           # rewrite the table
    python3 benchmarks/gen_model_type_defaults.py --check   # exit 1 when the committed table is stale
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import sys
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "kvplan" / "data" / "model_type_defaults.json"
READERS = ("spec.py", "hybrid.py", "config_reader.py", "params.py", "layer_variants.py", "model_types.py")

_TEXT_ENCODER_MAPS = ("MASKED_LM", "TEXT_ENCODING", "SEQUENCE_CLASSIFICATION", "TOKEN_CLASSIFICATION",
                      "QUESTION_ANSWERING", "MULTIPLE_CHOICE", "NEXT_SENTENCE_PREDICTION")
_ENCODER_DECODER_MAPS = ("SEQ_TO_SEQ_CAUSAL_LM", "SPEECH_SEQ_2_SEQ", "TEXT_RECOGNITION")
_DECODER_MAPS = ("CAUSAL_LM", "IMAGE_TEXT_TO_TEXT", "MULTIMODAL_LM")
_AUDIO_MAPS = ("AUDIO_CLASSIFICATION", "AUDIO_FRAME_CLASSIFICATION", "AUDIO_XVECTOR", "CTC", "RNNT", "TDT",
               "TEXT_TO_WAVEFORM", "TEXT_TO_SPECTROGRAM")
_TIME_SERIES_MAPS = ("TIME_SERIES_CLASSIFICATION", "TIME_SERIES_PREDICTION", "TIME_SERIES_REGRESSION")
_TEXT_KEYS = ("text_config", "decoder", "generator")  # where get_text_config(decoder=True) looks


def quiet_transformers() -> None:
    """Silence transformers' config warnings (vocabulary / RoPE notices on default configs)."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from transformers.utils import logging as tlogging

    tlogging.set_verbosity_error()


def kvplan_keys(field_names: set[str]) -> list[str]:
    """Config field names kvplan's readers mention (quoted identifiers that are a config class field)."""
    found: set[str] = set()
    for name in READERS:
        path = REPO / "kvplan" / "model" / name
        if path.exists():
            found |= set(re.findall(r'"([a-z_][a-z0-9_]*)"', path.read_text()))
    return sorted((found & field_names) - _SKIP_KEYS)


def _mapping(names: tuple[str, ...]) -> set[str]:
    from transformers.models.auto import modeling_auto

    out: set[str] = set()
    for name in names:
        out |= set(getattr(modeling_auto, f"MODEL_FOR_{name}_MAPPING_NAMES", {}))
    return out


_SKIP_KEYS = {"architectures", "text_config", "vision_config", "dtype", "is_encoder_decoder"}


def _jsonable(value: Any) -> Any:
    """A default as JSON (tuples as lists); ``None`` for values JSON cannot hold (callables, configs)."""
    if callable(value) and not isinstance(value, type):
        try:
            value = value()  # a dataclass default_factory
        except Exception:  # noqa: BLE001 - factory needs arguments: not a plain default
            return None
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, (bool, int, str)) or (isinstance(value, float) and value == value and abs(value) != float("inf")):
        return value
    if isinstance(value, list) and all(_jsonable(v) is not None for v in value):
        return [_jsonable(v) for v in value]
    return None


def _fields(cls: type) -> dict[str, Any]:
    """The class's declared field defaults (``{}`` when transformers cannot resolve them, e.g. ``nougat``)."""
    try:
        return cls.default_config_fields()
    except Exception:  # noqa: BLE001 - a sub-config type transformers itself does not register
        return {}


def _class_defaults(cls: type, keys: list[str]) -> dict[str, Any]:
    fields = _fields(cls)
    out = {}
    for key in keys:
        value = _jsonable(fields.get(key))
        if value is not None:
            out[key] = value
    return out


def _has(config: Any, key: str) -> bool:
    """``hasattr`` that counts transformers' per-layer-only attributes as present."""
    try:
        getattr(config, key)
    except AttributeError:
        return False
    except Exception:  # noqa: BLE001 - AmbiguousGlobalPerLayerAttributeError: it exists, per layer
        return True
    return True


def _instance(cls: type, **kwargs: Any) -> Any:
    """``cls(**kwargs)``, or ``None`` when transformers' validation refuses it."""
    try:
        return cls(**kwargs)
    except Exception:  # noqa: BLE001 - strict validation, unregistered sub-config types
        return None


def _text_path(cls: type, config: Any) -> list[tuple[str, Any]] | None:
    """The sub-config keys (with their SubConfigSpec) from a composite config to its language model."""
    from transformers import PreTrainedConfig

    try:
        target = config.get_text_config(decoder=True)
    except Exception:  # noqa: BLE001 - ambiguous text configs
        return None
    if target is config:
        return None

    def search(cfg: Any, path: list[tuple[str, Any]]) -> list[tuple[str, Any]] | None:
        for key, spec in (getattr(type(cfg), "sub_configs_defaults", None) or {}).items():
            sub = getattr(cfg, key, None)
            if sub is target:
                return path + [(key, spec)]
            if isinstance(sub, PreTrainedConfig):
                found = search(sub, path + [(key, spec)])
                if found:
                    return found
        return None

    return search(config, [])


def _flat(cls: type, config: Any, path: list[tuple[str, Any]]) -> bool:
    """Whether a composite without its text key reads the language model's fields from the top level
    (pre-v5 saves of Qwen2-VL and others)."""
    fields = _fields(cls)
    for key in ("num_hidden_layers", "num_attention_heads"):
        if key in fields or len(path) != 1:
            continue
        probe = _instance(cls, **{key: 3})
        if probe is not None:
            try:
                return getattr(probe.get_text_config(decoder=True), key, None) == 3
            except Exception:  # noqa: BLE001 - per-layer attribute
                return False
    return False


def _text_entry(cls: type, config: Any, keys: list[str]) -> dict[str, Any] | None:
    path = _text_path(cls, config)
    if not path:
        return None
    spec = path[-1][1]
    entry: dict[str, Any] = {"key": ".".join(k for k, _ in path), "model_type": spec.model_type}
    init = {k: _jsonable(v) for k, v in spec.init_kwargs.items() if k in keys and (v is None or _jsonable(v) is not None)}
    if init:
        entry["init"] = init
    if _flat(cls, config, path):
        entry["flat"] = True
    return entry


_PATTERN_LETTERS = {"full_attention": "F", "sliding_attention": "S", "chunked_attention": "C", "linear_attention": "L"}


def _fit(seqs: dict[int, str]) -> dict[str, str] | None:
    """The simplest rule that reproduces every sequence: a pattern of at most 8 layers repeated from the
    first layer (``i % len``) or from the last, possibly with its first one or two layers and its last
    layer forced to other kinds (MiMo-V2-Flash: layer 0 full; Gemma 4: the last layer full). Fitted on 8
    layers and more (some classes special-case tiny models: OLMo-Hybrid forces one full layer)."""
    ref = seqs[max(seqs)]
    for head in range(3):
        for last in ("", "F"):
            for period in range(1, 9):
                pattern = ["?"] * period
                for i in range(head, len(ref) - (1 if last else 0)):
                    pattern[i % period] = ref[i]
                rule = {"pattern": "".join(pattern), "from": "start", "head": ref[:head], "last": last}

                def expected(i: int, n: int) -> str:
                    return ref[i] if i < head else (last if last and i == n - 1 else pattern[i % period])

                if "?" not in pattern and all(all(seq[i] == expected(i, n) for i in range(n))
                                              for n, seq in seqs.items() if n >= 8):
                    return {k: v for k, v in rule.items() if v}
    for period in range(1, 9):
        end = ref[::-1][:period]
        if all(all(seq[i] == end[(n - 1 - i) % period] for i in range(n)) for n, seq in seqs.items() if n >= 8):
            return {"pattern": end, "from": "end"}
    return None


def layer_pattern(cls: type) -> dict[str, str] | None:
    """The layer pattern the class derives when a config has no ``layer_types`` (its defaults otherwise),
    probed with 8..19 layers and fitted by :func:`_fit`; ``None`` when the class keeps no ``layer_types``
    or no simple rule fits."""
    seqs: dict[int, str] = {}
    for n in range(8, 20):
        config = _instance(cls, num_hidden_layers=n)
        try:
            types = getattr(config, "layer_types", None) if config is not None else None
        except Exception:  # noqa: BLE001 - per-layer attribute
            return None
        if not isinstance(types, list) or len(types) != n or any(t not in _PATTERN_LETTERS for t in types):
            return None
        seqs[n] = "".join(_PATTERN_LETTERS[t] for t in types)
    return _fit(seqs)


def _derived_pattern(cls: type, config: Any) -> dict[str, Any]:
    """A hybrid pattern the class derives its layer count from (Nemotron-H: ``num_hidden_layers`` is
    ``len(layers_block_type)``), resolved at the defaults: with no count to follow, the default is exact."""
    if config is None or "num_hidden_layers" in {f.name for f in dataclasses.fields(cls)}:
        return {}
    out = {}
    for key in ("layers_block_type", "hybrid_override_pattern"):
        value = _jsonable(getattr(config, key, None))
        if value is not None and _fields(cls).get(key) is None:
            out[key] = value
    return out


def role_of(model_type: str, cls: type, config: Any, maps: dict[str, set[str]], text_types: dict[str, str]) -> str:
    """What transformers does with a model type (see the module docstring)."""
    fields = _fields(cls)
    if (fields.get("is_encoder_decoder") is True or getattr(config, "is_encoder_decoder", False) is True
            or model_type in maps["encoder-decoder"]):
        return "encoder-decoder"
    if model_type in maps["decoder"] or text_types.get(model_type) == "decoder":
        if model_type in maps["masked"]:
            return "encoder"
        text = config.get_text_config(decoder=True) if config is not None else None
        if text is not None and _has(text, "num_hidden_layers") and not _has(text, "num_attention_heads"):
            return "recurrent"  # Mamba, RWKV, xLSTM: no attention heads at all
        return "decoder"
    if model_type in text_types:
        return text_types[model_type]
    if model_type in maps["encoder"]:
        return "encoder"
    if model_type in maps["audio"]:
        return "audio"
    if model_type in maps["time-series"]:
        return "time-series"
    if model_type in maps["vision"]:
        return "vision"
    return "other"


def all_keys() -> list[str]:
    """The fields kvplan reads that some config class declares (see the module docstring)."""
    from transformers import CONFIG_MAPPING

    classes = [CONFIG_MAPPING[t] for t in CONFIG_MAPPING.keys()]
    field_names = {f.name for cls in classes if dataclasses.is_dataclass(cls) for f in dataclasses.fields(cls)}
    field_names |= {k for cls in classes for k in (cls.attribute_map or {})}
    return kvplan_keys(field_names)


def decoder_entry(model_type: str, keys: list[str], config: Any) -> dict[str, Any]:
    """A decoder's table entry: defaults, aliases, the language model of a composite, the layer pattern."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    entry: dict[str, Any] = {"role": "decoder"}
    aliases = {std: fld for std, fld in sorted((cls.attribute_map or {}).items()) if std in keys or fld in keys}
    defaults = _class_defaults(cls, sorted(set(keys) | set(aliases.values())))
    defaults.update(_derived_pattern(cls, config))
    if defaults:
        entry["defaults"] = defaults
    if aliases:
        entry["aliases"] = aliases
    text = _text_entry(cls, config, keys) if config is not None else None
    if text is not None:
        entry["text"] = text
    else:
        pattern = layer_pattern(cls)
        if pattern is not None:
            entry["layer_pattern"] = pattern
    return entry


def check_entries(model_types: list[str]) -> list[str]:
    """The model types among ``model_types`` whose committed decoder entry differs from transformers'
    (a quick freshness check for tests; ``--check`` compares the whole table)."""
    quiet_transformers()
    from transformers import CONFIG_MAPPING

    committed = json.loads(TABLE.read_text())
    keys = committed["keys"]
    stale = [] if all_keys() == keys else ["<keys>"]
    for t in model_types:
        entry = committed["model_types"].get(t)
        if entry is None or entry["role"] != "decoder" or decoder_entry(t, keys, _instance(CONFIG_MAPPING[t])) != entry:
            stale.append(t)
    return stale


def build_table() -> dict[str, Any]:
    quiet_transformers()
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto

    classes = {t: CONFIG_MAPPING[t] for t in sorted(CONFIG_MAPPING.keys())}
    keys = all_keys()
    all_maps = {n.removeprefix("MODEL_FOR_").removesuffix("_MAPPING_NAMES") for n in dir(modeling_auto)
                if n.startswith("MODEL_FOR_") and n.endswith("_MAPPING_NAMES")}
    other = tuple(sorted(all_maps - set(_DECODER_MAPS + _TEXT_ENCODER_MAPS + _ENCODER_DECODER_MAPS + _AUDIO_MAPS
                                        + _TIME_SERIES_MAPS)))
    maps = {"decoder": _mapping(_DECODER_MAPS), "masked": _mapping(("MASKED_LM",)),
            "encoder": _mapping(_TEXT_ENCODER_MAPS), "encoder-decoder": _mapping(_ENCODER_DECODER_MAPS),
            "audio": _mapping(_AUDIO_MAPS), "time-series": _mapping(_TIME_SERIES_MAPS), "vision": _mapping(other)}
    instances = {t: _instance(cls) for t, cls in classes.items()}
    # sub-config types (gemma3_text, qwen2_5_vl_text, siglip_vision_model...) take the role of where they sit
    text_types: dict[str, str] = {}
    for t, cls in classes.items():
        path = _text_path(cls, instances[t]) if t in maps["decoder"] and instances[t] is not None else None
        if path:
            text_types.setdefault(path[-1][1].model_type, "decoder")
        for key, spec in (getattr(cls, "sub_configs_defaults", None) or {}).items():
            if "vision" in key or "image" in key:
                text_types.setdefault(spec.model_type, "vision")
            elif "audio" in key or "speech" in key:
                text_types.setdefault(spec.model_type, "audio")
    types = {t: decoder_entry(t, keys, instances[t]) if role_of(t, cls, instances[t], maps, text_types) == "decoder"
             else {"role": role_of(t, cls, instances[t], maps, text_types)} for t, cls in classes.items()}
    return {
        "about": ("Generated by benchmarks/gen_model_type_defaults.py from transformers "
                  f"{transformers.__version__}: per model_type, what transformers does with it (role), the "
                  "declared defaults of its config class for the fields kvplan reads, attribute_map aliases, the "
                  "attention pattern it derives without layer_types, and where a composite model keeps its "
                  "language model. Do not edit by hand: rerun the script."),
        "transformers_version": transformers.__version__,
        "keys": keys,
        "model_types": types,
    }


def render(table: dict[str, Any]) -> str:
    """One model type per line: a small diff when transformers changes, still plain JSON."""
    lines = ["{"]
    for key in ("about", "transformers_version", "keys"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(table[key])},")
    lines.append('  "model_types": {')
    items = list(table["model_types"].items())
    for i, (name, entry) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        lines.append(f"    {json.dumps(name)}: {json.dumps(entry, sort_keys=True)}{comma}")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed table differs")
    args = parser.parse_args(argv)
    text = render(build_table())
    if args.check:
        current = TABLE.read_text() if TABLE.exists() else ""
        if current != text:
            print(f"{TABLE.relative_to(REPO)} is stale: rerun python3 benchmarks/gen_model_type_defaults.py",
                  file=sys.stderr)
            return 1
        print(f"{TABLE.relative_to(REPO)} is up to date")
        return 0
    TABLE.write_text(text)
    counts: dict[str, int] = {}
    for entry in json.loads(text)["model_types"].values():
        counts[entry["role"]] = counts.get(entry["role"], 0) + 1
    print(f"wrote {TABLE.relative_to(REPO)}: {sum(counts.values())} model types {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
