"""A what-if report's rows: each pool planned once (Pool, its per-request figures memoised in bounded memory) and a
row's key figures from it (make_row), combined exactly as kvplan.planning.plan.plan_for_spec combines them; the
row's columns (CSV / JSON) from the option table.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, NamedTuple

from kvplan import memory
from kvplan.options import PLAN_OPTIONS, ROW_AXES
from kvplan.planning.plan import Plan

MEMO_ENTRIES = 65_536  # per-pool memo of two-key figures, cleared when full (memory stays bounded)

# the columns of a row (CSV / JSON), from the option table: the scenario's name, every option that changes the
# plan (kvplan.options.PLAN_OPTIONS, as Plan.option_values gives them: feed them back to plan the row again),
# the per-request axes, then the figures (bytes per GPU)
POOL_LABELS = tuple(o.name for o in PLAN_OPTIONS if o.name not in ROW_AXES)
LABEL_FIELDS = ("name", *POOL_LABELS, "context", "batch", "max_model_len")
FIGURE_FIELDS = (
    "kv_bytes_per_token", "weights_bytes", "total_bytes", "usable_bytes", "activation_bytes", "overhead_bytes",
    "cudagraph_bytes", "kv_budget_bytes", "num_blocks", "kv_tokens", "max_requests", "max_requests_low",
    "max_requests_high", "max_concurrency",
    "max_context_at_batch", "fits", "engine_starts", "decode_tokens_per_s", "why",
)
ROW_FIELDS = LABEL_FIELDS + FIGURE_FIELDS
# the labels the tables show when they vary (the others only when the file sets them)
SHOWN_LABELS = ("model", "gpu", "gpus", "tp", "pp", "engine", "dtype", "kv_dtype", "weights_dtype", "block_size", "gpu_util")


class Pool:
    """One planned pool (a combination of pool options) and its memoised per-request figures.

    ``plan`` is the full plan at the pool's first row; only its pool-level parts (budget, layout,
    num_blocks, engine, weights) are read for the other rows.
    """

    LABELS = POOL_LABELS
    __slots__ = ("plan", "label", "deployment", "low", "high", "_rkv", "_tps", "_validated", "_labels", "_figures")

    def __init__(self, plan: Plan, label: Mapping[str, Any]) -> None:
        self.plan = plan
        self.label = dict(label)
        self.deployment = plan.deployment  # the answer's rules, memoised per length
        rng = plan.kv_range  # the same rules at the ends of kvplan's range
        self.low, self.high = (rng.low_deployment, rng.high_deployment) if rng else (self.deployment, self.deployment)
        self._rkv: dict[int, int] = {}
        self._tps: dict[tuple[int, int], float] = {}
        self._validated: set[int] = set()
        p, b = plan, plan.budget
        values = plan.option_values
        self._labels = {k: values[k] for k in POOL_LABELS}  # gpu None: a custom GPU (gpu_memory)
        self._figures = {"kv_bytes_per_token": p.kv_bytes_per_token_gpu, "weights_bytes": b.weights.bytes,
                         "total_bytes": b.total_bytes, "usable_bytes": b.usable_bytes,
                         "activation_bytes": b.activation.bytes, "overhead_bytes": b.overhead.bytes,
                         "cudagraph_bytes": b.cudagraph.bytes, "kv_budget_bytes": b.kv_budget_bytes,
                         "num_blocks": p.answer.num_blocks}

    def labels(self) -> dict[str, Any]:
        """What the pool is: every option of :data:`POOL_LABELS` as the plan resolved it (``max_num_seqs`` at
        the first row's max_model_len: a row has its own)."""
        return self._labels

    def figures(self) -> dict[str, Any]:
        """Pool-level figures (bytes per GPU): per-token bytes, budget terms, KV budget, blocks."""
        return self._figures

    # the deployment's rules (kvplan.planning.answer.Deployment, memoised there) --------------------------
    def blocks_per_request(self, tokens: int) -> int:
        return self.deployment.blocks_per_request(tokens)

    def engine_starts(self, max_model_len: int) -> bool:
        return self.deployment.refusal(max_model_len) is None

    def decode_tokens_per_s(self, context: int, batch: int) -> float | None:
        p = self.plan
        if not p.gpu.bandwidth_bytes_per_s:
            return None
        key = (context, batch)
        tps = self._tps.get(key)
        if tps is None:
            rkv = self._rkv.get(context)
            if rkv is None:
                rkv = self._rkv[context] = p.demand.bytes(context)
            if len(self._tps) >= MEMO_ENTRIES:  # (context, batch) pairs rarely repeat: keep the memo bounded
                self._tps.clear()
            tps = self._tps[key] = memory.decode_roofline(memory.step_weight_bytes(p.budget.weights.bytes, p.spec, batch),
                                                          rkv, batch,
                                                          p.gpu.bandwidth_bytes_per_s).tokens_per_s
        return tps

    def validate_context(self, context: int) -> None:
        """Options' own check of a context against the pool (only ``prefix_tokens <= context`` depends on it)."""
        if self.plan.options.prefix_tokens and context not in self._validated:
            replace(self.plan.options, context=context)  # raises InputError like the CLI would
            self._validated.add(context)


class Row(NamedTuple):
    """One scenario's key figures (tokens, requests; bytes per GPU in ``pool.plan``).

    Immutable like the frozen dataclasses elsewhere; a NamedTuple because a sweep makes 100,000 of them
    and a frozen dataclass's ``__init__`` costs four times as much.
    """

    name: str | None
    pool: Pool
    context: int
    batch: int
    max_model_len: int | None  # as set: None when it follows the context (then the longest context is the model's)
    max_num_seqs: int  # the engine's limit on requests at once at max_model_len (SGLang's depends on it)
    kv_tokens: int
    max_requests: int  # whole requests of `context` tokens that fit at once
    max_requests_low: int  # ... at the low end of kvplan's range (Plan.kv_range)
    max_requests_high: int  # ... at its high end
    max_concurrency: float  # vLLM's "Maximum concurrency" at max_model_len
    max_context_at_batch: int
    fits: bool  # batch x context fits
    engine_starts: bool
    decode_tokens_per_s: float | None  # decode roofline ceiling (HBM bandwidth bound)
    why: str | None = None  # why the row does not fit when memory is not the reason (over the model's maximum length)

    def to_dict(self) -> dict[str, Any]:
        """The row's figures under :data:`ROW_FIELDS` (bytes as integers)."""
        mc = self.max_concurrency
        tps = self.decode_tokens_per_s
        return {
            "name": self.name, **self.pool.labels(), "max_num_seqs": self.max_num_seqs,
            "context": self.context, "batch": self.batch, "max_model_len": self.max_model_len,
            **self.pool.figures(),
            "kv_tokens": self.kv_tokens, "max_requests": self.max_requests,
            "max_requests_low": self.max_requests_low, "max_requests_high": self.max_requests_high,
            "max_concurrency": round(mc, 4) if mc != float("inf") else None,
            "max_context_at_batch": self.max_context_at_batch, "fits": self.fits, "engine_starts": self.engine_starts,
            "decode_tokens_per_s": round(tps, 1) if tps is not None else None,
            "why": self.why,
        }


def make_row(pool: Pool, context: int, batch: int, max_model_len: int | None, name: str | None = None) -> Row:
    """The figures of one (context, batch, max_model_len) on ``pool``: the answer's own rules
    (:class:`kvplan.planning.answer.Deployment`), so a row says what ``kvplan estimate`` says."""
    d = pool.deployment
    pool.validate_context(context)
    mml = max_model_len or context
    n = d.max_requests(context, mml)
    fits = d.fits(batch, context, mml)
    low = n if pool.low is d else pool.low.max_requests(context, mml)
    high = n if pool.high is d else pool.high.max_requests(context, mml)
    return Row(name, pool, context, batch, max_model_len, d.request_limit(mml), d.kv_tokens(mml), n, low, high,
               memory.vllm_max_concurrency(d.blocks, d.blocks_per_request(mml)),
               d.max_context(batch, max_model_len),
               fits,
               pool.engine_starts(mml),
               pool.decode_tokens_per_s(context, min(n, batch) if fits else n) if n else None,
               None if fits else over_model_length(d, max(context, mml)))


def over_model_length(d: Any, tokens: int) -> str | None:
    """Why ``tokens`` cannot run on deployment ``d`` whatever the memory: over the model's maximum length
    (``over the model's maximum length 4,096 (max_position_embeddings)``), or ``None``."""
    if tokens <= d.model_limit:
        return None
    return f"over the model's maximum length {d.model_length.rule}"
