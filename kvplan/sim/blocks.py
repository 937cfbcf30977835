"""Block accounting of one simulated policy over the real allocator (:mod:`kvplan.paged.allocator`).

The allocator hears about a request's tokens only when they need a new block (``sync``): decoders are
bucketed by ``off % block_size`` (a decoder holds ``D + off`` tokens at step counter D), so the decoders
that cross a block boundary at a step are one bucket, and the blocks all decoders need over the next
``k`` steps are a sum over buckets (:meth:`BlockBook.crossings`). The unused token slots of the used
blocks (internal fragmentation) are kept the same way, in O(block_size) per query.
"""

from __future__ import annotations

from operator import mul

from kvplan.paged.allocator import BlockAllocator, GroupSpec
from kvplan.sim.model import Pool
from kvplan.sim.streams import Live
from kvplan.units import cdiv

# token ids: prefix group g uses [g << 40, ...); request i's own tokens [2^62 + i << 40, ...): no two
# requests' own tokens and no prefix share an id (a request holds fewer than 2^40 tokens)
_ID_STRIDE = 1 << 40
_UNIQUE_ID_BASE = 1 << 62


class BlockBook:
    """The allocator of one policy and which tokens of each live request it knows."""

    def __init__(self, pool: Pool, policy: str) -> None:
        self.bs = bs = pool.block_size
        self.reserve = policy == "contiguous"
        self.caching = policy == "prefix_caching"
        groups = pool.groups
        if self.caching and pool.prefix_state_blocks:
            it = iter(pool.prefix_state_blocks)
            groups = tuple(GroupSpec("state", state_blocks=next(it)) if g.kind == "state" else g for g in groups)
        self.alloc = BlockAllocator(pool.num_blocks, bs, groups, enable_prefix_caching=self.caching)
        self.usable = self.alloc.num_usable_blocks
        self.n_attn = sum(1 for g in groups if g.kind != "state")
        self.sliding = any(g.kind == "sliding" for g in groups)
        self.reserve_tokens = pool.max_model_len  # contiguous: what each request reserves (a count)
        self.reserve_slots = cdiv(pool.max_model_len, bs) * bs
        self.blocks_per_reservation = cdiv(pool.max_model_len, bs) * self.n_attn if self.reserve else 0
        self.buckets: list[dict[int, Live]] = [{} for _ in range(bs)]  # decoders by off % bs, by index
        self.bcount = [0] * bs  # len() of each bucket
        # fill[p][b]: unused slots of a decoder in bucket b when D % bs == p
        self.fill = [[-(p + b) % bs for b in range(bs)] for p in range(bs)]
        self.n_dec = 0  # decoders
        self.s_off = 0  # sum of their offs
        self.pf_unused = 0  # unused slots of prefilling requests' last blocks (paged)
        self._prefix_lists: dict[int, list[int]] = {}

    # ---- the allocator ------------------------------------------------------------------------
    def _tokens_of(self, r: Live, n: int) -> list[int] | int:
        """What to allocate for a prefill of ``n`` tokens: ids (prefix caching) or a count."""
        if self.reserve:
            return self.reserve_tokens
        if not self.caching:
            return n
        pid, plen = r.prefix_id, r.prefix_tokens
        base = _UNIQUE_ID_BASE + r.index * _ID_STRIDE
        if pid < 0 or plen == 0:
            return list(range(base, base + n))
        plist = self._prefix_lists.get(pid)
        if plist is None or len(plist) < plen:
            start = pid * _ID_STRIDE
            plist = self._prefix_lists[pid] = list(range(start, start + max(plen, len(plist or ()))))
        plen = min(plen, n)
        return plist[:plen] + list(range(base, base + n - plen))

    def admit(self, r: Live, n: int) -> int | None:
        """Allocate ``r``'s prefill of ``n`` tokens; the tokens found cached, or None when it does not fit."""
        hit = self.alloc.allocate(r.index, self._tokens_of(r, n))
        if hit is not None:
            r.synced = r.pf_tokens = n
            if not self.reserve:
                self.pf_unused += -n % self.bs
        return hit

    def prefill_done(self, r: Live) -> None:
        if not self.reserve:
            self.pf_unused -= -r.pf_tokens % self.bs

    def free(self, r: Live) -> None:
        self.alloc.free(r.index)

    def sync(self, r: Live, tokens: int) -> bool:
        """Tell the allocator ``r`` now holds ``tokens`` tokens (False: no room for the next block).

        With sliding groups the tokens go in up to each block boundary first, so the blocks that left
        the window are released before the next block is taken (as vLLM does at that step)."""
        append, s, i = self.alloc.append_tokens, r.synced, r.index
        if self.sliding:
            bs = self.bs
            edge = cdiv(s, bs) * bs  # appending token edge + 1 takes a new block
            while edge < tokens:
                if edge > s:
                    append(i, edge - s)
                    s = r.synced = edge
                if not append(i, 1):
                    return False
                s = r.synced = edge + 1
                edge += bs
        if tokens > s and not append(i, tokens - s):
            return False
        r.synced = tokens
        return True

    # ---- decoders -----------------------------------------------------------------------------
    def add_decoder(self, r: Live) -> None:
        b = r.off % self.bs
        self.buckets[b][r.index] = r
        self.bcount[b] += 1
        self.n_dec += 1
        self.s_off += r.off

    def remove_decoder(self, r: Live) -> None:
        b = r.off % self.bs
        del self.buckets[b][r.index]
        self.bcount[b] -= 1
        self.n_dec -= 1
        self.s_off -= r.off

    def crossing(self, D: int) -> dict[int, Live]:
        """The decoders whose next token (at step counter D) needs a new block."""
        return self.buckets[-D % self.bs]

    def crossings(self, D: int, k: int) -> int:
        """Blocks the decoders need over the next ``k`` steps from counter D."""
        if self.reserve:
            return 0
        bs, total = self.bs, 0
        for n, first in zip(self.bcount, self.fill[D % bs]):
            if n and first < k:
                total += n * ((k - 1 - first) // bs + 1)
        return total * self.n_attn

    def crossings_sum(self, D: int, k: int) -> int:
        """``sum(crossings(D, m) for m in 1..k)`` in O(block_size): the blocks decoders have taken by each of
        the next ``k`` steps (a step's own crossings included), summed over the steps."""
        if self.reserve or k <= 0:
            return 0
        bs, total = self.bs, 0
        for n, first in zip(self.bcount, self.fill[D % bs]):
            if n and first < k:
                # sum over m in first+1..k of ((m - 1 - first) // bs + 1) = sum over t in 0..T of (t // bs + 1)
                count = k - first  # T + 1
                q, r = divmod(count, bs)
                total += n * (bs * q * (q - 1) // 2 + q * r + count)
        return total * self.n_attn

    def advance(self, D: int, k: int) -> None:
        """Sync every decoder that crosses a block boundary within ``k`` steps from D (they all fit)."""
        if self.reserve:
            return
        bs, end = self.bs, D + k
        for b, members in enumerate(self.buckets):
            if members and -(D + b) % bs < k:
                for r in members.values():
                    ok = self.sync(r, end + r.off)
                    assert ok

    def offs(self) -> list[int]:
        return [r.off for members in self.buckets for r in members.values()]

    # ---- what the pool holds ------------------------------------------------------------------
    def unused_slots(self, D: int, n_running: int, prefill_tokens: int) -> int:
        """Allocated but unfilled token slots (all attention groups); ``prefill_tokens``: of prefilling requests."""
        if self.reserve:
            live = self.n_dec * D + self.s_off + prefill_tokens
            return self.n_attn * (n_running * self.reserve_slots - live)
        return self.n_attn * (self.pf_unused + sum(map(mul, self.bcount, self.fill[D % self.bs])))

    def usage_and_frag(self, D: int, n_running: int, prefill_tokens: int) -> tuple[float, float]:
        """(used blocks / usable blocks, unused slots / slots of used blocks)."""
        used = self.alloc.num_used_blocks
        if not used:
            return 0.0, 0.0
        return used / self.usable, self.unused_slots(D, n_running, prefill_tokens) / (used * self.bs)
