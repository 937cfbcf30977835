"""What-if reports: expand a sweep into rows of key figures (never prints, never exits).

Structure of a sweep (so that 100,000 rows take well under two seconds):

- each model's spec is resolved ONCE (``kvplan.model.sources.load_spec``, the one spec cache);
- every combination of the *pool* options (model, GPU, parallelism, dtypes, engine settings: everything
  but ``context``, ``batch`` and ``max_model_len``) is planned ONCE with :func:`kvplan.planning.plan.plan_for_spec`:
  that gives the budget, the pool layout and ``num_blocks``, which do not depend on the per-request axes;
- each (context, batch, max_model_len) row then uses only the pool's :class:`kvplan.memory.Demand`
  (``blocks``, ``bytes``) and the cheap functions of :mod:`kvplan.memory` (``max_requests``,
  ``kv_cache_tokens``, ``vllm_max_concurrency``, ``max_context``, ``decode_roofline``) and the engine's
  rules (``plan.rules.starts``, ``plan.rules.kv_tokens``), memoised per pool, combined exactly as
  ``plan_for_spec`` combines them (a test compares rows with full plans).

Size: a :class:`Sweep` counts its rows and pool configurations before any work and refuses past
:data:`MAX_ROWS` rows or :data:`MAX_POOLS` configurations unless forced; it plans every pool first (so
the columns that vary and the notes are known), then yields rows one at a time. :class:`RowDigest` keeps
what tables and plots need from them (head, tail, plot points) in bounded memory, so the CLI streams
every row to CSV / JSON without holding them; :func:`build_report` (the Python API) keeps them all. A row, its
pool and its columns: :mod:`kvplan.checks.rows`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import field
from itertools import product
from typing import Any, Callable, Iterator, Mapping

from kvplan.errors import InputError, KvplanError
from kvplan.planning.plan import options_from_values, plan_for_spec
from kvplan.options import ROW_AXES
from kvplan.checks.fields import in_file_words
from kvplan.checks.rows import LABEL_FIELDS, Pool, Row, make_row
from kvplan.checks.scenario import WhatIfFile, model_error
from kvplan.io.yamldoc import ScenarioFileError, Where
from kvplan.model.spec import ModelSpec, Overrides
from kvplan.units import plural
from kvplan.frozen import frozen

SCHEMA_VERSION = 1
MAX_ROWS = 1_000_000
"""Rows a report may have without ``--force``: about a minute and ~1.6 GB of CSV + JSON (a row is ~260 B of
CSV and ~1.3 KB of JSON: every option that changes the plan, then the figures); the terminal, Markdown and
HTML show a head and a tail of them anyway."""
MAX_POOLS = 10_000
"""Distinct pool configurations (every option but context, batch, max_model_len) a report may plan without
``--force``: each is one full plan (2-4 ms, ~8 KiB kept), so 10,000 take ~30 s."""

Progress = Callable[[int, int], None]


class RowDigest:
    """What the tables and the concurrency plot need from a stream of rows, in bounded memory: the first
    ``keep`` rows, the last ``keep`` after them, and the (context -> max requests) points of the first
    ``max_lines`` pools that have more than one context (and how many pools have)."""

    def __init__(self, keep: int = 2000, max_lines: int = 144) -> None:  # report_plots: 12 panels x 12 lines
        self.keep, self.max_lines = keep, max_lines
        self.count = 0
        self.head: list[Row] = []
        self.tail: deque[Row] = deque(maxlen=keep)
        self.lines: dict[int, tuple[Pool, dict[int, int]]] = {}  # pools plotted (>1 context)
        self._first: dict[int, tuple[int, int]] = {}  # pools with one context so far: (context, max requests)
        self.num_lines = 0
        self.over_length: dict[int, set[str]] = {}  # model maximum length -> models with rows over it (not plotted)

    def add(self, row: Row) -> None:
        self.count += 1
        if len(self.head) < self.keep:
            self.head.append(row)
        else:
            self.tail.append(row)
        if row.why is not None:  # over the model's maximum length: not a point of memory running out
            self.over_length.setdefault(row.pool.deployment.model_limit, set()).add(str(row.pool.labels()["model"]))
            return
        key = id(row.pool)
        line = self.lines.get(key)
        if line is not None:
            line[1][row.context] = row.max_requests
            return
        first = self._first.get(key)
        if first is None:
            self._first[key] = (row.context, row.max_requests)
        elif first[0] == row.context:
            self._first[key] = (row.context, row.max_requests)
        elif first[0] != -1:
            self.num_lines += 1
            if len(self.lines) < self.max_lines:
                self.lines[key] = (row.pool, {first[0]: first[1], row.context: row.max_requests})
            self._first[key] = (-1, 0)  # counted; not plotted

    def sample(self, limit: int) -> list[Row | None]:
        """At most ``limit`` rows: all of them, or the head and the tail around a ``None`` gap marker."""
        assert limit <= self.keep, "the digest keeps fewer rows than asked for"
        if self.count <= limit:
            return list(self.head[:self.count])
        head_n = limit - max(1, limit // 8)
        tail_n = limit - head_n
        last = (self.head + list(self.tail))[-tail_n:]
        return list(self.head[:head_n]) + [None] + last


@frozen
class Report:
    """A what-if report: rows in sweep order (pool options outermost, then max_model_len, context, batch).

    ``rows`` holds every row when the report was built whole (:func:`build_report`); a streamed report
    (the CLI) has ``rows=None`` and its ``digest`` (head, tail, plot points) only.
    """

    title: str
    description: str | None
    file: str
    num_rows: int
    varying: tuple[str, ...]  # ROW_FIELDS label columns whose value differs between rows
    notes: tuple[str, ...]
    pools: tuple[Pool, ...]  # the distinct pools, in row order
    mml_differs: bool  # some row's max_model_len differs from its context
    digest: RowDigest = field(repr=False, compare=False, default_factory=RowDigest)
    rows: tuple[Row, ...] | None = None
    given: tuple[str, ...] = ()  # the LABEL_FIELDS the file sets (defaults, sweep, zip, scenarios)
    sizes: tuple[tuple[str, Any], ...] = ()  # the file's ``size:`` answers: (name, kvplan.planning.size.Sizing)

    def header(self) -> dict[str, Any]:
        """Everything :meth:`to_dict` holds but the rows (written before the rows when streaming)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "title": self.title,
            "description": self.description,
            "file": self.file,
            "num_rows": self.num_rows,
            "varying": list(self.varying),
            "notes": list(self.notes),
            **({"size": [{"name": name, **s.to_dict()} for name, s in self.sizes]} if self.sizes else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        if self.rows is None:
            raise InputError("a streamed report does not keep its rows", "use build_report() for every row")
        return {**self.header(), "rows": [r.to_dict() for r in self.rows]}


class _Planner:
    """Resolves each model once and plans each pool once."""

    def __init__(self, whatif: WhatIfFile, offline: bool, token: str | None, calibration: Any = None) -> None:
        self.whatif = whatif
        self.offline = offline
        self.token = token
        self.calibration = calibration  # --calibration: a loaded Calibration every row without its own uses
        self.pools: dict[tuple[Any, ...], Pool] = {}

    def spec(self, v: Mapping[str, Any], where: Where) -> tuple[ModelSpec, str]:
        """The model's spec, resolved once per process (:func:`kvplan.model.sources.load_spec`)."""
        from kvplan.model.sources import load_spec

        try:
            spec, source = load_spec(str(v["model"]), revision=v.get("revision"), token=self.token,
                                     force_hub=bool(v.get("hub")), offline=self.offline or bool(v.get("offline")),
                                     refresh=bool(v.get("refresh")),
                                     overrides=Overrides(v.get("layers"), v.get("kv_heads"), v.get("head_dim")))
        except KvplanError as exc:
            raise model_error(where, "", v["model"], exc) from None
        return spec, source.describe()

    def pool(self, values: Mapping[str, Any], first_row: Mapping[str, Any], where: Where) -> Pool:
        if self.calibration is not None and values.get("calibration") is None:
            values = {**values, "calibration": self.calibration}
        pool_values = {k: v for k, v in values.items() if k not in ROW_AXES}
        key = tuple(sorted(pool_values.items()))
        pool = self.pools.get(key)
        if pool is None:
            model_where = self.whatif.where_of("model") if where == self.whatif.where else where
            spec, source = self.spec(pool_values, model_where)
            try:
                plan = plan_for_spec(spec, options_from_values({**pool_values, **first_row}), source)
            except KvplanError as exc:  # in the file's words (a row's values come from several lines)
                raise ScenarioFileError(where, f"{_describe_values(pool_values)}: {in_file_words(exc.message)}",
                                        in_file_words(exc.hint)) from None
            pool = self.pools[key] = Pool(plan, pool_values)
        return pool


def _describe_values(values: Mapping[str, Any]) -> str:
    shown = {k: v for k, v in values.items() if k in ("model", "gpu", "gpu_memory", "gpu_count", "tp", "pp", "kv_dtype",
                                                       "weights_dtype", "dtype", "engine", "block_size")}
    return "row " + ", ".join(f"{'gpus' if k == 'gpu_count' else k}={v}" for k, v in shown.items())


def _defaulted(pool: Pool, triple: tuple[int, int, int | None], values: Mapping[str, Any]) -> tuple[int, int, int | None]:
    """An explicit row's (context, batch, max_model_len), its context the pool's where the row plans the default
    (neither context nor max_model_len given: at most the model's maximum)."""
    if "context" in values or "max_model_len" in values:
        return triple
    return (pool.plan.options.context, *triple[1:])


def _row_values(values: Mapping[str, Any]) -> tuple[int, int, int | None]:
    """A row's (context, batch, max_model_len): a max_model_len given without a context is the context too
    (:func:`kvplan.options.options_from_values`' rule)."""
    mml = values.get("max_model_len")
    context = values.get("context") or (mml if isinstance(mml, int) and not isinstance(mml, bool) else 8192)
    return int(context), int(values.get("batch") or 1), mml


def _count_of(axes: list[Any]) -> int:
    n = 1
    for axis in axes:
        n *= len(axis.values)
    return n


_CACHED_TRIPLES = 1 << 16  # row-axis products up to this size are kept as a list (shared by every pool)


class Sweep:
    """A what-if file's rows: counted before any work (:attr:`num_rows`, :attr:`num_pools`), pools planned
    by :meth:`plan`, rows produced one at a time by :meth:`rows` (sweep product, then explicit scenarios)."""

    def __init__(self, whatif: WhatIfFile, *, offline: bool = False, token: str | None = None,
                 calibration: Any = None) -> None:
        self.whatif = whatif
        self.offline, self.token = offline, token  # the size questions resolve their models the same way
        self._planner = _Planner(whatif, offline, token, calibration)  # calibration: --calibration's loaded file
        self.pool_axes = [a for a in whatif.axes if not set(a.names) <= set(ROW_AXES)]
        self.row_axes = [a for a in whatif.axes if set(a.names) <= set(ROW_AXES)]
        # the sweep's rows plan the default context (no context or max_model_len anywhere): each pool's own, at most
        # its model's maximum (kvplan.planning.plan.plan_for_spec)
        self._context_defaulted = not {"context", "max_model_len"} & (set(whatif.defaults) |
                                                                       {n for a in self.row_axes for n in a.names})
        self.num_rows = whatif.num_rows
        self.num_pools = (_count_of(self.pool_axes) if whatif.axes else 0) + len(whatif.scenarios)  # at most
        self._sweep_pools: list[tuple[dict[str, Any], Pool]] = []
        self._explicit_pools: list[Pool] = []
        self._triples: list[tuple[int, int, int | None]] | None = None
        self._planned = False

    def describe_size(self) -> str:
        """``100,000 rows (context 100 x batch 1,000)``: the rows and the axes that make them."""
        axes = " x ".join(f"{'+'.join(a.names)} {len(a.values):,}" for a in self.whatif.axes)
        extra = len(self.whatif.scenarios)
        parts = [p for p in (axes, f"{extra:,} scenarios" if extra else "") if p]
        return f"{plural(self.num_rows, 'row')} ({' + '.join(parts)})" if parts else f"{plural(self.num_rows, 'row')}"

    def check_bounds(self, force: bool = False) -> None:
        """Raise InputError past :data:`MAX_ROWS` rows or :data:`MAX_POOLS` pool configurations, unless ``force``."""
        if force:
            return
        hint = "use --force to run it anyway, or sweep fewer values"
        if self.num_rows > MAX_ROWS:
            raise InputError(f"{self.whatif.display}: {self.describe_size()}, past the bound of {plural(MAX_ROWS, 'row')} "
                             f"(about a minute and 1.6 GB of CSV + JSON)", hint)
        if self.num_pools > MAX_POOLS:
            raise InputError(f"{self.whatif.display}: up to {self.num_pools:,} configurations to plan (every option but "
                             f"context, batch and max_model_len), past the bound of {MAX_POOLS:,} (about 30 s)", hint)

    # ---- planning -----------------------------------------------------------------------------
    def _assigns(self, axes: list[Any] | None = None) -> Iterator[dict[str, Any]]:
        """Each combination of the values of ``axes`` (the row axes when None), as option name -> value."""
        axes = self.row_axes if axes is None else axes
        for combo in product(*(a.values for a in axes)):
            assign: dict[str, Any] = {}
            for axis, vals in zip(axes, combo):
                assign.update(zip(axis.names, vals))
            yield assign

    def _row_triples(self) -> Any:
        """The (context, batch, max_model_len) of each sweep row of a pool (the same for every pool: pool
        axes never hold a row axis, so only the defaults and the row axes decide them)."""
        if self._triples is not None:
            return self._triples
        base = {k: self.whatif.defaults[k] for k in ROW_AXES if k in self.whatif.defaults}
        triples = (_row_values({**base, **assign}) for assign in self._assigns())
        if _count_of(self.row_axes) <= _CACHED_TRIPLES:
            self._triples = list(triples)
            return self._triples
        return triples

    def _lengths(self) -> list[tuple[int, int | None]]:
        """The distinct (context, max_model_len) of the sweep rows, in the rows' order: read from the row axes that
        set either (an axis of batch alone changes neither), so a 100 x 5,000 sweep checks 100 pairs, not 500,000
        rows, before its first row is written."""
        if any(not a.values for a in self.row_axes):
            return []
        axes = [a for a in self.row_axes if {"context", "max_model_len"} & set(a.names)]
        base = {k: self.whatif.defaults[k] for k in ROW_AXES if k in self.whatif.defaults}
        out: dict[tuple[int, int | None], None] = {}
        for assign in self._assigns(axes):
            context, _, mml = _row_values({**base, **assign})
            out[context, mml] = None
        return list(out)

    def plan(self, progress: Progress | None = None) -> None:
        """Plan every pool (each once); errors are ScenarioFileError naming the row's options and line."""
        if self._planned:
            return
        whatif, planner = self.whatif, self._planner
        first = next(self._assigns(), {}) if whatif.axes else {}
        done = 0
        if whatif.axes:
            for combo in product(*(a.values for a in self.pool_axes)):
                values = dict(whatif.defaults)
                for axis, vals in zip(self.pool_axes, combo):
                    values.update(zip(axis.names, vals))
                if values.get("gpu") is None and values.get("gpu_memory") is None:
                    values["gpu"] = "H100"
                pool = planner.pool(values, {**{k: values[k] for k in ROW_AXES if k in values}, **first}, whatif.where)
                self._sweep_pools.append((values, pool))
                done += 1
                if progress is not None and done % 64 == 0:
                    progress(done, self.num_pools)
        for explicit in whatif.scenarios:
            self._explicit_pools.append(planner.pool(
                explicit.values, {k: explicit.values[k] for k in ROW_AXES if k in explicit.values}, explicit.where))
        self._planned = True
        # the row-level checks (context <= max_model_len, prefix_tokens <= context), made now so that
        # streaming rows cannot fail
        from kvplan.options import check_context

        lengths = self._lengths() if self._sweep_pools else []
        for context, mml in lengths:
            try:
                check_context(context, mml)
            except KvplanError as exc:
                raise ScenarioFileError(whatif.where, in_file_words(exc.message), in_file_words(exc.hint)) from None
        for explicit in whatif.scenarios:
            context, _, mml = _row_values(explicit.values)
            try:
                check_context(context, mml)
            except KvplanError as exc:
                raise ScenarioFileError(explicit.where, in_file_words(exc.message), in_file_words(exc.hint)) from None
        contexts = {context for context, _ in lengths}
        for values, pool in self._sweep_pools:
            try:
                for context in contexts if not self._context_defaulted else {pool.plan.options.context}:
                    pool.validate_context(context)
            except KvplanError as exc:
                raise ScenarioFileError(whatif.where, f"{_describe_values(values)}: {in_file_words(exc.message)}",
                                        in_file_words(exc.hint)) from None
        for explicit, pool in zip(whatif.scenarios, self._explicit_pools):
            try:
                pool.validate_context(_defaulted(pool, _row_values(explicit.values), explicit.values)[0])
            except KvplanError as exc:
                raise ScenarioFileError(explicit.where, in_file_words(exc.message), in_file_words(exc.hint)) from None

    # ---- rows ---------------------------------------------------------------------------------
    def rows(self, progress: Progress | None = None) -> Iterator[Row]:
        """Every row in order; ``progress(rows done, total)`` after each pool's rows."""
        self.plan()
        whatif, done = self.whatif, 0
        for values, pool in self._sweep_pools:
            try:
                for context, batch, mml in self._row_triples():
                    if self._context_defaulted:  # the default context: the pool's (a shorter model's maximum)
                        context = pool.plan.options.context
                    yield make_row(pool, context, batch, mml)
                    done += 1
            except KvplanError as exc:
                raise ScenarioFileError(whatif.where, f"{_describe_values(values)}: {in_file_words(exc.message)}",
                                        in_file_words(exc.hint)) from None
            if progress is not None:
                progress(done, self.num_rows)
        for explicit, pool in zip(whatif.scenarios, self._explicit_pools):
            context, batch, mml = _defaulted(pool, _row_values(explicit.values), explicit.values)
            try:
                yield make_row(pool, context, batch, mml, explicit.name)
            except KvplanError as exc:
                raise ScenarioFileError(explicit.where, in_file_words(exc.message), in_file_words(exc.hint)) from None
            done += 1
        if progress is not None:
            progress(done, self.num_rows)

    def report(self, digest: RowDigest, rows: tuple[Row, ...] | None = None) -> Report:
        """The report of the rows produced (pass the digest that saw them; ``rows`` when kept)."""
        self.plan()
        pools = list({id(p): p for p in [p for _, p in self._sweep_pools] + self._explicit_pools}.values())
        row_values = self._row_value_sets()
        return Report(self.whatif.title, self.whatif.description, self.whatif.display, self.num_rows,
                      _varying(pools, row_values), _notes(pools) + _length_notes(digest), tuple(pools),
                      row_values["mml_differs"], digest, rows,
                      self._given(), self._sizes())

    def _sizes(self) -> tuple[tuple[str, Any], ...]:
        """The ``size:`` questions answered (:func:`kvplan.planning.size.size_model`); a question no GPU holds,
        or with a bad price file, is the file's located error."""
        if not self.whatif.sizes:
            return ()
        from kvplan.planning.size import size_model

        out = []
        for q in self.whatif.sizes:
            try:
                arguments = {"offline": self.offline or None, **q.arguments}
                out.append((q.name, size_model(q.model, q.concurrency, q.context, token=self.token, **arguments)))
            except ScenarioFileError:
                raise
            except KvplanError as exc:
                raise ScenarioFileError(q.where, f"size {q.name!r}: {exc.message}", exc.hint) from None
        return tuple(out)

    def _given(self) -> tuple[str, ...]:
        """The label columns the file sets (``gpu_count`` is the ``gpus`` column)."""
        w = self.whatif
        keys = set(w.defaults) | {n for a in w.axes for n in a.names} | {k for e in w.scenarios for k in e.values}
        keys = {"gpus" if k == "gpu_count" else k for k in keys}
        return tuple(k for k in LABEL_FIELDS if k in keys)

    def _row_value_sets(self) -> dict[str, Any]:
        """Distinct names, contexts, batches and max_model_lens over the rows (without making the rows)."""
        sets: dict[str, Any] = {"name": set(), "context": set(), "batch": set(), "max_model_len": set(), "mml_differs": False}
        from itertools import chain

        sweep_rows = ((None, t) for t in self._row_triples()) if self._sweep_pools else ()
        if self._sweep_pools and self._context_defaulted:  # each pool's default context (a shorter model's maximum)
            sweep_rows = ((None, (p.plan.options.context, *t[1:])) for _, p in self._sweep_pools for t in self._row_triples())
        explicit_rows = ((e.name, _defaulted(p, _row_values(e.values), e.values))
                         for e, p in zip(self.whatif.scenarios, self._explicit_pools))
        for name, (context, batch, mml) in chain(sweep_rows, explicit_rows):
            mml = mml or context
            sets["name"].add(name)
            sets["context"].add(context)
            sets["batch"].add(batch)
            sets["max_model_len"].add(mml)
            sets["mml_differs"] = sets["mml_differs"] or mml != context
        return sets


def build_report(whatif: WhatIfFile, *, offline: bool = False, token: str | None = None,
                 progress: Progress | None = None, force: bool = False) -> Report:
    """Every row of ``whatif`` (sweep product, then explicit scenarios), kept in the report.

    Raises ScenarioFileError (file:line) for a bad row, InputError past :data:`MAX_ROWS` rows or
    :data:`MAX_POOLS` configurations unless ``force``.
    """
    sweep = Sweep(whatif, offline=offline, token=token)
    sweep.check_bounds(force)
    digest = RowDigest()
    rows = []
    for row in sweep.rows(progress):
        digest.add(row)
        rows.append(row)
    return sweep.report(digest, tuple(rows))


def _varying(pools: list[Pool], row_values: Mapping[str, Any]) -> tuple[str, ...]:
    """The label columns whose value differs between rows (constant ones are stated once instead)."""
    if not pools:
        return ()
    varying = {name for name in LABEL_FIELDS if name in Pool.LABELS and len({p.labels()[name] for p in pools}) > 1}
    for name in ("name", "context", "batch", "max_model_len"):
        if len(row_values[name]) > 1:
            varying.add(name)
    return tuple(n for n in LABEL_FIELDS if n in varying)


def _length_notes(digest: RowDigest) -> tuple[str, ...]:
    """What the rows over a model's maximum length are: they fit whatever the memory, and the plot leaves them out."""
    if not digest.over_length:
        return ()
    models = "; ".join(f"{', '.join(sorted(m.split('/')[-1] for m in names))}: {plural(limit, 'token')}"
                       for limit, names in sorted(digest.over_length.items()))
    return (f"rows over a model's maximum length ({models}) do not fit whatever the memory: fits says no (len) and "
            "why says so; the concurrency plot leaves them out",)


def _notes(pools: list[Pool]) -> tuple[str, ...]:
    notes: list[str] = []
    calibrated = [n for p in pools for n in p.plan.budget.notes if n.startswith("calibration ")]
    if calibrated:
        used = sum(1 for n in calibrated if "no entry" not in n)
        notes.append(f"{calibrated[0].split(':')[0]}: measured terms used in {used} of {len(pools)} configurations "
                     "(the others had no entry for their deployment)")
    shared = [p for p in pools if p.plan.options.prefix_tokens]
    if shared:
        credited = sum(1 for p in shared if p.deployment.prefix_tokens)
        notes.append(f"prefix_tokens: requests, max context and fits count the shared prefix once where prefix caching "
                     f"is on ({credited} of {len(shared)} configurations with a prefix; the others store a copy per "
                     "request)")
    what_if = [p for p in pools if p.plan.launch.kv_cache_dtype is None]
    if what_if:  # the engine has no --kv-cache-dtype for the planned KV dtype: no launch line, a what-if's figures
        kinds = sorted({f"{p.plan.engine.engine} --kv-dtype {p.plan.kv_dtype}" for p in what_if})
        notes.append(f"{len(what_if)} of {len(pools)} configurations plan a KV dtype their engine cannot run "
                     f"({', '.join(kinds)}): their figures are a what-if, with no launch line")
    no_kv = [p for p in pools if p.plan.budget.kv_budget_bytes <= 0]
    if no_kv:
        p = no_kv[0].plan
        notes.append(f"{len(no_kv)} of {len(pools)} configurations leave no memory for the KV cache "
                     f"(e.g. {p.spec.model_id} on {p.options.gpu_count}x {p.gpu.name})")
    return tuple(notes)
