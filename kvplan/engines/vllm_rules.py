"""vLLM's rules over one deployment (the :class:`~kvplan.engines.Engine` interface's rules, re-exported by
:mod:`kvplan.engines.vllm`): what a request holds in flight, prefix caching's default, the start-up checks
(:func:`refusal`: the architecture, the model's maximum length (:func:`model_max_len`), the pool), the
scheduler's limits (:func:`request_limit`, :func:`check_batching`), the token figure it logs, the command line
that launches it (:func:`serve_command`) and the dtypes it runs a checkpoint in.

Release differences come from :class:`~kvplan.engines.EngineDefaults` (``mode``, ``refusal``,
``kv_tokens_rule``, ``concurrent_batches``), filled from :data:`kvplan.engines.vllm.PROFILES`.
"""

from __future__ import annotations

from kvplan import memory
from kvplan.engines import (Budget, Device, EngineDefaults, Launch, ModelLength, launch_flags, length_refusal,
                            release_tuple, scaled_length)
from kvplan.errors import InputError
from kvplan.model.spec import LayerCache, ModelSpec
from kvplan.units import GiB, plural

ENGINE = "vllm"
V0_LONG_CONTEXT_TOKENS = 32 * 1024  # V0 `vllm serve` above 32K context turns chunked prefill on
LONG_LEN_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"  # ModelConfig._get_and_verify_max_len's override
# Architectures a release no longer serves: architecture -> (the first release without it, the last release
# that serves it, what it is). Mllama (Llama-3.2-Vision, cross-attention layers) ran on the V0 engine only;
# 0.11 removed both.
DROPPED_ARCHITECTURES: dict[str, tuple[tuple[int, int, int], str, str]] = {
    "MllamaForConditionalGeneration": ((0, 11, 0), "0.10.2", "Llama-3.2-Vision (mllama): removed with the V0 engine"),
}


def inflight_tokens(engine: EngineDefaults, pp: int, is_cpu: bool) -> int:
    """Tokens a request may have scheduled but not yet computed, which windowed layers must also hold:
    ``max_num_batched_tokens`` x the batches in flight (``pp`` stages; ``engine.concurrent_batches``: 2
    with >= 0.26's async scheduling on GPUs; 1 on CPU and in older releases)."""
    if pp > 1:
        return engine.max_num_batched_tokens * pp
    return engine.max_num_batched_tokens * (1 if is_cpu else engine.concurrent_batches)


def default_prefix_caching(engine: EngineDefaults) -> bool:
    """``enable_prefix_caching``'s default: on in the V1 engine, off in V0; for a model whose default differs
    (``engine.prefix_caching_default``, set by :func:`~kvplan.engines.vllm.for_model`), that."""
    if engine.prefix_caching_default is not None:
        return engine.prefix_caching_default
    return engine.mode != "V0"


def start_blocks(engine: EngineDefaults, blocks: int) -> int:
    """Blocks the start-up check lets one request use: all but the null block from 0.29
    (``refusal == "null_block"``); all of them before (V0 compares tokens, V1 <= 0.28 bytes)."""
    return blocks - memory.NULL_BLOCKS if engine.refusal == "null_block" else blocks


def starts(engine: EngineDefaults, blocks: int, per_request_blocks: int) -> bool:
    """The pool's start-up check: one request of max_model_len fits in :func:`start_blocks`."""
    return start_blocks(engine, blocks) >= per_request_blocks


def longest_start(engine: EngineDefaults, blocks: int, demand: memory.Demand, limit_tokens: int) -> int:
    """The longest max_model_len (at most ``limit_tokens``, the model's maximum) whose one request passes the
    pool's start-up check (:func:`starts`: it fits in :func:`start_blocks`); block-aligned when the pool binds."""
    return memory.max_context(start_blocks(engine, blocks), demand, 1, limit_tokens=limit_tokens, null_blocks=0)


def idle_reason(engine: EngineDefaults, max_model_len: int, per_request_blocks: int, blocks: int,
                longest_runs: int) -> str:
    """Why vLLM starts with ``max_model_len`` although no request that long runs: before 0.29 its start-up
    check counts every block (:func:`start_blocks`), but block 0 is the null block, so a request needing all
    of them never gets them (from 0.29 the check keeps the null block out and refuses instead)."""
    return (f"vllm {engine.version} starts with max_model_len {max_model_len:,} (its start-up check counts all "
            f"{plural(blocks, 'block')}) but one {max_model_len:,}-token request needs "
            f"{plural(per_request_blocks, 'block')} and {max(0, blocks - memory.NULL_BLOCKS):,} hold requests (block 0 "
            f"is the null block): none runs; the longest that runs is {plural(longest_runs, 'token')} (vllm 0.29 and "
            "later refuse to start instead)")


