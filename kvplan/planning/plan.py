"""Spec + GPU + budget + workload -> :class:`Plan`: the frozen numbers every output renders.

``estimate(options)`` is the one entry point; ``check``, ``report`` and ``simulate`` call it (or
``plan_for_spec``) and never recompute anything themselves. The steps: the GPU (:mod:`kvplan.planning.gpu`), the
pool (:mod:`kvplan.planning.pool`, its given budget terms in :mod:`kvplan.planning.budget`), the deployment over it
and its answer (here and :mod:`kvplan.planning.answer`), the notes (:mod:`kvplan.planning.notes`).
"""

from __future__ import annotations

from dataclasses import field, replace
from typing import Any, Callable

from kvplan import memory
from kvplan.engines import Budget, Engine, EngineDefaults, Launch, kv_cache_dtype_spelling
from kvplan.engines.registry import engine as engine_rules, setting_name
from kvplan.errors import InputError
from kvplan.model.spec import LayerCache, ModelSpec, Overrides
from kvplan.options import (DEFAULT_CONTEXT, Options, check_context, default_context, option_values_of,
                            options_from_values)
from kvplan.planning.answer import Answer, Deployment, credited_prefix
from kvplan.planning.gpu import GpuInfo
from kvplan.planning.kv_range import KvRange, kv_range
from kvplan.planning.notes import _notes
from kvplan.planning.pool import StagePool, _paged_layers, _Pool, _pool
from kvplan.planning.weights import served_weights
from kvplan.units import DType, GiB, plural
from kvplan.frozen import frozen


