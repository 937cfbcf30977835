"""The model spec's data types: what each decoder layer caches per request (whole model, before tp/pp).

Built by :mod:`kvplan.model.spec` (the config reader); read by the memory math, the engines and the paged pool.
A :class:`ModelSpec` is a tuple of per-layer :class:`LayerCache` entries (one per decoder layer, in order),
so pipeline stages are slices and hybrid models are just layers of several kinds. The byte formulas live
in :mod:`kvplan.memory`, never here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import field
from enum import Enum
from typing import Mapping

from kvplan.model.source import WeightFacts
from kvplan.frozen import frozen


class LayerKind(str, Enum):
    """What a layer keeps per request."""

    FULL = "full"  # K and V for every token (MHA / GQA / MQA)
    SLIDING = "sliding"  # K and V for the last ``window_tokens`` tokens
    CHUNKED = "chunked"  # K and V within the current ``window_tokens`` chunk (Llama 4 local attention)
    MLA = "mla"  # one compressed latent per token (DeepSeek V2/V3, Kimi K2)
    MAMBA = "mamba"  # fixed conv + SSM state per request (Mamba / Mamba2)
    LINEAR = "linear_attention"  # fixed conv + recurrent state per request (gated delta net, ...)
    CROSS = "cross_attention"  # K and V of the request's ``window_tokens`` encoder (image) tokens, fixed per request
    NONE = "none"  # caches nothing (no-op attention, reuses another layer's cache)

    def __str__(self) -> str:
        return self.value


TOKEN_KINDS = frozenset({LayerKind.FULL, LayerKind.SLIDING, LayerKind.CHUNKED, LayerKind.MLA, LayerKind.CROSS})
STATE_KINDS = frozenset({LayerKind.MAMBA, LayerKind.LINEAR})


@frozen
class LayerCache:
    """The cache one decoder layer keeps for one request (whole model, before tp/pp slicing).

    Attention kinds: ``kv_heads`` x ``head_dim`` elements per token for K and again for V
    (MLA: ``kv_heads == 1`` and ``head_dim`` = ``kv_lora_rank + qk_rope_head_dim``, stored once, no V).
    ``window_tokens``: the sliding window or attention chunk (tokens), else ``None``; for cross-attention
    layers the encoder (image) tokens one request caches, whatever its text length.
    State kinds: ``conv_elements`` and ``ssm_elements`` per request, independent of length; the conv
    state is stored in the model dtype and the SSM state in ``ssm_dtype`` (``None`` = model dtype).
    ``state_kind`` (``mamba1``, ``mamba2``, ``gated_delta_net``) and ``state_dims`` keep the config's
    dimensions so a tensor-parallel slice can be recomputed exactly (see :func:`kvplan.model.hybrid.state_elements`).
    ``tp_shardable``: whether tensor parallelism divides this layer's cache across ranks.
    """

    kind: LayerKind
    kv_heads: int = 0
    head_dim: int = 0
    window_tokens: int | None = None
    conv_elements: int = 0
    ssm_elements: int = 0
    state_kind: str = ""
    ssm_dtype: str | None = None
    tp_shardable: bool = True
    state_dims: tuple[int, ...] = ()

    @property
    def caches_tokens(self) -> bool:
        return self.kind in TOKEN_KINDS

    @property
    def is_state(self) -> bool:
        return self.kind in STATE_KINDS

    @property
    def grows_with_context(self) -> bool:
        """Whether the cache grows with the request's text tokens (not state, not cross-attention)."""
        return self.caches_tokens and self.kind is not LayerKind.CROSS

    def describe(self) -> str:
        """``full 8x128``, ``sliding(4096) 8x128``, ``mla 576``, ``mamba state``."""
        if self.kind is LayerKind.MLA:
            return f"mla latent {self.head_dim}"
        if self.is_state:
            return f"{self.kind.value} state ({self.state_kind or 'conv+ssm'})"
        if self.kind is LayerKind.NONE:
            return "none"
        if self.kind is LayerKind.CROSS:
            return f"cross_attention({self.window_tokens} encoder tokens) {self.kv_heads}x{self.head_dim}"
        win = f"({self.window_tokens})" if self.window_tokens else ""
        return f"{self.kind.value}{win} {self.kv_heads}x{self.head_dim}"


@frozen
class LayerGroup:
    """Identical layers counted together (``num_layers`` layers caching the same thing)."""

    cache: LayerCache
    num_layers: int


