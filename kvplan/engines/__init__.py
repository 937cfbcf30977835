"""Serving engines: how much of a GPU's memory an engine gives the KV cache, and its other rules.

An engine model turns (spec, GPU, options) into a :class:`Budget` whose every term is shown and can
be overridden, plus the engine's defaults (utilisation, block size, batching limits), plus the rules
that decide what a request holds and whether the engine starts.

Two engines are modelled: :mod:`kvplan.engines.vllm` (the default; several releases, selectable by
``--engine-version``) and :mod:`kvplan.engines.sglang`. Each module is an :class:`Engine` (the
interface below); :func:`kvplan.engines.registry.engine` finds one by name. Nothing outside this
package asks which engine it is: it asks the engine. Any PEP 440 version string (``0.19.0``,
``0.15.2rc1.dev93+g11a4c9d30``) maps to the modelled release whose range covers it
(:func:`resolve_release`). The derivations and their sources are in docs/engines.md.

May import: kvplan.errors, kvplan.units, kvplan.limits, kvplan.io, kvplan.gpus, kvplan.options, kvplan.model, kvplan.memory
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Protocol

from kvplan.errors import InputError
from kvplan.memory import UNBOUNDED_TOKENS, Demand, PoolLayout
from kvplan.options import USAGE_CONTEXTS as USAGE_CONTEXTS  # re-exported for the engine modules
from kvplan.model.spec import LayerCache, ModelSpec
from kvplan.units import scaled


@dataclass(frozen=True)
class Term:
    """One budget term in bytes and where it came from (``computed: ...`` or ``--weights-gib``)."""

    name: str
    bytes: int
    source: str


# a term the user gave (--weights-gib ...) or a calibration file measured; "--quantization fp8: ..." is an estimate
GIVEN_SOURCES = ("--weights-gib", "--activation-gib", "--overhead-gib", "--cudagraph-gib", "--enforce-eager", "calibration")


def given(term: Term) -> bool:
    """Whether ``term`` was given rather than estimated: an engine adds nothing of its own to it."""
    return term.source.startswith(GIVEN_SOURCES)


@dataclass(frozen=True)
class Budget:
    """Per-GPU memory budget (bytes).

    ``usable = ceil(total x gpu_util)`` (vLLM >= 0.19; ``floor`` of the float product before, which
    gives the same block count); ``kv_budget = usable - weights - activation - overhead - cudagraph``,
    or the explicit ``--kv-budget`` when given (then the other terms are informational).
    ``activation_forward_bytes`` / ``activation_sampler_bytes`` are the decoder's two candidates (both 0
    when the term was given by the user or the engine has none); a multimodal model's dummy image batch adds
    ``activation_images_bytes`` (pixels and cached encoder outputs, alive through both) and its own candidate
    ``activation_encoder_bytes`` (the encoder run): the activation term is
    ``max(max(forward, sampler) + images, encoder)``.
    """

    total_bytes: int
    gpu_util: float
    usable_bytes: int
    weights: Term
    activation: Term
    overhead: Term
    cudagraph: Term
    kv_budget_bytes: int
    kv_budget_source: str
    requested_rounding: str = "ceil"  # how usable was rounded: "ceil" or "floor" (vLLM's float product)
    activation_forward_bytes: int = 0
    activation_sampler_bytes: int = 0
    notes: tuple[str, ...] = ()
    activation_images_bytes: int = 0
    activation_encoder_bytes: int = 0
    path_gap_bytes: int = 0  # how much more the activation is where the engine takes its other code path (vLLM
    # 0.8 - 0.11: the native sampler where FlashInfer is not installed); the low end of the plan's range pays it
    state_pool_bytes: int = 0  # a pool of per-request state slots the engine carves out of the budget before the
    # KV pool (SGLang's Mamba pool: ``state_slots x`` one request's state); ``kv_budget_bytes`` is what is left
    state_slots: int = 0  # that pool's request slots (SGLang's max_mamba_cache_size); 0: no such pool
    mm_profile: tuple[int, str, int] | None = None  # the dummy multimodal batch: (items, modality, encoder budget
    # tokens), as vLLM logs it ("Encoder cache will be initialized with a budget of N tokens, and profiled with K
    # image items"); None: no multimodal profile

    @property
    def terms(self) -> tuple[Term, ...]:
        return (self.weights, self.activation, self.overhead, self.cudagraph)


@dataclass(frozen=True)
class EngineDefaults:
    """Engine settings that change capacity: utilisation, block size, batching limits.

    ``mode``: vLLM's ``V0``/``V1`` engine or ``sglang``. ``usage_context``: ``serve`` (``vllm serve``,
    the OpenAI server) or ``llm`` (the ``LLM`` class), which have different batching defaults.
    ``refusal``: how the engine decides that one request at ``max_model_len`` does not fit:
    ``tokens`` (V0: ``max_model_len > num_blocks x block_size``), ``bytes`` (V1: needed bytes >
    available bytes), ``null_block`` (``num_blocks - 1`` blocks must hold it) or ``pool`` (SGLang:
    the request is capped by the pool instead of refusing to start).
    ``kv_tokens_rule``: how the engine prints its token capacity: ``blocks`` (``num_blocks x
    block_size``) or ``concurrency`` (``int(max_concurrency x max_model_len)``).
    """

    engine: str
    version: str
    gpu_util: float
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    mode: str = ""
    usage_context: str = "serve"
    cudagraph_profiled: bool = False
    refusal: str = "null_block"
    kv_tokens_rule: str = "concurrency"
    notes: tuple[str, ...] = ()
    requested_version: str = ""  # what the user typed (--engine-version), "" for the default
    release_range: str = ""  # the releases whose rules ``version`` models, e.g. "0.18.0 - 0.19.x"
    concurrent_batches: int = 1  # batches in flight at once (2 with vLLM >= 0.26's async scheduling)
    prefix_caching: bool | None = None  # forced by the engine for this model (vLLM's CPU MLA: off); None: not forced
    prefix_caching_default: bool | None = None  # the default for this model where it is not the release's (vLLM's
    # hybrids 0.11.1 - 0.25: off); None: the release's default
    kv_in_model_dtype: bool = False  # the engine keeps this model's KV cache in the model dtype (vLLM's Falcon)
    max_len_rule: str = ""  # how rope scaling sets the model's maximum length (vLLM's Profile.max_len_rule)
    mla_align_bytes: int = 0  # MLA cache entries padded to this many bytes of the model dtype (vLLM V0 0.7.2+)
    pool_follows_length: bool = False  # the budget depends on max_model_len (vLLM V0's batch, a dummy video's frames)
    long_prefill_chunked: bool = True  # vLLM V0 chunks prefills above 32K by itself (not on ROCm, nor for
    # multimodal or sliding-window models)
    state_pool: bool = False  # state layers live in a pool of request slots of their own, outside the token pool
    # (SGLang's MambaPool): the pool layout holds the attention layers only
    state_slots: int = 0  # that pool's request slots once the budget is split (SGLang's max_mamba_cache_size)
    state_slots_per_request: int = 1  # slots the request cap counts per running request (SGLang: 3 with radix cache)
    windows_full_length: bool = False  # sliding / chunked layers hold every token (SGLang outside its hybrid SWA pool)
    swa_ratio: float = 0.0  # > 0: sliding layers in a pool of their own with this ratio of the full pool's tokens
    # (SGLang's hybrid SWA pool, --swa-full-tokens-ratio); the plan's layout is then memory.split_swa_layout
    charges_other_processes: bool = False  # the profiler charges memory other processes hold on the GPU as this
    # engine's non-torch memory (vLLM V0 0.6.4 and V1 0.8.0 - 0.9.0: a desktop on the card shrinks the KV budget)

    @property
    def label(self) -> str:
        """``vllm 0.19.0`` (the version asked for) or ``vllm 0.30.0 and later`` (the modelled range)."""
        return f"{self.engine} {self.requested_version or self.release_range or self.version}"




@dataclass(frozen=True)
class Device:
    """What an engine's budget needs to know about the GPU beyond its memory.

    ``platform``: ``cuda`` or ``rocm``. ``sm_count``: streaming multiprocessors (AMD: compute units),
    ``None`` when unknown. ``interconnect``: ``nvlink-switch``, ``nvlink``, ``pcie``, ``infinity-fabric``
    or ``None`` (the GPU catalogue's field).
    """

    platform: str = "cuda"
    sm_count: int | None = None
    interconnect: str | None = None
    compute_capability: str | None = None  # "9.0" (NVIDIA), None when unknown or not NVIDIA
    smi_memory_bytes: int | None = None  # the total nvidia-smi shows (SGLang's defaults read it); None: unknown

    @property
    def capability(self) -> tuple[int, int] | None:
        """The compute capability as ``(major, minor)``, None when unknown."""
        try:
            major, minor = str(self.compute_capability).split(".")
            return int(major), int(minor)
        except ValueError:
            return None


@dataclass(frozen=True)
class Features:
    """Serving features that change the budget, as the engine's flags set them.

    ``max_loras``: adapters whose weight slots the engine keeps (vLLM ``--max-loras``; 0: LoRA off);
    ``max_lora_rank``: the rank each slot is sized for. ``speculative``: the speculative decoding method
    (``mtp``, ``eagle``, ``eagle3``, ``ngram``; None: off) and ``speculative_tokens`` the tokens it proposes
    per step. ``expert_parallel``: experts split over the GPUs instead of their intermediate size
    (vLLM ``--enable-expert-parallel``). ``flashinfer``: whether FlashInfer is installed, which decides the
    sampler path of vLLM 0.8 - 0.11's profile run (None: not known; kvplan plans the Docker images' FlashInfer).
    """

    max_loras: int = 0
    max_lora_rank: int = 16
    speculative: str | None = None
    speculative_tokens: int = 0
    expert_parallel: bool = False
    flashinfer: bool | None = None  # FlashInfer installed (vLLM 0.8 - 0.11's sampler path); None: not known

    @property
    def lora(self) -> bool:
        return self.max_loras > 0


# vLLM's / SGLang's --quantization: methods that quantize a 16-bit checkpoint while it loads (what the
# linear layers' weights become per element; embeddings and the LM head stay in the model dtype), and
# checkpoint formats, whose tensors are already quantized (the checkpoint's size is the answer).
ONLINE_QUANTIZATION = {"fp8": "fp8", "fbgemm_fp8": "fp8", "ptpc_fp8": "fp8", "experts_int8": "int8",
                       "bitsandbytes": "int4"}
CHECKPOINT_QUANTIZATION = ("awq", "awq_marlin", "gptq", "gptq_marlin", "gptq_marlin_24", "marlin", "compressed-tensors",
                           "modelopt", "modelopt_fp4", "mxfp4", "gguf", "quark", "torchao", "moe_wna16", "inc", "fp_quant",
                           "petit_nvfp4", "bitblas", "gptq_bitblas", "awq_triton", "tpu_int8", "hqq", "deepspeedfp")


def quantization_weights(method: str) -> tuple[str | None, str]:
    """``(weights dtype, how)`` for an engine's ``--quantization`` value: ``("fp8", ...)`` for online fp8,
    ``(None, ...)`` for a checkpoint format (its size stands); an unknown method is an InputError."""
    key = str(method).strip().lower()
    if key in ONLINE_QUANTIZATION:
        return ONLINE_QUANTIZATION[key], f"--quantization {key}: linear layers quantized to {ONLINE_QUANTIZATION[key]} at load"
    if key in CHECKPOINT_QUANTIZATION:
        return None, f"--quantization {key}: a checkpoint format, the checkpoint's size stands"
    raise InputError(f"unknown --quantization {method!r}",
                     "online: " + ", ".join(ONLINE_QUANTIZATION) + "; checkpoint formats: awq, gptq, compressed-tensors, "
                     "mxfp4, ... (or --weights-dtype fp8|int8|int4)")


@dataclass(frozen=True)
class Launch:
    """What an engine's start-up log and command line need from a plan (tokens, requests, bytes).

    The command line carries every setting of the plan that changes it (the engine's ``serve_command``):
    the model and its ``revision``, ``max_model_len``, utilisation, tp/pp, the run dtype when given (``dtype``), ``quantization``, the KV
    dtype, the SSM-state dtype when given (``ssm_dtype``), ``block_size`` and ``kv_budget_bytes`` when the
    user chose them, the batching limits when the user set them or the plan models another usage context
    than the server (``max_num_batched_tokens_flag``, ``max_num_seqs_flag``), ``enforce_eager``, and prefix
    caching when it differs from the engine's default (``prefix_caching_flag``). ``max_num_seqs`` is the
    engine's effective limit on requests running at once (the user's, vLLM's default, SGLang's derived
    ``max_running_requests``).
    """

    model_id: str
    max_model_len: int
    gpu_util: float
    tp: int
    pp: int
    model_dtype: str
    kv_dtype: str
    max_num_seqs: int
    max_requests: int
    kv_tokens: int
    capacity_tokens: int
    max_concurrency: float
    kv_tokens_rule: str = "concurrency"
    block_size: int | None = None
    kv_budget_bytes: int | None = None
    serve_model: str = ""  # what the launch command names: a local model's folder, else the model id
    max_num_seqs_flag: int | None = None  # --max-num-seqs to pass (the user's)
    dtype: str | None = None  # --dtype to pass (the user's, not auto)
    quantization: str | None = None  # --quantization to pass
    max_num_batched_tokens_flag: int | None = None  # --max-num-batched-tokens to pass
    enforce_eager: bool = False
    prefix_caching_flag: bool | None = None  # prefix caching on/off when it differs from the engine's default
    ssm_dtype: str | None = None  # --mamba-ssm-cache-dtype to pass (the user's)
    is_cpu: bool = False  # vLLM's CPU backend: no utilisation flag, the KV space sized by --kv-cache-memory-bytes
    revision: str | None = None  # --revision to pass (the Hub revision planned)
    kv_memory_bytes: int = 0  # the KV budget per GPU (what vLLM logs as "Available KV cache memory")
    lora: bool = False  # LoRA adapters served (--enable-lora)
    max_loras: int | None = None  # --max-loras to pass (the user's)
    max_lora_rank: int | None = None  # --max-lora-rank to pass (the user's)
    speculative: str | None = None  # the speculative decoding method (mtp, eagle, eagle3, ngram)
    speculative_tokens: int = 0  # tokens the draft proposes per step
    expert_parallel: bool = False  # --enable-expert-parallel
    state_slots: int = 0  # request slots of the engine's own state pool (SGLang's max_mamba_cache_size); 0: none
    swa_tokens: int = 0  # token slots of the engine's own sliding-window pool (SGLang's swa_layer_tokens); 0: none
    swa_full_tokens_ratio: float | None = None  # SGLang's --swa-full-tokens-ratio to pass (the user's)
    disable_hybrid_swa_memory: bool = False  # SGLang's --disable-hybrid-swa-memory
    kv_cache_dtype: str | None = "auto"  # --kv-cache-dtype as the engine spells the planned KV dtype ("auto": the model
    # dtype's); None: the engine has no spelling for it, so the plan is a what-if it cannot run (no command line)

    @property
    def speculative_config(self) -> str | None:
        """vLLM's ``--speculative-config`` JSON for the planned method, None when off."""
        if not self.speculative:
            return None
        return f'{{"method": "{self.speculative}", "num_speculative_tokens": {self.speculative_tokens or 1}}}'

    @property
    def speculative_algorithm(self) -> str | None:
        """SGLang's ``--speculative-algorithm`` for the planned method (MTP is SGLang's NEXTN), None when off."""
        return {"mtp": "NEXTN", "eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM"}.get(self.speculative or "")

    @property
    def ep_size(self) -> int | None:
        """SGLang's ``--ep-size``: expert parallelism over the tensor-parallel GPUs, None when off."""
        return self.tp if self.expert_parallel else None

    # the settings a command line passes only when they differ from the engine's default
    @property
    def tp_flag(self) -> int | None:
        return self.tp if self.tp > 1 else None

    @property
    def pp_flag(self) -> int | None:
        return self.pp if self.pp > 1 else None

    @property
    def kv_dtype_flag(self) -> str | None:
        """``--kv-cache-dtype`` as the engine spells it (:attr:`kv_cache_dtype`), None for ``auto``."""
        return None if self.kv_cache_dtype in ("auto", None) else self.kv_cache_dtype

    @property
    def kv_budget_tokens(self) -> int | None:
        """The pool's token slots when the KV budget was given (engines that size a pool in tokens)."""
        return self.capacity_tokens if self.kv_budget_bytes is not None else None

    @property
    def prefix_caching_on(self) -> bool:
        return self.prefix_caching_flag is True

    @property
    def prefix_caching_off(self) -> bool:
        return self.prefix_caching_flag is False


