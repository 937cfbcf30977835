"""What a serving engine builds for a model besides its layers' caches and weights: rotary tables and the image encoder.

Called by :mod:`kvplan.model.spec` with its config reader. Both feed the engine's budget, not the KV cache:

- :func:`rotary_caches`: the cos/sin tables vLLM's ``get_rope`` builds at load (one per distinct set of rope
  parameters, ``[positions, rotary_dim]`` in the model dtype; vLLM logs them with the weights). The rows
  follow the rope type, as each ``RotaryEmbedding._compute_cos_sin_cache`` does (vLLM 0.8 - 0.32):
  ``linear`` / ``dynamic`` ``max_position_embeddings x factor``; ``yarn`` / ``deepseek_yarn``
  ``original_max_position_embeddings x factor``; ``longrope`` the short and the long table
  (``original + max_position_embeddings``); every other type (``default``, ``llama3``, ``mrope``, ...)
  ``max_position_embeddings``. ``rotary_dim = head_dim x partial_rotary_factor``. Gemma 3's local layers
  use ``rope_local_base_freq`` without scaling, a second table (so do per-layer-type ``rope_parameters``).
- :func:`rope_scaling`: the config's rope parameters (``rope_parameters``, per layer type when nested, or
  ``rope_scaling``), from which each engine derives the longest max_model_len it accepts
  (:func:`kvplan.engines.vllm_rules.model_max_len`, :func:`kvplan.engines.sglang.model_max_len`).
- :func:`vision_encoder`: the image encoder of Gemma 3's multimodal checkpoints (SigLIP) and of the Qwen-VL
  family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 / Qwen3.6), whose dummy image or video batch vLLM's profile
  run pushes through the encoder (:mod:`kvplan.engines.vllm_profile`). Other multimodal families are not
  modelled (``None``; the spec's note says so).
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from kvplan.model.config_reader import ConfigReader
from kvplan.errors import ConfigError
from kvplan.limits import MAX_ROPE_TABLE_ELEMENTS
from kvplan.model.modelspec import LayerCache, LayerKind, RopeScaling, RotaryCache, VisionEncoder
from kvplan.units import scaled

_PARTIAL_KEYS = ("partial_rotary_factor", "rotary_pct", "rotary_emb_fraction")  # vLLM's patch_rope_parameters
_KIND_LAYER_TYPES = {LayerKind.FULL: "full_attention", LayerKind.SLIDING: "sliding_attention",
                     LayerKind.CHUNKED: "chunked_attention"}
# text model types whose sliding layers use their own unscaled rope (rope_local_base_freq, transformers default 10000)
_LOCAL_ROPE_TYPES = frozenset({"gemma3_text", "gemma3n_text"})
# transformers' SiglipVisionConfig defaults, for a Gemma 3 vision_config that leaves a key out
_SIGLIP_DEFAULTS = {"image_size": 224, "patch_size": 16, "hidden_size": 768, "intermediate_size": 3072, "num_channels": 3}
# Gemma 3's processor writes each image as "\n\n<start_of_image>" + N x <image_soft_token> + "<end_of_image>\n\n":
# N embeddings in N + 4 prompt tokens (vLLM up to 0.12 sized its dummy batch by the prompt tokens: 8,192 // 260 = 31)
GEMMA3_IMAGE_MARKER_TOKENS = 4


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _ceil_product(rows: int, factor: float) -> int:
    """``ceil(rows x factor)`` exactly (a factor of 1e300 is a huge integer for the bound, not an overflow)."""
    return scaled(rows, factor, ceil=True)


def _positions(params: Mapping[str, Any], max_pos: int, original: int | None) -> tuple[int, str]:
    """Rows of the cos/sin table for one set of rope parameters, and how they were derived."""
    kind = str(params.get("rope_type") or params.get("type") or "default")
    factor = _number(params.get("factor"))
    orig = int(_number(params.get("original_max_position_embeddings")) or original or max_pos)
    if kind in ("linear", "dynamic") and factor:
        return _ceil_product(max_pos, factor), f"max_position_embeddings {max_pos:,} x {kind} factor {factor:g}"
    if kind in ("yarn", "deepseek_yarn") and factor:
        return _ceil_product(orig, factor), f"original_max_position_embeddings {orig:,} x {kind} factor {factor:g}"
    if kind in ("longrope", "su"):
        return orig + max_pos, f"longrope: short {orig:,} + long {max_pos:,} positions"
    return max_pos, f"max_position_embeddings {max_pos:,}" + ("" if kind == "default" else f" ({kind})")


def _partial(r: ConfigReader, params: Mapping[str, Any]) -> float:
    for value in [params.get("partial_rotary_factor")] + [r.raw(k) for k in _PARTIAL_KEYS]:
        factor = _number(value)
        if factor is not None and 0 < factor <= 1:
            return factor
    return 1.0


def _params_by_kind(r: ConfigReader, kinds: list[LayerKind]) -> dict[LayerKind, dict[str, Any]]:
    """The rope parameters each attention layer kind uses (vLLM: ``config.rope_parameters``, per layer type
    when nested; Gemma 3's local layers ``rope_local_base_freq`` unscaled)."""
    raw = r.raw("rope_parameters") or r.raw("rope_scaling")
    raw = raw if isinstance(raw, Mapping) else {}
    theta = r.raw("rope_theta")
    if raw and all(isinstance(v, Mapping) for v in raw.values()):  # transformers v5: one entry per layer type
        return {k: dict(raw.get(_KIND_LAYER_TYPES[k]) or next(iter(raw.values()))) for k in kinds}
    flat = {"rope_theta": theta, **raw}
    out = {k: flat for k in kinds}
    if LayerKind.SLIDING in kinds and (r.has("rope_local_base_freq") or r.raw("model_type") in _LOCAL_ROPE_TYPES):
        out[LayerKind.SLIDING] = {"rope_type": "default", "rope_theta": r.raw("rope_local_base_freq") or 10000.0}
    return out


def rotary_caches(r: ConfigReader, layers: list[LayerCache], max_pos: int | None) -> tuple[RotaryCache, ...]:
    """The distinct rope tables of the model's attention layers (none for state-only models, or without
    ``max_position_embeddings``); see the module docstring for the rows. MLA layers rotate ``qk_rope_head_dim``
    dimensions (``DeepseekV2MLAAttention``'s ``get_rope``; DeepSeek-R1's deepseek_yarn: 4,096 x 40 = 163,840 rows x
    64 = 20 MiB in bf16)."""
    if not max_pos:
        return ()
    rope_dim = r.raw("qk_rope_head_dim")
    if any(layer.kind is LayerKind.MLA for layer in layers) and _number(rope_dim):
        original = r.raw("original_max_position_embeddings")
        rows, rule = _positions(_params_by_kind(r, [LayerKind.FULL])[LayerKind.FULL], max_pos,
                                int(original) if _number(original) else None)
        return (_bounded(r, RotaryCache(rows, int(rope_dim), rule)),)
    attn = [layer for layer in layers if layer.kind in _KIND_LAYER_TYPES and layer.head_dim]
    if not attn:
        return ()
    kinds = list(dict.fromkeys(layer.kind for layer in attn))
    head_dim = {layer.kind: layer.head_dim for layer in reversed(attn)}
    original = r.raw("original_max_position_embeddings")
    tables: dict[str, RotaryCache] = {}
    for kind, params in _params_by_kind(r, kinds).items():
        rows, rule = _positions(params, max_pos, int(original) if _number(original) else None)
        dim = int(head_dim[kind] * _partial(r, params))
        kind_name = params.get("rope_type") or params.get("type") or "default"
        key = json.dumps([rows, dim, kind_name, {k: v for k, v in params.items() if k not in ("rope_type", "type")}],
                         sort_keys=True, default=str)  # vLLM's get_rope cache key: the parameters and sizes
        tables.setdefault(key, _bounded(r, RotaryCache(rows, dim, rule)))
    return tuple(tables.values())


def _bounded(r: ConfigReader, table: RotaryCache) -> RotaryCache:
    """The table, or a ConfigError when it is past :data:`~kvplan.limits.MAX_ROPE_TABLE_ELEMENTS` (vLLM
    would build it on the GPU at load: a 4-billion-position table is a terabyte)."""
    elements = table.positions * table.rotary_dim
    if elements > MAX_ROPE_TABLE_ELEMENTS:
        raise ConfigError(f"{r.where}: the rotary cos/sin table of {r.prefix}{table.rule} x rotary_dim {table.rotary_dim} "
                          f"is {elements:,} elements ({elements * 2 / 2**30:,.0f} GiB in bf16): at most "
                          f"{MAX_ROPE_TABLE_ELEMENTS:,}", "check max_position_embeddings and the rope scaling factor")
    return table


_LEGACY_ROPE_TYPES = {"su": "longrope", "mrope": "default"}  # vLLM's patch_legacy_rope_type


def _whole(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number >= 1 else None


def rope_scaling(r: ConfigReader) -> tuple[RopeScaling, ...]:
    """The config's rope parameters in order: one entry per layer type when ``rope_parameters`` is nested
    (transformers 5), else the one ``rope_parameters`` / ``rope_scaling`` dict; none without either."""
    raw = r.raw("rope_parameters") or r.raw("rope_scaling")
    if not isinstance(raw, Mapping) or not raw:
        return ()
    nested = all(isinstance(v, Mapping) for v in raw.values())
    sets = [v for v in raw.values() if v] if nested else [raw]
    top = _whole(r.raw("original_max_position_embeddings"))
    out = []
    for params in sets:
        kind = str(params.get("rope_type") or params.get("type") or "default")
        out.append(RopeScaling(_LEGACY_ROPE_TYPES.get(kind, kind), _number(params.get("factor")),
                               _whole(params.get("original_max_position_embeddings")), top))
    return tuple(out)


# Qwen2-VL's image processor defaults (preprocessor_config.json, not config.json): max_pixels 12,845,056 =
# 16,384 merged tokens of 28 x 28 pixels; Qwen3-VL's longest_edge 16,777,216 pixels = 16,384 tokens of 32 x 32.
# Qwen3.5 / Qwen3.6 (qwen3_5, qwen3_5_moe) ship Qwen3-VL's processor files unchanged (Qwen3VLProcessor, the same
# longest_edge 16,777,216 and a video longest_edge of 25,165,824: public copies of Qwen/Qwen3.5-2B-Base's and
# Qwen/Qwen3.6-35B-A3B-FP8's), and vLLM's qwen3_5.py reads them through Qwen3VLProcessingInfo.
QWEN_VL_MAX_PIXELS = {"qwen2_vl": 12_845_056, "qwen2_5_vl": 12_845_056, "qwen3_vl": 16_777_216,
                      "qwen3_vl_moe": 16_777_216, "qwen3_5": 16_777_216, "qwen3_5_moe": 16_777_216}
QWEN_VL_MAX_VIDEO_FRAMES = 14  # vLLM's _MAX_FRAMES_PER_VIDEO (qwen2_vl.py) from 0.11 (16 before: the engine's rule)
# Qwen3-VL's video_preprocessor_config.json (the Qwen3-VL checkpoints ship it; transformers' class default is
# 768 x 32 x 32): size.longest_edge 25,165,824 pixels over all frames = 12,288 tokens of 2 frames x 32 x 32.
QWEN3_VL_VIDEO_MAX_PIXELS = 25_165_824
QWEN3_VL_MAX_VIDEO_FRAMES = 24_576  # vLLM's _MAX_FRAMES_PER_VIDEO in qwen3_vl.py 0.11 - 0.14


def _qwen_vl(config: Mapping[str, Any], vision: Mapping[str, Any], where: str) -> VisionEncoder:
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5: patches of ``patch_size`` over ``temporal_patch_size`` frames,
    merged ``spatial_merge_size`` x ``spatial_merge_size`` into one token; vLLM's dummy image is the largest the
    image processor takes (``max_pixels``). Its dummy video: Qwen2/2.5-VL frames of that image's size, Qwen3-VL
    frames its video processor shrinks to ``QWEN3_VL_VIDEO_MAX_PIXELS`` over all of them. Qwen3-VL's encoder output
    per token is ``out_hidden_size x (1 + len(deepstack_visual_indexes))`` (the deepstack features are
    concatenated to it: vLLM's ``Qwen3_VisionTransformer.forward``).

    Qwen3.5 / Qwen3.6 (model_type ``qwen3_5`` / ``qwen3_5_moe``; vLLM 0.17 - 0.33 ``qwen3_5.py``) are read as
    Qwen3-VL: ``Qwen3_5ForConditionalGeneration`` builds Qwen3-VL's ``Qwen3_VisionTransformer`` (an fc1/fc2 GELU
    MLP) and registers ``Qwen3_5ProcessingInfo`` (Qwen3-VL's, only ``get_hf_config`` replaced) with
    ``Qwen3VLDummyInputsBuilder``. Their ``deepstack_visual_indexes`` is empty, so the output is
    ``out_hidden_size`` a token and no deepstack features or buffers are counted."""
    model_type = str(config.get("model_type"))
    v = ConfigReader(dict(vision), where, "vision_config.")
    patch = v.int("patch_size", ("patch_size", "spatial_patch_size"), default=14) or 14
    merge = v.int("spatial_merge_size", ("spatial_merge_size",), default=2) or 2
    temporal = v.int("temporal_patch_size", ("temporal_patch_size",), default=2) or 2
    channels = v.int("in_channels", ("in_channels", "in_chans"), default=3) or 3
    if model_type == "qwen2_vl":  # embed_dim is the encoder's width, mlp_ratio its MLP's (hidden_size: the output)
        hidden = v.int("embed_dim", ("embed_dim",), default=1280) or 1280
        inter = int(hidden * float(vision.get("mlp_ratio") or 4))
        gated = False
    else:
        hidden = v.int("hidden_size", ("hidden_size",), default=1280) or 1280
        inter = v.int("intermediate_size", ("intermediate_size",), default=3420) or 3420
        gated = model_type == "qwen2_5_vl"
    qwen3 = model_type.startswith("qwen3")
    width, deepstack, levels = 0, "", 0
    if qwen3:
        out = v.int("out_hidden_size", ("out_hidden_size",), default=0) or 0
        levels = vision.get("deepstack_visual_indexes") or []
        levels = len(levels) if isinstance(levels, list) else 0
        if out:
            width = out * (1 + levels)
            deepstack = (f", output {out} x (1 + {levels} deepstack levels)" if levels
                         else f", output {out}, no deepstack")
    unit = patch * merge
    tokens = QWEN_VL_MAX_PIXELS.get(model_type, 12_845_056) // (unit * unit)
    side = math.isqrt(tokens) * unit  # the dummy image: square, its merged tokens a square number
    tokens = (side // unit) ** 2
    video = (f"; the dummy video {QWEN3_VL_VIDEO_MAX_PIXELS:,} pixels over up to {QWEN3_VL_MAX_VIDEO_FRAMES:,} frames"
             if qwen3 else f"; the dummy video up to {QWEN_VL_MAX_VIDEO_FRAMES} frames of that size")
    return VisionEncoder(side, patch, hidden, inter, tokens, tokens, channels,
                         f"vision_config ({model_type}: patch {patch} x {temporal} frames, merge {merge}x{merge}, "
                         f"hidden {hidden}, intermediate {inter}{deepstack}); the dummy image {side}x{side} "
                         f"(max_pixels){video}",
                         kind="qwen-vl", temporal_patch=temporal, gated_mlp=gated,
                         max_video_frames=QWEN3_VL_MAX_VIDEO_FRAMES if qwen3 else QWEN_VL_MAX_VIDEO_FRAMES,
                         merge=merge, video_max_pixels=QWEN3_VL_VIDEO_MAX_PIXELS if qwen3 else 0,
                         output_width=width, deepstack_levels=levels if qwen3 else 0, position_embeddings=qwen3)


def vision_encoder(config: Mapping[str, Any], where: str) -> VisionEncoder | None:
    """The image encoder an engine profiles: Gemma 3's (SigLIP) and the Qwen-VL family's, else ``None``."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return None
    if str(config.get("model_type")) in QWEN_VL_MAX_PIXELS:
        return _qwen_vl(config, vision, where)
    if config.get("model_type") != "gemma3":
        return None
    v = ConfigReader({**_SIGLIP_DEFAULTS, **vision}, where, "vision_config.")
    top = ConfigReader(config, where)
    tokens = top.int("mm_tokens_per_image", ("mm_tokens_per_image",), default=256)
    assert tokens is not None
    size, patch, hidden, inter, channels = (v.int(k, (k,)) for k in ("image_size", "patch_size", "hidden_size",
                                                                      "intermediate_size", "num_channels"))
    assert size and patch and hidden and inter and channels
    return VisionEncoder(size, patch, hidden, inter, tokens, tokens + GEMMA3_IMAGE_MARKER_TOKENS, channels,
                         f"vision_config (SigLIP {size}x{size}, patch {patch}, hidden {hidden}, intermediate {inter}); "
                         f"mm_tokens_per_image {tokens}")


__all__ = ["rotary_caches", "rope_scaling", "vision_encoder", "GEMMA3_IMAGE_MARKER_TOKENS"]
