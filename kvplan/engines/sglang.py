"""SGLang's KV pool: ``mem_fraction_static`` defaults and the token pool it allocates.

SGLang does not profile activations. It measures free memory around weight loading and gives the
pool everything inside ``mem_fraction_static`` that the weights (and what was allocated before them)
do not use; activations and CUDA graphs live in ``1 - mem_fraction_static``.

- ``0.4`` (2024 - mid 2025, ``ModelRunner.profile_max_num_token``): ``rest = free_after_load -
  total x (1 - mem_fraction_static)``, i.e. ``pool = total x frac - weights - used_before_load``;
  ``mem_fraction_static`` by tp x pp: 0.88, 0.87 (>= 2), 0.85 (>= 4), 0.81 (>= 8), 0.79 (>= 16);
  ``chunked_prefill_size`` 2048 below 25,000 MiB of GPU memory, else 8192.
- ``0.5`` (late 2025 / 2026, ``_handle_gpu_memory_settings``): ``pool = (total - used_before_load) x
  frac - weights`` (measured against the free memory before loading), with ``frac = round((gpu_mem -
  reserved) / gpu_mem, 3)`` and ``reserved = 512 + max(chunked_prefill_size, 2048) x 1.5 +
  cuda_graph_max_bs x 2 + (tp x pp / 8) x 1024`` MiB, at least 10 GiB above 60 GiB of GPU memory.

``max_total_num_tokens = pool // cell_size`` where ``cell_size`` is the KV bytes of one token over
all of this GPU's layers (MLA: ``(kv_lora_rank + qk_rope_head_dim) x layers x bytes``); page size 1,
so kvplan expresses the pool as blocks of one token and the shared block math applies.
"""

from __future__ import annotations

import math

from kvplan import memory
from kvplan.engines import (USAGE_CONTEXTS, Budget, Device, EngineDefaults, Launch, ModelLength, Term, launch_flags,
                            length_refusal, release_ranges, resolve_release, scaled_length)
from kvplan.errors import InputError
from kvplan.model.spec import LayerCache, ModelSpec
from kvplan.units import DType, GiB, MiB, plural

ENGINE = "sglang"
BLOCK_SIZES: tuple[int, ...] | None = None  # --page-size takes any positive number of tokens
LONG_LEN_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"  # ModelConfig._derive_context_length's override
# The first release each modelled version covers. 0.5.3 brought ServerArgs._handle_gpu_memory_settings
# (the memory-tier mem_fraction_static); 0.4.0 - 0.5.2 pick the fraction by world size (read in the
# released sglang wheels 0.4.0, 0.4.10, 0.5.1, 0.5.2 and 0.5.3).
FIRSTS: dict[str, tuple[int, ...]] = {"0.4": (0, 4, 0), "0.5": (0, 5, 3)}
VERSIONS = tuple(FIRSTS)
DEFAULT_VERSION = "0.5"
RANGES = release_ranges(FIRSTS)
PAGE_SIZE = 1  # --page-size default: one token per page
MAX_RUNNING_REQUESTS_CEILING = 4096

# Memory in use before the weights load (CUDA context, NCCL communicators, custom all-reduce
# buffers), which SGLang's free-memory arithmetic charges to the pool. Calibrated on one report
# (Qwen3-235B-A22B-FP8, tp 4 on H100: ~2.2 GiB); the 0.75 GiB CUDA context is the usual size of a
# context with cuBLAS / NCCL kernels loaded.
CONTEXT_BYTES = 768 * MiB
NCCL_BYTES_PER_DOUBLING = 512 * MiB

# 0.5: (chunked_prefill_size, cuda_graph_max_bs) by GPU memory (MiB upper bound). The 24 GB and
# 80 GB tiers are the anchors in docs/dev/engine_budget_notes.md (RTX 4090: 2048 / 24 -> ~0.847;
# H100: 8192 / 256 -> ~0.836); the other tiers are recalled, not re-read (docs/engines.md).
_TIERS_05 = (
    (20 * 1024, 2048, 8),
    (35 * 1024, 2048, 24),
    (60 * 1024, 4096, 32),
    (160 * 1024, 8192, 256),
    (math.inf, 16384, 512),
)