def kv_cache_dtype_spelling(kv_dtype: str, model_dtype: str, choices: dict[str, str]) -> str | None:
    """How an engine's ``--kv-cache-dtype`` names kvplan's KV dtype ``kv_dtype`` (a :class:`kvplan.units.DType`
    name): ``"auto"`` when it is the model dtype, else ``choices[kv_dtype]`` (the release's spellings: kvplan's
    dtype name -> the engine's choice), None when the release has none (the engine cannot run it)."""
    if kv_dtype == model_dtype:
        return "auto"
    return choices.get(kv_dtype)


def what_if_kv_dtype(engine: EngineDefaults, kv_dtype: str, choices: dict[str, str]) -> str:
    """The note of a plan whose KV dtype the engine cannot run: a what-if, with the release's choices."""
    names = ", ".join(dict.fromkeys(["auto", *choices.values()]))
    return (f"--kv-dtype {kv_dtype} is a what-if {engine.label} cannot run: its --kv-cache-dtype takes {names} "
            "(no launch line)")


def launch_flags(launch: Launch, spelling: tuple[tuple[str, str], ...]) -> list[str]:
    """The flags of the settings ``launch`` sets, in an engine's ``spelling``: ``(setting, flag)`` pairs in
    command-line order, ``setting`` a :class:`Launch` field or property, ``flag`` a format of the value
    (``"--block-size {}"``) or, for a switch, the flag alone. Unset settings (None, False) are left out."""
    out = []
    for setting, flag in spelling:
        value = getattr(launch, setting)
        if value is True:
            out.append(flag)
        elif value is not None and value is not False:
            out.append(flag.format(value))
    return out