@frozen
class RotaryCache:
    """One rotary-embedding cos/sin table a serving engine builds while loading the model, shared by the layers
    that use the same rope parameters: ``positions`` rows of ``rotary_dim`` values (the cos and sin halves).

    ``rule`` says how ``positions`` follows from the config (``max_position_embeddings 131,072 x linear
    factor 8``). Models whose layer kinds use different rope parameters (Gemma 3: local and global) hold one
    table each.
    """

    positions: int
    rotary_dim: int
    rule: str = ""


@frozen
class RopeScaling:
    """One set of the config's rope parameters (one per layer type when ``rope_parameters`` is nested), as far
    as an engine's maximum length needs it: engines derive the longest max_model_len they accept from
    ``max_position_embeddings``, the ``rope_type`` and its ``factor`` (:mod:`kvplan.engines`).

    ``rope_type``: ``rope_type`` or the legacy ``type`` (``su`` read as ``longrope``, ``mrope`` as ``default``,
    as vLLM's ``patch_legacy_rope_type`` does). ``factor``: None when the parameters have none.
    ``original``: the parameters' ``original_max_position_embeddings`` (tokens); ``config_original``: the
    config's own top-level ``original_max_position_embeddings`` (Phi-3), which transformers 5 puts into the
    parameters of ``llama3`` / ``yarn`` / ``longrope`` in its place.
    """

    rope_type: str
    factor: float | None = None
    original: int | None = None
    config_original: int | None = None


@frozen
class VisionEncoder:
    """The image encoder of a multimodal checkpoint, as far as an engine's profile run needs it (element counts).

    One image is ``channels x image_size^2`` pixels, cut into ``(image_size // patch_size)^2`` patches that
    run through encoder layers of ``hidden_size`` / ``intermediate_size``; it reaches the language model as
    ``tokens_per_image`` embeddings and occupies ``placeholder_tokens`` prompt tokens (the embeddings plus
    the start/end markers around them, as the engine counts them: Qwen-VL's processing info reports the
    embeddings alone). A video (``max_video_frames`` > 0) is ``temporal_patch``-frame groups of patches;
    ``video_max_pixels`` caps all its frames together (the video processor's ``size["longest_edge"]``), so more
    frames come smaller. ``output_width``: the elements of one output token, when they are not the language
    model's hidden size (Qwen3-VL appends its deepstack features).
    """

    image_size: int
    patch_size: int
    hidden_size: int
    intermediate_size: int
    tokens_per_image: int
    placeholder_tokens: int
    channels: int = 3
    source: str = ""
    kind: str = "siglip"  # "siglip" (Gemma 3) or "qwen-vl" (Qwen2-VL / 2.5-VL / 3-VL: patches merged 2x2, video)
    temporal_patch: int = 1  # frames one patch spans (Qwen-VL: 2; an image is its own pair of frames)
    gated_mlp: bool = False  # the encoder's MLP is gate/up/down (SwiGLU) rather than fc1/fc2
    max_video_frames: int = 0  # the most frames of the dummy video (0: no video modality)
    merge: int = 1  # patches merged into one token along each side (Qwen-VL: spatial_merge_size 2)
    video_max_pixels: int = 0  # a video's pixel cap over all its frames (Qwen3-VL); 0: every frame at the image's size
    output_width: int = 0  # elements per output token (Qwen3-VL: out_hidden_size x (1 + deepstack levels)); 0: hidden
    deepstack_levels: int = 0  # encoder layers whose features are added to early decoder layers (Qwen3-VL: 3)
    position_embeddings: bool = False  # a learned position embedding per patch, held through the encoder's forward
    # (Qwen3-VL / Qwen3.5: fast_pos_embed_interpolate's pos_embeds, a local - from 0.20 in encoder_metadata)

    @property
    def patches_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def pixels_per_image(self) -> int:
        return self.channels * self.temporal_patch * self.image_size * self.image_size

    @property
    def pixels_per_patch(self) -> int:
        """Pixel elements of one encoder patch (its ``temporal_patch`` frames)."""
        return self.channels * self.temporal_patch * self.patch_size * self.patch_size


