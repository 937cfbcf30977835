"""SGLang's KV pool, release by release: ``mem_fraction_static`` defaults and the token pool it allocates.

SGLang does not profile activations. Every release (read in the sglang wheels 0.3.6 - 0.5.23,
``ModelRunner.profile_max_num_token`` and its successors) measures the free memory after its distributed init
(``total_gpu_memory``, misleadingly named: the free memory before the weights load, the minimum over ranks) and
again after loading, and keeps ``rest = free_after_load - free_before_load x (1 - mem_fraction_static)`` for the
pool: ``pool = (total - used_before_load) x frac - weights``. Activations and CUDA graphs live in ``1 -
mem_fraction_static`` (every release captures its graphs after the pool: no term of the pool). Its two terms are what
its log prints: the weights ("Load weight end ... mem usage": the weights' bytes and what loading holds more) and the
memory in use before loading (the total less "Load weight begin"'s avail mem) x the fraction; 0.3 - 0.4.6 at tp >= 2
also pay in full the NCCL communicator their free memory's all-reduce creates after the first reading
(:func:`late_comm_bytes`). ``max_total_num_tokens = pool // cell_size`` (rounded down to the page size from 0.4.6),
``cell_size`` the KV bytes of one token over this GPU's layers (MLA: ``(kv_lora_rank + qk_rope_head_dim) x layers x
bytes``); sliding-window models split the pool between full and windowed layers where the release gives them a
hybrid SWA pool (:func:`hybrid_swa`), else hold every token in every layer; Mamba / linear-attention hybrids
(0.5.2+) keep their state layers in a pool of request slots carved out of the budget first
(:mod:`kvplan.engines.sglang_mamba`: :func:`split_state_pool`, :func:`mamba_slots`), the token pool holding the
full-attention layers only. Page size 1 is expressed as ``EngineDefaults(block_size=1)``, so the plan's blocks are
tokens and the shared pool math applies.

``mem_fraction_static``'s default changed often (:data:`RELEASES`, in :mod:`kvplan.engines.sglang_releases`;
:func:`mem_fraction_static`): a tp ladder (0.3 - 0.4.5), a large-GPU reserve (0.4.6, 0.4.7), a reserve by GPU size
(0.4.8 - 0.5.2), and from 0.5.3 an estimate of the activations and CUDA graphs (``_handle_gpu_memory_settings``).
The GPU size in these rules is nvidia-smi's total in MiB (the smallest card's), not the runtime's: the catalogue's
``smi_memory_mib``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kvplan import memory
from kvplan.engines import (USAGE_CONTEXTS, Budget, Device, EngineDefaults, Features, Launch, ModelLength, Term,
                            given, launch_flags, length_refusal, lora_stack_bytes, release_tuple, scaled_length)
from kvplan.engines.sglang_mamba import (  # noqa: F401 - the Engine interface's rules and the state pool's, re-exported
    MAMBA_CONV_DTYPE, MAMBA_FIXED_SLOTS, MAMBA_FULL_MEMORY_RATIO, MAMBA_SLOTS_PER_RUNNING_REQUEST, MAMBA_SSM_DTYPE,
    mamba_cache_per_req, mamba_radix_cache, mamba_slots, mamba_slots_per_request, split_state_pool)
from kvplan.engines.sglang_overhead import (  # noqa: F401 - the memory in use before loading, re-exported
    CONTEXT_BYTES, LATE_COMM_BOARDS, late_comm_bytes, pre_load, pre_load_bytes)
from kvplan.engines.sglang_releases import (  # noqa: F401 - the Engine interface's releases, re-exported
    DEFAULT_VERSION, ENGINE, FIRSTS, NEWEST_CHECKED, RANGES, RELEASES, VERSIONS, Release, release, resolve_version)
from kvplan.errors import InputError
from kvplan.model.spec import LayerCache, LayerKind, ModelSpec
from kvplan.units import DType, GiB, MiB, plural

BLOCK_SIZES: tuple[int, ...] | None = None  # --page-size takes any positive number of tokens
LONG_LEN_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"  # ModelConfig._derive_context_length's override
PAGE_SIZE = 1  # --page-size default: one token per page
MAX_RUNNING_REQUESTS_CEILING = 4096
SWA_FULL_TOKENS_RATIO = 0.8  # --swa-full-tokens-ratio: windowed layers' tokens per full layers' token
SMI_EXTRA_MIB = 480  # nvidia-smi's total less the runtime's, when the catalogue has no nvidia-smi figure
# What "Load weight end ... mem usage" shows above the checkpoint's bytes per GPU (loader buffers, rotary caches,
# padded vocabularies): +0.20 / +0.21 / +0.28 GiB at tp 2 - 4 (calibration part of benchmarks/corpus:
# sglang-projecta-4x4090, sglang-exp001-2x4090, sglang-llmsinclouds-4xl4). Part of the weights term (what that line
# prints), charged in full: it is in use before the pool is sized.
LOAD_EXTRA_BYTES = round(0.20 * GiB)

# (GiB upper bound of the GPU's memory, chunked_prefill_size, cuda_graph_max_bs at tp < 4, at tp >= 4)
_TIERS = {
    "0.5.3": ((20, 2048, 8, 8), (35, 2048, 16, 80), (60, 4096, 32, 160), (160, 8192, 256, 512),
              (math.inf, 16384, 512, 512)),
    "0.5.5": ((20, 2048, 8, 8), (35, 2048, 24, 80), (60, 4096, 32, 160), (160, 8192, 256, 512),
              (math.inf, 16384, 512, 512)),
    "0.5.20": ((20, 2048, 8, 8), (35, 4096, 48, 160), (60, 4096, 32, 160), (160, 8192, 256, 512),
               (math.inf, 16384, 512, 512)),
}


def smi_mib(gpu_memory_bytes: int | None, device: Device | None = None) -> float:
    """The GPU memory SGLang's defaults read: nvidia-smi's total (MiB), else the runtime's + a typical gap."""
    if device is not None and device.smi_memory_bytes:
        return device.smi_memory_bytes / MiB
    return (gpu_memory_bytes or 0) / MiB + SMI_EXTRA_MIB if gpu_memory_bytes else 0.0


