"""transformers as the config oracle: every model_type it knows, planned by kvplan and compared.

For each ``model_type`` in transformers' ``CONFIG_MAPPING`` this builds the default config
(``AutoConfig.for_model``, no network) and, for decoders, variations (GQA, explicit ``head_dim``, sliding
windows, another layer count, a nested ``text_config`` saved as a diff, no ``text_config`` at all), writes
each as ``config.json`` the way ``save_pretrained`` does (only what differs from the class defaults) and
also in full, then:

- **transformers' view**: reloads the file with ``AutoConfig.from_pretrained`` and asks transformers'
  own cache helpers what each decoder layer caches (``get_layer_types_and_kwargs``: full / sliding(W) /
  chunked(C) / linear-state / hybrid / dummy; ``get_head_shapes``: KV heads and head_dim per layer) on
  ``get_text_config(decoder=True)``. MLA layers (``kv_lora_rank``) are compared as the latent that
  serving engines cache (``kv_lora_rank + qk_rope_head_dim``), not as the K/V transformers expands;
  mllama's ``cross_attention_layers`` as cross-attention layers (their image-token count is kvplan's
  assumption from the vision config, not a transformers attribute, so only kind, heads and head_dim count).
- **kvplan's view**: ``kvplan.model.sources.resolve_model(path)`` + ``kvplan.model.spec.build_spec``, read back per
  layer (kind, KV heads, head_dim, window) plus the dtype when the config states one.

Every model type ends in exactly one outcome: ``agrees`` (every variation equal), ``refused`` (kvplan
raises a ConfigError naming why: encoder-only, encoder-decoder, vision/audio, a cache kvplan does not
model...), ``different`` (a difference listed in ``KNOWN_DIFFERENCES`` with its explanation), or
``DISAGREES`` (anything else: a silent disagreement, the thing this sweep exists to find; exit 1).

    python3 benchmarks/transformers_sweep.py                   # all model types, print the summary
    python3 benchmarks/transformers_sweep.py --only gemma      # model types containing "gemma"
    python3 benchmarks/transformers_sweep.py --write           # also rewrite the section in docs/coverage.md
    python3 benchmarks/transformers_sweep.py -v --only paligemma   # show each variation's layers
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from doc_section import replace_section  # noqa: E402
from gen_model_type_defaults import quiet_transformers  # noqa: E402

from kvplan.errors import KvplanError  # noqa: E402
from kvplan.model.sources import resolve_model  # noqa: E402
from kvplan.model.spec import LayerKind, build_spec  # noqa: E402

COVERAGE = REPO / "docs" / "coverage.md"
BEGIN, END = "<!-- transformers-sweep:begin -->", "<!-- transformers-sweep:end -->"

# A layer as both sides describe it: (kind, kv_heads, head_dim, window); state and no-cache layers
# carry only their kind.
Layer = tuple

# Differences we know of and accept, with the reason (model_type -> explanation). The sweep fails when
# one listed here no longer differs (so the list stays true) or when an unlisted one appears.
_DSA = ("DeepSeek sparse attention: kvplan plans the MLA latent (kv_lora_rank + qk_rope_head_dim) per token and does "
        "not count the indexer's key cache (index_head_dim per token per layer) that transformers' DynamicIndexedLayer "
        "(and vLLM) also keep, so it under-counts these models' KV bytes (DeepSeek-V3.2: 576 of 704 elements/token/layer)")
KNOWN_DIFFERENCES: dict[str, str] = {
    "falcon": ("transformers' generic get_head_shapes reads num_kv_heads (= num_attention_heads when unset) and ignores "
               "multi_query; FalconAttention and vLLM keep one KV head when multi_query is set without "
               "new_decoder_architecture, and kvplan follows them"),
    "minicpm3": ("MiniCPM3's low-rank attention: transformers caches K at qk_nope + qk_rope and V at v_head_dim per "
                 "head; kvplan follows vLLM 0.32, which runs it as plain attention and caches K and V of every head at "
                 "qk_nope + qk_rope (V padded), not the MLA latent (checked against vLLM's CPU build)"),
    **{t: _DSA for t in ("axk2", "deepseek_v32", "glm_moe_dsa", "hy_v4", "hy_v4_vl", "hy_v4_vl_text", "mistral_large4",
                         "mistral_large4_text")},
}

# Decoders kvplan refuses on purpose: the ConfigError must contain this text.
_HYBRID_LAYER = "'hybrid' layers: attention and a linear-attention state in one layer"
_LINEAR_STATE = "linear-attention layers whose state kvplan cannot size"
EXPECTED_REFUSALS: dict[str, str] = {
    "bamba": "has no attention layer",  # transformers' default Bamba config is all Mamba (no attn_layer_indices)
    "granitemoehybrid": "has no attention layer",  # likewise: the default layer_types are all mamba
    "deepseek_v4": "compressed sparse attention (DeepSeek V4)",
    "dots3_note": "next to MLA layers", "dots3_note_text": "next to MLA layers",
    "gemma4_unified_assistant": "keeps a cache of its own",
    "lfm3": "'conv' layers: short-convolution state", "lfm3_vl": "'conv' layers: short-convolution state",
    "qwen4_exp": "'indexed_attention' layers", "qwen4_exp_text": "'indexed_attention' layers",
    "recurrent_gemma": "recurrent (RG-LRU) blocks",
    "unlimited_ocr": "'reference_sliding_attention' layers", "unlimited_ocr_text": "'reference_sliding_attention' layers",
    **{t: _HYBRID_LAYER for t in ("inkling2", "inkling2_loop", "inkling2_loop_text", "inkling2_text", "inkling_mm_model",
                                  "inkling_text", "zamba", "zamba2", "zaya")},
    **{t: _LINEAR_STATE for t in ("bailing_hybrid", "kimi_linear", "minimax", "glm5_next", "glm5_next_text")},
}


@dataclass
class Result:
    model_type: str
    outcome: str  # agrees / refused / different / DISAGREES / skipped
    reason: str = ""
    details: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# transformers' side


def _attr(config: Any, name: str) -> Any:
    """``getattr`` that treats transformers' per-layer-only attributes as absent."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001 - AmbiguousGlobalPerLayerAttributeError on heterogeneous configs
        return None


