"""vLLM's profile run around the decoder: rotary tables and a multimodal model's dummy batch (Gemma 3, Qwen-VL).

Hand-derived from vLLM's code (kvplan/engines/vllm_profile.py names the functions) and checked against
the Gemma-3-27B start-up numbers of issue 15 (vLLM 0.19.0, one H100, util 0.95: 15,999 blocks).
"""

from __future__ import annotations

import pytest

from kvplan.engines import Device, Term, vllm
from kvplan.engines.vllm_overhead import rope_cache_bytes
from kvplan.engines.vllm_profile import image_profile
from kvplan.engines.vllm_weights import deepstack_buffer_bytes
from kvplan.memory import num_blocks
from kvplan.planning.plan import Options, plan_for_spec
from kvplan.model.sources import load_bundled
from kvplan.model.spec import build_spec, spec_from_config

H100 = 85_045_477_376  # the catalogue's CUDA total of an H100 SXM
H100_DEVICE = Device("cuda", 132, "nvlink-switch")
GEMMA3_27B_CHECKPOINT = 54_864_813_280  # the bundled spec's bytes (27,432,406,640 params x 2, vision tower included)


@pytest.fixture(scope="module")
def gemma3():
    return build_spec(load_bundled("google/gemma-3-27b-it"))


def test_gemma3_has_a_local_and_a_scaled_global_rope_table(gemma3):
    # sliding layers: rope_local_base_freq, unscaled: 131,072 rows; full layers: linear factor 8 -> 1,048,576 rows
    assert sorted((t.positions, t.rotary_dim) for t in gemma3.rotary_caches) == [(131_072, 128), (1_048_576, 128)]
    # (131,072 + 1,048,576) x 128 x 2 B = 301,989,888 (288 MiB; 32 MiB before the scaling and the second table)
    assert rope_cache_bytes(gemma3, 2) == 301_989_888


@pytest.mark.parametrize(("rope", "extra", "positions", "dim"), [
    ({"rope_type": "linear", "factor": 4.0}, {}, 4 * 8192, 128),
    ({"rope_type": "dynamic", "factor": 2.0}, {}, 2 * 8192, 128),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}, {}, 16_384, 128),
    ({"rope_type": "longrope", "original_max_position_embeddings": 4096, "short_factor": [1.0], "long_factor": [1.0]},
     {}, 4096 + 8192, 128),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 2048}, {}, 8192, 128),
    (None, {"partial_rotary_factor": 0.25}, 8192, 32),
])
def test_rope_rows_follow_vllms_rope_classes(rope, extra, positions, dim):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 1024,
              "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 2048, "vocab_size": 1000,
              "max_position_embeddings": 8192, "rope_scaling": rope, **extra}
    spec = spec_from_config(config, model_id="t", where="t")
    assert [(t.positions, t.rotary_dim) for t in spec.rotary_caches] == [(positions, dim)]


