"""Parameters computed from a config: an inventory of the checkpoint's tensors, for checkpoints without weight
facts and for estimating how a quantized checkpoint stores them (:mod:`kvplan.model.quant`).

Counted: embeddings (+ an untied LM head), each layer's attention or mixer (MLA projections, Mamba /
gated-delta-net mixers), its MLP (dense, or routed experts + router + shared experts), norms, the attention
biases configs declare (``attention_bias``, Qwen2's q/k/v biases, gpt-oss' sinks and expert biases), and the
multi-token-prediction (MTP) layers a checkpoint stores (``num_nextn_predict_layers``), marked as such: serving
engines do not load them without speculative decoding, so they are not in :attr:`ModelSpec.parameters`.
"""

from __future__ import annotations


from kvplan.model.config_reader import ConfigReader
from kvplan.model.source import WeightFacts
from kvplan.model.modelspec import LayerCache, LayerKind, ModelSpec
from kvplan.frozen import frozen


_UNGATED_MLP_TYPES = {"gpt2", "opt", "falcon", "RefinedWeb", "RefinedWebModel", "phi", "gpt_neox", "gptj", "bloom",
                      "gpt_bigcode", "starcoder2", "mpt", "codegen", "gpt_neo"}


# transformers' config classes that tie the LM head to the embeddings unless the config says otherwise
TIED_BY_DEFAULT = {"gpt2", "opt", "falcon", "RefinedWeb", "RefinedWebModel", "gpt_neo", "gpt_bigcode", "bloom", "mpt",
                    "gemma", "gemma2", "gemma3_text"}
_LEARNED_POSITIONS = {"gpt2", "opt", "gpt_bigcode", "gpt_neo", "codegen"}
# Qwen2-family attention: q, k and v projections with biases (no config key says so)
_QKV_BIAS_TYPES = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"}


@frozen
class Tensors:
    """``count`` tensors of ``rows x cols`` parameters each, under one module name.

    ``module``: the Hugging Face module path in Llama / DeepSeek names (``model.layers.3.self_attn.q_proj``;
    routed experts are named by expert 0), which quantization configs' ignore lists are matched against.
    ``role``: ``embedding``, ``lm_head``, ``attention``, ``mlp``, ``experts``, ``shared_experts``, ``router``,
    ``mixer``, ``norm``, ``biases``, ``mtp_proj``. ``linear``: the weight of a linear layer (rows = out
    features, cols = in features), what weight quantizers convert. ``dtype``: the safetensors dtype of a
    tensor checkpoints keep in another precision (DeepSeek's float32 ``e_score_correction_bias``), else None
    (the model dtype). ``mtp``: part of a multi-token-prediction layer.
    """

    module: str
    role: str
    rows: int
    cols: int = 1
    count: int = 1
    linear: bool = False
    dtype: str | None = None
    mtp: bool = False

    @property
    def parameters(self) -> int:
        return self.rows * self.cols * self.count


def _linear(module: str, role: str, rows: int, cols: int, count: int = 1) -> Tensors:
    return Tensors(module, role, rows, cols, count, linear=True)


def _moe_layer(r: ConfigReader, i: int, num_layers: int, model_type: str) -> bool:
    """Whether decoder layer ``i`` has routed experts (DeepSeek, Qwen-MoE, Jamba, Llama 4 key conventions)."""
    opt = lambda key, default: r.int(key, (key,), required=False, minimum=0) if r.has(key) else default  # noqa: E731
    if r.has("first_k_dense_replace") or r.has("moe_layer_freq"):
        k, freq = opt("first_k_dense_replace", 0), max(1, opt("moe_layer_freq", 1))
        return i >= k and i % freq == 0
    mlp_only = r.raw("mlp_only_layers")
    if isinstance(mlp_only, list) and i in mlp_only:
        return False
    if r.has("decoder_sparse_step"):
        step = max(1, opt("decoder_sparse_step", 1))
        return (i + 1) % step == 0
    if r.has("expert_layer_period"):
        period, offset = max(1, opt("expert_layer_period", 1)), opt("expert_layer_offset", 0)
        return i % period == offset
    moe_layers = r.raw("moe_layers")
    if isinstance(moe_layers, list):
        return i in moe_layers
    if model_type.startswith("llama4"):
        step = max(1, opt("interleave_moe_layer_step", 1))
        return (i + 1) % step == 0
    return True