def _per_layer(value: Any, i: int) -> Any:
    return value[i] if isinstance(value, list) else value


def oracle_layers(config: Any) -> list[Layer]:
    """What transformers caches per decoder layer (see the module docstring)."""
    from transformers.cache_utils import get_layer_types_and_kwargs
    from transformers.configuration_utils import get_head_shapes

    text = config.get_text_config(decoder=True)
    types, kwargs = get_layer_types_and_kwargs(text)
    try:
        heads, dims = get_head_shapes(text)
    except AttributeError:  # attention-free models (mamba, rwkv) have no head attributes
        heads = dims = None
    layers: list[Layer] = []
    for i, (kind, kw) in enumerate(zip(types, kwargs)):
        layer_config = text.per_layer_config[i] if text.is_heterogeneous else text
        rank = _attr(layer_config, "kv_lora_rank")
        h, d = _per_layer(heads, i), _per_layer(dims, i)
        if rank is not None and kind == "indexed_attention":  # MLA latent + the indexer's key per token
            attention: Layer = ("mla+indexer", 1, rank + _attr(layer_config, "qk_rope_head_dim"),
                                _attr(layer_config, "index_head_dim"))
        elif rank is not None and kind == "full_attention":
            attention = ("mla", 1, rank + _attr(layer_config, "qk_rope_head_dim"), None)
        else:
            attention = ("full", h, d, None)
        if kind in ("full_attention", "hybrid") or (kind == "indexed_attention" and rank is not None):
            layers.append(attention)
        elif kind in ("sliding_attention", "hybrid_sliding"):
            window = kw["sliding_window"]  # a sliding layer without a window attends to everything
            layers.append(("sliding", h, d, window) if window is not None else ("full", h, d, None))
        elif kind == "chunked_attention":
            layers.append(("chunked", h, d, kw["sliding_window"]))
        elif kind == "dummy":
            layers.append(("none",))
        elif kind not in ("linear_attention", "conv"):
            layers.append((f"unmodelled:{kind}",))
        if kind in ("linear_attention", "conv", "hybrid", "hybrid_sliding"):
            layers.append(("state",))
    for i in _attr(text, "cross_attention_layers") or ():  # mllama: these layers cache the image tokens' K/V
        layers[i] = ("cross_attention", *layers[i][1:3], None)
    return layers