def test_image_profile_of_gemma3_follows_each_release(gemma3):
    # 0.13+: items = 8,192 // 256 embeddings = 32; pixels 32 x 3 x 896 x 896 x 2 B = 154,140,672;
    # cached outputs 32 x 256 x 5,376 x 2 B = 88,080,384; encoder peak: pixels + 32 x 4,096 patches x
    # (2 x 1,152 + 2 x 4,304) x 2 B = 154,140,672 + 2,860,515,328 = 3,014,656,000
    p = image_profile(gemma3, 1, 8192, 1024, 2, "embeds")
    assert (p.items, p.pixel_bytes, p.cached_bytes, p.encoder_peak_bytes) == (32, 154_140_672, 88_080_384, 3_014_656_000)
    # 0.9 - 0.12 count the prompt tokens of an image (256 + 4 markers): 8,192 // 260 = 31 (the 0.11 log says 31)
    p = image_profile(gemma3, 1, 8192, 1024, 2, "placeholder")
    assert (p.items, p.cached_bytes) == (31, 31 * 256 * 5376 * 2)
    # 0.11 copies each output into an encoder-budget buffer, 31 x 8,192 x 5,376 x 2 B = 2,730,491,904, and the
    # copy loop's variable still holds the outputs, 31 x 256 x 5,376 x 2 B = 85,327,872
    assert image_profile(gemma3, 1, 8192, 1024, 2, "scattered").cached_bytes == 2_730_491_904 + 85_327_872
    # 0.12 into a buffer of the item's 260 tokens: 31 x 260 x 5,376 x 2 B = 86,661,120, + the outputs
    assert image_profile(gemma3, 1, 8192, 1024, 2, "scattered-item").cached_bytes == 86_661_120 + 85_327_872
    # 0.8: cdiv(8,192, 260) = 32
    assert image_profile(gemma3, 1, 8192, 1024, 2, "ceil-placeholder").items == 32
    # tp 2 halves the encoder MLP's intermediate: (2 x 1,152 + 2 x 2,152) x 2 B per patch
    assert image_profile(gemma3, 2, 8192, 1024, 2, "embeds").encoder_peak_bytes == 154_140_672 + 131_072 * 6_608 * 2
    assert image_profile(gemma3, 1, 8192, 1024, 2, "none") is None  # V0 is not modelled
    assert vllm.image_profile_for(gemma3, 1, 8192, 1024, 2, "0.6.4") is None
    assert vllm.image_profile_for(gemma3, 1, 8192, 1024, 2, "0.11.0").rule == "scattered"
    assert vllm.image_profile_for(gemma3, 1, 8192, 1024, 2, "0.12.0").rule == "scattered-item"
    assert vllm.image_profile_for(gemma3, 1, 8192, 1024, 2, "0.13.0").rule == "embeds"


def test_text_only_models_have_no_image_profile():
    llama = build_spec(load_bundled("meta-llama/Llama-3.1-8B-Instruct"))
    assert llama.vision is None and image_profile(llama, 1, 8192, 1024, 2, "embeds") is None


def test_gemma3_27b_on_one_h100_under_0_19(gemma3):
    # Triton sampler at 1,024 rows of the 262,208 vocab: bf16 logits 537,001,984 + 3 fp32 copies 3,222,011,904
    # + per-SM buffer 132 x 262,208 x 4 = 138,445,824 + hidden states (8,192 + 2 x 1,024) x 5,376 x 2 = 110,100,480
    # = 4,007,560,192; plus the images kept through the text profile (242,221,056) = 4,249,781,248, above the
    # encoder's own 3,014,656,000 and the forward 8,192 x 161,280 = 1,321,205,760.
    b = vllm.budget(H100, 0.95, Term("weights", GEMMA3_27B_CHECKPOINT, "checkpoint"), None, None, None, None,
                    spec=gemma3, tp=1, max_num_batched_tokens=8192, max_num_seqs=1024, act_bytes=2, is_cpu=False,
                    version="0.19.0", device=H100_DEVICE)
    assert b.activation_sampler_bytes == 4_007_560_192
    assert b.activation_images_bytes == 154_140_672 + 88_080_384
    assert b.activation.bytes == 4_249_781_248
    assert "32 dummy images" in b.activation.source
    # overhead: non-torch 0.30 GiB; both rope tables (301,989,888) load with the weights
    assert b.overhead.bytes == vllm.NON_TORCH_BYTES
    assert b.weights.bytes == GEMMA3_27B_CHECKPOINT + 301_989_888


