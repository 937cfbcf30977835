"""What-if reports: expand a sweep into rows of key figures (never prints, never exits).

Structure of a sweep (so that 100,000 rows take well under two seconds):

- each model's spec is resolved ONCE (``resolve_model`` + ``build_spec``);
- every combination of the *pool* options (model, GPU, parallelism, dtypes, engine settings: everything
  but ``context``, ``batch`` and ``max_model_len``) is planned ONCE with :func:`kvplan.plan.plan_for_spec`:
  that gives the budget, the pool layout and ``num_blocks``, which do not depend on the per-request axes;
- each (context, batch, max_model_len) row then uses only the pool's :class:`kvplan.memory.Demand`
  (``blocks``, ``bytes``) and the cheap functions of :mod:`kvplan.memory` (``max_requests``,
  ``kv_cache_tokens``, ``vllm_max_concurrency``, ``max_context``, ``decode_roofline``) and the engine's
  rules (``plan.rules.starts``, ``plan.rules.kv_tokens``), memoised per pool, combined exactly as
  ``plan_for_spec`` combines them (a test compares rows with full plans).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import product
from typing import Any, Callable, Mapping, NamedTuple

from kvplan import memory
from kvplan.errors import KvplanError
from kvplan.plan import Plan, options_from_values, plan_for_spec
from kvplan.scenario import ROW_AXES, ScenarioFileError, WhatIfFile, Where, model_error
from kvplan.spec import ModelSpec, Overrides

SCHEMA_VERSION = 1

# the key figures of a row, in column order (CSV / JSON); bytes are per GPU
ROW_FIELDS = (
    "name", "model", "gpu", "gpus", "tp", "pp", "engine", "dtype", "kv_dtype", "weights_dtype", "block_size", "gpu_util",
    "context", "batch", "max_model_len",
    "kv_bytes_per_token", "weights_bytes", "total_bytes", "usable_bytes", "activation_bytes", "overhead_bytes",
    "cudagraph_bytes", "kv_budget_bytes", "num_blocks", "kv_tokens", "max_requests", "max_concurrency",
    "max_context_at_batch", "fits", "engine_starts", "decode_tokens_per_s",
)


class Pool:
    """One planned pool (a combination of pool options) and its memoised per-request figures.

    ``plan`` is the full plan at the pool's first row; only its pool-level parts (budget, layout,
    num_blocks, engine, weights) are read for the other rows.
    """

    LABELS = ("model", "gpu", "gpus", "tp", "pp", "engine", "dtype", "kv_dtype", "weights_dtype", "block_size", "gpu_util")
    __slots__ = ("plan", "label", "_bpr", "_ctx", "_starts", "_rkv", "_tps", "_validated", "_labels", "_figures")

    def __init__(self, plan: Plan, label: Mapping[str, Any]) -> None:
        self.plan = plan
        self.label = dict(label)
        self._bpr: dict[int, int] = {}
        self._ctx: dict[tuple[int, int], int] = {}
        self._starts: dict[int, bool] = {}
        self._rkv: dict[int, int] = {}
        self._tps: dict[tuple[int, int], float] = {}
        self._validated: set[int] = set()
        p, o, b = plan, plan.options, plan.budget
        self._labels = {"model": p.spec.model_id, "gpu": p.gpu.name, "gpus": o.gpu_count, "tp": o.tp, "pp": o.pp,
                        "engine": p.engine.engine, "dtype": p.model_dtype, "kv_dtype": p.kv_dtype,
                        "weights_dtype": p.weights_dtype, "block_size": p.layout.block_size, "gpu_util": b.gpu_util}
        self._figures = {"kv_bytes_per_token": p.kv_bytes_per_token_gpu, "weights_bytes": b.weights.bytes,
                         "total_bytes": b.total_bytes, "usable_bytes": b.usable_bytes,
                         "activation_bytes": b.activation.bytes, "overhead_bytes": b.overhead.bytes,
                         "cudagraph_bytes": b.cudagraph.bytes, "kv_budget_bytes": b.kv_budget_bytes,
                         "num_blocks": p.answer.num_blocks}

    def labels(self) -> dict[str, Any]:
        """What the pool is: model, GPU, parallelism, engine, dtypes, block size, utilisation."""
        return self._labels

    def figures(self) -> dict[str, Any]:
        """Pool-level figures (bytes per GPU): per-token bytes, budget terms, KV budget, blocks."""
        return self._figures

    # memoised memory.py calls ------------------------------------------------------------------
    def blocks_per_request(self, tokens: int) -> int:
        n = self._bpr.get(tokens)
        if n is None:
            n = self._bpr[tokens] = self.plan.demand.blocks(tokens)
        return n

    def max_context(self, batch: int, context: int) -> int:
        """``memory.max_context`` at ``batch``, limited as plan_for_spec limits it: ``max(max_position, context)``.

        Searched once per batch up to the model's limit; a context beyond the limit needs its own search only
        when everything up to the limit fits (blocks per request never shrink as tokens grow).
        """
        p = self.plan
        limit = p.spec.max_position_embeddings or memory.UNBOUNDED_TOKENS
        n = self._ctx.get((batch, limit))
        if n is None:
            n = self._ctx[(batch, limit)] = memory.max_context(p.answer.num_blocks, p.demand, batch, limit_tokens=limit)
        if context <= limit or n < limit:
            return n
        key = (batch, context)
        m = self._ctx.get(key)
        if m is None:
            m = self._ctx[key] = memory.max_context(p.answer.num_blocks, p.demand, batch, limit_tokens=context)
        return m

    def engine_starts(self, max_model_len: int) -> bool:
        ok = self._starts.get(max_model_len)
        if ok is None:
            p = self.plan
            ok = self._starts[max_model_len] = p.rules.starts(p.engine, p.answer.num_blocks,
                                                              self.blocks_per_request(max_model_len))
        return ok

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
            tps = self._tps[key] = memory.decode_roofline(p.budget.weights.bytes, rkv, batch,
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
    max_model_len: int
    kv_tokens: int
    max_requests: int  # whole requests of `context` tokens that fit at once
    max_concurrency: float  # vLLM's "Maximum concurrency" at max_model_len
    max_context_at_batch: int
    fits: bool  # batch x context fits
    engine_starts: bool
    decode_tokens_per_s: float | None  # decode roofline ceiling (HBM bandwidth bound)

    def to_dict(self) -> dict[str, Any]:
        """The row's figures under :data:`ROW_FIELDS` (bytes as integers)."""
        mc = self.max_concurrency
        tps = self.decode_tokens_per_s
        return {
            "name": self.name, **self.pool.labels(),
            "context": self.context, "batch": self.batch, "max_model_len": self.max_model_len,
            **self.pool.figures(),
            "kv_tokens": self.kv_tokens, "max_requests": self.max_requests,
            "max_concurrency": round(mc, 4) if mc != float("inf") else None,
            "max_context_at_batch": self.max_context_at_batch, "fits": self.fits, "engine_starts": self.engine_starts,
            "decode_tokens_per_s": round(tps, 1) if tps is not None else None,
        }