def _tier(r: Release, mib: float, tp: int) -> tuple[int, int]:
    """``(chunked_prefill_size, cuda_graph_max_bs)`` defaults of release ``r`` for a GPU of ``mib`` MiB."""
    if r.tiers == "small-25000":  # 0.3
        return (2048, 4) if mib < 25_000 else (8192, 160)
    if r.tiers == "small-tp":  # 0.4.0 - 0.4.7
        chunk = 16384 if r.first >= (0, 4, 7) and mib > 180_000 else 2048 if mib < 25_000 else 8192
        return chunk, ((8 if tp < 4 else 80) if mib < 25_000 else 160)
    if r.tiers == "0.4.8":  # 0.4.8 - 0.5.2
        if mib and mib < 35 * 1024:
            return 2048, 8 if tp < 4 else 80
        return (8192 if mib < 160 * 1024 else 16384), (512 if mib > 160_000 else 256 if mib > 90 * 1024 else 160)
    if not mib:
        return 4096, 160
    limit, chunk, small, wide = next(row for row in _TIERS[r.tiers] if mib < row[0] * 1024)
    return chunk, small if tp < 4 else wide


def chunked_prefill_size(version: str, gpu_memory_bytes: int | None, tp: int = 1, device: Device | None = None) -> int:
    """SGLang's default ``--chunked-prefill-size`` (tokens) for this GPU."""
    return _tier(release(version), smi_mib(gpu_memory_bytes, device), tp)[0]


def cuda_graph_max_bs(version: str, gpu_memory_bytes: int | None, tp: int = 1, device: Device | None = None) -> int:
    """SGLang's default ``--cuda-graph-max-bs`` for this GPU."""
    return _tier(release(version), smi_mib(gpu_memory_bytes, device), tp)[1]


def _ladder(world: int, tp8: float = 0.81) -> float:
    return 0.79 if world >= 16 else tp8 if world >= 8 else 0.85 if world >= 4 else 0.87 if world >= 2 else 0.88


