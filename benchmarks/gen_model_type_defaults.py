"""Regenerate ``kvplan/data/model_type_defaults.json`` from transformers' config classes.

kvplan must not import transformers at runtime, yet a config field a ``config.json`` leaves out means
"the default of that model type's transformers config class" (and vLLM loads configs through those
classes). This script writes, for every ``model_type`` transformers knows (``CONFIG_MAPPING``):

- ``role``: ``decoder`` (a causal LM or a multimodal model with a text decoder), ``encoder`` (masked-LM /
  bidirectional encoders), ``encoder-decoder``, ``vision``, ``audio``, ``time-series`` or ``other``;
  kvplan plans only decoders and refuses the rest with the role as the reason;
- ``defaults``: the class's declared field defaults (``default_config_fields()``: what ``save_pretrained``
  leaves out of a config.json) for the fields kvplan reads;
- ``aliases``: the class's ``attribute_map`` entries for those fields (``n_head`` -> ``num_attention_heads``);
- ``text``: for composite (multimodal) types, the key holding the language model's config, its default
  model_type and the keyword arguments transformers uses when that key is absent.

"The fields kvplan reads" are the quoted identifiers in kvplan's config readers (``kvplan/spec.py``,
``kvplan/hybrid.py``, ``kvplan/model_types.py``) that are a field of some config class, so the table grows
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
READERS = ("spec.py", "hybrid.py", "config_reader.py", "params.py", "model_types.py")

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
        path = REPO / "kvplan" / name
        if path.exists():
            found |= set(re.findall(r'"([a-z_][a-z0-9_]*)"', path.read_text()))
    return sorted(found & field_names)


def _mapping(names: tuple[str, ...]) -> set[str]:
    from transformers.models.auto import modeling_auto

    out: set[str] = set()
    for name in names:
        out |= set(getattr(modeling_auto, f"MODEL_FOR_{name}_MAPPING_NAMES", {}))
    return out


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


def _text_sub_config(cls: type) -> tuple[str, Any] | None:
    """``(key, SubConfigSpec)`` of a composite config's language model, or ``None``."""
    specs = getattr(cls, "sub_configs_defaults", None) or {}
    for key in _TEXT_KEYS:
        if key in specs:
            return key, specs[key]
    return None


def role_of(model_type: str, cls: type, maps: dict[str, set[str]], text_types: dict[str, str]) -> str:
    """What transformers does with a model type (see the module docstring)."""
    fields = _fields(cls)
    if fields.get("is_encoder_decoder") is True or model_type in maps["encoder-decoder"]:
        return "encoder-decoder"
    if model_type in maps["decoder"]:
        return "encoder" if model_type in maps["masked"] else "decoder"
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


def build_table() -> dict[str, Any]:
    quiet_transformers()
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto

    classes = {t: CONFIG_MAPPING[t] for t in sorted(CONFIG_MAPPING.keys())}
    field_names = {f.name for cls in classes.values() if dataclasses.is_dataclass(cls) for f in dataclasses.fields(cls)}
    field_names |= {k for cls in classes.values() for k in (cls.attribute_map or {})}
    keys = kvplan_keys(field_names)
    all_maps = {n.removeprefix("MODEL_FOR_").removesuffix("_MAPPING_NAMES") for n in dir(modeling_auto)
                if n.startswith("MODEL_FOR_") and n.endswith("_MAPPING_NAMES")}
    other = tuple(sorted(all_maps - set(_DECODER_MAPS + _TEXT_ENCODER_MAPS + _ENCODER_DECODER_MAPS + _AUDIO_MAPS
                                        + _TIME_SERIES_MAPS)))
    maps = {"decoder": _mapping(_DECODER_MAPS), "masked": _mapping(("MASKED_LM",)),
            "encoder": _mapping(_TEXT_ENCODER_MAPS), "encoder-decoder": _mapping(_ENCODER_DECODER_MAPS),
            "audio": _mapping(_AUDIO_MAPS), "time-series": _mapping(_TIME_SERIES_MAPS), "vision": _mapping(other)}
    # sub-config types (gemma3_text, qwen2_5_vl_text, siglip_vision_model...) take the role of where they sit
    text_types: dict[str, str] = {}
    for t, cls in classes.items():
        for key, spec in (getattr(cls, "sub_configs_defaults", None) or {}).items():
            sub = spec.model_type
            if key in _TEXT_KEYS and t in maps["decoder"]:
                text_types.setdefault(sub, "decoder")
            elif "vision" in key or "image" in key:
                text_types.setdefault(sub, "vision")
            elif "audio" in key or "speech" in key:
                text_types.setdefault(sub, "audio")
    types: dict[str, Any] = {}
    for t, cls in classes.items():
        entry: dict[str, Any] = {"role": role_of(t, cls, maps, text_types)}
        if entry["role"] == "decoder":
            defaults = _class_defaults(cls, keys)
            if defaults:
                entry["defaults"] = defaults
            aliases = {std: fld for std, fld in sorted((cls.attribute_map or {}).items())
                       if std in keys or fld in keys}
            if aliases:
                entry["aliases"] = aliases
            sub = _text_sub_config(cls)
            if sub is not None:
                key, spec = sub
                text = {"key": key, "model_type": spec.model_type}
                init = {k: v for k in keys if (v := _jsonable(spec.init_kwargs.get(k))) is not None}
                if init:
                    text["init"] = init
                entry["text"] = text
        types[t] = entry
    return {
        "about": ("Generated by benchmarks/gen_model_type_defaults.py from transformers "
                  f"{transformers.__version__}: per model_type, what transformers does with it (role), the "
                  "declared defaults of its config class for the fields kvplan reads, attribute_map aliases, and "
                  "where a composite model keeps its language model. Do not edit by hand: rerun the script."),
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
