"""What vLLM holds for the weights beyond the checkpoint's bytes: "Model loading took X GiB" per GPU.

"Model loading took" is the torch allocator's live bytes after ``process_weights_after_loading`` (read in every
release: ``DeviceMemoryProfiler`` around ``load_model``): copies made while loading that are freed do not count,
layouts a kernel needs do. kvplan's weights term is the checkpoint's bytes split over the GPUs; this module adds
what the released code keeps on top of them, per release and GPU generation (read in the released wheels'
``model_executor/layers/quantization/mxfp4.py``, ``fused_moe/oracle/mxfp4.py`` and the vendored
``triton_kernels``, ``attention/backends/mla/common.py`` and ``models/deepseek_v2.py``):

- **MXFP4 experts** (gpt-oss): each backend pads the expert matrices and re-lays the scales and biases -
  Marlin (Ampere / Ada; compute capability < 9): intermediate to 128, hidden to 256, biases bf16;
  Triton (Hopper, 9.x, where ``triton_kernels`` is installed): intermediate to 64, hidden as it is, biases fp32,
  the scales re-laid with rows padded
  to 256 while the originals stay referenced through 0.22 (both counted), the packed weight dimension padded
  by 2.2% in 0.17 - 0.20; TRT-LLM (Blackwell, 10.x): intermediate to 256 (128 from 0.27), hidden to 256, biases
  fp32. gpt-oss-120b on one H100 (0.10 - 0.14): 64.33 GiB against a 60.77 GiB checkpoint (logged 64.38).
  Hopper without ``triton_kernels`` takes Marlin: 0.10.1 - 0.11.x ``get_mxfp4_backend()`` returns ``MARLIN``
  when ``not has_triton_kernels()``, and no wheel of those releases depends on or vendors ``triton_kernels``
  (only the project's Docker images install it; 0.11.0's wheel lists ``flashinfer-python`` as an extra too,
  and its Hopper warning says "Please `pip install vllm[flashinfer]`"). gpt-oss-120b on one H100 that way:
  60.77 + 5.13 = 65.90 GiB (corpus vllm-23278-h100-gpt-oss-120b-refused, 0.10.1.1 with the "leveraging the
  Marlin kernel" warning, logged 65.97).
- **MLA** (DeepSeek V2 / V3 / R1, Kimi K2): ``q_a_proj``, ``kv_a_proj_with_mqa`` and the router are replicated
  on every rank, not split; and the MLA backend keeps the up-projections for the absorbed attention - from 0.8
  the bf16 ``W_UK_T`` / ``W_UV`` (``2 x kv_lora x heads/tp x (nope + v)`` bytes per layer); V0 0.7.x instead the
  absorbed ``W_Q_UK`` and ``W_UV_O`` (requantized to fp8 for fp8 weights, else in the model dtype; absorbed into
  ``q_proj`` where the model has no q LoRA) and a model-dtype ``W_QR``, and an fp8 model's dequantized
  ``kv_b_proj`` copy (fp32 in 0.7.1 - 0.7.2). DeepSeek-R1 at tp 8 on H200s with V0 0.7.3: 83.78 GiB (logged 83.88);
  DeepSeek-Coder-V2-Lite at tp 8 with 0.7.1: 3.96 GiB (logged 3.97; 3.81 before the q_proj absorption).
- **Qwen3-VL's deepstack buffers** (:func:`deepstack_buffer_bytes`, ``models/qwen3_vl.py``): zeros of
  ``max_num_batched_tokens x hidden`` per deepstack level, made with the model.
"""

from __future__ import annotations

from kvplan.memory.stages import PipelineStage
from kvplan.model.modelspec import ModelSpec
from kvplan.units import GiB, cdiv

MXFP4_BYTES_PER_ELEMENT = 0.5 + 1 / 32  # 4-bit values + one e8m0 scale byte per 32


def _round_up(n: int, multiple: int) -> int:
    return cdiv(n, multiple) * multiple