def _attention(r: ConfigReader, spec: ModelSpec, layer: LayerCache, at: str) -> list[Tensors]:
    """One layer's attention / mixer tensors (projections, norms of the latent, biases)."""
    h, heads = spec.hidden_size, spec.num_attention_heads
    if layer.kind is LayerKind.MLA:
        return _mla(r, spec, at)
    if layer.caches_tokens:
        q, kv = heads * layer.head_dim, layer.kv_heads * layer.head_dim
        a = f"{at}.self_attn"
        out = [_linear(f"{a}.q_proj", "attention", q, h), _linear(f"{a}.k_proj", "attention", kv, h),
               _linear(f"{a}.v_proj", "attention", kv, h), _linear(f"{a}.o_proj", "attention", h, q)]
        if r.bool("attention_bias"):
            out.append(Tensors(f"{at}.self_attn.bias", "biases", q + 2 * kv + h))
        elif spec.model_type in _QKV_BIAS_TYPES:
            out.append(Tensors(f"{at}.self_attn.bias", "biases", q + 2 * kv))
        if spec.model_type == "gpt_oss":
            out.append(Tensors(f"{at}.self_attn.sinks", "biases", heads))
        return out
    if layer.is_state and layer.state_dims:
        return _state(h, layer, f"{at}.mixer")
    return []


def _mla(r: ConfigReader, spec: ModelSpec, at: str) -> list[Tensors]:
    """MLA (DeepSeek V2/V3): low-rank q (or a full q_proj), the compressed kv projection, its norm, kv_b, o."""
    h, heads = spec.hidden_size, spec.num_attention_heads
    get = lambda key, default=0: r.int(key, (key,), required=False, minimum=0) or default  # noqa: E731
    nope, rope, v_dim = get("qk_nope_head_dim"), get("qk_rope_head_dim"), get("v_head_dim")
    q_lora, kv_lora = get("q_lora_rank"), get("kv_lora_rank")
    a = f"{at}.self_attn"
    if q_lora:
        q = [_linear(f"{a}.q_a_proj", "attention", q_lora, h), Tensors(f"{a}.q_a_layernorm", "norm", q_lora),
             _linear(f"{a}.q_b_proj", "attention", heads * (nope + rope), q_lora)]
    else:
        q = [_linear(f"{a}.q_proj", "attention", heads * (nope + rope), h)]
    return q + [_linear(f"{a}.kv_a_proj_with_mqa", "attention", kv_lora + rope, h),
                Tensors(f"{a}.kv_a_layernorm", "norm", kv_lora),
                _linear(f"{a}.kv_b_proj", "attention", heads * (nope + v_dim), kv_lora),
                _linear(f"{a}.o_proj", "attention", h, heads * v_dim)]