def make_row(pool: Pool, context: int, batch: int, max_model_len: int | None, name: str | None = None) -> Row:
    """The figures of one (context, batch, max_model_len) on ``pool``, combined as ``plan_for_spec`` does."""
    blocks = pool.plan.answer.num_blocks
    pool.validate_context(context)
    mml = max_model_len or context
    per_req_ctx = pool.blocks_per_request(context)
    per_req_len = per_req_ctx if mml == context else pool.blocks_per_request(mml)
    n = memory.max_requests(blocks, per_req_ctx)
    fits = max(0, blocks - memory.NULL_BLOCKS) >= batch * per_req_ctx
    return Row(name, pool, context, batch, mml,
               pool.plan.rules.kv_tokens(pool.plan.engine, blocks, pool.plan.layout, per_req_len, mml),
               n,
               memory.vllm_max_concurrency(blocks, per_req_len),
               pool.max_context(batch, context),
               fits,
               pool.engine_starts(mml),
               pool.decode_tokens_per_s(context, max(1, min(n, batch if fits else n) or 1)))


@dataclass(frozen=True)
class Report:
    """A what-if report: rows in sweep order (pool options outermost, then max_model_len, context, batch)."""

    title: str
    description: str | None
    file: str
    rows: tuple[Row, ...]
    varying: tuple[str, ...]  # ROW_FIELDS label columns whose value differs between rows
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def pools(self) -> list[Pool]:
        """The distinct pools, in row order."""
        seen: dict[int, Pool] = {}
        for row in self.rows:
            seen.setdefault(id(row.pool), row.pool)
        return list(seen.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "title": self.title,
            "description": self.description,
            "file": self.file,
            "num_rows": len(self.rows),
            "varying": list(self.varying),
            "notes": list(self.notes),
            "rows": [r.to_dict() for r in self.rows],
        }


LABEL_FIELDS = ("name", "model", "gpu", "gpus", "tp", "pp", "engine", "dtype", "kv_dtype", "weights_dtype", "block_size",
                "gpu_util", "context", "batch", "max_model_len")

Progress = Callable[[int, int], None]


class _Planner:
    """Resolves each model once and plans each pool once."""

    def __init__(self, whatif: WhatIfFile, offline: bool, token: str | None) -> None:
        self.whatif = whatif
        self.offline = offline
        self.token = token
        self.pools: dict[tuple[Any, ...], Pool] = {}

    def spec(self, v: Mapping[str, Any], where: Where) -> tuple[ModelSpec, str]:
        """The model's spec, resolved once per process (:func:`kvplan.sources.load_spec`)."""
        from kvplan.sources import load_spec

        try:
            spec, source = load_spec(str(v["model"]), revision=v.get("revision"), token=self.token,
                                     force_hub=bool(v.get("hub")), offline=self.offline or bool(v.get("offline")),
                                     refresh=bool(v.get("refresh")),
                                     overrides=Overrides(v.get("layers"), v.get("kv_heads"), v.get("head_dim")))
        except KvplanError as exc:
            raise model_error(where, "", v["model"], exc) from None
        return spec, source.describe()

    def pool(self, values: Mapping[str, Any], first_row: Mapping[str, Any], where: Where) -> Pool:
        pool_values = {k: v for k, v in values.items() if k not in ROW_AXES}
        key = tuple(sorted(pool_values.items()))
        pool = self.pools.get(key)
        if pool is None:
            model_where = self.whatif.where_of("model") if where == self.whatif.where else where
            spec, source = self.spec(pool_values, model_where)
            try:
                plan = plan_for_spec(spec, options_from_values({**pool_values, **first_row}), source)
            except KvplanError as exc:
                raise ScenarioFileError(where, f"{_describe_values(pool_values)}: {exc.message}", exc.hint) from None
            pool = self.pools[key] = Pool(plan, pool_values)
        return pool


