"""The answer for one GPU's pool as the engine runs it: :class:`Deployment` owns every rule that turns blocks
into requests, so the answer, the paging comparison, prefix sharing, report rows and capacity checks agree.

Three limits decide what runs at once, and each is asked here only:

- the engine starts at all (:meth:`Deployment.refusal`: the engine's ``refusal`` rule: a model the release
  does not serve, a max_model_len past the model's maximum, a pool too small for one request);
- the scheduler runs at most ``max_num_seqs`` requests (:meth:`Deployment.request_limit`: vLLM's
  ``max_num_seqs``, SGLang's ``max_running_requests``);
- the pool's blocks (:class:`~kvplan.memory.Demand`: what one request holds; with prefix caching on, a prefix
  every request shares is stored once: :meth:`~kvplan.memory.Demand.batch_blocks`, asked through
  :meth:`Deployment.batch_blocks`).

``max_model_len`` is either fixed (``--max-model-len N`` or ``auto``) or follows the context (the default:
the engine is launched with ``--max-model-len`` = the context); the longest context at a batch is the longest
the deployment serves, so with a following max_model_len it is bounded by the model's maximum, not by
``--context``.
"""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING

from kvplan import memory
from kvplan.model.spec import ModelSpec
from kvplan.units import plural
from kvplan.frozen import frozen

if TYPE_CHECKING:  # pragma: no cover
    from kvplan.engines import Engine, EngineDefaults, ModelLength

MEMO_ENTRIES = 65_536  # memoised per-length figures per deployment (a report asks for many), cleared when full



def null_block_words(engine: str) -> str:
    """Why the spare (or short) blocks of a verdict are one off ``blocks - batch x request blocks``: the engine
    keeps :data:`kvplan.memory.NULL_BLOCKS` block(s) as its null block, never a request's. Said wherever spare or
    short blocks are shown."""
    return f"{plural(memory.NULL_BLOCKS, 'null block')} kept by {engine}"

@frozen
class Answer:
    """The headline answer for one GPU's pool (tokens, blocks, requests)."""

    num_blocks: int
    kv_tokens: int  # the engine's logged token figure at max_model_len
    capacity_tokens: int  # num_blocks x block_size (raw slots)
    context: int
    blocks_per_request: int
    max_concurrency: float  # vLLM's float: num_blocks / blocks per request at max_model_len
    max_requests: int  # requests of `context` tokens running at once: min(pool, max_num_seqs); 0 when refused
    batch: int
    max_context_at_batch: int  # the longest context `batch` requests of which run at once (0: none)
    fits: bool  # the engine starts, batch <= max_num_seqs and batch x context fits the pool
    fits_margin_blocks: int  # free blocks after batch x context (negative: short by)
    engine_starts: bool  # the engine starts with this max_model_len (refusal is None)
    longest_startable_len: int  # longest max_model_len that starts (at most the model's maximum)
    fix: str | None  # the flags that would make batch x context fit
    pool_requests: int = 0  # requests of `context` tokens the pool's blocks hold (memory alone)
    max_num_seqs: int = 0  # requests the engine's scheduler runs at once at most
    refusal: str | None = None  # why the engine refuses to start (None: it starts)
    model_max_len: int | None = None  # the longest max_model_len the engine accepts for the model (None: no maximum)
    model_max_len_rule: str = ""  # how it follows from the config (max_position_embeddings, rope scaling)
    idle_reason: str | None = None  # why no request of max_model_len runs although the engine starts with it
    shared_prefix_tokens: int = 0  # the prefix every request shares, counted once (prefix caching on; 0: none)
    shared_blocks: int = 0  # block ids of that prefix stored once (in the requests, fits and max context above)
    unshared_requests: int = 0  # max_requests were each request to store its own copy of the prefix

    @property
    def limited_by(self) -> str:
        """What bounds ``max_requests``: ``refused`` (the engine does not start), ``max_num_seqs`` or ``pool``."""
        if self.refusal is not None:
            return "refused"
        return "max_num_seqs" if self.max_num_seqs < self.pool_requests else "pool"


