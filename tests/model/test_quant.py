"""Quantized checkpoints sized the way they are stored, and multi-token-prediction layers left out.

A config with a ``quantization_config`` and no checkpoint size used to be sized in bf16: DeepSeek-V3 from its
config.json folder was 1,249.9 GiB of weights (0 requests on 8 x H200) against 641 GiB for its checkpoint,
gpt-oss-20b 38.9 GiB against 12.8 GiB. DeepSeek-V3's active parameters were 51.06B with its MTP layer, which
vLLM does not load without speculative decoding (37.6B without it, the published ~37B).
"""

import json
import math
from pathlib import Path

import pytest

from kvplan.model import quant
from kvplan.errors import ConfigError
from kvplan.model.source import WeightFacts
from kvplan.model.params import Tensors
from kvplan.planning.plan import Options, estimate, plan_for_spec
from kvplan.model.sources import load_bundled, load_spec
from kvplan.model.spec import spec_from_config
from entry_point import assert_one_line, kvplan

HUB_CONFIGS = Path(__file__).resolve().parents[3] / "shared" / "hub-configs"
if not HUB_CONFIGS.is_dir():
    HUB_CONFIGS = Path("/work/shared/hub-configs")

# A tiny Llama: hidden 256, 4 heads of 64 (2 KV heads), 2 layers, MLP 512, vocabulary 1,000, untied head.
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 1000,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# per layer, linear weights (out x in): q 256x256, k 128x256, v 128x256, o 256x256, gate/up 512x256, down 256x512
# = 65,536 + 32,768 + 32,768 + 65,536 + 3 x 131,072 = 589,824; 2 layers = 1,179,648
TINY_LINEAR = 1_179_648
# kept in bf16: embeddings 1,000 x 256 + LM head 1,000 x 256 + final norm 256 + 2 layers x 2 norms x 256
TINY_KEPT = 256_000 + 256_000 + 256 + 1_024


def spec_of(config, weights=None):
    return spec_from_config(config, model_id="m", where="config.json", weights=weights)


def with_quant(quantization_config, **extra):
    return {**TINY, **extra, "quantization_config": quantization_config}


# --- how one weight is stored ----------------------------------------------------------------------


W = Tensors("model.layers.0.mlp.down_proj", "mlp", 256, 512, linear=True)  # 131,072 weights, 256 rows of 512 inputs


@pytest.mark.parametrize("config, expected", [
    # fp8 with 128x128 block scales: 131,072 fp8 + ceil(256/128) x ceil(512/128) = 8 float32 scales
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, {"F8_E4M3": 131_072, "F32": 8}),
    # per-tensor fp8, static activations: one weight scale and one input scale
    ({"quant_method": "fp8", "activation_scheme": "static"}, {"F8_E4M3": 131_072, "F32": 2}),
    # GPTQ 4-bit, group 128: 131,072 x 4 / 32 = 16,384 int32 of weights; 256 rows x 4 groups = 1,024 fp16 scales and
    # 1,024 x 4 / 32 = 128 int32 of zero points; g_idx: 512 int32
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, {"I32": 16_384 + 128 + 512, "F16": 1_024}),
    # GPTQ 8-bit, one group per row (group_size -1): 32,768 int32; 256 scales, 256 x 8 / 32 = 64 zeros; g_idx 512
    ({"quant_method": "gptq", "bits": 8, "group_size": -1}, {"I32": 32_768 + 64 + 512, "F16": 256}),
    # AWQ 4-bit, group 128, zero points: no g_idx
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, {"I32": 16_384 + 128, "F16": 1_024}),
    # bitsandbytes nf4 with double quantization: 65,536 bytes of packed weights + one 8-bit absmax per 64 weights
    # (2,048) + one float32 per 256 absmax (8)
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
      "bnb_4bit_use_double_quant": True}, {"U8": 65_536 + 2_048, "F32": 8}),
    # bitsandbytes 8-bit: int8 + one float32 per output row
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, {"I8": 131_072, "F32": 256}),
    # compressed-tensors W4A16, group 128, symmetric, packed: 16,384 int32, 1,024 scales in the model dtype, the shape
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                                           "symmetric": True}}}}, {"I32": 16_384, "BF16": 1_024, "I64": 2}),
    # compressed-tensors NVFP4: 65,536 bytes + one fp8 scale per 16 weights (8,192) + 2 float32 global scales
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                           "group_size": 16}}}}, {"U8": 65_536, "F8_E4M3": 8_192, "F32": 2}),
    # compressed-tensors fp8 per channel: one scale per output row, in the model dtype
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}},
     {"F8_E4M3": 131_072, "BF16": 256}),
])
def test_one_weight_is_stored_as_the_method_says(config, expected):
    q = quant.read({"quantization_config": config}, "config.json", "BF16")
    assert q is not None and q.rules
    assert dict(q.rules[0].storage.elements(W)) == expected