def _state(h: int, layer: LayerCache, at: str) -> list[Tensors]:
    """A Mamba1 / Mamba2 / gated-delta-net mixer from its dims: its linear projections and the rest (conv,
    A, D, dt, norm) as one vector."""
    d = layer.state_dims
    if layer.state_kind == "mamba1":
        inner, state, kernel, dt_rank = d
        return [_linear(f"{at}.in_proj", "mixer", 2 * inner, h),
                _linear(f"{at}.x_proj", "mixer", dt_rank + 2 * state, inner),
                _linear(f"{at}.dt_proj", "mixer", inner, dt_rank), _linear(f"{at}.out_proj", "mixer", h, inner),
                Tensors(f"{at}.conv1d", "norm", inner * kernel + inner + inner + inner * state + inner)]
    if layer.state_kind == "mamba2":
        heads, _head_dim, groups, state, kernel, inner = d
        conv = inner + 2 * groups * state
        return [_linear(f"{at}.in_proj", "mixer", 2 * inner + 2 * groups * state + heads, h),
                _linear(f"{at}.out_proj", "mixer", h, inner),
                Tensors(f"{at}.conv1d", "norm", conv * kernel + conv + 3 * heads + inner)]
    k_heads, v_heads, k_dim, v_dim, kernel = d
    conv = 2 * k_heads * k_dim + v_heads * v_dim
    return [_linear(f"{at}.in_proj_qkvz", "mixer", 2 * k_heads * k_dim + 2 * v_heads * v_dim, h),
            _linear(f"{at}.in_proj_ba", "mixer", 2 * v_heads, h),
            _linear(f"{at}.out_proj", "mixer", h, v_heads * v_dim),
            Tensors(f"{at}.conv1d", "norm", conv * kernel + 2 * v_heads + v_dim)]


@frozen
class _Mlp:
    """What a config says about its MLPs (sizes in parameters' dimensions)."""

    gated: bool
    dense_size: int  # intermediate size of a dense MLP
    n_shared: int  # DeepSeek-style shared experts (each moe_intermediate_size wide)
    shared_size: int  # Qwen-MoE's one shared expert (shared_expert_intermediate_size), with a 1-wide gate
    score_bias: bool  # DeepSeek-V3 noaux_tc routing: a float32 e_score_correction_bias per MoE layer


def _mlp_facts(r: ConfigReader, spec: ModelSpec) -> _Mlp:
    model_type = spec.model_type
    n_shared = r.int("n_shared_experts", ("n_shared_experts", "num_shared_experts"), required=False, minimum=0) or 0
    shared = r.int("shared_expert_intermediate_size", ("shared_expert_intermediate_size",), required=False,
                   minimum=0) or 0
    dense = spec.intermediate_size
    if model_type.startswith("llama4"):
        dense = r.int("intermediate_size_mlp", ("intermediate_size_mlp",), required=False) or spec.intermediate_size
        n_shared = max(n_shared, 1)
    return _Mlp(model_type not in _UNGATED_MLP_TYPES, dense, n_shared, shared, r.str("topk_method") == "noaux_tc")


def _dense_mlp(m: _Mlp, h: int, at: str, size: int | None = None, gated: bool | None = None) -> list[Tensors]:
    size = m.dense_size if size is None else size
    up = [_linear(f"{at}.gate_proj", "mlp", size, h)] if (m.gated if gated is None else gated) else []
    return up + [_linear(f"{at}.up_proj", "mlp", size, h), _linear(f"{at}.down_proj", "mlp", h, size)]


def _moe_mlp(m: _Mlp, spec: ModelSpec, at: str) -> list[Tensors]:
    """Routed experts (gate, up, down of each), the router, shared experts."""
    h, e, size = spec.hidden_size, spec.num_experts, spec.moe_intermediate_size
    x = f"{at}.experts.0"
    out = [_linear(f"{x}.gate_proj", "experts", size, h, e), _linear(f"{x}.up_proj", "experts", size, h, e),
           _linear(f"{x}.down_proj", "experts", h, size, e), _linear(f"{at}.gate", "router", e, h)]
    if m.score_bias:
        out.append(Tensors(f"{at}.gate.e_score_correction_bias", "router", e, dtype="F32"))
    if spec.model_type == "gpt_oss":
        out.append(Tensors(f"{at}.experts.bias", "biases", e * (2 * size + h) + e))  # gate_up, down and router biases
    if m.n_shared:
        shared = m.n_shared * size
        out += [_linear(f"{at}.shared_experts.{p}", "shared_experts", shared, h) for p in ("gate_proj", "up_proj")]
        out.append(_linear(f"{at}.shared_experts.down_proj", "shared_experts", h, shared))
    if m.shared_size:
        out += [_linear(f"{at}.shared_expert.{p}", "shared_experts", m.shared_size, h)
                for p in ("gate_proj", "up_proj")]
        out += [_linear(f"{at}.shared_expert.down_proj", "shared_experts", h, m.shared_size),
                _linear(f"{at}.shared_expert_gate", "router", 1, h)]
    return out