def resolve_version(text: str | None) -> tuple[str, str]:
    """``(modelled version, note)`` for any PEP 440 SGLang version (``0.4.6.post1``, ``0.5.3rc0``);
    ``None`` is the newest modelled one. Versions before 0.4 are refused, with the ranges."""
    if text is None:
        return DEFAULT_VERSION, ""
    return resolve_release(ENGINE, text, FIRSTS)


def _check(version: str) -> None:
    if version not in VERSIONS:
        raise InputError(f"unknown --engine-version {version!r} for sglang",
                         "modelled versions: " + ", ".join(f"{k} ({r})" for k, r in RANGES.items()))


def _mib(n_bytes: int | None) -> float:
    return (n_bytes or 0) / MiB


def chunked_prefill_size(version: str, gpu_memory_bytes: int | None) -> int:
    """SGLang's default ``--chunked-prefill-size`` (tokens) for this GPU."""
    _check(version)
    mib = _mib(gpu_memory_bytes)
    if version == "0.4":
        return 2048 if mib < 25_000 else 8192
    return next(chunk for limit, chunk, _ in _TIERS_05 if mib < limit)


def cuda_graph_max_bs(version: str, gpu_memory_bytes: int | None) -> int:
    """SGLang 0.5's default ``--cuda-graph-max-bs`` for this GPU (160 in 0.4)."""
    _check(version)
    if version == "0.4":
        return 160
    mib = _mib(gpu_memory_bytes)
    return next(bs for limit, _, bs in _TIERS_05 if mib < limit)


def mem_fraction_static(version: str, gpu_memory_bytes: int | None, tp: int = 1, pp: int = 1) -> float:
    """SGLang's default ``--mem-fraction-static``.

    0.4: by world size ``tp x pp``: 0.79 (>= 16), 0.81 (>= 8), 0.85 (>= 4), 0.87 (>= 2), else 0.88.
    0.5: ``round((gpu_mib - reserved_mib) / gpu_mib, 3)``; reserved = ``512 + max(chunk, 2048) x 1.5
    + cuda_graph_max_bs x 2 + world / 8 x 1024`` MiB, raised to 10 GiB above 60 GiB (0.88 when the
    GPU memory is unknown). H100 (81,106 MiB): 512 + 12288 + 512 + 128 = 13,440 -> 0.834.
    """
    _check(version)
    world = tp * pp
    if version == "0.4":
        return 0.79 if world >= 16 else 0.81 if world >= 8 else 0.85 if world >= 4 else 0.87 if world >= 2 else 0.88
    mib = _mib(gpu_memory_bytes)
    if mib <= 0:
        return 0.88
    reserved = (512 + max(chunked_prefill_size(version, gpu_memory_bytes), 2048) * 1.5
                + cuda_graph_max_bs(version, gpu_memory_bytes) * 2 + world / 8 * 1024)
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mib - reserved) / mib, 3)


def defaults(version: str, gpu_memory_bytes: int | None, is_cpu: bool, *, gpu_name: str | None = None,
             max_model_len: int | None = None, usage_context: str = "serve", tp: int = 1,
             pp: int = 1) -> EngineDefaults:
    """SGLang's defaults: ``mem_fraction_static`` as ``gpu_util``, page size 1 as ``block_size``,
    ``chunked_prefill_size`` as ``max_num_batched_tokens``; ``max_num_seqs`` is the 4096 ceiling of
    ``max_running_requests`` (the real value follows the pool: :func:`max_running_requests`)."""
    _check(version)
    if is_cpu:
        raise InputError("SGLang's CPU backend is not modelled", "use --engine vllm for a CPU plan")
    if usage_context not in USAGE_CONTEXTS:
        raise InputError(f"unknown usage context {usage_context!r}", "use serve or llm")
    return EngineDefaults(ENGINE, version, mem_fraction_static(version, gpu_memory_bytes, tp, pp), PAGE_SIZE,
                          chunked_prefill_size(version, gpu_memory_bytes), MAX_RUNNING_REQUESTS_CEILING,
                          mode="sglang", usage_context=usage_context, cudagraph_profiled=False, refusal="pool",
                          kv_tokens_rule="blocks", release_range=RANGES[version])


