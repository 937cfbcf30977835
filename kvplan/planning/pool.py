"""The per-GPU pool of one scenario, the first step of a plan: the engine's defaults for the GPU, the dtypes, this
GPU's layers as the engine caches them, the pool layout and demand, the budget and the blocks.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kvplan import memory
from kvplan.engines import Budget, Engine, EngineDefaults, Features, Term, quantization_weights
from kvplan.engines.registry import engine as engine_rules
from kvplan.engines.registry import has_setting
from kvplan.errors import InputError
from kvplan.model.spec import LayerCache, LayerKind, ModelSpec
from kvplan.options import Options
from kvplan.planning.budget import (_given_terms, check_kv_budget, with_host_use, with_unlisted_weights,
                                    with_unmodelled_non_torch)
from kvplan.planning.gpu import GpuInfo, resolve_gpu
from kvplan.planning.weights import check_quantization
from kvplan.planning.weights import weights_bytes as _weights
from kvplan.units import DType, parse_dtype, plural
from kvplan.frozen import frozen


@frozen
class StagePool:
    """One pipeline stage's share of a plan, per GPU: the weights it loads, its KV budget and its blocks (the engine
    gives every stage the fewest blocks of any)."""

    stage: memory.PipelineStage
    budget: Budget
    blocks: int

    @property
    def weights_bytes(self) -> int:
        return self.budget.weights.bytes

    @property
    def kv_budget_bytes(self) -> int:
        return self.budget.kv_budget_bytes


@frozen
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
    stage: memory.PipelineStage | None = None  # the pipeline stage whose pool this is (the one with the fewest blocks)
    stages: tuple[StagePool, ...] = ()  # every pipeline stage's weights, budget and blocks (none at pp 1)


def features_of(options: Options, spec: ModelSpec | None = None, weights_dtype: DType | None = None) -> Features:
    """The serving features the options turn on (LoRA slots, speculative decoding, expert parallelism) and whether
    the weights run in fp8 (an fp8 checkpoint, ``--weights-dtype fp8`` or ``--quantization fp8``)."""
    loras = options.max_loras or (1 if options.enable_lora or options.max_lora_rank else 0)
    fp8 = (weights_dtype is not None and weights_dtype.name.startswith("fp8")) or (
        spec is not None and spec.quant_method == "fp8" and weights_dtype is None)
    return Features(max_loras=loras, max_lora_rank=options.max_lora_rank or 16, speculative=options.speculative,
                    speculative_tokens=options.num_speculative_tokens or (1 if options.speculative else 0),
                    expert_parallel=options.expert_parallel, flashinfer=options.flashinfer, fp8_weights=fp8)


def _engine_defaults(rules: Engine, options: Options, gpu: GpuInfo, spec: ModelSpec) -> EngineDefaults:
    """The engine's defaults for this GPU, with the user's utilisation / block size / batching limits."""
    version, version_note = rules.resolve_version(options.engine_version)
    if options.chunked_prefill is not None and not has_setting(rules.ENGINE, "chunked_prefill"):
        raise InputError(f"--{'' if options.chunked_prefill else 'no-'}enable-chunked-prefill is vLLM's: "
                         f"{rules.ENGINE} sizes its chunks with --chunked-prefill-size (-1: off, which kvplan does "
                         "not model)", "drop it, or give --chunked-prefill-size")
    engine = rules.defaults(version, gpu.memory_bytes, gpu.is_cpu, gpu_name=gpu.name,
                            max_model_len=options.max_model_len or options.context,
                            usage_context=options.usage_context, tp=options.tp, pp=options.pp, device=gpu.device,
                            spec=spec, chunked_prefill=options.chunked_prefill, features=features_of(options, spec))
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
            if dtype != layer.ssm_dtype:  # the same layer otherwise (replace builds and checks a new one)
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


def _dtypes(spec: ModelSpec, options: Options, rules: Engine, engine: EngineDefaults,
            gpu: GpuInfo) -> tuple[DType, DType, DType | None, str]:
    """The dtype the model runs in, the KV cache's, the weights' when not the checkpoint's (``--weights-dtype``, an
    online ``--quantization``'s), and how the quantization method stores them ("" without one)."""
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
    return model_dtype, kv_dtype, weights_dtype, quantized_how


