"""Every real Hugging Face config in ``shared/hub-configs`` gives the kind and the per-token KV bytes
that its MANIFEST.yaml entry computes by hand.

Manifest conventions (MANIFEST.yaml ``conventions``): the headline ``kv_bytes_per_token_bf16`` counts
the layers that keep a context-length cache - full attention (sliding layers of interleaved models are
left out) and MLA latents; hybrids count their attention layers only; encoder-decoder models (t5) must
be refused with a clear ConfigError.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from kvplan import memory
from kvplan.errors import ConfigError
from kvplan.model.spec import LayerKind, spec_from_config
from kvplan.units import parse_dtype

# The real configs are not in the repository: they live beside it, in the workspace's shared/hub-configs
# (KVPLAN_HUB_CONFIGS names another folder). A plain clone skips this file and says why; CI (CI=true) has the
# folder, and fails when it is missing rather than pass without these checks.
HUB_CONFIGS = Path(os.environ.get("KVPLAN_HUB_CONFIGS") or Path(__file__).resolve().parents[3] / "shared" / "hub-configs")

if not (HUB_CONFIGS / "MANIFEST.yaml").is_file():
    _why = (f"tests/test_hub_configs.py needs the real Hugging Face configs at {HUB_CONFIGS} (../shared/hub-configs "
            "beside the repository, or KVPLAN_HUB_CONFIGS): the CI workspace has them, a plain clone does not")
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"{_why}; under CI these checks must run, not be skipped", pytrace=False)
    pytest.skip(f"{_why}, so its checks are skipped here", allow_module_level=True)

MANIFEST = yaml.safe_load((HUB_CONFIGS / "MANIFEST.yaml").read_text(encoding="utf-8"))
ENTRIES = {e["hub_id"]: e for e in MANIFEST["models"]}
BF16 = parse_dtype("bf16")


def _spec(hub_id: str):
    path = HUB_CONFIGS / ENTRIES[hub_id]["file"]
    return spec_from_config(json.loads(path.read_text(encoding="utf-8")), model_id=hub_id, where=str(path))


def _headline_bytes(spec) -> int:
    """Per-token bf16 bytes of the layers that keep every token (full attention and MLA)."""
    return sum(memory.layer_token_bytes(x, BF16) for x in spec.layers if x.kind in (LayerKind.FULL, LayerKind.MLA))


def test_manifest_lists_every_config_folder():
    on_disk = {str(p.parent.relative_to(HUB_CONFIGS)) for p in HUB_CONFIGS.rglob("config.json")}
    assert on_disk == set(ENTRIES)
    assert len(ENTRIES) == MANIFEST["count"]


DECODERS = sorted(h for h, e in ENTRIES.items() if e["kind"] != "encdec")


@pytest.mark.parametrize("hub_id", DECODERS)
def test_kind_matches_manifest(hub_id):
    entry, spec = ENTRIES[hub_id], _spec(hub_id)
    # multimodal entries give the language model's kind second: ["multimodal", "sliding", "gqa"]
    expected = entry["kinds"][1] if entry["kind"] == "multimodal" else entry["kind"]
    assert spec.kind_summary == expected
    if entry["kind"] == "multimodal":
        assert any("multimodal" in note for note in spec.notes)


@pytest.mark.parametrize("hub_id", DECODERS)
def test_kv_bytes_per_token_matches_manifest(hub_id):
    entry, spec = ENTRIES[hub_id], _spec(hub_id)
    assert _headline_bytes(spec) == entry["kv_bytes_per_token_bf16"], entry.get("kv_bytes_formula")


@pytest.mark.parametrize("hub_id", DECODERS)
def test_layer_count_matches_manifest(hub_id):
    entry, spec = ENTRIES[hub_id], _spec(hub_id)
    assert spec.num_layers == entry["kv_fields"]["num_hidden_layers"] if "num_hidden_layers" in entry["kv_fields"] \
        else spec.num_layers > 0


@pytest.mark.parametrize("hub_id", [h for h, e in ENTRIES.items() if e["kind"] == "encdec"])
def test_encoder_decoder_is_refused(hub_id):
    with pytest.raises(ConfigError, match="encoder-decoder"):
        _spec(hub_id)


def test_interleaved_sliding_models_keep_their_window_layers():
    # gpt-oss-20b: 24 layers alternate sliding(128) / full; the headline counts the 12 full ones:
    # 12 x 2 x 8 kv heads x 64 x 2 B = 24,576 B; the sliding ones add the same per token but only for 128 tokens
    spec = _spec("openai/gpt-oss-20b")
    kinds = [x.kind for x in spec.layers]
    assert kinds[:4] == [LayerKind.SLIDING, LayerKind.FULL, LayerKind.SLIDING, LayerKind.FULL]
    assert {x.window_tokens for x in spec.layers if x.kind is LayerKind.SLIDING} == {128}
    assert memory.kv_bytes_per_token(spec, BF16) == 2 * 24_576


def test_gemma3_nested_text_config_uses_model_type_defaults():
    # gemma-3-27b-it: text_config gives 62 layers, 32 heads, 16 KV heads, head_dim 128, window 1024;
    # every 6th layer is global -> layers 5, 11, ..., 59 = 10 full layers, 52 sliding
    spec = _spec("google/gemma-3-27b-it")
    full = [i for i, x in enumerate(spec.layers) if x.kind is LayerKind.FULL]
    assert full == list(range(5, 62, 6))
    assert {x.window_tokens for x in spec.layers if x.kind is LayerKind.SLIDING} == {1024}


def test_qwen3_next_hybrid_state_layers():
    # 48 layers, every 4th full attention (12), the other 36 gated delta net
    # conv (4 - 1) x (2 x 16 x 128 + 32 x 128) = 3 x 8192 = 24,576 elements; ssm 32 x 128 x 128 = 524,288
    spec = _spec("Qwen/Qwen3-Next-80B-A3B-Thinking")
    states = [x for x in spec.layers if x.is_state]
    assert len(states) == 36
    assert {(x.conv_elements, x.ssm_elements) for x in states} == {(24_576, 524_288)}


def test_mla_latent_is_not_split_or_doubled():
    # DeepSeek-V3: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 B = 70,272 B per token, any tp
    spec = _spec("deepseek-ai/DeepSeek-V3")
    assert memory.kv_bytes_per_token(memory.rank_layers(spec, tp=8), BF16) == 70_272
    assert any("MTP" in note for note in spec.notes)
