"""Parameter counts computed from a config, for checkpoints without weight facts.

Counted: embeddings (+ an untied LM head), each layer's attention or mixer (MLA projections, Mamba /
gated-delta-net mixers), its MLP (dense, or routed experts + router + shared experts), norms.
"""

from __future__ import annotations

from kvplan.config_reader import ConfigReader
from kvplan.modelspec import LayerCache, LayerKind, ModelSpec


_UNGATED_MLP_TYPES = {"gpt2", "opt", "falcon", "RefinedWeb", "RefinedWebModel", "phi", "gpt_neox", "gptj", "bloom",
                      "gpt_bigcode", "starcoder2", "mpt", "codegen", "gpt_neo"}


# transformers' config classes that tie the LM head to the embeddings unless the config says otherwise
TIED_BY_DEFAULT = {"gpt2", "opt", "falcon", "RefinedWeb", "RefinedWebModel", "gpt_neo", "gpt_bigcode", "bloom", "mpt",
                    "gemma", "gemma2", "gemma3_text"}
_LEARNED_POSITIONS = {"gpt2", "opt", "gpt_bigcode", "gpt_neo", "codegen"}


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


def _attention_params(r: ConfigReader, spec: ModelSpec, layer: LayerCache) -> int:
    """Parameters of one layer's attention / mixer (projections, norms of the latent)."""
    h, heads = spec.hidden_size, spec.num_attention_heads
    if layer.kind is LayerKind.MLA:
        get = lambda key, default=0: r.int(key, (key,), required=False, minimum=0) or default  # noqa: E731
        nope, rope, v_dim = get("qk_nope_head_dim"), get("qk_rope_head_dim"), get("v_head_dim")
        q_lora, kv_lora = get("q_lora_rank"), get("kv_lora_rank")
        q = (h * q_lora + q_lora + q_lora * heads * (nope + rope)) if q_lora else h * heads * (nope + rope)
        kv = h * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
        return q + kv + heads * v_dim * h
    if layer.caches_tokens:
        head_dim = layer.head_dim
        return 2 * h * heads * head_dim + 2 * h * layer.kv_heads * head_dim
    if layer.is_state and layer.state_dims:
        return _state_params(h, layer)
    return 0


def _state_params(h: int, layer: LayerCache) -> int:
    """Parameters of a Mamba1 / Mamba2 / gated-delta-net mixer from its dims."""
    d = layer.state_dims
    if layer.state_kind == "mamba1":
        inner, state, kernel, dt_rank = d
        return (h * 2 * inner + inner * kernel + inner + inner * (dt_rank + 2 * state) + dt_rank * inner + inner
                + inner * state + inner + inner * h)
    if layer.state_kind == "mamba2":
        heads, _head_dim, groups, state, kernel, inner = d
        conv = inner + 2 * groups * state
        return h * (2 * inner + 2 * groups * state + heads) + conv * kernel + conv + 3 * heads + inner + inner * h
    k_heads, v_heads, k_dim, v_dim, kernel = d
    conv = 2 * k_heads * k_dim + v_heads * v_dim
    return (h * (2 * k_heads * k_dim + 2 * v_heads * v_dim) + h * 2 * v_heads + conv * kernel + 2 * v_heads + v_dim
            + v_heads * v_dim * h)


def routed_expert_layers(spec: ModelSpec, r: ConfigReader) -> int:
    """Decoder layers with routed experts (0 for a dense model): the layers whose unpicked experts a token
    does not read (:meth:`kvplan.modelspec.ModelSpec.parameters_read`)."""
    if not spec.num_experts or not spec.num_experts_per_token or not spec.moe_intermediate_size:
        return 0
    pattern = r.raw("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) == spec.num_layers_decoder:
        return pattern.count("E")
    model_type = r.str("model_type", "") or ""
    return sum(1 for i in range(spec.num_layers_decoder) if _moe_layer(r, i, spec.num_layers_decoder, model_type))


def parameter_count(spec: ModelSpec, r: ConfigReader) -> int | None:
    """Total parameters from the weight facts, else computed from the config (dense or MoE).

    Counted: embeddings (+ an untied LM head), each layer's attention or mixer (MLA projections, Mamba /
    gated-delta-net mixers), its MLP (dense, or routed experts x 3 x hidden x expert size + router +
    shared experts), norms. Not counted: biases, multi-token-prediction layers, vision towers.
    """
    w = spec.weights
    if w is not None and w.parameters:
        return w.parameters
    if w is not None and w.params_by_dtype:
        return sum(w.params_by_dtype.values())
    if not spec.vocab_size:
        return None
    h = spec.hidden_size
    model_type = r.str("model_type", "") or ""
    gated = model_type not in _UNGATED_MLP_TYPES
    dense_mlp = (3 if gated else 2) * h * spec.intermediate_size
    n_shared = r.int("n_shared_experts", ("n_shared_experts", "num_shared_experts"), required=False, minimum=0) or 0
    shared_inter = r.int("shared_expert_intermediate_size", ("shared_expert_intermediate_size",), required=False,
                         minimum=0) or 0
    if model_type.startswith("llama4"):
        dense_mlp = 3 * h * (r.int("intermediate_size_mlp", ("intermediate_size_mlp",), required=False)
                             or spec.intermediate_size)
        n_shared = max(n_shared, 1)
    expert = 3 * h * spec.moe_intermediate_size
    moe_mlp = spec.num_experts * expert + h * spec.num_experts + n_shared * expert
    if shared_inter:
        moe_mlp += 3 * h * shared_inter + h  # Qwen-MoE shared expert and its gate
    total = 0
    mixers = [_attention_params(r, spec, layer) for layer in spec.layers]
    total += sum(mixers)
    pattern = r.raw("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) == spec.num_layers_decoder:
        # Nemotron-H: each block is one norm + one sublayer; only '-' (squared-ReLU MLP) and 'E' (MoE) have an MLP
        return total + sum({"-": 2 * h * spec.intermediate_size, "E": moe_mlp}.get(c, 0) + h for c in pattern) + (
            spec.vocab_size * h * (1 if r.bool("tie_word_embeddings", default=False) else 2) + h)
    for i in range(spec.num_layers_decoder):
        moe = spec.num_experts and _moe_layer(r, i, spec.num_layers_decoder, model_type)
        total += moe_mlp if moe else dense_mlp
        total += 2 * h
    embed = spec.vocab_size * h
    tied = r.bool("tie_word_embeddings", default=model_type in TIED_BY_DEFAULT)
    if model_type in _LEARNED_POSITIONS and spec.max_position_embeddings:
        embed += spec.max_position_embeddings * h
    return total + embed * (1 if tied else 2) + h
