"""The profile run's activation formulas the engines share: a decoder layer's forward pass (dense and fused MoE), LoRA
stacks, and the sampler's logits (bytes per GPU).
"""

from __future__ import annotations

import math

from kvplan.model.spec import LayerKind, ModelSpec


def _per_rank(n: int, tp: int) -> int:
    return math.ceil(n / tp) if n else 0


def routes_experts(spec: ModelSpec) -> bool:
    """Whether the model has routed-expert (MoE) layers: experts, top-k and their intermediate size, on at least
    one decoder layer (NVIDIA-Nemotron-Nano-9B-v2's config carries MoE fields, but its layer pattern has no MoE
    layer: dense)."""
    return bool(spec.num_experts and spec.num_experts_per_token and spec.moe_intermediate_size
                and spec.routed_expert_layers)


def forward_bytes_per_token(spec: ModelSpec, tp: int, act_bytes: int) -> int:
    """Peak live activation bytes per batched token of one decoder layer's forward pass, per GPU.

    Eager layer, MLP stage (the larger one for dense models): the residual, the normed input, the
    gate/up output (2 x intermediate), the activation output (1 x intermediate) and the down
    projection's output are alive at once: ``(3 x hidden + 3 x intermediate / tp) x act_bytes``.
    MoE (fused experts): each token is routed to ``top_k`` experts, each holding its gate/up/act
    rows and a hidden-sized output: ``(3 x hidden + top_k x (3 x moe_intermediate / tp + hidden))``.
    Attention stage: residual + normed input + q/k/v + attention output; the larger stage wins.
    Llama-3-8B (4096 hidden, 14336 intermediate, bf16): (3 x 4096 + 3 x 14336) x 2 = 110,592 B.
    """
    h = spec.hidden_size
    if routes_experts(spec):
        mlp = 3 * h + spec.num_experts_per_token * (3 * _per_rank(spec.moe_intermediate_size, tp) + h)
    else:
        mlp = 3 * h + 3 * _per_rank(spec.intermediate_size, tp)
    return max(mlp, _attention_stage(spec, tp)) * act_bytes