def release_of(engine: EngineDefaults) -> tuple[int, int, int]:
    """The release planned for: the one asked for (``--engine-version``), else the modelled release's first
    (a modelled release is named after its first version: ``0.29``, ``0.20.1``)."""
    return release_tuple(engine.requested_version or engine.version, ENGINE)


# rope types whose factor never scales the maximum length ("su" is read as longrope)
_UNSCALED_ROPE_TYPES = ("longrope", "llama3")
_YARN_TYPES = ("yarn", "deepseek_yarn", "deepseek_llama_scaling")  # unscaled too from 0.30 (max_len_rule)


def model_max_len(engine: EngineDefaults, spec: ModelSpec) -> ModelLength:
    """The longest max_model_len vLLM accepts (``_get_and_verify_max_len``'s derived length, tokens).

    ``max_position_embeddings`` (kvplan's reader) times the rope ``factor`` of the last rope parameters
    whose type scales it (each set's ``factor``, absent: the one before; none: 1): ``linear``, ``dynamic``
    and every other type except ``longrope`` / ``su`` and ``llama3``, and Gemma 3 never (its maximum is
    already scaled). YaRN (``engine.max_len_rule``): before 0.30 ``yarn`` starts from
    ``original_max_position_embeddings`` (transformers 5: the config's top-level one first, else
    max_position_embeddings) times the factor, and ``deepseek_yarn`` / ``deepseek_llama_scaling`` scale
    max_position_embeddings; from 0.30 none of them scales it. vLLM compares with the float product, so
    the integer part is the longest length it accepts.
    """
    base = spec.max_position_embeddings
    if not base:
        return ModelLength(None, "")
    plain = ModelLength(base, f"{base:,} (max_position_embeddings)")
    if not spec.rope_scaling or "gemma3" in spec.model_type:
        return plain
    unscaled = _UNSCALED_ROPE_TYPES + (_YARN_TYPES if engine.max_len_rule == "yarn-unscaled" else ())
    start, start_rule, factor, kind, ignored = base, "max_position_embeddings", None, "", ""
    for rp in spec.rope_scaling:
        if rp.rope_type in unscaled:
            if rp.rope_type in _YARN_TYPES and rp.factor is not None:
                ignored = f"; vLLM 0.30 and later do not scale it by the {rp.rope_type} factor {rp.factor:g}"
            continue
        if rp.factor is not None:
            factor, kind = rp.factor, rp.rope_type
        if rp.rope_type == "yarn":
            start = rp.config_original or rp.original or base
            start_rule = "original_max_position_embeddings" if rp.config_original or rp.original else start_rule
    if factor is None and start == base:
        return ModelLength(base, f"{base:,} (max_position_embeddings{ignored})")
    tokens = scaled_length(start, 1.0 if factor is None else factor)
    scaled = "" if factor is None else f" x {kind} factor {factor:g}"
    return ModelLength(tokens, f"{tokens:,} = {start_rule} {start:,}{scaled}")


def refusal(engine: EngineDefaults, spec: ModelSpec, blocks: int, per_request_blocks: int, block_bytes: int,
            max_model_len: int) -> str | None:
    """Why vLLM refuses to start, in the order it checks, or None:

    1. the release does not serve the architecture (:data:`DROPPED_ARCHITECTURES`);
    2. max_model_len above the model's maximum (:func:`model_max_len`; :data:`LONG_LEN_ENV` overrides);
    3. no KV cache memory at all, or one request of max_model_len does not fit in :func:`start_blocks`
       (``_check_enough_kv_cache_memory``).
    """
    dropped = DROPPED_ARCHITECTURES.get(spec.architecture or "")
    if dropped and release_of(engine) >= dropped[0]:
        first = ".".join(map(str, dropped[0][:2]))
        return (f"vllm {first} and later do not serve {spec.architecture} ({dropped[2]}); "
                f"vllm {dropped[1]} and earlier or --engine sglang serve it")
    too_long = length_refusal(model_max_len(engine, spec), max_model_len, setting="max_model_len", env=LONG_LEN_ENV)
    if too_long:
        return too_long
    if blocks <= 0:
        return "no memory left for the KV cache (no available memory for the cache blocks)"
    usable = start_blocks(engine, blocks)
    if usable < per_request_blocks:
        return (f"one {max_model_len:,}-token request needs {per_request_blocks * block_bytes / GiB:.2f} GiB KV cache, "
                f"{max(0, usable) * block_bytes / GiB:.2f} GiB available")
    return None


