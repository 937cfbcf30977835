"""Spec + GPU + budget + workload -> :class:`Plan`: the frozen numbers every output renders.

``estimate(options)`` is the one entry point; ``check``, ``report`` and ``simulate`` call it (or
``plan_for_spec``) and never recompute anything themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from kvplan import memory
from kvplan.planning.answer import Answer, Deployment, credited_prefix
from kvplan.planning.kv_range import KvRange, kv_range
from kvplan.planning.weights import check_quantization, served_weights, weights_bytes as _weights
from kvplan.engines import (Budget, Device, Engine, EngineDefaults, Features, Launch, Term, kv_cache_dtype_spelling,
                            quantization_weights, what_if_kv_dtype)
from kvplan.engines.registry import engine as engine_rules, has_setting
from kvplan.errors import InputError
from kvplan.options import (DEFAULT_CONTEXT, Options, check_context, default_context, option_values_of,
                            options_from_values)
from kvplan.model.spec import LayerCache, LayerKind, ModelSpec, Overrides
from kvplan.units import DType, GiB, MiB, parse_dtype, plural


@dataclass(frozen=True)
class GpuInfo:
    """The GPU planned for: name, memory the runtime reports (bytes), HBM bandwidth (bytes/s)."""

    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: int | None
    memory_source: str
    is_cpu: bool = False
    fp16_tflops: float | None = None  # dense fp16/bf16 peak, for prefill-cost estimates
    vendor: str = ""  # nvidia, amd, any (the catalogue's), "" for --gpu-memory alone
    sm_count: int | None = None  # streaming multiprocessors (AMD: compute units)
    interconnect: str | None = None  # nvlink-switch, nvlink, pcie, infinity-fabric (the catalogue's)
    bf16: bool = True  # the engine can run bfloat16 here (NVIDIA: compute capability >= 8.0)
    compute_capability: str | None = None  # NVIDIA compute capability (the catalogue's)
    smi_memory_bytes: int | None = None  # the total nvidia-smi shows (the catalogue's smi_memory_mib)
    memory_kind: str = "dedicated"  # "unified": the host's memory (the catalogue's memory_kind)

    @property
    def device(self) -> Device:
        """What the engine's budget needs: platform (``rocm`` for AMD GPUs, else ``cuda``), SMs, interconnect,
        compute capability and nvidia-smi's total."""
        return Device("rocm" if self.vendor == "amd" else "cuda", self.sm_count, self.interconnect,
                      self.compute_capability, self.smi_memory_bytes)


@dataclass(frozen=True)
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


def resolve_gpu(options: Options) -> GpuInfo:
    """The GPU from the catalogue (or ``--gpu-memory``), as the runtime reports it."""
    from kvplan.gpus import find_gpu

    gpu = find_gpu(options.gpu) if options.gpu else None
    is_cpu = bool(gpu and gpu.is_cpu)
    if gpu is not None and not is_cpu and gpu.memory_bytes and options.gpu_memory_bytes:
        _check_gpu_memory(gpu, options.gpu_memory_bytes)
    memory_bytes = options.gpu_memory_bytes or (gpu.memory_bytes if gpu else None)
    source = "--gpu-memory" if options.gpu_memory_bytes else (gpu.memory_source if gpu else "")
    if memory_bytes is None and is_cpu and options.kv_budget_bytes:
        # The CPU backend sizes its KV cache from VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory alone.
        memory_bytes, source = options.kv_budget_bytes, "--kv-budget (the CPU backend needs no host memory size)"
    if memory_bytes is None:
        raise InputError(f"GPU {gpu.name if gpu else options.gpu!r} has no fixed memory",
                         "pass --gpu-memory SIZE (e.g. 64GiB), or for the CPU backend --kv-budget SIZE")
    name = gpu.name if gpu else "custom"
    same_memory = gpu is not None and memory_bytes == gpu.memory_bytes
    return GpuInfo(name, memory_bytes, gpu.bandwidth_bytes_per_s if gpu else None, source, is_cpu,
                   gpu.fp16_tflops if gpu else None, gpu.vendor if gpu else "", gpu.sm_count if gpu else None,
                   gpu.interconnect if gpu else None, gpu.supports_bf16 if gpu else True,
                   gpu.compute_capability if gpu else None,
                   gpu.smi_memory_mib * MiB if gpu and gpu.smi_memory_mib and same_memory else None,
                   gpu.memory_kind if gpu else "dedicated")


