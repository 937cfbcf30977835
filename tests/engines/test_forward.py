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
    # 0.27 measures total_consumed (the drop in free memory: buffers still allocated after the profile run) and
    # prints the activation as the transient peak above what is allocated: the workspaces move to the overhead
    kept = forward_parts(gpt_oss_20b, 1, 8192, 2, "v014", 0)[1]
    b26, b27 = _budget(gpt_oss_20b, "0.26"), _budget(gpt_oss_20b, "0.27")
    assert b26.activation.bytes - b27.activation.bytes == kept
    assert b27.overhead.bytes - b26.overhead.bytes == kept
    assert "fused-MoE workspaces 0.53 GiB" in b27.overhead.source and b27.kv_budget_bytes == b26.kv_budget_bytes


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
    # the graphs are not subtracted a second time (0.26 prints them apart and still subtracts kvplan's estimate)
    def run(version: str, cudagraph=None):
        return vllm.budget(H100, 0.9, Term("weights", 16 * GiB, "test"), Term("activation", 3 * GiB, "--activation-gib"),
                           None, cudagraph, None, spec=llama31, tp=1, max_num_batched_tokens=8192, max_num_seqs=1024,
                           act_bytes=2, is_cpu=False, version=version, device=H100_DEVICE)
    b27, b26 = run("0.27"), run("0.26")
    assert b27.cudagraph.bytes == 0 and "in the given activation" in b27.cudagraph.source
    assert b26.cudagraph.bytes > 0
    assert run("0.27", Term("cudagraph", GiB, "--cudagraph-gib")).cudagraph.bytes == GiB