def serving_release(spec: ModelSpec) -> str | None:
    """The newest release that serves ``spec``'s architecture when later ones do not
    (:data:`DROPPED_ARCHITECTURES`), as ``--engine-version`` takes it; None when every release serves it."""
    dropped = DROPPED_ARCHITECTURES.get(spec.architecture or "")
    return dropped[1] if dropped else None


def request_limit(engine: EngineDefaults, max_num_seqs: int | None, kv_tokens: int, max_model_len: int) -> int:
    """vLLM's scheduler runs at most ``max_num_seqs`` requests at once (the user's or the default)."""
    return max_num_seqs or engine.max_num_seqs


V1_CHUNKING_SWITCH_FROM = (0, 11, 0)  # the first modelled release whose V1 honours --no-enable-chunked-prefill


def prefill_chunked(mode: str, release: tuple[int, ...], max_model_len: int | None, long_prefill_chunked: bool = True,
                    switch: bool | None = None) -> bool:
    """Whether a release chunks prefills, read in each release's ``EngineArgs.create_engine_config`` /
    ``_set_default_args`` (``switch``: the user's ``--[no-]enable-chunked-prefill``, None unset):

    - V0 (0.6 - 0.7.x; ``vllm serve`` and the LLM class alike): the switch; unset, on above 32K tokens where
      ``long_prefill_chunked`` (``engines.vllm.v0_long_prefill_chunked``), else off;
    - V1 0.8 - 0.11.0: always ("V1 always uses chunked prefills": a user's False is set back);
    - V1 0.11.1 and later: the switch, unset on. kvplan's 0.11 rules cover 0.11.0 too, which ignores an off:
      planning it off profiles the longer batch, the side of less KV.
    """
    if mode == "V0":
        if switch is not None:
            return switch
        return long_prefill_chunked and max_model_len is not None and max_model_len > V0_LONG_CONTEXT_TOKENS
    return switch is not False or tuple(release) < V1_CHUNKING_SWITCH_FROM


def chunked_prefill(engine: EngineDefaults, max_model_len: int) -> bool:
    """Whether the engine chunks prefills at ``max_model_len`` (:func:`prefill_chunked` of its release, mode and
    the user's switch)."""
    return prefill_chunked(engine.mode, release_tuple(engine.version, ENGINE), max_model_len,
                           engine.long_prefill_chunked, engine.chunked_prefill_switch)


def check_batching(engine: EngineDefaults, max_model_len: int) -> None:
    """``SchedulerConfig``'s checks: ``max_num_batched_tokens >= max_num_seqs``, and ``>= max_model_len``
    without chunked prefill (V0); InputError naming both values otherwise."""
    mnbt, seqs = engine.max_num_batched_tokens, engine.max_num_seqs
    if mnbt < seqs:
        raise InputError(f"max_num_batched_tokens {mnbt} is below max_num_seqs {seqs}: vLLM requires "
                         "max_num_batched_tokens >= max_num_seqs (SchedulerConfig) and refuses to start",
                         f"raise --max-num-batched-tokens to {seqs} or lower --max-num-seqs to {mnbt}")
    if not chunked_prefill(engine, max_model_len) and mnbt < max_model_len:
        raise InputError(f"max_num_batched_tokens {mnbt} is below max_model_len {max_model_len}: vLLM without chunked "
                         "prefill (V0 below 32K tokens, or --no-enable-chunked-prefill) refuses to start",
                         f"raise --max-num-batched-tokens to {max_model_len} or lower --max-model-len to {mnbt}")


def split_state_pool(engine: EngineDefaults, budget: Budget, layers: tuple[LayerCache, ...], *,
                     max_num_seqs: int | None, prefix_caching: bool) -> tuple[EngineDefaults, Budget]:
    """vLLM keeps state layers in the shared block pool (one padded page per request), no pool of their own:
    the defaults and the budget as they are."""
    return engine, budget