def cell_size_bytes(layers: tuple[LayerCache, ...] | ModelSpec, kv_dtype: DType) -> int:
    """SGLang's ``cell_size``: KV bytes of one token over all (this GPU's) layers.

    GQA/MHA: ``kv_heads x head_dim x layers x 2 x bytes``; MLA: ``(kv_lora_rank + qk_rope_head_dim) x
    layers x bytes`` (one latent, no separate V).
    """
    return memory.kv_bytes_per_token(layers, kv_dtype)


def max_total_num_tokens(kv_budget_bytes: int, cell_size: int) -> int:
    """``max_total_num_tokens = pool bytes // cell_size`` (0 when the pool is negative)."""
    return max(0, kv_budget_bytes // cell_size) if cell_size > 0 else 0


def max_running_requests(total_num_tokens: int, context_len: int) -> int:
    """0.4's default: ``min(max(int(max_total_num_tokens / context_len x 512), 2048), 4096)``.

    (sglang#4090; newer releases derive it differently - a 2026 log shows 33 - and are not modelled.)
    """
    if context_len <= 0:
        raise InputError(f"invalid context length {context_len}")
    return min(max(int(total_num_tokens / context_len * 512), 2048), MAX_RUNNING_REQUESTS_CEILING)


def pre_load_bytes(tp: int, pp: int) -> int:
    """Estimated memory in use before the weights load: CUDA context + 0.5 GiB per doubling of ranks."""
    world = tp * pp
    return CONTEXT_BYTES + NCCL_BYTES_PER_DOUBLING * max(0, math.ceil(math.log2(world))) if world > 1 else CONTEXT_BYTES


def budget(total_bytes: int, gpu_util: float, weights: Term, activation: Term | None, overhead: Term | None,
           cudagraph: Term | None, kv_budget_override: int | None, *, spec: ModelSpec, tp: int,
           max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int, is_cpu: bool,
           version: str = DEFAULT_VERSION, pp: int = 1, device: Device | None = None) -> Budget:
    """SGLang's pool budget per GPU: ``total x mem_fraction_static - weights - overhead``.

    ``overhead`` is the memory in use before loading (0.4: all of it; 0.5: that times the fraction,
    since the fraction applies to the free memory before loading). No activation or CUDA-graph term:
    both live in ``1 - mem_fraction_static``. ``--kv-budget`` (like ``--max-total-tokens`` x cell
    size) replaces the result.
    """
    _check(version)
    if is_cpu:
        raise InputError("SGLang's CPU backend is not modelled", "use --engine vllm for a CPU plan")
    usable = math.floor(total_bytes * gpu_util)
    if activation is None:
        activation = Term("activation", 0, "none: SGLang keeps activations in 1 - mem_fraction_static")
    if cudagraph is None:
        cudagraph = Term("cudagraph", 0, "none: SGLang captures CUDA graphs in 1 - mem_fraction_static")
    if overhead is None:
        before = pre_load_bytes(tp, pp)
        if version == "0.4":
            overhead = Term("overhead", before, f"estimate: {before / GiB:.2f} GiB in use before loading "
                                                 "(CUDA context, NCCL), charged to the pool")
        else:
            charged = math.floor(before * gpu_util)
            overhead = Term("overhead", charged, f"estimate: {before / GiB:.2f} GiB in use before loading x "
                                                  f"mem_fraction_static {gpu_util}")
    if kv_budget_override is not None:
        kv, source = kv_budget_override, "--kv-budget"
    else:
        kv = usable - weights.bytes - activation.bytes - overhead.bytes - cudagraph.bytes
        source = "total x mem_fraction_static - weights - overhead"
    return Budget(total_bytes, gpu_util, usable, weights, activation, overhead, cudagraph, kv, source, "floor")


# ---------------------------------------------------------------------------------------------
# the engine's rules (kvplan.engines.Engine)


def for_model(engine: EngineDefaults, spec: ModelSpec, is_cpu: bool, max_model_len: int | None) -> EngineDefaults:
    """SGLang's defaults do not depend on the model's layer kinds."""
    return engine


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
    (``_derive_context_length``; :data:`LONG_LEN_ENV` overrides), or an empty pool (``init_memory_pool``:
    "Not enough memory. Please try to increase --mem-fraction-static")."""
    too_long = length_refusal(model_max_len(engine, spec), max_model_len, setting="context_length", env=LONG_LEN_ENV)
    if too_long:
        return too_long
    if not starts(engine, blocks, per_request_blocks):
        return (f"not enough memory: the weights leave no KV pool inside mem_fraction_static {engine.gpu_util:g} "
                "(max_total_num_tokens <= 0)")
    return None


def serving_release(spec: ModelSpec) -> str | None:
    """Every modelled SGLang release serves the architectures kvplan plans: None."""
    return None


def request_limit(engine: EngineDefaults, max_num_seqs: int | None, kv_tokens: int, max_model_len: int) -> int:
    """``max_running_requests``: the user's ``--max-running-requests``, else derived from the pool
    (:func:`max_running_requests`)."""
    return max_num_seqs or max_running_requests(kv_tokens, max_model_len)


def check_batching(engine: EngineDefaults, max_model_len: int) -> None:
    """SGLang accepts any positive ``--chunked-prefill-size`` and ``--max-running-requests``."""


def kv_tokens(engine: EngineDefaults, blocks: int, layout: memory.PoolLayout, per_request_blocks: int,
              max_model_len: int) -> int:
    """``max_total_num_tokens``: the pool's token slots (``blocks x page size``)."""
    return blocks * layout.block_size


def log_lines(launch: Launch) -> tuple[str, ...]:
    """SGLang's start-up line about its pool, its numbers as it prints them (no thousands separators):
    ``max_total_num_tokens``, ``max_running_requests`` (``launch.max_num_seqs``), ``context_len``."""
    return (f"max_total_num_tokens={launch.kv_tokens}, max_running_requests={launch.max_num_seqs}, "
            f"context_len={launch.max_model_len}",)


def report(launch: Launch) -> tuple[str, ...]:
    """SGLang's start-up line (:func:`log_lines`) and the ``mem_fraction_static`` it was sized with."""
    return (f"{log_lines(launch)[0]} (mem_fraction_static {launch.gpu_util:g})",)


# how `python -m sglang.launch_server` spells each setting of a Launch, in command-line order
SERVE_FLAGS = (("revision", "--revision {}"), ("tp_flag", "--tp {}"), ("pp_flag", "--pp-size {}"), ("dtype", "--dtype {}"),
               ("quantization", "--quantization {}"), ("kv_dtype_flag", "--kv-cache-dtype {}"),
               ("ssm_dtype", "--mamba-ssm-dtype {}"), ("block_size", "--page-size {}"),
               ("kv_budget_tokens", "--max-total-tokens {}"), ("max_num_batched_tokens_flag", "--chunked-prefill-size {}"),
               ("max_num_seqs_flag", "--max-running-requests {}"), ("enforce_eager", "--disable-cuda-graph"),
               ("prefix_caching_off", "--disable-radix-cache"))


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


def ssm_dtype(requested: str | None, state_kind: str, *, is_cpu: bool) -> str | None:  # noqa: ARG001
    """The SSM-state dtype of a state layer: what was requested (None: the model's own)."""
    return requested