def _attention_stage(spec: ModelSpec, tp: int) -> int:
    """Live elements per token of the attention stage, per GPU: residual, normed input, q, k, v and output."""
    h, heads = spec.hidden_size, spec.num_attention_heads or 1
    attn_layer = next((layer for layer in spec.layers if layer.kv_heads and layer.head_dim), None)
    head_dim = attn_layer.head_dim if attn_layer else h // heads
    kv_heads = attn_layer.kv_heads if attn_layer else heads
    q = _per_rank(heads * head_dim, tp)
    return 2 * h + q + 2 * max(1, kv_heads // tp) * head_dim + q


def dense_forward_bytes_per_token(spec: ModelSpec, tp: int, act_bytes: int) -> int:
    """Peak live activation bytes per batched token of a dense decoder layer (or a MoE model's attention stage),
    per GPU: the larger of the MLP stage ``(3 x hidden + 3 x intermediate / tp)`` and the attention stage
    (residual, input, q, k, v, output), times ``act_bytes`` (see :func:`forward_bytes_per_token`)."""
    h = spec.hidden_size
    all_moe = bool(spec.num_experts and spec.moe_intermediate_size
                   and spec.routed_expert_layers >= spec.num_layers_decoder)
    mlp = 0 if all_moe else 3 * h + 3 * _per_rank(spec.intermediate_size, tp)
    return max(mlp, _attention_stage(spec, tp)) * act_bytes


# How vLLM's fused-MoE kernels size their workspaces, per release (read in the released code:
# model_executor/layers/fused_moe/fused_moe.py and modular_kernel.py), per routed token-expert pair, in
# elements of the activation dtype, with I = moe_intermediate_size / tp (the whole of it under expert
# parallelism) and H = hidden:
# - v06 (0.6 - 0.7): intermediate_cache1 [M, k, 2I], cache2 [M k, I], cache3 [M, k, H] -> 3I + H
# - v08 (0.8 - 0.13): cache1 and cache3 share one buffer of max(2I, H), cache2 [M k, I] -> max(2I, H) + I
# - v014 (0.14 and later, the modular kernel's TritonExperts workspaces, kept by the workspace manager):
#   [M, k, max(I, H)] + [M, k, max(2I, H)] -> max(I, H) + max(2I, H)
MOE_RULES = ("v06", "v08", "v014")


def moe_workspace_elements(rule: str, moe_intermediate: int, hidden: int) -> int:
    """Elements of the fused-MoE workspaces per routed (token, expert) pair under ``rule`` (:data:`MOE_RULES`)."""
    i, h = moe_intermediate, hidden
    if rule == "v06":
        return 3 * i + h
    if rule == "v08":
        return max(2 * i, h) + i
    if rule == "v014":
        return max(i, h) + max(2 * i, h)
    raise ValueError(f"unknown MoE workspace rule {rule!r}")


# The rules whose fused-MoE workspaces outlive the layer: from 0.14 the modular kernel takes them from the
# workspace manager (v1/worker/workspace.py ``WorkspaceManager.get_simultaneous``), one buffer per micro-batch that
# grows to the largest request and is never freed, so after the first MoE layer of the profile run it stays
# allocated through every later layer, the dummy sampler run and the profiler's closing reading.
KEPT_MOE_RULES = ("v014",)


def moe_workspace_bytes(spec: ModelSpec, tp: int, tokens: int, act_bytes: int, rule: str, chunk: int,
                        expert_parallel: bool = False) -> int:
    """Bytes of the fused-MoE workspaces of one MoE layer over ``tokens`` batched tokens, per GPU (0 for a dense
    model): ``min(tokens, chunk)`` tokens (``chunk`` 0: no chunking) x ``top_k`` routed pairs x
    :func:`moe_workspace_elements` x ``act_bytes``. The intermediate size shrinks with tp (not at all under expert
    parallelism), and at most to the hidden-sized floors."""
    if not routes_experts(spec):
        return 0
    k, h = spec.num_experts_per_token, spec.hidden_size
    inter = spec.moe_intermediate_size if expert_parallel else _per_rank(spec.moe_intermediate_size, tp)
    m = min(tokens, chunk) if chunk else tokens
    return m * k * moe_workspace_elements(rule, inter, h) * act_bytes


def moe_around_bytes(spec: ModelSpec, tokens: int, act_bytes: int) -> int:
    """Bytes alive around one MoE layer's experts call for every one of ``tokens`` tokens, per GPU (0 for a dense
    model): the residual, the normed input and the layer's output (``3 x hidden``), the router logits (``experts``,
    model dtype), the top-k weights and ids (12 B per pair: fp32 + int32 + int32) and a shared expert's output
    (``hidden``). Tokens are not split by tp: every rank routes the whole batch."""
    if not routes_experts(spec):
        return 0
    k, h = spec.num_experts_per_token, spec.hidden_size
    shared = h if spec.shared_expert_size else 0
    return tokens * ((3 * h + spec.num_experts + shared) * act_bytes + 12 * k)


FP8_GROUP = 128  # elements per fp32 scale of a per-token-group fp8 quantization (block-quantized checkpoints)


def _fp8_copy_bytes(rows: int, width: int) -> int:
    """An fp8 copy of a ``[rows, width]`` activation and its fp32 scale per 128-element group, bytes."""
    return rows * (width + 4 * -(-width // FP8_GROUP))


def moe_quantized_input_bytes(spec: ModelSpec, tp: int, tokens: int, rule: str, chunk: int,
                              expert_parallel: bool = False) -> int:
    """Bytes of the fp8 copies a fused-MoE layer with fp8 weights (w8a8) makes of its two GEMMs' inputs, per GPU
    (0 for a dense model): the layer input ``[M, hidden]`` and the activation output ``[M x top_k, I]``, each 1 B
    an element plus an fp32 scale per 128 (``per_token_group_quant_fp8``; a per-tensor scale is smaller), with
    ``M = min(tokens, chunk)`` (``chunk`` 0: no chunking). Per release (fused_moe.py / modular_kernel.py):

    - v06 (V0 0.6 - 0.7): ``invoke_fused_moe_kernel`` quantizes its own input and frees it with the call: the
      larger of the two;
    - v08 (0.8 - 0.13): ``fused_experts_impl`` keeps the chunk's quantized input (``qcurr_hidden_states``) through
      the second GEMM's (``qintermediate_cache2``): both;
    - v014 (0.14+): the prepare step quantizes the whole batch's input (``a1q``), alive through the experts, which
      quantize their activation output: both, the input over every token.

    DeepSeek-R1 at tp 8 (hidden 7,168, 8 experts of 2,048 / 8 = 256), 32,000 tokens, V0: 32,000 x (7,168 + 224) B
    = 0.22 GiB (the second input, 32,000 x 8 x (256 + 8) B, is smaller).
    """
    if not routes_experts(spec):
        return 0
    k, h = spec.num_experts_per_token, spec.hidden_size
    inter = spec.moe_intermediate_size if expert_parallel else _per_rank(spec.moe_intermediate_size, tp)
    m = min(tokens, chunk) if chunk else tokens
    first = _fp8_copy_bytes(tokens if rule == "v014" else m, h)
    second = _fp8_copy_bytes(m * k, inter)
    return max(first, second) if rule == "v06" else first + second


def moe_forward_bytes(spec: ModelSpec, tp: int, tokens: int, act_bytes: int, rule: str, chunk: int,
                      expert_parallel: bool = False) -> int:
    """Peak bytes of one MoE layer's forward over ``tokens`` batched tokens, per GPU (0 for a dense model): its
    workspaces (:func:`moe_workspace_bytes`) plus what stays alive around the experts call
    (:func:`moe_around_bytes`)."""
    return (moe_workspace_bytes(spec, tp, tokens, act_bytes, rule, chunk, expert_parallel)
            + moe_around_bytes(spec, tokens, act_bytes))


# How vLLM's MLA backend runs the profile run's prefill, per release (attention/backends/mla/utils.py and
# triton_mla.py): "v07" (V0 0.7.1 - 0.7.3, ``MLACommonImpl._forward_prefill_flash``) up-projects the whole batch's
# latent and pads v to the q/k head dim for flash-attn; "" (other releases): the generic attention stage.
MLA_PREFILL_RULES = ("", "v07")


def mla_prefill_bytes_per_token(spec: ModelSpec, tp: int, act_bytes: int, rule: str = "v07") -> int:
    """Peak live bytes per batched token of one MLA layer's prefill attention on V0 0.7.1 - 0.7.3, per GPU (0 for a
    model without MLA-latent layers or dimensions, MiniCPM3's expanded K / V among them, or under another ``rule``).

    With ``N = heads / tp`` (ceil), ``P`` / ``R`` / ``V`` the nope / rope / v head dims, ``L`` = kv_lora_rank, ``Q``
    = q_lora_rank and ``H`` = hidden, in elements of the activation dtype: the layer input (normed in place, held by
    the model's loop) and the residual ``2H``; ``DeepseekV2MLAAttention.forward``'s ``ckq`` and its norm ``2Q``, the
    ``kv_a_proj_with_mqa`` output ``L + R`` and ``kv_c_normed`` ``L``; the backend's ``q`` ``N(P + R)`` and rotated
    ``k_pe`` ``R``; ``_forward_prefill_flash``'s ``kv_b_proj`` output ``N(P + V)``, ``k`` and the zero-padded ``v``
    ``2N(P + R)`` and the attention output sliced to v ``NV``; then the larger of the flash output ``N(P + R)``
    (alive while it is sliced) and ``o_proj``'s output with its out-of-place all-reduce copy (``2H`` at tp > 1, else
    ``H``). DeepSeek-R1 at tp 8 (128 / 8 = 16 heads, 128 / 64 / 128, 512, 1,536, hidden 7,168), bf16:
    (14,336 + 3,072 + 576 + 512 + 3,072 + 64 + 4,096 + 6,144 + 2,048 + max(3,072, 14,336)) x 2 = 96,512 B.
    """
    if rule != "v07" or len(spec.mla_dims) != 5 or not all(spec.mla_dims[1:]):
        return 0
    if not any(layer.kind is LayerKind.MLA for layer in spec.layers):  # not MiniCPM3's expanded K / V
        return 0
    q_lora, kv_lora, nope, rope, v_dim = spec.mla_dims
    h, n = spec.hidden_size, _per_rank(spec.num_attention_heads or 1, tp)
    base = (2 * h + 2 * q_lora + (kv_lora + rope) + kv_lora + n * (nope + rope) + rope
            + n * (nope + v_dim) + 2 * n * (nope + rope) + n * v_dim)
    return (base + max(n * (nope + rope), (2 if tp > 1 else 1) * h)) * act_bytes


def forward_parts(spec: ModelSpec, tp: int, tokens: int, act_bytes: int, moe_rule: str = "v06", moe_chunk: int = 0,
                  expert_parallel: bool = False, fp8: bool = False, mla_rule: str = "") -> tuple[int, int]:
    """``(transient, kept)`` bytes of the profiled forward over ``tokens`` tokens, per GPU.

    ``kept``: the fused-MoE workspaces where the release keeps them after the layer (:data:`KEPT_MOE_RULES`),
    else 0. ``transient``: the forward's peak besides them - the larger of a dense layer (or a MoE model's
    attention stage, :func:`dense_forward_bytes_per_token`) and a MoE layer (with its workspaces where they are
    not kept, only what is alive around the experts call where they are: every layer after the first MoE one runs
    with the kept buffer allocated); ``fp8``: the weights run in fp8, and the MoE layer holds its inputs' fp8 copies
    too (:func:`moe_quantized_input_bytes`); ``mla_rule`` (:data:`MLA_PREFILL_RULES`): the release's MLA prefill
    attention stage, taken where larger (:func:`mla_prefill_bytes_per_token`). Qwen3-235B-A22B at tp 4 (hidden 4,096, 8 of 128 experts of 1,536 / 4 = 384),
    8,192 tokens, bf16, v014: kept 8,192 x 8 x (4,096 + 4,096) x 2 B = 1.0 GiB, transient max(0.19, 0.19) GiB."""
    dense = tokens * max(dense_forward_bytes_per_token(spec, tp, act_bytes),
                         mla_prefill_bytes_per_token(spec, tp, act_bytes, mla_rule))
    workspace = moe_workspace_bytes(spec, tp, tokens, act_bytes, moe_rule, moe_chunk, expert_parallel)
    around = moe_around_bytes(spec, tokens, act_bytes)
    if fp8 and around:
        around += moe_quantized_input_bytes(spec, tp, tokens, moe_rule, moe_chunk, expert_parallel)
    if moe_rule in KEPT_MOE_RULES:
        return max(dense, around), workspace
    return max(dense, workspace + around if around else 0), 0


def forward_bytes(spec: ModelSpec, tp: int, tokens: int, act_bytes: int, moe_rule: str = "v06", moe_chunk: int = 0,
                  expert_parallel: bool = False, fp8: bool = False, mla_rule: str = "") -> int:
    """Peak bytes of the profiled forward over ``tokens`` tokens, per GPU: :func:`forward_parts`' transient and
    kept bytes together."""
    return sum(forward_parts(spec, tp, tokens, act_bytes, moe_rule, moe_chunk, expert_parallel, fp8, mla_rule))


def lora_stack_bytes(spec: ModelSpec, tp: int, pp: int, max_loras: int, max_lora_rank: int, act_bytes: int) -> int:
    """Bytes of the LoRA weight slots an engine keeps per GPU for ``max_loras`` adapters of rank ``max_lora_rank``
    on every attention and dense-MLP projection (vLLM ``create_lora_weights``: per slot and projection an A
    ``[rank, input]`` and a B ``[output, rank]`` stack, the tp-split side divided by tp), on this GPU's layers:

    ``max_loras x rank x bytes x (7 x hidden + (2 x q + 2 x kv + 3 x intermediate) / tp)`` per layer
    (qkv: A 3 hidden, B (q + 2 kv) / tp; o: A q / tp, B hidden; gate/up: A 2 hidden, B 2 intermediate / tp;
    down: A intermediate / tp, B hidden). MoE experts' adapters are not counted (MoE models use the shared
    ``intermediate_size`` here). Llama-3-8B, 1 slot of rank 16, bf16: 16 x 2 x 81,920 = 2,621,440 B per layer.
    """
    if max_loras <= 0:
        return 0
    h = spec.hidden_size
    heads = spec.num_attention_heads or 1
    attn_layer = next((layer for layer in spec.layers if layer.kv_heads and layer.head_dim), None)
    head_dim = attn_layer.head_dim if attn_layer else h // heads
    q = heads * head_dim
    kv = (attn_layer.kv_heads if attn_layer else heads) * head_dim
    per_layer = 7 * h + (2 * q + 2 * kv + 3 * spec.intermediate_size) // tp
    layers = -(-spec.num_layers_decoder // pp)
    return max_loras * max_lora_rank * act_bytes * per_layer * layers


def padded_vocab(vocab_size: int, multiple: int = 64) -> int:
    """vLLM pads the vocab (embedding / LM head rows) to a multiple of 64."""
    return -(-vocab_size // multiple) * multiple


def sampler_bytes(rows: int, vocab_size: int, copies: int) -> int:
    """``copies`` fp32 tensors of ``[rows, padded vocab]`` alive at the sampler's peak (bytes)."""
    return copies * rows * padded_vocab(vocab_size) * 4


DEFAULT_SM_COUNT = 132  # an H100's, when the catalogue has no SM count for the GPU


def sampler_peak_bytes(spec: ModelSpec, rows: int, act_bytes: int, max_num_batched_tokens: int, path: str,
                       sm_count: int | None = None, tp: int = 1) -> int:
    """Peak bytes of the dummy sampler run on the Triton (0.17+) and FlashInfer (0.21+) paths, derived
    from vLLM's code (``_dummy_sampler_run``, ``Sampler.forward``, ``TopKTopPSampler``):

    - the logits ``compute_logits`` returns, ``[rows, padded vocab]`` in the model dtype, stay referenced
      by ``_dummy_sampler_run`` (Gemma 2's soft-capping makes two transient copies there, below this peak);
    - ``Sampler.forward``: ``logits.to(float32)``, ``[rows, vocab]`` x 4 B (the same tensor for fp32 models);
    - then two more fp32 ``[rows, vocab]`` tensors: Triton path: ``softmax`` probs and the exponential
      noise ``q`` of ``random_sample`` (the top-k/top-p kernel works in place); FlashInfer path: the
      top-k masked logits and their softmax probs;
    - Triton only: its per-program buffer, one fp32 vocab row per SM (``min(rows, SMs)`` rounded up to a
      power of two, at most the SM count), kept for later steps;
    - the model's output hidden states of the profiled batch, ``max_num_batched_tokens x hidden``, and of the
      sampled rows twice (``hidden_states[logit_indices]`` and its ``torch.rand_like`` copy), ``2 x rows x hidden``.
    Llama-3.1-8B on an H100, 1,024 rows (Triton): 1,024 x (128,256 x 2 + 128,256 x 12) + 132 x 128,256 x 4
    + (8,192 + 2 x 1,024) x 4,096 x 2 = 1,838,678,016 + 67,719,168 + 83,886,080 = 1,990,283,264 B (1.85 GiB).

    ``v2-greedy``: the V2 model runner's dummy run (vLLM 0.26 - 0.32, v1/worker/gpu/model_runner.py
    ``_dummy_sampler_run``) samples greedily from the default request states: no fp32 copy, no top-k / top-p, a
    Gumbel argmax over ``[rows, vocab / 1,024]`` partial maxima. Its peak is ``compute_logits``' all-gather at
    ``tp`` > 1 (``all_gather``: this rank's ``[rows, padded / tp]`` slice, the gathered ``[tp, rows, padded / tp]``
    and the ``movedim`` + ``reshape`` copy ``[rows, padded]``, all in the model dtype) beside the profiled batch's
    hidden states and the sampled rows' (``(max_num_batched_tokens + rows) x hidden``). ``v2-greedy-fp32`` (0.25):
    the same run, whose ``apply_sampling_params`` first copies the logits to fp32 (``[rows, vocab]`` x 4 B beside them).
    """
    vocab, padded = spec.vocab_size, padded_vocab(spec.vocab_size)
    logits = rows * padded * act_bytes
    if path.startswith("v2-greedy"):
        gather = 0 if tp <= 1 else rows * (padded // tp) * act_bytes + logits  # transient, beside the logits
        fp32 = rows * vocab * 4 if path == "v2-greedy-fp32" else 0
        return logits + max(gather, fp32) + (max_num_batched_tokens + rows) * spec.hidden_size * act_bytes
    if path == "flashinfer-old":
        # vLLM 0.8.0 - 0.9.0 with FlashInfer < 0.2.3 (the 0.8 Docker images): the fp32 logits and FlashInfer's
        # softmax probs; only the sampled rows' hidden states are alive (the batch's [T, hidden] output is freed)
        fp32 = rows * vocab * 4 * (1 if act_bytes == 4 else 2)
        return logits + fp32 + rows * spec.hidden_size * act_bytes
    fp32 = rows * vocab * 4 * (2 if act_bytes == 4 else 3)
    buffer = 0
    if path == "triton":
        sms = sm_count or DEFAULT_SM_COUNT
        programs = min(sms, rows)
        buffer = min(1 << (programs - 1).bit_length() if programs > 1 else 1, sms) * vocab * 4
    return logits + fp32 + buffer + (max_num_batched_tokens + 2 * rows) * spec.hidden_size * act_bytes
