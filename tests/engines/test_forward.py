"""The profile run's forward formulas (kvplan/engines/forward.py) and where vLLM charges the fused-MoE workspaces it
keeps (issue 27): hand-derived numbers from the released code."""

from __future__ import annotations

import pytest

from kvplan.engines import Device, Term, forward_bytes, forward_parts, vllm
from kvplan.engines.vllm import PROFILES, cudagraph_bytes, profile
from kvplan.model.sources import load_bundled
from kvplan.model.spec import build_spec
from kvplan.units import GiB

H100 = 85_045_477_376
H100_DEVICE = Device("cuda", sm_count=132)


@pytest.fixture(scope="module")
def qwen3_235b():
    return build_spec(load_bundled("Qwen/Qwen3-235B-A22B"))


@pytest.fixture(scope="module")
def gpt_oss_20b():
    return build_spec(load_bundled("openai/gpt-oss-20b"))


@pytest.fixture(scope="module")
def llama31():
    return build_spec(load_bundled("meta-llama/Llama-3.1-8B-Instruct"))


def test_the_modular_kernels_workspaces_are_kept_and_the_older_ones_are_not(qwen3_235b):
    # Qwen3-235B-A22B at tp 4: hidden 4,096, 8 of 128 experts, 1,536 / 4 = 384 intermediate; 8,192 tokens, bf16
    around = 8192 * ((3 * 4096 + 128) * 2 + 12 * 8)  # residual, input, output, router logits; top-k weights + ids
    attention = 8192 * (2 * 4096 + 2048 + 2 * 128 + 2048) * 2  # residual, input, q, k, v, output (64 / 4 heads x 128)
    # v014 (0.14+, the workspace manager's buffer): [M, k, max(I, H)] + [M, k, max(2I, H)], kept after the layer
    assert forward_parts(qwen3_235b, 4, 8192, 2, "v014", 0) == (max(around, attention), 8192 * 8 * (4096 + 4096) * 2)
    assert forward_parts(qwen3_235b, 4, 8192, 2, "v014", 0)[1] == 1 * GiB
    # v08 (0.8 - 0.13: torch.empty caches freed with the layer): max(2I, H) + I, nothing kept
    assert forward_parts(qwen3_235b, 4, 8192, 2, "v08", 0) == (8192 * 8 * (4096 + 384) * 2 + around, 0)
    for rule in ("v06", "v08", "v014"):
        assert forward_bytes(qwen3_235b, 4, 8192, 2, rule, 0) == sum(forward_parts(qwen3_235b, 4, 8192, 2, rule, 0))


def test_a_dense_model_keeps_nothing(llama31):
    assert forward_parts(llama31, 1, 8192, 2, "v014", 0)[1] == 0
    assert forward_parts(llama31, 1, 8192, 2, "v014", 0) == forward_parts(llama31, 1, 8192, 2, "v08", 0)


def _budget(spec, version: str):
    return vllm.budget(H100, 0.9, Term("weights", 20 * GiB, "test"), None, None, None, None, spec=spec, tp=1,
                       max_num_batched_tokens=8192, max_num_seqs=1024, act_bytes=2, is_cpu=False, version=version,
                       device=H100_DEVICE)


def test_kept_workspaces_stay_allocated_through_the_sampler_run(gpt_oss_20b):
    # gpt-oss-20b: hidden 2,880, 4 of 32 experts of 2,880; at 8,192 tokens the v014 workspaces are
    # 8,192 x 4 x (2,880 + 5,760) x 2 B = 0.53 GiB, kept while the 1,024-row sampler (7.67 GiB on 0.14's native
    # path) runs: the peak is their sum, not the larger of the forward and the sampler
    kept = 8192 * 4 * (2880 + 5760) * 2
    transient, kept_part = forward_parts(gpt_oss_20b, 1, 8192, 2, "v014", 0)
    assert kept_part == kept
    forward, sampler = vllm.activation_parts(gpt_oss_20b, 1, 8192, 1024, 2, "0.14", H100_DEVICE)
    assert forward == transient + kept and sampler > forward
    assert _budget(gpt_oss_20b, "0.14").activation.bytes == kept + sampler
    assert "kept fused-MoE workspaces 0.53 GiB" in _budget(gpt_oss_20b, "0.14").activation.source
    # 0.13's caches are freed with the layer: the sampler's peak alone
    assert _budget(gpt_oss_20b, "0.13").activation.bytes == vllm.activation_parts(
        gpt_oss_20b, 1, 8192, 1024, 2, "0.13", H100_DEVICE)[1]