def _check_gpu_memory(gpu: Any, given_bytes: int) -> None:
    """``--gpu-memory`` with a named GPU may be less than it reports (a share of it) but not more than the part
    has by any count (what the runtime reports, nvidia-smi's total, the size on its box): a plan on memory the
    GPU does not have is refused, never answered."""
    most = max(gpu.memory_bytes, (gpu.smi_memory_mib or 0) * MiB, round((gpu.marketing_gb or 0) * GiB))
    if given_bytes <= most:
        return
    counts = [f"it reports {gpu.memory_bytes / GiB:,.2f} GiB"]
    if gpu.smi_memory_mib:
        counts.append(f"nvidia-smi {gpu.smi_memory_mib:,} MiB")
    if gpu.marketing_gb:
        counts.append(f"{gpu.marketing_gb:g} GB on the box")
    raise InputError(f"--gpu-memory {given_bytes / GiB:,.2f} GiB is more than the {gpu.name} has ({', '.join(counts)})",
                     "name the GPU that has it (`kvplan gpus`), or leave --gpu out: --gpu-memory alone plans a GPU "
                     "of that size")


def estimate(options: Options, token: str | None = None) -> Plan:
    """Resolve the model, then :func:`plan_for_spec`. ``token`` is a Hub token (never stored or printed)."""
    from kvplan.model.sources import load_spec

    spec, source = load_spec(options.model, revision=options.revision, token=token, force_hub=options.hub,
                             offline=options.offline, refresh=options.refresh,
                             overrides=Overrides(options.layers, options.kv_heads, options.head_dim))
    return plan_for_spec(spec, options, source.describe())


@dataclass(frozen=True)
class _Pool:
    """The per-GPU pool of one scenario: everything that does not depend on context, batch or max_model_len
    (except the V0 batch default). ``options`` has ``prefix_caching`` resolved to the engine's default."""

    options: Options
    gpu: GpuInfo
    engine: EngineDefaults
    model_dtype: DType
    kv_dtype: DType
    weights_dtype: DType | None
    layers: tuple[LayerCache, ...]
    demand: memory.Demand
    weights_total_bytes: int
    budget: Budget
    blocks: int
    ssm_note: str = ""  # why the state layers' SSM dtype is not the config's (the engine's rule), "" when it is


def features_of(options: Options) -> Features:
    """The serving features the options turn on (LoRA slots, speculative decoding, expert parallelism)."""
    loras = options.max_loras or (1 if options.enable_lora or options.max_lora_rank else 0)
    return Features(max_loras=loras, max_lora_rank=options.max_lora_rank or 16, speculative=options.speculative,
                    speculative_tokens=options.num_speculative_tokens or (1 if options.speculative else 0),
                    expert_parallel=options.expert_parallel, flashinfer=options.flashinfer)


def _engine_defaults(rules: Engine, options: Options, gpu: GpuInfo, spec: ModelSpec) -> EngineDefaults:
    """The engine's defaults for this GPU, with the user's utilisation / block size / batching limits."""
    version, version_note = rules.resolve_version(options.engine_version)
    engine = rules.defaults(version, gpu.memory_bytes, gpu.is_cpu, gpu_name=gpu.name,
                            max_model_len=options.max_model_len or options.context,
                            usage_context=options.usage_context, tp=options.tp, pp=options.pp, device=gpu.device,
                            spec=spec)
    if version_note:
        engine = replace(engine, requested_version=options.engine_version or "", notes=(version_note,) + engine.notes)
    if options.block_size and rules.BLOCK_SIZES and options.block_size not in rules.BLOCK_SIZES:
        raise InputError(f"invalid --block-size {options.block_size}: {rules.ENGINE}'s choices are "
                         + ", ".join(map(str, rules.BLOCK_SIZES)), f"{rules.ENGINE}'s default here is {engine.block_size}")
    if options.gpu_util is not None or options.block_size or options.max_num_batched_tokens or options.max_num_seqs:
        engine = replace(
            engine,
            gpu_util=options.gpu_util if options.gpu_util is not None else engine.gpu_util,
            block_size=options.block_size or engine.block_size,
            max_num_batched_tokens=options.max_num_batched_tokens or engine.max_num_batched_tokens,
            max_num_seqs=options.max_num_seqs or engine.max_num_seqs,
        )
    return engine