def piecewise_graph_tokens(max_tokens: int) -> int:
    """How many piecewise CUDA graphs 0.5.10+ capture up to ``max_tokens`` tokens (each reserves 8 MiB)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
             + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return sum(1 for s in sizes if s <= max_tokens)


def mem_fraction_static(version: str, gpu_memory_bytes: int | None, tp: int = 1, pp: int = 1,
                        device: Device | None = None, spec: ModelSpec | None = None) -> float:
    """SGLang's default ``--mem-fraction-static`` (``ServerArgs``), by release:

    - 0.3: 0.88, 0.87 (tp >= 2), 0.85 (>= 4), 0.82 (>= 8), 0.79 (>= 16); 0.4 - 0.4.5: the same with 0.81 at 8;
    - 0.4.6: the ladder up to 80 GiB, above it ``(gpu - 13 GiB) / gpu``; 0.4.7: the ladder by tp x pp, above
      96 GiB ``min(base + 48 GiB x (1 - base) / gpu, (gpu - 18 GiB) / gpu)``, 0.79 above 180 GB;
    - 0.4.8 - 0.5.2: ``round((gpu - reserved) / gpu, 3)``, reserved ``(2.8 + tp x pp / 10)`` GiB below 35 GiB,
      ``(9.5 + tp x pp / 2)`` below 90, ``(12 + tp x pp / 2)`` below 160, else 32 GiB;
    - 0.5.3+: reserved ``512 + max(chunked_prefill_size, 2048) x 1.5 + cuda_graph_max_bs x 2 + tp x pp / 8 x 1024``
      MiB (0.5.10+: + 8 MiB per piecewise CUDA graph, 1.5 GiB for MLA models), at least 10 GiB above 60 GiB.
    ``gpu`` is nvidia-smi's MiB (:func:`smi_mib`); 0.88 when unknown. H100 (81,559 MiB) at tp 1: 0.874 (0.4.8),
    0.835 (0.5.3), 0.830 (0.5.10).
    """
    r = release(version)
    world = tp * pp
    mib = smi_mib(gpu_memory_bytes, device)
    if r.fraction == "ladder-0.3":
        return _ladder(tp, 0.82)
    if r.fraction == "ladder":
        return _ladder(tp)
    if r.fraction == "ladder-13g":
        return _ladder(tp) if mib <= 81920 else (mib - 13 * 1024) / mib
    if r.fraction == "ladder-big":
        base = _ladder(world) if mib <= 81920 else 0.88
        if mib > 180_000:
            return 0.79
        return min(base + 48 * 1024 * (1 - base) / mib, (mib - 18 * 1024) / mib) if mib > 96 * 1024 else base
    if mib <= 0:
        return 0.88
    if r.fraction == "tiers":
        gib = (2.8 + world / 10 if mib < 35 * 1024 else 9.5 + world / 2 if mib < 90 * 1024
               else 12 + world / 2 if mib < 160 * 1024 else 32)
        return round((mib - gib * 1024) / mib, 3)
    chunk, bs = _tier(r, mib, tp)
    reserved = 512 + max(chunk, 2048) * 1.5 + bs * 2 + world / 8 * 1024
    if r.graph_reserve and pp == 1:
        mla = spec is not None and any(layer.kind is LayerKind.MLA for layer in spec.layers)
        reserved += 1.5 * 1024 if mla else piecewise_graph_tokens(chunk) * 8
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mib - reserved) / mib, 3)


def defaults(version: str, gpu_memory_bytes: int | None, is_cpu: bool, *, gpu_name: str | None = None,
             max_model_len: int | None = None, usage_context: str = "serve", tp: int = 1,
             pp: int = 1, device: Device | None = None, spec: ModelSpec | None = None,
             chunked_prefill: bool | None = None, features: Features | None = None) -> EngineDefaults:
    """SGLang's defaults: ``mem_fraction_static`` as ``gpu_util``, page size 1 as ``block_size``,
    ``chunked_prefill_size`` as ``max_num_batched_tokens``; ``max_num_seqs`` is the 4096 ceiling of
    ``max_running_requests`` (the real value follows the pool: :func:`max_running_requests`). ``chunked_prefill``
    is vLLM's switch (the planner refuses it for SGLang, whose off is ``--chunked-prefill-size -1``)."""
    r = release(version)
    if is_cpu:
        raise InputError("SGLang's CPU backend is not modelled", "use --engine vllm for a CPU plan")
    if usage_context not in USAGE_CONTEXTS:
        raise InputError(f"unknown usage context {usage_context!r}", "use serve or llm")
    return EngineDefaults(ENGINE, r.version, mem_fraction_static(r.version, gpu_memory_bytes, tp, pp, device, spec),
                          PAGE_SIZE, chunked_prefill_size(r.version, gpu_memory_bytes, tp, device),
                          MAX_RUNNING_REQUESTS_CEILING, mode="sglang", usage_context=usage_context,
                          cudagraph_profiled=False, refusal="pool", kv_tokens_rule="blocks",
                          charges_other_processes=True,
                          release_range=RANGES[r.version], pp_partition=r.pp_partition, pp_free_min=True)