@frozen
class Plan:
    """Everything kvplan computed for one scenario, in bytes and tokens. Renderers only format this."""

    options: Options
    spec: ModelSpec
    source: str
    gpu: GpuInfo
    engine: EngineDefaults
    kv_dtype: str
    model_dtype: str
    weights_dtype: str
    rank_layers: tuple[LayerCache, ...]
    heads_replicated: bool
    kv_bytes_per_token_model: int  # whole model, all layers (no window), kv dtype
    kv_bytes_per_token_gpu: int  # one GPU's slice
    state_bytes_per_request_gpu: int
    weights_total_bytes: int
    budget: Budget
    demand: memory.Demand  # the pool layout and what one request holds in it under the engine's rules
    max_model_len: int
    max_num_batched_tokens: int  # the engine's scheduler token budget per step
    answer: Answer
    fragmentation: memory.Fragmentation
    prefix: memory.PrefixSharing | None
    roofline: memory.Roofline | None
    notes: tuple[str, ...] = field(default_factory=tuple)
    kv_range: KvRange | None = None  # the answer at the ends of the KV budget's spread (kvplan.planning.kv_range)
    stages: tuple[StagePool, ...] = ()  # each pipeline stage's weights, KV budget and blocks per GPU (none at pp 1);
    # ``budget``, ``rank_layers`` and ``demand`` are those of the stage with the fewest blocks

    def __repr__(self) -> str:
        a = self.answer
        return (f"Plan({self.spec.model_id} on {self.options.gpu_count}x {self.gpu.name}: "
                f"{self.kv_bytes_per_token_gpu:,} B/token/GPU, KV budget {self.budget.kv_budget_bytes / GiB:.2f} GiB, "
                f"{a.kv_tokens:,} KV tokens, {plural(a.max_requests, 'request')} at {plural(a.context, 'token')}, "
                f"{'fits' if a.fits else 'does not fit'} {a.batch:,} x {a.context:,})")

    @property
    def layout(self) -> memory.PoolLayout:
        """The pool layout (``demand.layout``)."""
        return self.demand.layout

    @property
    def rules(self) -> Engine:
        """The engine's rules (``kvplan.engines.vllm`` or ``kvplan.engines.sglang``), for this plan's ``engine``."""
        return engine_rules(self.engine.engine)

    @property
    def deployment(self) -> Deployment:
        """The pool under the engine's rules: whether it starts, requests at once, the longest context."""
        return Deployment(self.spec, self.engine, self.rules, self.demand, self.answer.num_blocks,
                          self.options.max_num_seqs, credited_prefix(self.options.prefix_tokens, self.prefix_caching))

    @property
    def max_model_len_fixed(self) -> int | None:
        """max_model_len when the user fixed it (``--max-model-len N`` or ``auto``); None when it follows
        ``--context``."""
        return self.max_model_len if self.options.max_model_len or self.options.auto_max_model_len else None

    @property
    def launch(self) -> Launch:
        """What the engine's start-up log and command line need (``rules.report`` / ``rules.serve_command``):
        every option of this plan that changes it, as the plan resolved it."""
        o, a, e = self.options, self.answer, self.engine
        default_caching = self.rules.default_prefix_caching(e) if e.prefix_caching is None else e.prefix_caching
        other_usage = o.usage_context != "serve"  # the LLM class's batching defaults: pass them to a server
        return Launch(
            self.spec.model_id, self.max_model_len, self.budget.gpu_util, o.tp, o.pp, self.model_dtype, self.kv_dtype,
            a.max_num_seqs, a.max_requests, a.kv_tokens, a.capacity_tokens, a.max_concurrency, e.kv_tokens_rule,
            self.layout.block_size if o.block_size else None, o.kv_budget_bytes, self.serve_model,
            max_num_seqs_flag=o.max_num_seqs or (a.max_num_seqs if other_usage else None),
            dtype=self.model_dtype if o.dtype and o.dtype != "auto" else None,
            quantization=served_weights(self)[0],
            max_num_batched_tokens_flag=o.max_num_batched_tokens or (e.max_num_batched_tokens if other_usage else None),
            enforce_eager=o.enforce_eager,
            prefix_caching_flag=None if self.prefix_caching == default_caching else self.prefix_caching,
            chunked_prefill_flag=o.chunked_prefill,
            ssm_dtype=next((x.ssm_dtype for x in self.rank_layers if x.is_state and x.ssm_dtype), None)
            if o.ssm_dtype else None,
            is_cpu=self.gpu.is_cpu, revision=o.revision, kv_memory_bytes=self.budget.kv_budget_bytes,
            lora=bool(o.enable_lora or o.max_loras or o.max_lora_rank), max_loras=o.max_loras,
            max_lora_rank=o.max_lora_rank,
            speculative=o.speculative, speculative_tokens=o.num_speculative_tokens or 0,
            expert_parallel=o.expert_parallel, state_slots=e.state_slots,
            swa_tokens=int(a.capacity_tokens * self.layout.swa_ratio) // self.layout.block_size * self.layout.block_size,
            kv_cache_dtype=kv_cache_dtype_spelling(self.kv_dtype, self.model_dtype, self.rules.kv_cache_dtypes(e)),
            swa_full_tokens_ratio=o.swa_full_tokens_ratio, disable_hybrid_swa_memory=o.disable_hybrid_swa_memory)

    @property
    def request_bytes(self) -> int:
        """Pool bytes one request of ``--context`` tokens holds on one GPU under the engine's rules (windows, paging,
        state: ``demand.bytes``): what the answer's concurrency divides the budget by."""
        return self.demand.bytes(self.options.context)

    @property
    def serve_command(self) -> str | None:
        """The command line that starts the planned deployment (the engine's ``serve_command``), None when the engine
        refuses to start or cannot run the planned KV dtype (a what-if: :attr:`Launch.kv_cache_dtype` None)."""
        launch = self.launch
        if self.answer.refusal or launch.kv_cache_dtype is None:
            return None
        return self.rules.serve_command(launch)

    @property
    def option_values(self) -> dict[str, Any]:
        """Every option that changes this plan (:data:`kvplan.options.PLAN_OPTIONS`) as
        :func:`options_from_values` takes it: as resolved here (GPU, engine release: the one asked for, else
        the first of the modelled range, dtypes, block size, utilisation, batching limits, prefix caching) or
        as set. Planning them again gives this plan."""
        o, e = self.options, self.engine
        return option_values_of(o, {
            "model": self.spec.model_id, "gpu": self.gpu.name if o.gpu else None, "engine": e.engine,
            "engine_version": e.requested_version or (e.release_range.split()[0] if e.release_range else e.version),
            "usage_context": e.usage_context,
            "dtype": self.model_dtype, "kv_dtype": self.kv_dtype, "weights_dtype": self.weights_dtype,
            "block_size": e.block_size, "gpu_util": self.budget.gpu_util, "max_model_len": self.max_model_len,
            "max_num_batched_tokens": self.max_num_batched_tokens, "max_num_seqs": self.answer.max_num_seqs,
            "prefix_caching": self.prefix_caching})

    @property
    def serve_model(self) -> str:
        """What a launch command names: a local model's folder (engines load the folder), else the model id."""
        if self.source.startswith("local config "):
            from pathlib import Path

            return str(Path(self.spec.source).parent)
        return self.spec.model_id

    @property
    def inflight_tokens(self) -> int:
        """Tokens scheduled but not yet computed, which windowed groups also hold (``demand.inflight_tokens``)."""
        return self.demand.inflight_tokens

    @property
    def prefix_caching(self) -> bool:
        """Whether the engine runs with prefix caching (``demand.prefix_caching``)."""
        return self.demand.prefix_caching

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready numbers under the documented schema (docs/cli.md, "JSON output")."""
        from kvplan.planning.serialize import plan_to_dict

        return plan_to_dict(self)


# ---------------------------------------------------------------------------------------------


def estimate(options: Options, token: str | None = None, *, suggest: bool = True) -> Plan:
    """Resolve the model, then :func:`plan_for_spec` (``suggest``: as there). ``token`` is a Hub token (never stored
    or printed)."""
    from kvplan.model.sources import load_spec

    spec, source = load_spec(options.model, revision=options.revision, token=token, force_hub=options.hub,
                             offline=options.offline, refresh=options.refresh,
                             overrides=Overrides(options.layers, options.kv_heads, options.head_dim))
    return plan_for_spec(spec, options, source.describe(), suggest=suggest)


def _fixed_length(spec: ModelSpec, pool: _Pool, deployment: Deployment, context_note: str | None, source: str | None,
                  suggest: bool) -> tuple[_Pool, Deployment, int | None, str | None, str | None]:
    """The max_model_len the plan is fixed at (``None``: the context), settled on a pool sized for it where
    ``--max-model-len auto``; the auto note and the default context's note (which follows what auto chose)."""
    options = pool.options
    fixed, auto_note = options.max_model_len, None
    if not options.auto_max_model_len:
        return pool, deployment, fixed, auto_note, context_note
    try:
        pool, deployment, fixed, auto_note = _auto_max_model_len(spec, pool, deployment)
    except InputError as exc:
        if not suggest:
            raise
        from kvplan.planning.suggest import start_hint

        raise InputError(exc.message, start_hint(spec, options, _planner(spec, source), pool.kv_dtype.bits,
                                                 pool.gpu.memory_bytes)) from None
    if default_context(options) and options.context > fixed:  # the default context follows what auto chose
        pool = replace(pool, options=replace(pool.options, context=fixed))
        context_note = context_note or _default_context_note(pool.engine, fixed,
                                                             "the longest --max-model-len auto starts with")
    check_context(pool.options.context, fixed, auto=True)
    return pool, deployment, fixed, auto_note, context_note