def test_mxfp4_stores_experts_in_4_bits_with_a_byte_per_32():
    experts = Tensors("model.layers.0.mlp.experts.0.down_proj", "experts", 256, 512, count=4, linear=True)
    q = quant.read({"quantization_config": {"quant_method": "mxfp4"}}, "config.json", "BF16")
    # 4 experts x (131,072 / 2 bytes of blocks + 131,072 / 32 scales) = 4 x (65,536 + 4,096)
    assert dict(q.storage(experts).elements(experts)) == {"U8": 4 * (65_536 + 4_096)}
    assert q.storage(W) is None  # attention, dense MLPs, router, embeddings: bf16


# --- which modules are quantized ---------------------------------------------------------------------


@pytest.mark.parametrize("module, pattern, expected", [
    ("model.layers.3.mlp.gate", "model.layers.*.mlp.router", True),  # gpt-oss spells the router 'router'
    ("model.layers.3.mlp.gate", "mlp.gate", True),
    ("model.layers.3.mlp.gate_proj", "mlp.gate", False),  # whole segments, not substrings
    ("model.layers.3.mlp.experts.0.gate_proj", "re:.*mlp.gate$", False),
    ("model.layers.3.mlp.gate", "re:.*mlp.gate$", True),
    ("model.layers.0.mlp.gate", "model.layers.0.block_sparse_moe.gate", True),  # Mixtral's names
    ("model.layers.10.mlp.down_proj", "model.layers.1", False),
    ("model.layers.1.mlp.down_proj", "model.layers.1", True),
    ("lm_head", "lm_head", True),
    ("model.layers.5.self_attn.q_proj", "model.layers.*.self_attn", True),
])
def test_ignore_patterns_name_modules(module, pattern, expected):
    assert quant.matches(module, pattern) is expected


# --- a whole model, by hand ----------------------------------------------------------------------------


def test_fp8_block_quantized_config_is_sized_as_stored():
    spec = spec_of(with_quant({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}))
    # scales per layer: q 2x2 + k 1x2 + v 1x2 + o 2x2 + gate 4x2 + up 4x2 + down 2x4 = 36; 2 layers = 72 float32
    assert dict(spec.weights.params_by_dtype) == {"F8_E4M3": TINY_LINEAR, "F32": 72, "BF16": TINY_KEPT}
    assert spec.weights.total_bytes == TINY_LINEAR + 72 * 4 + TINY_KEPT * 2 == 2_206_496
    assert spec.parameters == TINY_LINEAR + TINY_KEPT
    assert any("quant_method fp8" in n and "128x128 block" in n and "--weights-gib" in n for n in spec.notes)


def test_modules_to_not_convert_stay_in_the_model_dtype():
    spec = spec_of(with_quant({"quant_method": "fp8", "weight_block_size": [128, 128],
                               "modules_to_not_convert": ["model.layers.1.mlp"]}))
    # layer 1's MLP (3 x 131,072 weights, 24 scales) stays bf16
    assert dict(spec.weights.params_by_dtype) == {"F8_E4M3": TINY_LINEAR - 393_216, "F32": 72 - 24,
                                                  "BF16": TINY_KEPT + 393_216}