def mla_dims(r: ConfigReader) -> tuple[int, ...]:
    """An MLA config's ``(q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)``, () if not MLA."""
    if r.raw("kv_lora_rank") is None:
        return ()
    get = lambda key: r.int(key, (key,), required=False, minimum=0) or 0  # noqa: E731
    return tuple(get(k) for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))


def quant_method(r: ConfigReader) -> str:
    """The quantization method a checkpoint's config declares, lower case: ``quantization_config.quant_method``
    (or a ``compression_config``'s: ``compressed-tensors``), ``modelopt`` for ModelOpt's ``quant_algo``,
    ``unknown`` for a quantization_config naming no method; "" when the checkpoint is not quantized."""
    for key in ("quantization_config", "compression_config"):
        q = r.raw(key)
        if isinstance(q, dict):
            method = q.get("quant_method")
            if isinstance(method, str) and method.strip():
                return method.strip().lower()
            if "quant_algo" in q:
                return "modelopt"
            return "compressed-tensors" if key == "compression_config" else "unknown"
    return ""


def shared_expert_size(spec: ModelSpec, r: ConfigReader) -> int:
    """The intermediate size of a MoE layer's shared experts (DeepSeek's ``n_shared_experts x
    moe_intermediate_size``, Qwen-MoE's ``shared_expert_intermediate_size``); 0 for a dense model or none."""
    if not spec.num_experts:
        return 0
    m = _mlp_facts(r, spec)
    return m.n_shared * spec.moe_intermediate_size + m.shared_size


def routed_expert_layers(spec: ModelSpec, r: ConfigReader) -> int:
    """Decoder layers with routed experts (0 for a dense model): the layers whose unpicked experts a token
    does not read (:meth:`kvplan.model.modelspec.ModelSpec.parameters_read`)."""
    return len(expert_layer_ids(spec, r))