def test_gemma3_27b_h100_within_half_a_percent_of_issue_15s_log(gemma3):
    # The log (issue 15): 15,999 blocks, 7 KV-cache groups of 10 layers, 16-token blocks of 10 x 16 x 2 x 16 x
    # 128 x 2 B = 1,310,720 B; "GPU KV cache size: 36,560 tokens" = 15,999 // 7 x 16. Before the rope tables and
    # the image batch kvplan said 16,469 blocks (+2.9%); now 16,063 (+0.4%): the rest is 0.07 GiB of load-time
    # memory vLLM 0.19.0 logs above checkpoint + rope tables (51.45 GiB on an A100) that kvplan does not model.
    plan = plan_for_spec(gemma3, Options(model=gemma3.model_id, gpu="H100-SXM-80GB", gpu_util=0.95, engine_version="0.19.0",
                                         max_model_len=8192, context=8192))
    blocks = plan.answer.num_blocks
    assert blocks == num_blocks(plan.budget.kv_budget_bytes, plan.layout) == 16_063
    assert abs(blocks - 15_999) / 15_999 < 0.005
    assert plan.answer.kv_tokens == 16_063 // 7 * 16 == 36_704


@pytest.fixture(scope="module")
def qwen25_vl():
    return build_spec(load_bundled("Qwen/Qwen2.5-VL-7B-Instruct"))


@pytest.fixture(scope="module")
def qwen3_vl():
    return build_spec(load_bundled("Qwen/Qwen3-VL-30B-A3B-Instruct"))


def test_qwen_vl_vision_specs_read_the_processor_sizes_and_the_output_width(qwen25_vl, qwen3_vl):
    # Qwen2.5-VL: max_pixels 12,845,056 // 28^2 = 16,384 tokens -> a 3,584 x 3,584 image of (3,584 / 14)^2 =
    # 65,536 patches; vLLM counts its 16,384 embeddings as the item's tokens (no markers)
    v = qwen25_vl.vision
    assert (v.image_size, v.tokens_per_image, v.placeholder_tokens) == (3584, 16_384, 16_384)
    assert v.patches_per_image == 65_536
    assert (v.max_video_frames, v.video_max_pixels, v.output_width) == (14, 0, 0)
    # Qwen3-VL: 16,777,216 // 32^2 = 16,384 tokens of a 4,096 x 4,096 image; the video processor's 25,165,824
    # pixels over all frames; output 2,048 x (1 + 3 deepstack levels) = 8,192 elements per token
    v = qwen3_vl.vision
    assert (v.image_size, v.patch_size, v.tokens_per_image, v.patches_per_image) == (4096, 16, 16_384, 65_536)
    assert (v.max_video_frames, v.video_max_pixels, v.output_width) == (24_576, 25_165_824, 8192)


