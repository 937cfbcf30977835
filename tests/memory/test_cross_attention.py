"""Cross-attention layers (Llama-3.2-Vision / mllama ``cross_attention_layers``) cache the request's image
tokens, a fixed amount per request, not its text tokens.

Image tokens per image as vLLM's mllama processor counts them: ``max_num_tiles`` tiles of
``(image_size // patch_size)^2 + 1`` tokens; Llama-3.2-Vision: 4 x ((560 // 14)^2 + 1) = 4 x 1,601 = 6,404.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan import memory
from kvplan.cli.app import app
from kvplan.errors import ConfigError
from kvplan.paged.groups import allocator_groups
from kvplan.planning.plan import options_from_values, plan_for_spec
from kvplan.model.spec import LayerKind, spec_from_config

CROSS_LAYERS = list(range(3, 100, 5))  # 3, 8, ..., 98: 20 layers
LLAMA_32_90B_VISION = {
    "architectures": ["MllamaForConditionalGeneration"], "model_type": "mllama", "torch_dtype": "bfloat16",
    "text_config": {"model_type": "mllama_text_model", "hidden_size": 8192, "num_hidden_layers": 100,
                    "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672,
                    "vocab_size": 128256, "max_position_embeddings": 131072, "cross_attention_layers": CROSS_LAYERS},
    "vision_config": {"model_type": "mllama_vision_model", "image_size": 560, "patch_size": 14, "max_num_tiles": 4},
}
IMAGE_TOKENS = 4 * ((560 // 14) ** 2 + 1)  # 6,404
TOKEN_BYTES = 2 * 8 * 128 * 2  # K and V x 8 KV heads x head_dim 128 (8192 / 64) x 2 B = 4,096 B per layer


def _spec(config: dict = LLAMA_32_90B_VISION):
    return spec_from_config(config, model_id="meta-llama/Llama-3.2-90B-Vision-Instruct", where="config.json")


def test_self_attention_layers_alone_cost_per_text_token() -> None:
    """Before: all 100 layers per text token, 409,600 B/token."""
    spec = _spec()
    kinds = [layer.kind for layer in spec.layers]
    assert kinds.count(LayerKind.CROSS) == 20 and kinds.count(LayerKind.FULL) == 80
    assert [i for i, k in enumerate(kinds) if k is LayerKind.CROSS] == CROSS_LAYERS
    # 80 self-attention layers x 4,096 B = 327,680 B/token
    assert memory.kv_bytes_per_token(spec, _bf16()) == 80 * TOKEN_BYTES == 327_680


def test_cross_attention_is_a_fixed_cache_per_request() -> None:
    spec = _spec()
    assert IMAGE_TOKENS == 6_404
    # 20 layers x 6,404 image tokens x 4,096 B = 524,615,680 B per request, whatever its length
    assert memory.cross_bytes_per_request(spec, _bf16()) == 20 * IMAGE_TOKENS * TOKEN_BYTES == 524_615_680
    assert any("assumed 1 image x 4 tiles" in n and "6,404 tokens per request" in n and "SGLang" in n
               and "vLLM served it up to 0.10.2" in n for n in spec.notes)


def test_pool_groups_and_blocks_per_request() -> None:
    plan = plan_for_spec(_spec(), options_from_values({"model": "m", "gpu": "H200", "tp": 4, "weights_gib": 177,
                                                        "context": "8k"}))
    layout = plan.layout
    # kinds 80 full : 20 cross -> group size 20: four full groups and one cross-attention group
    assert [g.cache.kind for g in layout.groups] == [LayerKind.FULL] * 4 + [LayerKind.CROSS]
    # at 8,192 tokens and block 16: 4 x 512 + ceil(6,404 / 16) = 2,048 + 401 = 2,449 blocks
    assert plan.demand.blocks(8192) == 2_449
    assert plan.demand.blocks(16) == 4 + 401  # a short request still holds its image tokens
    # the torch validator and the simulator hold the same blocks: the cross group is a fixed-size group
    assert [g.kind for g in allocator_groups(plan.demand)][-1] == "state"
    assert allocator_groups(plan.demand)[-1].state_blocks == 401


def test_images_option_multiplies_the_image_tokens(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_32_90B_VISION))
    args = ["estimate", str(tmp_path), "--gpu", "H200", "--weights-gib", "177", "--tp", "4", "--json"]
    one = json.loads(CliRunner().invoke(app, args).stdout)
    two = json.loads(CliRunner().invoke(app, [*args, "--images", "2"]).stdout)
    # per GPU (tp 4: 2 KV heads): 20 x 6,404 x (2 x 2 x 128 x 2 B = 1,024 B) = 131,153,920 B per image
    assert one["per_token"]["cross_attention_bytes_per_request_gpu"] == 131_153_920
    assert two["per_token"]["cross_attention_bytes_per_request_gpu"] == 2 * 131_153_920
    assert one["per_token"]["kv_bytes_per_token_gpu"] == two["per_token"]["kv_bytes_per_token_gpu"] == 81_920
    assert any("cross_attention layers" in line and "6,404 image tokens" in line for line in one["per_token"]["formula"])
    r = CliRunner().invoke(app, ["estimate", "meta-llama/Llama-3.1-8B", "--images", "2"])
    assert r.exit_code == 2 and "has no cross-attention layers" in r.stderr


def test_vision_config_defaults_and_bad_indices() -> None:
    config = copy.deepcopy(LLAMA_32_90B_VISION)
    config["vision_config"] = {"model_type": "mllama_vision_model"}  # transformers' defaults: 448, 14, 4 tiles
    cross = [x for x in _spec(config).layers if x.kind is LayerKind.CROSS][0]
    assert cross.window_tokens == 4 * ((448 // 14) ** 2 + 1) == 4_100
    config["text_config"]["cross_attention_layers"] = [3, 100]
    with pytest.raises(ConfigError, match="cross_attention_layers"):
        _spec(config)


def _bf16():
    from kvplan.units import parse_dtype

    return parse_dtype("bf16")