def test_compressed_tensors_targets_linear_and_honours_ignore():
    group = {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}
    quantized = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": group}}
    # "Linear" targets the LM head too unless the config ignores it (llm-compressor's recipes do)
    every = spec_of(with_quant(quantized)).weights.params_by_dtype
    assert every["F8_E4M3"] == TINY_LINEAR + 256_000
    kept_head = spec_of(with_quant({**quantized, "ignore": ["re:.*lm_head"]})).weights.params_by_dtype
    assert kept_head["F8_E4M3"] == TINY_LINEAR and kept_head["BF16"] == TINY_KEPT + 14  # + 14 per-tensor scales


def test_a_checkpoint_size_wins_over_the_estimate():
    facts = WeightFacts(total_bytes=3_000_000, source="model.safetensors.index.json metadata.total_size")
    spec = spec_of(with_quant({"quant_method": "fp8", "weight_block_size": [128, 128]}), facts)
    assert spec.weights == facts
    assert not any("estimated" in n for n in spec.notes)


def test_an_unmodelled_method_is_sized_unquantized_with_a_note(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(with_quant({"quant_method": "hqq", "nbits": 4})))
    p = estimate(Options(model=str(tmp_path), gpu="H100"))
    assert p.spec.weights is None
    assert p.weights_total_bytes == (TINY_LINEAR + TINY_KEPT) * 2  # parameters x bf16
    note = next(n for n in p.notes if "'hqq' is not modelled" in n)
    assert "unquantized" in note and "--weights-gib" in note and "--weights-dtype" in note


def test_kv_cache_scheme_leaves_the_kv_cache_in_the_model_dtype(tmp_path):
    config = with_quant({"quant_method": "compressed-tensors", "format": "float-quantized",
                         "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}},
                         "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}})
    (tmp_path / "config.json").write_text(json.dumps(config))
    p = estimate(Options(model=str(tmp_path), gpu="H100"))
    assert p.kv_dtype == "bfloat16"  # vLLM reads kv_cache_scheme only under --kv-cache-dtype fp8
    assert any("kv_cache_scheme" in n and "--kv-dtype fp8" in n for n in p.notes)


@pytest.mark.parametrize("qc, field", [
    ("fp8", "quantization_config"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "quantization_config.weight_block_size"),
    ({"quant_method": "gptq", "bits": "four"}, "quantization_config.bits"),
    ({"quant_method": "awq", "modules_to_not_convert": ["re:(unclosed"]}, "quantization_config.modules_to_not_convert"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"strategy": "diagonal"}}}},
     "quantization_config.config_groups.g.weights.strategy"),
])
def test_a_malformed_quantization_config_names_the_field(tmp_path, qc, field):
    with pytest.raises(ConfigError, match=f"field {field}"):
        spec_of(with_quant(qc))
    (tmp_path / "config.json").write_text(json.dumps(with_quant(qc)))
    assert_one_line(kvplan("estimate", str(tmp_path), "--gpu", "H100"), field)


# --- real checkpoints: the estimate reproduces their sizes, dtype by dtype ---------------------------------


@pytest.mark.parametrize("model_id", ["deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1"])
def test_the_estimate_plus_the_mtp_layers_is_the_checkpoint(model_id):
    source = load_bundled(model_id)  # weight facts: the checkpoint's own per-dtype element counts
    with_facts = spec_of(source.config, source.weights)
    estimated = spec_of(source.config)  # the same config without facts, as from a local folder
    mtp = source.weights.total_bytes - with_facts.weights.total_bytes  # what the engine does not load
    assert estimated.weights.total_bytes + mtp == source.weights.total_bytes == 688_574_839_360
    assert dict(estimated.weights.params_by_dtype) == dict(with_facts.weights.params_by_dtype)


@pytest.mark.parametrize("model_id, stored", [("openai/gpt-oss-20b", 13_761_264_768),
                                              ("openai/gpt-oss-120b", 65_248_815_744)])