def _sections(spec: ModelSpec, pool: _Pool, deployment: Deployment, answer: Answer, max_model_len: int
              ) -> tuple[memory.Fragmentation, memory.PrefixSharing | None, memory.Roofline | None]:
    """The sections every output reads beside the answer, over the same demand and request cap: contiguous vs
    paged, the shared prefix, the decode roofline (none for a deployment that runs nothing)."""
    options, demand, blocks = pool.options, pool.demand, pool.blocks
    cap = deployment.request_cap(max_model_len)
    frag = memory.contiguous_vs_paged(blocks, demand, _paged_layers(pool.layers, pool.engine), options.context,
                                      max_model_len, cap,
                                      deployment.prefix_tokens)
    prefix = None
    if options.prefix_tokens:
        prefix = memory.prefix_sharing(blocks, demand, options.context, options.prefix_tokens, spec.parameters_read(1),
                                       cap, credited=bool(deployment.prefix_tokens))
    roofline = None
    if pool.gpu.bandwidth_bytes_per_s and answer.max_requests >= 1:  # no roofline for a deployment that runs nothing
        batch = min(answer.max_requests, options.batch) if answer.fits else answer.max_requests
        roofline = memory.decode_roofline(memory.step_weight_bytes(pool.budget.weights.bytes, spec, batch),
                                          demand.bytes(options.context), batch,
                                          pool.gpu.bandwidth_bytes_per_s)
    return frag, prefix, roofline


