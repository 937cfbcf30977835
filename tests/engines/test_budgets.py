"""Engine models: every budget term with hand-derived numbers, versions, defaults, SGLang's pool."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvplan.engines import Device, Features, Term, forward_bytes_per_token, padded_vocab, sampler_bytes
from kvplan.engines import sglang, vllm, vllm_overhead
from kvplan.errors import InputError
from kvplan.planning.plan import Options, plan_for_spec
from kvplan.model.sources import load_bundled
from kvplan.model.spec import build_spec
from kvplan.units import GiB, MiB

H100 = 85_045_477_376  # catalogue: CUDA total of an H100 SXM (81,106 MiB)
RTX4090 = 25_250_627_584  # 24,081 MiB


@pytest.fixture(scope="module")
def llama3():
    return build_spec(load_bundled("meta-llama/Meta-Llama-3-8B"))


@pytest.fixture(scope="module")
def llama31():
    return build_spec(load_bundled("meta-llama/Llama-3.1-8B-Instruct"))


@pytest.fixture(scope="module")
def qwen3_8b():
    return build_spec(load_bundled("Qwen/Qwen3-8B"))


def _weights(n: int) -> Term:
    return Term("weights", n, "test")


# --------------------------------------------------------------------------------- activation


def test_forward_bytes_dense(llama3):
    # MLP stage: (3 x hidden 4096 + 3 x intermediate 14336) x 2 B = (12,288 + 43,008) x 2 = 110,592
    assert forward_bytes_per_token(llama3, 1, 2) == 110_592
    # tp 2 splits the intermediate only: (12,288 + 3 x 7,168) x 2 = 67,584
    assert forward_bytes_per_token(llama3, 2, 2) == 67_584


def test_forward_bytes_moe_uses_active_experts():
    spec = build_spec(load_bundled("Qwen/Qwen3-30B-A3B"))
    # hidden 2048, top-8 experts of moe_intermediate 768 (not the dense 6144):
    # 3 x 2048 + 8 x (3 x 768 + 2048) = 6,144 + 34,816 = 40,960 elements x 2 B = 81,920
    assert forward_bytes_per_token(spec, 1, 2) == 81_920


def test_sampler_bytes_fp32_rows_over_padded_vocab():
    assert padded_vocab(128_256) == 128_256  # already a multiple of 64
    assert padded_vocab(32_001) == 32_064  # 501 x 64
    # 10 copies x 256 rows x 128,256 x 4 B = 1,313,341,440
    assert sampler_bytes(256, 128_256, 10) == 1_313_341_440


def test_activation_is_max_of_forward_and_sampler(llama3):
    # V0, 8192-token profile: forward 8192 x 110,592 = 905,969,664 < sampler 1,313,341,440 (10 copies)
    forward, sampler = vllm.activation_parts(llama3, 1, 8192, 256, 2, "0.6")
    assert (forward, sampler) == (905_969_664, 1_313_341_440)
    # 0.24 (the V1 model runner's FlashInfer sampler): bf16 logits + 3 fp32 copies + the batch's hidden states + the sampled rows'
    # hidden states twice (gathered, and their rand_like copy):
    # 256 x (128,256 x 2 + 128,256 x 12) + (2,048 + 2 x 256) x 4,096 x 2 = 459,669,504 + 20,971,520 = 480,641,024;
    # forward 2048 x 110,592 = 226,492,416
    assert vllm.activation_parts(llama3, 1, 2048, 256, 2, "0.24") == (226_492_416, 480_641_024)
    # sampler rows are min(max_num_seqs, max_num_batched_tokens): 100 x 1,795,584 + (100 + 200) x 4,096 x 2
    assert vllm.activation_parts(llama3, 1, 100, 256, 2, "0.24")[1] == 179_558_400 + 2_457_600 == 182_016_000
    b = vllm.budget(H100, 0.9, _weights(0), None, None, None, None, spec=llama3, tp=1, max_num_batched_tokens=20_000,
                    max_num_seqs=256, act_bytes=2, is_cpu=False, version="0.6")
    # 20,000 x 110,592 = 2,211,840,000 > sampler: the forward wins
    assert b.activation.bytes == 2_211_840_000 == b.activation_forward_bytes
    assert b.activation_sampler_bytes == 1_313_341_440


def test_sampler_paths_of_0_8_to_0_16_follow_the_code():
    # Read in the released code: 0.8.0 - 0.9.0 run the native torch-sort top-k/top-p (TopKTopPSampler sends
    # FlashInfer >= 0.2.3 to forward_native): 10 fp32 [rows, vocab] copies, as V0. 0.9.1 - 0.11 take FlashInfer
    # where it is installed (the Docker images): flashinfer's top_k_top_p_sampling_from_logits keeps the model-dtype
    # logits, their fp32 copy, the top-k masked logits and their softmax (2 + 12 B per element) and the batch's
    # hidden states; 0.12 - 0.16 the native path again; ROCm (no FlashInfer) native until 0.17.
    # Qwen2(.5)-7B, `vllm serve` on an A100: 2048 tokens, 256 rows; vocab 152,064 is a multiple of 64.
    qwen = build_spec(load_bundled("Qwen/Qwen2.5-7B-Instruct"))
    forward, sampler = vllm.activation_parts(qwen, 1, 2048, 256, 2, "0.10")
    assert forward == 2048 * (3 * 3584 + 3 * 18944) * 2 == 276_824_064
    # 256 x 152,064 x 14 + (2,048 + 2 x 256) x 3,584 x 2 = 544,997,376 + 18,350,080
    assert sampler == 563_347_456
    assert vllm.activation_parts(qwen, 1, 2048, 256, 2, "0.11.2")[1] == 563_347_456
    # 0.8.0 - 0.9.0 with the FlashInfer the 0.8 images ship (< 0.2.3): logits + their fp32 copy + softmax probs, and
    # only the sampled rows' hidden states: 256 x (152,064 x 2 + 152,064 x 8) + 256 x 3,584 x 2
    assert vllm.activation_parts(qwen, 1, 2048, 256, 2, "0.8.5")[1] == 256 * 152_064 * 10 + 256 * 3584 * 2 == 391_118_848
    assert vllm.activation_parts(qwen, 1, 2048, 256, 2, "0.12")[1] == 1_557_135_360
    assert vllm.activation_parts(qwen, 1, 2048, 256, 2, "0.11.1", Device("rocm"))[1] == 1_557_135_360
    # dennislee-a100-80-qwen2-7b-util025 (0.10.1.1, "Using FlashInfer for top-p & top-k sampling"):
    # 0.25 x 79.151 GiB - 14.2488 - 5.01 = 0.53 GiB for activation + non-torch; kvplan's code-derived peak and its
    # 0.20 GiB non-torch are above it (the safe side) by less than 0.25 GiB.
    assert 0.53 * GiB < max(forward, sampler) + vllm.NON_TORCH_BYTES < 0.88 * GiB


def test_triton_and_flashinfer_sampler_peaks_are_derived(llama31):
    # Llama-3.1-8B, `vllm serve` on an H100 (132 SMs): 8,192 tokens, 1,024 rows, vocab 128,256 (padded the same).
    # 0.17 - 0.20 (Triton top-k/top-p): bf16 logits 1,024 x 128,256 x 2 = 262,668,288; fp32 logits, softmax
    # probs and exponential noise 1,024 x 128,256 x 12 = 1,576,009,728; Triton buffer 132 x 128,256 x 4 =
    # 67,719,168; hidden states of the batch 8,192 x 4,096 x 2 = 67,108,864 and of the sampled rows twice
    # (gathered, then torch.rand_like) 2 x 1,024 x 4,096 x 2 = 16,777,216 -> 1,990,283,264 (1.85 GiB; 5 copies: 2.45)
    h100 = Device("cuda", 132, "nvlink-switch")
    forward, triton = vllm.activation_parts(llama31, 1, 8192, 1024, 2, "0.19.0", h100)
    assert (forward, triton) == (905_969_664, 1_990_283_264)
    # 0.21+ (FlashInfer: top-k masked logits + probs, no per-SM buffer): 1,990,283,264 - 67,719,168
    assert vllm.activation_parts(llama31, 1, 8192, 1024, 2, "0.21.0", h100)[1] == 1_922_564_096
    # ROCm has no FlashInfer: the Triton buffer again, one row per compute unit (MI300X: 304)
    mi300x = Device("rocm", 304, "infinity-fabric")
    assert vllm.activation_parts(llama31, 1, 8192, 1024, 2, "0.21.0", mi300x)[1] == 1_922_564_096 + 304 * 128_256 * 4
    # 24 rows on an H100: the buffer is min(next power of two of 24, 132) = 32 rows
    small = vllm.sampler_peak_bytes(llama31, 24, 2, 24, "triton", 132)
    assert small == 24 * 128_256 * 14 + 32 * 128_256 * 4 + (24 + 48) * 4_096 * 2
    # fp32 models: .to(float32) returns the logits themselves -> 4 B + 8 B per element, no extra copy
    assert vllm.sampler_peak_bytes(llama31, 8, 4, 8, "flashinfer") == 8 * 128_256 * 12 + (8 + 16) * 4_096 * 4


def test_rope_cache_counted_with_the_weights_as_vllm_logs_it(llama31, llama3):
    # Llama-3.1: 131,072 positions x 128 head_dim x 2 B = 33,554,432 (32 MiB); Llama-3: 8,192 x 128 x 2 = 2 MiB
    assert vllm_overhead.rope_cache_bytes(llama31, 2) == 33_554_432
    assert vllm_overhead.rope_cache_bytes(llama3, 2) == 2 * MiB
    b = vllm.budget(H100, 0.9, Term("weights", 1000, "checkpoint"), None, None, None, None, spec=llama3, tp=1,
                    max_num_batched_tokens=2048, max_num_seqs=256, act_bytes=2, is_cpu=False, version="0.24")
    assert b.weights.bytes == 1000 + 2 * MiB  # "Model loading took": the checkpoint + the table
    assert b.overhead.bytes == vllm.NON_TORCH_BYTES
    given = vllm.budget(H100, 0.9, Term("weights", 1000, "--weights-gib"), None, None, None, None, spec=llama3, tp=1,
                        max_num_batched_tokens=2048, max_num_seqs=256, act_bytes=2, is_cpu=False, version="0.24")
    assert given.weights.bytes == 1000 and given.overhead.bytes == vllm.NON_TORCH_BYTES  # a logged figure holds it


def test_native_sampler_ten_copies_calibrated_on_h100_and_rocm_logs(llama31):
    # h100-k8s-llama31-8b-tp1 (benchmarks/corpus/vllm/): `vllm serve` on an H100 -> 8192 tokens, 1024 rows.
    # sampler 10 x 1,024 x 128,256 x 4 B = 5,253,365,760 (4.89 GiB); logged activation peak 4.76 GiB.
    # forward 8,192 x 110,592 B = 905,969,664 is smaller, so the sampler is the term.
    forward, sampler = vllm.activation_parts(llama31, 1, 8192, 1024, 2, "0.12")
    assert (forward, sampler) == (905_969_664, 5_253_365_760)
    assert abs(sampler / GiB - 4.76) < 0.15
    # The whole budget: floor(79.18 GiB x 0.9) - weights 14.99 GiB - 4.89 - 0.30 - 32 MiB rope = 51.05 GiB,
    # against the logged 51.38 GiB (kvplan's 0.30 GiB non-torch vs the logged 0.13).
    total = round(79.18 * GiB)
    b = vllm.budget(total, 0.9, Term("weights", round(14.99 * GiB), "log"), None, None, None, None, spec=llama31, tp=1,
                    max_num_batched_tokens=8192, max_num_seqs=1024, act_bytes=2, is_cpu=False, version="0.12")
    assert b.activation.bytes == 5_253_365_760
    assert b.cudagraph.bytes == 0  # 0.12 captures graphs after the KV cache
    assert abs(b.kv_budget_bytes / GiB - 51.38) < 0.4


# --------------------------------------------------------------------------------- budget


def test_requested_rounding_per_version():
    # 85,045,477,376 x 0.9 = 76,540,929,638.4
    assert vllm.requested_bytes(H100, 0.9, "floor") == 76_540_929_638
    assert vllm.requested_bytes(H100, 0.9, "ceil") == 76_540_929_639
    assert vllm.profile("0.13.0").rounding == "floor"
    assert vllm.profile("0.14.0").rounding == "ceil"  # request_memory: math.ceil from 0.14


def test_v0_budget_end_to_end(llama31):
    # 24 GiB card, V0 profile, util 0.9, LLM at max_model_len 20,000 (no chunked prefill below 32K):
    # usable   = floor(25,769,803,776 x 0.9)            = 23,192,823,398
    # weights  = 16,060,522,496 (checkpoint) + rope 33,554,432 = 16,094,076,928
    # activation = 20,000 x 110,592                     =  2,211,840,000
    # overhead = round(0.30 x 2**30)                    =    322,122,547
    # kv = 23,192,823,398 - 16,094,076,928 - 2,211,840,000 - 322,122,547 = 4,564,783,923
    plan = plan_for_spec(llama31, Options(model="x", gpu=None, gpu_memory_bytes=24 * GiB, engine_version="0.6",
                                          gpu_util=0.9, context=20_000))
    b = plan.budget
    assert plan.engine.max_num_batched_tokens == 20_000
    assert b.usable_bytes == 23_192_823_398
    assert b.weights.bytes == 16_094_076_928
    assert b.activation.bytes == 2_211_840_000
    assert b.overhead.bytes == 322_122_547
    assert b.cudagraph.bytes == 0
    assert b.kv_budget_bytes == 4_564_783_923
    # 2 MiB blocks (32 layers x 16 tokens x 4 KiB): 4,564,783,923 // 2,097,152 = 2,176
    assert plan.answer.num_blocks == 2_176


def test_cudagraph_logged_from_018_subtracted_from_020(llama3):
    assert len(vllm.capture_sizes(512)) == 51  # 1, 2, 4 + 8..256 by 8 (32) + 272..512 by 16 (16)
    assert len(vllm.capture_sizes(256)) == 35
    assert vllm.capture_sizes(16) == [1, 2, 4, 8, 16]
    # max_num_seqs 256: piecewise up to min(512, 512, 2048) = 512 (51), FULL up to 256 (35);
    # shared = 512 x 110,592 = 56,623,104; extra = (50 + 34) x 32 layers x 300 KiB = 825,753,600
    est, n_pw, n_full = vllm.cudagraph_bytes(llama3, 1, 1, 256, 2048, 2)
    assert (est, n_pw, n_full) == (56_623_104 + 825_753_600, 51, 35)
    common = dict(spec=llama3, tp=1, max_num_batched_tokens=2048, max_num_seqs=256, act_bytes=2, is_cpu=False)
    assert vllm.budget(H100, 0.9, _weights(0), None, None, None, None, version="0.20.0", **common).cudagraph.bytes == est
    logged = vllm.budget(H100, 0.9, _weights(0), None, None, None, None, version="0.19.1", **common).cudagraph
    assert logged.bytes == 0 and "only logged" in logged.source
    assert vllm.budget(H100, 0.9, _weights(0), None, None, None, None, version="0.17.1", **common).cudagraph.bytes == 0


def test_user_terms_and_kv_budget_replace_estimates(llama3):
    b = vllm.budget(H100, 0.9, _weights(10 * GiB), Term("activation", GiB, "--activation-gib"),
                    Term("overhead", 0, "--overhead-gib"), Term("cudagraph", 0, "--cudagraph-gib"), None, spec=llama3,
                    tp=1, max_num_batched_tokens=2048, max_num_seqs=256, act_bytes=2, is_cpu=False, version="0.32")
    # ceil(85,045,477,376 x 0.9) - (10 GiB + the 2 MiB rotary table) - 1 GiB
    # = 76,540,929,639 - 11,813,257,216 = 64,727,672,423
    assert b.kv_budget_bytes == 64_727_672_423
    fixed = vllm.budget(H100, 0.9, _weights(10 * GiB), None, None, None, 5 * GiB, spec=llama3, tp=1,
                        max_num_batched_tokens=2048, max_num_seqs=256, act_bytes=2, is_cpu=False)
    assert fixed.kv_budget_bytes == 5 * GiB and fixed.kv_budget_source == "--kv-budget"


def test_negative_budget_is_an_answer():
    spec = build_spec(load_bundled("meta-llama/Llama-3.1-70B"))
    plan = plan_for_spec(spec, Options(model="x", gpu="RTX-4090-24GB"))
    assert plan.budget.kv_budget_bytes < 0
    assert plan.answer.num_blocks == 0 and not plan.answer.engine_starts


def test_cpu_backend(llama3):
    plan = plan_for_spec(llama3, Options(model="x", gpu="cpu", gpu_memory_bytes=64 * GiB, engine_version="0.13.0"))
    assert (plan.engine.block_size, plan.engine.max_num_batched_tokens) == (128, 4096)
    # VLLM_CPU_KVCACHE_SPACE unset before 0.14: 4 GiB; 128-token blocks of 32 layers x 4 KiB = 16 MiB -> 256 blocks
    assert plan.budget.kv_budget_bytes == 4 * GiB and plan.answer.num_blocks == 256
    # from 0.20 ("Auto set"): the 64 GiB node x 0.92 less the weights and the worker's runtime
    auto = plan_for_spec(llama3, Options(model="x", gpu="cpu", gpu_memory_bytes=64 * GiB)).budget
    assert auto.gpu_util == 0.92
    assert auto.kv_budget_bytes == -(-64 * GiB * 92 // 100) - auto.weights.bytes - vllm.CPU_WORKER_RSS_BYTES
    given = plan_for_spec(llama3, Options(model="x", gpu="cpu", gpu_memory_bytes=64 * GiB, kv_budget_bytes=40 * GiB))
    assert given.answer.num_blocks == 2560  # 40 GiB / 16 MiB


# --------------------------------------------------------------------------------- versions and defaults


def test_versions_and_default_utilisation():
    assert vllm.DEFAULT_VERSION == "0.33" == vllm.VERSIONS[-1]
    utils = {v: vllm.defaults(v, H100, False).gpu_util for v in vllm.VERSIONS}
    # CacheConfig.gpu_memory_utilization: Field(default=0.9) through 0.19.x, 0.92 from 0.20.0
    assert {v for v, u in utils.items() if u == 0.92} == {"0.20", "0.20.1", "0.21", "0.25", "0.26", "0.27", "0.28", "0.29",
                                                         "0.30", "0.33"}
    assert vllm.defaults("0.6", H100, False).mode == "V0"
    assert vllm.defaults("0.19.1", H100, False).gpu_util == 0.9 and vllm.defaults("0.20.0", H100, False).gpu_util == 0.92
    with pytest.raises(InputError, match="older than every modelled"):
        vllm.defaults("0.5.5", H100, False)


@pytest.mark.parametrize(("typed", "release", "covers"), [
    ("0.19.0", "0.18", "0.18.0 - 0.19.x"),
    ("0.10.1.1", "0.9.1", "0.9.1 - 0.10.x"),
    ("0.9.0.1", "0.9", "0.9.0"),
    ("0.6.3.post1", "0.6", "0.6.0 - 0.6.3"),
    ("0.7.3", "0.7.2", "0.7.2 - 0.7.x"),
        ("0.11.0rc2.dev98+g393de22d2", "0.11", "0.11.0 - 0.11.x"),
        ("0.13.0", "0.13", "0.13.0 - 0.13.x"),
    ("0.15.2rc1.dev93+g11a4c9d30", "0.14", "0.14.0 - 0.16.x"),
    ("0.29.1rc1.dev17+gd2d649e67", "0.29", "0.29.0 - 0.29.x"),
    ("0.31.0", "0.30", "0.30.0 - 0.32.x"),
    ("0.33.1", "0.33", "0.33.0 and later"),
    ("0.10.1.dev101+gbda9d0535", "0.9.1", "0.9.1 - 0.10.x"),  # a dev build before 0.10.1 is 0.10.x code
    ("v0.20.0", "0.20", "0.20.0"),
    ("0.20.1", "0.20.1", "0.20.1 - 0.20.x"),
    ("0.23.0", "0.21", "0.21.0 - 0.24.x"),
    ("0.25.1", "0.25", "0.25.0 - 0.25.x"),
])
def test_any_pep440_version_maps_to_the_release_that_covers_it(typed, release, covers):
    key, note = vllm.resolve_version(typed)
    assert key == release and vllm.RANGES[key] == covers
    assert typed in note and f"release {release} (covers {covers})" in note


def test_versions_outside_every_range_are_refused_with_the_ranges():
    with pytest.raises(InputError, match="older than every modelled") as err:
        vllm.resolve_version("0.1.dev7548+gbaba038")
    assert "0.6: 0.6.0 - 0.6.3" in err.value.hint and "0.33: 0.33.0 and later" in err.value.hint
    with pytest.raises(InputError, match="invalid --engine-version 'next'"):
        vllm.resolve_version("next")
    assert "newer than the newest release checked" in vllm.resolve_version("0.40.0")[1]
    # SGLang's releases by the rule each changed (read in the sglang wheels 0.3.6 - 0.5.23)
    assert [sglang.resolve_version(v)[0] for v in ("0.3.6", "0.4.3.post2", "0.4.6.post1", "0.4.7", "0.4.10",
                                                   "0.5.2", "0.5.3", "0.5.6", "0.5.12", "0.5.16", "0.5.23")] == [
        "0.3", "0.4", "0.4.6", "0.4.7", "0.4.8", "0.4.8", "0.5.3", "0.5.6", "0.5.10", "0.5.14", "0.5.20"]
    assert sglang.resolve_version("0.5.5")[0] == "0.5.5" and sglang.resolve_version("0.5.9")[0] == "0.5.6"
    # a modelled release's own name selects it; 0.5 as a version is 0.5.0, which 0.4.8's rules cover
    assert sglang.resolve_version("0.5.10")[0] == "0.5.10" and sglang.resolve_version("0.5")[0] == "0.4.8"
    assert all(vllm.resolve_version(key)[0] == key for key in vllm.PROFILES)
    assert all(sglang.resolve_version(key)[0] == key for key in sglang.RELEASES)
    assert "newer than the newest release checked" in sglang.resolve_version("0.6.0")[1]
    with pytest.raises(InputError, match="older than every modelled sglang"):
        sglang.resolve_version("0.2.14")


def test_plan_selects_version(llama3):
    plan = plan_for_spec(llama3, Options(model="x", gpu="h100", engine_version="0.6", context=8192))
    assert plan.engine.version == "0.6" and plan.budget.requested_rounding == "floor"
    assert plan.engine.max_num_batched_tokens == 8192  # V0: max(max_model_len, 2048)
    typed = plan_for_spec(llama3, Options(model="x", gpu="h100", engine_version="0.19.0"))
    assert typed.engine.version == "0.18" and typed.engine.requested_version == "0.19.0"
    assert "vllm 0.19.0: rules of modelled release 0.18 (covers 0.18.0 - 0.19.x)" in typed.notes
    with pytest.raises(InputError):
        plan_for_spec(llama3, Options(model="x", gpu="h100", engine_version="0.5"))


@pytest.mark.parametrize(("version", "memory", "name", "context", "usage", "expected"), [
    ("0.32", H100, "H100-SXM-80GB", "serve", "serve", (8192, 1024)),
    ("0.32", H100, "H100-SXM-80GB", "serve", "llm", (16384, 1024)),
    ("0.32", 84_987_740_160, "A100-SXM-80GB", "serve", "serve", (2048, 256)),  # >= 70 GiB but an A100
    ("0.32", 84_987_740_160, "A100-SXM-80GB", "serve", "llm", (8192, 256)),
    ("0.32", RTX4090, "RTX-4090-24GB", "serve", "serve", (2048, 256)),
    ("0.32", 191_514_017_792, "B200-180GB", "serve", "serve", (16384, 1024)),  # >= 160 GiB tier (from 0.28)
    ("0.27", 191_514_017_792, "B200-180GB", "serve", "serve", (8192, 1024)),  # no such tier before 0.28
    ("0.8.5", 84_987_740_160, "A100-SXM-80GB", "serve", "serve", (8192, 1024)),  # 0.8.x: A100s in the 70 GiB tier
])
def test_batch_defaults_by_gpu(version, memory, name, context, usage, expected):
    assert vllm.batch_defaults(version, memory, gpu_name=name, usage_context=usage) == expected


def test_v0_batch_defaults_follow_max_model_len():
    assert vllm.batch_defaults("0.6", H100, max_model_len=8192) == (8192, 256)
    assert vllm.batch_defaults("0.6", H100, max_model_len=1000) == (2048, 256)
    # above 32K: chunked prefill of 512 tokens up to 0.6.3 (SchedulerConfig), 2048 from 0.6.4; EngineArgs turns it
    # on for `vllm serve` and the LLM class alike (create_engine_config has no usage-context condition)
    assert vllm.batch_defaults("0.6", H100, max_model_len=40_000) == (512, 256)
    assert vllm.batch_defaults("0.6.6", H100, max_model_len=40_000) == (2048, 256)
    assert vllm.batch_defaults("0.6", H100, max_model_len=40_000, usage_context="llm") == (512, 256)
    # not where V0 keeps it off (a sliding window, a multimodal model, ROCm from 0.6.5): one 40,000-token prefill
    assert vllm.batch_defaults("0.6", H100, max_model_len=40_000, long_prefill_chunked=False) == (40_000, 256)
    with pytest.raises(InputError):
        vllm.batch_defaults("0.6", H100, usage_context="batch")


def test_the_chunked_prefill_switch_as_each_release_takes_it():
    # --no-enable-chunked-prefill: V0 prefills max(max_model_len, 2048) at once, also above 32K
    assert vllm.batch_defaults("0.6.6", H100, max_model_len=40_000, chunked_prefill=False) == (40_000, 256)
    assert vllm.batch_defaults("0.6.6", H100, max_model_len=1000, chunked_prefill=False) == (2048, 256)
    # --enable-chunked-prefill below 32K: the release's chunk
    assert vllm.batch_defaults("0.6.6", H100, max_model_len=8192, chunked_prefill=True) == (2048, 256)
    # V1 0.8 - 0.11.0 set it back on ("V1 always uses chunked prefills"); from 0.11.1 the batch is
    # max(max_model_len, the default 8,192 on an H100), at most max_num_seqs x max_model_len
    assert vllm.batch_defaults("0.10.2", H100, max_model_len=40_000, chunked_prefill=False) == (8192, 1024)
    assert vllm.batch_defaults("0.12.0", H100, max_model_len=40_000, chunked_prefill=False) == (40_000, 1024)
    assert vllm.batch_defaults("0.12.0", H100, max_model_len=4096, chunked_prefill=False) == (8192, 1024)
    assert vllm.batch_defaults("0.12.0", H100, max_model_len=40_000, chunked_prefill=True) == (8192, 1024)
    v0 = vllm.defaults("0.6.6", H100, False, max_model_len=40_000, chunked_prefill=False)
    assert not vllm.chunked_prefill(v0, 40_000) and v0.chunked_prefill_switch is False
    with pytest.raises(InputError, match="without chunked prefill"):
        vllm.check_batching(replace(v0, max_num_batched_tokens=8192), 40_000)
    assert "always chunks prefills" in " ".join(vllm.defaults("0.9.2", H100, False, chunked_prefill=False).notes)


def test_v0_chunks_long_prefills_on_rocm_only_before_0_6_5():
    # EngineArgs: device_type "cuda" holds for ROCm too; 0.6.5 adds `not current_platform.is_rocm()`
    rocm = Device("rocm", 304)
    assert vllm.v0_long_prefill_chunked(rocm, None, (0, 6, 4)) and not vllm.v0_long_prefill_chunked(rocm, None, (0, 6, 5))
    assert not vllm.v0_long_prefill_chunked(Device("cpu", 0), None, (0, 6, 0))


# --------------------------------------------------------------------------------- SGLang


def test_sglang_cell_size_gqa_and_mla(qwen3_8b):
    from kvplan import memory
    from kvplan.units import parse_dtype

    bf16 = parse_dtype("bfloat16")
    # GQA: 8 KV heads x 128 x 36 layers x 2 (K, V) x 2 B = 147,456; tp 4 -> 2 heads = 36,864
    assert sglang.cell_size_bytes(qwen3_8b, bf16) == 147_456
    assert sglang.cell_size_bytes(memory.rank_layers(qwen3_8b, 4, 1), bf16) == 36_864
    # MLA: (kv_lora_rank 512 + qk_rope_head_dim 64) x 27 layers x 2 B = 31,104 (no x2 for V)
    mla = build_spec(load_bundled("deepseek-ai/DeepSeek-V2-Lite-Chat"))
    assert sglang.cell_size_bytes(mla, bf16) == 31_104
    assert sglang.max_total_num_tokens(31_104 * 1000 + 5, 31_104) == 1000
    assert sglang.max_total_num_tokens(-1, 31_104) == 0


def test_sglang_mem_fraction_defaults():
    # the GPU size SGLang's defaults read is nvidia-smi's total: 81,559 MiB on an H100 (the catalogue's
    # smi_memory_mib); the RTX 4090 has none in the catalogue: its runtime 24,081 MiB + 480 = 24,561 MiB
    assert [sglang.mem_fraction_static("0.4", H100, tp) for tp in (1, 2, 4, 8, 16)] == [0.88, 0.87, 0.85, 0.81, 0.79]
    assert sglang.mem_fraction_static("0.3", H100, 8) == 0.82
    h100 = Device("cuda", 132, "nvlink-switch", "9.0", 81_559 * MiB)
    # 0.4.6: above 80 GiB (gpu - 13 GiB) / gpu, unrounded; at or below it the ladder
    assert sglang.mem_fraction_static("0.4.6", H100, 1, device=h100) == 0.88
    h200 = Device("cuda", 132, "nvlink-switch", "9.0", 143_771 * MiB)
    assert sglang.mem_fraction_static("0.4.6", H100, 1, device=h200) == (143_771 - 13_312) / 143_771
    # 0.4.8 - 0.5.2: reserved (9.5 + tp x pp / 2) GiB below 90 GiB: 10,240 MiB -> 71,319 / 81,559 = 0.874
    assert [sglang.mem_fraction_static("0.4.8", H100, tp, device=h100) for tp in (1, 2, 4, 8)] == [0.874, 0.868, 0.856, 0.831]
    # 0.5.3: 512 + 8192 x 1.5 + 256 x 2 + 1/8 x 1024 = 13,440 -> 68,119 / 81,559 = 0.835
    assert sglang.mem_fraction_static("0.5.3", H100, 1, device=h100) == 0.835
    # tp 8: cuda_graph_max_bs 512 at tp >= 4: 512 + 12,288 + 1,024 + 1,024 = 14,848 -> 0.818
    assert sglang.mem_fraction_static("0.5.3", H100, 8, device=h100) == 0.818
    # 0.5.10+: + 8 MiB per piecewise CUDA graph up to chunked_prefill_size 8192 (58 graphs): 13,904 -> 0.830
    assert sglang.piecewise_graph_tokens(8192) == 58 and sglang.mem_fraction_static("0.5.10", H100, 1, device=h100) == 0.830
    # RTX 4090: 512 + 2048 x 1.5 + 16 x 2 + 128 = 3,744 (0.5.3) -> 20,817 / 24,561 = 0.848; 0.5.5: bs 24 -> 0.847;
    # 0.5.10: + 42 graphs x 8 = 336 -> 0.833; 0.5.20: chunk 4096, bs 48 -> 512 + 6144 + 96 + 128 + 50 x 8 -> 0.704
    assert [sglang.mem_fraction_static(v, RTX4090, 1) for v in ("0.5.3", "0.5.5", "0.5.10", "0.5.20")] == [
        0.848, 0.847, 0.833, 0.704]
    assert sglang.chunked_prefill_size("0.4", RTX4090) == 2048 and sglang.chunked_prefill_size("0.4", H100) == 8192
    assert sglang.cuda_graph_max_bs("0.5.5", H100, 4, h100) == 512 and sglang.cuda_graph_max_bs("0.5.5", H100, 1, h100) == 256


def test_sglang_running_requests():
    assert sglang.max_running_requests(400_000, 8192) == 4096  # int(400,000 / 8192 x 512) = 25,000 -> cap 4096
    assert sglang.max_running_requests(100_000, 131_072) == 2048  # 390 -> floor 2048
    assert sglang.max_running_requests(1_000_000, 131_072) == 3906  # int(3906.25)


def test_sglang_plan_page_size_one(qwen3_8b):
    plan = plan_for_spec(qwen3_8b, Options(model="x", gpu="h100", engine="sglang", engine_version="0.4"))
    assert plan.engine.block_size == 1 and plan.engine.gpu_util == 0.88
    # every release: pool = (total - used before loading) x frac - weights - what loads above the checkpoint.
    # usable = floor(85,045,477,376 x 0.88) = 74,840,020,090; weights 16,381,470,720 (checkpoint); 0.45 GiB in use
    # before loading x 0.88 = floor(483,183,821 x 0.88) = 425,201,762; + 0.20 GiB = 214,748,365 loaded above the
    # checkpoint; kv = 57,818,599,243 -> // 147,456 B per token = 392,107 tokens
    assert plan.budget.kv_budget_bytes == 74_840_020_090 - 16_381_470_720 - 425_201_762 - 214_748_365
    assert plan.budget.activation.bytes == 0 and plan.budget.cudagraph.bytes == 0
    assert plan.answer.num_blocks == 392_107 == plan.answer.capacity_tokens
    with pytest.raises(InputError):
        plan_for_spec(qwen3_8b, Options(model="x", gpu="cpu", gpu_memory_bytes=64 * GiB, engine="sglang"))


# --------------------------------------------------------------------------------- JSON


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_json_budget_carries_every_term(llama3, engine):
    plan = plan_for_spec(llama3, Options(model="x", gpu="h100", engine=engine))
    budget = plan.to_dict()["budget"]
    b = plan.budget
    for term in b.terms:
        assert budget[f"{term.name}_bytes"] == term.bytes
        assert budget["sources"][term.name] == term.source
    assert {"weights", "activation", "overhead", "cudagraph"} == set(budget["sources"])
    assert budget["total_bytes"] == H100 and budget["usable_bytes"] == b.usable_bytes
    assert budget["kv_budget_bytes"] == b.usable_bytes - sum(t.bytes for t in b.terms)


# --------------------------------------------------------------------------------- the token line per release


def test_token_line_of_multi_group_models_per_release():
    # vLLM 0.11.0 - 0.20.0 print num_blocks // len(kv_cache_groups) x min block size; 0.20.1+ print
    # int(max_concurrency x max_model_len); 0.8.x printed num_blocks x block_size.
    # Gemma-3-27B on one H100 at util 0.95 (vLLM 0.19.0): 52 sliding + 10 full layers in groups of 10 ->
    # 6 + 1 = 7 groups; block = 10 layers x 16 tokens x 2 x 16 KV heads x 128 x 2 B = 1,310,720 B.
    gemma = build_spec(load_bundled("google/gemma-3-27b-it"))
    budget = 15_999 * 1_310_720
    p = plan_for_spec(gemma, Options(model="x", gpu="H100", gpu_util=0.95, engine_version="0.19.0",
                                     kv_budget_bytes=budget))
    assert (p.answer.num_blocks, len(p.layout.groups), p.layout.block_bytes) == (15_999, 7, 1_310_720)
    assert p.answer.kv_tokens == 15_999 // 7 * 16 == 36_560
    newer = plan_for_spec(gemma, Options(model="x", gpu="H100", gpu_util=0.95, engine_version="0.20.1",
                                         kv_budget_bytes=budget))
    assert newer.answer.kv_tokens == int(newer.answer.max_concurrency * newer.max_model_len) != 36_560
    # gpt-oss-20b at tp 2: 12 sliding + 12 full layers -> 2 groups of 12; 4 KV heads x 64 per rank:
    # block = 12 x 16 x 2 x 4 x 64 x 2 B = 196,608 B; 323,972 blocks -> 323,972 // 2 x 16 = 2,591,776 tokens.
    oss = build_spec(load_bundled("openai/gpt-oss-20b"))
    q = plan_for_spec(oss, Options(model="x", gpu="H100", tp=2, engine_version="0.19.0",
                                   kv_budget_bytes=323_972 * 196_608))
    assert (q.answer.num_blocks, len(q.layout.groups)) == (323_972, 2)
    assert q.answer.kv_tokens == 2_591_776
    # a single-group model prints num_blocks x block_size in every release that uses the group rule
    llama = build_spec(load_bundled("meta-llama/Llama-3.1-8B-Instruct"))
    r = plan_for_spec(llama, Options(model="x", gpu="H100", engine_version="0.13.0", kv_budget_bytes=GiB))
    assert r.answer.kv_tokens == 512 * 16


def test_rocm_cudagraph_estimate_from_0_26(llama3):
    # gpu_worker (0.18 - 0.25): "Skip on ROCm/HIP as graph pool handles and mem_get_info behave differently";
    # 0.26 includes ROCm (#44825)
    common = dict(spec=llama3, tp=1, max_num_batched_tokens=2048, max_num_seqs=256, act_bytes=2, is_cpu=False)
    rocm = vllm.budget(H100, 0.9, _weights(0), None, None, None, None, version="0.25.0", device=Device("rocm", 304),
                       **common).cudagraph
    assert rocm.bytes == 0 and "ROCm" in rocm.source
    # (Llama on 0.25 - 0.28 runs on the V2 model runner, which estimates no graphs: 0.29 and 0.24 show the rule)
    assert vllm.budget(H100, 0.9, _weights(0), None, None, None, None, version="0.29.0", device=Device("rocm", 304),
                       **common).cudagraph.bytes > 0
    assert vllm.budget(H100, 0.9, _weights(0), None, None, None, None, version="0.24.0", **common).cudagraph.bytes > 0


def test_non_torch_memory_by_release_tp_and_interconnect(llama3):
    # tp 1: 0.30 GiB = round(0.30 x 2**30) = 322,122,547 B. At tp >= 2 the NCCL communicators the release
    # counts: one in 0.11 - 0.25 (torch.distributed's, created lazily by the profile run's all-gather; PyNccl's is in
    # the snapshot), none from 0.26 on CUDA (the all-gather runs on PyNccl too), two before (+ 18 MiB of custom
    # all-reduce buffers). One communicator: 0.41 GiB = 440,234,148 B of channel
    # buffers over NVLink / NVSwitch, 0.05 GiB = 53,687,091 over PCIe, + 288 MiB x tp of NVLS buffers on NVSwitch
    # boards above 2 GPUs; each peer beyond the first adds 0.08 GiB = 85,899,346 B over NVLink-class links (none over
    # PCIe). The rotary cache is the weights' (test_rope_cache_counted_with_the_weights_as_vllm_logs_it), not here.
    common = dict(spec=llama3, max_num_batched_tokens=2048, max_num_seqs=256, act_bytes=2, is_cpu=False)
    rope = 0
    base, chan, nvls, car, peer = 322_122_547, 440_234_148, 288 * MiB, 18 * MiB, 85_899_346
    # above 2 NVLink ranks the pool's fullest rank (a middle one of NCCL's chain) holds one send buffer per channel
    # and communicator more than rank 0: 24 x 2 MiB on Hopper, 24 x 6 MiB on A100s (P2P read)
    fullest, fullest_a100 = 48 * MiB, 144 * MiB
    # V1 takes NCCL's own NVLS sizes: 16 channels x 2 x 1 MiB x the ranks, rounded up to 512 MiB (2.22+: 0.9 on); the
    # low end pays what V0's 288 MiB x tp would add (Budget.nvls_gap_bytes)
    nvls_v1 = 512 * MiB

    def overhead(tp, interconnect, version="0.32", pp=1, cc="9.0"):
        b = vllm.budget(H100, 0.9, _weights(0), None, None, None, None, tp=tp, pp=pp, version=version,
                        device=Device("cuda", 132, interconnect, cc), **common)
        # the model runner's persistent buffers 0.27+ charge (their own tests) are taken out: the NCCL part is here
        buffers = vllm_overhead.charged_runner_buffers(vllm.profile(version), llama3, 2048, 256, 2, Features(), True, [])
        return replace(b.overhead, bytes=b.overhead.bytes - buffers[0]), b.notes

    assert overhead(1, "nvlink-switch")[0].bytes == base + rope
    assert overhead(1, "nvlink-switch")[1] == ()
    term, notes = overhead(2, "nvlink-switch")
    # 0.25+ on an NVSwitch board at tp 2: + FlashInfer's mnnvl fusion workspace, T = min(64 MiB // (4096 x 2), 2048)
    # = 2048 tokens; one multicast buffer of 3 x two-shot (2 x 1024 x 2 x 4096 x 2 = 16 MiB) = 48 MiB -> 512 MiB
    assert term.bytes == base + 512 * MiB + rope
    assert "no NCCL communicator at tp 2" in term.source and term.source.startswith("estimate")
    assert notes and "is an estimate" in notes[0] and "--overhead-gib" in notes[0]
    assert "fusion workspace" in term.source and any("--enforce-eager" in n for n in notes)
    assert overhead(8, "nvlink-switch")[0].bytes == base + 512 * MiB + rope
    # 0.11 - 0.25: torch.distributed's communicator, its NVLS buffers and the fullest rank's send buffers
    assert overhead(8, "nvlink-switch", "0.16.0")[0].bytes == base + chan + 6 * peer + nvls_v1 + fullest + rope
    b = vllm.budget(H100, 0.9, _weights(0), None, None, None, None, tp=8, version="0.16.0",
                    device=Device("cuda", 132, "nvlink-switch", "9.0"), **common)
    assert b.nvls_gap_bytes == 8 * nvls - nvls_v1
    # 0.8 (NCCL 2.21): 16 x 2 x 3 MiB x 8 = 768 MiB -> 1 GiB a communicator, two counted; V0 keeps 288 MiB x tp
    from kvplan.engines.vllm import non_torch, profile
    assert non_torch(profile("0.8"), 8, Device("cuda", 132, "nvlink-switch", "9.0")).nvls == 2 * GiB
    assert non_torch(profile("0.7.2"), 8, Device("cuda", 132, "nvlink-switch", "9.0")).nvls == 2 * 8 * nvls
    assert non_torch(profile("0.7.2"), 8, Device("cuda", 132, "nvlink-switch", "9.0")).nvls_gap == 0
    assert "1 NCCL communicator at tp 8 over nvlink-switch" in overhead(8, "nvlink-switch", "0.16.0")[0].source
    # 0.17 - 0.24 (trtllm, FlashInfer 0.6.4 - 0.6.12): each of its three buffers rounded up to 512 MiB, at any tp
    for tp in (2, 4, 8):
        assert (overhead(tp, "nvlink-switch", "0.19.0")[0].bytes
                == base + chan + (tp - 2) * peer + (nvls_v1 + fullest if tp > 2 else 0) + 3 * 512 * MiB + rope)
    # 0.27+ without NVSwitch: the trtllm fallback, 2 MiB granularity (+ a 2 KiB signal pad per buffer): buffer
    # 2 x 2048 x 4096 x 2 = 32 MiB -> 34, flags -> 2, lamport 96 -> 98 MiB; none before 0.27
    assert overhead(2, "nvlink")[0].bytes == base + (34 + 2 + 98) * MiB + rope
    assert overhead(2, "nvlink", "0.26.0")[0].bytes == base + rope
    assert overhead(2, "nvlink", "0.25.0")[0].bytes == base + chan + rope
    assert (overhead(8, "nvlink-switch", "0.10.1")[0].bytes
            == base + 2 * (chan + 6 * peer + nvls_v1 + fullest) + car + rope)
    # 8 x A100 40GB (NVSwitch, no NVLS), V0 0.7.1, two communicators: 0.30 + 2 x (0.41 + 6 x 0.08) + 18 MiB = 2.10
    # GiB, the non-torch memory vllm-f3706561278's log charges on rank 0; its fullest rank 2 x 144 MiB more
    assert abs(overhead(8, "nvlink", "0.7.1", cc="8.0")[0].bytes - rope - 2 * fullest_a100 - 2.10 * GiB) < 0.01 * GiB
    # above one node of 8 GPUs neither the per-peer buffers nor NVLS grow (peers on other nodes use the network)
    assert overhead(16, "nvlink-switch", "0.10.1")[0].bytes == overhead(8, "nvlink-switch", "0.10.1")[0].bytes
    assert overhead(4, "nvlink", "0.25.0")[0].bytes == base + chan + 2 * peer + fullest + rope
    assert overhead(4, "nvlink", "0.26.0")[0].bytes == base + rope
    assert overhead(2, "pcie", "0.25.0", cc="8.0")[0].bytes == base + 53_687_091 + rope
    assert overhead(2, "pcie")[0].bytes == base + (34 + 2 + 98) * MiB + rope  # 0.27+'s trtllm fallback
    assert overhead(4, "pcie", "0.6.6")[0].bytes == base + 2 * 53_687_091 + rope  # custom all-reduce off on > 2 PCIe;
    # no per-peer term over PCIe
    assert overhead(2, None, "0.25.0", cc=None)[0].bytes == base + chan + rope  # unknown GPU: nvlink, no fusion
    # no fusion workspace before 0.17, at pp > 1, or below compute capability 9.0
    assert overhead(2, "nvlink-switch", "0.16.0")[0].bytes == base + chan + rope
    assert overhead(2, "nvlink-switch", pp=2)[0].bytes == base + rope
    assert overhead(2, "nvlink-switch", "0.25.0", cc="8.0")[0].bytes == base + chan + rope
    # 0.8.0 - 0.9.0 and 0.6.4 charge all non-torch memory: the CUDA context too
    assert overhead(1, "pcie", "0.8.5")[0].bytes == base + round(0.15 * GiB) + rope


def test_non_torch_parts_sum_to_the_term_and_each_has_its_rule(llama3):
    # Every release x tp x board: the named parts add up to what the plan charges; NVLS only on NVSwitch above 2
    # GPUs; the fusion workspace only from 0.17 at capability 9.0 / 10.x - trtllm on NVSwitch to 0.24, mnnvl
    # from 0.25, trtllm without NVSwitch from 0.27 - each buffer a whole number of its granularity (512 MiB with
    # multicast, 2 MiB without) and none smaller than the bytes it must hold.
    from kvplan.engines.vllm import (
        FUSION_MULTICAST_GRANULARITY_BYTES,
        PROFILES,
        fusion_backend,
        fusion_buffer_bytes,
        non_torch,
        profile,
    )

    for version in PROFILES:
        p = profile(version)
        for tp in (1, 2, 4, 8):
            for board in ("nvlink-switch", "nvlink", "pcie", None):
                for cc in ("9.0", "10.0", "8.0"):
                    device = Device("cuda", 132, board, cc)
                    nt = non_torch(p, tp, device, 1, llama3, 8192)
                    assert sum(size for _, size in nt.parts()) == nt.bytes
                    # 0.26+ on CUDA counts no communicator (the profile's all-gathers run on PyNccl)
                    assert nt.counted == (0 if tp == 1 else 0 if p.first >= (0, 26, 0) else
                                          1 if p.first >= (0, 11, 0) else 2), (version, tp)
                    assert (nt.nvls > 0) == (board == "nvlink-switch" and tp > 2 and nt.counted > 0)
                    if tp > 2 and nt.counted:  # one communicator's channel buffers grow with its peers, except over PCIe
                        fewer = non_torch(p, tp // 2, device, 1, llama3, 8192)
                        assert (nt.channels > fewer.channels) == (board != "pcie")
                    backend = fusion_backend(p, tp, 1, device)
                    switch = board == "nvlink-switch"
                    expected = (None if p.first < (0, 17, 0) or tp == 1 or cc == "8.0" else
                                ("mnnvl" if p.first >= (0, 25, 0) else "trtllm") if switch else
                                "trtllm" if p.first >= (0, 27, 0) else None)
                    assert backend == expected, (version, tp, board, cc)
                    assert (nt.fusion > 0) == (backend is not None)
                    if backend:
                        grain = FUSION_MULTICAST_GRANULARITY_BYTES if switch else 2 * MiB
                        parts = fusion_buffer_bytes(backend, switch, llama3.hidden_size, tp, 8192, device.capability)
                        # 0.25 only: the quant fusion's own trtllm workspace beside mnnvl's
                        quant = fusion_buffer_bytes("trtllm", switch, llama3.hidden_size, tp, 8192, device.capability) \
                            if backend == "mnnvl" and version == "0.25" else ()
                        assert sum(parts) + sum(quant) == nt.fusion and all(b % grain == 0 for b in parts + quant)
                        assert len(parts) == (1 if backend == "mnnvl" else 3)
                        if backend == "trtllm":
                            assert parts[2] >= 3 * (parts[0] - grain)  # the lamport buffers: 3 x the buffer


def test_the_catalogue_carries_interconnect_and_sm_count():
    from kvplan.gpus import find_gpu
    from kvplan.planning.gpu import resolve_gpu

    assert (find_gpu("h100").interconnect, find_gpu("h100").sm_count) == ("nvlink-switch", 132)
    assert find_gpu("h100-pcie").interconnect == "pcie" and find_gpu("a100").interconnect == "nvlink"
    assert find_gpu("mi300x").interconnect == "infinity-fabric"
    assert resolve_gpu(Options(model="x", gpu="mi300x")).device == Device("rocm", 304, "infinity-fabric")
    assert resolve_gpu(Options(model="x", gpu=None, gpu_memory_bytes=GiB)).device == Device("cuda", None, None)


def test_vllm_on_rocm_says_its_non_torch_memory_is_not_modelled(llama31):
    # hipBLASLt's loaded kernels are charged by V0's profiler and by V1's (its non-torch increase) alike
    rocm = plan_for_spec(llama31, Options(model=llama31.model_id, gpu="MI300X", engine_version="0.6.3", context=4096))
    cuda = plan_for_spec(llama31, Options(model=llama31.model_id, gpu="H100", engine_version="0.6.3", context=4096))
    v1 = plan_for_spec(llama31, Options(model=llama31.model_id, gpu="MI300X", engine_version="0.11.0", context=4096))
    for plan in (rocm, v1):
        assert any("vLLM on ROCm" in n and "hipBLASLt" in n and "--overhead-gib" in n for n in plan.budget.notes)
    assert not any("on ROCm" in n for n in cuda.budget.notes)


# ---------------------------------------------------------------------------------------------
# SGLang's sliding-window models: the pool it allocates, not vLLM's windowed groups


def _windowed_bundled_specs():
    from kvplan.model.modelspec import LayerKind
    from kvplan.model.sources import bundled_ids

    out = []
    for model_id in bundled_ids():
        spec = build_spec(load_bundled(model_id))
        if any(x.kind in (LayerKind.SLIDING, LayerKind.CHUNKED) for x in spec.layers):
            out.append(spec)
    return out


@pytest.mark.parametrize("version", ["0.4.9", "0.4.10", "0.5.3", "0.5.8", "0.5.20"])
def test_sglang_never_plans_more_than_its_full_token_pool_on_a_windowed_model(version):
    """Every bundled sliding / chunked-window model on SGLang: every request holds each of its tokens in the
    full-attention pool (the hybrid SWA pool's full_layer_tokens) or, without the hybrid pool, in every layer, so no
    answer line (max context, concurrency, fits, spare tokens) goes past max_total_num_tokens; without the hybrid pool
    the pool is the budget over every layer's bytes per token (no window)."""
    from kvplan import memory
    from kvplan.model.modelspec import LayerKind

    specs = _windowed_bundled_specs()
    assert len(specs) >= 8  # Gemma 2 / 3, gpt-oss, Mistral v0.1, Llama 4, ...
    hybrids = 0
    for spec in specs:
        for context in (4096, 32768):
            try:
                plan = plan_for_spec(spec, Options(model=spec.model_id, gpu="H200", engine="sglang", engine_version=version,
                                                   context=context, max_model_len=131072 if spec.max_position_embeddings
                                                   and spec.max_position_embeddings >= 131072 else None,
                                                   tp=8 if spec.parameters_read(1) > 60e9 else 1), suggest=False)
            except Exception as exc:  # noqa: BLE001 - a model the GPU cannot plan at all says so
                assert "InputError" in type(exc).__name__ or "Error" in type(exc).__name__
                continue
            a, tokens = plan.answer, plan.answer.kv_tokens
            where = f"{spec.model_id} sglang {version} at {context}"
            assert a.max_context_at_batch <= tokens, where
            assert a.max_requests * context <= tokens, where
            if a.fits:
                assert a.batch * context <= tokens, where
            assert plan.demand.blocks(context) >= context, where  # every token in the full pool
            if plan.layout.swa_ratio:
                hybrids += 1
                assert sglang.hybrid_swa(plan.engine, spec, plan.gpu.device)
                lines = sglang.log_lines(plan.launch)
                assert f"full_layer_tokens={tokens}, swa_layer_tokens={sglang.swa_tokens(tokens)}" in " ".join(lines)
            else:
                assert all(x.kind not in (LayerKind.SLIDING, LayerKind.CHUNKED) for g in plan.layout.groups
                           for x in (g.cache,)), where
                layers = memory.full_length_layers(plan.rank_layers)
                assert tokens == sglang.max_total_num_tokens(plan.budget.kv_budget_bytes,
                                                     sglang.cell_size_bytes(layers, plan.layout.kv_dtype)), where
    assert hybrids or version in ("0.4.9", "0.5.3")


def test_sglang_hybrid_swa_pool_by_architecture_and_release():
    """Which models get SGLang's hybrid SWA pool (read in the wheels): Gemma 3 in 0.4.10.x only, gpt-oss from 0.5.8
    (not on compute capability 10 in 0.5.8 - 0.5.9), Mistral v0.1 (every layer sliding) never."""
    def hybrid(model_id, version, cc=None):
        spec = build_spec(load_bundled(model_id))
        engine = sglang.defaults(sglang.resolve_version(version)[0], 80 * GiB, False)
        from dataclasses import replace

        engine = replace(engine, requested_version=version)
        return sglang.hybrid_swa(engine, spec, Device(compute_capability=cc))

    assert [hybrid("google/gemma-3-27b-it", v) for v in ("0.4.9", "0.4.10", "0.5.3", "0.5.20")] == \
        [False, True, False, False]
    assert [hybrid("openai/gpt-oss-120b", v) for v in ("0.5.3", "0.5.7", "0.5.8", "0.5.20")] == [False, False, True, True]
    assert not hybrid("openai/gpt-oss-120b", "0.5.9", "10.0") and hybrid("openai/gpt-oss-120b", "0.5.10", "10.0")
    assert not any(hybrid("mistralai/Mistral-7B-v0.1", v) for v in ("0.4.10", "0.5.20"))


def test_sglang_hybrid_swa_request_holds_every_token_in_the_full_pool_and_its_window_in_the_other():
    """gpt-oss-120b on an H100, SGLang 0.5.20: 71,179 full-layer tokens (the budget over 18 full + 0.8 x 18 sliding
    layers' bytes per token); one request of 32,768 tokens holds 32,768 of them, so batch 1 runs up to 71,178 (the pool
    less SGLang's one token); a short request's window binds in the sliding pool: 129 tokens / 0.8."""
    spec = build_spec(load_bundled("openai/gpt-oss-120b"))
    plan = plan_for_spec(spec, Options(model=spec.model_id, gpu="H100", engine="sglang", context=32768), suggest=False)
    per_token = 18 * 8 * 64 * 2 * 2  # full layers: 8 kv heads x 64 x K,V x bf16 = 36,864 B
    assert plan.layout.block_bytes == per_token + int(0.8 * per_token)
    assert plan.answer.kv_tokens == plan.budget.kv_budget_bytes // plan.layout.block_bytes
    assert plan.answer.max_context_at_batch == plan.answer.kv_tokens - 1
    assert plan.demand.blocks(32768) == 32768
    window = plan.demand.blocks(100)  # min(128 - 1 + chunk, 100) + 1 = 101 sliding tokens, / 0.8
    assert window == -(-101 * 10 // 8)


# ---------------------------------------------------------------------------------------------
# --kv-cache-dtype: each engine's own spellings per release; a dtype it has none for is a what-if


# each release's --kv-cache-dtype choices as its arg parser lists them (read in the wheels)
ENGINE_KV_CHOICES = {
    ("vllm", "0.6.3"): {"auto", "fp8", "fp8_e4m3", "fp8_e5m2"},
    ("vllm", "0.10.2"): {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"},
    ("vllm", "0.11.0"): {"auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"},
    ("vllm", "0.17.0"): {"auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"},
    ("vllm", "0.33.0"): {"auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"},
    ("sglang", "0.4.0"): {"auto", "fp8_e5m2"},
    ("sglang", "0.4.9"): {"auto", "fp8_e5m2", "fp8_e4m3"},
    ("sglang", "0.5.3"): {"auto", "fp8_e5m2", "fp8_e4m3"},
    ("sglang", "0.5.20"): {"auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"},
}
KVPLAN_KV_DTYPES = ("auto", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "int4")


@pytest.mark.parametrize("engine_name,version", sorted(ENGINE_KV_CHOICES))
def test_launch_lines_only_name_kv_dtypes_the_engine_takes(engine_name, version, llama3):
    """Every engine release x every kvplan KV dtype: the launch line's --kv-cache-dtype is one of the release's own
    choices, or there is no launch line at all and a note says the dtype is a what-if the engine cannot run; the
    JSON's serve_command agrees."""
    import re

    choices = ENGINE_KV_CHOICES[(engine_name, version)]
    what_ifs = 0
    for kv in KVPLAN_KV_DTYPES:
        plan = plan_for_spec(llama3, Options(model=llama3.model_id, gpu="H100", engine=engine_name,
                                             engine_version=version, kv_dtype=kv), suggest=False)
        command = plan.serve_command
        assert plan.to_dict()["engine_report"]["serve_command"] == command
        notes = [n for n in plan.notes if "what-if" in n]
        if command is None:
            what_ifs += 1
            assert len(notes) == 1 and f"--kv-dtype {plan.kv_dtype}" in notes[0], (version, kv, plan.notes)
            continue
        assert not notes, (version, kv)
        flag = re.search(r"--kv-cache-dtype (\S+)", command)
        if flag:
            assert flag.group(1) in choices, (engine_name, version, kv, command)
        else:
            assert plan.kv_dtype == plan.model_dtype, (engine_name, version, kv, command)
    assert what_ifs >= 2  # int8 and int4 in every release



def test_sglang_swa_flags_resize_the_hybrid_pool_as_sglang_does():
    """--swa-full-tokens-ratio r: full tokens = budget / (full bytes + r x sliding bytes per token), the sliding pool r
    x that, and the launch line passes it; --disable-hybrid-swa-memory: one pool of full layers (budget / every
    layer's bytes). On a model without the hybrid pool, a note says the flag changes nothing; vLLM refuses them."""
    from kvplan import memory
    from kvplan.errors import InputError as Refused

    spec = build_spec(load_bundled("openai/gpt-oss-120b"))
    base = Options(model=spec.model_id, gpu="H100", engine="sglang", context=32768)
    half = plan_for_spec(spec, Options(**{**base.__dict__, "swa_full_tokens_ratio": 0.5}), suggest=False)
    per_token = 18 * 8 * 64 * 2 * 2
    assert half.layout.block_bytes == per_token + per_token // 2
    assert half.answer.kv_tokens == half.budget.kv_budget_bytes // half.layout.block_bytes
    assert f"swa_layer_tokens={int(half.answer.kv_tokens * 0.5)}" in " ".join(sglang.log_lines(half.launch))
    assert "--swa-full-tokens-ratio 0.5" in half.serve_command
    off = plan_for_spec(spec, Options(**{**base.__dict__, "disable_hybrid_swa_memory": True}), suggest=False)
    assert off.answer.kv_tokens == sglang.max_total_num_tokens(
        off.budget.kv_budget_bytes, sglang.cell_size_bytes(memory.full_length_layers(off.rank_layers), off.layout.kv_dtype))
    assert off.answer.kv_tokens < half.answer.kv_tokens and "--disable-hybrid-swa-memory" in off.serve_command
    mistral = build_spec(load_bundled("mistralai/Mistral-7B-v0.1"))
    plan = plan_for_spec(mistral, Options(model=mistral.model_id, gpu="H100", engine="sglang", swa_full_tokens_ratio=0.5),
                         suggest=False)
    assert any("no hybrid SWA pool" in n and "no effect" in n for n in plan.notes)
    with pytest.raises(Refused, match="SGLang's"):
        plan_for_spec(spec, Options(model=spec.model_id, gpu="H100", disable_hybrid_swa_memory=True), suggest=False)


def test_vllm_0_25_takes_the_mnnvl_fusion_workspace_on_one_node_and_a_trtllm_one_for_quant_fusion():
    # _resolve_fi_ar_backend (flashinfer_all_reduce.py): 0.24.0's "auto" takes trtllm on one node (three buffers
    # of 512 MiB on an NVSwitch board, the quant fusion reusing them); 0.25.0's mnnvl (one 512 MiB multicast
    # buffer), and get_fi_ar_quant_workspace "always uses trtllm": three more (AllReduceFusionPass.__init__ makes
    # both for every model); 0.26 gives the quant fusion the mnnvl workspace itself
    import kvplan

    def fusion(version):
        p = kvplan.estimate("Qwen/Qwen3-32B", gpu="H100", tp=2, engine_version=version)
        return p.engine.version, p.budget.overhead.source

    assert fusion("0.24.1")[0] == "0.21" and "1,536 MiB (FlashInfer trtllm)" in fusion("0.24.1")[1]
    assert fusion("0.25.1")[0] == "0.25" and "2,048 MiB (FlashInfer mnnvl + the quant fusion's trtllm)" in \
        fusion("0.25.1")[1]
    assert fusion("0.26.0")[0] == "0.26" and "512 MiB (FlashInfer mnnvl)" in fusion("0.26.0")[1]


def test_v0_keeps_long_prefills_whole_with_lora_or_a_speculative_model():
    # EngineArgs (0.6 - 0.7.x): the > 32K auto-chunking needs `not self.enable_lora` and no speculative model
    import kvplan

    def batch(**kw):
        return kvplan.estimate("meta-llama/Llama-3.1-8B-Instruct", gpu="H100", engine_version="0.6.6",
                               max_model_len=65536, **kw).engine.max_num_batched_tokens

    assert batch() == 2048
    assert batch(enable_lora=True) == batch(speculative="ngram") == 65536
    assert batch(enable_lora=True, chunked_prefill=True) == 2048  # the user's switch still wins


def test_the_v2_model_runner_of_0_25_to_0_28_subtracts_no_cuda_graph_estimate():
    # VllmConfig.use_v2_model_runner (0.25 - 0.28): a generating model that is neither MoE nor hybrid, or a listed
    # architecture, runs on the V2 model runner, whose profile_cudagraph_memory returns 0; 0.24 and 0.29 estimate
    import kvplan
    from kvplan.engines.vllm import profile
    from kvplan.engines.vllm_releases import runs_v2_model_runner

    def graphs(model, version, **kw):
        return kvplan.estimate(model, gpu="H100", engine_version=version, **kw).budget.cudagraph

    dense = "meta-llama/Llama-3.1-8B-Instruct"
    assert graphs(dense, "0.24.0").bytes > 0 and graphs(dense, "0.29.0").bytes > 0
    off = graphs(dense, "0.27.1")
    assert off.bytes == 0 and "V2 model runner" in off.source
    assert graphs("Qwen/Qwen3-30B-A3B", "0.27.1").bytes > 0  # MoE, not listed: the V1 runner
    assert graphs(dense, "0.27.1", speculative="ngram").bytes > 0  # the V2 runner lacks ngram drafting
    assert graphs(dense, "0.27.1", pp=2).bytes > 0  # kvplan keeps its estimate at pp > 1 (an unexplained gap)
    p25, p27 = profile("0.25.0"), profile("0.27.0")
    assert runs_v2_model_runner(p25, "Qwen2MoeForCausalLM", True, False, False, None)  # listed MoE
    assert not runs_v2_model_runner(p25, "Qwen3NextForCausalLM", True, True, False, None)
    assert not runs_v2_model_runner(p25, "KimiK3ForConditionalGeneration", True, True, False, None)
    assert runs_v2_model_runner(p27, "KimiK3ForConditionalGeneration", True, True, False, None)
    assert not runs_v2_model_runner(p27, "MambaForCausalLM", False, True, True, None)  # attention-free


def test_the_v2_model_runner_samples_its_dummy_run_greedily(llama31):
    # 0.25 - 0.28, _dummy_sampler_run on default request states: no fp32 copy, no top-k / top-p; the peak is the
    # logits (1,024 x 128,256 x 2 B at tp 1) beside the batch's and the sampled rows' hidden states
    h100 = Device("cuda", 132, "nvlink-switch")
    tp1 = 1024 * 128_256 * 2 + (8192 + 1024) * 4096 * 2
    assert vllm.sampler_peak_bytes(llama31, 1024, 2, 8192, "v2-greedy") == tp1
    assert vllm.activation_parts(llama31, 1, 8192, 1024, 2, "0.27.1", h100)[1] == tp1
    # tp 2: the all-gather holds this rank's half, the gathered [2, rows, vocab / 2] and the reshaped copy
    tp2 = 1024 * 64_128 * 2 + 2 * 1024 * 128_256 * 2 + (8192 + 1024) * 4096 * 2
    assert vllm.activation_parts(llama31, 2, 8192, 1024, 2, "0.27.1", h100)[1] == tp2
    # the V1 runner (0.24, or a MoE 0.27 does not list) keeps the FlashInfer top-k / top-p path, far larger
    assert vllm.activation_parts(llama31, 1, 8192, 1024, 2, "0.24.0", h100)[1] > 2 * tp1


def test_the_v2_model_runner_sampler_states_are_consumed_memory_from_0_27(llama31):
    # sample/penalties.py output_bin_counts [max_num_reqs, vocab] int32 + prompt_bin_mask and the grammar bitmask
    # over vocab / 32 words + the fixed-width tables (4,481 elements), made after the weights are measured
    from kvplan.engines.vllm_overhead import v2_sampler_state_bytes
    per_request = (128_256 + 2 * 4_008 + 4_481) * 4
    assert v2_sampler_state_bytes(128_256, 1024) == 1024 * per_request
    assert v2_sampler_state_bytes(128_256, 256, 3) == 256 * (per_request + 3 * 4_008 * 4)


def test_a_0_27_plan_charges_the_v2_sampler_states_on_the_last_stage_only():
    import kvplan
    from kvplan.engines.vllm_overhead import v2_sampler_state_bytes

    def overhead(model, **kw):
        return kvplan.estimate(model, gpu="H100", engine_version="0.27.1", **kw)

    dense = overhead("meta-llama/Llama-3.1-8B-Instruct")
    states = v2_sampler_state_bytes(128_256, dense.engine.max_num_seqs)
    assert "sampler states" in dense.budget.overhead.source
    # 0.25 - 0.26 charge the torch peak's increase during the profile, which these are made before: not charged,
    # and the plan says the GPU holds them above gpu_memory_utilization
    earlier = kvplan.estimate("meta-llama/Llama-3.1-8B-Instruct", gpu="H100", engine_version="0.26.0")
    assert dense.budget.overhead.bytes - earlier.budget.overhead.bytes == states
    assert any("does not charge" in n for n in earlier.budget.notes)
    moe = overhead("Qwen/Qwen3-30B-A3B")  # not listed: the V1 model runner, no such states
    assert "sampler states" not in moe.budget.overhead.source
    staged = overhead("meta-llama/Llama-3.1-8B-Instruct", pp=2)
    first, last = (s.budget.overhead for s in staged.stages)
    assert last.bytes - first.bytes == states and "sampler states" not in first.source


def test_the_0_25_v2_sampler_copies_the_logits_to_fp32_first(llama31):
    # 0.25's apply_sampling_params copies the logits to fp32 before any processing; 0.26 works in place
    h100 = Device("cuda", 132, "nvlink-switch")
    hidden = (8192 + 1024) * 4096 * 2
    assert vllm.activation_parts(llama31, 1, 8192, 1024, 2, "0.25.0", h100)[1] == \
        1024 * 128_256 * 2 + 1024 * 128_256 * 4 + hidden
    assert vllm.activation_parts(llama31, 1, 8192, 1024, 2, "0.26.0", h100)[1] == 1024 * 128_256 * 2 + hidden
    # at tp 4 the fp32 copy (4 B an element) outweighs the gather's transient slice and copy (2.5 B)
    assert vllm.activation_parts(llama31, 4, 8192, 1024, 2, "0.25.0", h100)[1] == \
        1024 * 128_256 * 2 + 1024 * 128_256 * 4 + hidden


def test_rocm_keeps_the_sparse_mla_models_on_the_v1_runner_in_0_29_to_0_31():
    # VllmConfig.use_v2_model_runner (0.29 - 0.31): ROCM_DEFAULT_MRV1_ARCHITECTURES stay on the V1 model runner
    from kvplan.engines.vllm_releases import runs_v2_model_runner

    p29, p33 = vllm.profile("0.29.0"), vllm.profile("0.33.0")
    assert runs_v2_model_runner(p29, "DeepseekV32ForCausalLM", True, False, False, None, "cuda")
    assert not runs_v2_model_runner(p29, "DeepseekV32ForCausalLM", True, False, False, None, "rocm")
    assert runs_v2_model_runner(p29, "LlamaForCausalLM", False, False, False, None, "rocm")
    assert runs_v2_model_runner(p33, "DeepseekV32ForCausalLM", True, False, False, None, "rocm")  # 0.32 dropped it
    assert not runs_v2_model_runner(p33, "LlamaForCausalLM", False, False, False, "ngram", "cuda")  # V2 lacks ngram