def test_the_estimate_loads_like_the_checkpoint(model_id, stored):
    # gpt-oss' config has no torch_dtype: vLLM reads float32 and runs bf16, so the estimate keeps the unquantized
    # tensors in float32 and the plan loads them as bf16, like the checkpoint's own bf16 tensors
    source = load_bundled(model_id)
    options = Options(model=model_id, gpu="H200")
    loaded = plan_for_spec(spec_of(source.config), options, "config.json").weights_total_bytes
    assert loaded == plan_for_spec(spec_of(source.config, source.weights), options, "b").weights_total_bytes == stored


def test_deepseek_v3_leaves_its_mtp_layer_out_of_weights_and_active_parameters():
    spec, _ = load_spec("deepseek-ai/DeepSeek-V3", offline=True)
    # The MTP layer (model.layers.61), as the checkpoint stores it:
    #   fp8: MLA 1536x7168 + 24576x1536 + 576x7168 + 32768x512 + 7168x16384 = 187,105,280
    #        + 256 experts x 3 x 2048x7168 = 11,274,289,152 + the shared expert 3 x 2048x7168 = 44,040,192
    #   float32 scales, one per 128x128 block: MLA 672 + 2,304 + 280 + 1,024 + 7,168 = 11,448;
    #        experts 256 x 3 x 16 x 56 = 688,128; shared 2,688; + e_score_correction_bias 256  -> 702,520 x 4 B
    #   bf16: router 256x7168, norms 1536 + 512 + 2 x 7168 + 3 x 7168 (enorm, hnorm, shared_head.norm),
    #        its own embed_tokens and shared_head.head 2 x 129280x7168, eh_proj 7168x14336 -> 1,957,991,424 x 2 B
    mtp_bytes = 11_505_434_624 + 702_520 * 4 + 1_957_991_424 * 2
    assert mtp_bytes == 15_424_227_552
    assert spec.weights.total_bytes == 688_574_839_360 - mtp_bytes
    # 13,463,426,304 MTP parameters out of the Hub's 684,531,386,000
    assert spec.parameters == 684_531_386_000 - 13_463_426_304
    # active: before, 51.06B (the MTP layer's 256 experts and its embedding and head counted); published ~37B
    assert 37.5e9 < spec.parameters_read(1) < 37.7e9
    assert any("num_nextn_predict_layers = 1" in n and "active parameters" in n for n in spec.notes)


@pytest.mark.parametrize("model_id, active_b", [("moonshotai/Kimi-K2-Instruct", 32.9), ("Qwen/Qwen3-235B-A22B", 22.2),
                                                ("mistralai/Mixtral-8x7B-v0.1", 12.9)])
def test_active_parameters_without_mtp_layers_are_unchanged(model_id, active_b):
    spec, _ = load_spec(model_id, offline=True)
    assert round(spec.parameters_read(1) / 1e9, 1) == active_b


def test_the_weights_term_excludes_the_mtp_layer():
    from kvplan.engines.vllm_weights import loaded_extra_bytes

    p = estimate(Options(model="deepseek-ai/DeepSeek-V3", gpu="H200", tp=8))
    assert p.weights_total_bytes == 673_150_611_808  # 688,574,839,360 - 15,424,227,552
    # the checkpoint's split plus what vLLM's load keeps for MLA (replicated projections, up-projections)
    extra, why = loaded_extra_bytes(p.spec, 8, 1, (0, 30, 0), (9, 0))
    assert extra > 0 and why in p.budget.weights.source
    # + the rotary table vLLM builds while loading: deepseek_yarn 4,096 x 40 = 163,840 rows x 64 rope dims x 2 B
    assert p.budget.weights.bytes == math.ceil(673_150_611_808 / 8) + extra + 163_840 * 64 * 2
    assert "less the MTP layers' 14.36 GiB (not loaded)" in p.budget.weights.source


# --- the real configs from their folders -----------------------------------------------------------------


@pytest.mark.skipif(not HUB_CONFIGS.is_dir(), reason="needs the shared hub-configs folder")
@pytest.mark.parametrize("model_id", ["deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1", "openai/gpt-oss-20b",
                                      "openai/gpt-oss-120b"])
