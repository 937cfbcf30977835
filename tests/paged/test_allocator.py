"""The plain-Python paged block allocator: exact block ids on tiny pools (arithmetic in comments, as in
vLLM's own tests) and a hypothesis state machine that checks the pool's invariants after every step."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvplan.paged import allocator as allocator_module
from kvplan.paged.allocator import ROOT_HASH, BlockAllocator, GroupSpec, block_hash

FULL = GroupSpec("full")


def sliding(window_tokens: int) -> GroupSpec:
    return GroupSpec("sliding", window_tokens=window_tokens)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---- basics -------------------------------------------------------------------------------------
def test_first_request_gets_blocks_after_the_null_block():
    alloc = BlockAllocator(10, 4)  # block 0 withheld: 9 usable blocks, free queue 1..9
    assert alloc.num_usable_blocks == 9 and alloc.num_free_blocks == 9 and alloc.null_block == 0
    assert alloc.allocate("a", list(range(9))) == 0  # 9 tokens -> cdiv(9, 4) = 3 blocks, nothing cached yet
    assert alloc.block_table("a") == [1, 2, 3]
    assert alloc.allocate("b", 5) == 0  # 5 anonymous tokens -> 2 blocks, next from the head: 4, 5
    assert alloc.block_table("b") == [4, 5]
    assert (alloc.num_free_blocks, alloc.num_used_blocks) == (4, 5)  # 9 - 5, 3 + 2
    assert alloc.usage == pytest.approx(5 / 9)
    assert alloc.num_unused_slots == (12 - 9) + (8 - 5)  # slots of the partial last blocks
    assert (alloc.num_blocks_of("a"), alloc.num_tokens("a"), len(alloc), "a" in alloc) == (3, 9, 2, True)


def test_without_a_null_block_every_block_is_usable():
    alloc = BlockAllocator(3, 4, reserve_null_block=False)
    assert alloc.null_block == -1 and alloc.num_usable_blocks == 3
    assert alloc.allocate("a", 12) == 0 and alloc.block_table("a") == [0, 1, 2]


def test_append_takes_a_new_block_only_when_the_last_is_full():
    alloc = BlockAllocator(10, 4)
    alloc.allocate("a", list(range(9)))  # blocks [1, 2, 3]; block 3 holds token 8 only
    for token in (9, 10, 11):  # tokens 9..11 fill block 3 (12 = 3 x 4 slots)
        assert alloc.append("a", token)
        assert alloc.block_table("a") == [1, 2, 3]
    assert alloc.append("a", 12)  # token 12 starts block 4 of the request: the head of the queue, 4
    assert alloc.block_table("a") == [1, 2, 3, 4] and alloc.num_tokens("a") == 13
    assert alloc.append_tokens("a", 7)  # 13 + 7 = 20 tokens -> cdiv(20, 4) = 5 blocks: one more, 5
    assert alloc.block_table("a") == [1, 2, 3, 4, 5] and alloc.num_unused_slots == 0
    assert alloc.append_tokens("a", 0) and alloc.block_table("a") == [1, 2, 3, 4, 5]


def test_free_releases_tail_first():
    alloc = BlockAllocator(10, 4)
    alloc.allocate("a", 13)  # cdiv(13, 4) = 4 blocks: [1, 2, 3, 4]; queue left: 5..9
    alloc.free("a")
    # blocks rejoin the tail in reverse table order, so the request's tail is evicted first
    assert alloc.free_block_ids() == [5, 6, 7, 8, 9, 4, 3, 2, 1]
    assert alloc.num_free_blocks == 9 and len(alloc) == 0


def snapshot(alloc: BlockAllocator):
    return (alloc.free_block_ids(), list(alloc._ref), list(alloc._hash), [dict(c) for c in alloc._caches],
            {r: ([alloc.block_table(r, g) for g in range(len(alloc.groups))], alloc.num_tokens(r))
             for r in alloc._requests}, alloc.num_cached_blocks, alloc.prefix_query_tokens,
            alloc.prefix_hit_tokens)


def test_pool_full_returns_no_and_changes_nothing():
    alloc = BlockAllocator(10, 4)
    assert alloc.allocate("a", list(range(30))) == 0  # cdiv(30, 4) = 8 of 9 blocks: [1..8]
    before = snapshot(alloc)
    assert alloc.allocate("b", list(range(100, 108))) is None  # needs 2 blocks, 1 free
    assert "b" not in alloc and snapshot(alloc) == before
    assert alloc.append_tokens("a", [30, 31])  # 32 tokens still fit in 8 blocks
    assert alloc.append("a", 32) and alloc.block_table("a")[-1] == 9  # 33 tokens: the last block, 9
    before = snapshot(alloc)
    assert alloc.append_tokens("a", 4) is False  # 37 tokens need cdiv(37, 4) = 10 blocks, 9 usable
    assert snapshot(alloc) == before
    assert alloc.allocate("huge", 1000) is None  # larger than the whole pool: still just "no"


def test_misuse_raises_value_error():
    alloc = BlockAllocator(10, 4)
    alloc.allocate("a", 3)
    with pytest.raises(ValueError, match="already allocated"):
        alloc.allocate("a", 3)
    with pytest.raises(ValueError, match="at least one token"):
        alloc.allocate("b", [])
    with pytest.raises(ValueError, match="unknown request"):
        alloc.append("b", 1)
    with pytest.raises(ValueError, match="negative"):
        alloc.append_tokens("a", -1)
    alloc.free("a")
    with pytest.raises(ValueError, match="freed twice"):
        alloc.free("a")
    for bad in (dict(kind="paged"), dict(kind="sliding"), dict(kind="full", window_tokens=8),
                dict(kind="sliding", window_tokens=0), dict(kind="state"), dict(kind="full", state_blocks=1)):
        with pytest.raises(ValueError):
            GroupSpec(**bad)
    with pytest.raises(ValueError):
        BlockAllocator(1, 4)  # only the null block
    with pytest.raises(ValueError):
        BlockAllocator(10, 0)


# ---- prefix caching -----------------------------------------------------------------------------
def test_common_prefix_saves_floor_p_over_bs_blocks_per_request():
    # P = 10 common tokens, block size 4: floor(10 / 4) = 2 full blocks are shareable; the partial third
    # block (tokens 8, 9 + each request's own tokens) never is. Prompt = 10 + 3 = 13 tokens = 4 blocks.
    alloc = BlockAllocator(20, 4)
    prefix = list(range(10))
    used = []
    for i in range(4):
        hits = alloc.allocate(i, prefix + [100 + 3 * i, 101 + 3 * i, 102 + 3 * i])
        assert hits == (0 if i == 0 else 2 * 4)  # 2 blocks x 4 tokens hit after the first request
        used.append(alloc.num_used_blocks)
    assert used == [4, 6, 8, 10]  # 4 new blocks, then 4 - 2 = 2 new blocks each
    assert [alloc.block_table(i)[:2] for i in range(4)] == [[1, 2]] * 4
    assert len({alloc.block_table(i)[2] for i in range(4)}) == 4  # partial block: never shared
    assert alloc.ref_count(1) == alloc.ref_count(2) == 4
    assert alloc.prefix_query_tokens == 4 * 13 and alloc.prefix_hit_tokens == 3 * 8
    assert alloc.prefix_hit_rate == pytest.approx(24 / 52)
    assert alloc.num_blocks_of(1) == 4  # shared blocks count for every holder


def test_last_prompt_token_is_never_a_hit():
    alloc = BlockAllocator(10, 4)
    alloc.allocate("a", list(range(8)))  # two full blocks [1, 2], both cached
    assert alloc.num_cached_blocks == 2
    # the same 8 tokens again: at most (8 - 1) // 4 = 1 block may hit (vLLM computes the last token)
    assert alloc.allocate("b", list(range(8))) == 4
    assert alloc.block_table("b") == [1, 3]
    assert alloc.num_cached_blocks == 2  # block 3 holds the same tokens as block 2: the first copy stays


def test_blocks_that_fill_during_decode_become_cached():
    alloc = BlockAllocator(10, 4)
    alloc.allocate("a", [7, 7, 7])  # no full block yet
    assert alloc.num_cached_blocks == 0
    alloc.append("a", 7)  # block 1 is now full: cached
    alloc.append_tokens("a", [8, 8, 8, 8, 9])  # block 2 full (cached), block 3 partial
    assert alloc.num_cached_blocks == 2
    assert alloc.allocate("b", [7, 7, 7, 7, 8, 8, 8, 8, 5]) == 8 and alloc.block_table("b")[:2] == [1, 2]
    alloc.append_tokens("b", 3)  # anonymous tokens end hashing for b: its block 3 fills, uncached
    assert alloc.num_cached_blocks == 2 and alloc.block_hash_of(alloc.block_table("b")[2]) is None


def test_collision_guard_rejects_same_hash_with_other_tokens(monkeypatch):
    monkeypatch.setattr(allocator_module, "block_hash", lambda parent, tokens: 42)  # every block collides
    alloc = BlockAllocator(10, 4)
    alloc.allocate("a", [1, 2, 3, 4, 5])  # block 1 cached under hash 42
    assert alloc.block_hash_of(1) == 42
    assert alloc.allocate("b", [9, 9, 9, 9, 5]) == 0  # same hash, other tokens: no hit
    assert alloc.block_table("b") == [3, 4] and alloc.ref_count(1) == 1
    assert alloc.allocate("c", [1, 2, 3, 4, 6]) == 4 and alloc.block_table("c")[0] == 1  # a true hit


def test_collision_guard_checks_the_parent_in_sliding_lookups(monkeypatch):
    monkeypatch.setattr(allocator_module, "block_hash", lambda parent, tokens: 42)
    alloc = BlockAllocator(10, 4, [sliding(2)])  # window 2 -> one cached block ends a hit
    alloc.allocate("a", [1, 2, 3, 4, 1, 2, 3, 4, 0])  # block 1 = (1, 2, 3, 4) after the root, hash 42
    # (1, 2, 3, 4) again, but after (7, 7, 7, 7): same hash and tokens, different parent -> no hit
    assert alloc.allocate("b", [7, 7, 7, 7, 1, 2, 3, 4, 0]) == 0


def test_hash_is_chained_to_the_parent():
    assert block_hash(ROOT_HASH, (1, 2)) != block_hash(block_hash(ROOT_HASH, (0, 0)), (1, 2))
    alloc = BlockAllocator(10, 2)
    alloc.allocate("a", [0, 0, 1, 2, 9])
    assert alloc.block_hash_of(2) == block_hash(block_hash(ROOT_HASH, (0, 0)), (1, 2))
    assert alloc.allocate("b", [5, 5, 1, 2, 9]) == 0  # same second block after another first: a miss


def test_freed_cached_blocks_are_reused_and_evicted_lru():
    alloc = BlockAllocator(10, 4)
    prompt = list(range(12))
    alloc.allocate("a", prompt)  # [1, 2, 3], all full, all cached
    alloc.free("a")
    assert alloc.free_block_ids() == [4, 5, 6, 7, 8, 9, 3, 2, 1] and alloc.num_cached_blocks == 3
    assert alloc.allocate("x", 28) == 0  # cdiv(28, 4) = 7 blocks: 4..9, then 3 (a's tail) is evicted
    assert alloc.block_table("x") == [4, 5, 6, 7, 8, 9, 3] and alloc.num_cached_blocks == 2
    assert alloc.allocate("y", 4) == 0 and alloc.block_table("y") == [2]  # evicts block 2 next
    assert alloc.free_block_ids() == [1] and alloc.num_cached_blocks == 1
    # prompt[:5]: block (0..3) is still cached in block 1 -> a 4-token hit, plus 1 new block; but the
    # hit block itself is the last free block, so nothing is left for the new one: "no", nothing changed
    before = snapshot(alloc)
    assert alloc.allocate("b", prompt[:5]) is None and snapshot(alloc) == before
    alloc.free("y")  # block 2 (no longer cached) joins the tail: queue [1, 2]
    assert alloc.allocate("b", prompt[:5]) == 4 and alloc.block_table("b") == [1, 2]
    assert alloc.ref_count(1) == 1 and alloc.num_free_blocks == 0


def test_prefix_caching_can_be_disabled():
    alloc = BlockAllocator(10, 4, enable_prefix_caching=False)
    alloc.allocate("a", list(range(9)))
    assert alloc.allocate("b", list(range(9))) == 0 and alloc.num_cached_blocks == 0
    assert alloc.prefix_query_tokens == 0


# ---- sliding windows and several groups ---------------------------------------------------------
def test_sliding_window_releases_blocks_out_of_the_window():
    bs, window = 4, 6
    alloc = BlockAllocator(10, bs, [sliding(window)])
    alloc.allocate("a", 1)
    held = []
    for length in range(2, 41):  # append one token at a time up to 40 tokens
        assert alloc.append("a")
        held.append(alloc.num_blocks_of("a"))
        # before this append length - 1 tokens were computed; positions < length - 1 - 6 + 1 are dropped
        assert held[-1] == cdiv(length, bs) - max(0, length - window) // bs
        table = alloc.block_table("a")
        assert len(table) == cdiv(length, bs)
        dropped = max(0, length - window) // bs
        assert table[:dropped] == [0] * dropped and 0 not in table[dropped:]
        if length == 13:
            # 1..3 taken for 12 tokens; at 10 tokens (9 computed -> skip 4) block 1 rejoined the tail
            # (queue 4..9, 1); at 13 tokens the new block is the head, 4
            assert table == [0, 2, 3, 4]
    # bound: a window of W tokens covers at most ceil((W - 1) / bs) + 1 = ceil(5 / 4) + 1 = 3 blocks
    assert max(held) == cdiv(window - 1, bs) + 1 == 3


def test_sliding_window_prefill_holds_the_whole_chunk_until_the_next_step():
    alloc = BlockAllocator(20, 4, [sliding(4)])
    alloc.allocate("a", 20)  # nothing computed yet: all cdiv(20, 4) = 5 blocks are held
    assert alloc.num_blocks_of("a") == 5
    alloc.append("a")  # 20 computed: positions < 20 - 4 + 1 = 17 dropped -> blocks 0..3 (17 // 4 = 4)
    assert alloc.block_table("a") == [0, 0, 0, 0, 5, 6] and alloc.num_blocks_of("a") == 2
    assert alloc.free_block_ids()[-4:] == [4, 3, 2, 1]  # later blocks first, as vLLM frees them
    alloc.free("a")
    assert alloc.num_free_blocks == 19


def test_state_group_allocates_all_groups_or_nothing():
    alloc = BlockAllocator(10, 4, [FULL, GroupSpec("state", state_blocks=2)])
    assert alloc.allocate("a", 9) == 0  # full: cdiv(9, 4) = 3 blocks [1, 2, 3]; state: 2 blocks [4, 5]
    assert alloc.block_table("a", 0) == [1, 2, 3] and alloc.block_table("a", 1) == [4, 5]
    before = snapshot(alloc)
    assert alloc.allocate("b", 9) is None and snapshot(alloc) == before  # needs 3 + 2 = 5, 4 free
    assert alloc.allocate("b", 5) == 0  # 2 + 2 = 4 blocks
    assert alloc.block_table("b", 0) == [6, 7] and alloc.block_table("b", 1) == [8, 9]
    alloc.free("a")  # group by group, each tail first
    assert alloc.free_block_ids() == [3, 2, 1, 5, 4]
    assert alloc.append_tokens("b", 3) and alloc.block_table("b", 1) == [8, 9]  # state never grows
    assert alloc.allocate("c", list(range(8))) == 0  # 2 + 2 blocks of the 5 free
    alloc.free("c")
    assert alloc.allocate("d", list(range(8))) == 0  # same prompt, yet no hit
    assert alloc.num_cached_blocks == 0  # a state group turns prefix hits off (no saved states)


def test_full_and_sliding_groups_grow_together():
    alloc = BlockAllocator(10, 4, [FULL, sliding(4)])
    assert alloc.allocate("a", 9) == 0  # 3 blocks per group: full [1, 2, 3], sliding [4, 5, 6]
    assert (alloc.block_table("a", 0), alloc.block_table("a", 1)) == ([1, 2, 3], [4, 5, 6])
    before = snapshot(alloc)
    assert alloc.allocate("b", 5) is None and snapshot(alloc) == before  # 2 + 2 = 4 blocks, 3 free
    # 9 computed: sliding drops positions < 9 - 4 + 1 = 6 -> block 0 (6 // 4 = 1), id 4; 12 tokens
    # still fit in 3 blocks per group, so nothing new: 6 - 1 = 5 used, queue 7, 8, 9, 4
    assert alloc.append_tokens("a", 3) and alloc.num_used_blocks == 5
    assert alloc.free_block_ids() == [7, 8, 9, 4]
    # 12 computed: positions < 9 dropped -> blocks 0, 1 (9 // 4 = 2): id 5 joins the tail; the 13th
    # token needs one block per group, from the head: 7 (full) and 8 (sliding)
    assert alloc.append("a")
    assert (alloc.block_table("a", 0), alloc.block_table("a", 1)) == ([1, 2, 3, 7], [0, 0, 6, 8])
    assert alloc.free_block_ids() == [9, 4, 5] and alloc.num_blocks_of("a") == 4 + 2


def test_append_counts_sliding_blocks_it_can_reclaim():
    alloc = BlockAllocator(4, 4, [sliding(4)])  # 3 usable blocks
    alloc.allocate("a", 12)  # [1, 2, 3]: the pool is full
    assert alloc.num_free_blocks == 0
    # 12 computed: blocks 0, 1 (positions < 9) are dropped first, so the new block fits
    assert alloc.append("a") and alloc.block_table("a") == [0, 0, 3, 2]


def test_hybrid_prefix_hit_keeps_only_the_window_in_the_sliding_group():
    alloc = BlockAllocator(16, 4, [FULL, sliding(5)])  # 15 usable
    prompt = list(range(17))
    alloc.allocate("a", prompt)  # cdiv(17, 4) = 5 per group: full [1..5], sliding [6..10]
    alloc.free("a")  # queue: 11..15, then full 5, 4, 3, 2, 1, then sliding 10, 9, 8, 7, 6
    assert alloc.free_block_ids() == [11, 12, 13, 14, 15, 5, 4, 3, 2, 1, 10, 9, 8, 7, 6]
    # up to (17 - 1) // 4 = 4 blocks may hit; the full group hits [1, 2, 3, 4]; the sliding group needs
    # only cdiv(5 - 1, 4) = 1 cached block before the hit point: its block 3 (id 9), the rest placeholders
    assert alloc.allocate("b", prompt) == 16
    assert alloc.block_table("b", 0) == [1, 2, 3, 4, 11] and alloc.block_table("b", 1) == [0, 0, 0, 9, 12]
    assert alloc.num_blocks_of("b") == 5 + 2


def test_importing_the_allocator_does_not_import_torch():
    code = "import sys, kvplan.paged.allocator; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- state machine -------------------------------------------------------------------------------
CONFIGS = [
    [FULL],
    [sliding(3)],
    [sliding(1)],
    [FULL, sliding(5)],
    [FULL, sliding(2), sliding(7)],
    [FULL, GroupSpec("state", state_blocks=1)],
    [sliding(4), GroupSpec("state", state_blocks=2)],
]
token_lists = st.lists(st.integers(0, 1), min_size=1, max_size=14)  # two token values: many true hits


class AllocatorMachine(RuleBasedStateMachine):
    @initialize(groups=st.sampled_from(CONFIGS), block_size=st.sampled_from([1, 2, 4]),
                num_blocks=st.integers(3, 30), reserve=st.booleans(), caching=st.booleans())
    def setup(self, groups, block_size, num_blocks, reserve, caching):
        self.alloc = BlockAllocator(num_blocks, block_size, groups, reserve_null_block=reserve,
                                    enable_prefix_caching=caching)
        self.tokens: dict[int, list[int | None]] = {}  # None: an anonymous token
        self.computed: dict[int, int] = {}  # tokens computed before the last allocation step
        self.next_id = 0

    def _unchanged(self, before) -> None:
        assert snapshot(self.alloc) == before

    @rule(tokens=st.one_of(token_lists, st.integers(1, 14)))
    def allocate(self, tokens):
        before, rid = snapshot(self.alloc), self.next_id
        self.next_id += 1
        hits = self.alloc.allocate(rid, tokens)
        if hits is None:
            self._unchanged(before)
            return
        bs = self.alloc.block_size
        n = len(tokens) if isinstance(tokens, list) else tokens
        assert hits % bs == 0 and hits <= (n - 1) // bs * bs
        self.tokens[rid] = list(tokens) if isinstance(tokens, list) else [None] * tokens
        self.computed[rid] = hits

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), tokens=st.one_of(token_lists, st.integers(0, 6)))
    def append(self, data, tokens):
        rid = data.draw(st.sampled_from(sorted(self.tokens)))
        before = snapshot(self.alloc)
        if not self.alloc.append_tokens(rid, tokens):
            self._unchanged(before)
            return
        self.computed[rid] = len(self.tokens[rid])
        self.tokens[rid] += tokens if isinstance(tokens, list) else [None] * tokens

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.tokens)))
        self.alloc.free(rid)
        del self.tokens[rid], self.computed[rid]

    @invariant()
    def pool_is_consistent(self):
        alloc, null = self.alloc, self.alloc.null_block
        owners: dict[int, list[tuple[int, int, int]]] = {}
        for rid, toks in self.tokens.items():
            assert alloc.num_tokens(rid) == len(toks)
            for g, spec in enumerate(alloc.groups):
                table = alloc.block_table(rid, g)
                if spec.kind == "state":
                    assert len(table) == spec.state_blocks and null not in table
                else:
                    assert len(table) == cdiv(len(toks), alloc.block_size)
                num_null = table.count(null)
                assert table[:num_null] == [null] * num_null  # placeholders are a leading run
                if spec.kind == "sliding":  # exactly the blocks the window still needs
                    skipped = max(0, self.computed[rid] - spec.window_tokens + 1) // alloc.block_size
                    assert num_null == min(skipped, len(table))
                elif spec.kind == "full":
                    assert num_null == 0
                for pos, bid in enumerate(table[num_null:], num_null):
                    owners.setdefault(bid, []).append((rid, g, pos))
        free = alloc.free_block_ids()
        assert len(free) == len(set(free)) and null not in free
        assert len(free) + alloc.num_used_blocks == alloc.num_usable_blocks
        for bid in range(alloc.num_blocks):
            assert alloc.ref_count(bid) >= 0
            if bid == null:
                continue
            held = owners.get(bid, [])
            assert alloc.ref_count(bid) == len(held)  # shared blocks: refcount = number of owners
            assert (bid in free) == (not held)
            if len(held) > 1:  # only identical full prefixes at the same position are shared
                (rid0, g0, pos0), bs = held[0], alloc.block_size
                prefix = self.tokens[rid0][: (pos0 + 1) * bs]
                assert None not in prefix and len(prefix) == (pos0 + 1) * bs
                for rid, g, pos in held[1:]:
                    assert (g, pos) == (g0, pos0) and self.tokens[rid][: (pos + 1) * bs] == prefix
        num_cached = 0
        for g, cache in enumerate(alloc._caches):
            for h, bid in cache.items():
                assert alloc.block_hash_of(bid) == h and alloc._group[bid] == g
            num_cached += len(cache)
        assert num_cached == alloc.num_cached_blocks
        for bid, held in owners.items():  # a cached block holds exactly its owners' tokens and chain
            if alloc.block_hash_of(bid) is not None:
                for rid, _, pos in held:
                    bs, toks = alloc.block_size, self.tokens[rid]
                    parent = ROOT_HASH
                    for i in range(pos + 1):
                        block = tuple(toks[i * bs:(i + 1) * bs])
                        parent, prev = block_hash(parent, block), parent
                    assert alloc._tokens[bid] == block and alloc._parent[bid] == prev
                    assert alloc.block_hash_of(bid) == parent


AllocatorMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
TestAllocatorMachine = AllocatorMachine.TestCase