def oracle_dtype(config: Any) -> str | None:
    """The checkpoint dtype the config states (text config first, as kvplan reads it), or None."""
    for c in (config.get_text_config(decoder=True), config):
        value = _attr(c, "dtype")
        if value is not None:
            return str(value).removeprefix("torch.")
    return None


# ---------------------------------------------------------------------------------------------
# kvplan's side


def kvplan_layers(path: Path) -> tuple[list[Layer], str]:
    spec = build_spec(resolve_model(str(path)))
    layers: list[Layer] = []
    for layer in spec.layers:
        if layer.is_state:
            layers.append(("state",))
        elif layer.kind is LayerKind.NONE:
            layers.append(("none",))
        elif layer.kind is LayerKind.MLA:
            layers.append(("mla", 1, layer.head_dim, None))
        elif layer.kind is LayerKind.CROSS:  # its window is the image tokens per request (not a config field)
            layers.append(("cross_attention", layer.kv_heads, layer.head_dim, None))
        else:
            layers.append((layer.kind.value, layer.kv_heads, layer.head_dim, layer.window_tokens))
    return layers, spec.dtype


# ---------------------------------------------------------------------------------------------
# variations


def _fields(cls: type) -> set[str]:
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    return names | set(cls.attribute_map or {})


def _text_variations(text: Any) -> dict[str, dict[str, Any]]:
    """Keyword changes to the language model's config (only those its class has fields for)."""
    fields = _fields(type(text))
    heads = _attr(text, "num_attention_heads")
    out: dict[str, dict[str, Any]] = {}
    if "num_hidden_layers" in fields:
        out["layers=7"] = {"num_hidden_layers": 7}
    if isinstance(heads, int) and heads % 4 == 0 and "num_key_value_heads" in fields:
        out["gqa"] = {"num_hidden_layers": 6, "num_key_value_heads": heads // 4, "dtype": "float16"}
    if "head_dim" in fields and isinstance(_attr(text, "head_dim"), int):
        out["head_dim"] = {"head_dim": 2 * _attr(text, "head_dim") + 32}
    if "sliding_window" in fields:
        sliding = {"sliding_window": 256, "num_hidden_layers": 8}
        if "use_sliding_window" in fields:
            sliding["use_sliding_window"] = True
        if "max_window_layers" in fields:
            sliding["max_window_layers"] = 2
        out["sliding"] = sliding
    return out


def variations(model_type: str) -> dict[str, dict[str, Any]]:
    """config.json dicts to plan: name -> dict (diff-saved unless the name says ``full``)."""
    from transformers import AutoConfig

    base = AutoConfig.for_model(model_type)
    out = {"saved": base.to_diff_dict(), "full": base.to_dict(),
           "model_type only": {"model_type": base.to_diff_dict().get("model_type", model_type)}}
    text = base.get_text_config(decoder=True)
    nested_key = next((k for k in ("text_config", "decoder", "generator") if _attr(base, k) is text), None)
    for name, change in _text_variations(text).items():
        try:
            variant_text = type(text)(**{**text.to_diff_dict(), **change})
            if nested_key is None:
                out[name] = variant_text.to_diff_dict()
            else:
                top = base.to_diff_dict()
                top[nested_key] = variant_text.to_diff_dict()
                if "dtype" in change:
                    top["dtype"] = change["dtype"]
                out[name] = top
        except Exception:  # noqa: BLE001 - transformers' own validation refuses this variation
            continue
    saved = base.to_diff_dict()
    target = saved.get(nested_key) if nested_key and isinstance(saved.get(nested_key), dict) else saved
    if "layer_types" in target or "layers_block_type" in target:  # a config saved before layer_types existed
        pruned = {k: v for k, v in target.items() if k not in ("layer_types", "layers_block_type")}
        out["no layer_types"] = {**saved, nested_key: pruned} if target is not saved else pruned
    if nested_key is not None:
        top = base.to_diff_dict()
        nested = dict(text.to_diff_dict())
        nested.pop("model_type", None)
        out["text_config without model_type"] = {**top, nested_key: nested}
        without = {k: v for k, v in top.items() if k != nested_key}
        out["no text_config"] = without
    return out


# ---------------------------------------------------------------------------------------------
# one model type


def _write(folder: Path, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1, default=str))
    return folder