def test_from_0_27_the_kept_workspaces_are_consumed_memory_not_activation(gpt_oss_20b):
    from kvplan.engines.vllm_overhead import v1_runner_buffer_bytes

    # 0.27 measures total_consumed (the drop in free memory: buffers still allocated after the profile run) and
    # prints the activation as the transient peak above what is allocated: the workspaces move to the overhead
    kept = forward_parts(gpt_oss_20b, 1, 8192, 2, "v014", 0)[1]
    b26, b27 = _budget(gpt_oss_20b, "0.26"), _budget(gpt_oss_20b, "0.27")
    assert b26.activation.bytes - b27.activation.bytes == kept
    # + the V1 model runner's inputs_embeds [8,192, 2,880] bf16 and slot mapping, made after the snapshot
    buffers = v1_runner_buffer_bytes(gpt_oss_20b, 8192, 2)
    assert b27.overhead.bytes - b26.overhead.bytes == kept + buffers == kept + 8192 * (2880 * 2 + 8)
    assert "fused-MoE workspaces 0.53 GiB" in b27.overhead.source
    assert b27.kv_budget_bytes == b26.kv_budget_bytes - buffers


def test_the_graph_pool_reuses_the_kept_workspaces(qwen3_235b):
    # the CUDA-graph estimate's shared pool is the forward's transient memory at the largest capture size: the
    # kept buffer was allocated by the profile run's larger batch and the captures reuse it
    transient = forward_parts(qwen3_235b, 4, 512, 2, "v014", 0)[0]
    shared_v014, _, _ = cudagraph_bytes(qwen3_235b, 4, 1, 256, 8192, 2, "0.20")
    shared_v08, _, _ = cudagraph_bytes(qwen3_235b, 4, 1, 256, 8192, 2, "0.13")
    assert shared_v014 - transient == shared_v08 - forward_bytes(qwen3_235b, 4, 512, 2, "v08", 16 * 1024)


def test_the_printed_activation_holds_the_graph_estimate_from_0_27():
    assert profile("0.26").printed_activation == "torch-peak"
    assert all(p.printed_activation == ("transient+graphs" if p.first >= (0, 27, 0) else "torch-peak")
               for p in PROFILES.values())
    assert all(p.measure == "consumed" for p in PROFILES.values() if p.printed_activation == "transient+graphs")


@pytest.fixture(scope="module")
def deepseek_r1():
    return build_spec(load_bundled("deepseek-ai/DeepSeek-R1"))


def test_fp8_experts_hold_their_inputs_fp8_copies_per_release(deepseek_r1, qwen3_235b):
    from kvplan.engines.forward import moe_quantized_input_bytes

    # DeepSeek-R1 at tp 8: hidden 7,168 (56 scales of 128), 8 experts of 2,048 / 8 = 256 (2 scales); 32,000 tokens
    first, second = 32_000 * (7168 + 4 * 56), 32_000 * 8 * (256 + 4 * 2)
    assert moe_quantized_input_bytes(deepseek_r1, 8, 32_000, "v06", 32_768) == max(first, second)  # V0: one at a time
    assert moe_quantized_input_bytes(deepseek_r1, 8, 32_000, "v08", 32_768) == first + second  # kept through GEMM 2
    # chunks of 16,384 (0.12 - 0.13) hold one chunk's copies; 0.14+'s prepare quantizes the whole batch's input
    assert moe_quantized_input_bytes(deepseek_r1, 8, 32_000, "v08", 16_384) == (16_384 * (7168 + 224)
                                                                              + 16_384 * 8 * (256 + 8))
    assert moe_quantized_input_bytes(deepseek_r1, 8, 32_000, "v014", 16_384) == first + 16_384 * 8 * (256 + 8)
    # they are transient: the forward grows by them with fp8 weights, the kept workspaces do not
    plain, fp8 = (forward_parts(qwen3_235b, 4, 8192, 2, "v014", 0, fp8=f) for f in (False, True))
    around = 8192 * ((3 * 4096 + 128) * 2 + 12 * 8)  # above the attention stage's 205,520,896 with the copies
    assert fp8[1] == plain[1] and fp8[0] == around + 8192 * (4096 + 128) + 8192 * 8 * (384 + 12) > plain[0]
    assert forward_bytes(deepseek_r1, 8, 32_000, 2, "v06", 32_768, fp8=True) - forward_bytes(
        deepseek_r1, 8, 32_000, 2, "v06", 32_768) == max(first, second)