def mxfp4_backend(capability: tuple[int, int] | None, triton_kernels: bool = True) -> str:
    """The MXFP4 MoE backend vLLM picks on a GPU of this compute capability: ``marlin`` (< 9), ``triton`` (9.x),
    ``trtllm`` (10.x and later); ``triton`` when unknown (kvplan's default GPU is an H100). ``triton_kernels``
    False (a plain wheel install of 0.10.1 - 0.11, see the module docstring): Hopper takes ``marlin``."""
    if capability is None:
        capability = (9, 0)
    if capability[0] == 9:
        return "triton" if triton_kernels else "marlin"
    return "marlin" if capability[0] < 9 else "trtllm"


def _mxfp4_layer_bytes(backend: str, experts: int, inter: int, hidden: int, release: tuple[int, ...]) -> float:
    """One MoE layer's expert bytes per GPU as loaded: ``inter`` the per-rank intermediate size."""
    if backend == "marlin":
        ip, hp, bias = _round_up(inter, 128), _round_up(hidden, 256), 2
    elif backend == "trtllm":
        ip, hp, bias = _round_up(inter, 256 if release < (0, 27, 0) else 128), _round_up(hidden, 256), 4
    else:
        ip, hp, bias = _round_up(inter, 64), hidden, 4
    weights = 1.5 * ip * hp  # w13 [2 ip, hp] and w2 [hp, ip] at 4 bits
    scales = 3 * ip * hp / 32
    if backend == "triton":
        if (0, 17, 0) <= release < (0, 21, 0):
            weights *= 1.022  # the vendored triton_kernels pads the packed dimension (1440 -> 1472)
        relaid = (_round_up(2 * ip, 256) * hp + _round_up(hp, 256) * ip) / 32
        scales = relaid + (scales if release < (0, 25, 0) else 0)  # the originals stay referenced through 0.22
    return experts * (weights + scales + (2 * ip + hp) * bias)


def _mxfp4_checkpoint_layer_bytes(experts: int, inter: int, hidden: int) -> float:
    return experts * (3 * inter * hidden * MXFP4_BYTES_PER_ELEMENT + (2 * inter + hidden) * 2)