def plan_for_spec(spec: ModelSpec, options: Options, source: str | None = None, *, suggest: bool = True) -> Plan:
    """All the numbers for ``spec`` under ``options`` (pure: no I/O beyond the GPU catalogue).

    :func:`kvplan.planning.pool._pool` sizes the pool once; the :class:`~kvplan.planning.answer.Deployment` over it answers (whether the
    engine starts, requests at once, the longest context) and every other section reads the same
    :class:`~kvplan.memory.Demand` and request cap, so they count the same blocks. When ``batch x context`` does not fit
    and ``suggest``, ``answer.fix`` lists the single changes that make it fit, each one re-planned
    (:func:`kvplan.planning.suggest.fix`; so is the hint of a ``--max-model-len auto`` that starts with no length);
    callers that re-plan many variants themselves pass ``suggest=False``.
    """
    pool, deployment, fixed, auto_note, context_note, answer = _answer_for_spec(spec, options, source, suggest)
    options, demand = pool.options, pool.demand
    max_model_len = fixed or options.context
    if suggest and not answer.fits:
        from kvplan.planning.suggest import fix, refuses_the_model

        answer = replace(answer, fix=fix(spec, options, _planner(spec, source), answer, refuses_the_model(deployment),
                                         pool.kv_dtype.bits, pool.gpu.memory_bytes))
    frag, prefix, roofline = _sections(spec, pool, deployment, answer, max_model_len)
    replicated = memory.kv_heads_replicated(spec, options.tp)
    rng = kv_range(pool.budget, pool.engine, deployment, answer, options.tp, options.context, options.batch, fixed,
                   pool.gpu.is_cpu, spec, pool.gpu)
    return Plan(
        options=options,
        spec=spec,
        source=source or spec.source,
        gpu=pool.gpu,
        engine=pool.engine,
        kv_dtype=pool.kv_dtype.name,
        model_dtype=pool.model_dtype.name,
        weights_dtype=planned_weights_dtype(spec, pool.weights_dtype, pool.model_dtype),
        rank_layers=pool.layers,
        heads_replicated=replicated,
        kv_bytes_per_token_model=memory.kv_bytes_per_token(spec, pool.kv_dtype),
        kv_bytes_per_token_gpu=memory.kv_bytes_per_token(pool.layers, pool.kv_dtype),
        state_bytes_per_request_gpu=memory.state_bytes_per_request(pool.layers, pool.model_dtype),
        weights_total_bytes=pool.weights_total_bytes,
        budget=pool.budget,
        demand=demand,
        max_model_len=max_model_len,
        max_num_batched_tokens=pool.engine.max_num_batched_tokens,
        answer=answer,
        fragmentation=frag,
        prefix=prefix,
        roofline=roofline,
        notes=_notes(pool, spec, auto_note, replicated) + ((context_note,) if context_note else ()) + rng.notes,
        kv_range=rng,
        stages=pool.stages,
    )


def planned_weights_dtype(spec: ModelSpec, weights_dtype: DType | None, model_dtype: DType) -> str:
    """What the planned weights are stored as: ``--weights-dtype`` (or an online ``--quantization``'s), else a
    quantized checkpoint's stored format (``fp8_e4m3``, ``mxfp4``, ``int4``, ...: ``spec.weights_format``), else the
    dtype the model runs in. ``--weights-dtype`` with this value plans the same weights."""
    if weights_dtype is not None:
        return weights_dtype.name
    return spec.weights_format or model_dtype.name


def _default_context_note(engine: EngineDefaults, tokens: int, why: str) -> str:
    """The note of a default context lowered to ``tokens``, in the engine's words (vLLM's max_model_len, SGLang's
    context_length: each engine's own default is the model's maximum)."""
    return (f"context {plural(tokens, 'token')}: {why}, below kvplan's default {DEFAULT_CONTEXT:,} ({engine.engine}'s "
            f"own default {setting_name(engine.engine, 'max_model_len')} is the model's maximum); --context sets another")