def test_the_budget_takes_fp8_weights_from_the_checkpoint_or_the_options(deepseek_r1):
    from kvplan.planning.pool import features_of
    from kvplan.planning.plan import options_from_values
    from kvplan.units import parse_dtype

    options = options_from_values({"model": "deepseek-ai/DeepSeek-R1", "offline": True})
    assert features_of(options, deepseek_r1, None).fp8_weights  # quant_method fp8: the checkpoint runs in fp8
    assert not features_of(options, deepseek_r1, parse_dtype("int4", "--weights-dtype", weights=True)).fp8_weights
    assert features_of(options, None, parse_dtype("fp8", "--weights-dtype", weights=True)).fp8_weights
    assert not features_of(options).fp8_weights


def test_moe_fields_without_moe_layers_are_a_dense_model():
    from kvplan.engines import routes_experts

    # NVIDIA-Nemotron-Nano-9B-v2's config carries n_routed_experts 8 and a moe_intermediate_size, but its hybrid
    # pattern has no MoE layer: no fused-MoE workspaces (0.27+ would charge them as consumed memory otherwise)
    nano = build_spec(load_bundled("nvidia/NVIDIA-Nemotron-Nano-9B-v2"))
    assert nano.num_experts and not nano.routed_expert_layers and not routes_experts(nano)
    assert forward_parts(nano, 1, 8192, 2, "v014", 0)[1] == 0
    assert forward_parts(nano, 1, 8192, 2, "v014", 0) == forward_parts(nano, 1, 8192, 2, "v08", 0)
    assert routes_experts(build_spec(load_bundled("Qwen/Qwen3-235B-A22B")))


def test_an_activation_given_from_a_0_27_log_holds_the_graphs(llama31):
    # 0.27+ print the peak activation with the CUDA-graph estimate in it: a given activation is that figure, so
    # the graphs are not subtracted a second time (0.21 - 0.24 print them apart and still subtract kvplan's estimate;
    # Llama on 0.25 - 0.28 runs on the V2 model runner, which estimates none)
    def run(version: str, cudagraph=None):
        return vllm.budget(H100, 0.9, Term("weights", 16 * GiB, "test"), Term("activation", 3 * GiB, "--activation-gib"),
                           None, cudagraph, None, spec=llama31, tp=1, max_num_batched_tokens=8192, max_num_seqs=1024,
                           act_bytes=2, is_cpu=False, version=version, device=H100_DEVICE)
    b27, b26 = run("0.27"), run("0.21")
    assert b27.cudagraph.bytes == 0 and "in the given activation" in b27.cudagraph.source
    assert b26.cudagraph.bytes > 0
    assert run("0.27", Term("cudagraph", GiB, "--cudagraph-gib")).cudagraph.bytes == GiB


@pytest.fixture(scope="module")
def deepseek_v3():
    return build_spec(load_bundled("deepseek-ai/DeepSeek-V3"))