def _mla_extra_layer_bytes(spec: ModelSpec, tp: int, release: tuple[int, ...]) -> float:
    """MLA's per-layer bytes per GPU beyond the checkpoint's split: replicated projections and the absorbed copies.

    V0 0.7.x (``MLACommonImpl.process_weights_after_loading``, read in 0.7.1): ``W_Q`` is ``q_b_proj``'s weight, or
    ``q_proj``'s where the model has no q LoRA (DeepSeek-V2-Lite: ``[hidden, heads x qk_head_dim]``); it keeps
    ``W_Q_UK`` ``[q_in, heads x kv_lora]`` and ``W_UV_O`` ``[heads x kv_lora, hidden]`` (requantized to fp8 for fp8
    weights, else in the model dtype) and a model-dtype ``W_QR`` ``[q_in, heads x rope]``; ``W_UK`` / ``W_UV`` are
    views of ``kv_b_proj``'s weight, a copy only where it was dequantized (fp8: fp32 in 0.7.1 - 0.7.2)."""
    q_lora, kv_lora, nope, rope, v_dim = spec.mla_dims
    heads = max(1, spec.num_attention_heads // tp)
    h = spec.hidden_size
    fp8 = spec.quant_method == "fp8"
    weight_bytes = 1 if fp8 else 2
    replicated = (h * q_lora + h * (kv_lora + rope)) * weight_bytes + spec.num_experts * h * 2
    extra = replicated * (1 - 1 / tp)
    if (0, 7, 1) <= release < (0, 8, 0):  # V0's absorbed matrices
        q_in = q_lora or h
        extra += (q_in * heads * kv_lora + heads * kv_lora * h) * weight_bytes + 2 * q_in * heads * rope
        if fp8:
            extra += 2 * kv_lora * heads * (nope + v_dim) * (2 if release < (0, 7, 3) else 1)
    else:
        extra += 2 * kv_lora * heads * (nope + v_dim)
    return extra


def deepstack_buffer_bytes(spec: ModelSpec, max_num_batched_tokens: int, act_bytes: int) -> int:
    """Qwen3-VL's deepstack buffers: ``Qwen3VLForConditionalGeneration.__init__`` (0.11 and later) allocates one
    ``torch.zeros(max_num_batched_tokens, text hidden)`` per deepstack level, in the model dtype on the GPU, on
    every rank: 3 x 2,048 x 2,048 x 2 B = 25,165,824 B for Qwen3-VL-30B-A3B under ``vllm serve`` on a 24 GB
    card, 201 MB at 16,384 tokens. Qwen3.5 / Qwen3.6 have none: ``Qwen3_5ForConditionalGeneration.__init__``
    (0.17 - 0.33) skips Qwen3-VL's, and their ``deepstack_visual_indexes`` is empty (0 levels)."""
    levels = spec.vision.deepstack_levels if spec.vision is not None else 0
    return levels * max_num_batched_tokens * spec.hidden_size * act_bytes


def _stage_layers(spec: ModelSpec, pp: int, stage: PipelineStage | None, experts: bool) -> int:
    """Decoder layers (``experts``: those with routed experts) one GPU holds: the stage's own, else the largest
    even share over ``pp`` stages."""
    if stage is None:
        return cdiv((spec.routed_expert_layers if experts else 0) or spec.num_layers_decoder, pp)
    if experts and spec.expert_layer_ids:
        return sum(1 for i in spec.expert_layer_ids if stage.start <= i < stage.end)
    return stage.num_layers


def loaded_extra_bytes(spec: ModelSpec, tp: int, pp: int, release: tuple[int, ...],
                       capability: tuple[int, int] | None, platform: str = "cuda",
                       expert_parallel: bool = False, max_num_batched_tokens: int = 0,
                       act_bytes: int = 2, triton_kernels: bool = True,
                       stage: PipelineStage | None = None) -> tuple[int, str]:
    """Bytes per GPU vLLM's "Model loading took" holds above the checkpoint's split, and why ("" for none).
    ``triton_kernels``: whether the installation has the ``triton_kernels`` package (:func:`mxfp4_backend`).
    ``stage``: the pipeline stage whose layers this GPU holds (None: the largest even share over ``pp``)."""
    deepstack = deepstack_buffer_bytes(spec, max_num_batched_tokens, act_bytes)
    if deepstack:
        return deepstack, f"Qwen3-VL's deepstack buffers {deepstack / GiB:.2f} GiB"
    layers = _stage_layers(spec, pp, stage, experts=True)
    if spec.quant_method == "mxfp4" and spec.num_experts and spec.moe_intermediate_size and platform == "cuda":
        backend = mxfp4_backend(capability, triton_kernels)
        experts = cdiv(spec.num_experts, tp) if expert_parallel else spec.num_experts
        inter = spec.moe_intermediate_size if expert_parallel else cdiv(spec.moe_intermediate_size, tp)
        extra = (_mxfp4_layer_bytes(backend, experts, inter, spec.hidden_size, release)
                 - _mxfp4_checkpoint_layer_bytes(experts, inter, spec.hidden_size)) * layers
        return max(0, round(extra)), f"MXFP4 experts as the {backend} backend lays them out {extra / GiB:.2f} GiB"
    if len(spec.mla_dims) == 5 and all(spec.mla_dims[1:]):
        extra = _mla_extra_layer_bytes(spec, tp, release) * _stage_layers(spec, pp, stage, experts=False)
        return max(0, round(extra)), f"MLA projections replicated and up-projections kept {extra / GiB:.2f} GiB"
    return 0, ""


__all__ = ["deepstack_buffer_bytes", "loaded_extra_bytes", "mxfp4_backend"]