def test_qwen25_vl_profiles_its_image_until_a_video_has_more_tokens(qwen25_vl):
    # 2,048 of max_model_len: a video of max(1, min(2 x (2,048 // 16,384), 16)) = 1 frame, padded to one pair =
    # 16,384 tokens, a tie: max() keeps the image. Pixels 3 x 2 x 3,584^2 x 2 B = 154,140,672; output 16,384 x
    # 3,584 x 2 B = 117,440,512. Encoder (0.8 - 0.10): the attention's rotary step holds residual and normed
    # input (2 x 1,280), the qkv output (3 x 1,280), q, k, v (3 x 1,280), q in float32 and its rotated float32
    # copy (2 x 2 x 1,280) and the new q (1,280) = 16,640 elements a patch, above the MLP's (2 x 1,280 + 3 x
    # 3,420 = 12,820): pixels + 65,536 x 16,640 x 2 B = 2,181,038,080
    p = image_profile(qwen25_vl, 1, 2048, 256, 2, "placeholder", 2048)
    assert (p.modality, p.items, p.tokens_per_item, p.encoder_budget_tokens) == ("image", 1, 16_384, 16_384)
    assert (p.pixel_bytes, p.cached_bytes) == (154_140_672, 117_440_512)
    assert p.encoder_peak_bytes == 154_140_672 + 2_181_038_080
    # 0.13: the MLP's 12,820 above the attention's 2 x 1,280 + 8 x 1,280 = 12,800: 65,536 x 12,820 x 2 B
    assert image_profile(qwen25_vl, 1, 2048, 256, 2, "embeds", 2048).encoder_peak_bytes == 154_140_672 + 1_680_343_040
    # 0.11 at 8,192: still the image; the 16,384-row output fills the budget buffer, so no copy
    assert image_profile(qwen25_vl, 1, 2048, 256, 2, "scattered", 8192).cached_bytes == 117_440_512
    # 128K on 0.9.2: the budget counts a video within 131,072 - 16,384 (room for one image) = 7 x 16,384: 14
    # frames, 7 pairs = 114,688 tokens, more than the image: the video is profiled, one item. But the dummy
    # itself is built within max_num_tokens = 2,048: 1 frame, one pair (the image's pixels and output).
    p = image_profile(qwen25_vl, 1, 2048, 256, 2, "placeholder", 131_072, (0, 9, 2))
    assert (p.modality, p.items, p.tokens_per_item, p.encoder_budget_tokens) == ("video", 1, 114_688, 114_688)
    assert (p.frames, p.pixel_bytes, p.cached_bytes) == (1, 154_140_672, 117_440_512)
    # 32,768 batched tokens: a dummy of 4 frames = 2 pairs; 0.10.2 counts all 131,072 tokens: 16 frames (the
    # cap before 0.11) = 8 pairs = 131,072
    p = image_profile(qwen25_vl, 1, 32_768, 256, 2, "placeholder", 131_072, (0, 10, 2))
    assert (p.tokens_per_item, p.frames, p.pixel_bytes) == (131_072, 4, 2 * 154_140_672)
    # 0.13 counts and builds the same video from max_model_len: 14 frames (the cap) = 7 pairs = 114,688 tokens
    p = image_profile(qwen25_vl, 1, 2048, 256, 2, "embeds", 131_072, (0, 13, 0))
    assert (p.modality, p.frames, p.tokens_per_item, p.cached_bytes) == ("video", 14, 114_688, 114_688 * 3584 * 2)


def test_qwen3_vl_profiles_one_formatted_video_on_0_11_and_0_12(qwen3_vl):
    # 64K: frames grow from 2 while the video's tokens fit 65,536; its 25,165,824 pixels shrink each frame, to
    # 32 x 32 at 24,576 frames (the cap): sqrt(24,576 x 4,096^2 / 25,165,824) = 128, 4,096 / 128 = 32. Tokens
    # 12,288 groups x (32 / 16)^2 // 4 = 12,288, counted x 12.5 = 153,600 (the log's "budget of 153600 tokens,
    # profiled with 1 video items"). Pixels 49,152 patches x 3 x 2 x 16 x 16 x 2 B = 150,994,944. Cached: a
    # 153,600 x 8,192 x 2 B = 2,516,582,400 buffer + the output 12,288 x 8,192 x 2 B = 201,326,592.
    p = image_profile(qwen3_vl, 4, 2048, 256, 2, "scattered", 65_536)
    assert (p.modality, p.frames, p.items, p.tokens_per_item, p.encoder_budget_tokens) == ("video", 24_576, 1, 153_600,
                                                                                            153_600)
    assert (p.pixel_bytes, p.cached_bytes) == (150_994_944, 2_516_582_400 + 201_326_592)
    # encoder at tp 4: 0.11's rotary step (18 x 1,152 / 4 besides residual and input) above the MLP (2 x 1,152 +
    # 2 x ceil(4,304 / 4) = 4,456), and the 3 deepstack levels' features held, 3 x 2,048 per 4 patches:
    # 49,152 patches x (2,304 + 5,184 + 1,536) x 2 B = 887,095,296, the position embeddings held through the
    # forward (one 1,152-wide vector a patch): 49,152 x 1,152 x 2 B = 113,246,208, + the pixels
    assert p.encoder_peak_bytes == 887_095_296 + 113_246_208 + 150_994_944
    # 0.12 sizes the buffer by the item's 153,600 tokens: the same for one item
    assert image_profile(qwen3_vl, 4, 2048, 256, 2, "scattered-item", 65_536).cached_bytes == p.cached_bytes
    # 8K: 2 frames already exceed it (12,100 tokens: 4,096 / sqrt(2 x 4,096^2 / 25,165,824) = 3,547 -> 3,520,
    # (3,520 / 16)^2 // 4 = 12,100), so the loop stops at 2 frames: 151,250 tokens
    p = image_profile(qwen3_vl, 4, 2048, 256, 2, "scattered", 8192)
    assert (p.frames, p.tokens_per_item, p.pixel_bytes) == (2, 151_250, 48_400 * 1536 * 2)


