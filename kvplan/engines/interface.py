"""The Engine interface every engine module implements, and the model-length rules the engines share.
"""

from __future__ import annotations

from typing import Protocol

from kvplan.engines.launch import Launch
from kvplan.engines.terms import Budget, Device, EngineDefaults, Features, Term
from kvplan.memory import UNBOUNDED_TOKENS, Demand, PipelineStage, PoolLayout
from kvplan.model.spec import LayerCache, ModelSpec
from kvplan.units import scaled
from kvplan.frozen import frozen


@frozen
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
                 pp: int = 1, device: Device | None = None, spec: ModelSpec | None = None,
                 chunked_prefill: bool | None = None, features: Features | None = None) -> EngineDefaults:
        """The engine's defaults for ``version`` on this GPU (utilisation, block size, batching limits);
        ``chunked_prefill``: the user's on/off (None: the engine's default); ``features``: the serving features
        on (LoRA, speculative decoding), which some releases' defaults follow."""

    def budget(self, total_bytes: int, gpu_util: float, weights: Term, activation: Term | None,
               overhead: Term | None, cudagraph: Term | None, kv_budget_override: int | None, *, spec: ModelSpec,
               tp: int, max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int, is_cpu: bool,
               version: str, pp: int = 1, device: Device | None = None, features: Features | None = None,
               max_model_len: int | None = None, stage: PipelineStage | None = None) -> Budget:
        """The per-GPU budget of one pipeline ``stage`` (None: one stage); a term given by the caller replaces the
        engine's estimate."""

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