@dataclass(frozen=True)
class ModelLength:
    """The longest max_model_len an engine accepts for a model without its override (tokens; None: the config
    names no maximum), and how it follows from the config (``rule``: ``131,072 = original_max_position_embeddings
    32,768 x yarn factor 4``). Each engine's ``model_max_len`` derives it."""

    tokens: int | None
    rule: str = ""


def scaled_length(tokens: int, factor: float) -> int:
    """``floor(tokens x factor)``, exactly (engines compare a max_model_len with the float product, so its
    integer part is the longest they accept), kept within 1 .. ``UNBOUNDED_TOKENS`` (a factor of
    1e300 or of 0 in a config stays a number the plan can use)."""
    exact = scaled(tokens, factor)
    return min(max(exact, 1), UNBOUNDED_TOKENS)


def length_refusal(limit: ModelLength, max_model_len: int, *, setting: str, env: str) -> str | None:
    """Why an engine refuses ``max_model_len`` above the model's maximum length ``limit``, or None.

    vLLM (``ModelConfig._get_and_verify_max_len``) and SGLang (``ModelConfig._derive_context_length``)
    both refuse a length above the one they derive from the config (each engine's ``model_max_len``) unless
    an environment variable ``env`` allows it, since positions past it give NaNs (RoPE) or out-of-bounds
    errors (learned positions).
    """
    top = limit.tokens
    if not top or max_model_len <= top:
        return None
    return (f"{setting} {max_model_len:,} exceeds the model's maximum length {limit.rule}; "
            f"the engine allows it only with {env}=1 set (positions past {top:,} give wrong outputs)")