def _default_context(spec: ModelSpec, pool: _Pool, deployment: Deployment) -> tuple[_Pool, Deployment, str | None]:
    """The default context (:data:`~kvplan.options.DEFAULT_CONTEXT`) lowered to the model's maximum where that is
    shorter (a 4k model's first run starts), re-planned there, and the note that says so; as given otherwise."""
    options, limit = pool.options, deployment.model_length
    if not default_context(options) or not limit.tokens or limit.tokens >= options.context:
        return pool, deployment, None
    options = replace(options, context=limit.tokens)
    pool = _pool(spec, options)
    return pool, _deployment(spec, pool), _default_context_note(pool.engine, limit.tokens, f"the model's maximum, {limit.rule}")


def _answer_for_spec(spec: ModelSpec, options: Options, source: str | None, suggest: bool
                     ) -> tuple[_Pool, Deployment, int | None, str | None, str | None, Answer]:
    """The pool, the deployment over it, the fixed max_model_len (``None``: the context), the auto and default
    context notes, and the answer: the part of :func:`plan_for_spec` before its suggestions and other sections."""
    pool = _pool(spec, options)
    deployment = _deployment(spec, pool)
    pool, deployment, context_note = _default_context(spec, pool, deployment)
    pool, deployment, fixed, auto_note, context_note = _fixed_length(spec, pool, deployment, context_note, source,
                                                                     suggest)
    deployment.rules.check_batching(pool.engine, fixed or pool.options.context)
    answer = deployment.answer(pool.options.context, pool.options.batch, fixed)
    return pool, deployment, fixed, auto_note, context_note, answer


@frozen
class _Answered:
    """A re-planned change as :mod:`kvplan.planning.suggest` reads it for a plan's suggestions: its answer."""

    answer: Answer


def _planner(spec: ModelSpec, source: str | None) -> "Callable[[Options], _Answered]":
    """Options -> their answer for ``spec`` without suggestions: how :mod:`kvplan.planning.suggest` re-plans a
    change for a plan's ``answer.fix`` and auto hint, which read whether it fits or starts (``answer.fits``,
    ``answer.engine_starts``), not the plan's other sections (its range, paging, roofline: ~40% of a plan)."""
    return lambda options: _Answered(_answer_for_spec(spec, options, source, False)[-1])


def _deployment(spec: ModelSpec, pool: _Pool) -> Deployment:
    """The engine's answers over ``pool`` (starts, requests, fits, max context)."""
    return Deployment(spec, pool.engine, engine_rules(pool.engine.engine), pool.demand, pool.blocks,
                      pool.options.max_num_seqs, credited_prefix(pool.options.prefix_tokens, pool.demand.prefix_caching))


def _auto_max_model_len(spec: ModelSpec, pool: _Pool, deployment: Deployment) -> tuple[_Pool, Deployment, int, str]:
    """``--max-model-len auto`` (:func:`kvplan.planning.auto_length.settle`) on the pools :func:`_runs_at` plans; the
    plan keeps the options as given (the context, auto) on the pool sized for the length chosen."""
    from kvplan.planning.auto_length import settle

    (settled, deployment), longest, note = settle(deployment, lambda length: _runs_at(spec, pool.options, length))
    asked = pool.options
    settled = replace(settled, options=replace(settled.options, context=asked.context,
                                               max_model_len=asked.max_model_len,
                                               auto_max_model_len=asked.auto_max_model_len))
    return settled, deployment, longest, note


def _runs_at(spec: ModelSpec, options: Options, length: int) -> tuple[_Pool, Deployment] | None:
    """The pool and answers the engine has at ``max_model_len = length``, or None when it does not start there,
    refuses its batching, or runs no request that long."""
    try:
        pool = _pool(spec, replace(options, max_model_len=length, auto_max_model_len=False,
                                   context=min(options.context, length)))
        deployment = _deployment(spec, pool)
        deployment.rules.check_batching(pool.engine, length)
    except InputError:
        return None
    return (pool, deployment) if deployment.longest_runnable_len() >= length else None


__all__ = ["Options", "Plan", "Answer", "GpuInfo", "estimate", "plan_for_spec", "options_from_values"]
