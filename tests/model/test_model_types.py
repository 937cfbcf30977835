"""A missing field takes the default of its model type's transformers config class (kvplan/model/model_types.py).

Each test is a config shape kvplan got wrong or refused before the generated table
(kvplan/data/model_type_defaults.json); the numbers are derived by hand in the comments.
"""

from __future__ import annotations

import pytest

from kvplan import memory
from kvplan.model import model_types
from kvplan.errors import ConfigError
from kvplan.model.spec import LayerKind, spec_from_config
from kvplan.units import parse_dtype

BF16 = parse_dtype("bf16")


def spec_of(config: dict):
    return spec_from_config(config, model_id="test/model", where="config.json")


def kinds(spec) -> str:
    """One letter per layer: F full, S sliding, C chunked, M MLA, state layers s, nothing ``-``."""
    letters = {LayerKind.FULL: "F", LayerKind.SLIDING: "S", LayerKind.CHUNKED: "C", LayerKind.MLA: "M",
               LayerKind.NONE: "-"}
    return "".join(letters.get(layer.kind, "s") for layer in spec.layers)


# --- defect 3: nested text_config takes its model type's defaults ------------------------------------


def test_paligemma_text_config_takes_gemma_head_dim():
    # PaliGemma-3B's text_config (model_type gemma) has no head_dim: GemmaConfig's default is 256, not
    # hidden 2048 / 8 heads = 256... by coincidence equal here, so the kv heads decide: 1 (explicit).
    # 18 layers x 2 (K, V) x 1 KV head x 256 x 2 B = 18,432 B per token (what vLLM uses)
    config = {"model_type": "paligemma", "architectures": ["PaliGemmaForConditionalGeneration"],
              "text_config": {"model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384,
                              "num_attention_heads": 8, "num_hidden_layers": 18, "num_key_value_heads": 1,
                              "vocab_size": 257216},
              "vision_config": {"model_type": "siglip_vision_model"}}
    spec = spec_of(config)
    assert {layer.head_dim for layer in spec.layers} == {256}
    assert memory.kv_bytes_per_token(spec, BF16) == 18_432
    assert spec.provenance["head_dim"] == "text_config.head_dim (gemma default)"


def test_gemma_head_dim_default_is_not_hidden_over_heads():
    # GemmaConfig: head_dim 256 by default; hidden 3072 / 16 heads would give 192.
    # 28 layers x 2 x 16 KV heads (default = heads) x 256 x 2 B = 458,752 B per token
    spec = spec_of({"model_type": "gemma", "hidden_size": 3072, "num_attention_heads": 16, "num_hidden_layers": 28})
    assert spec.layers[0].head_dim == 256
    assert memory.kv_bytes_per_token(spec, BF16) == 458_752


def test_a_config_with_only_its_model_type_is_the_class_default():
    # GPT2Config(): n_layer 12, n_head 12, n_embd 768 -> 12 x 2 x 12 x 64 x 2 B = 36,864 B per token
    spec = spec_of({"model_type": "gpt2"})
    assert (spec.num_layers, spec.layers[0].kv_heads, spec.layers[0].head_dim) == (12, 12, 64)
    assert memory.kv_bytes_per_token(spec, BF16) == 36_864


def test_attribute_map_aliases_read_under_both_names():
    # gpt2's attribute_map: num_attention_heads -> n_head; a standard name in the file sets the field
    spec = spec_of({"model_type": "gpt2", "n_layer": 24, "n_embd": 1024, "num_attention_heads": 16})
    assert (spec.num_layers, spec.layers[0].kv_heads, spec.layers[0].head_dim) == (24, 16, 64)


def test_explicit_null_stays_null():
    # MistralConfig's default window is 4096; "sliding_window": null turns it off (every layer full)
    base = {"model_type": "mistral", "num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 8}
    assert kinds(spec_of(base)) == "SSSS"
    assert kinds(spec_of({**base, "sliding_window": None})) == "FFFF"


def test_nested_text_config_without_model_type_takes_the_parent_default():
    # LlavaConfig's text_config defaults to model_type llama: LlamaConfig fills num_key_value_heads = heads
    spec = spec_of({"model_type": "llava", "text_config": {"num_hidden_layers": 2, "hidden_size": 1024,
                                                           "num_attention_heads": 8}})
    assert spec.layers[0].kv_heads == 8 and spec.layers[0].head_dim == 128


def test_dotted_text_config_path():
    # Qwen2.5-Omni keeps its language model under thinker_config.text_config
    config = {"model_type": "qwen2_5_omni", "thinker_config": {"text_config": {
        "model_type": "qwen2_5_omni_text", "num_hidden_layers": 3, "hidden_size": 1024, "num_attention_heads": 8,
        "num_key_value_heads": 2}}}
    spec = spec_of(config)
    assert spec.num_layers == 3 and spec.layers[0].kv_heads == 2
    assert "thinker_config.text_config" in spec.notes[0]


# --- what transformers' classes derive ---------------------------------------------------------------


def test_layer_pattern_without_layer_types_follows_the_class():
    # Cohere2Config derives sliding, sliding, sliding, full (its pattern of 4) when layer_types is absent
    spec = spec_of({"model_type": "cohere2", "num_hidden_layers": 8, "hidden_size": 512, "num_attention_heads": 4})
    assert kinds(spec) == "SSSFSSSF"
    assert model_types.layer_pattern("cohere2", 8) == ["sliding"] * 3 + ["full"] + ["sliding"] * 3 + ["full"]


def test_layer_pattern_with_a_forced_first_layer():
    # MiMo-V2-Flash: layer 0 and every 6th layer full, the rest sliding (window 128 + 1)
    spec = spec_of({"model_type": "mimo_v2_flash", "num_hidden_layers": 8, "hidden_size": 512,
                    "num_attention_heads": 4})
    assert kinds(spec) == "FSSSSFSS"


def test_head_dim_rounds_down_like_transformers_and_vllm():
    # 4096 / 96 heads = 42.67 -> 42 (both engines use floor division when no head_dim is given)
    spec = spec_of({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 4096, "num_attention_heads": 96,
                    "num_key_value_heads": 8})
    assert spec.layers[0].head_dim == 42
    assert "rounded down" in spec.provenance["head_dim"]


def test_layer_count_from_a_pattern_when_no_count_is_given():
    # transformers 5 writes Nemotron-H's layers_block_type and derives num_hidden_layers from its length
    config = {"model_type": "nemotron_h", "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp"],
              "hidden_size": 1024, "mamba_num_heads": 16, "mamba_head_dim": 64, "n_groups": 2, "ssm_state_size": 32}
    spec = spec_of(config)
    assert kinds(spec) == "s-F-"


