"""Config -> ModelSpec, per architecture, with hand-derived numbers (kvplan's own fixture configs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan import memory
from kvplan.errors import ConfigError, KvplanError
from kvplan.model.sources import load_bundled
from kvplan.model.spec import LayerKind, Overrides, spec_from_config
from kvplan.units import parse_dtype

FIXTURES = Path(__file__).parents[1] / "fixtures" / "configs"
BF16 = parse_dtype("bf16")


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def spec_of(config: dict, overrides: Overrides = Overrides()):
    return spec_from_config(config, model_id="test/model", where="config.json", overrides=overrides)


def kinds(spec) -> list[str]:
    return [x.kind.value for x in spec.layers]


# --- full attention -------------------------------------------------------------------------------


def test_mha_head_dim_from_hidden():
    # 32 layers x 2 (K, V) x 32 heads x (4096 / 32 = 128) x 2 B = 524,288 B per token
    spec = spec_of({"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096, "vocab_size": 32000})
    assert spec.kind_summary == "mha"
    assert memory.kv_bytes_per_token(spec, BF16) == 524_288
    assert spec.provenance["head_dim"].startswith("hidden_size // num_attention_heads")


def test_mqa_multi_query_is_one_kv_head():
    # falcon-style multi_query: 32 layers x 2 x 1 head x (1024 / 16 = 64) x 2 B = 8,192 B per token
    spec = spec_of(load("falcon_mqa.json"))
    assert spec.kind_summary == "mqa"
    assert memory.kv_bytes_per_token(spec, BF16) == 8_192


def test_fp8_kv_halves_token_bytes():
    spec = spec_of(load("mistral_v01.json"))
    assert memory.kv_bytes_per_token(spec, parse_dtype("fp8")) * 2 == memory.kv_bytes_per_token(spec, BF16)


# --- sliding windows --------------------------------------------------------------------------------


def test_mistral_v01_every_layer_slides():
    # Mistral v0.1: sliding_window 4096 and no layer pattern -> all 32 layers sliding(4096), 8 x 128
    spec = spec_of(load("mistral_v01.json"))
    assert set(kinds(spec)) == {"sliding"} and spec.kind_summary == "sliding"
    assert {x.window_tokens for x in spec.layers} == {4096}


def test_mistral_window_default_and_explicit_null():
    base = load("mistral_v01.json")
    absent = {k: v for k, v in base.items() if k != "sliding_window"}
    assert set(kinds(spec_of(absent))) == {"sliding"}  # MistralConfig's default window is 4096
    assert set(kinds(spec_of({**base, "sliding_window": None}))) == {"full"}  # v0.2/v0.3: null = off


def test_gemma2_alternates_even_layers_sliding():
    # Gemma 2 9B: 42 layers, even layers sliding(4096), odd global; 16 heads, 8 KV heads x 256.
    # Global layers: 21 x 2 x 8 x 256 x 2 B = 172,032 B per token; all 42 layers: 344,064
    spec = spec_of(load("gemma2_9b.json"))
    assert kinds(spec)[:3] == ["sliding", "full", "sliding"]
    full = [x for x in spec.layers if x.kind is LayerKind.FULL]
    assert len(full) == 21 and memory.kv_bytes_per_token(tuple(full), BF16) == 172_032
    assert memory.kv_bytes_per_token(spec, BF16) == 344_064


def test_gemma3_text_defaults_fill_missing_keys():
    # gemma3_text with only layers/hidden/heads: KV heads 4, head_dim 256, window 4096, every 6th layer global
    spec = spec_of(load("gemma3_text.json"))
    assert [i for i, k in enumerate(kinds(spec)) if k == "full"] == [5, 11, 17, 23, 29]
    assert {(x.kv_heads, x.head_dim, x.window_tokens) for x in spec.layers if x.kind is LayerKind.SLIDING} == {(4, 256, 4096)}


def test_gemma3_nested_text_config_without_model_type():
    nested = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "torch_dtype": "bfloat16",
              "text_config": {"num_hidden_layers": 12, "hidden_size": 2560, "num_attention_heads": 8},
              "vision_config": {"hidden_size": 1152}}
    spec = spec_of(nested)
    assert kinds(spec).count("full") == 2 and spec.layers[0].head_dim == 256
    assert any("multimodal" in note for note in spec.notes)


def test_gpt_oss_alternates_from_model_type():
    # gpt-oss-20b without layer_types: even layers sliding(128), odd full, 8 KV heads x 64
    spec = spec_of(load("gpt_oss_20b.json"))
    assert kinds(spec)[:2] == ["sliding", "full"] and kinds(spec).count("full") == 12
    assert {x.window_tokens for x in spec.layers if x.window_tokens} == {128}


@pytest.mark.parametrize("pattern, expected", [("LLLG", ["sliding"] * 3 + ["full"]), (2, ["sliding", "full"] * 2)])
def test_sliding_window_pattern_string_and_period(pattern, expected):
    spec = spec_of({"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 1024, "sliding_window": 512,
                    "sliding_window_pattern": pattern})
    assert kinds(spec) == expected


def test_qwen2_use_sliding_window_and_max_window_layers():
    base = {"model_type": "qwen2", "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
            "hidden_size": 1024, "sliding_window": 4096, "max_window_layers": 2}
    assert kinds(spec_of({**base, "use_sliding_window": False})) == ["full"] * 4
    assert kinds(spec_of({**base, "use_sliding_window": True})) == ["full", "full", "sliding", "sliding"]


def test_sliding_window_zero_means_off():
    spec = spec_of({"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 1024, "sliding_window": 0})
    assert kinds(spec) == ["full", "full"]


# --- chunked local attention -----------------------------------------------------------------------


def test_llama4_chunked_layers_keep_the_chunk_bound():
    # Llama 4 text: no_rope_layer_interval 4 -> layers 3, 7 global (NoPE), the rest chunked(8192).
    # vLLM 0.32 (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults to 1) groups 2 full + 6 chunked:
    # group size 2, 1 full + 3 chunked groups. At 16,384 tokens, 4,096 batched, bs 128:
    # full ceil(16384 / 128) = 128; chunked ceil(min(8192 + 4096, 16384) / 128) = 96 each -> 128 + 3 x 96 = 416
    spec = spec_of(load("llama4_text.json"))
    assert kinds(spec) == ["chunked"] * 3 + ["full"] + ["chunked"] * 3 + ["full"]
    layout = memory.pool_layout(spec.layers, 128, BF16, BF16)
    assert layout.group_size == 2 and len(layout.groups) == 4
    assert memory.Demand(layout, 4096).blocks(16384) == 416
    assert any("chunked" in note for note in spec.notes)


# --- MLA ---------------------------------------------------------------------------------------------


def test_deepseek_v3_mla_bytes_and_parameters():
    # 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 B = 70,272 B per token, no K/V doubling
    spec = spec_of(load("deepseek_v3.json"))
    assert spec.kind_summary == "mla"
    assert memory.kv_bytes_per_token(spec, BF16) == 70_272
    # replicated across tp: every rank holds all 576 elements
    assert memory.kv_bytes_per_token(memory.rank_layers(spec, tp=8), BF16) == 70_272
    # 671B published (main model, MTP module excluded)
    assert abs(spec.parameters / 671e9 - 1) < 0.005
    assert any("MTP" in note for note in spec.notes)


# --- hybrids -----------------------------------------------------------------------------------------


def test_jamba_mamba1_state():
    # attn_layer_period 8, offset 4 -> layers 4, 12, 20, 28 attention; 28 Mamba1 layers.
    # inner = mamba_expand 2 x 4096 = 8192: conv (4 - 1) x 8192 = 24,576; ssm 8192 x 16 = 131,072 elements
    spec = spec_of(load("jamba.json"))
    assert [i for i, k in enumerate(kinds(spec)) if k == "full"] == [4, 12, 20, 28]
    state = {(x.conv_elements, x.ssm_elements, x.state_kind) for x in spec.layers if x.is_state}
    assert state == {(24_576, 131_072, "mamba1")}
    # bf16: (24,576 + 131,072) x 2 B = 311,296 B per layer per request
    assert memory.state_bytes_per_request(spec, BF16) == 28 * 311_296
    assert spec.kind_summary == "hybrid"
    assert abs(spec.parameters / 51_570_323_328 - 1) < 0.001  # the bundled Jamba-1.5-Mini count


def test_qwen3_next_gated_delta_net_fixture():
    # 8 layers, full_attention_interval 4 -> layers 3, 7 full. conv (4 - 1) x (2 x 4 x 64 + 8 x 64) = 3,072;
    # ssm 8 value heads x 64 x 64 = 32,768 elements
    spec = spec_of(load("qwen3_next.json"))
    assert kinds(spec) == ["linear_attention"] * 3 + ["full"] + ["linear_attention"] * 3 + ["full"]
    assert {(x.conv_elements, x.ssm_elements) for x in spec.layers if x.is_state} == {(3_072, 32_768)}


def test_nemotron_h_pattern_and_float32_ssm():
    # "M-M*-M*-": M mamba2, * attention, - MLP only (caches nothing); SSM cache float32 by default.
    # conv (4 - 1) x (128 x 64 + 2 x 8 x 128) = 3 x 10,240 = 30,720; ssm 128 x 64 x 128 = 1,048,576
    spec = spec_of(load("nemotron_h.json"))
    assert kinds(spec) == ["mamba", "none", "mamba", "full", "none", "mamba", "full", "none"]
    states = [x for x in spec.layers if x.is_state]
    assert {(x.conv_elements, x.ssm_elements, x.ssm_dtype) for x in states} == {(30_720, 1_048_576, "float32")}
    # bytes: conv in bf16 (61,440) + ssm in float32 (4,194,304) = 4,255,744 per layer
    assert memory.layer_state_bytes(states[0], BF16) == 4_255_744
    explicit = spec_of({**load("nemotron_h.json"), "mamba_ssm_cache_dtype": "bfloat16"})
    assert {x.ssm_dtype for x in explicit.layers if x.is_state} == {"bfloat16"}


def test_granite4_layer_types_mamba2():
    # inner = mamba_expand 2 x 512 = 1024: conv 3 x (1024 + 2 x 1 x 128) = 3,840; ssm 16 x 64 x 128 = 131,072
    spec = spec_of(load("granite_hybrid.json"))
    assert kinds(spec).count("mamba") == 6 and kinds(spec).count("full") == 2
    assert {(x.conv_elements, x.ssm_elements) for x in spec.layers if x.is_state} == {(3_840, 131_072)}


def test_falcon_h1_holds_attention_and_mamba_in_every_layer():
    # conv 3 x (mamba_d_ssm 1536 + 2 x 1 x 128) = 5,376; ssm 24 x 64 x 128 = 196,608
    spec = spec_of(load("falcon_h1.json"))
    assert spec.num_layers_decoder == 4 and spec.num_layers == 8
    assert kinds(spec) == ["full", "mamba"] * 4
    assert {(x.conv_elements, x.ssm_elements) for x in spec.layers if x.is_state} == {(5_376, 196_608)}


def test_nemotron_nas_no_op_layers_and_per_layer_heads():
    # 64 heads; n_heads_in_group 8 -> 8 KV heads, 16 -> 4 KV heads; layer 1 is a no-op.
    # head_dim 8192 / 64 = 128: (8 + 4 + 8) x 2 x 128 x 2 B = 10,240 B per token
    spec = spec_of(load("nemotron_nas.json"))
    assert [(x.kind.value, x.kv_heads) for x in spec.layers] == [("full", 8), ("none", 0), ("full", 4), ("full", 8)]
    assert memory.kv_bytes_per_token(spec, BF16) == 10_240
    # one group (same token slots), a block costs the sum of the three pages: 128 x 10,240 B
    layout = memory.pool_layout(spec.layers, 128, BF16, BF16)
    assert len(layout.groups) == 1 and layout.block_bytes == 128 * 10_240


# --- parameters ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_id, tolerance", [
    ("Qwen/Qwen3-30B-A3B", 0.001), ("Qwen/Qwen3-235B-A22B", 0.001), ("Qwen/Qwen3-8B", 0.001),
    ("mistralai/Mixtral-8x7B-v0.1", 0.001), ("meta-llama/Llama-3.1-8B", 0.001), ("meta-llama/Llama-2-7b-hf", 0.001),
    ("openai/gpt-oss-20b", 0.001), ("openai/gpt-oss-120b", 0.002), ("ai21labs/AI21-Jamba-1.5-Mini", 0.001),
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", 0.002), ("deepseek-ai/DeepSeek-V2-Lite-Chat", 0.01),
    ("openai-community/gpt2", 0.01), ("tiiuae/falcon-7b", 0.01),
])
def test_parameter_count_from_config_matches_published(model_id, tolerance):
    source = load_bundled(model_id)
    published = source.weights.parameters
    computed = spec_from_config(source.config, model_id=model_id, where="bundled").parameters
    assert abs(computed / published - 1) < tolerance, (computed, published)


def test_notes_that_speak_of_one_engine_speak_of_both():
    # A spec's notes are printed under either engine's plan: one that says what vLLM does with these layers
    # (the chunked-attention bound) must say what SGLang does too, or an SGLang plan reads vLLM's rule as its own.
    specs = [spec_of(load(p.name)) for p in sorted(FIXTURES.glob("*.json"))]
    specs += [spec_from_config(load_bundled(m).config, model_id=m, where="bundled")
              for m in ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "deepseek-ai/DeepSeek-R1",
                        "Qwen/Qwen2.5-VL-7B-Instruct", "google/gemma-3-27b-it")]
    one_sided = [n for s in specs for n in s.notes if ("vLLM" in n) != ("SGLang" in n)]
    assert any("chunked" in n for s in specs for n in s.notes)  # the class is exercised
    assert one_sided == []


def test_qwen3_30b_a3b_is_30_5b():
    source = load_bundled("Qwen/Qwen3-30B-A3B")
    assert round(spec_from_config(source.config, model_id="q", where="b").parameters / 1e9, 1) == 30.5


# --- errors ------------------------------------------------------------------------------------------


def test_unknown_config_names_missing_keys_and_overrides():
    with pytest.raises(ConfigError) as err:
        spec_of({"model_type": "mystery", "hidden_size": 1024})
    assert "num_layers" in str(err.value) and "num_hidden_layers" in str(err.value)
    assert "--layers" in (err.value.hint or "")


def test_overrides_describe_an_unknown_config():
    spec = spec_of({"model_type": "mystery"}, Overrides(num_layers=4, kv_heads=2, head_dim=64))
    # 4 x 2 x 2 x 64 x 2 B = 2,048 B per token
    assert memory.kv_bytes_per_token(spec, BF16) == 2_048


def test_encoder_decoder_refused():
    with pytest.raises(ConfigError, match="encoder-decoder"):
        spec_of({"model_type": "t5", "num_layers": 24, "num_heads": 16, "d_model": 1024})


@pytest.mark.parametrize("patch, field", [
    ({"num_hidden_layers": -1}, "num_hidden_layers"), ({"num_hidden_layers": 1.5}, "num_hidden_layers"),
    ({"num_key_value_heads": 64}, "num_key_value_heads"), ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"torch_dtype": "int3"}, "torch_dtype"), ({"sliding_window": "big"}, "sliding_window"),
])
def test_bad_values_name_the_field(patch, field):
    base = {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 1024, "num_key_value_heads": 8}
    with pytest.raises(ConfigError, match=field):
        spec_of({**base, **patch})


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 2**60) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6) | st.sampled_from(["full_attention", "sliding_attention", "mamba", "linear_attention",
                                              "M*-", "LLG", "bfloat16", "auto"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=8,
)
_KEYS = ["num_hidden_layers", "num_attention_heads", "hidden_size", "num_key_value_heads", "head_dim", "sliding_window",
         "layer_types", "sliding_window_pattern", "use_sliding_window", "max_window_layers", "kv_lora_rank",
         "qk_rope_head_dim", "attention_chunk_size", "no_rope_layers", "hybrid_override_pattern", "attn_layer_period",
         "attn_layer_offset", "mamba_d_state", "mamba_expand", "mamba_d_conv", "linear_num_value_heads",
         "full_attention_interval", "block_configs", "text_config", "model_type", "torch_dtype", "vocab_size",
         "num_experts", "multi_query", "tie_word_embeddings", "mamba_n_heads", "mamba_ssm_cache_dtype"]
_GOOD = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512, "num_key_value_heads": 2,
         "vocab_size": 1000}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_KEYS), _json, max_size=6), st.booleans())
def test_malformed_configs_give_a_spec_or_a_kvplan_error(garbage, start_good):
    config = {**(_GOOD if start_good else {}), **garbage}
    try:
        spec = spec_of(config)
    except KvplanError as err:
        assert str(err)
        return
    assert spec.num_layers >= 1
    assert all(math.isfinite(memory.kv_bytes_per_token(spec, BF16)) for _ in [0])


def test_more_heads_than_hidden_units_is_a_config_error_not_a_zero_head_dim():
    # 512 // 513 = 0: a head_dim of 0 would make every page 0 bytes (and the block count a division by zero)
    config = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 513, "num_key_value_heads": 2,
              "hidden_size": 512, "vocab_size": 1000, "torch_dtype": "bfloat16"}
    with pytest.raises(ConfigError, match="num_attention_heads 513 gives a head_dim of 0"):
        spec_from_config(config, model_id="t/m", where="config.json")
    assert spec_from_config({**config, "head_dim": 64}, model_id="t/m", where="config.json").layers[0].head_dim == 64


@pytest.mark.parametrize("top_k, refused", [(8, False), (9, True), (1024, True)])
def test_a_router_cannot_pick_more_experts_than_there_are(top_k, refused):
    """vLLM's and SGLang's top-k router over 8 experts takes k <= 8; a config asking more is refused, naming the file
    and both fields, rather than sizing the fused-MoE workspaces for 1,024 experts per token."""
    config = {**load("mistral_v01.json"), "num_local_experts": 8, "num_experts_per_tok": top_k}
    if not refused:
        assert spec_from_config(config, model_id="t/m", where="config.json").num_experts_per_token == top_k
        return
    with pytest.raises(ConfigError) as err:
        spec_from_config(config, model_id="t/m", where="config.json")
    line = err.value.one_line()
    assert line.startswith("config.json: field num_experts_per_tok = ") and "num_local_experts = 8" in line