def _check_tp(spec: ModelSpec, options: Options, rules: Engine) -> None:
    """The tensor parallelism must divide the attention heads (vLLM's ``ModelConfig.verify_with_parallel_config``)."""
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


def _weights_term(spec: ModelSpec, options: Options, weights_dtype: DType | None, model_dtype: DType,
                  quantized_how: str, stage: memory.PipelineStage | None = None) -> tuple[int, Term]:
    """The weights in all (bytes) and their term per GPU: the ``stage``'s weights (its own layers, the embedding on
    the first stage, the LM head on the last: :func:`kvplan.memory.stage_weight_bytes`) split over tp; without
    pipeline stages the whole model split over tp."""
    weights_total, weights_source = _weights(spec, options, weights_dtype, model_dtype)
    if quantized_how and options.weights_bytes is None:
        weights_source = f"{quantized_how}: {weights_source}"
    if stage is None or stage.count == 1:
        n_gpus = options.tp * options.pp
        return weights_total, Term("weights", math.ceil(weights_total / n_gpus),
                                   weights_source + (f", split over {plural(n_gpus, 'GPU')}" if n_gpus > 1 else ""))
    held = memory.stage_weight_bytes(spec, stage, weights_total, model_dtype.nbytes(1))
    where = (f", {stage.describe()}: {held / max(1, weights_total):.1%} of them (its layers"
             + (", the embedding" if stage.first else "") + (", the LM head" if stage.last else "") + ")"
             + (f", split over tp {options.tp}" if options.tp > 1 else ""))
    return weights_total, Term("weights", math.ceil(held / options.tp), weights_source + where)


@frozen
class _Setup:
    """What every pipeline stage of one scenario shares: the GPU, the engine's rules and defaults, the dtypes."""

    spec: ModelSpec
    options: Options
    gpu: GpuInfo
    rules: Engine
    engine: EngineDefaults
    features: Features
    model_dtype: DType
    kv_dtype: DType
    weights_dtype: DType | None
    quantized_how: str


def _pool(spec: ModelSpec, options: Options) -> _Pool:
    """GPU, engine, dtypes, this GPU's layers, the pool layout and demand, the budget and the blocks.

    With pipeline stages every stage is sized as its own workers size it (its weights, its layers' KV bytes per
    token, the sampler on the last stage) and the pool is the stage with the fewest blocks (the engine's minimum
    over workers; ties: the earliest stage). SGLang sizes every stage from the smallest free memory over all ranks:
    the heaviest stage's weights."""
    gpu = resolve_gpu(options)
    rules = engine_rules(options.engine)
    engine = rules.for_model(_engine_defaults(rules, options, gpu, spec), spec, gpu.is_cpu,
                             options.max_model_len or options.context, device=gpu.device,
                             kv_dtype=options.kv_dtype, user_block_size=options.block_size)
    if options.swa_full_tokens_ratio is not None or options.disable_hybrid_swa_memory:
        engine = _hybrid_swa_options(engine, options)
    model_dtype, kv_dtype, weights_dtype, quantized_how = _dtypes(spec, options, rules, engine, gpu)
    features = features_of(options, spec, weights_dtype)
    _check_tp(spec, options, rules)
    prefix_caching = rules.default_prefix_caching(engine) if options.prefix_caching is None else options.prefix_caching
    if engine.prefix_caching is not None:  # the engine forces it for this model
        prefix_caching = engine.prefix_caching
    if prefix_caching != options.prefix_caching:
        options = replace(options, prefix_caching=prefix_caching)
    setup = _Setup(spec, options, gpu, rules, engine, features, model_dtype, kv_dtype, weights_dtype,
                   quantized_how)
    if options.pp == 1:
        return _stage_pool(setup, None)
    stages = memory.pipeline_stages(spec.num_layers_decoder, options.pp, engine.pp_partition)
    heaviest = None
    if engine.pp_free_min:
        heaviest = max((_weights_term(spec, options, weights_dtype, model_dtype, quantized_how, s)[1] for s in stages),
                       key=lambda t: t.bytes)
    pools = [_stage_pool(setup, s, heaviest) for s in stages]
    deciding = min(pools, key=lambda p: p.blocks)
    counts = ", ".join(str(s.num_layers) for s in stages)
    note = (f"layers per pipeline stage: {counts}; blocks per stage: {', '.join(f'{p.blocks:,}' for p in pools)}; the "
            f"engine takes the smallest, {deciding.stage.describe() if deciding.stage else 'stage 1'}'s")
    summary = tuple(StagePool(p.stage, p.budget, p.blocks) for p in pools if p.stage is not None)
    notes, engine = (note,), deciding.engine
    if engine.mode == "V0":  # vllm/core/scheduler.py: num_gpu_blocks //= pipeline_parallel_size per virtual engine
        engine = replace(engine, pool_shards=options.pp)
        notes += (f"vLLM V0 splits the pool among its {options.pp} virtual engines (one scheduler each, with "
                  f"{plural(deciding.blocks // options.pp, 'block')} and its own max_num_seqs): one request holds at "
                  "most that many blocks",)
    return replace(deciding, engine=engine, budget=replace(deciding.budget, notes=deciding.budget.notes + notes),
                   stages=summary)