def test_qwen3_vl_profiles_its_image_from_0_13(qwen3_vl):
    # 0.13+: the video counts its 12,288 output tokens, below the image's 16,384: one 4,096 x 4,096 image,
    # pixels 3 x 2 x 4,096^2 x 2 B = 201,326,592, output 16,384 x 8,192 x 2 B = 268,435,456
    p = image_profile(qwen3_vl, 4, 2048, 256, 2, "embeds", 65_536)
    assert (p.modality, p.items, p.tokens_per_item, p.pixel_bytes, p.cached_bytes) == ("image", 1, 16_384, 201_326_592,
                                                                                       268_435_456)
    # encoder at tp 1: the attention, 2 x 1,152 + 8 x 1,152 = 11,520 elements a patch, above the MLP's 2 x 1,152
    # + 2 x 4,304 = 10,912, + the deepstack features 1,536 + the position embeddings 1,152: 65,536 x 14,208 x 2 B =
    # 1,862,270,976 + the pixels
    assert image_profile(qwen3_vl, 1, 2048, 256, 2, "embeds", 65_536).encoder_peak_bytes == 1_862_270_976 + 201_326_592


def test_qwen3_vl_loads_its_deepstack_buffers_with_the_weights(qwen25_vl, qwen3_vl):
    # one zeros(max_num_batched_tokens, 2,048) per deepstack level, model dtype: 3 x 2,048 x 2,048 x 2 B
    assert deepstack_buffer_bytes(qwen3_vl, 2048, 2) == 25_165_824
    assert deepstack_buffer_bytes(qwen25_vl, 2048, 2) == 0
    b = vllm.budget(H100, 0.9, Term("weights", 10 * 2**30, "checkpoint"), None, None, None, None, spec=qwen3_vl, tp=4,
                    max_num_batched_tokens=8192, max_num_seqs=256, act_bytes=2, is_cpu=False, version="0.11.0",
                    max_model_len=65_536)
    rope = rope_cache_bytes(qwen3_vl, 2)
    assert b.weights.bytes == 10 * 2**30 + 3 * 8192 * 2048 * 2 + rope and "deepstack" in b.weights.source


def test_the_0_9_sources_round_the_encoder_items_up_and_0_10_down(gemma3):
    """gpu_model_runner.profile_run of 0.9.0 - 0.9.2 takes cdiv(encoder_budget, tokens per item); 0.10's
    MultiModalBudget floors it. Gemma 3's image is 260 prompt tokens: 8,192 tokens hold 31.5 of them."""
    assert image_profile(gemma3, 1, 8192, 1024, 2, "placeholder", release=(0, 9, 2)).items == 32
    assert image_profile(gemma3, 1, 8192, 1024, 2, "placeholder", release=(0, 10, 1)).items == 31
    assert image_profile(gemma3, 1, 8192, 1024, 2, "ceil-placeholder", release=(0, 8, 5)).items == 32


@pytest.fixture(scope="module")
def qwen35_9b():
    return build_spec(load_bundled("Qwen/Qwen3.5-9B"))


@pytest.fixture(scope="module")
def qwen36_35b():
    return build_spec(load_bundled("Qwen/Qwen3.6-35B-A3B"))