@frozen
class Deployment:
    """One GPU's pool of ``blocks`` under the engine's rules: the one place that decides whether it starts,
    how many requests run at once and the longest context at a batch (all lengths in tokens).

    ``max_num_seqs``: the user's limit (None: the engine's own, which SGLang derives from the pool).
    ``prefix_tokens``: a prefix every request shares, which the pool stores once (pass it only when the engine
    runs with prefix caching: :func:`credited_prefix`); requests, fits, margin and max context count with it.
    ``max_model_len`` arguments: the engine's max_model_len, or None when it follows the context.
    """

    spec: ModelSpec
    engine: "EngineDefaults"
    rules: "Engine"
    demand: memory.Demand
    blocks: int
    max_num_seqs: int | None = None
    prefix_tokens: int = 0
    _memo: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    # per-length figures (memoised) -------------------------------------------------------------
    def _get(self, key: tuple, make):  # noqa: ANN001, ANN202
        value = self._memo.get(key)
        if value is None:
            if len(self._memo) >= MEMO_ENTRIES:
                self._memo.clear()
            value = self._memo[key] = make()
        return value

    def blocks_per_request(self, tokens: int) -> int:
        """Block ids one request of ``tokens`` tokens holds (:meth:`~kvplan.memory.Demand.blocks`)."""
        return self._get(("blocks", tokens), lambda: self.demand.blocks(tokens))

    @property
    def model_length(self) -> "ModelLength":
        """The model's maximum length as the engine derives it (``model_max_len``), with its rule."""
        return self._get(("model_length",), lambda: self.rules.model_max_len(self.engine, self.spec))

    @property
    def model_limit(self) -> int:
        """The longest max_model_len the engine accepts (tokens; unbounded when the config names none)."""
        return self.model_length.tokens or memory.UNBOUNDED_TOKENS

    def kv_tokens(self, max_model_len: int) -> int:
        """The token figure the engine logs at start-up with this max_model_len."""
        return self.rules.kv_tokens(self.engine, self.blocks, self.demand.layout,
                                    self.blocks_per_request(max_model_len), max_model_len)

    def refusal(self, max_model_len: int) -> str | None:
        """Why the engine refuses to start with ``max_model_len`` (one line), or None when it starts."""
        why = self._get(("refusal", max_model_len), lambda: self.rules.refusal(
            self.engine, self.spec, self.blocks, self.blocks_per_request(max_model_len),
            self.demand.layout.block_bytes, max_model_len) or "")
        return why or None

    def request_limit(self, max_model_len: int) -> int:
        """Requests the engine's schedulers run at once at most (``max_num_seqs`` / ``max_running_requests``; each of
        vLLM V0's virtual engines has its own scheduler: :attr:`shards`)."""
        slots = self.blocks * self.demand.layout.block_size
        return self.shards * self.rules.request_limit(self.engine, self.max_num_seqs, slots, max_model_len)

    @property
    def shards(self) -> int:
        """The parts the pool is split into, each with its own scheduler and requests (vLLM V0 at pp >= 2: one per
        virtual engine, ``num_gpu_blocks // pp`` blocks each; ``EngineDefaults.pool_shards``); 1 elsewhere."""
        return max(1, self.engine.pool_shards)

    @property
    def shard_blocks(self) -> int:
        """Blocks one shard holds (all of them with one shard)."""
        return self.blocks // self.shards

    def _per_shard(self, batch: int) -> int:
        """Requests of ``batch`` the fullest shard holds (the engine sends each to the least busy one)."""
        return -(-batch // self.shards)

    # the answer ----------------------------------------------------------------------------------
    def batch_blocks(self, batch: int, context: int) -> int:
        """Block ids ``batch`` requests of ``context`` tokens hold, the shared prefix stored once
        (:meth:`kvplan.memory.Demand.batch_blocks`)."""
        return self.demand.batch_blocks(batch, context, self.prefix_tokens)

    def shared_blocks(self, context: int) -> int:
        """Block ids of the shared prefix stored once at ``context`` (0: no prefix credited)."""
        return self.demand.shared_blocks(context, self.prefix_tokens) if self.prefix_tokens else 0

    def pool_requests(self, context: int) -> int:
        """Requests of ``context`` tokens the pool's blocks hold at once (the null block reserved; the shared
        prefix stored once)."""
        if not self.prefix_tokens:
            return self.shards * memory.max_requests(self.shard_blocks, self.blocks_per_request(context))
        return self._get(("pool", context), lambda: self.shards * memory.max_sharing_requests(
            self.shard_blocks, self.demand, context, self.prefix_tokens))

    def request_cap(self, max_model_len: int) -> int:
        """The most requests running at once whatever the pool: 0 when the engine refuses, else its limit."""
        return 0 if self.refusal(max_model_len) else self.request_limit(max_model_len)

    def max_requests(self, context: int, max_model_len: int | None = None) -> int:
        """Requests of ``context`` tokens running at once: the pool's, capped by :meth:`request_cap`."""
        return min(self.pool_requests(context), self.request_cap(max_model_len or context))

    def margin_blocks(self, batch: int, context: int) -> int:
        """Free usable blocks after ``batch`` requests of ``context`` tokens (negative: short by)."""
        held = self._per_shard(batch)  # the fullest shard's
        if not self.prefix_tokens:
            return max(0, self.shard_blocks - memory.NULL_BLOCKS) - held * self.blocks_per_request(context)
        return max(0, self.shard_blocks - memory.NULL_BLOCKS) - self.batch_blocks(held, context)

    def fits(self, batch: int, context: int, max_model_len: int | None = None) -> bool:
        """``batch`` requests of ``context`` tokens run at once: the engine starts, the scheduler takes
        ``batch`` and the pool holds them."""
        return batch <= self.request_cap(max_model_len or context) and self.margin_blocks(batch, context) >= 0

    def max_context(self, batch: int, max_model_len: int | None = None) -> int:
        """The longest context of which ``batch`` requests run at once, 0 when none does.

        With a fixed ``max_model_len``: at most it, and 0 when the engine refuses it. Following the context:
        at most the model's maximum (the engine refuses longer), whatever the context asked for.
        """
        if max_model_len is not None:
            if batch > self.request_cap(max_model_len):
                return 0
            return self._get(("ctx", batch, max_model_len), lambda: memory.max_context(
                self.shard_blocks, self.demand, self._per_shard(batch), limit_tokens=max_model_len,
                prefix_tokens=self.prefix_tokens))
        if self.refusal(1):
            return 0  # it refuses whatever the length (the model, an empty pool)
        longest = self._get(("ctx", batch, None), lambda: memory.max_context(
            self.shard_blocks, self.demand, self._per_shard(batch), limit_tokens=self.model_limit,
            prefix_tokens=self.prefix_tokens))
        if longest < 1 or batch <= self.request_limit(longest):
            return longest
        # the scheduler's limit shrinks as the length grows (SGLang derives it from the pool): the longest
        # length whose limit still takes the batch
        lo, hi = 0, longest  # request_limit(hi) < batch
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if batch <= self.request_limit(mid) else (lo, mid)
        return lo

    def longest_startable_len(self) -> int:
        """The longest max_model_len (at most the model's maximum) with which the engine starts; 0 when it
        refuses whatever the length. Block-aligned when the pool is what limits it (the engine's
        ``longest_start``: the same check as :meth:`refusal`). At least :meth:`max_context` at batch 1; longer
        where the engine starts with a length no request of which runs (:meth:`idle_reason`)."""
        if self.refusal(1):
            return 0
        return self._get(("longest",), lambda: self.rules.longest_start(self.engine, self.blocks, self.demand,
                                                                         self.model_limit))

    def longest_runnable_len(self) -> int:
        """The longest max_model_len with which the engine starts and one request that long runs (tokens; 0:
        none): what ``--max-model-len auto`` picks."""
        return min(self.longest_startable_len(), self.max_context(1))

    def idle_reason(self, max_model_len: int) -> str | None:
        """Why no request of ``max_model_len`` tokens runs although the engine starts with it (the engine's
        ``idle_reason``: vLLM before 0.29 counts the null block in its start-up check; SGLang caps a request at
        the pool), or None: one runs, or the engine refuses (:meth:`refusal` says why)."""
        if self.refusal(max_model_len) or self.pool_requests(max_model_len) >= 1:
            return None
        return self.rules.idle_reason(self.engine, max_model_len, self.blocks_per_request(max_model_len),
                                      self.blocks, self.max_context(1))

    def answer(self, context: int, batch: int, max_model_len: int | None = None) -> Answer:
        """Every headline figure at ``batch`` x ``context`` (``max_model_len`` None: it follows the context)."""
        mml = max_model_len or context
        per_len = self.blocks_per_request(mml)
        refusal = self.refusal(mml)
        return Answer(
            num_blocks=self.blocks,
            kv_tokens=self.kv_tokens(mml),
            capacity_tokens=self.blocks * self.demand.layout.block_size,
            context=context,
            blocks_per_request=self.blocks_per_request(context),
            max_concurrency=memory.vllm_max_concurrency(self.blocks, per_len),
            max_requests=self.max_requests(context, mml),
            batch=batch,
            max_context_at_batch=self.max_context(batch, max_model_len),
            fits=self.fits(batch, context, mml),
            fits_margin_blocks=self.margin_blocks(batch, context),
            engine_starts=refusal is None,
            longest_startable_len=self.longest_startable_len(),
            fix=None,
            pool_requests=self.pool_requests(context),
            max_num_seqs=self.request_limit(mml),
            refusal=refusal,
            model_max_len=self.model_length.tokens,
            model_max_len_rule=self.model_length.rule,
            idle_reason=self.idle_reason(mml),
            shared_prefix_tokens=self.prefix_tokens,
            shared_blocks=self.shared_blocks(context),
            unshared_requests=min(self.shards * memory.max_requests(self.shard_blocks, self.blocks_per_request(context)),
                                  self.request_cap(mml)),
        )


def credited_prefix(prefix_tokens: int, prefix_caching: bool) -> int:
    """The shared prefix a deployment's answer counts once: ``prefix_tokens`` when the engine runs with prefix
    caching, else 0 (each request then stores its own copy)."""
    return prefix_tokens if prefix_caching else 0
