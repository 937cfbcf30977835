"""The bundled model specs in ``model_specs/``: they parse, say where their numbers came from, and agree
with the real Hugging Face configs kept as test data in ``/work/shared/hub-configs`` (when present)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kvplan.model.sources import bundled_ids, load_bundled, specs_dir

HUB_CONFIGS = Path("/work/shared/hub-configs")

# Config keys that give the layer count, in the Hub's own spellings (gpt2: n_layer, T5: num_layers).
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# Keys the KV-cache arithmetic reads; a bundled spec must carry the real config's value for each.
KV_KEYS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "sliding_window",
    "layer_types",
    # alias spellings of the same facts in older architectures
    "n_layer",
    "n_head",
    "n_embd",
    "num_layers",
    "num_heads",
    "d_kv",
    "d_model",
    "multi_query",
    "num_kv_heads",
    "use_sliding_window",
    "full_attention_interval",
)
# Bytes per stored element, safetensors dtype names.
DTYPE_BYTES = {"F8_E4M3": 1, "U8": 1, "I8": 1, "BF16": 2, "F16": 2, "F32": 4}

SPEC_PATHS = sorted(specs_dir().glob("*/*.yaml"))
SPEC_IDS = [f"{p.parent.name}/{p.stem}" for p in SPEC_PATHS]


def _raw(model_id: str) -> dict:
    org, name = model_id.split("/")
    return yaml.safe_load((specs_dir() / org / f"{name}.yaml").read_text(encoding="utf-8"))


def _layers(config: dict) -> int | None:
    for scope in (config, config.get("text_config") or {}):
        for key in LAYER_KEYS:
            if isinstance(scope.get(key), int):
                return scope[key]
    return None


def _manifest() -> list[dict]:
    path = HUB_CONFIGS / "MANIFEST.yaml"
    if not path.is_file():
        return []
    return yaml.safe_load(path.read_text(encoding="utf-8"))["models"]


MANIFEST = _manifest()
BUNDLED_LOWER = {i.lower() for i in SPEC_IDS}
MANIFEST_BUNDLED = [m for m in MANIFEST if m["hub_id"].lower() in BUNDLED_LOWER]


def test_at_least_45_specs_with_unique_ids():
    assert len(SPEC_IDS) >= 45
    assert len({i.lower() for i in SPEC_IDS}) == len(SPEC_IDS)
    assert bundled_ids() == sorted(SPEC_IDS)


@pytest.mark.parametrize("model_id", SPEC_IDS)
def test_spec_loads_and_id_matches_path(model_id):
    source = load_bundled(model_id)
    assert source.kind == "bundled"
    assert source.model_id == model_id  # the file's `id` is the Hub repo id spelled as the path
    assert source.location == f"model_specs/{model_id}.yaml"
    raw = _raw(model_id)
    assert isinstance(raw["source"], str) and raw["source"].strip()
    assert set(raw) <= {"id", "source", "notes", "revision", "config", "weights"}


@pytest.mark.parametrize("model_id", SPEC_IDS)
def test_spec_has_layers_and_architecture(model_id):
    config = load_bundled(model_id).config
    layers = _layers(config)
    assert layers is not None and layers > 0
    assert config.get("model_type"), "model_type tells the parser which architecture rules apply"
    # layer_types, where given, lists one entry per layer
    for scope in (config, config.get("text_config") or {}):
        if "layer_types" in scope:
            assert len(scope["layer_types"]) == _layers(scope)


@pytest.mark.parametrize("model_id", SPEC_IDS)
def test_weights_are_sourced_and_plausible(model_id):
    weights = load_bundled(model_id).weights
    assert weights is not None
    assert weights.source.strip()
    assert weights.parameters and weights.total_bytes
    # 0.4 B/param covers 4-bit expert weights (gpt-oss MXFP4: ~0.66); 4.2 covers float32 checkpoints
    assert 0.4 <= weights.total_bytes / weights.parameters <= 4.2
    if weights.params_by_dtype:
        stored = sum(DTYPE_BYTES[d] * n for d, n in weights.params_by_dtype.items())
        assert stored == weights.total_bytes


def test_hand_checked_numbers():
    # Llama-3.1-8B: published index total_size 16,060,522,496 = 8,030,261,248 params x 2 bytes (bf16)
    llama = load_bundled("meta-llama/Llama-3.1-8B")
    assert llama.weights.parameters == 8_030_261_248
    assert llama.weights.total_bytes == 2 * 8_030_261_248
    # 32 layers x 8 kv heads x (4096 / 32 = 128) x 2 (K and V) x 2 bytes = 131,072 bytes per token
    c = llama.config
    assert 32 * c["num_key_value_heads"] * (c["hidden_size"] // c["num_attention_heads"]) * 2 * 2 == 131_072
    # Mistral-7B-v0.1 slides a 4096-token window on every layer: one scalar, no per-layer list
    mistral = load_bundled("mistralai/Mistral-7B-v0.1").config
    assert mistral["sliding_window"] == 4096 and "layer_types" not in mistral
    # DeepSeek-V3 MLA latent: kv_lora_rank 512 + qk_rope_head_dim 64 = 576 elements per token per layer
    ds = load_bundled("deepseek-ai/DeepSeek-V3").config
    assert ds["kv_lora_rank"] + ds["qk_rope_head_dim"] == 576
    # falcon-7b is multi-query (one KV head); falcon-40b has 8 KV groups
    assert load_bundled("tiiuae/falcon-7b").config["multi_query"] is True
    f40 = load_bundled("tiiuae/falcon-40b").config
    assert f40["new_decoder_architecture"] is True and f40["num_kv_heads"] == 8
    # gpt-oss-20b alternates sliding (window 128) and full attention: 12 of each
    oss = load_bundled("openai/gpt-oss-20b").config
    assert oss["layer_types"].count("full_attention") == 12 and oss["sliding_window"] == 128


def test_manifest_is_present_when_hub_configs_exist():
    if not HUB_CONFIGS.is_dir():
        pytest.skip("hub-configs test data not on this machine")
    assert MANIFEST_BUNDLED, "the bundled specs should cover the models in the hub-configs manifest"


@pytest.mark.parametrize("entry", MANIFEST_BUNDLED, ids=[m["hub_id"] for m in MANIFEST_BUNDLED])
def test_kv_fields_equal_the_real_config(entry):
    real = json.loads((HUB_CONFIGS / entry["file"]).read_text(encoding="utf-8"))
    spec = load_bundled(entry["hub_id"]).config
    checked = 0
    for real_scope, spec_scope in ((real, spec), (real.get("text_config"), spec.get("text_config"))):
        if real_scope is None:
            continue
        assert spec_scope is not None, "text_config must stay nested as in the Hub config"
        for key in KV_KEYS:
            if key in real_scope:
                assert key in spec_scope, f"{key} missing"
                assert spec_scope[key] == real_scope[key], key
                checked += 1
    assert checked >= 3


@pytest.mark.parametrize(
    "entry",
    [m for m in MANIFEST_BUNDLED if set(m["kinds"]) <= {"gqa", "mha"}],
    ids=lambda m: m["hub_id"],
)
def test_plain_attention_kv_bytes_match_manifest(entry):
    # Independent hand count in the manifest: 2 (K, V) x layers x kv_heads x head_dim x 2 bytes (bf16)
    c = load_bundled(entry["hub_id"]).config
    layers = c.get("num_hidden_layers", c.get("n_layer"))
    heads = c.get("num_attention_heads", c.get("n_head"))
    kv_heads = c.get("num_key_value_heads", heads)
    head_dim = c.get("head_dim") or c.get("hidden_size", c.get("n_embd")) // heads
    assert 2 * layers * kv_heads * head_dim * 2 == entry["kv_bytes_per_token_bf16"]


def _bundled_spec(model_id: str):
    from kvplan.model.spec import build_spec

    return build_spec(load_bundled(model_id))


def test_hybrid_falcon_h1_7b_hand_checked():
    from kvplan.memory import kv_bytes_per_token, state_bytes_per_request
    from kvplan.units import parse_dtype

    bf16 = parse_dtype("bfloat16")
    spec = _bundled_spec("tiiuae/Falcon-H1-7B-Instruct")
    # parallel hybrid: 44 decoder layers, each with an attention cache and a Mamba2 state
    assert sum(1 for x in spec.layers if x.is_state) == 44
    assert sum(1 for x in spec.layers if x.caches_tokens) == 44
    # KV: 44 layers x 2 KV heads x 128 head_dim x 2 (K, V) x 2 bytes = 45,056 bytes per token
    assert kv_bytes_per_token(spec, bf16) == 44 * 2 * 128 * 2 * 2 == 45_056
    # Mamba2 state, inner = mamba_d_ssm 3072 (not mamba_expand 2 x hidden 3072 = 6144):
    #   conv (4 - 1) x (3072 + 2 x 1 group x 256 state) = 10,752 elements x 2 bytes = 21,504
    #   SSM 24 heads x 128 head_dim x 256 state = 786,432 elements x 2 bytes (model dtype) = 1,572,864
    #   44 layers x (21,504 + 1,572,864) = 70,152,192 bytes per request
    assert state_bytes_per_request(spec, bf16) == 44 * (3 * 3584 * 2 + 24 * 128 * 256 * 2) == 70_152_192


def test_hybrid_nemotron_nano_9b_v2_hand_checked():
    from kvplan.memory import kv_bytes_per_token, state_bytes_per_request
    from kvplan.units import parse_dtype

    bf16 = parse_dtype("bfloat16")
    spec = _bundled_spec("nvidia/NVIDIA-Nemotron-Nano-9B-v2")
    # hybrid_override_pattern: 27 'M' (Mamba2), 4 '*' (attention), 25 '-' (MLP only, no cache)
    pattern = load_bundled("nvidia/NVIDIA-Nemotron-Nano-9B-v2").config["hybrid_override_pattern"]
    assert (pattern.count("M"), pattern.count("*"), pattern.count("-")) == (27, 4, 25)
    assert sum(1 for x in spec.layers if x.is_state) == 27
    assert sum(1 for x in spec.layers if x.caches_tokens) == 4
    # KV: 4 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 16,384 bytes per token
    assert kv_bytes_per_token(spec, bf16) == 4 * 8 * 128 * 2 * 2 == 16_384
    # Mamba2 state, inner = mamba_num_heads 128 x mamba_head_dim 80 = 10,240:
    #   conv (4 - 1) x (10,240 + 2 x 8 groups x 128 state) = 36,864 elements x 2 bytes = 73,728
    #   SSM 128 x 80 x 128 = 1,310,720 elements x 4 bytes (NemotronH keeps it in float32) = 5,242,880
    #   27 layers x (73,728 + 5,242,880) = 143,548,416 bytes per request
    assert state_bytes_per_request(spec, bf16) == 27 * (3 * 12_288 * 2 + 128 * 80 * 128 * 4) == 143_548_416
    # parameter count follows the pattern (MLP only on '-' blocks): NVIDIA publishes 8.89 B
    assert spec.parameters == 8_888_227_328


def test_new_dense_specs_hand_checked():
    from kvplan.memory import kv_bytes_per_token
    from kvplan.units import parse_dtype

    bf16 = parse_dtype("bfloat16")
    # Qwen3-14B: 40 layers x 8 KV heads x 128 x 2 x 2 bytes = 163,840 bytes per token
    assert kv_bytes_per_token(_bundled_spec("Qwen/Qwen3-14B"), bf16) == 163_840
    # Qwen3-0.6B: 28 x 8 x 128 x 2 x 2 = 114,688 (head_dim 128 explicit, not 1024 / 16 = 64)
    assert kv_bytes_per_token(_bundled_spec("Qwen/Qwen3-0.6B"), bf16) == 114_688
    # gemma-3-12b-it: 48 layers, every 6th global -> 8 full + 40 sliding (window 1024), 8 KV heads x 256
    g12 = _bundled_spec("google/gemma-3-12b-it")
    assert sum(1 for x in g12.layers if x.window_tokens == 1024) == 40
    assert kv_bytes_per_token(g12, bf16) == 48 * 8 * 256 * 2 * 2 == 393_216
    # gemma-3-4b-it relies on Gemma3TextConfig defaults: 4 KV heads x 256; 34 layers -> 5 global, 29 local
    g4 = _bundled_spec("google/gemma-3-4b-it")
    assert sum(1 for x in g4.layers if x.window_tokens is None) == 5
    assert kv_bytes_per_token(g4, bf16) == 34 * 4 * 256 * 2 * 2 == 139_264