class Engine(Protocol):
    """What every engine module provides (``kvplan.engines.vllm``, ``kvplan.engines.sglang``).

    Versions, budget and defaults: ``ENGINE`` (its name), ``VERSIONS``, ``DEFAULT_VERSION``,
    :meth:`resolve_version`, :meth:`defaults` (and :meth:`for_model`, what it forces for one model), :meth:`budget`.
    Rules over one engine's :class:`EngineDefaults`: :meth:`inflight_tokens`, :meth:`default_prefix_caching`,
    :meth:`model_max_len` (the longest max_model_len it accepts), :meth:`starts` / :meth:`longest_start` (the
    pool's start-up check; :meth:`idle_reason`, why it starts although no request of max_model_len runs), :meth:`refusal` (every reason it refuses to start; :meth:`serving_release`, the
    release that still serves a dropped architecture), :meth:`request_limit` (requests at once),
    :meth:`check_batching` (limits it rejects),
    :meth:`kv_tokens` (the token figure it logs), :meth:`split_state_pool` (a state pool of its own, SGLang's Mamba pool). The dtypes it runs a checkpoint in: :meth:`auto_dtype`
    (``--dtype auto``), :meth:`ssm_dtype` (state layers' SSM cache). What it prints and how it is launched:
    :meth:`report`, :meth:`serve_command`. A new engine is a module with these names plus one line in
    :mod:`kvplan.engines.registry`.
    """

    ENGINE: str
    VERSIONS: tuple[str, ...]
    DEFAULT_VERSION: str
    BLOCK_SIZES: tuple[int, ...] | None  # the block (page) sizes it accepts; None: any positive size
    LONG_LEN_ENV: str  # the environment variable that lets it start past the model's maximum length

    def resolve_version(self, text: str | None) -> tuple[str, str]:
        """``(modelled version, note)`` for any PEP 440 version (``None``: the newest modelled one)."""

    def defaults(self, version: str, gpu_memory_bytes: int | None, is_cpu: bool, *, gpu_name: str | None = None,
                 max_model_len: int | None = None, usage_context: str = "serve", tp: int = 1,
                 pp: int = 1, device: Device | None = None, spec: ModelSpec | None = None) -> EngineDefaults:
        """The engine's defaults for ``version`` on this GPU (utilisation, block size, batching limits)."""

    def budget(self, total_bytes: int, gpu_util: float, weights: Term, activation: Term | None,
               overhead: Term | None, cudagraph: Term | None, kv_budget_override: int | None, *, spec: ModelSpec,
               tp: int, max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int, is_cpu: bool,
               version: str, pp: int = 1, device: Device | None = None, features: Features | None = None,
               max_model_len: int | None = None) -> Budget:
        """The per-GPU budget; a term given by the caller replaces the engine's estimate."""

    def draft_layers(self, engine: EngineDefaults, spec: ModelSpec, features: Features | None) -> int:
        """How many draft (multi-token-prediction) decoder layers the engine gives a KV cache in the same pool."""

    def for_model(self, engine: EngineDefaults, spec: ModelSpec, is_cpu: bool, max_model_len: int | None, *,
                  device: Device | None = None, kv_dtype: str | None = None,
                  user_block_size: int | None = None) -> EngineDefaults:
        """The defaults with what the engine forces for this model (block size, batching, prefix caching) on this
        GPU, for the asked ``--kv-dtype`` and ``--block-size`` (None: not given)."""

    def inflight_tokens(self, engine: EngineDefaults, pp: int, is_cpu: bool) -> int:
        """Tokens a request may have scheduled but not yet computed, which windowed layers also hold."""

    def default_prefix_caching(self, engine: EngineDefaults) -> bool:
        """Whether the engine runs with prefix caching when the user does not say."""

    def longest_start(self, engine: EngineDefaults, blocks: int, demand: Demand, limit_tokens: int) -> int:
        """The longest max_model_len (at most ``limit_tokens``) with which the pool passes the start-up check."""

    def idle_reason(self, engine: EngineDefaults, max_model_len: int, per_request_blocks: int, blocks: int,
                    longest_runs: int) -> str:
        """Why the engine starts with ``max_model_len`` although no request that long runs (one line), when
        :meth:`Deployment <kvplan.planning.answer.Deployment.idle_reason>` finds so; ``longest_runs``: the longest that runs."""

    def model_max_len(self, engine: EngineDefaults, spec: ModelSpec) -> ModelLength:
        """The longest max_model_len the engine accepts for ``spec`` (from max_position_embeddings and rope
        scaling), with how it follows from the config."""

    def starts(self, engine: EngineDefaults, blocks: int, per_request_blocks: int) -> bool:
        """Whether the pool passes the engine's start-up check when one request of max_model_len holds
        ``per_request_blocks`` (the other reasons to refuse: :meth:`refusal`)."""

    def refusal(self, engine: EngineDefaults, spec: ModelSpec, blocks: int, per_request_blocks: int,
                block_bytes: int, max_model_len: int) -> str | None:
        """Why the engine refuses to start this deployment (one line in its own terms), or None when it starts:
        a model the release does not serve, a max_model_len past the model's maximum, a pool too small."""

    def serving_release(self, spec: ModelSpec) -> str | None:
        """The newest release that serves ``spec``'s architecture when later ones do not, else None."""

    def request_limit(self, engine: EngineDefaults, max_num_seqs: int | None, kv_tokens: int,
                      max_model_len: int) -> int:
        """Requests the engine runs at once at most (``max_num_seqs`` the user's, or None)."""

    def check_batching(self, engine: EngineDefaults, max_model_len: int) -> None:
        """Raise InputError when the batching limits are ones the engine rejects at start-up."""

    def kv_tokens(self, engine: EngineDefaults, blocks: int, layout: PoolLayout, per_request_blocks: int,
                  max_model_len: int) -> int:
        """The token capacity the engine logs at start-up."""

    def split_state_pool(self, engine: EngineDefaults, budget: Budget, layers: tuple[LayerCache, ...], *,
                         max_num_seqs: int | None, prefix_caching: bool) -> tuple[EngineDefaults, Budget]:
        """Where ``engine.state_pool`` (:meth:`for_model` sets it): the budget split into the state pool's request
        slots and the KV pool (``budget.kv_budget_bytes`` what the token pool gets), and the defaults with the slots."""

    def auto_dtype(self, checkpoint_dtype: str, model_type: str, *, bf16: bool) -> str:
        """The dtype ``--dtype auto`` runs a ``checkpoint_dtype`` checkpoint in (``bf16``: the GPU supports it)."""

    def ssm_dtype(self, engine: EngineDefaults, requested: str | None, configured: str | None, state_kind: str,
                  architecture: str, *, is_cpu: bool) -> tuple[str | None, str]:
        """The SSM-state dtype the engine stores a state layer in (None: the model dtype) given ``--ssm-dtype``
        (``requested``) and the config's (``configured``), and why when it is not the config's."""

    def kv_cache_dtypes(self, engine: EngineDefaults) -> dict[str, str]:
        """The release's ``--kv-cache-dtype`` choices besides ``auto``: kvplan's KV dtype name -> the engine's
        spelling (:func:`kv_cache_dtype_spelling`); a dtype missing from it is a what-if the engine cannot run."""

    def report(self, launch: Launch) -> tuple[str, ...]:
        """What the engine will log about its KV cache (first line: the log itself; then explanations)."""

    def log_lines(self, launch: Launch) -> tuple[str, ...]:
        """The engine's own start-up lines about its KV cache, one per line, as it prints them."""

    def serve_command(self, launch: Launch) -> str:
        """The command line that launches the engine as planned."""