@frozen
class ModelSpec:
    """Everything the memory math needs about a model, normalised from its config.

    Sizes are element counts, not bytes; ``dtype`` is the checkpoint's (``bfloat16``...): the dtype an engine
    runs it in is the engine's rule (``auto_dtype`` in :mod:`kvplan.engines.vllm`).
    ``weights`` and ``parameters`` are what an engine loads (:mod:`kvplan.model.checkpoint`): the checkpoint's weight
    facts less its multi-token-prediction layers (not loaded without speculative decoding), or for a quantized
    config without facts an estimate of how the checkpoint stores them (:mod:`kvplan.model.quant`).
    ``provenance`` maps a field name to the config key (or rule) it came from.
    """

    model_id: str
    source: str
    architecture: str
    layers: tuple[LayerCache, ...]
    dtype: str
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None
    num_experts: int = 0
    num_experts_per_token: int = 0
    moe_intermediate_size: int = 0
    parameters: int | None = None
    weights: WeightFacts | None = None
    provenance: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    model_type: str = ""  # the (text) config's model_type: engines' dtype rules depend on it
    decoder_layers: int = 0  # decoder layers when some hold two caches (Falcon-H1); 0: one entry per layer
    embedding_parameters: int = 0  # token embeddings + an untied LM head (kept 16-bit by weight quantizers)
    routed_expert_layers: int = 0  # decoder layers with routed experts (MoE); 0: dense
    rotary_caches: tuple[RotaryCache, ...] = ()  # the rope tables an engine builds at load (none: no rope)
    vision: VisionEncoder | None = None  # the image encoder an engine profiles (None: text-only or not modelled)
    rope_scaling: tuple[RopeScaling, ...] = ()  # the config's rope parameters, in order (none: no rope keys)
    mtp_layers: int = 0  # multi-token-prediction layers the config says the checkpoint holds (num_nextn_predict_layers)
    mtp_parameters: int = 0  # their parameters (loaded only with speculative decoding)
    shared_expert_size: int = 0  # intermediate size of a MoE layer's shared expert(s), 0 for none
    quant_method: str = ""  # the checkpoint's quantization_config quant_method ("mxfp4", "fp8", ...), "" when not quantized
    weights_format: str = ""  # the format its quantized weights are stored in ("fp8_e4m3", "mxfp4", "int4", ...), "" when
    # not quantized (kvplan.model.checkpoint.weights_format)
    mla_dims: tuple[int, ...] = ()  # MLA: (q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
    layer_parameters: tuple[int, ...] = ()  # each decoder layer's parameters (attention or mixer, MLP or experts,
    # norms) from the config's inventory, in order; () when not counted (a pipeline stage's weights: kvplan.memory.stages)
    expert_layer_ids: tuple[int, ...] = ()  # the decoder layers with routed experts (len = routed_expert_layers)
    tied_embeddings: bool = False  # the LM head is the token embedding (tie_word_embeddings)

    @property
    def expert_parameters(self) -> int:
        """Parameters of one routed expert (gate, up and down projections: 3 x hidden x expert size)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def parameters_read(self, tokens: int = 1) -> int | None:
        """Parameters a forward step over ``tokens`` tokens reads and computes with: all of them for a dense
        model; for a MoE, all but the routed experts no token picks. With uniform routing each MoE layer
        touches ``E x (1 - (1 - k/E)^tokens)`` of its ``E`` experts (``k`` per token): at one token the active
        parameters (DeepSeek-V3: ~37B of 671B), at a large batch nearly all. Memory always holds them all
        (:attr:`parameters`)."""
        if not self.parameters:
            return None
        if not self.routed_expert_layers:
            return self.parameters
        e, k = self.num_experts, self.num_experts_per_token
        touched = e * (1 - (1 - k / e) ** max(1, tokens))
        idle = self.routed_expert_layers * (e - touched) * self.expert_parameters
        return max(int(self.parameters - idle), 1)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_layers_decoder(self) -> int:
        """Decoder layers (``len(layers)`` except for parallel hybrids with two caches per layer)."""
        return self.decoder_layers or len(self.layers)

    @property
    def groups(self) -> tuple[LayerGroup, ...]:
        """Layers bucketed by identical cache, in order of first appearance."""
        counts = Counter(self.layers)
        seen: dict[LayerCache, None] = dict.fromkeys(self.layers)
        return tuple(LayerGroup(cache, counts[cache]) for cache in seen)

    @property
    def kind_summary(self) -> str:
        """``gqa``, ``mha``, ``mqa``, ``mla``, ``sliding``, ``hybrid``: the headline kind (cross-attention
        layers, which cache encoder tokens, do not change it)."""
        kinds = {layer.kind for layer in self.layers if layer.kind not in (LayerKind.NONE, LayerKind.CROSS)}
        if kinds & STATE_KINDS:
            return "hybrid"
        if kinds == {LayerKind.MLA}:
            return "mla"
        if LayerKind.SLIDING in kinds or LayerKind.CHUNKED in kinds:
            return "sliding" if LayerKind.SLIDING in kinds else "chunked"
        heads = {layer.kv_heads for layer in self.layers if layer.kind is LayerKind.FULL}
        if heads == {1}:
            return "mqa"
        if heads == {self.num_attention_heads}:
            return "mha"
        return "gqa"