def test_a_quantized_config_folder_plans_like_its_bundled_spec(model_id):
    # before: DeepSeek-V3's folder gave 1,249.9 GiB of weights and 0 requests on 8 x H200, gpt-oss-20b 38.9 GiB
    local = estimate(Options(model=str(HUB_CONFIGS / model_id), gpu="H200", tp=8))
    bundled = estimate(Options(model=model_id, gpu="H200", tp=8))
    assert local.weights_total_bytes == bundled.weights_total_bytes
    assert local.answer.max_concurrency == bundled.answer.max_concurrency > 0
    assert local.budget.weights.source.startswith("checkpoint: estimated from quantization_config")


# --- the stored format is what a plan says its weights are ----------------------------------------


@pytest.mark.parametrize("config, fmt", [
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8_e4m3"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "fp8_e5m2"),
    ({"quant_method": "mxfp4"}, "mxfp4"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "int4"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "int4"),
    ({"quant_method": "gptq", "bits": 8, "group_size": -1}, "int8"),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "int8"),
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                           "group_size": 16}}}}, "nvfp4"),
    ({"quant_algo": "FP8"}, "fp8_e4m3"),
])
def test_a_quantized_config_plans_its_weights_in_the_stored_format(config, fmt):
    """A quantized checkpoint's plan reports the format its weights are stored in (never the model dtype) in the
    plan, the JSON assumptions and a report row's column, and re-planning with that column plans the same weights."""
    spec = spec_of(with_quant(config))
    assert spec.weights_format == fmt
    plan = plan_for_spec(spec, Options(model="m", gpu="H100"), suggest=False)
    assert plan.weights_dtype == fmt and plan.to_dict()["assumptions"]["weights_dtype"] == fmt
    again = plan_for_spec(spec, Options(model="m", gpu="H100", weights_dtype=plan.option_values["weights_dtype"]),
                          suggest=False)
    assert again.weights_total_bytes == plan.weights_total_bytes and again.weights_dtype == fmt


def test_bundled_quantized_checkpoints_report_their_format_and_replan_to_the_same_weights():
    """Every bundled quantized checkpoint (DeepSeek-R1 / V3: fp8_e4m3, gpt-oss: mxfp4) on both engines: the plan's
    weights dtype is the stored format, a report row re-planned from its own columns has the same weights, and no
    note calls the checkpoint float32."""
    from kvplan.model.sources import bundled_ids
    from kvplan.model.spec import build_spec
    from kvplan.options import options_from_values

    seen = {}
    for model_id in bundled_ids():
        spec = build_spec(load_bundled(model_id))
        if not spec.quant_method:
            continue
        for engine in ("vllm", "sglang"):
            plan = plan_for_spec(spec, Options(model=model_id, gpu="H200", tp=8, engine=engine), suggest=False)
            assert plan.weights_dtype == spec.weights_format != plan.model_dtype, (model_id, engine)
            again = plan_for_spec(spec, options_from_values(plan.option_values), suggest=False)
            assert again.weights_total_bytes == plan.weights_total_bytes, (model_id, engine)
            assert not any("float32 checkpoint" in n for n in plan.notes), plan.notes
            seen[model_id] = plan.weights_dtype
    assert seen["deepseek-ai/DeepSeek-R1"] == "fp8_e4m3" and seen["openai/gpt-oss-120b"] == "mxfp4"


def test_gpt_oss_is_named_by_what_its_checkpoint_stores():
    """gpt-oss' config names no torch_dtype (float32 by default) but its checkpoint holds MXFP4 experts and bfloat16
    tensors: the note says so, and both engines run it in bfloat16."""
    for engine in ("vllm", "sglang"):
        plan = estimate(Options(model="openai/gpt-oss-120b", gpu="H100", engine=engine))
        assert plan.model_dtype == "bfloat16", engine
        note = next(n for n in plan.notes if n.startswith("dtype auto"))
        assert "mxfp4 + bfloat16 checkpoint" in note and "--dtype float32" not in note, note