def test_qwen35_vision_specs_read_as_qwen3_vl_without_deepstack(qwen35_9b, qwen36_35b):
    # qwen3_5 / qwen3_5_moe: Qwen3-VL's processor sizes, 16,777,216 // 32^2 = 16,384 tokens of a 4,096 x 4,096
    # image, (4,096 / 16)^2 = 65,536 patches; deepstack_visual_indexes [] -> the output is out_hidden_size a token
    for spec, out in ((qwen35_9b, 4096), (qwen36_35b, 2048)):
        v = spec.vision
        assert (v.kind, v.image_size, v.patch_size, v.tokens_per_image, v.patches_per_image) == ("qwen-vl", 4096, 16,
                                                                                                16_384, 65_536)
        assert (v.output_width, v.deepstack_levels, v.gated_mlp, v.video_max_pixels) == (out, 0, False, 25_165_824)
        assert "no deepstack" in v.source
        assert deepstack_buffer_bytes(spec, 8192, 2) == 0  # Qwen3_5ForConditionalGeneration makes none
        assert any("profile run of it" in n for n in spec.notes)
        assert not any("not modelled" in n for n in spec.notes if n.startswith("multimodal"))


def test_qwen35_profiles_its_image_on_0_14_and_from_0_17(qwen35_9b):
    # 0.17+: the video is 2 frames of 25,165,824 // 2 // 32^2 = 12,288 = 96 x 128 tokens (3,072 x 4,096 pixels),
    # below the image's 16,384: one image at 8,192 batched tokens (16,384 // 16,384). Pixels 3 x 2 x 4,096^2 x 2 B =
    # 201,326,592; output 16,384 x 4,096 x 2 B = 134,217,728; encoder at tp 1: the attention's 2 x 1,152 + 8 x
    # 1,152 = 11,520 elements a patch (above the MLP's 2 x 1,152 + 2 x 4,304 = 10,912), no deepstack features, the
    # position embeddings 1,152: 65,536 x 12,672 x 2 B = 1,660,944,384 + the pixels
    for version in ("0.17.0", "0.20.0", "0.33.0"):
        p = vllm.image_profile_for(qwen35_9b, 1, 8192, 256, 2, version, 262_144)
        assert (p.rule, p.modality, p.items, p.tokens_per_item, p.encoder_budget_tokens) == ("embeds", "image", 1,
                                                                                             16_384, 16_384)
        assert (p.pixel_bytes, p.cached_bytes) == (201_326_592, 134_217_728)
        assert p.encoder_peak_bytes == 1_660_944_384 + 201_326_592
    # 0.14's rules (the 0.16 dev builds of the corpus): the video grows to 24,576 frames of 32 x 32 within
    # 262,144 tokens, 12,288 tokens again: the same image
    assert vllm.image_profile_for(qwen35_9b, 1, 8192, 256, 2, "0.14.0", 262_144) == p
    # tp 2: the attention shard 576 - 2 x 1,152 + 8 x 576 = 6,912 (MLP 2 x 1,152 + 2 x 2,152 = 6,608), + 1,152
    assert image_profile(qwen35_9b, 2, 8192, 256, 2, "embeds", 262_144, (0, 20, 0)).encoder_peak_bytes == (
        201_326_592 + 65_536 * (6_912 + 1_152) * 2)


def test_qwen3_two_frame_video_from_0_17(qwen35_9b):
    from kvplan.engines.vllm_profile import _video_item
    # 12,288 tokens = 96 x 128 -> 1 group of 192 x 256 = 49,152 patches of 3 x 2 x 16 x 16 pixel elements
    video = _video_item(qwen35_9b.vision, "embeds", 262_144, 8192, (0, 17, 0))
    assert (video.frames, video.tokens, video.embeds, video.patches, video.pixels) == (2, 12_288, 12_288, 49_152,
                                                                                        49_152 * 1536)


