"""The torch block pool: the oracle (tensor storage == memory.pool_bytes for every bundled model kind),
engine-shaped views, slot sharing across groups, and shared-prefix block usage measured on the tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvplan import memory  # noqa: E402
from kvplan.errors import ConfigError  # noqa: E402
from kvplan.paged.allocator import BlockAllocator  # noqa: E402
from kvplan.paged.attention import slot_mapping, write_slots  # noqa: E402
from kvplan.paged.pool import allocate_pool, used_blocks  # noqa: E402
from kvplan.model.sources import bundled_ids, load_bundled  # noqa: E402
from kvplan.model.spec import LayerCache, LayerKind, build_spec  # noqa: E402
from kvplan.units import parse_dtype  # noqa: E402

BF16 = parse_dtype("bf16")


def _specs():
    out = []
    for model_id in bundled_ids():
        try:
            out.append(build_spec(load_bundled(model_id)))
        except ConfigError:  # hybrid (not modelled yet) and encoder-decoder specs have no layout to pool
            continue
    return out


SPECS = _specs()


def test_the_oracle_covers_every_kind_of_bundled_model():
    kinds = {spec.kind_summary for spec in SPECS}
    assert {"gqa", "mha", "mqa", "mla", "sliding", "chunked"} <= kinds
    assert len(SPECS) >= 40


@pytest.mark.parametrize("kv_dtype", [None, "fp8", "int4", "int8", "fp32"])
def test_pool_storage_equals_memory_pool_bytes_for_every_bundled_spec(kv_dtype):
    """The oracle: tensors built from shapes and dtypes hold exactly memory.pool_bytes (tiny pools, CPU)."""
    for spec in SPECS:
        model_dtype = parse_dtype(spec.dtype)
        kv = parse_dtype(kv_dtype) if kv_dtype else model_dtype
        for tp in (1, 2):
            try:
                layers = memory.rank_layers(spec, tp=tp)
            except Exception:  # tp 2 does not divide some models' KV heads
                continue
            layout = memory.pool_layout(layers, 16, kv, model_dtype)
            for blocks in (2, 5):
                pool = allocate_pool(layout, blocks, "cpu", zero=False, check=False)
                assert pool.storage_bytes == memory.pool_bytes(blocks, layout), (spec.model_id, kv.name, tp, blocks)
                assert len(pool.slots) == layout.group_size
                assert len(pool.layers) == layout.num_layers


def _pool(model_id: str, blocks: int, kv_dtype: str | None = None, block_size: int = 16):
    spec = build_spec(load_bundled(model_id))
    model_dtype = parse_dtype(spec.dtype)
    layout = memory.pool_layout(spec.layers, block_size, parse_dtype(kv_dtype) if kv_dtype else model_dtype, model_dtype)
    return layout, allocate_pool(layout, blocks, "cpu")


def test_llama_pool_is_shaped_like_vllm_flash_attention_cache():
    layout, pool = _pool("meta-llama/Llama-3.1-8B", 3)
    # page = 16 tokens x 2 (K, V) x 8 heads x 128 x 2 B = 65,536 B; 32 layers -> block id 2 MiB; 3 blocks = 6 MiB
    assert layout.page_bytes == 65_536 and layout.block_bytes == 2_097_152
    assert pool.storage_bytes == 6_291_456 == memory.pool_bytes(3, layout)
    view = pool.layers[0]
    assert view.tensors["kv"].shape == (2, 3, 16, 8, 128) and view.tensors["kv"].dtype == torch.bfloat16
    assert view.k.shape == (3, 16, 8, 128) and view.k.is_contiguous()


def test_fp8_pool_is_float8_and_half_the_bytes():
    _, bf16 = _pool("meta-llama/Llama-3.1-8B", 3)
    layout, fp8 = _pool("meta-llama/Llama-3.1-8B", 3, "fp8")
    assert fp8.layers[0].tensors["kv"].dtype == torch.float8_e4m3fn
    assert fp8.storage_bytes * 2 == bf16.storage_bytes == 6_291_456


def test_int4_pool_is_packed_bytes_plus_fp16_scales():
    layout, pool = _pool("meta-llama/Llama-3.1-8B", 3, "int4")
    kv, scales = pool.layers[0].tensors["kv"], pool.layers[0].tensors["kv_scales"]
    assert kv.shape == (2, 3, 16, 8, 64) and kv.dtype == torch.uint8  # 128 values, two a byte
    assert scales.shape == (2, 3, 16, 8, 4) and scales.dtype == torch.float16  # 128 / 32 scales
    # per token per layer: 2 x 8 heads x (64 + 4 x 2) B = 1,152 B; page 16 x 1,152 = 18,432 B
    assert layout.page_bytes == 18_432 and pool.storage_bytes == 3 * 32 * 18_432


def test_mla_pool_is_one_latent_per_token():
    layout, pool = _pool("deepseek-ai/DeepSeek-V2-Lite-Chat", 4)
    latent = pool.layers[0].tensors["latent"]
    assert latent.shape == (4, 16, 576) and latent.dtype == torch.bfloat16  # kv_lora_rank 512 + rope 64
    # 16 x 576 x 2 B = 18,432 B a page; 27 layers; 4 blocks
    assert pool.storage_bytes == 4 * 27 * 18_432 == memory.pool_bytes(4, layout)


def test_groups_share_slots_as_vllm_kv_cache_tensors():
    layout, pool = _pool("google/gemma-2-9b-it", 2)
    # 42 layers: 21 sliding + 21 full -> two groups of 21; slot i backs layer i of both groups
    assert layout.group_size == 21 and len(layout.groups) == 2 and len(pool.slots) == 21
    sliding, full = pool.group_layers(0)[3], pool.group_layers(1)[3]
    assert sliding.cache.kind is LayerKind.SLIDING and full.cache.kind is LayerKind.FULL
    assert sliding.k.data_ptr() == full.k.data_ptr()
    sliding.k[1, 0, 0, 0] = 7.0  # block 1 written through the sliding layer is the full layer's block 1
    assert float(full.k[1, 0, 0, 0]) == 7.0


def test_state_layers_get_conv_and_ssm_tensors_padded_to_the_attention_page():
    mamba = LayerCache(LayerKind.MAMBA, conv_elements=3 * 1024, ssm_elements=32 * 64 * 16, state_kind="mamba2",
                       ssm_dtype="float32")
    attn = LayerCache(LayerKind.FULL, kv_heads=8, head_dim=128)
    layout = memory.pool_layout((mamba, mamba, attn, mamba, mamba, attn), 16, BF16, BF16)
    # state = 3,072 x 2 B + 32,768 x 4 B = 137,216 B; attention 2 x 8 x 128 x 2 B = 4 KiB a token:
    # block 16 x ceil(137,216 / (16 x 4,096)) = 48 tokens, page 48 x 4,096 = 196,608 B (state padded up)
    assert layout.block_size == 48 and layout.page_bytes == 196_608 and layout.state_page_bytes == 137_216
    pool = allocate_pool(layout, 5, "cpu")
    state = next(v for v in pool.layers if v.cache.is_state)
    conv, ssm = state.tensors["conv"], state.tensors["ssm"]
    assert conv.shape == (5, 3072) and conv.dtype == torch.bfloat16
    assert ssm.shape == (5, 32_768) and ssm.dtype == torch.float32
    attention = next(v for v in pool.layers if v.cache.kind is LayerKind.FULL)
    assert attention.k.shape == (5, 48, 8, 128)
    assert pool.storage_bytes == memory.pool_bytes(5, layout) == 5 * layout.group_size * 196_608


def test_release_drops_every_tensor():
    _, pool = _pool("meta-llama/Llama-3.2-1B-Instruct", 3)
    pool.release()
    assert pool.slots == [] and pool.layers == [] and pool.storage_bytes == 0


def test_used_blocks_counts_written_blocks_on_the_tensor():
    _, pool = _pool("meta-llama/Llama-3.2-1B-Instruct", 8)
    view = pool.layers[0]
    assert used_blocks(pool) == 0
    write_slots(view.k, slot_mapping([5, 2], range(20), 16), torch.ones(20, 8, 64))  # 20 tokens: blocks 5, 2
    assert used_blocks(pool) == 2


def test_shared_prefix_uses_floor_p_over_bs_fewer_blocks_each_after_the_first():
    """N = 4 requests of L = 100 tokens sharing a P = 40-token prefix, block size 16."""
    layout, pool = _pool("meta-llama/Llama-3.2-1B-Instruct", 64)
    n, length, prefix, bs = 4, 100, 40, 16
    alloc = BlockAllocator(64, bs)
    view = pool.layers[0]
    shared_prefix = list(range(prefix))
    for i in range(n):
        tokens = shared_prefix + [1000 * (i + 1) + t for t in range(length - prefix)]
        hit = alloc.allocate(i, tokens)
        assert hit == (0 if i == 0 else (prefix // bs) * bs)  # floor(40 / 16) = 2 blocks = 32 tokens hit
        # write K/V only for the tokens the engine computes (the hit tokens are already in the pool)
        positions = range(hit, length)
        values = torch.randn(len(positions), 8, 64) + 1.0
        write_slots(view.k, slot_mapping(alloc.block_table(i), positions, bs), values)
    per_request = -(-length // bs)  # ceil(100 / 16) = 7
    saved = prefix // bs  # floor(40 / 16) = 2
    expected = per_request + (n - 1) * (per_request - saved)  # 7 + 3 x 5 = 22 (unshared: 28)
    assert alloc.num_used_blocks == expected == 22
    assert used_blocks(pool) == expected  # measured on the tensor: 22 distinct blocks hold K/V
    sharing = memory.prefix_sharing(64, memory.Demand(layout, 2048), length, prefix, None)
    assert sharing.shared_blocks == saved and sharing.blocks_per_request_shared == per_request - saved


def test_one_group_with_different_kv_heads_gets_one_tensor_per_layer():
    """Nemotron-NAS style: full-attention layers with 8, 4 and 8 KV heads are one group (vLLM's
    UniformTypeKVCacheSpecs); a block id costs the sum of the three pages."""
    wide, narrow = LayerCache(LayerKind.FULL, kv_heads=8, head_dim=128), LayerCache(LayerKind.FULL, kv_heads=4, head_dim=128)
    layers = (wide, narrow, wide)
    layout = memory.pool_layout(layers, 16, BF16, BF16)
    # pages: 16 x 2 x 8 x 128 x 2 B = 65,536 B and 32,768 B -> 65,536 + 32,768 + 65,536 = 163,840 B a block
    assert layout.block_bytes == 163_840
    pool = allocate_pool(layout, 4, "cpu", layers=layers)
    assert [v.k.shape[2] for v in pool.layers] == [8, 4, 8]
    assert pool.storage_bytes == 4 * 163_840 == memory.pool_bytes(4, layout)
    with pytest.raises(ValueError, match="needs its layers"):
        allocate_pool(layout, 4, "cpu")