# ---------------------------------------------------------------------------------------------
# engine versions -> modelled releases

_PLAIN_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)$")


def release_tuple(text: str, engine: str) -> tuple[int, int, int]:
    """``(major, minor, micro)`` of a PEP 440 version string; pre-, dev-, post-releases and local labels
    (``0.15.2rc1.dev93+g11a4c9d30``) count as the release they are numbered after (0.15.2).

    Plain versions (``0.19.0``, ``0.10.1.1``) are parsed without importing ``packaging``.
    """
    text = str(text).strip()
    plain = _PLAIN_VERSION.match(text)
    if plain:
        parts = tuple(int(p) for p in plain.group(1).split("."))
    else:
        from packaging.version import InvalidVersion, Version

        try:
            parts = Version(text).release
        except InvalidVersion:
            raise InputError(f"invalid --engine-version {text!r} for {engine}",
                             "write a version such as 0.19.0 or 0.15.2rc1.dev93+g11a4c9d30 (PEP 440)") from None
    padded = (parts + (0, 0, 0))[:3]
    return padded[0], padded[1], padded[2]


def _fmt_release(release: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in release)


def release_ranges(firsts: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """Each modelled release's range as text: ``"0.18.0 - 0.19.x"`` (the next one's first release bounds it)."""
    keys = list(firsts)
    out = {}
    for i, key in enumerate(keys):
        first = _fmt_release(firsts[key])
        if i + 1 == len(keys):
            out[key] = f"{first} and later"
            continue
        nxt = firsts[keys[i + 1]]
        if len(nxt) >= 3 and nxt[2] > 0:
            last = f"{nxt[0]}.{nxt[1]}.{nxt[2] - 1}"
        elif nxt[1] > 0:
            last = f"{nxt[0]}.{nxt[1] - 1}.x"
        else:
            last = f"< {_fmt_release(nxt)}"
        out[key] = first if last == first else f"{first} - {last}"
    return out


def resolve_release(engine: str, text: str, firsts: dict[str, tuple[int, ...]]) -> tuple[str, str]:
    """The modelled release covering version ``text`` and a note naming it.

    ``firsts`` maps each modelled release (oldest first) to the first version it covers; a release
    covers everything up to the next one's first version, the newest one everything after it.
    Versions older than the oldest modelled release are refused, with the ranges in the message. A modelled
    release's own name selects it (SGLang ``0.5`` is the modelled 0.5, which starts at 0.5.3, although
    ``0.5`` as a version, 0.5.0, falls in 0.4's range).
    """
    release, name = release_tuple(text, engine), str(text).strip()
    covering = [key for key, first in firsts.items() if release >= (tuple(first) + (0, 0, 0))[:3]]
    chosen = name if name in firsts else (covering[-1] if covering else None)
    ranges = release_ranges(firsts)
    if chosen is None:
        listed = "; ".join(f"{key}: {rng}" for key, rng in ranges.items())
        raise InputError(f"--engine-version {text!r} is older than every modelled {engine} release",
                         f"modelled releases: {listed}")
    return chosen, f"{engine} {text}: rules of modelled release {chosen} (covers {ranges[chosen]})"


# ---------------------------------------------------------------------------------------------
# the activation estimate shared by the engine models


def _per_rank(n: int, tp: int) -> int:
    return math.ceil(n / tp) if n else 0


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
    if spec.num_experts and spec.num_experts_per_token and spec.moe_intermediate_size:
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


def moe_forward_bytes(spec: ModelSpec, tp: int, tokens: int, act_bytes: int, rule: str, chunk: int,
                      expert_parallel: bool = False) -> int:
    """Peak bytes of one MoE layer's forward over ``tokens`` batched tokens, per GPU (0 for a dense model).

    The fused-MoE workspaces of ``min(tokens, chunk)`` tokens (``chunk`` 0: no chunking) x ``top_k`` routed
    pairs (:func:`moe_workspace_elements`), plus what stays alive around the experts call for every token:
    the residual, the normed input and the layer's output (``3 x hidden``), the router logits (``experts``, model
    dtype), the top-k weights and ids (12 B per pair: fp32 + int32 + int32) and a shared expert's output
    (``hidden``). Tokens are not split by tp: every rank routes the whole batch, only the intermediate size
    shrinks with tp (not at all under expert parallelism), and at most to the hidden-sized floors.
    """
    if not (spec.num_experts and spec.num_experts_per_token and spec.moe_intermediate_size):
        return 0
    k, h = spec.num_experts_per_token, spec.hidden_size
    inter = spec.moe_intermediate_size if expert_parallel else _per_rank(spec.moe_intermediate_size, tp)
    m = min(tokens, chunk) if chunk else tokens
    workspace = m * k * moe_workspace_elements(rule, inter, h) * act_bytes
    shared = h if spec.shared_expert_size else 0
    around = tokens * ((3 * h + spec.num_experts + shared) * act_bytes + 12 * k)
    return workspace + around


def forward_bytes(spec: ModelSpec, tp: int, tokens: int, act_bytes: int, moe_rule: str = "v06", moe_chunk: int = 0,
                  expert_parallel: bool = False) -> int:
    """Peak bytes of the profiled forward over ``tokens`` tokens, per GPU: the larger of a dense layer (or a MoE
    model's attention stage, :func:`dense_forward_bytes_per_token`) and a MoE layer (:func:`moe_forward_bytes`)."""
    return max(tokens * dense_forward_bytes_per_token(spec, tp, act_bytes),
               moe_forward_bytes(spec, tp, tokens, act_bytes, moe_rule, moe_chunk, expert_parallel))


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
                       sm_count: int | None = None) -> int:
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
    """
    vocab, padded = spec.vocab_size, padded_vocab(spec.vocab_size)
    logits = rows * padded * act_bytes
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