def _stage_pool(setup: _Setup, stage: memory.PipelineStage | None, weights: Term | None = None) -> _Pool:
    """One pipeline stage's pool (``stage`` None: the whole model on each GPU): its layers, layout, demand, budget and
    blocks; ``weights``: the weights term to charge instead of the stage's own (SGLang's heaviest stage)."""
    spec, options, gpu, rules, engine = setup.spec, setup.options, setup.gpu, setup.rules, setup.engine
    model_dtype, kv_dtype = setup.model_dtype, setup.kv_dtype
    own = memory.stage_rank_layers(spec, options.tp, stage) if stage is not None else \
        memory.rank_layers(spec, options.tp, options.pp, engine.pp_partition)
    layers, ssm_note = _with_ssm_dtype(own, rules, engine, spec, options, gpu)
    layers = _with_images(layers, spec, options)
    draft = rules.draft_layers(engine, spec, setup.features) if stage is None or stage.last else 0
    layers = _with_engine_layers(layers, draft, engine, model_dtype)
    layout = _layout(layers, engine, kv_dtype, model_dtype)
    demand = memory.Demand(layout, rules.inflight_tokens(engine, options.pp, gpu.is_cpu), options.prefix_caching)
    weights_total, weights_term = _weights_term(spec, options, setup.weights_dtype, model_dtype, setup.quantized_how,
                                                stage)
    terms, calibration_note = _given_terms(spec, options, gpu, engine, model_dtype, weights or weights_term)
    budget: Budget = rules.budget(
        gpu.memory_bytes, engine.gpu_util, *terms, options.kv_budget_bytes,
        spec=spec, tp=options.tp, max_num_batched_tokens=engine.max_num_batched_tokens,
        max_num_seqs=engine.max_num_seqs, act_bytes=model_dtype.nbytes(1), is_cpu=gpu.is_cpu,
        version=engine.version, pp=options.pp, device=gpu.device, features=setup.features,
        max_model_len=options.max_model_len or options.context, stage=stage,
    )
    if calibration_note:
        budget = replace(budget, notes=budget.notes + (calibration_note,))
    budget = with_unmodelled_non_torch(with_host_use(budget, engine, gpu), engine, gpu, options.tp)
    budget = with_unlisted_weights(budget, engine, spec)
    check_kv_budget(budget, gpu, options, rules.ENGINE, layout)
    if engine.state_pool:  # the state pool's request slots come out of the budget first
        engine, budget = rules.split_state_pool(engine, budget, layers, max_num_seqs=options.max_num_seqs,
                                                prefix_caching=options.prefix_caching)
    return _Pool(options, gpu, engine, model_dtype, kv_dtype, setup.weights_dtype, layers, demand, weights_total,
                 budget, memory.num_blocks(budget.kv_budget_bytes, layout), ssm_note, stage)


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