def _with_ssm_dtype(layers: tuple[LayerCache, ...], rules: Engine, engine: EngineDefaults, spec: ModelSpec,
                    options: Options, gpu: GpuInfo) -> tuple[tuple[LayerCache, ...], str]:
    """State layers with the SSM dtype the engine stores (``--ssm-dtype``, the release's rule for the config's,
    the CPU backend's float32), and why when that is not the config's."""
    requested = parse_dtype(options.ssm_dtype, "--ssm-dtype").name if options.ssm_dtype else None
    out, why = [], ""
    for layer in layers:
        if layer.is_state:
            dtype, reason = rules.ssm_dtype(engine, requested, layer.ssm_dtype, layer.state_kind, spec.architecture,
                                            is_cpu=gpu.is_cpu)
            why = why or reason
            layer = replace(layer, ssm_dtype=dtype)
        out.append(layer)
    return tuple(out), why


def _with_images(layers: tuple[LayerCache, ...], spec: ModelSpec, options: Options) -> tuple[LayerCache, ...]:
    """Cross-attention layers caching ``--images`` images' tokens per request (the spec counts one)."""
    if options.images is None:
        return layers
    if not any(layer.kind is LayerKind.CROSS for layer in spec.layers):
        raise InputError(f"--images {options.images}: {spec.model_id} has no cross-attention layers",
                         "--images sizes the image tokens of cross-attention models such as Llama-3.2-Vision")
    return tuple(replace(layer, window_tokens=(layer.window_tokens or 0) * options.images)
                 if layer.kind is LayerKind.CROSS else layer for layer in layers)


