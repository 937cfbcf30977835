"""A paged KV block allocator in plain Python (no torch): what serving engines do, small enough to read.

Semantics follow vLLM v1 (``block_pool.py``, ``single_type_kv_cache_manager.py``) at nano-vllm's size:

* one pool of ``num_blocks`` blocks of ``block_size`` tokens, shared by every layer group; with
  ``reserve_null_block`` block 0 is withheld as the placeholder for released positions (vLLM's null
  block), otherwise the placeholder is ``-1``;
* the free queue is ordered: freed blocks join the tail, allocation pops the head, and a popped block
  that still holds a cached prefix hash loses it then (LRU eviction among free cached blocks); a hit can
  take a block from the queue's middle (its entry is then stale: see :meth:`BlockAllocator._take`);
* a request's blocks are freed tail first, so its tail blocks are evicted before its prefix;
* prefix caching hashes every FULL block chained to its parent's hash, ``hash_fn(parent_hash, tokens)``;
  a hit needs the same hash, the same parent hash and the same token ids (a collision guard), and at
  most ``(num_prompt_tokens - 1) // block_size`` blocks hit (the last prompt token is always computed);
* a sliding-window group drops blocks wholly before ``num_computed_tokens - window_tokens + 1``
  (checked when the request next grows); a state group holds ``state_blocks`` blocks per request;
* any allocation takes the blocks of every group at once or nothing: "does not fit" returns
  ``None``/``False`` and changes nothing; misuse (unknown or duplicate request id) raises ``ValueError``.

The guard compares one block and its parent's hash, not the whole prefix: two different prefixes whose
hashes collide could still share a later block (vLLM makes the same trade; with Python's 64-bit hash
of int tuples this does not happen in practice). A model with a state group gets no prefix hits (a
cached prefix would also need its saved state), and an anonymous token (a count, not an id) ends the
request's hashing. Bulk paths (``allocate``, ``append_tokens`` with a count) do no per-token work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from typing import Literal

from kvplan.units import cdiv, plural
from kvplan.frozen import frozen

ROOT_HASH = -1
"""The parent hash of a request's first block (Python's ``hash`` never returns -1)."""

GroupKind = Literal["full", "sliding", "state"]


def block_hash(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    """The chained hash of one full block: ``hash((parent_hash, token_ids))`` (deterministic for ints)."""
    return hash((parent_hash, token_ids))


_BUILTIN_HASH = block_hash  # bound at import: a monkeypatched ``block_hash`` is called, not inlined


def _drain(calls: Iterator[object]) -> None:
    """Run a lazy ``map`` of calls for their effect, in C (a zero-length deque keeps none of the results)."""
    deque(calls, maxlen=0)


@frozen
class GroupSpec:
    """One layer group of the pool: ``full`` attention, ``sliding`` window attention of
    ``window_tokens`` tokens, or ``state`` (a fixed ``state_blocks`` blocks per request, e.g. Mamba)."""

    kind: GroupKind = "full"
    window_tokens: int | None = None
    state_blocks: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("full", "sliding", "state"):
            raise ValueError(f"GroupSpec.kind must be 'full', 'sliding' or 'state', not {self.kind!r}")
        if (self.kind == "sliding") != (self.window_tokens is not None):
            raise ValueError(f"GroupSpec.window_tokens is required for 'sliding' and only for it: {self}")
        if self.window_tokens is not None and self.window_tokens < 1:
            raise ValueError(f"GroupSpec.window_tokens must be >= 1, not {self.window_tokens}")
        if (self.kind == "state") != (self.state_blocks > 0) or self.state_blocks < 0:
            raise ValueError(f"GroupSpec.state_blocks must be >= 1 for 'state' and 0 otherwise: {self}")


FULL = GroupSpec()


class _Request:
    """Book-keeping of one request: token count, one block table per group, hash-chain state."""

    __slots__ = ("num_tokens", "tables", "num_null", "parent_hash", "num_hashed", "tail", "num_hit_tokens")

    def __init__(self, num_tokens: int, tables: list[list[int]], num_null: list[int]) -> None:
        self.num_tokens = num_tokens
        self.tables = tables
        self.num_null = num_null  # leading placeholder entries per group (sliding groups only)
        self.parent_hash = ROOT_HASH  # hash of the last full block hashed so far
        self.num_hashed = 0  # full blocks hashed so far
        self.tail: list[int] | None = None  # token ids of the partial last block; None: not hashing
        self.num_hit_tokens = 0


class BlockAllocator:
    """A pool of ``num_blocks`` blocks of ``block_size`` tokens shared by ``groups`` (see module doc).

    Each request holds one block table per group (``block_table(req_id, group)``). Attention groups
    (full, sliding) hold ``cdiv(num_tokens, block_size)`` entries, placeholders included; a state group
    holds ``state_blocks``. ``hash_fn(parent_hash, token_ids_tuple) -> int`` replaces :func:`block_hash`.
    Request ids are any hashable values. Counters: ``prefix_query_tokens`` (prompt tokens looked up)
    and ``prefix_hit_tokens`` (of those, found cached), both since construction.
    """

    def __init__(self, num_blocks: int, block_size: int, groups: Sequence[GroupSpec] = (FULL,), *,
                 reserve_null_block: bool = True, enable_prefix_caching: bool = True,
                 hash_fn: Callable[[int, tuple[int, ...]], int] | None = None) -> None:
        if block_size < 1 or num_blocks < 1 + reserve_null_block or not groups:
            raise ValueError(f"need block_size >= 1, num_blocks >= {1 + reserve_null_block} and a group; got "
                             f"block_size={block_size}, num_blocks={num_blocks}, groups={list(groups)}")
        self.num_blocks, self.block_size, self.groups = num_blocks, block_size, tuple(groups)
        self.null_block = 0 if reserve_null_block else -1
        self.num_usable_blocks = num_blocks - reserve_null_block
        self._attn = [g for g, s in enumerate(self.groups) if s.kind != "state"]
        self._full = [g for g, s in enumerate(self.groups) if s.kind == "full"]
        self._sliding = [(g, s.window_tokens) for g, s in enumerate(self.groups) if s.kind == "sliding"]
        self._num_state_blocks = sum(s.state_blocks for s in self.groups)
        self.caching = enable_prefix_caching and self._num_state_blocks == 0 and bool(self._attn)
        self._hash_fn = hash_fn or block_hash
        # the free queue: ``_queue[_head:]``, head first, less its stale entries (``_stale[b]``: how many of
        # block b's entries, its oldest, are no longer free; a free block's newest entry is its place)
        self._queue: list[int] = list(range(reserve_null_block, num_blocks))
        self._head = 0
        self._stale = [0] * num_blocks
        self._num_stale = 0
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks  # set only while a block is in a cache
        self._parent = [ROOT_HASH] * num_blocks
        self._tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._group = [0] * num_blocks
        self._caches: list[dict[int, int]] = [{} for _ in self.groups]  # per group: hash -> block id
        self._requests: dict[object, _Request] = {}
        self.num_cached_blocks = 0  # blocks holding a prefix hash, in use or free
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    # ---- stats -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._queue) - self._head - self._num_stale

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Used fraction of the usable blocks (0..1), as vLLM's ``get_usage``."""
        return self.num_used_blocks / self.num_usable_blocks

    @property
    def prefix_hit_rate(self) -> float:
        """``prefix_hit_tokens / prefix_query_tokens`` (0.0 before any query)."""
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

    @property
    def num_unused_slots(self) -> int:
        """Token slots allocated but not filled (the partial last block of each request and group)."""
        bs = self.block_size
        return len(self._attn) * sum(-r.num_tokens % bs for r in self._requests.values())

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def _get(self, req_id: object) -> _Request:
        r = self._requests.get(req_id)
        if r is None:
            raise ValueError(f"unknown request id {req_id!r} (never allocated, or already freed)")
        return r

    def num_tokens(self, req_id: object) -> int:
        return self._get(req_id).num_tokens

    def num_blocks_of(self, req_id: object) -> int:
        """Blocks the request holds in all groups (placeholders excluded; shared blocks count)."""
        r = self._get(req_id)
        return sum(len(t) - n for t, n in zip(r.tables, r.num_null))

    def num_hit_tokens(self, req_id: object) -> int:
        return self._get(req_id).num_hit_tokens

    def block_table(self, req_id: object, group: int = 0) -> list[int]:
        """A copy of the request's table for ``group``: logical block index -> physical block id."""
        return list(self._get(req_id).tables[group])

    def free_block_ids(self) -> list[int]:
        """The free blocks in eviction order (head first: the next blocks ``allocate`` takes)."""
        queue = self._queue[self._head:]
        if not self._num_stale:
            return queue
        skip = {b: n for b, n in enumerate(self._stale) if n}
        out = []
        for b in queue:
            if skip.get(b):
                skip[b] -= 1
            else:
                out.append(b)
        return out

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def block_hash_of(self, block_id: int) -> int | None:
        """The prefix hash a block is cached under, or None."""
        return self._hash[block_id]

    # ---- pool primitives ---------------------------------------------------------------------
    def _take(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the head of the free queue, evicting their cached hashes.

        The queue is a list read from ``_head`` (compacted once half of it is read), so a take is a slice and
        a release an ``extend``: a contiguous policy takes ``max_model_len / block_size`` blocks a request, and
        an ``OrderedDict`` popped a block at a time was most of a simulation. A block a hit took from the
        queue's middle left its entry there, stale: a take skips it."""
        if n > self.num_free_blocks:
            raise KeyError(f"{plural(n, 'block')} asked of {plural(self.num_free_blocks, 'free block')}")  # callers check
        queue, h, stale, out = self._queue, self._head, self._stale, []
        while len(out) < n:
            chunk = queue[h:h + n - len(out)]
            h += len(chunk)
            if self._num_stale and any(map(stale.__getitem__, chunk)):
                kept = []
                for b in chunk:
                    if stale[b]:
                        stale[b] -= 1
                        self._num_stale -= 1
                    else:
                        kept.append(b)
                chunk = kept
            out += chunk
        if h > 4096 and 2 * h > len(queue):
            del queue[:h]
            h = 0
        self._head = h
        if self.num_cached_blocks:
            hashes = self._hash
            for bid in [b for b in out if hashes[b] is not None]:
                del self._caches[self._group[bid]][hashes[bid]]
                hashes[bid] = self._tokens[bid] = None
                self.num_cached_blocks -= 1
        _drain(map(self._ref.__setitem__, out, repeat(1)))
        return out

    def _unqueue(self, bid: int) -> None:
        """Take a free block (a prefix hit) off the queue: its entry goes stale."""
        self._stale[bid] += 1
        self._num_stale += 1

    def _release(self, blocks: Sequence[int]) -> None:
        """Drop one reference of each (real) block in order; blocks reaching 0 join the free tail.

        Where each block is held once and listed once (no sharing: the common case), all join the tail at C speed."""
        ref, queue = self._ref, self._queue
        if len(blocks) > 8 and list(map(ref.__getitem__, blocks)).count(1) == len(blocks) == len(set(blocks)):
            _drain(map(ref.__setitem__, blocks, repeat(0)))
            queue.extend(blocks)
            return
        for bid in blocks:
            ref[bid] -= 1
            if not ref[bid]:
                queue.append(bid)

    def _chain(self, parent: int, blocks: list[tuple[int, ...]]) -> list[int]:
        """The chained hashes of consecutive full blocks after a block hashed ``parent``."""
        out = []
        if self._hash_fn is _BUILTIN_HASH:  # the default, inlined for speed
            for toks in blocks:
                parent = hash((parent, toks))
                out.append(parent)
        else:
            for toks in blocks:
                parent = self._hash_fn(parent, toks)
                out.append(parent)
        return out

    def _register(self, r: _Request, blocks: list[tuple[int, ...]], hashes: list[int]) -> None:
        """Cache the next full blocks of ``r`` (token tuples; ``hashes`` may be a prefix of theirs)
        in every attention group."""
        if len(hashes) < len(blocks):
            hashes = hashes + self._chain(hashes[-1] if hashes else r.parent_hash, blocks[len(hashes):])
        i, parent = r.num_hashed, r.parent_hash
        for toks, h in zip(blocks, hashes):
            for g in self._attn:
                cache, bid = self._caches[g], r.tables[g][i]
                if h not in cache and self._hash[bid] is None:  # keep the first copy (append-only tables)
                    cache[h], self._hash[bid], self._parent[bid] = bid, h, parent
                    self._tokens[bid], self._group[bid] = toks, g
                    self.num_cached_blocks += 1
            parent, i = h, i + 1
        r.parent_hash, r.num_hashed = parent, i

    def _match(self, g: int, i: int, hashes: list[int], toks: list[tuple[int, ...]]) -> int:
        """The block cached in group ``g`` for full block ``i``, or -1 (also on a hash collision)."""
        bid = self._caches[g].get(hashes[i], -1)
        parent = hashes[i - 1] if i else ROOT_HASH
        if bid >= 0 and (self._tokens[bid] != toks[i] or self._parent[bid] != parent):
            return -1  # a hash collision: different tokens or a different parent
        return bid

    def _find_hits(self, hashes: list[int], toks: list[tuple[int, ...]],
                   k: int) -> tuple[int, dict[int, list[int]]]:
        """Longest prefix (in blocks, <= k) cached in every attention group, and each group's hit blocks."""
        hits: dict[int, list[int]] = {}
        tokens_of, parent_of = self._tokens, self._parent
        for g in self._full:  # full attention: the hit is a prefix, so stop at the first miss
            found: list[int] = []
            cache, parent = self._caches[g], ROOT_HASH
            for h, t in zip(hashes[:k], toks):
                bid = cache.get(h)
                if bid is None or tokens_of[bid] != t or parent_of[bid] != parent:
                    break
                found.append(bid)
                parent = h
            hits[g], k = found, len(found)
        changed = True
        while changed and self._sliding:  # sliding windows may shorten k; re-check until stable
            changed = False
            for g, window in self._sliding:
                kk, hits[g] = self._sliding_hit(g, window, hashes, toks, k)
                changed |= kk < k
                k = kk
        return k, {g: found[:k] for g, found in hits.items()}

    def _sliding_hit(self, g: int, window: int, hashes: list[int], toks: list[tuple[int, ...]],
                     k: int) -> tuple[int, list[int]]:
        """vLLM's sliding-window hit: scan from the right for ``cdiv(window - 1, bs)`` cached blocks in
        a row (earlier positions become placeholders); without such a run, the cached run from block 0."""
        need, run = cdiv(window - 1, self.block_size), []
        if need == 0:  # a window of one token needs no earlier KV at all
            return k, [self.null_block] * k
        for i in range(k - 1, -1, -1):
            bid = self._match(g, i, hashes, toks)
            if bid < 0:
                run = []
                continue
            run.append(bid)
            if len(run) >= need:
                return i + len(run), [self.null_block] * i + run[::-1]
        return len(run), run[::-1]

    # ---- requests ----------------------------------------------------------------------------
    def allocate(self, req_id: object, tokens: Sequence[int] | int) -> int | None:
        """Start a request with its prompt: token ids (prefix caching applies) or a count (anonymous).

        Returns the number of prompt tokens found in the prefix cache (0 or more), or ``None`` when the
        blocks do not fit (nothing changed). Check ``is None``, not falsiness.
        """
        if req_id in self._requests:
            raise ValueError(f"request id {req_id!r} is already allocated")
        known = not isinstance(tokens, int)
        n = len(tokens) if known else tokens
        if n < 1:
            raise ValueError(f"a request needs at least one token, got {n}")
        bs, caching = self.block_size, self.caching and known
        hit_blocks, hits, toks = 0, {}, []
        if caching:
            toks = [tuple(tokens[s:s + bs]) for s in range(0, n - bs + 1, bs)]
            hashes = self._chain(ROOT_HASH, toks[: (n - 1) // bs])
            hit_blocks, hits = self._find_hits(hashes, toks, len(hashes))
        num_new = (cdiv(n, bs) - hit_blocks) * len(self._attn) + self._num_state_blocks
        ref, null = self._ref, self.null_block
        touched = [b for found in hits.values() for b in found if b != null]
        free = self.num_free_blocks
        if num_new + len(touched) > free and num_new + sum(1 for b in touched if not ref[b]) > free:
            return None  # hit blocks that sit in the free queue are taken from it too
        for b in touched:  # take hit blocks off the free queue before popping new ones
            if not ref[b]:
                self._unqueue(b)
            ref[b] += 1
        fresh = self._take(num_new)
        tables, num_null, pos = [], [], 0
        for g, spec in enumerate(self.groups):
            count = spec.state_blocks if spec.kind == "state" else cdiv(n, bs) - hit_blocks
            table = hits.get(g, []) + fresh[pos:pos + count]
            pos += count
            tables.append(table)
            num_null.append(hits.get(g, []).count(self.null_block))  # sliding hits: leading placeholders
        r = _Request(n, tables, num_null)
        r.num_hit_tokens = hit_blocks * bs
        if caching:
            self.prefix_query_tokens += n
            self.prefix_hit_tokens += hit_blocks * bs
            r.num_hashed, r.parent_hash = hit_blocks, hashes[hit_blocks - 1] if hit_blocks else ROOT_HASH
            self._register(r, toks[hit_blocks:], hashes[hit_blocks:])
            r.tail = list(tokens[len(toks) * bs:])
        self._requests[req_id] = r
        return r.num_hit_tokens

    def append(self, req_id: object, token_id: int | None = None) -> bool:
        """Append one token (decode); a new block only when the last one is full. False: no room."""
        return self.append_tokens(req_id, 1 if token_id is None else (token_id,))

    def append_tokens(self, req_id: object, tokens: Sequence[int] | int) -> bool:
        """Append token ids (their full blocks join the prefix cache) or a count of anonymous tokens
        (which ends hashing for this request). Sliding groups first drop blocks wholly before
        ``num_tokens - window_tokens + 1``. Returns False (nothing changed) when the blocks do not fit."""
        r = self._get(req_id)
        known = not isinstance(tokens, int)
        n = len(tokens) if known else tokens
        if n < 0:
            raise ValueError(f"cannot append a negative number of tokens ({n})")
        bs, length = self.block_size, r.num_tokens
        grow = cdiv(length + n, bs) - cdiv(length, bs)
        drops, reclaim = [], 0
        for g, window in self._sliding:
            table, start = r.tables[g], r.num_null[g]
            stop = min(max(0, length - window + 1) // bs, len(table))
            if stop > start:
                drops.append((g, start, stop))
                reclaim += sum(1 for b in table[start:stop] if self._ref[b] == 1)
        if grow * len(self._attn) > self.num_free_blocks + reclaim:
            return False
        for g, start, stop in drops:
            table = r.tables[g]
            self._release(table[start:stop][::-1])  # vLLM order: the later blocks are evicted first
            table[start:stop] = [self.null_block] * (stop - start)
            r.num_null[g] = stop
        if grow:
            fresh = self._take(grow * len(self._attn))
            for j, g in enumerate(self._attn):
                r.tables[g] += fresh[j * grow:(j + 1) * grow]
        r.num_tokens = length + n
        if r.tail is not None:
            if not known:
                r.tail = None
            else:
                tail = r.tail
                tail += tokens
                full = len(tail) - len(tail) % bs
                if full:
                    self._register(r, [tuple(tail[s:s + bs]) for s in range(0, full, bs)], [])
                    del tail[:full]
        return True

    def free(self, req_id: object) -> None:
        """Finish a request: release its blocks tail first (cached ones stay reusable until evicted)."""
        r = self._requests.pop(req_id, None)
        if r is None:
            raise ValueError(f"cannot free unknown request id {req_id!r} (never allocated, or freed twice)")
        for table, num_null in zip(r.tables, r.num_null):
            self._release(table[:num_null - 1 if num_null else None:-1])