def test_qwen36_35b_on_a_gb10_at_65536_batched_tokens(qwen36_35b):
    # The GB10 log (vllm 0.20.0, max_num_batched_tokens 65,536): "budget of 65536 tokens, and profiled with 4
    # image items". Pixels 4 x 201,326,592 = 805,306,368; outputs 4 x 16,384 x 2,048 x 2 B = 268,435,456; the
    # encoder over 4 x 65,536 patches x (11,520 + 1,152) x 2 B = 6,643,777,536 + the pixels = 7,449,083,904,
    # above the text peak (the 65,536-token forward 5.04 GiB + the images 1.00 GiB), so it is the activation - on
    # 0.20 and 0.27
    for version in ("0.20.0", "0.27.0"):
        p = vllm.image_profile_for(qwen36_35b, 1, 65_536, 8, 2, version, 262_144)
        assert (p.items, p.encoder_budget_tokens, p.pixel_bytes, p.cached_bytes) == (4, 65_536, 805_306_368,
                                                                                     268_435_456)
        assert p.encoder_peak_bytes == 7_449_083_904
        b = vllm.budget(128 * 2**30, 0.85, Term("weights", 18 * 2**30, "checkpoint"), None, None, None, None,
                        spec=qwen36_35b, tp=1, max_num_batched_tokens=65_536, max_num_seqs=8, act_bytes=2,
                        is_cpu=False, version=version, max_model_len=262_144)
        assert b.activation_images_bytes == 805_306_368 + 268_435_456
        assert b.activation.bytes == 7_449_083_904 and "4 dummy images" in b.activation.source
        assert b.weights.bytes == 18 * 2**30 + rope_cache_bytes(qwen36_35b, 2)  # the rotary table, no deepstack buffers


# --- gpt-oss' MXFP4 experts on Hopper: Triton where triton_kernels is installed, Marlin on a plain wheel -------------


def test_hopper_mxfp4_takes_marlin_without_triton_kernels():
    from kvplan.engines.vllm_weights import loaded_extra_bytes, mxfp4_backend

    assert mxfp4_backend((9, 0)) == "triton" and mxfp4_backend((9, 0), triton_kernels=False) == "marlin"
    assert mxfp4_backend(None, triton_kernels=False) == "marlin"  # the default GPU is an H100
    # triton_kernels does not decide off Hopper: Ampere / Ada always Marlin, Blackwell TRT-LLM
    assert mxfp4_backend((8, 0), triton_kernels=True) == "marlin"
    assert mxfp4_backend((10, 0), triton_kernels=False) == "trtllm"
    spec = build_spec(load_bundled("openai/gpt-oss-120b"))
    # Marlin, one layer of 128 experts (intermediate 2880 -> 2944, hidden 2880 -> 3072, bf16 biases):
    # 128 x (1.5 x 2944 x 3072 + 3 x 2944 x 3072 / 32 + (2 x 2944 + 3072) x 2) = 1,847,263,232 B
    # checkpoint: 128 x (3 x 2880 x 2880 x 17/32 + (2 x 2880 + 2880) x 2) = 1,694,269,440 B
    # 36 layers x 152,993,792 B = 5,507,776,512 B (5.13 GiB; 65.90 GiB with the 60.77 GiB checkpoint, vllm-23278
    # logged 65.97 with the Marlin warning)
    extra, why = loaded_extra_bytes(spec, 1, 1, (0, 11, 0), (9, 0), triton_kernels=False)
    assert extra == 5_507_776_512 and "marlin" in why
    triton, _ = loaded_extra_bytes(spec, 1, 1, (0, 11, 0), (9, 0))
    assert triton < extra