# --- layers that differ --------------------------------------------------------------------------------


def test_kv_shared_layers_own_no_cache():
    # Gemma 3n: the last num_kv_shared_layers (default 15 of 35) reuse earlier layers' caches
    spec = spec_of({"model_type": "gemma3n_text", "num_hidden_layers": 35})
    assert kinds(spec).endswith("-" * 15) and "-" not in kinds(spec)[:20]


def test_gemma4_global_layers_use_the_global_head_dim():
    # Gemma4TextConfig: 5 sliding : 1 full, the full layers' head_dim is global_head_dim (512 unless given)
    spec = spec_of({"model_type": "gemma4_text", "num_hidden_layers": 6, "hidden_size": 512})
    assert kinds(spec) == "SSSSSF"
    assert [layer.head_dim for layer in spec.layers] == [256] * 5 + [512]
    spec = spec_of({"model_type": "gemma4_text", "num_hidden_layers": 6, "hidden_size": 512, "global_head_dim": 384})
    assert spec.layers[-1].head_dim == 384


def test_per_layer_config_overrides_one_layer():
    # transformers' heterogeneous configs: {"05": {...}} changes layer 5 only
    config = {"model_type": "llama", "num_hidden_layers": 6, "hidden_size": 512, "num_attention_heads": 4,
              "num_key_value_heads": 4, "head_dim": 128,
              "per_layer_config": {"05": {"head_dim": 256, "num_key_value_heads": 2}}}
    spec = spec_of(config)
    assert [(x.kv_heads, x.head_dim) for x in spec.layers] == [(4, 128)] * 5 + [(2, 256)]


def test_longcat_caches_two_attention_sublayers_per_layer():
    # LongCat-Flash: num_layers 2 -> 4 MLA caches of kv_lora_rank 512 + rope 64 = 576 each
    spec = spec_of({"model_type": "longcat_flash", "num_layers": 2})
    assert kinds(spec) == "MMMM" and spec.layers[0].head_dim == 576
    assert spec.num_layers_decoder == 2


# --- refusals, with the reason ----------------------------------------------------------------------------


@pytest.mark.parametrize(("config", "reason"), [
    ({"model_type": "bert"}, "encoder-only"),
    ({"model_type": "t5"}, "encoder-decoder"),
    ({"model_type": "mamba"}, "attention-free recurrent model"),
    ({"model_type": "siglip_vision_model"}, "vision model"),
    ({"model_type": "recurrent_gemma"}, "recurrent (RG-LRU) blocks"),
    ({"model_type": "zamba2", "num_hidden_layers": 2, "layer_types": ["mamba", "hybrid"]},
     "'hybrid' layers: attention and a linear-attention state in one layer"),
    ({"model_type": "minimax"}, "linear-attention layers whose state kvplan cannot size"),
    ({"model_type": "gemma4_unified_assistant", "text_config": {"num_hidden_layers": 6, "num_kv_shared_layers": 6}},
     "keeps a cache of its own"),
])
def test_model_types_kvplan_cannot_plan_say_why(config, reason):
    with pytest.raises(ConfigError, match="config.json: ") as err:
        spec_of(config)
    assert reason in str(err.value)


def test_unknown_model_types_keep_the_generic_parser():
    assert model_types.lookup("RefinedWeb") is None
    spec = spec_of({"model_type": "RefinedWeb", "n_layer": 2, "n_head": 8, "hidden_size": 512, "n_head_kv": 1,
                    "new_decoder_architecture": True})
    assert spec.layers[0].kv_heads == 1


def test_mllama_cross_attention_layers_default_to_the_class_list():
    # MllamaTextConfig: cross_attention_layers [3, 8, ..., 38] when the config leaves them out (40 layers)
    spec = spec_of({"model_type": "mllama_text_model"})
    assert [i for i, x in enumerate(spec.layers) if x.kind is LayerKind.CROSS] == [3, 8, 13, 18, 23, 28, 33, 38]
