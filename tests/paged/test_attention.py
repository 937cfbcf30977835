"""Attention over scattered blocks agrees with attention over a contiguous copy (GQA, MHA, MQA, MLA-shaped,
sliding window), through real allocator block tables; a wrong block table is caught."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvplan.paged.allocator import BlockAllocator, GroupSpec  # noqa: E402
from kvplan.paged.attention import (  # noqa: E402
    check_decode, contiguous_decode, gather_slots, paged_decode, slot_mapping, write_slots,
)

BS = 16


def test_slot_mapping_is_block_id_times_block_size_plus_offset():
    # table [5, 2], block size 4: positions 0..3 -> block 5 (slots 20..23), 4..5 -> block 2 (slots 8, 9)
    assert slot_mapping([5, 2], range(6), 4).tolist() == [20, 21, 22, 23, 8, 9]


def _scattered_tables(num_blocks: int, lengths: dict[str, int]) -> BlockAllocator:
    """Requests grown a block at a time in turn, so each one's blocks interleave with the others'."""
    alloc = BlockAllocator(num_blocks, BS, enable_prefix_caching=False)
    for name in lengths:
        alloc.allocate(name, 1)
    for step in range(1, max(lengths.values())):
        for name, length in lengths.items():
            if step < length:
                assert alloc.append(name)
    return alloc


def test_interleaved_requests_get_non_contiguous_tables():
    alloc = _scattered_tables(64, {"a": 100, "b": 70})
    table = alloc.block_table("a")
    assert len(table) == 7  # ceil(100 / 16)
    assert any(b - a != 1 for a, b in zip(table, table[1:]))  # scattered, not one run


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize(("case", "q_heads", "kv_heads"), [("gqa", 32, 8), ("mha", 8, 8), ("mqa", 8, 1)])
def test_paged_decode_matches_contiguous(dtype, case, q_heads, kv_heads):
    alloc = _scattered_tables(64, {"a": 300, "b": 170})
    kv = torch.zeros(2, 64, BS, kv_heads, 64, dtype=dtype)  # vLLM's [2, num_blocks, block_size, heads, dim]
    for req, length in (("a", 300), ("b", 170)):
        result = check_decode(case, kv[0], kv[1], alloc.block_table(req), length, BS, q_heads)
        assert result.ok, result
        assert (result.q_heads, result.kv_heads, result.num_tokens) == (q_heads, kv_heads, length)


def test_mla_shaped_latent_is_key_and_its_first_rank_is_value():
    alloc = _scattered_tables(64, {"a": 257, "b": 33})
    latent = torch.zeros(64, BS, 576, dtype=torch.bfloat16)  # [num_blocks, block_size, kv_lora_rank + rope]
    for req, length in (("a", 257), ("b", 33)):
        result = check_decode("mla", latent, None, alloc.block_table(req), length, BS, 16, value_dim=512)
        assert result.ok, result
    # the value really is the latent's first 512 elements: compare with a hand-built contiguous case
    table = alloc.block_table("b")
    slots = slot_mapping(table, range(33), BS)
    latents = gather_slots(latent, slots).float()
    q = torch.randn(16, 576)
    paged = paged_decode(q, latent, latent, table, 33, BS, value_dim=512).float()
    ref = contiguous_decode(q.bfloat16(), latents.bfloat16().unsqueeze(1), latents.bfloat16().unsqueeze(1)[..., :512])
    assert paged.shape == (16, 512)
    torch.testing.assert_close(paged, ref, atol=1.6e-2, rtol=1.6e-2)


def test_sliding_window_reads_only_the_window_and_never_dropped_blocks():
    window = 40
    alloc = BlockAllocator(32, BS, [GroupSpec("sliding", window_tokens=window)], enable_prefix_caching=False)
    alloc.allocate("a", 100)
    assert alloc.append_tokens("a", 100) and alloc.append_tokens("a", 0)  # 200 tokens; old blocks dropped
    table = alloc.block_table("a")
    # blocks wholly before 200 - 40 + 1 = 161 are dropped: floor(161 / 16) = 10 placeholders (null block 0)
    assert table[:10] == [0] * 10 and 0 not in table[10:] and len(table) == 13
    kv = torch.zeros(2, 32, BS, 2, 64, dtype=torch.bfloat16)
    result = check_decode("sliding", kv[0], kv[1], table, 200, BS, 8, window=window, null_block=0)
    assert result.ok, result
    q = torch.randn(8, 64)
    before = paged_decode(q, kv[0], kv[1], table, 200, BS, window=window)
    kv[:, 0] = 1e4  # garbage in the null block, which the dropped positions map to
    after = paged_decode(q, kv[0], kv[1], table, 200, BS, window=window)
    assert torch.equal(before, after)


def test_a_wrong_block_table_is_caught():
    alloc = _scattered_tables(64, {"a": 300, "b": 170})
    kv = torch.zeros(2, 64, BS, 2, 64, dtype=torch.float32)
    table = alloc.block_table("a")
    check_decode("gqa", kv[0], kv[1], alloc.block_table("b"), 170, BS, 8)  # b's blocks hold other values
    swapped = table[:2] + alloc.block_table("b")[2:3] + table[3:]  # block 2 read from request b
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(300, 2, 64, generator=gen)
    v = torch.randn(300, 2, 64, generator=gen)
    slots = slot_mapping(table, range(300), BS)
    write_slots(kv[0], slots, k)
    write_slots(kv[1], slots, v)
    q = torch.randn(8, 64, generator=gen)
    good = paged_decode(q, kv[0], kv[1], table, 300, BS)
    bad = paged_decode(q, kv[0], kv[1], swapped, 300, BS)
    ref = contiguous_decode(q, k, v)
    torch.testing.assert_close(good, ref, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(bad, ref, atol=1e-2, rtol=1e-2)


def test_fp8_cache_stores_one_byte_values():
    kv = torch.zeros(2, 4, BS, 1, 8, dtype=torch.float8_e4m3fn)
    values = torch.tensor([0.5, 1.0, -2.0, 448.0]).repeat(2).view(1, 1, 8)
    write_slots(kv[0], slot_mapping([3], [5], BS), values)
    assert kv[0][3, 5].float().tolist() == [[0.5, 1.0, -2.0, 448.0] * 2]  # exact in e4m3
    assert kv.element_size() == 1