def _with_engine_layers(layers: tuple[LayerCache, ...], draft: int, engine: EngineDefaults,
                        model_dtype: DType) -> tuple[LayerCache, ...]:
    """This GPU's layers as the engine caches them: ``draft`` copies of the last attention layer for the draft
    (multi-token-prediction) layers it gives a KV cache, and MLA entries padded to ``engine.mla_align_bytes`` of
    the model dtype (vLLM V0 0.7.2+)."""
    if draft:
        last = next((layer for layer in reversed(layers) if layer.caches_tokens), None)
        layers = layers + (last,) * draft if last is not None else layers
    if engine.mla_align_bytes:
        multiple = max(1, engine.mla_align_bytes // model_dtype.nbytes(1))
        layers = tuple(replace(layer, head_dim=-(-layer.head_dim // multiple) * multiple)
                       if layer.kind is LayerKind.MLA else layer for layer in layers)
    return layers


def _hybrid_swa_options(engine: EngineDefaults, options: Options) -> EngineDefaults:
    """SGLang's ``--swa-full-tokens-ratio`` (the hybrid SWA pool's split) and ``--disable-hybrid-swa-memory`` (one
    pool of full layers instead); a note where the release gives the model no hybrid pool for them to change."""
    flag = "--disable-hybrid-swa-memory" if options.disable_hybrid_swa_memory else "--swa-full-tokens-ratio"
    if not has_setting(engine.engine, "swa_full_tokens_ratio"):
        raise InputError(f"{flag} is SGLang's: {engine.engine} has no hybrid SWA pool", "use --engine sglang")
    if not engine.swa_ratio:
        return replace(engine, notes=engine.notes + (f"{flag}: {engine.label} gives this model no hybrid SWA pool "
                                                     "(every layer holds every token): no effect",))
    if options.disable_hybrid_swa_memory:
        return replace(engine, swa_ratio=0.0, windows_full_length=True)
    return replace(engine, swa_ratio=options.swa_full_tokens_ratio)


def _paged_layers(layers: tuple[LayerCache, ...], engine: EngineDefaults) -> tuple[LayerCache, ...]:
    """The layers the paged pool holds: all, or the attention layers alone where the engine keeps state layers in
    a pool of request slots of their own (``engine.state_pool``: SGLang's Mamba pool); windowed layers at full
    length where the engine keeps no window (``engine.windows_full_length``: SGLang outside its hybrid SWA pool)."""
    layers = tuple(x for x in layers if not x.is_state) if engine.state_pool else layers
    return memory.full_length_layers(layers) if engine.windows_full_length else layers


def _layout(layers: tuple[LayerCache, ...], engine: EngineDefaults, kv_dtype: DType,
            model_dtype: DType) -> memory.PoolLayout:
    """The pool layout of this GPU's ``layers`` as the engine lays them out: vLLM's KV-cache groups, or SGLang's
    full-attention and sliding-window pools (``engine.swa_ratio``: :func:`kvplan.memory.split_swa_layout`)."""
    paged = _paged_layers(layers, engine)
    if engine.swa_ratio:
        return memory.split_swa_layout(paged, engine.block_size, kv_dtype, model_dtype, engine.swa_ratio)
    return memory.cached_pool_layout(paged, engine.block_size, kv_dtype, model_dtype)


def _pool(spec: ModelSpec, options: Options) -> _Pool:
    """GPU, engine, dtypes, this GPU's layers, the pool layout and demand, the budget and the blocks."""
    gpu = resolve_gpu(options)
    rules = engine_rules(options.engine)
    engine = rules.for_model(_engine_defaults(rules, options, gpu, spec), spec, gpu.is_cpu,
                             options.max_model_len or options.context, device=gpu.device,
                             kv_dtype=options.kv_dtype, user_block_size=options.block_size)
    if options.swa_full_tokens_ratio is not None or options.disable_hybrid_swa_memory:
        engine = _hybrid_swa_options(engine, options)
    features = features_of(options)
    if options.dtype and options.dtype != "auto":
        model_dtype = parse_dtype(options.dtype, "--dtype")
    else:  # the engine's --dtype auto: a float32 checkpoint runs in bf16 (fp16 without bf16 support)
        model_dtype = parse_dtype(rules.auto_dtype(stored_dtype(spec), spec.model_type, bf16=gpu.bf16))
    kv_dtype = parse_dtype(options.kv_dtype, "--kv-dtype") if options.kv_dtype and options.kv_dtype != "auto" else model_dtype
    if engine.kv_in_model_dtype:  # the engine ignores --kv-dtype for this model
        kv_dtype = model_dtype
    weights_dtype = None
    if options.weights_dtype and options.weights_dtype.strip().lower() != spec.weights_format:
        weights_dtype = parse_dtype(options.weights_dtype, "--weights-dtype", weights=True)
        if weights_dtype.name == spec.weights_format:  # the format the checkpoint stores: the checkpoint as it is
            weights_dtype = None
    quantized_how = ""
    if options.quantization:
        method_dtype, quantized_how = quantization_weights(options.quantization)
        check_quantization(spec, options.quantization, method_dtype, rules.ENGINE)
        if weights_dtype is None and method_dtype:
            weights_dtype = parse_dtype(method_dtype, "--quantization", weights=True)

    heads = spec.num_attention_heads
    if heads and heads % options.tp:  # vLLM's ModelConfig.verify_with_parallel_config
        divisors = ", ".join(str(t) for t in (1, 2, 4, 8, 16, 32, 64) if t <= heads and heads % t == 0)
        if options.tp_from_gpus:  # the user said --gpus N: speak of it
            raise InputError(f"--gpus {options.gpu_count} (tensor parallelism over all of them) does not divide the "
                             f"model's {heads} attention heads ({rules.ENGINE} requires it)",
                             f"use --gpus {divisors.replace(', ', ', --gpus ')}; or split them with --tp and --pp "
                             f"(tp x pp = {options.gpu_count}, tp dividing {heads})")
        raise InputError(f"--tp {options.tp} does not divide the model's {heads} attention heads ({rules.ENGINE} "
                         "requires it)", f"use a tp that divides {heads}: {divisors}")
    layers, ssm_note = _with_ssm_dtype(memory.rank_layers(spec, options.tp, options.pp), rules, engine, spec,
                                       options, gpu)
    layers = _with_images(layers, spec, options)
    layers = _with_engine_layers(layers, rules.draft_layers(engine, spec, features), engine, model_dtype)
    layout = _layout(layers, engine, kv_dtype, model_dtype)
    prefix_caching = rules.default_prefix_caching(engine) if options.prefix_caching is None else options.prefix_caching
    if engine.prefix_caching is not None:  # the engine forces it for this model
        prefix_caching = engine.prefix_caching
    if prefix_caching != options.prefix_caching:
        options = replace(options, prefix_caching=prefix_caching)
    demand = memory.Demand(layout, rules.inflight_tokens(engine, options.pp, gpu.is_cpu), prefix_caching)

    weights_total, weights_source = _weights(spec, options, weights_dtype, model_dtype)
    if quantized_how and options.weights_bytes is None:
        weights_source = f"{quantized_how}: {weights_source}"
    n_gpus = options.tp * options.pp
    weights_term = Term("weights", math.ceil(weights_total / n_gpus),
                        weights_source + (f", split over {plural(n_gpus, 'GPU')}" if n_gpus > 1 else ""))

    terms, calibration_note = _given_terms(spec, options, gpu, engine, model_dtype, weights_term)
    budget: Budget = rules.budget(
        gpu.memory_bytes, engine.gpu_util, *terms, options.kv_budget_bytes,
        spec=spec, tp=options.tp, max_num_batched_tokens=engine.max_num_batched_tokens,
        max_num_seqs=engine.max_num_seqs, act_bytes=model_dtype.nbytes(1), is_cpu=gpu.is_cpu,
        version=engine.version, pp=options.pp, device=gpu.device, features=features,
        max_model_len=options.max_model_len or options.context,
    )
    if calibration_note:
        budget = replace(budget, notes=budget.notes + (calibration_note,))
    check_kv_budget(budget, gpu, options, rules.ENGINE, layout)
    if engine.state_pool:  # the state pool's request slots come out of the budget first
        engine, budget = rules.split_state_pool(engine, budget, layers, max_num_seqs=options.max_num_seqs,
                                                prefix_caching=prefix_caching)
    return _Pool(options, gpu, engine, model_dtype, kv_dtype, weights_dtype, layers, demand, weights_total, budget,
                 memory.num_blocks(budget.kv_budget_bytes, layout), ssm_note)


def check_kv_budget(budget: Budget, gpu: GpuInfo, options: Options, engine: str, layout: memory.PoolLayout) -> None:
    """A given ``--kv-budget`` must fit on the device beside every other term the engine holds there (weights,
    activation, non-torch overhead, CUDA graphs): the engine allocates the cache it is told to and fails when the
    device has less, so a plan of more KV than the device holds is refused (one line with the device's figures),
    never answered "fits". The CPU backend's KV space must fit the host's total (the weights aside: the backend's
    own sizing ignores them); sized from the KV space alone, it has no host total to hold it to; a
    budget that holds no block besides the null block answers itself (nothing fits: the low end of a plan whose
    terms fill the device is planned so, :func:`kvplan.checks.capacity.low_end`)."""
    kv = options.kv_budget_bytes
    if kv is None or gpu.memory_source.startswith("--kv-budget"):
        return
    if memory.num_blocks(kv, layout) <= memory.NULL_BLOCKS:
        return
    # the CPU backend's KV space is host memory beside the weights, sized from the host's total alone (vLLM's own
    # default is a share of it, kvplan.engines.vllm.cpu_kv_budget): it must fit the host, the weights aside
    held = [] if gpu.is_cpu else [t for t in budget.terms if t.bytes]
    room = budget.total_bytes - sum(t.bytes for t in held)
    if kv <= room:
        return
    taken = "".join(f" {'-' if i == 0 else '+'} {t.name} {t.bytes / GiB:,.2f}" for i, t in enumerate(held))
    taken += " GiB" if held else ""
    what = "host" if gpu.is_cpu else "GPU"
    if options.gpu_memory_bytes:
        total = f"--gpu-memory {budget.total_bytes / GiB:,.2f} GiB"
    else:
        total = f"the {gpu.name}'s {budget.total_bytes / GiB:,.2f} GiB" + ("" if gpu.is_cpu else " (runtime-reported)")
    most = math.floor(room / GiB * 100) / 100
    hint = (f"give at most --kv-budget {most:.2f}GiB, or a {what} with more memory" if most > 0 else
            f"those terms alone fill the {what}: more tensor parallelism (--tp), or a {what} with more memory")
    raise InputError(f"--kv-budget {kv / GiB:,.2f} GiB does not fit: {total}{taken} leaves "
                     f"{room / GiB:,.2f} GiB for the KV cache, and {engine} would fail to allocate more", hint)


def _given_terms(spec: ModelSpec, options: Options, gpu: GpuInfo, engine: EngineDefaults, model_dtype: DType,
                 weights: Term) -> tuple[tuple[Term, Term | None, Term | None, Term | None], str]:
    """The terms the engine does not estimate: the user's (``--activation-gib``, ..., ``--enforce-eager``)
    and, under them, a matching calibration entry's measured ones; and the calibration note."""
    def given(name: str, value: int | None) -> Term | None:
        return None if value is None else Term(name, value, "--" + name.replace("_", "-") + "-gib")

    terms = {"weights": weights, "activation": given("activation", options.activation_bytes),
             "overhead": given("overhead", options.overhead_bytes), "cudagraph": given("cudagraph", options.cudagraph_bytes)}
    if terms["cudagraph"] is None and options.enforce_eager:
        terms["cudagraph"] = Term("cudagraph", 0, "--enforce-eager: no CUDA graphs are captured")
    note = ""
    if options.calibration is not None:
        cal = options.calibration
        key = dict(model=spec.model_id, gpu=gpu.name, gpu_memory_bytes=gpu.memory_bytes, engine=engine.engine,
                   release=engine.version, tp=options.tp, pp=options.pp, dtype=model_dtype.name,
                   max_num_batched_tokens=engine.max_num_batched_tokens, max_num_seqs=engine.max_num_seqs)
        entry = cal.match(**key)
        if entry is None:
            note = f"calibration {cal.path}: no entry for this deployment ({cal.mismatch(**key)}): kvplan's estimates used"
        else:
            used = []
            for key, value in entry.terms:
                name = key.removesuffix("_bytes")
                user_given = options.weights_bytes is not None if name == "weights" else terms[name] is not None
                if not user_given:
                    terms[name] = Term(name, value, f"calibration {cal.path}: measured ({entry.source or 'a log'})")
                    used.append(name)
            note = (f"calibration {cal.path}: measured {', '.join(used) or 'no'} term(s) of {entry.source or 'a log'} used"
                    + (f" ({entry.note})" if entry.note else ""))
    return (terms["weights"], terms["activation"], terms["overhead"], terms["cudagraph"]), note


def plan_for_spec(spec: ModelSpec, options: Options, source: str | None = None, *, suggest: bool = True) -> Plan:
    """All the numbers for ``spec`` under ``options`` (pure: no I/O beyond the GPU catalogue).

    :func:`_pool` sizes the pool once; the :class:`~kvplan.planning.answer.Deployment` over it answers (whether the
    engine starts, requests at once, the longest context) and every other section reads the same
    :class:`~kvplan.memory.Demand` and request cap, so they count the same blocks. When ``batch x context`` does not fit
    and ``suggest``, ``answer.fix`` lists the single changes that make it fit, each one re-planned
    (:func:`kvplan.planning.suggest.fix`; so is the hint of a ``--max-model-len auto`` that starts with no length);
    callers that re-plan many variants themselves pass ``suggest=False``.
    """
    pool = _pool(spec, options)
    deployment = _deployment(spec, pool)
    pool, deployment, context_note = _default_context(spec, pool, deployment)
    options = pool.options
    fixed, auto_note = options.max_model_len, None
    if options.auto_max_model_len:
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
            context_note = context_note or _default_context_note(fixed, "the longest --max-model-len auto starts with")
        check_context(pool.options.context, fixed, auto=True)
    options, demand, blocks = pool.options, pool.demand, pool.blocks
    max_model_len = fixed or options.context
    deployment.rules.check_batching(pool.engine, max_model_len)
    answer = deployment.answer(options.context, options.batch, fixed)
    if suggest and not answer.fits:
        from kvplan.planning.suggest import fix, refuses_the_model

        answer = replace(answer, fix=fix(spec, options, _planner(spec, source), answer, refuses_the_model(deployment),
                                         pool.kv_dtype.bits, pool.gpu.memory_bytes))
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
    )


def planned_weights_dtype(spec: ModelSpec, weights_dtype: DType | None, model_dtype: DType) -> str:
    """What the planned weights are stored as: ``--weights-dtype`` (or an online ``--quantization``'s), else a
    quantized checkpoint's stored format (``fp8_e4m3``, ``mxfp4``, ``int4``, ...: ``spec.weights_format``), else the
    dtype the model runs in. ``--weights-dtype`` with this value plans the same weights."""
    if weights_dtype is not None:
        return weights_dtype.name
    return spec.weights_format or model_dtype.name


def _default_context_note(tokens: int, why: str) -> str:
    return (f"context {plural(tokens, 'token')}: {why}, below kvplan's default {DEFAULT_CONTEXT:,} (vLLM's own default "
            "max_model_len is the model's maximum); --context sets another")


def _default_context(spec: ModelSpec, pool: _Pool, deployment: Deployment) -> tuple[_Pool, Deployment, str | None]:
    """The default context (:data:`~kvplan.options.DEFAULT_CONTEXT`) lowered to the model's maximum where that is
    shorter (a 4k model's first run starts), re-planned there, and the note that says so; as given otherwise."""
    options, limit = pool.options, deployment.model_length
    if not default_context(options) or not limit.tokens or limit.tokens >= options.context:
        return pool, deployment, None
    options = replace(options, context=limit.tokens)
    pool = _pool(spec, options)
    return pool, _deployment(spec, pool), _default_context_note(limit.tokens, f"the model's maximum, {limit.rule}")


def _planner(spec: ModelSpec, source: str | None) -> "Callable[[Options], Plan]":
    """Options -> their plan for ``spec`` without suggestions: how :mod:`kvplan.planning.suggest` re-plans a change."""
    return lambda options: plan_for_spec(spec, options, source, suggest=False)


def _notes(pool: _Pool, spec: ModelSpec, auto_note: str | None, replicated: bool) -> tuple[str, ...]:
    """What the reader should know: the spec's, the engine's and the budget's notes, plus the plan's own."""
    options, budget, layout = pool.options, pool.budget, pool.demand.layout
    state = _state_note(pool, spec)
    notes = [n for n in spec.notes if not (state and n.startswith(STATE_NOTE))] + list(pool.engine.notes)
    notes += list(budget.notes) + ([state] if state else [])
    if auto_note:
        notes.append(auto_note)
    if options.gpu_memory_bytes:
        notes.append(_gpu_memory_note(pool.gpu, options))
    if options.split_given:  # --gpus with --tp or --pp: the other took the rest
        given, other = ("tp", "pp") if options.split_given == "tp" else ("pp", "tp")
        kind = "pipeline" if other == "pp" else "tensor"
        notes.append(f"--gpus {options.gpu_count} with --{given} {getattr(options, given)}: {kind} parallelism over "
                     f"the rest ({other} {getattr(options, other)})")
    elif options.tp_from_gpus:
        notes.append(f"--gpus {options.gpu_count} without --tp/--pp: tensor parallelism over all of them (tp "
                     f"{options.tp}); pass --tp and --pp to split them otherwise")
    if replicated:
        notes.append(f"tp {options.tp} exceeds the KV heads: each rank holds a replicated copy of its head")
    if pool.model_dtype.name != spec.dtype:
        notes.append(_dtype_note(pool, spec))
    choices = engine_rules(pool.engine.engine).kv_cache_dtypes(pool.engine)
    if kv_cache_dtype_spelling(pool.kv_dtype.name, pool.model_dtype.name, choices) is None:
        notes.append(what_if_kv_dtype(pool.engine, pool.kv_dtype.name, choices))
    if budget.kv_budget_bytes <= 0:
        notes.append(_no_kv_memory_note(budget))
    if layout.padding_layers:
        notes.append(f"{layout.padding_layers} padded layer slot(s) in the last group of a kind waste "
                     f"{layout.padding_layers}/{len(layout.groups) * layout.group_size} of each block")
    return tuple(notes)


def _gpu_memory_note(gpu: GpuInfo, options: Options) -> str:
    """What ``--gpu-memory`` means (the total the runtime reports, in GiB), in decimal units where it was given
    in them, and the catalogue GPU nearest to it with what that one reports (``--gpu-memory 80GB`` is 74.51 GiB;
    an H100 reports 79.20 GiB)."""
    from kvplan.gpus import load_gpus
    from kvplan.units import GB

    size = options.gpu_memory_bytes
    what = f"--gpu-memory: {size / GiB:,.2f} GiB ({size:,} B), planned as the total the runtime reports"
    if size % GB == 0 and size % GiB:
        what += f" (GB is 10^9 B: {size // GB:,} GB = {size / GiB:,.2f} GiB)"
    gpus = [g for g in load_gpus() if not g.is_cpu and g.memory_bytes]
    boxed = [g for g in gpus if g.marketing_gb and size in (round(g.marketing_gb * GB), round(g.marketing_gb * GiB))]
    near = boxed or [g for g in gpus if 0.8 <= g.memory_bytes / size <= 1.25]
    if options.gpu:  # the user's size, not the named GPU's: say what that one reports when it differs
        from kvplan.gpus import find_gpu

        named = find_gpu(options.gpu)
        if named.memory_bytes and named.memory_bytes != size:
            what += (f", not what the catalogue's {named.name} reports ({named.memory_bytes / GiB:,.2f} GiB; leave "
                     "--gpu-memory out to plan that)")
        return what
    if not near:
        return what
    # the size on a box names the first such GPU of the catalogue (H100 SXM for 80 GB), else the nearest in size
    best = near[0] if boxed else min(near, key=lambda g: abs(math.log(g.memory_bytes / size)))
    flag = min((best.name, *best.aliases), key=len).lower()
    return (f"{what}; the catalogue's {best.name} reports {best.memory_bytes / GiB:,.2f} GiB, not its box's "
            f"{best.marketing_gb:g} GB (--gpu {flag} plans that)" if boxed else
            f"{what}; the catalogue's {best.name} reports {best.memory_bytes / GiB:,.2f} GiB (--gpu {flag} plans that)")


def _no_kv_memory_note(budget: Budget) -> str:
    """Why the KV budget is empty: the weights alone, or the terms together (each named, GiB per GPU)."""
    usable = f"{budget.usable_bytes / GiB:.2f} GiB usable per GPU"
    if budget.weights.bytes >= budget.usable_bytes:
        return f"no memory left for the KV cache: weights alone take {budget.weights.bytes / GiB:.2f} GiB of {usable}"
    terms = [t for t in budget.terms if t.bytes]
    taken = sum(t.bytes for t in terms)
    listed = " + ".join(f"{t.name} {t.bytes / GiB:.2f}" for t in terms)
    return f"no memory left for the KV cache: {listed} = {taken / GiB:.2f} GiB of {usable}"


STATE_NOTE = "state layers:"  # how the spec's note on state layers begins (the plan's own replaces it)


def _state_note(pool: _Pool, spec: ModelSpec) -> str | None:
    """The dtypes state layers are planned in, when the engine changed the spec's (its CPU backend stores the
    SSM state in float32): one note that replaces the spec's, so they cannot disagree."""
    planned = sorted({x.ssm_dtype or "" for x in pool.layers if x.is_state})
    if not planned or planned == sorted({x.ssm_dtype or "" for x in spec.layers if x.is_state}):
        return None
    ssm = ", ".join(d or "the model dtype" for d in planned)
    why = f" ({pool.ssm_note})" if pool.ssm_note else ""
    return f"{STATE_NOTE} conv state in {pool.model_dtype.name}, SSM state in {ssm}{why}"


_SAFETENSORS_16 = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def checkpoint_label(spec: ModelSpec) -> str:
    """What the checkpoint stores, in words: ``float32``, or for a quantized one its format and the dtype of its
    other tensors (``mxfp4 + bfloat16``: gpt-oss' MXFP4 experts and bfloat16 rest, whatever the config's
    ``torch_dtype`` says or leaves out)."""
    return f"{spec.weights_format} + {stored_dtype(spec)}" if spec.weights_format else spec.dtype


def stored_dtype(spec: ModelSpec) -> str:
    """The dtype of a checkpoint's unquantized tensors: a quantized checkpoint's most common 16-bit tensor dtype
    (gpt-oss: bfloat16, whatever its config's missing torch_dtype defaults to), else the config's dtype. What the
    engines' ``--dtype auto`` reads (SGLang runs MXFP4 gpt-oss in bfloat16)."""
    held = dict(spec.weights.params_by_dtype) if spec.weights is not None and spec.weights.params_by_dtype else {}
    rest = [_SAFETENSORS_16[k] for k in sorted(held, key=lambda k: -held[k]) if k in _SAFETENSORS_16 and k != "F32"]
    return rest[0] if spec.weights_format and rest else spec.dtype


def _dtype_note(pool: _Pool, spec: ModelSpec) -> str:
    """Why the model runs in another dtype than its config's (KV, activations and weights follow); a quantized
    checkpoint is named by what it stores (:func:`checkpoint_label`), not by the config's dtype."""
    run, checkpoint = pool.model_dtype.name, spec.dtype
    stored = checkpoint_label(spec)
    prov = spec.provenance.get("dtype") or ""
    config_dtype = prov if prov and prov != "torch_dtype" else f"the config's torch_dtype {checkpoint}"
    what = f"the {stored} checkpoint" + (f" ({config_dtype})" if spec.weights_format else "")
    if pool.options.dtype and pool.options.dtype != "auto":
        why = f"--dtype {pool.options.dtype}: {what} is cast to {run}"
    else:
        no_bf16 = "" if pool.gpu.bf16 else f" ({pool.gpu.name} has no bfloat16: compute capability below 8.0)"
        why = f"dtype auto: {pool.engine.engine} runs {what} in {run}{no_bf16}"
    keep = f"; --dtype {checkpoint} keeps {checkpoint}" if checkpoint == "float32" and not spec.weights_format else ""
    return f"{why}; the KV cache, activations and weights are sized in {run}{keep}"


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