def _describe(layers: list[Layer]) -> str:
    runs: list[str] = []
    prev, count = None, 0
    for layer in layers + [None]:  # type: ignore[list-item]
        if layer == prev:
            count += 1
            continue
        if prev is not None:
            runs.append(f"{count}x{'/'.join(str(x) for x in prev)}")
        prev, count = layer, 1
    return " ".join(runs)


def check_decoder(model_type: str, work: Path, verbose: bool) -> Result:
    from transformers import AutoConfig

    differences: list[str] = []
    refused: str | None = None
    compared = 0
    for name, config in variations(model_type).items():
        folder = _write(work / model_type / name.replace(" ", "_"), config)
        try:
            reloaded = AutoConfig.from_pretrained(str(folder))
            theirs = oracle_layers(reloaded)
            their_dtype = oracle_dtype(reloaded)
        except Exception as exc:  # noqa: BLE001 - transformers cannot read its own variation back
            if verbose:
                print(f"  {name}: transformers cannot reload it ({type(exc).__name__})")
            continue
        try:
            ours, our_dtype = kvplan_layers(folder)
        except KvplanError as exc:
            if name == "saved":
                refused = exc.one_line()
                break
            differences.append(f"{name}: kvplan refuses it: {exc.one_line()}")
            continue
        compared += 1
        if verbose:
            print(f"  {name}: transformers {_describe(theirs)} | kvplan {_describe(ours)}")
        ours, theirs = [x for x in ours if x != ("none",)], [x for x in theirs if x != ("none",)]
        if ours != theirs:  # compared without the layers that cache nothing (MLP-only, shared, dummy)
            differences.append(f"{name}: transformers {_describe(theirs)}; kvplan {_describe(ours)}")
        if their_dtype is not None and their_dtype != our_dtype:
            differences.append(f"{name}: dtype transformers {their_dtype}; kvplan {our_dtype}")
    if refused is None and not compared:
        return Result(model_type, "skipped", "transformers' own cache helpers cannot read any variation back "
                      "(no num_hidden_layers / layer types on its text config)")
    if refused is not None:
        expected = EXPECTED_REFUSALS.get(model_type)
        if expected is not None and expected in refused:
            return Result(model_type, "refused", refused)
        return Result(model_type, "DISAGREES", f"kvplan refuses a decoder transformers builds: {refused}")
    if not differences:
        if model_type in KNOWN_DIFFERENCES:
            return Result(model_type, "DISAGREES", "listed as different but agrees now: update KNOWN_DIFFERENCES")
        return Result(model_type, "agrees")
    if model_type in KNOWN_DIFFERENCES:
        return Result(model_type, "different", KNOWN_DIFFERENCES[model_type], differences)
    return Result(model_type, "DISAGREES", differences[0], differences)


def check_non_decoder(model_type: str, role: str, work: Path) -> Result:
    from transformers import AutoConfig

    folder = _write(work / model_type / "saved", AutoConfig.for_model(model_type).to_diff_dict())
    try:
        kvplan_layers(folder)
    except KvplanError as exc:
        return Result(model_type, "refused", exc.one_line())
    return Result(model_type, "DISAGREES", f"transformers role {role}: kvplan plans a KV cache for it")


