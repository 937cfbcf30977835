"""What vLLM 0.32's CPU backend does with particular models, found by the widened vLLM oracle
(benchmarks/vllm_sweep.py) and checked here with the arithmetic by hand."""

from __future__ import annotations

from kvplan.options import Options
from kvplan.planning.plan import plan_for_spec
from kvplan.model.spec import LayerKind, spec_from_config
from kvplan.units import GiB

BUDGET = GiB // 4  # 268,435,456 B


def cpu_plan(config: dict, **kw):
    spec = spec_from_config(config, model_id="tiny", where="config.json")
    return plan_for_spec(spec, Options(model="tiny", gpu="cpu", kv_budget_bytes=BUDGET, max_model_len=8192,
                                       context=8192, **kw))


TINY_DEEPSEEK_V2 = {"model_type": "deepseek_v2", "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 4,
                    "num_key_value_heads": 4, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                    "v_head_dim": 128, "q_lora_rank": 256, "vocab_size": 1024, "intermediate_size": 128,
                    "dtype": "bfloat16"}


def test_mla_on_the_cpu_backend_uses_16_token_blocks():
    # vLLM's reference CPU MLA kernel (no AMX): block size 16 whatever is asked, prefix caching off.
    # latent 512 + 64 = 576 x 2 B = 1,152 B/token/layer; page 16 x 1,152 = 18,432 B; 4 layers in one group
    # -> 73,728 B per block id; 268,435,456 // 73,728 = 3,640 blocks (vLLM 0.32 CPU: 3,640)
    plan = cpu_plan(TINY_DEEPSEEK_V2, block_size=128, prefix_caching=True)
    assert plan.layout.block_size == 16
    assert plan.answer.num_blocks == 3_640
    # one request at 8,192 tokens: 8,192 / 16 = 512 blocks -> 3,640 / 512 = 7.109375; 58,240 tokens
    assert plan.answer.max_concurrency == 3_640 / 512
    assert plan.answer.kv_tokens == 58_240
    assert plan.prefix_caching is False
    # chunked prefill is off too, so one step takes a whole prompt: max(max_model_len 8,192, 2,048)
    assert plan.engine.max_num_batched_tokens == 8_192


def test_mla_on_gpus_keeps_the_asked_block_size():
    spec = spec_from_config(TINY_DEEPSEEK_V2, model_id="tiny", where="config.json")
    plan = plan_for_spec(spec, Options(model="tiny", gpu="H100", max_model_len=8192, context=8192))
    assert plan.layout.block_size == 16 and plan.prefix_caching is True  # GPU default block 16 anyway
    plan = plan_for_spec(spec, Options(model="tiny", gpu="H100", max_model_len=8192, context=8192, block_size=64))
    assert plan.layout.block_size == 64


def test_minicpm3_caches_expanded_heads_not_the_latent():
    # vLLM treats only the DeepSeek family as MLA: MiniCPM3 caches K and V of all 4 heads at
    # qk_nope 64 + qk_rope 32 = 96 -> 2 x 4 x 96 x 2 B = 1,536 B/token/layer; page 128 x 1,536 = 196,608 B;
    # 4 layers -> 786,432 B per block id; 268,435,456 // 786,432 = 341 blocks (vLLM 0.32 CPU: 341)
    config = {"model_type": "minicpm3", "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 4,
              "num_key_value_heads": 4, "kv_lora_rank": 256, "qk_rope_head_dim": 32, "qk_nope_head_dim": 64,
              "v_head_dim": 128, "q_lora_rank": 256, "vocab_size": 1024, "intermediate_size": 128}
    plan = cpu_plan(config)
    assert {(x.kind, x.kv_heads, x.head_dim) for x in plan.spec.layers} == {(LayerKind.FULL, 4, 96)}
    assert plan.answer.num_blocks == 341
    assert plan.answer.max_concurrency == 341 / 64


def test_falcon_keeps_its_kv_cache_in_the_model_dtype_under_fp8():
    # vLLM's Falcon builds Attention without the cache config: --kv-cache-dtype fp8 changes nothing.
    # 4 layers x 2 x 1 KV head (multi_query) x 64 x 2 B = 1,024 B/token; block 128 x 1,024 = 131,072 B per block id
    # -> 268,435,456 // 131,072 = 2,048 blocks with fp8 as without (vLLM 0.32 CPU: 2,048 both)
    config = {"model_type": "falcon", "architectures": ["FalconForCausalLM"], "num_hidden_layers": 4,
              "hidden_size": 256, "num_attention_heads": 4, "multi_query": True, "vocab_size": 1024}
    assert cpu_plan(config, kv_dtype="fp8").answer.num_blocks == 2_048
    assert cpu_plan(config).answer.num_blocks == 2_048