def test_v0_0_7_mla_prefill_up_projects_the_whole_batch(deepseek_v3, llama31):
    """DeepSeek-V3 on V0 0.7.1 - 0.7.3 (attention/backends/mla/utils.py ``_forward_prefill_flash``), bf16, elements
    per token at tp 8 (128 / 8 = 16 heads; nope 128, rope 64, v 128, kv_lora 512, q_lora 1,536, hidden 7,168):
    layer input + residual 2 x 7,168; ``ckq`` and its norm 2 x 1,536; ``kv_a_proj_with_mqa`` 512 + 64;
    ``kv_c_normed`` 512; ``q`` 16 x 192; rotated ``k_pe`` 64; ``kv_b_proj`` output 16 x 256; ``k`` and the padded
    ``v`` 2 x 16 x 192; the output sliced to v 16 x 128; then ``o_proj``'s output and its all-reduce copy
    2 x 7,168 (above the flash output's 16 x 192): 48,256 elements = 96,512 B. At tp 1 (128 heads, no all-reduce
    copy) the flash output 128 x 192 = 24,576 outweighs ``o_proj``'s 7,168: 166,016 elements = 332,032 B."""
    from dataclasses import replace

    from kvplan.engines import mla_prefill_bytes_per_token
    from kvplan.model.spec import spec_from_config

    tp8 = 2 * 7168 + 2 * 1536 + (512 + 64) + 512 + 16 * 192 + 64 + 16 * 256 + 2 * 16 * 192 + 16 * 128 + 2 * 7168
    assert mla_prefill_bytes_per_token(deepseek_v3, 8, 2) == tp8 * 2 == 96_512
    tp1 = (2 * 7168 + 2 * 1536 + 576 + 512 + 128 * 192 + 64 + 128 * 256 + 2 * 128 * 192 + 128 * 128
           + max(128 * 192, 7168))
    assert mla_prefill_bytes_per_token(deepseek_v3, 1, 2) == tp1 * 2 == 332_032
    # other releases (and models without MLA dimensions) keep the generic attention stage
    assert mla_prefill_bytes_per_token(deepseek_v3, 8, 2, "") == 0
    assert mla_prefill_bytes_per_token(llama31, 1, 2) == 0
    # MiniCPM3 has MLA dimensions but vLLM runs it as plain attention over expanded K / V (no MLA backend)
    minicpm3 = spec_from_config({"model_type": "minicpm3", "num_hidden_layers": 4, "hidden_size": 512,
                                 "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 256,
                                 "qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "v_head_dim": 128,
                                 "q_lora_rank": 256, "vocab_size": 1024, "intermediate_size": 128},
                                model_id="tiny", where="config.json")
    assert minicpm3.mla_dims and mla_prefill_bytes_per_token(minicpm3, 1, 2) == 0
    # the MoE layer stays the forward's peak at 32,000 tokens: 32,000 x (8 x (512 + 256 + 7,168) x 2 +
    # (4 x 7,168 + 256) x 2 + 12 x 8) = 5,917,696,000 B against the MLA stage's 32,000 x 96,512 = 3,088,384,000 B
    moe = 32_000 * (8 * (512 + 256 + 7168) * 2 + (4 * 7168 + 256) * 2 + 12 * 8)
    assert forward_parts(deepseek_v3, 8, 32_000, 2, "v06", 32_768, mla_rule="v07") == (moe, 0)
    # with the routed experts taken away the stage decides: 0.7.3 charges it; 0.7.0 (no MLA backend) keeps the
    # generic stage over the 576-wide latent, (2 x 7,168 + 2 x 128 x 576 / 8 + 2 x 576) x 2 = 67,840 B a token
    dense = replace(deepseek_v3, num_experts=0)
    assert vllm.activation_parts(dense, 8, 32_000, 1024, 2, "0.7.3")[0] == 32_000 * 96_512
    assert vllm.activation_parts(dense, 8, 32_000, 1024, 2, "0.7.0")[0] == 32_000 * 67_840 < 32_000 * 96_512
    assert {v: profile(v).mla_prefill for v in ("0.7.0", "0.7.1", "0.7.3", "0.8.4")} == {
        "0.7.0": "", "0.7.1": "v07", "0.7.3": "v07", "0.8.4": ""}