def test_v0_mla_absorbs_q_proj_where_the_model_has_no_q_lora():
    from kvplan.engines.vllm_weights import loaded_extra_bytes

    # DeepSeek-V2-Lite (bf16, no q LoRA: W_Q is q_proj's [hidden 2,048, heads x 192]) at tp 8 on V0 0.7.1, per layer:
    # kv_a_proj_with_mqa [2,048, 512 + 64] and the 64-expert router replicated: (2,048 x 576 x 2 + 64 x 2,048 x 2)
    # x 7/8 = 2,293,760; W_Q_UK [2,048, 2 x 512] + W_UV_O [2 x 512, 2,048] in bf16 = 8,388,608; W_QR [2,048, 2 x 64]
    # bf16 = 524,288; W_UK / W_UV are views of the bf16 kv_b_proj (no copy). 27 layers x 11,206,656 = 302,579,712 B
    # (0.28 GiB; vllm-f3706561278 logged 3.97 GiB where the checkpoint's split + its rotary table is 3.79)
    lite = build_spec(load_bundled("deepseek-ai/DeepSeek-V2-Lite-Chat"))
    assert lite.mla_dims[0] == 0
    assert loaded_extra_bytes(lite, 8, 1, (0, 7, 1), (8, 0))[0] == 27 * (2_293_760 + 8_388_608 + 524_288)
    # from 0.8: the replicated projections and the bf16 W_UK_T / W_UV, 2 x 512 x 2 x (128 + 128) = 524,288 a layer
    assert loaded_extra_bytes(lite, 8, 1, (0, 8, 0), (8, 0))[0] == 27 * (2_293_760 + 524_288)


@pytest.mark.parametrize("version, flashinfer, marlin", [
    ("0.11.0", False, True),   # a plain wheel: neither FlashInfer nor triton_kernels
    ("0.10.1.1", False, True),
    ("0.11.0", None, False),   # unknown installation: the Docker image's Triton backend
    ("0.11.0", True, False),
    ("0.12.0", False, False),  # the sampler no longer depends on the installation: --no-flashinfer says nothing
])
def test_no_flashinfer_on_0_10_to_0_11_plans_the_plain_wheels_marlin_weights(version, flashinfer, marlin):
    spec = build_spec(load_bundled("openai/gpt-oss-120b"))
    plan = plan_for_spec(spec, Options(model="openai/gpt-oss-120b", gpu="H100", engine_version=version,
                                       flashinfer=flashinfer, offline=True))
    assert ("the marlin backend" in plan.budget.weights.source) is marlin
    assert ("the triton backend" in plan.budget.weights.source) is not marlin


@pytest.mark.parametrize("model", ["openai/gpt-oss-120b", "openai/gpt-oss-20b"])
@pytest.mark.parametrize("version", ["0.10.1.1", "0.11.0"])
def test_an_unknown_installation_has_its_low_end_at_or_below_the_plain_wheel(model, version):
    # kvplan plans the Docker image (Triton layout, FlashInfer sampler); a plain wheel loads the Marlin layout and
    # runs the native sampler: the low end must not promise more than the plain wheel's plan
    spec = build_spec(load_bundled(model))
    unknown = plan_for_spec(spec, Options(model=model, gpu="H100", engine_version=version, offline=True))
    wheel = plan_for_spec(spec, Options(model=model, gpu="H100", engine_version=version, flashinfer=False,
                                        offline=True))
    marlin_gap = wheel.budget.weights.bytes - unknown.budget.weights.bytes
    assert marlin_gap > 0 and wheel.budget.path_gap_bytes == 0
    assert unknown.budget.path_gap_bytes >= marlin_gap
    assert unknown.kv_range.kv_budget_low_bytes <= wheel.budget.kv_budget_bytes
    assert any("Marlin on a plain wheel" in n for n in unknown.budget.notes)
    # off Hopper the layout does not depend on the installation: no weights gap
    a100 = plan_for_spec(spec, Options(model=model, gpu="A100-80GB", engine_version=version, offline=True))
    assert not any("Marlin on a plain wheel" in n for n in a100.budget.notes)
