"""The memory math: tp/pp slices, vLLM's grouping and padding, hybrid block size, capacity properties."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan import memory
from kvplan.errors import InputError
from kvplan.model.spec import LayerCache, LayerKind, spec_from_config
from kvplan.units import parse_dtype

FIXTURES = Path(__file__).parents[1] / "fixtures" / "configs"
BF16, FP8, FP32 = parse_dtype("bf16"), parse_dtype("fp8"), parse_dtype("fp32")


def fixture_spec(name: str):
    return spec_from_config(json.loads((FIXTURES / name).read_text()), model_id=name, where=name)


FULL = LayerCache(LayerKind.FULL, kv_heads=8, head_dim=128)  # 2 x 8 x 128 x 2 B = 4,096 B per token (bf16)
SWA = LayerCache(LayerKind.SLIDING, kv_heads=8, head_dim=128, window_tokens=4096)
MLA = LayerCache(LayerKind.MLA, kv_heads=1, head_dim=576, tp_shardable=False)


# --- tensor / pipeline parallel ---------------------------------------------------------------------


@pytest.mark.parametrize("layers, pp, expected", [
    (61, 4, [15, 15, 16, 15]),  # remainder 1 goes to the stage before the last (vLLM get_pp_indices)
    (62, 4, [15, 16, 16, 15]),
    (32, 4, [8, 8, 8, 8]),
    (27, 2, [14, 13]),
])
def test_pp_layer_counts(layers, pp, expected):
    assert memory.pp_layer_counts(layers, pp) == expected


def test_pp_rank_layers_take_the_largest_stage():
    spec = fixture_spec("deepseek_v3.json")  # 61 MLA layers, 576 x 2 B = 1,152 B per token each
    assert memory.kv_bytes_per_token(memory.rank_layers(spec, pp=4), BF16) == 16 * 1_152


@pytest.mark.parametrize("kv_heads, tp, expected", [(8, 1, 8), (8, 2, 4), (8, 8, 1), (8, 16, 1), (1, 4, 1)])
def test_tp_kv_heads(kv_heads, tp, expected):
    assert memory.tp_kv_heads(kv_heads, tp) == expected


@pytest.mark.parametrize("kv_heads, tp", [(8, 3), (6, 4), (2, 3)])
def test_tp_must_divide_heads(kv_heads, tp):
    with pytest.raises(InputError):
        memory.tp_kv_heads(kv_heads, tp)


def test_mla_is_replicated_across_tp():
    assert memory.shard_layer(MLA, 8) == MLA


def test_mamba2_groups_replicated_when_tp_exceeds_them():
    # Nemotron-H fixture: 128 heads x 64, n_groups 8, state 128, conv 4.
    # tp 4: conv (4 - 1) x (8192 + 2 x 8 x 128) / 4 = 7,680; ssm 128/4 x 64 x 128 = 262,144
    # tp 16: groups 8 -> 16 (replicated): conv 3 x (8192 + 2 x 16 x 128) / 16 = 2,304; ssm 8 x 64 x 128 = 65,536
    state = next(x for x in fixture_spec("nemotron_h.json").layers if x.is_state)
    four, sixteen = memory.shard_layer(state, 4), memory.shard_layer(state, 16)
    assert (four.conv_elements, four.ssm_elements) == (7_680, 262_144)
    assert (sixteen.conv_elements, sixteen.ssm_elements) == (2_304, 65_536)


def test_gated_delta_net_tp_split():
    # Qwen3-Next fixture at tp 2: conv 3 x 1024 / 2 = 1,536; ssm 8/2 x 64 x 64 = 16,384
    state = next(x for x in fixture_spec("qwen3_next.json").layers if x.is_state)
    half = memory.shard_layer(state, 2)
    assert (half.conv_elements, half.ssm_elements) == (1_536, 16_384)
    with pytest.raises(InputError):
        memory.shard_layer(state, 3)


# --- grouping and padding -------------------------------------------------------------------------------


def test_uniform_model_is_one_group():
    layout = memory.pool_layout((FULL,) * 32, 16, BF16, BF16)
    # page 16 x 4,096 = 65,536 B; one block id = 32 pages = 2 MiB
    assert (len(layout.groups), layout.page_bytes, layout.block_bytes) == (1, 65_536, 2 * 1024 * 1024)


def test_gemma3_grouping_and_padding():
    # 10 full + 52 sliding: group size 10 (52 >= 1.5 x 10); sliding splits into ceil(52/10) = 6 groups of
    # 9/9/9/9/8/8 (layers[i::6]); 7 groups x 10 slots - 62 layers = 8 padded slots
    layers = tuple(FULL if (i + 1) % 6 == 0 else SWA for i in range(62))
    layout = memory.pool_layout(layers, 16, BF16, BF16)
    assert layout.group_size == 10 and len(layout.groups) == 7
    assert sorted(g.num_layers for g in layout.groups if g.cache.kind is LayerKind.SLIDING) == [8, 8, 9, 9, 9, 9]
    assert layout.padding_layers == 8
    assert layout.block_bytes == 10 * 16 * 4_096


def test_near_equal_counts_use_the_larger_group():
    # 12 sliding + 13 full: 13 < 1.5 x 12 -> group size 13, one padded slot (vLLM's gpt-oss + eagle example)
    layout = memory.pool_layout((SWA,) * 12 + (FULL,) * 13, 16, BF16, BF16)
    assert layout.group_size == 13 and len(layout.groups) == 2 and layout.padding_layers == 1
    assert memory.GROUP_RATIO == 1.5


def test_sliding_blocks_per_request():
    # window 4096, 8192 batched tokens, bs 16: ceil(min(4095 + 8192, L) / 16) + 1
    group = memory.KVGroup(SWA, 1)
    assert memory.group_blocks_per_request(group, 100_000, 16, 8192) == 12_287 // 16 + 1 + 1  # 769
    assert memory.group_blocks_per_request(group, 1000, 16, 8192) == 63 + 1


# --- hybrid block size --------------------------------------------------------------------------------------


def test_hybrid_block_size_and_state_padding():
    # Qwen3-Next fixture at bf16, base 16: attention 2 x 2 x 128 x 2 B = 1,024 B per token per layer;
    # state 3,072 x 2 B + 32,768 x 2 B = 71,680 B -> 16 x ceil(71,680 / (16 x 1,024)) = 16 x 5 = 80 tokens;
    # page 80 x 1,024 = 81,920 B; the state page is padded by 10,240 B
    layout = memory.pool_layout(fixture_spec("qwen3_next.json").layers, 16, BF16, BF16)
    assert layout.block_size == 80 and layout.page_bytes == 81_920
    assert layout.state_page_bytes == 71_680 and layout.state_padding_bytes == 10_240
    # 6 linear + 2 full: group size 2, 3 state groups + 1 full group = 4 groups, 2 pages per block id
    assert len(layout.groups) == 4 and layout.block_bytes == 2 * 81_920
    # one request at 4,096 tokens: ceil(4096 / 80) = 52 + 3 state blocks; prefix caching: 52 + 3 x 2
    assert memory.Demand(layout, 2048).blocks(4096) == 55
    assert memory.Demand(layout, 2048, prefix_caching=True).blocks(4096) == 58


def test_fp8_kv_grows_the_hybrid_block_and_gains_less_than_2x():
    # fp8: 512 B per token per layer -> 16 x ceil(71,680 / 8,192) = 144 tokens; page 73,728 B
    spec = fixture_spec("qwen3_next.json")
    bf16 = memory.pool_layout(spec.layers, 16, BF16, BF16)
    fp8 = memory.pool_layout(spec.layers, 16, FP8, BF16)
    assert fp8.block_size == 144 and fp8.page_bytes == 73_728
    # requests at 32,768 tokens in 4 GiB: bf16 26,214 blocks / (410 + 3) = 63.47;
    # fp8 29,127 blocks / (228 + 3) = 126.09 -> 1.99x, not 2x (the padded state pages do not shrink)
    budget = 4 << 30
    c16 = memory.vllm_max_concurrency(memory.num_blocks(budget, bf16), memory.Demand(bf16, 2048).blocks(32768))
    c8 = memory.vllm_max_concurrency(memory.num_blocks(budget, fp8), memory.Demand(fp8, 2048).blocks(32768))
    assert memory.num_blocks(budget, fp8) == 29_127 and memory.Demand(fp8, 2048).blocks(32768) == 231
    assert c16 < c8 < 2 * c16


def test_hybrid_block_size_formula():
    assert memory.hybrid_block_size(16, 1024, 71_680) == 80
    assert memory.hybrid_block_size(128, 1024, 1000) == 128  # never below the base block size
    assert memory.hybrid_block_size(16, 1024, 10_000, is_mla=True) == 128  # MLA hybrids align to 128


# --- capacity properties ----------------------------------------------------------------------------------

LAYOUTS = {
    "dense": memory.pool_layout((FULL,) * 8, 16, BF16, BF16),
    "gemma": memory.pool_layout(tuple(FULL if (i + 1) % 6 == 0 else SWA for i in range(12)), 16, BF16, BF16),
    "mla": memory.pool_layout((MLA,) * 4, 64, BF16, BF16),
    "hybrid": memory.pool_layout(fixture_spec("qwen3_next.json").layers, 16, BF16, BF16),
}
LAYERS = {
    "dense": (FULL,) * 8,
    "gemma": tuple(FULL if (i + 1) % 6 == 0 else SWA for i in range(12)),
    "mla": (MLA,) * 4,
    "hybrid": fixture_spec("qwen3_next.json").layers,
}

tokens = st.integers(1, 200_000)
mnbt = st.sampled_from([512, 2048, 8192])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(LAYOUTS)), tokens, tokens, mnbt)
def test_blocks_monotone_in_tokens(name, a, b, t):
    layout = LAYOUTS[name]
    lo, hi = sorted((a, b))
    assert memory.Demand(layout, t).blocks(lo) <= memory.Demand(layout, t).blocks(hi)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["dense", "mla"]), tokens)
def test_paged_bytes_bound_raw_bytes(name, n):
    # full attention only: raw <= paged < raw + one block per group
    layout, layers = LAYOUTS[name], LAYERS[name]
    raw = memory.raw_request_bytes(layers, n, BF16, BF16)
    paged = memory.Demand(layout, 2048).bytes(n)
    assert raw <= paged < raw + len(layout.groups) * layout.block_bytes


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(LAYOUTS)), tokens)
def test_paged_bytes_cover_raw_bytes(name, n):
    # any layout: what a request holds in the pool covers its raw cache (windows and state included)
    layout, layers = LAYOUTS[name], LAYERS[name]
    assert memory.Demand(layout, 2048).bytes(n) >= memory.raw_request_bytes(layers, n, BF16, BF16)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(LAYOUTS)), st.integers(0, 50_000), st.integers(1, 64), mnbt)
def test_max_context_solves_exactly(name, blocks, batch, t):
    layout = LAYOUTS[name]
    limit = 1 << 20
    demand = memory.Demand(layout, t)
    best = memory.max_context(blocks, demand, batch, limit_tokens=limit)
    usable = blocks - memory.NULL_BLOCKS
    if best == 0:
        assert batch * demand.blocks(1) > usable
        return
    assert batch * demand.blocks(best) <= usable
    if best < limit:
        assert batch * demand.blocks(best + 1) > usable
        assert batch * demand.blocks(best + layout.block_size) > usable


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(LAYOUTS)), st.integers(0, 1 << 36), st.integers(0, 1 << 30), tokens)
def test_capacity_monotone_in_budget_and_batch(name, budget, more, n):
    layout = LAYOUTS[name]
    small, big = memory.num_blocks(budget, layout), memory.num_blocks(budget + more, layout)
    assert small <= big
    per = memory.Demand(layout, 2048).blocks(n)
    assert memory.max_requests(small, per) <= memory.max_requests(big, per)
    # a batch that fits still fits with one request fewer
    fit = memory.max_requests(big, per)
    assert fit * per <= max(0, big - memory.NULL_BLOCKS)


def test_kv_cache_tokens_is_vllms_float_product():
    # vLLM: int(num_blocks / per_request * max_model_len)
    assert memory.kv_cache_tokens(819, 518, 16384) == int(819 / 518 * 16384)
    assert memory.vllm_max_concurrency(819, 518) == 819 / 518