def kv_tokens(engine: EngineDefaults, blocks: int, layout: memory.PoolLayout, per_request_blocks: int,
              max_model_len: int) -> int:
    """The "GPU KV cache size: N tokens" vLLM logs (``engine.kv_tokens_rule``): ``num_blocks x block_size``
    (V0 / 0.8), ``num_blocks // num_groups x block_size`` (0.9 - 0.20.0) or
    ``int(max_concurrency x max_model_len)`` (0.20.1 and later)."""
    if engine.kv_tokens_rule == "blocks":
        return blocks * layout.block_size
    if engine.kv_tokens_rule == "groups":
        smallest = min((g.block_size or layout.block_size for g in layout.groups), default=layout.block_size)
        return memory.grouped_kv_tokens(blocks, len(layout.groups), smallest)
    return memory.kv_cache_tokens(blocks, per_request_blocks, max_model_len)


def log_lines(launch: Launch) -> tuple[str, ...]:
    """vLLM's three start-up lines about the KV cache: the memory it has for it, its token figure, the
    maximum concurrency at max_model_len."""
    device = "CPU" if launch.is_cpu else "GPU"
    return (f"Available KV cache memory: {max(0, launch.kv_memory_bytes) / (1 << 30):.2f} GiB",
            f"{device} KV cache size: {launch.kv_tokens:,} tokens",
            f"Maximum concurrency for {launch.max_model_len:,} tokens per request: {launch.max_concurrency:.2f}x")


def report(launch: Launch) -> tuple[str, ...]:
    """vLLM's start-up lines about the KV cache, and what its token figure means when it is not the slots."""
    lines = ["; ".join(log_lines(launch)[1:])]
    if launch.kv_tokens != launch.capacity_tokens:
        what = ("num_blocks // KV-cache groups x block size" if launch.kv_tokens_rule == "groups" else
                f"max concurrency x max_model_len: the tokens whole {launch.max_model_len:,}-token requests hold")
        lines.append(f"(its KV cache size is {what}, not the {launch.capacity_tokens:,} token slots)")
    return tuple(lines)


def kv_cache_dtypes(engine: EngineDefaults) -> dict[str, str]:
    """vLLM's ``--kv-cache-dtype`` choices besides ``auto`` (``CacheDType``, read in the wheels): fp8 (e4m3) and
    fp8_e5m2 in every modelled release (0.6+), ``bfloat16`` from 0.11, ``float16`` from 0.18 (kvplan's dtype name ->
    vLLM's). No int8 or int4 KV cache in any release."""
    v = release_tuple(engine.requested_version or engine.version, "vllm")
    out = {"fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
    if v >= (0, 11, 0):
        out["bfloat16"] = "bfloat16"
    if v >= (0, 18, 0):
        out["float16"] = "float16"
    return out


# how `vllm serve` spells each setting of a Launch, in command-line order
SERVE_FLAGS = (("revision", "--revision {}"), ("tp_flag", "--tensor-parallel-size {}"),
               ("pp_flag", "--pipeline-parallel-size {}"), ("dtype", "--dtype {}"), ("quantization", "--quantization {}"),
               ("kv_dtype_flag", "--kv-cache-dtype {}"), ("ssm_dtype", "--mamba-ssm-cache-dtype {}"),
               ("block_size", "--block-size {}"), ("kv_budget_bytes", "--kv-cache-memory-bytes {}"),
               ("max_num_batched_tokens_flag", "--max-num-batched-tokens {}"), ("max_num_seqs_flag", "--max-num-seqs {}"),
               ("enforce_eager", "--enforce-eager"), ("prefix_caching_on", "--enable-prefix-caching"),
               ("prefix_caching_off", "--no-enable-prefix-caching"), ("chunked_prefill_on", "--enable-chunked-prefill"),
               ("chunked_prefill_off", "--no-enable-chunked-prefill"), ("lora", "--enable-lora"),
               ("max_loras", "--max-loras {}"), ("max_lora_rank", "--max-lora-rank {}"),
               ("speculative_config", "--speculative-config '{}'"), ("expert_parallel", "--enable-expert-parallel"))


def serve_command(launch: Launch) -> str:
    """The ``vllm serve`` command line that starts the planned deployment: every setting that changes the
    plan (:class:`~kvplan.engines.Launch`) as vLLM spells it (:data:`SERVE_FLAGS`). The CPU backend takes
    no utilisation: its KV space is its own (``--kv-cache-memory-bytes``)."""
    head = [f"vllm serve {launch.serve_model or launch.model_id}", f"--max-model-len {launch.max_model_len}"]
    if not launch.is_cpu:
        head.append(f"--gpu-memory-utilization {launch.gpu_util:g}")
    return " ".join(head + launch_flags(launch, SERVE_FLAGS))


# vLLM's `--dtype auto` (vllm/config/model.py _resolve_auto_dtype; the platforms' supported_dtypes:
# CUDA bf16 from compute capability 8.0, else fp16/fp32; ROCm and the x86/aarch64 CPU backend bf16/fp16/fp32).
_NO_FP16_MODEL_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})  # "numerical instability"