def cell_size_bytes(layers: tuple[LayerCache, ...] | ModelSpec, kv_dtype: DType) -> int:
    """SGLang's ``cell_size``: KV bytes of one token over all (this GPU's) layers.

    GQA/MHA: ``kv_heads x head_dim x layers x 2 x bytes``; MLA: ``(kv_lora_rank + qk_rope_head_dim) x
    layers x bytes`` (one latent, no separate V).
    """
    return memory.kv_bytes_per_token(layers, kv_dtype)


def max_total_num_tokens(kv_budget_bytes: int, cell_size: int, page_size: int = 1) -> int:
    """``max_total_num_tokens = pool bytes // cell_size``, rounded down to whole pages (0 when negative)."""
    tokens = max(0, kv_budget_bytes // cell_size) if cell_size > 0 else 0
    return tokens // page_size * page_size


def max_running_requests(total_num_tokens: int, context_len: int, version: str = DEFAULT_VERSION) -> int:
    """The default ``max_running_requests``: ``min(tokens // 2, clamp(int(tokens / context_len x 512), 2048,
    4096))`` (the clamp one higher up to 0.4.6, where the request pool had a padding slot)."""
    if context_len <= 0:
        raise InputError(f"invalid context length {context_len}")
    extra = 1 if release(version).clamp_plus_one else 0
    clamp = min(max(int(total_num_tokens / context_len * 512), 2048), MAX_RUNNING_REQUESTS_CEILING) + extra
    return max(1, min(total_num_tokens // 2, clamp))


def budget(total_bytes: int, gpu_util: float, weights: Term, activation: Term | None, overhead: Term | None,
           cudagraph: Term | None, kv_budget_override: int | None, *, spec: ModelSpec, tp: int,
           max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int, is_cpu: bool,
           version: str = DEFAULT_VERSION, pp: int = 1, device: Device | None = None,
           features: Features | None = None, max_model_len: int | None = None, stage: memory.PipelineStage | None = None) -> Budget:
    """SGLang's pool budget per GPU: ``(total - used_before_load) x mem_fraction_static - weights``.

    ``stage`` (a pipeline stage) changes nothing here: every rank sizes its pool from the smallest free memory over
    all ranks (``pp_free_min``), so the planner passes the heaviest stage's weights.

    ``weights`` is what loading uses (the weights' bytes + :data:`LOAD_EXTRA_BYTES`, "Load weight end ... mem
    usage"); ``overhead`` is the memory in use before loading times the fraction (the fraction applies to the free
    memory then; other processes' memory too: SGLang charges it, ``charges_other_processes``), plus 0.3 - 0.4.6's
    late NCCL communicator in full (:func:`late_comm_bytes`); LoRA adapters' buffers, allocated between loading and the pool, come out of it in full. No
    activation or CUDA-graph term: both live in ``1 - mem_fraction_static``. ``--kv-budget`` (like
    ``--max-total-tokens`` x cell size) replaces the result.
    """
    release(version)
    features = features or Features()
    if is_cpu:
        raise InputError("SGLang's CPU backend is not modelled", "use --engine vllm for a CPU plan")
    usable = math.floor(total_bytes * gpu_util)
    notes: list[str] = []
    if activation is None:
        activation = Term("activation", 0, "none: SGLang keeps activations in 1 - mem_fraction_static")
    if cudagraph is None:
        cudagraph = Term("cudagraph", 0, "none: SGLang captures CUDA graphs in 1 - mem_fraction_static")
    if not given(weights):  # what "Load weight end ... mem usage" prints: the weights and what loading holds more
        weights = Term("weights", weights.bytes + LOAD_EXTRA_BYTES, f"{weights.source} + {LOAD_EXTRA_BYTES / GiB:.2f} "
                       "GiB SGLang's loading holds above the weights' bytes")
    if overhead is None:
        first, late = pre_load(tp, pp, device), late_comm_bytes(version, tp, pp, device)
        before = first.bytes
        charged = math.floor(before * gpu_util) + late
        parts = " + ".join(f"{name} {size / GiB:.2f}" for name, size in first.parts())
        source = (f"estimate: {before / GiB:.2f} GiB in use before loading ({parts}) x mem_fraction_static {gpu_util:g}"
                  + (f" + {late / GiB:.2f} GiB the NCCL communicator the free memory's all-reduce creates after "
                     "the first reading" if late else ""))
        if features.lora:
            # SGLang sizes its adapter buffers for --max-loras-per-batch slots of --max-lora-rank
            stacks = lora_stack_bytes(spec, tp, pp, features.max_loras, features.max_lora_rank, act_bytes)
            charged += stacks
            source += f" + LoRA buffers {features.max_loras} x rank {features.max_lora_rank} = {stacks / GiB:.2f} GiB"
        overhead = Term("overhead", charged, source)
    if features.speculative:
        notes.append("SGLang's speculative decoding pools (the draft model's KV and the enlarged target pool) are "
                     "not modelled: pass --kv-budget with the log's KV size")
    if kv_budget_override is not None:
        kv, source = kv_budget_override, "--kv-budget"
    else:
        kv = usable - weights.bytes - activation.bytes - overhead.bytes - cudagraph.bytes
        source = "total x mem_fraction_static - weights - overhead"
    return Budget(total_bytes, gpu_util, usable, weights, activation, overhead, cudagraph, kv, source, "floor",
                  notes=tuple(notes))


# ---------------------------------------------------------------------------------------------
# the engine's rules (kvplan.engines.Engine)


def hybrid_swa(engine: EngineDefaults, spec: ModelSpec, device: Device | None = None,
               speculative: bool = False) -> bool:
    """Whether this release gives ``spec`` its hybrid SWA pool (a full-attention pool holding every token of a
    request and a sliding-window pool of ``--swa-full-tokens-ratio`` x its tokens holding the windows), read in
    the wheels (``ModelRunner`` / ``model_runner_kv_cache_mixin`` / ``pool_configurator``, ``ServerArgs``'
    model overrides): never before 0.4.10; Gemma 3 / 3n in 0.4.10.x only (0.4.10 gives every model with
    ``get_attention_sliding_window_size`` the pool; 0.5.1+ sets ``disable_hybrid_swa_memory`` for Gemma 2 / 3 /
    3n, 0.4.10.post2 already for Gemma 2, planned as never); gpt-oss from 0.5.8 (0.5.1 - 0.5.7 disable it; 0.5.8 -
    0.5.9 also with the ``trtllm_mha`` backend, the default on compute capability 10, and with speculative
    decoding); MiMo-V2 / Step-3.5 (0.5.10+'s ``is_hybrid_swa_model``) where kvplan plans them. The model needs
    both full and sliding layers. Every other model (Mistral v0.1, Qwen2 with sliding windows, Phi-3, Llama 4's
    chunks, ...) gets one pool of full layers: each layer holds every token. Lean to the safe side: where
    unsure, the full-layer pool (it holds fewer tokens)."""
    kinds = {layer.kind for layer in spec.layers if layer.kind is not LayerKind.NONE}
    if LayerKind.SLIDING not in kinds or not kinds & {LayerKind.FULL, LayerKind.MLA} or \
            kinds - {LayerKind.SLIDING, LayerKind.FULL, LayerKind.MLA}:
        return False
    v = release_tuple(engine.requested_version or engine.version, ENGINE)
    arch = spec.architecture
    if arch.startswith(("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Gemma3n")):
        return (0, 4, 10) <= v < (0, 5, 0)
    if arch == "GptOssForCausalLM":
        if v < (0, 5, 8):
            return False
        cc = device.capability if device else None
        return v >= (0, 5, 10) or not (speculative or (cc is not None and cc[0] == 10))
    if arch.startswith(("MiMoV2", "Step3p5")):
        return v >= (0, 5, 10)
    return False


def for_model(engine: EngineDefaults, spec: ModelSpec, is_cpu: bool, max_model_len: int | None, *,
              device: Device | None = None, kv_dtype: str | None = None,
              user_block_size: int | None = None) -> EngineDefaults:  # noqa: ARG001 - the Engine interface
    """What SGLang does for this model's layer kinds: a sliding-window model gets the hybrid SWA pool where the
    release gives its architecture one (:func:`hybrid_swa`: ``swa_ratio``), else every layer holds every token
    (``windows_full_length``); a Mamba / linear-attention hybrid keeps its state layers in a
    pool of request slots of its own (``HybridReqToTokenPool`` / ``MambaPool``; :func:`split_state_pool`), its
    token pool holds the full-attention layers only, and some releases run it without the radix cache
    (:func:`mamba_radix_cache`)."""
    if any(layer.kind in (LayerKind.SLIDING, LayerKind.CHUNKED) for layer in spec.layers):
        engine = (replace(engine, swa_ratio=SWA_FULL_TOKENS_RATIO) if hybrid_swa(engine, spec, device)
                  else replace(engine, windows_full_length=True))
    kinds = {layer.state_kind for layer in spec.layers if layer.is_state}
    if not kinds or not any(layer.caches_tokens for layer in spec.layers):
        return engine
    radix = mamba_radix_cache(engine.version, kinds)
    return replace(engine, state_pool=True, prefix_caching=radix if radix is not None else engine.prefix_caching)


def inflight_tokens(engine: EngineDefaults, pp: int, is_cpu: bool) -> int:
    """Tokens scheduled but not yet computed: one ``chunked_prefill_size`` per pipeline stage in flight."""
    return engine.max_num_batched_tokens * max(1, pp)


def default_prefix_caching(engine: EngineDefaults) -> bool:
    """SGLang's radix cache is on unless ``--disable-radix-cache``."""
    return True


def starts(engine: EngineDefaults, blocks: int, per_request_blocks: int) -> bool:
    """The pool's start-up check: SGLang caps a request's length at the pool instead of refusing to start,
    so any pool of at least one page passes (``init_memory_pool``: ``max_total_num_tokens > 0``)."""
    return blocks > 0


def longest_start(engine: EngineDefaults, blocks: int, demand: memory.Demand, limit_tokens: int) -> int:
    """SGLang's start does not depend on the context length (it caps each request at the pool instead):
    every length up to ``limit_tokens`` (the model's maximum) starts when the pool is not empty."""
    return limit_tokens if starts(engine, blocks, 0) else 0


def idle_reason(engine: EngineDefaults, max_model_len: int, per_request_blocks: int, blocks: int,
                longest_runs: int) -> str:
    """Why SGLang starts with ``max_model_len`` although no request that long runs: its scheduler admits a
    request of at most ``max_total_num_tokens - 1`` tokens (``max_req_len = min(context_len - 1,
    max_total_num_tokens - 1)``; kvplan: the pool less one page)."""
    return (f"sglang starts with context_length {max_model_len:,} but admits a request of at most "
            f"{plural(longest_runs, 'token')} (max_req_len: max_total_num_tokens {blocks * engine.block_size:,} - 1): "
            f"no request of {plural(max_model_len, 'token')} runs")


def model_max_len(engine: EngineDefaults, spec: ModelSpec) -> ModelLength:  # noqa: ARG001 - the Engine interface
    """The longest ``--context-length`` SGLang accepts (``get_context_length``, tokens): the model's maximum
    length times the rope ``factor``, unless the rope parameters name an ``original_max_position_embeddings``
    or are ``llama3`` (then the maximum as it is). It reads one flat ``rope_scaling`` dict: parameters nested
    per layer type (several sets) have no ``factor`` at the top, so they leave the maximum as it is."""
    base = spec.max_position_embeddings
    if not base:
        return ModelLength(None, "")
    rp = spec.rope_scaling[0] if len(spec.rope_scaling) == 1 else None
    if rp is None or rp.factor is None or rp.original is not None or rp.rope_type == "llama3":
        return ModelLength(base, f"{base:,} (max_position_embeddings)")
    tokens = scaled_length(base, rp.factor)
    return ModelLength(tokens, f"{tokens:,} = max_position_embeddings {base:,} x {rp.rope_type} factor {rp.factor:g}")


def refusal(engine: EngineDefaults, spec: ModelSpec, blocks: int, per_request_blocks: int, block_bytes: int,
            max_model_len: int) -> str | None:
    """Why SGLang refuses to start, or None: ``--context-length`` above the model's maximum
    (``_derive_context_length``; :data:`LONG_LEN_ENV` overrides), an empty pool (``init_memory_pool``:
    "Not enough memory. Please try to increase --mem-fraction-static"), or a hybrid's state pool too small for
    one running request (``max_mamba_cache_size // ratio`` < 1)."""
    too_long = length_refusal(model_max_len(engine, spec), max_model_len, setting="context_length", env=LONG_LEN_ENV)
    if too_long:
        return too_long
    if not starts(engine, blocks, per_request_blocks):
        return (f"not enough memory: the weights leave no KV pool inside mem_fraction_static {engine.gpu_util:g} "
                "(max_total_num_tokens <= 0)")
    if engine.state_pool and engine.state_slots // engine.state_slots_per_request < 1:
        return (f"not enough memory for the hybrid (mamba / linear-attention) state cache: "
                f"{plural(engine.state_slots, 'state slot')} (max_mamba_cache_size) leave no running request")
    return None


def serving_release(spec: ModelSpec) -> str | None:
    """Every modelled SGLang release serves the architectures kvplan plans: None."""
    return None


def request_limit(engine: EngineDefaults, max_num_seqs: int | None, kv_tokens: int, max_model_len: int) -> int:
    """``max_running_requests``: the user's ``--max-running-requests``, else derived from the pool
    (:func:`max_running_requests`); a hybrid's at most its state pool's slots // 3 with the radix cache, // 1
    without (``_resolve_max_num_reqs``: ``max_mamba_cache_size // ratio``; :func:`mamba_slots_per_request`)."""
    limit = max_num_seqs or max_running_requests(kv_tokens, max_model_len, engine.version)
    cap = engine.state_slots // engine.state_slots_per_request
    if engine.state_pool and cap >= 1:  # too few slots for one request: the engine refuses to start (:func:`refusal`)
        limit = min(limit, cap)
    return limit


def check_batching(engine: EngineDefaults, max_model_len: int) -> None:
    """SGLang accepts any positive ``--chunked-prefill-size`` and ``--max-running-requests``."""


def kv_tokens(engine: EngineDefaults, blocks: int, layout: memory.PoolLayout, per_request_blocks: int,
              max_model_len: int) -> int:
    """``max_total_num_tokens``: the pool's token slots (``blocks x page size``); in a hybrid SWA pool the full
    pool's (``full_layer_tokens``; :func:`swa_tokens` the sliding pool's)."""
    return blocks * layout.block_size


def swa_tokens(full_tokens: int, page_size: int = PAGE_SIZE, ratio: float = SWA_FULL_TOKENS_RATIO) -> int:
    """``swa_layer_tokens`` of a hybrid SWA pool with ``full_tokens`` full-layer tokens: ``int(full x ratio)``
    rounded down to whole pages."""
    return int(full_tokens * ratio) // page_size * page_size


def draft_layers(engine: EngineDefaults, spec: ModelSpec, features: Features | None) -> int:
    """SGLang keeps a speculative draft's KV in pools of its own (not modelled): 0 layers in the target's pool."""
    return 0


def log_lines(launch: Launch) -> tuple[str, ...]:
    """SGLang's start-up lines about its pools, their numbers as it prints them (no thousands separators):
    ``max_total_num_tokens``, ``max_running_requests`` (``launch.max_num_seqs``), ``context_len``; then a hybrid's
    ``Mamba Cache is allocated. max_mamba_cache_size`` (``launch.state_slots``; SGLang prints it first)."""
    mamba = (f"Mamba Cache is allocated. max_mamba_cache_size: {launch.state_slots}",) if launch.state_slots else ()
    if launch.swa_tokens:  # a hybrid SWA pool's split (SGLang prints it first)
        mamba = (f"Use sliding window memory pool. full_layer_tokens={launch.kv_tokens}, "
                 f"swa_layer_tokens={launch.swa_tokens}",) + mamba
    return (f"max_total_num_tokens={launch.kv_tokens}, max_running_requests={launch.max_num_seqs}, "
            f"context_len={launch.max_model_len}",) + mamba


def report(launch: Launch) -> tuple[str, ...]:
    """SGLang's start-up line (:func:`log_lines`) and the ``mem_fraction_static`` it was sized with; a hybrid's
    state pool line after it."""
    lines = log_lines(launch)
    return (f"{lines[0]} (mem_fraction_static {launch.gpu_util:g})",) + lines[1:]


def kv_cache_dtypes(engine: EngineDefaults) -> dict[str, str]:
    """SGLang's ``--kv-cache-dtype`` choices besides ``auto`` (``ServerArgs``, read in the wheels 0.3.6 - 0.5.23):
    ``fp8_e5m2`` in every release, ``fp8_e4m3`` from 0.4.2, ``bfloat16`` from 0.5.4 (kvplan's dtype name ->
    SGLang's). No float16, int8 or int4 KV cache in any release (its fp4 / mxfp8 / nvfp4 are not kvplan dtypes)."""
    v = release_tuple(engine.requested_version or engine.version, ENGINE)
    out = {"fp8_e5m2": "fp8_e5m2"}
    if v >= (0, 4, 2):
        out["fp8_e4m3"] = "fp8_e4m3"
    if v >= (0, 5, 4):
        out["bfloat16"] = "bfloat16"
    return out


# how `python -m sglang.launch_server` spells each setting of a Launch, in command-line order
SERVE_FLAGS = (("revision", "--revision {}"), ("tp_flag", "--tp {}"), ("pp_flag", "--pp-size {}"), ("dtype", "--dtype {}"),
               ("quantization", "--quantization {}"), ("kv_dtype_flag", "--kv-cache-dtype {}"),
               ("ssm_dtype", "--mamba-ssm-dtype {}"), ("block_size", "--page-size {}"),
               ("kv_budget_tokens", "--max-total-tokens {}"), ("max_num_batched_tokens_flag", "--chunked-prefill-size {}"),
               ("max_num_seqs_flag", "--max-running-requests {}"), ("enforce_eager", "--disable-cuda-graph"),
               ("prefix_caching_off", "--disable-radix-cache"), ("lora", "--enable-lora"),
               ("max_loras", "--max-loras-per-batch {}"), ("max_lora_rank", "--max-lora-rank {}"),
               ("speculative_algorithm", "--speculative-algorithm {}"), ("ep_size", "--ep-size {}"),
               ("swa_full_tokens_ratio", "--swa-full-tokens-ratio {}"),
               ("disable_hybrid_swa_memory", "--disable-hybrid-swa-memory"))


def serve_command(launch: Launch) -> str:
    """The ``python -m sglang.launch_server`` command line that starts the planned deployment: every setting
    that changes the plan (:class:`~kvplan.engines.Launch`) as SGLang spells it (:data:`SERVE_FLAGS`; an
    explicit KV budget is ``--max-total-tokens``, the pool's tokens)."""
    head = [f"python -m sglang.launch_server --model-path {launch.serve_model or launch.model_id}",
            f"--context-length {launch.max_model_len}", f"--mem-fraction-static {launch.gpu_util:g}"]
    return " ".join(head + launch_flags(launch, SERVE_FLAGS))


def auto_dtype(checkpoint_dtype: str, model_type: str, *, bf16: bool) -> str:  # noqa: ARG001 - same signature as vLLM's
    """The dtype SGLang's ``--dtype auto`` runs a ``checkpoint_dtype`` checkpoint in (python/sglang/srt/configs/
    model_config.py ``_get_and_verify_dtype``): float32 checkpoints in float16 (Gemma models: bfloat16), others
    as stored; SGLang does not check the GPU's bf16 support."""
    if checkpoint_dtype != "float32":
        return checkpoint_dtype
    return "bfloat16" if model_type.startswith("gemma") else "float16"


def ssm_dtype(engine: EngineDefaults, requested: str | None, configured: str | None, state_kind: str,  # noqa: ARG001
              architecture: str, *, is_cpu: bool) -> tuple[str | None, str]:
    """The SSM (temporal) state dtype of a state layer and why, when it is not the config's: ``--mamba-ssm-dtype``
    (kvplan's ``--ssm-dtype``), else 0.5.10+ the config's ``mamba_ssm_dtype`` (``text_config``'s too;
    ``mamba2_state_dtype``), else float32 (the flag's default; 0.5.2 - 0.5.9 read no config)."""
    if requested:
        return requested, f"--ssm-dtype {requested}"
    if configured and release(engine.version).ssm_from_config:
        return configured, ""
    if configured == MAMBA_SSM_DTYPE:
        return configured, ""
    return MAMBA_SSM_DTYPE, (f"sglang {engine.version}'s --mamba-ssm-dtype default {MAMBA_SSM_DTYPE}"
                             + ("; this release reads no config's" if configured else ""))
