"""vLLM's modelled releases: what each release's profile run measures and defaults to (:class:`Profile`), and which
modelled release a version string resolves to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.engines import (
    release_ranges,
    release_tuple,
    resolve_release,
)
from kvplan.units import GiB
from kvplan.frozen import frozen

if TYPE_CHECKING:
    from kvplan.model.spec import ModelSpec

ENGINE = "vllm"


@frozen
class Profile:
    """What the vLLM releases from ``first`` up to the next profile's ``first`` do when they size the KV cache.

    ``rounding``: ``floor`` (``requested = total * util`` as a float; blocks floor the difference) or
    ``ceil`` (``math.ceil(total * util)``). ``batch_rule``: which default table fills
    ``max_num_batched_tokens`` / ``max_num_seqs`` (``v0``, ``v1-70``, ``v1``, ``v1-160``). ``sampler``: the
    top-k/top-p path of the profiled dummy sampler run (``v0``, ``native``, ``flashinfer-installed``,
    ``triton``, ``flashinfer``); ``sampler_copies``: fp32 ``[rows, vocab]`` tensors alive at its peak on
    the torch-sort paths (the others are derived: :func:`sampler_peak_bytes`). ``cudagraph``: ``none``
    (captured after the KV cache, out of the ``1 - util`` slack), ``logged`` (estimated, not
    subtracted) or ``subtracted``. ``kv_tokens_rule``: the "GPU KV cache size" line: ``blocks``
    (``num_blocks x block_size``), ``groups`` (``num_blocks // num_groups x block_size``) or
    ``concurrency`` (``int(max_concurrency x max_model_len)``). ``concurrent_batches``: batches in
    flight, whose tokens sliding windows also hold (2 with async scheduling). ``non_torch_bytes``:
    the non-torch increase during profiling at tp 1. ``mm_profile``: how the profile run sizes its dummy
    image batch (:mod:`kvplan.engines.vllm_profile`). ``max_len_rule``: how the model's maximum length
    follows from YaRN rope parameters (:func:`~kvplan.engines.vllm_rules.model_max_len`): ``yarn-original``
    (``original_max_position_embeddings x factor``) or ``yarn-unscaled`` (``max_position_embeddings``, 0.30+).
    ``measure``: what the memory profiler charges besides the weights and the torch peak (:data:`MEASURES`).
    ``moe`` / ``moe_chunk``: the fused-MoE workspace shapes (:data:`kvplan.engines.MOE_RULES`) and
    ``VLLM_FUSED_MOE_CHUNK_SIZE`` (0: no chunking). ``mla_align``: V0 pads each MLA cache entry to 256 bytes
    of the model dtype (``VLLM_CUDA_MEM_ALIGN_KV_CACHE``). ``v0_chunk_tokens``: V0's ``max_num_batched_tokens``
    when it chunks prefills. ``mla_prefill``: how the MLA backend runs the profile run's prefill
    (:data:`kvplan.engines.MLA_PREFILL_RULES`: ``v07``, V0 0.7.1 - 0.7.3's up-projected, v-padded flash-attn
    prefill; "" the generic attention stage). ``lora_in_budget``: the LoRA weight slots are counted (V1: with the weights;
    V0 0.6.5 - 0.7.x create them after the weights are measured and charge them nowhere).
    ``printed_activation``: what the profiler's "peak activation" figure holds: ``torch-peak`` (the torch peak's
    increase during the profile run) or ``transient+graphs`` (0.27+: ``transient_peak_headroom``, the torch peak
    above what is still allocated after the run, plus the CUDA-graph estimate it subtracts, gpu_worker.py
    ``peak_activation_memory``; the "CUDAGraph memory" it prints beside it is the graphs captured later).
    ``tp_gather``: which communicator the tensor-parallel all-gather runs on (the logits' gather in the profile's
    dummy sampler run): ``torch`` (``DeviceCommunicatorBase.all_gather``, ``all_gather_into_tensor`` on the device
    group: the profile's first collective there makes torch.distributed's NCCL communicator, after a post-NCCL
    snapshot) or ``pynccl`` (0.26+: ``CudaCommunicator.all_gather`` takes PyNccl's on CUDA, and with all-reduce on
    custom all-reduce / symmetric memory / PyNccl no torch.distributed communicator is made during the profile; ROCm
    keeps the torch one).
    ``model_runner``: which models run on the V2 model runner (v1/worker/gpu/model_runner.py;
    :func:`runs_v2_model_runner`): ``v1`` none, ``v2-listed`` (0.25 - 0.28: :data:`V2_RUNNER_ARCHITECTURES` and the
    dense ones), ``v2`` (0.29+: every generating model, the default). ``v2_sampler``: that runner's dummy sampler
    run: ``fp32`` (0.25: greedy after an fp32 copy of the logits), ``greedy`` (0.26 - 0.32: the logits alone),
    ``warmup`` (0.33+: a second pass with SamplingParams.for_sampler_warmup, the fp32 top-k / top-p pipeline).
    ``change``: what this release changed.
    """

    version: str
    first: tuple[int, ...]
    change: str
    mode: str
    gpu_util: float
    rounding: str
    batch_rule: str
    sampler: str
    sampler_copies: int
    cudagraph: str
    refusal: str
    kv_tokens_rule: str
    non_torch_bytes: int
    concurrent_batches: int = 1
    mm_profile: str = "embeds"
    max_len_rule: str = "yarn-original"
    measure: str = "increase"
    moe: str = "v08"
    moe_chunk: int = 32 * 1024
    mla_align: bool = False
    v0_chunk_tokens: int = 2048
    lora_in_budget: bool = True
    mla_prefill: str = ""
    printed_activation: str = "torch-peak"
    tp_gather: str = "torch"
    model_runner: str = "v1"
    v2_sampler: str = "greedy"


# What the memory profiler charges besides the weights and the torch allocator's peak, by release (read in
# worker/worker.py, v1/worker/gpu_worker.py and utils/mem_utils.py of each release):
# - free-delta (V0 0.6.0 - 0.6.3): the drop in free memory since the worker started (NCCL, custom all-reduce,
#   cuBLAS; not the CUDA context, which exists before the first reading);
# - absolute (V0 0.6.4, V1 0.8.0 - 0.9.0): all device memory torch did not allocate, the CUDA context and any
#   other process on the GPU included;
# - increase (V0 0.6.5 - 0.10.x, V1 0.9.1 - 0.10.x): the non-torch increase since a snapshot taken before NCCL
#   starts: both tensor-parallel NCCL communicators (PyNccl and torch.distributed's) and custom all-reduce count;
# - post-nccl (V1 0.11 - 0.26): the snapshot moves after NCCL init: only what is created later counts, the
#   torch.distributed communicator made lazily by the profile run's first collective among it;
# - consumed (V1 0.27+): the whole drop in free memory since that snapshot plus the transient peak
#   (``total_consumed``): the same NCCL share, and the model runner's persistent buffers too.
MEASURES = ("free-delta", "absolute", "increase", "post-nccl", "consumed")
# Non-torch increase (cuBLAS / attention workspaces created during profiling) at tp 1, GPU-independent.
# Logged at tp 1 by releases that measure an increase (calibration part of benchmarks/corpus: 0.01 - 0.35 GiB,
# median 0.10 over 17 logs; 0.13 - 0.14 on an H100 machine): kvplan keeps 0.30 GiB, above nearly all of them
# (an overestimate promises less KV, the safe side; with it 59 vLLM 0.19 H100 logs agreed to 0.08% at the median).
# The one estimated constant kept off its calibration median: at the median (0.106 GiB) over-promising by > 1% rose
# from 11 to 19 of 49 calibration starts and 9 to 13 of 31 validation starts (docs/engines.md, "How sure kvplan is").
NON_TORCH_BYTES = round(0.30 * GiB)


def _p(version: str, first: tuple[int, ...], change: str, base: dict, **kw: object) -> Profile:
    return Profile(version, first, change, **{**base, **kw})  # type: ignore[arg-type]


# Each release differs from the one before it in the fields its ``change`` names; the source is the released
# code of that version (the first version where the change appears; the one before does not have it).
_V0 = dict(mode="V0", gpu_util=0.9, rounding="floor", batch_rule="v0", sampler="v0", sampler_copies=10,
           cudagraph="none", refusal="tokens", kv_tokens_rule="blocks", non_torch_bytes=NON_TORCH_BYTES,
           mm_profile="none", measure="free-delta", moe="v06", v0_chunk_tokens=512)
_V0_65 = dict(_V0, measure="increase", v0_chunk_tokens=2048, lora_in_budget=False)
# 0.8.0 - 0.9.0: V1 measures the absolute torch peak plus all non-torch memory; the sampler takes FlashInfer
# only if it is older than 0.2.3 (TopKTopPSampler sends newer ones to forward_native): the 0.8 Docker images
# ship FlashInfer 0.2.1 (the FlashInfer path), a plain pip install none (native); the fused-MoE caches share a buffer.
_V1_8 = dict(_V0, mode="V1", batch_rule="v1-70", sampler="flashinfer-old", sampler_copies=0, refusal="bytes",
             mm_profile="ceil-placeholder", measure="absolute", moe="v08", v0_chunk_tokens=2048)
# 0.9.1: memory_profiling (the increase since a pre-NCCL snapshot); FlashInfer's sampler when it is installed
# (an optional extra of the wheel; in the project's Docker images); the token line by KV-cache groups.
_V1_91 = dict(_V1_8, batch_rule="v1", kv_tokens_rule="groups", mm_profile="placeholder", measure="increase",
              sampler="flashinfer-installed", sampler_copies=0)
_V1_11 = dict(_V1_91, measure="post-nccl", mm_profile="scattered")
_V1_12 = dict(_V1_11, sampler="native", sampler_copies=10, moe_chunk=16 * 1024, mm_profile="scattered-item")
_V1_14 = dict(_V1_12, mm_profile="embeds", rounding="ceil", moe="v014")
_V1_17 = dict(_V1_14, sampler="triton", sampler_copies=0)
_V1_20 = dict(_V1_17, moe_chunk=0, cudagraph="subtracted", gpu_util=0.92)
_V1_21 = dict(_V1_20, kv_tokens_rule="concurrency", sampler="flashinfer")
_V1_27 = dict(_V1_21, concurrent_batches=2, measure="consumed", printed_activation="transient+graphs",
              tp_gather="pynccl", model_runner="v2-listed")
PROFILES: dict[str, Profile] = {p.version: p for p in (
    _p("0.6", (0, 6, 0), "V0 engine: the drop in free memory since start-up is charged", _V0),
    _p("0.6.4", (0, 6, 4), "V0 charges all non-torch memory (the CUDA context included); chunked prefill 2048",
       _V0, measure="absolute", v0_chunk_tokens=2048),
    _p("0.6.5", (0, 6, 5), "V0 memory profiling (PR #10511): the non-torch increase since a pre-NCCL snapshot; "
       "LoRA slots charged nowhere", _V0_65),
    _p("0.7.1", (0, 7, 1), "V0 MLA for DeepSeek V2 / V3 (0.7.1): the load absorbs W_UK / W_UV into the query and "
       "output projections (vllm_weights); its prefill up-projects the whole batch's latent (mla/utils.py)",
       _V0_65, mla_prefill="v07"),
    _p("0.7.2", (0, 7, 2), "V0 pads MLA cache entries to 256 bytes (VLLM_CUDA_MEM_ALIGN_KV_CACHE)", _V0_65,
       mla_align=True, mla_prefill="v07"),
    _p("0.8", (0, 8, 0), "V1 engine by default: absolute torch peak + all non-torch memory; the sampler takes "
       "FlashInfer < 0.2.3 (the Docker images) or the native path; batch defaults >= 70 GiB include the A100", _V1_8),
    # 0.9: get_batch_defaults excludes the A100 from the >= 70 GiB tier (read in 0.9.0.1)
    _p("0.9", (0, 9, 0), "A100 out of the >= 70 GiB batch tier; multimodal items sized by their prompt tokens", _V1_8, batch_rule="v1",
       mm_profile="placeholder"),
    _p("0.9.1", (0, 9, 1), "memory profiling of the increase since a pre-NCCL snapshot; FlashInfer sampler when "
       "installed; token line num_blocks // groups x block size", _V1_91),
    _p("0.11", (0, 11, 0), "the memory snapshot moves after NCCL init; multimodal profiling copies each dummy "
       "encoder output into an encoder-budget buffer", _V1_11),
    # 0.12: VLLM_USE_FLASHINFER_SAMPLER becomes opt-in: the native torch sort path, 10 copies, calibrated on
    # five H100 logs (activation 9.6 - 9.9 copies of rows x vocab x 4 B) and vLLM 0.11.1 on ROCm (native there).
    _p("0.12", (0, 12, 0), "FlashInfer sampler opt-in: native top-k/top-p (torch sort); fused-MoE chunks of 16,384; "
       "a dummy encoder output shorter than its item's tokens is copied into an item-sized buffer", _V1_12),
    _p("0.13", (0, 13, 0), "multimodal profiling counts an image's embeddings and caches the encoder outputs as "
       "they are", _V1_12, mm_profile="embeds"),
    _p("0.14", (0, 14, 0), "requested memory = ceil(total x util) (request_memory); the modular fused-MoE "
       "kernel's workspaces", _V1_14),
    # 0.17: apply_top_k_top_p runs a Triton kernel in place for >= 8 rows (no sort copies); the sampler peak is
    # derived from the code (sampler_peak_bytes). The all-reduce fusion workspace is on by default.
    _p("0.17", (0, 17, 0), "Triton top-k/top-p in place (no sort copies); all-reduce + RMSNorm fusion", _V1_17),
    _p("0.18", (0, 18, 0), "CUDA-graph memory estimated and logged (subtracted only with "
       "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1); fused MoE unchunked", _V1_17, cudagraph="logged", moe_chunk=0),
    _p("0.20", (0, 20, 0), "default gpu_memory_utilization 0.92; CUDA-graph estimate subtracted by default", _V1_20),
    # 0.20.1: _report_kv_cache_config prints int(max_concurrency x max_model_len) ("a naive num_blocks //
    # num_groups x block_size formula underestimates capacity"; vllm#40691 reported the old line on 0.19.0).
    _p("0.20.1", (0, 20, 1), "token line int(max_concurrency x max_model_len)", _V1_20, kv_tokens_rule="concurrency"),
    # 0.21: VLLM_USE_FLASHINFER_SAMPLER defaults to True again: FlashInfer's top_k_top_p_sampling_from_logits
    # (top-k mask copy + softmax probs) on CUDA GPUs with more than 16 SMs; ROCm keeps the Triton path.
    _p("0.21", (0, 21, 0), "FlashInfer top-k/top-p sampler on by default (CUDA)", _V1_21),
    # 0.25: _resolve_fi_ar_backend's "auto" picks mnnvl on one node too (the cudagraph hang fixed in FlashInfer
    # 0.6.12; read in 0.24.0 - trtllm on one node - and 0.25.0): one 512 MiB multicast buffer on NVSwitch boards,
    # and beside it the quant fusion's own trtllm workspace (three 512 MiB buffers), which 0.26 no longer makes
    # (vllm_overhead.FUSION_MNNVL_FROM, FUSION_QUANT_APART)
    _p("0.25", (0, 25, 0), "all-reduce fusion: FlashInfer's mnnvl backend on one node too, the quant fusion's "
       "trtllm workspace beside it", _V1_21, model_runner="v2-listed", v2_sampler="fp32"),
    # 0.26: sliding-window / chunked specs reserve window - 1 + max_in_flight_tokens (2 batches with async
    # scheduling on one pipeline stage). CudaCommunicator.all_gather sends the tensor-parallel all-gather through
    # PyNccl on CUDA (0.25.0 overrides it only for symmetric-memory dim-0 gathers, the rest going to torch's
    # all_gather_into_tensor): the profile makes no torch.distributed communicator (read in 0.24.0, 0.25.0, 0.26.0,
    # 0.27.0, 0.28.0).
    _p("0.26", (0, 26, 0), "windows hold the in-flight tokens of 2 async batches; the tp all-gather on PyNccl "
       "(no torch.distributed communicator in the profile)", _V1_21, concurrent_batches=2, tp_gather="pynccl",
       model_runner="v2-listed"),
    # 0.27: buffers still allocated after the profile run (the kept fused-MoE workspaces) are consumed memory; the
    # printed peak activation is the transient peak above them plus the CUDA-graph estimate
    _p("0.27", (0, 27, 0), "the profiler charges the whole drop in free memory (total_consumed)", _V1_27),
    _p("0.28", (0, 28, 0), ">= 160 GiB batch tier (16384 tokens for vllm serve)", _V1_27, batch_rule="v1-160"),
    # 0.29: VllmConfig.use_v2_model_runner takes the V2 model runner for every model the features allow (the list of
    # architectures is gone; read in 0.29.0 - 0.33.0)
    _p("0.29", (0, 29, 0), "the start-up check keeps the null block out (num_blocks - 1 must hold one request); the "
       "V2 model runner for every model", _V1_27, batch_rule="v1-160", refusal="null_block", model_runner="v2"),
    # 0.30: _get_and_verify_max_len no longer scales max_position_embeddings by a YaRN factor (yarn,
    # deepseek_yarn, deepseek_llama_scaling join su/longrope/llama3; vllm#56446, read in 0.29.0 and 0.30.0)
    _p("0.30", (0, 30, 0), "the model's maximum length ignores YaRN's factor (max_position_embeddings as it is)",
       _V1_27, batch_rule="v1-160", refusal="null_block", max_len_rule="yarn-unscaled", model_runner="v2"),
    # 0.33: _dummy_sampler_run samples a second time with SamplingParams.for_sampler_warmup (temperature, top-k,
    # top-p, min-p, penalties, logit bias, logprobs): warmup_kernels runs that pipeline after the KV cache is sized,
    # so the profile pays for it (fp32 logits, the top-k / top-p sampler)
    _p("0.33", (0, 33, 0), "the V2 model runner's dummy sampler adds a warmup-parameter pass (fp32, top-k / top-p)",
       _V1_27, batch_rule="v1-160", refusal="null_block", max_len_rule="yarn-unscaled", model_runner="v2",
       v2_sampler="warmup"),
)}
VERSIONS = tuple(PROFILES)
DEFAULT_VERSION = VERSIONS[-1]
NEWEST_CHECKED = (0, 33, 0)  # the newest release whose source was read (vllm 0.33.0)
RANGES = release_ranges({k: p.first for k, p in PROFILES.items()})


def resolve_version(text: str | None) -> tuple[str, str]:
    """``(modelled release, note)`` for any PEP 440 vLLM version (``0.19.0``, ``0.10.1.1``,
    ``0.15.2rc1.dev93+g11a4c9d30``); ``None`` is the newest modelled release. Refuses versions older than
    every modelled release (InputError listing the ranges)."""
    if text is None:
        return DEFAULT_VERSION, ""
    key, note = resolve_release(ENGINE, text, {k: p.first for k, p in PROFILES.items()})
    if release_tuple(text, ENGINE) > NEWEST_CHECKED:
        note += f"; newer than the newest release checked ({'.'.join(map(str, NEWEST_CHECKED))})"
    return key, note


def profile(version: str) -> Profile:
    """The modelled release for ``version``: a key of :data:`PROFILES` or any version it covers."""
    if version in PROFILES:
        return PROFILES[version]
    return PROFILES[resolve_version(version)[0]]


# The V2 model runner (vllm/v1/worker/gpu/model_runner.py), the default for a model by VllmConfig.use_v2_model_runner
# (read in 0.25.0, 0.26.0, 0.27.0, 0.27.1 and 0.28.0): a generating model that is not attention-free and either is in
# the release's DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES or is neither MoE nor (unless listed) hybrid, unless a feature it
# lacks is on (ngram speculative decoding among them). Its profile_cudagraph_memory returns 0 through 0.28: those
# releases subtract no CUDA-graph estimate for such a model. Its dummy sampler run samples greedily from the default
# request states (sample/sampler.py: no logits processing, no top-k / top-p, no fp32 copy: the logits alone), and its
# sampler keeps per-request states on the GPU (sample/penalties.py output_bin_counts [max_num_reqs, vocab] int32 among
# them), made after the weights are measured: :func:`~kvplan.engines.vllm_overhead.v2_sampler_state_bytes`.
# 0.23 - 0.24 took it for fewer models (inside kvplan's 0.21 rules, which keep the estimate); 0.29 and later take it
# for every model (Profile.model_runner "v2") and estimate the graphs again.
V2_RUNNER_ARCHITECTURES = {
    "0.25": frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"}),
    "0.26": frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "InklingForCausalLM",
                       "InklingForConditionalGeneration", "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM"}),
    "0.27": frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "InklingForCausalLM",
                       "InklingForConditionalGeneration", "KimiK3ForConditionalGeneration",
                       "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM"}),
    "0.28": frozenset({"DeepseekV2ForCausalLM", "DeepseekV4ForCausalLM", "GraniteMoeForCausalLM", "InklingForCausalLM",
                       "InklingForConditionalGeneration", "KimiK3ForConditionalGeneration",
                       "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM"}),
}
V2_RUNNER_HYBRIDS_LISTED_FROM = (0, 27, 0)  # 0.25 - 0.26 take no hybrid; 0.27+ a listed one
# ROCM_DEFAULT_MRV1_ARCHITECTURES: on ROCm 0.29 - 0.31 keep these on the V1 runner (GlmMoeDsa from 0.31; none in 0.32,
# inside kvplan's 0.30 rules, which keep the list: the V1 runner's larger sampler peak is the side of less KV)
ROCM_V1_RUNNER_ARCHITECTURES = {"0.29": frozenset({"DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM"}),
                                "0.30": frozenset({"DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM",
                                                   "GlmMoeDsaForCausalLM"})}


def runs_v2_model_runner(p: Profile, architecture: str, moe: bool, hybrid: bool, attention_free: bool,
                         speculative: str | None, platform: str = "cuda") -> bool:
    """Whether release ``p`` runs this model on the V2 model runner (``Profile.model_runner``: 0.25 - 0.28 by
    :data:`V2_RUNNER_ARCHITECTURES`, 0.29+ every model but an attention-free one, which kvplan keeps on V1, and
    ngram drafting, which V2 lacks), whose dummy sampler run is ``Profile.v2_sampler`` and whose sampler keeps its
    states on the GPU; 0.25 - 0.28 also subtract no CUDA-graph estimate there. On ROCm 0.29 - 0.31 keep DeepSeek V3.2
    / V4 and GLM-5's sparse-MLA models on V1 (:data:`ROCM_V1_RUNNER_ARCHITECTURES`)."""
    if p.model_runner == "v1" or attention_free or speculative in ("ngram", "ngram_gpu"):
        return False
    if p.model_runner == "v2":
        return not (platform == "rocm" and architecture in ROCM_V1_RUNNER_ARCHITECTURES.get(p.version, ()))
    listed = V2_RUNNER_ARCHITECTURES[p.version]
    if architecture in listed:
        return not hybrid or p.first >= V2_RUNNER_HYBRIDS_LISTED_FROM
    return not moe and not hybrid


def on_v2_runner(p: Profile, spec: ModelSpec, speculative: str | None, platform: str = "cuda") -> bool:
    """Whether release ``p`` runs ``spec`` on its V2 model runner (:func:`runs_v2_model_runner`, 0.25+)."""
    state = [layer.is_state for layer in spec.layers]
    return runs_v2_model_runner(p, spec.architecture, bool(spec.num_experts), any(state), bool(state) and all(state),
                                speculative, platform)