def auto_dtype(checkpoint_dtype: str, model_type: str, *, bf16: bool) -> str:
    """The dtype ``--dtype auto`` runs a ``checkpoint_dtype`` checkpoint in (the KV cache and activations follow).

    The platform's supported dtypes are bf16 (when ``bf16``), fp16, fp32, without fp16 for gemma2/gemma3/glm4;
    a float32 checkpoint is downcast to the first of them, and a dtype the platform lacks falls back to it
    (a bf16 checkpoint runs in fp16 below compute capability 8.0). Before vLLM 0.10.1 float32 went to fp16,
    the same 2 bytes per element.
    """
    supported = [d for d in ("bfloat16", "float16", "float32")
                 if (bf16 or d != "bfloat16") and not (d == "float16" and model_type in _NO_FP16_MODEL_TYPES)]
    wanted = supported[0] if checkpoint_dtype == "float32" else checkpoint_dtype
    return wanted if wanted in supported else supported[0]


# the SSM-state dtype vLLM takes from a model's config when --mamba-ssm-cache-dtype is auto
# (vllm/model_executor/models/config.py MODELS_CONFIG_MAP): NemotronH's mamba_ssm_cache_dtype from 0.13 (else
# float16; float32 from 0.20, DEFAULT_MAMBA_SSM_CACHE_DTYPE), Qwen3.5's text config mamba_ssm_dtype (in 0.17.0's
# source; a 0.16.1 dev build's log, vllm-f54355267735, already stores float32: the rule came with the model);
# every other model's state, and NemotronH's before 0.13, in the model dtype ("auto")
NEMOTRON_H_ARCHITECTURES = ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "NemotronH_Nano_VL_V2")
QWEN3_5_ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                         "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")


def _version(engine: EngineDefaults) -> str:
    return engine.requested_version or engine.version


def ssm_dtype(engine: EngineDefaults, requested: str | None, configured: str | None, state_kind: str,
              architecture: str, *, is_cpu: bool) -> tuple[str | None, str]:
    """The SSM-state dtype vLLM stores a state layer in (None: the model dtype) and why, when it is not the
    config's (``configured``: the config's ``mamba_ssm_cache_dtype`` / ``mamba_ssm_dtype``; ``requested``:
    ``--mamba-ssm-cache-dtype``).

    On GPUs, what was requested, else what the release takes from the config (:data:`NEMOTRON_H_ARCHITECTURES`,
    :data:`QWEN3_5_ARCHITECTURES`), else the model dtype. The CPU backend (vllm/platforms/cpu.py
    ``check_and_update_config``, on CPUs with AVX-512 BF16, which kvplan's ``cpu`` target assumes) resets it to
    float32 for every state kind ("Reset SSM cache type to float32 for accelerated GDN mamba backend"), unless
    float16/bfloat16 was asked for a gated-delta-net layer, which its accelerated GDN kernel stores as asked.
    """
    if is_cpu:
        if requested in ("float16", "bfloat16") and state_kind == "gated_delta_net":
            return requested, f"--ssm-dtype {requested}"
        return "float32", ("vllm's CPU backend resets it to float32 on CPUs with AVX-512 BF16; --ssm-dtype bf16 "
                           "keeps bf16 for gated-delta-net layers")
    if requested:
        return requested, f"--ssm-dtype {requested}"
    release = release_of(engine)
    if architecture in NEMOTRON_H_ARCHITECTURES and release >= (0, 13, 0):
        default = "float32" if release >= (0, 20, 0) else "float16"
        return configured or default, ("" if configured else f"vllm {_version(engine)}'s NemotronH default {default}")
    if architecture in QWEN3_5_ARCHITECTURES:
        return configured, ""
    if configured:
        return None, (f"vllm {_version(engine)} stores it in the model dtype: it reads the config's SSM dtype only for "
                      "NemotronH (0.13+) and Qwen3.5; --ssm-dtype sets it")
    return None, ""


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