def run(only: str | None, verbose: bool) -> list[Result]:
    quiet_transformers()
    from transformers import CONFIG_MAPPING, AutoConfig

    from kvplan.model import model_types

    results = []
    with tempfile.TemporaryDirectory(prefix="kvplan-sweep-") as tmp:
        for model_type in sorted(CONFIG_MAPPING.keys()):
            if only and only not in model_type:
                continue
            try:
                AutoConfig.for_model(model_type)
            except Exception as exc:  # noqa: BLE001 - transformers cannot build its own default
                results.append(Result(model_type, "skipped", f"transformers cannot build the default config "
                                      f"({type(exc).__name__}: {str(exc).splitlines()[0][:100]})"))
                continue
            saved_type = AutoConfig.for_model(model_type).to_diff_dict().get("model_type", model_type)
            role = model_types.role(saved_type) or "unknown"  # what kvplan reads: the model_type in the file
            if verbose:
                print(f"{model_type} ({role})")
            if role == "decoder":
                result = check_decoder(model_type, Path(tmp), verbose)
            else:
                result = check_non_decoder(model_type, role, Path(tmp))
            results.append(result)
            if verbose or result.outcome == "DISAGREES":
                print(f"{model_type}: {result.outcome} {result.reason}", flush=True)
    return results


# ---------------------------------------------------------------------------------------------
# report


def summary(results: list[Result]) -> str:
    import transformers

    from kvplan.model import model_types

    counts = Counter(r.outcome for r in results)
    decoders = [r for r in results if model_types.role(r.model_type) == "decoder"]
    lines = [BEGIN, "## transformers as the config oracle", "",
             f"`python3 benchmarks/transformers_sweep.py --write` (transformers {transformers.__version__}, "
             f"{len(results)} model types; {len(decoders)} of them decoders).",
             "Each decoder is planned from its default config saved the way `save_pretrained` writes it, in full,",
             "and with variations (7 layers; GQA with float16; an explicit head_dim; a 256-token sliding window;",
             "no layer_types, as configs saved before transformers wrote them; nothing but the model_type;",
             "a nested text_config with and without its model_type; no text_config at all), and compared per",
             "layer (kind, KV heads, head_dim, window, state) and dtype with transformers' own cache helpers.",
             "", "| outcome | model types |", "|---|---|"]
    refused_decoders = sum(1 for r in decoders if r.outcome == "refused")
    rows = {"agrees": counts["agrees"],
            "refused: not a text decoder (encoder, vision, audio, recurrent...)": counts["refused"] - refused_decoders,
            "refused: a decoder whose cache kvplan does not model (reason below)": refused_decoders,
            "different: listed and explained below": counts["different"],
            "DISAGREES (silent disagreement)": counts["DISAGREES"],
            "skipped: transformers cannot build or read it": counts["skipped"]}
    lines += [f"| {name} | {n} |" for name, n in rows.items()]
    lines.append(f"| **total** | **{len(results)}** |")
    refused_roles = Counter()
    for r in results:
        if r.outcome == "refused" and r not in decoders:
            refused_roles[model_types.role(r.model_type) or "unknown"] += 1
    lines += ["", "Refused because transformers itself gives them no text decoder (by role): "
              + ", ".join(f"{role} {n}" for role, n in sorted(refused_roles.items())) + "."]
    lines += ["", "Decoders that agree: " + ", ".join(f"`{r.model_type}`" for r in decoders if r.outcome == "agrees")
              + "."]
    for outcome, title in (("refused", "Decoders kvplan refuses, and why"), ("different", "Listed differences"),
                           ("DISAGREES", "Silent disagreements (must be empty)"),
                           ("skipped", "Skipped (transformers cannot build them)")):
        rows = [r for r in results if r.outcome == outcome and (outcome != "refused" or r in decoders)]
        if not rows:
            continue
        lines += ["", f"### {title}", "", "| model_type | reason |", "|---|---|"]
        lines += [f"| `{r.model_type}` | {_without_path(r.reason).replace('|', '/')} |" for r in rows]
    lines.append(END)
    return "\n".join(lines) + "\n"


def _without_path(reason: str) -> str:
    """A kvplan error without the temporary file it names (the docs stay the same from run to run)."""
    return reason.split("config.json: ", 1)[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="model types containing this text")
    parser.add_argument("--write", action="store_true", help=f"rewrite the sweep section of {COVERAGE.name}")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    results = run(args.only, args.verbose)
    section = summary(results)
    print(section)
    if args.write:
        replace_section(COVERAGE, section, BEGIN, END, empty="# Coverage\n\n")
    return 1 if any(r.outcome == "DISAGREES" for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