def _describe_values(values: Mapping[str, Any]) -> str:
    shown = {k: v for k, v in values.items() if k in ("model", "gpu", "gpu_memory", "gpu_count", "tp", "pp", "kv_dtype",
                                                       "weights_dtype", "dtype", "engine", "block_size")}
    return "row " + ", ".join(f"{'gpus' if k == 'gpu_count' else k}={v}" for k, v in shown.items())


def _row_values(values: Mapping[str, Any]) -> tuple[int, int, int | None]:
    return int(values.get("context") or 8192), int(values.get("batch") or 1), values.get("max_model_len")


def build_report(whatif: WhatIfFile, *, offline: bool = False, token: str | None = None,
                 progress: Progress | None = None) -> Report:
    """Every row of ``whatif`` (sweep product, then explicit scenarios). Raises ScenarioFileError (file:line)."""
    planner = _Planner(whatif, offline, token)
    pool_axes = [a for a in whatif.axes if not set(a.names) <= set(ROW_AXES)]
    row_axes = [a for a in whatif.axes if set(a.names) <= set(ROW_AXES)]
    row_assigns: list[dict[str, Any]] = []
    for combo in product(*(a.values for a in row_axes)):
        assign: dict[str, Any] = {}
        for axis, vals in zip(row_axes, combo):
            assign.update(zip(axis.names, vals))
        row_assigns.append(assign)
    total = whatif.num_rows
    rows: list[Row] = []
    append = rows.append
    row_triples: dict[tuple[Any, ...], list[tuple[int, int, int | None]]] = {}
    if whatif.axes:
        for combo in product(*(a.values for a in pool_axes)):
            values = dict(whatif.defaults)
            for axis, vals in zip(pool_axes, combo):
                values.update(zip(axis.names, vals))
            if values.get("gpu") is None and values.get("gpu_memory") is None:
                values["gpu"] = "H100"
            pool = planner.pool(values, {**{k: values[k] for k in ROW_AXES if k in values}, **row_assigns[0]}, whatif.where)
            row_key = tuple(values.get(k) for k in ROW_AXES)
            triples = row_triples.get(row_key)
            if triples is None:
                triples = row_triples[row_key] = [_row_values({**values, **assign}) for assign in row_assigns]
            try:
                for context, batch, mml in triples:
                    append(make_row(pool, context, batch, mml))
            except KvplanError as exc:
                raise ScenarioFileError(whatif.where, f"{_describe_values(values)}: {exc.message}", exc.hint) from None
            if progress is not None:
                progress(len(rows), total)
    for explicit in whatif.scenarios:
        pool = planner.pool(explicit.values, {k: explicit.values[k] for k in ROW_AXES if k in explicit.values}, explicit.where)
        context, batch, mml = _row_values(explicit.values)
        try:
            append(make_row(pool, context, batch, mml, explicit.name))
        except KvplanError as exc:
            raise ScenarioFileError(explicit.where, exc.message, exc.hint) from None
    if progress is not None:
        progress(len(rows), total)
    return Report(whatif.title, whatif.description, whatif.display, tuple(rows), _varying(rows), _notes(rows))


def _varying(rows: list[Row]) -> tuple[str, ...]:
    """The label columns whose value differs between rows (constant ones are stated once instead)."""
    if not rows:
        return ()
    pools = {id(r.pool): r.pool for r in rows}.values()
    varying = {name for name in LABEL_FIELDS if name in Pool.LABELS and len({p.labels()[name] for p in pools}) > 1}
    for name in ("name", "context", "batch", "max_model_len"):
        if len({getattr(r, name) for r in rows}) > 1:
            varying.add(name)
    return tuple(n for n in LABEL_FIELDS if n in varying)


def _notes(rows: list[Row]) -> tuple[str, ...]:
    notes: list[str] = []
    pools: dict[int, Pool] = {}
    for r in rows:
        pools.setdefault(id(r.pool), r.pool)
    no_kv = [p for p in pools.values() if p.plan.budget.kv_budget_bytes <= 0]
    if no_kv:
        p = no_kv[0].plan
        notes.append(f"{len(no_kv)} of {len(pools)} configurations leave no memory for the KV cache "
                     f"(e.g. {p.spec.model_id} on {p.options.gpu_count}x {p.gpu.name})")
    return tuple(notes)