def expert_layer_ids(spec: ModelSpec, r: ConfigReader) -> tuple[int, ...]:
    """The decoder layers with routed experts, in order (() for a dense model): DeepSeek's first
    ``first_k_dense_replace`` layers are dense, Nemotron-H's ``E`` blocks are MoE, and so on (:func:`_moe_layer`)."""
    if not spec.num_experts or not spec.num_experts_per_token or not spec.moe_intermediate_size:
        return ()
    n = spec.num_layers_decoder
    pattern = r.raw("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) == n:
        return tuple(i for i, c in enumerate(pattern) if c == "E")
    return tuple(i for i in range(n) if _moe_layer(r, i, n, spec.model_type))


def layer_parameters(tensors: tuple[Tensors, ...], num_layers: int) -> tuple[int, ...]:
    """Each decoder layer's parameters in the inventory (its ``model.layers.<i>.`` tensors, the MTP layers
    left out): what a pipeline stage of those layers loads besides the embedding and the LM head."""
    out = [0] * num_layers
    for t in tensors:
        if t.mtp or not t.module.startswith("model.layers."):
            continue
        index = t.module.split(".", 3)[2]
        if index.isdigit() and int(index) < num_layers:
            out[int(index)] += t.parameters
    return tuple(out) if any(out) else ()


def inventory(spec: ModelSpec, r: ConfigReader) -> tuple[Tensors, ...]:
    """The checkpoint's tensors as the config describes them, MTP layers last (``mtp=True``); empty when the
    config has no vocabulary size."""
    if not spec.vocab_size:
        return ()
    h, n = spec.hidden_size, spec.num_layers_decoder
    m = _mlp_facts(r, spec)
    out = [Tensors("model.embed_tokens", "embedding", spec.vocab_size, h)]
    if spec.model_type in _LEARNED_POSITIONS and spec.max_position_embeddings:
        out.append(Tensors("model.embed_positions", "embedding", spec.max_position_embeddings, h))
    per_layer = len(spec.layers) // n if n and len(spec.layers) % n == 0 else 1
    for j, layer in enumerate(spec.layers):
        out += _attention(r, spec, layer, f"model.layers.{j // per_layer}")
    pattern = r.raw("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) == n:
        # Nemotron-H: each block is one norm + one sublayer; only '-' (squared-ReLU MLP) and 'E' (MoE) have an MLP
        for i, c in enumerate(pattern):
            at = f"model.layers.{i}.mlp"
            out += _dense_mlp(m, h, at, spec.intermediate_size, gated=False) if c == "-" else (
                _moe_mlp(m, spec, at) if c == "E" else [])
            out.append(Tensors(f"model.layers.{i}.norm", "norm", h))
    else:
        for i in range(n):
            moe = spec.num_experts and _moe_layer(r, i, n, spec.model_type)
            at = f"model.layers.{i}.mlp"
            out += _moe_mlp(m, spec, at) if moe else _dense_mlp(m, h, at)
            out.append(Tensors(f"model.layers.{i}.layernorm", "norm", h, count=2))
    if not r.bool("tie_word_embeddings", default=spec.model_type in TIED_BY_DEFAULT):
        out.append(_linear("lm_head", "lm_head", spec.vocab_size, h))
    out.append(Tensors("model.norm", "norm", h))
    return tuple(out) + _mtp(spec, r, m)


def mtp_layers(r: ConfigReader) -> int:
    """The multi-token-prediction layers a checkpoint stores (``num_nextn_predict_layers``; transformers 5:
    ``num_mtp_layers``, whose DeepSeek-V3 / GLM-4-MoE default is 1)."""
    return r.int("num_mtp_layers", ("num_nextn_predict_layers", "num_mtp_layers"), required=False, minimum=0) or 0


def _mtp(spec: ModelSpec, r: ConfigReader, m: _Mlp) -> tuple[Tensors, ...]:
    """The ``num_nextn_predict_layers`` multi-token-prediction layers a checkpoint stores after the decoder
    layers (DeepSeek-V3 layout, ``model.layers.<num_hidden_layers + k>``): a decoder layer like the last one,
    its own embedding and LM head (``shared_head``), ``enorm``/``hnorm`` and the ``eh_proj`` that mixes them."""
    count = mtp_layers(r)
    if not count or not spec.layers:
        return ()
    h, n = spec.hidden_size, spec.num_layers_decoder
    out: list[Tensors] = []
    for k in range(count):
        at = f"model.layers.{n + k}"
        moe = spec.num_experts and _moe_layer(r, n + k, n + count, spec.model_type)
        out += _attention(r, spec, spec.layers[-1], at)
        out += _moe_mlp(m, spec, f"{at}.mlp") if moe else _dense_mlp(m, h, f"{at}.mlp")
        out += [Tensors(f"{at}.layernorm", "norm", h, count=2),
                Tensors(f"{at}.embed_tokens", "embedding", spec.vocab_size, h),
                Tensors(f"{at}.enorm", "norm", h, count=3),  # enorm, hnorm, shared_head.norm
                _linear(f"{at}.eh_proj", "mtp_proj", h, 2 * h),
                _linear(f"{at}.shared_head.head", "lm_head", spec.vocab_size, h)]
    return tuple(Tensors(t.module, t.role, t.rows, t.cols, t.count, t.linear, t.dtype, mtp=True) for t in out)


def parameter_count(weights: WeightFacts | None, tensors: tuple[Tensors, ...]) -> int | None:
    """Total parameters an engine loads: the count of ``weights`` (the facts less the MTP layers,
    :func:`kvplan.model.checkpoint.engine_weights`), else the inventory's count without the MTP layers. None when
    neither says (no vocabulary size, no facts)."""
    if weights is not None and weights.parameters:
        return weights.parameters
    if weights is not None and weights.params_by_dtype:
        return sum(weights.params_by_dtype.values())
    return sum(t.parameters for t in tensors if not t.mtp) if tensors else None
