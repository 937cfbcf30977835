"""``kvplan size``: the smallest deployments (GPU x tp x pp x replicas) that hold N requests of L tokens.

The inverse of ``estimate``. For each candidate GPU the search plans one replica per (tp, pp) with
:func:`kvplan.planning.plan.plan_for_spec` (the spec resolved once, each plan made once and reused) and reads
its requests at once from the plan itself: at the range's low end (``plan.kv_range.low.max_requests``, the
default) or at the estimate (``plan.answer.max_requests``). Nothing here recomputes a budget, a block or a
range; a row re-planned with ``kvplan estimate --gpu G --tp T --pp P`` gives its per-replica figures.

- tp: every size from 1 to one node's GPUs (the catalogue's ``node_gpus``; 8 for a GPU without it) that the
  engine accepts for the model (the plan's own check: attention heads, KV heads, state-layer widths);
- pp: 1, and more stages at each accepted tp while a replica that size can still be smaller than the best
  deployment found (:func:`request_bound` prunes the shapes that cannot);
- replicas: the fewest that hold N, ``ceil(N / requests per replica)``.

Deployments are ranked by GPUs, then by headroom (requests held past N); with prices
(:mod:`kvplan.io.prices`) by cost per hour. The best deployment of each GPU is one row; each says what binds
it and why a smaller deployment of that GPU fails.
"""

from __future__ import annotations

import math
from dataclasses import field, replace
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from kvplan.errors import InputError, KvplanError
from kvplan.options import Options
from kvplan.planning.plan import Plan, plan_for_spec
from kvplan.planning.suggest import revise
from kvplan.units import GiB, plural
from kvplan.frozen import frozen

if TYPE_CHECKING:  # pragma: no cover
    from kvplan.gpus import Gpu
    from kvplan.io.prices import Price, Prices
    from kvplan.model.spec import ModelSpec

LOW, ESTIMATE = "low", "estimate"  # where a replica's requests are judged
AT_WORDS = {LOW: "the low end of kvplan's range", ESTIMATE: "kvplan's estimate"}
DEFAULT_NODE_GPUS = 8  # one node's GPUs for a GPU the catalogue gives no node_gpus
MAX_PP = 16  # pipeline stages tried at most
SCHEMA_VERSION = 1  # of Sizing.to_dict (kvplan size --json); keys may be added within a version
WHY_CLAUSES = 3  # the nearest smaller deployments said in a row's why_not_smaller
BINDS = ("weights", "KV per GPU", "max_num_seqs", "model length")


@frozen
class Requirement:
    """What must be held: ``concurrency`` requests of ``context`` tokens at once (``prefix_tokens`` of each
    shared), judged at ``at`` (:data:`LOW` or :data:`ESTIMATE`)."""

    concurrency: int
    context: int
    prefix_tokens: int = 0
    at: str = LOW


@frozen
class Layout:
    """One replica's shape on one GPU and what it holds (``plan`` None: the engine refuses the shape, ``error``)."""

    tp: int
    pp: int
    plan: Plan | None
    error: str = ""
    exc: KvplanError | None = field(default=None, compare=False, repr=False)  # the refusal, to raise as it is

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def requests(self, at: str) -> int:
        """Requests of the plan's context one replica runs at once, at the low end or the estimate."""
        if self.plan is None:
            return 0
        return judged_answer(self.plan, at).max_requests


def judged_answer(plan: Plan, at: str) -> Any:
    """The plan's answer at ``at``: the range's low end (``plan.kv_range.low``) or the estimate."""
    if at == LOW and plan.kv_range is not None:
        return plan.kv_range.low
    return plan.answer


@frozen
class Sized:
    """One deployment: ``replicas`` replicas of ``tp`` x ``pp`` GPUs of ``gpu``, each planned as ``plan`` (serving
    ``plan.options.batch`` requests, its share of the requirement)."""

    gpu: str
    tp: int
    pp: int
    replicas: int
    plan: Plan
    requests_per_replica_low: int
    requests_per_replica: int
    at: str
    binds: str  # one of BINDS: what sets this size
    why_not_smaller: str  # why a smaller deployment of this GPU does not hold the requirement
    concurrency: int
    price: "Price | None" = None

    def __repr__(self) -> str:
        return (f"Sized({self.replicas} x {self.gpu} tp {self.tp} pp {self.pp} = {plural(self.gpus, 'GPU')}, "
                f"{plural(self.requests_per_replica_low, 'request')} per replica at the low end "
                f"({self.requests_per_replica:,} at the estimate), binds {self.binds})")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.replicas

    @property
    def requests_low(self) -> int:
        return self.replicas * self.requests_per_replica_low

    @property
    def requests(self) -> int:
        return self.replicas * self.requests_per_replica

    @property
    def requests_judged(self) -> int:
        return self.requests_low if self.at == LOW else self.requests

    @property
    def headroom(self) -> int:
        """Requests held past the requirement (at ``at``)."""
        return self.requests_judged - self.concurrency

    @property
    def cost_per_hour(self) -> float | None:
        return None if self.price is None else self.price.per_gpu_hour * self.gpus

    @property
    def cost_per_million_tokens_hour(self) -> float | None:
        """Cost of holding a million tokens of context for an hour: cost per hour over the tokens the deployment
        holds at once (requests at ``at`` x context)."""
        held = self.requests_judged * self.plan.options.context
        return None if self.cost_per_hour is None or not held else self.cost_per_hour / (held / 1e6)

    @property
    def serve_command(self) -> str | None:
        """The engine's launch line for one replica (each replica runs it on its own tp x pp GPUs), None when the
        engine cannot run the planned KV dtype (a what-if, as :attr:`Plan.serve_command` says: no launch line)."""
        return self.plan.serve_command

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "tp": self.tp, "pp": self.pp, "replicas": self.replicas, "gpus": self.gpus,
                "requests_per_replica_low": self.requests_per_replica_low,
                "requests_per_replica": self.requests_per_replica, "requests_low": self.requests_low,
                "requests": self.requests, "headroom_requests": self.headroom, "binds": self.binds,
                "why_not_smaller": self.why_not_smaller,
                "kv_budget_per_gpu_bytes": self.plan.budget.kv_budget_bytes,
                "kv_budget_per_gpu_low_bytes": self.plan.kv_range.kv_budget_low_bytes if self.plan.kv_range else None,
                "weights_per_gpu_bytes": self.plan.budget.weights.bytes,
                "cost_per_hour": _money(self.cost_per_hour),
                "cost_per_million_tokens_hour": _money(self.cost_per_million_tokens_hour, 4),
                "price": None if self.price is None else {"per_gpu_hour": self.price.per_gpu_hour,
                                                           "source": self.price.source, "date": self.price.date},
                "serve_command": self.serve_command}


def _money(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


@frozen
class Sizing:
    """The search's answer: the best deployment of each GPU that holds the requirement (``rows``, best first)
    and the GPUs that hold not even one request (``unfit``: GPU -> why)."""

    model: str
    source: str
    requirement: Requirement
    engine: str
    engine_version: str
    rows: tuple[Sized, ...]
    unfit: tuple[tuple[str, str], ...]
    prices: "Prices | None" = None
    searched: int = 0  # (gpu, tp, pp) shapes tried (each planned once; a tp the engine refuses counts)
    layouts: dict = field(default_factory=dict, compare=False, repr=False)  # gpu -> its Layouts, for checks

    def __repr__(self) -> str:
        r = self.requirement
        best = f"{self.best!r}" if self.rows else "none"
        return (f"Sizing({r.concurrency} x {plural(r.context, 'token')} of {self.model} on {self.engine}, at the "
                f"{'low end' if r.at == LOW else 'estimate'}: {len(self.rows)} of {plural(len(self.rows) + len(self.unfit), 'GPU')} searched hold it, best {best})")

    @property
    def ranked_by(self) -> str:
        return "cost" if self.prices is not None and any(r.price for r in self.rows) else "gpus"

    @property
    def best(self) -> Sized:
        return self.rows[0]

    def to_dict(self) -> dict[str, Any]:
        r = self.requirement
        return {"schema_version": SCHEMA_VERSION, "model": self.model, "source": self.source,
                "requirement": {"concurrency": r.concurrency, "context": r.context, "prefix_tokens": r.prefix_tokens,
                                "judged_at": "low end" if r.at == LOW else "estimate"},
                "engine": self.engine, "engine_version": self.engine_version, "ranked_by": self.ranked_by,
                "deployments": [row.to_dict() for row in self.rows],
                "unfit": [{"gpu": g, "why": why} for g, why in self.unfit],
                "prices": None if self.prices is None else self.prices.to_dict()}


# ---------------------------------------------------------------------------------------------
# candidates


def default_gpus() -> tuple["Gpu", ...]:
    """The catalogue's datacenter GPUs (those with ``node_gpus``), in catalogue order."""
    from kvplan.gpus import load_gpus

    return tuple(g for g in load_gpus() if g.node_gpus and not g.is_cpu)


def node_gpus(gpu: "Gpu") -> int:
    return gpu.node_gpus or DEFAULT_NODE_GPUS


class Replicas:
    """One GPU's replica plans, each (tp, pp) planned once (:meth:`layout`)."""

    def __init__(self, spec: "ModelSpec", base: Options, gpu: "Gpu", source: str | None) -> None:
        self.spec, self.base, self.gpu, self.source = spec, base, gpu, source
        self.plans: dict[tuple[int, int], Layout] = {}

    def layout(self, tp: int, pp: int) -> Layout:
        key = (tp, pp)
        if key not in self.plans:
            try:
                options = revise(self.base, gpu=self.gpu.name, gpu_memory_bytes=None, tp=tp, pp=pp)
                self.plans[key] = Layout(tp, pp, plan_for_spec(self.spec, options, self.source, suggest=False))
            except KvplanError as exc:
                self.plans[key] = Layout(tp, pp, None, exc.message, exc)
        return self.plans[key]

    def tps(self, allowed: Sequence[int] | None = None) -> list[int]:
        """The tp sizes within one node the engine accepts for the model (or those of ``allowed`` it accepts)."""
        sizes = allowed or range(1, node_gpus(self.gpu) + 1)
        return [tp for tp in sizes if self.layout(tp, 1).plan is not None]


def _order(candidates: Iterable[tuple[Layout, int]], concurrency: int, at: str) -> list[tuple[Layout, int]]:
    """(layout, replicas) smallest first: fewest GPUs, then most headroom, then fewer replicas."""
    return sorted(candidates, key=lambda c: (c[0].gpus * c[1], -(c[1] * c[0].requests(at) - concurrency), c[1],
                                             c[0].pp))


def search_gpu(replicas: Replicas, requirement: Requirement,
               tps: Sequence[int] | None = None) -> tuple[list[tuple[Layout, int]], list[Layout]]:
    """Every (layout, replicas) of one GPU that holds the requirement, smallest first, and the layouts that hold
    no request. ``tps``: the tp sizes to try (None: all within a node).

    Every accepted tp at pp 1 is planned. More stages (pp 2 to :data:`MAX_PP`, at every accepted tp) are
    planned in order of replica size while a replica that size could still be smaller than the best deployment
    found: a shape whose :func:`request_bound` says it cannot beat it is not planned."""
    n, at = requirement.concurrency, requirement.at
    holding: list[tuple[Layout, int]] = []
    empty: list[Layout] = []
    accepted = replicas.tps(tps)

    def consider(layout: Layout) -> None:
        per = layout.requests(at)
        if per >= 1:
            holding.append((layout, math.ceil(n / per)))
        else:
            empty.append(layout)

    for tp in accepted:
        consider(replicas.layout(tp, 1))
    first = replicas.layout(accepted[0], 1).plan if accepted else None
    if first is None or _too_long(first):  # more stages help memory, not the model's length
        return _order(holding, n, at), empty
    bound = request_bound(replicas, requirement)
    shapes = sorted(((tp, pp) for tp in accepted for pp in range(2, MAX_PP + 1)), key=lambda s: (s[0] * s[1], -s[0]))
    no_more: set[int] = set()  # tp sizes at which the engine took no more stages
    for tp, pp in shapes:
        g = tp * pp
        best = min((layout.gpus * r for layout, r in holding), default=None)
        if best is not None and g >= best:
            break  # shapes come by size: no later one is smaller than the best found
        most = bound(g)
        if tp in no_more or most < 1 or (best is not None and g * math.ceil(n / most) >= best):
            continue
        layout = replicas.layout(tp, pp)
        if layout.plan is None:
            no_more.add(tp)
            continue
        consider(layout)
    return _order(holding, n, at), empty


BOUND_SLACK = 1.02  # paging slack a larger shape may save over tp 1's request (block rounding)


def request_bound(replicas: Replicas, requirement: Requirement) -> Any:
    """g -> at most how many requests a replica of g GPUs runs: the GPUs' whole memory less the model's weights,
    over the bytes one request holds at tp 1 (the whole model; a shard holds at least its share; the shared
    prefix left out), with :data:`BOUND_SLACK`. Only for pruning: a shape is planned unless this says it cannot
    beat the best."""
    plan = replicas.layout(1, 1).plan
    if plan is None:
        return lambda g: math.inf
    tokens = max(1, requirement.context - requirement.prefix_tokens)
    per_request = plan.demand.bytes(tokens)
    weights = plan.budget.weights.bytes  # tp 1 pp 1: the whole model's
    memory = replicas.gpu.memory_bytes
    if per_request <= 0:
        return lambda g: math.inf
    return lambda g: math.floor(max(0, g * memory - weights) / per_request * BOUND_SLACK) + 1


# ---------------------------------------------------------------------------------------------
# why: what binds a deployment, why a smaller one fails


def _too_long(plan: Plan) -> bool:
    """Whether the context is past the model's maximum length (no GPU count helps)."""
    limit = plan.answer.model_max_len
    return bool(limit) and plan.options.context > limit


def no_request_reason(layout: Layout, requirement: Requirement) -> str:
    """Why one replica of ``layout`` holds no request of the context (at the requirement's end)."""
    if layout.plan is None:
        return layout.error
    plan = layout.plan
    a = judged_answer(plan, requirement.at)
    b = plan.budget
    if a.model_max_len and plan.options.context > a.model_max_len:
        return f"the model's maximum length is {plural(a.model_max_len, 'token')}"
    if b.weights.bytes >= b.usable_bytes:
        return (f"weights {b.weights.bytes / GiB:.1f} GiB per GPU exceed the {b.usable_bytes / GiB:.1f} GiB "
                f"usable")
    low_kv = plan.kv_range.kv_budget_low_bytes if requirement.at == LOW and plan.kv_range else b.kv_budget_bytes
    if low_kv <= 0:
        return (f"no KV memory per GPU after weights {b.weights.bytes / GiB:.1f} GiB and the runtime's terms "
                f"({b.usable_bytes / GiB:.1f} GiB usable)")
    if a.refusal:
        return a.refusal
    return (f"one {plan.options.context:,}-token request needs {plural(a.blocks_per_request, 'block')}, "
            f"the pool holds {a.num_blocks:,}")


def _weights_bound(layout: Layout) -> bool:
    """Whether a layout that holds no request fails for memory (what the weights leave per GPU is less than one
    request), not for the model's length."""
    return layout.plan is not None and not _too_long(layout.plan)


def binds_of(layout: Layout, n_replicas: int, empty: Sequence[Layout], requirement: Requirement,
             smaller_holding: bool = False) -> str:
    """What sets the size: ``weights`` (one replica holds N, and no smaller replica of this GPU holds even one
    request: the weights leave too little memory per GPU), ``max_num_seqs`` (the scheduler caps a replica's
    requests), ``model length`` (a smaller replica runs no request this long) or ``KV per GPU`` (the pool)."""
    smaller = [e for e in empty if e.gpus < layout.gpus and e.plan is not None]
    if n_replicas == 1 and smaller and all(_weights_bound(e) for e in smaller) and not smaller_holding:
        return "weights"
    a = judged_answer(layout.plan, requirement.at)
    if a.limited_by == "max_num_seqs":
        return "max_num_seqs"
    if smaller and all(_too_long(e.plan) for e in smaller):
        return "model length"
    return "KV per GPU"


def why_not_smaller(best: tuple[Layout, int], holding: Sequence[tuple[Layout, int]], empty: Sequence[Layout],
                    requirement: Requirement) -> str:
    """Why no smaller deployment of this GPU holds the requirement, one clause per kind (fewest words)."""
    layout, n_rep = best
    at, n = requirement.at, requirement.concurrency
    out = []
    if n_rep > 1:
        per = layout.requests(at)
        out.append(f"{n_rep - 1} x {_shape(layout)} hold {(n_rep - 1) * per:,} < {n:,}")
    for other, r in sorted(holding, key=lambda h: -h[0].gpus):  # the nearest smaller shapes first
        if (other.tp, other.pp) != (layout.tp, layout.pp) and other.gpus < layout.gpus:
            out.append(f"{_shape(other)} needs {plural(r, 'replica')} ({plural(other.gpus * r, 'GPU')})")
    for e in sorted(empty, key=lambda e: -e.gpus):
        if e.gpus < layout.gpus and e.plan is not None:
            out.append(f"{_shape(e)}: {no_request_reason(e, requirement)}")
    return "; ".join(out[:WHY_CLAUSES]) or "none is smaller"


def _shape(layout: Layout) -> str:
    return f"tp {layout.tp}" + (f" pp {layout.pp}" if layout.pp > 1 else "")


# ---------------------------------------------------------------------------------------------
# the search


def size(spec: "ModelSpec", base: Options, requirement: Requirement, gpus: Sequence["Gpu"] | None = None,
         source: str | None = None, prices: "Prices | None" = None, tps: Sequence[int] | None = None) -> Sizing:
    """The best deployment of each GPU of ``gpus`` (default: :func:`default_gpus`; with ``prices`` and no GPUs,
    the priced ones) that holds ``requirement`` under ``base`` (its model options: engine, release, dtypes; its
    ``gpu``, ``tp``, ``pp``, ``batch`` and ``context`` are the search's). Raises :class:`InputError` when no GPU
    holds even one request, or a tp of ``tps`` is one the engine cannot split the model by."""
    priced = _resolve_prices(prices) if prices is not None else {}
    if gpus is None:
        gpus = tuple(priced_gpu for priced_gpu, _ in priced.values()) if priced else default_gpus()
    base = replace(base, context=requirement.context, prefix_tokens=requirement.prefix_tokens, batch=1,
                   gpu_count=1, tp=1, pp=1, tp_from_gpus=False)
    rows, unfit, searched, layouts = [], [], 0, {}
    refused_tp: dict[int, str] = {}
    for gpu in gpus:
        replicas = Replicas(spec, base, gpu, source)
        holding, empty = search_gpu(replicas, requirement, tps)
        searched += len(replicas.plans)
        layouts[gpu.name] = replicas
        for tp in tps or ():
            layout = replicas.layout(tp, 1)
            if layout.plan is None:
                refused_tp.setdefault(tp, layout.error)
        if not holding:
            tried = max((e for e in empty if e.plan is not None), key=lambda e: e.gpus, default=None)
            why = no_request_reason(tried, requirement) if tried else next((e.error for e in empty), "no tp accepted")
            unfit.append((gpu.name, (f"{_shape(tried)}: " if tried else "") + why))
            continue
        rows.append(_row(gpu, holding, empty, requirement, priced.get(gpu.name, (None, None))[1]))
    if tps and len(refused_tp) == len(tps):
        raise InputError(refused_tp[tps[0]], "pass a tp the engine can split the model by, or no --tp")
    tried = [layout for replicas in layouts.values() for layout in replicas.plans.values()]
    if not rows and tried and all(layout.plan is None for layout in tried):
        raise tried[0].exc  # no shape of any GPU planned: the options themselves are refused (an unknown dtype)
    if not rows:
        what = f"{plural(requirement.context, 'token')}"
        reasons = {why.split(": ", 1)[-1] for _, why in unfit}
        if len(reasons) == 1:  # one reason for every GPU (the model's length): say it once
            detail = reasons.pop()
        else:
            detail = "; ".join(f"{g}: {why}" for g, why in unfit[:3]) + ("; ..." if len(unfit) > 3 else "")
        hint = ("give a --context the model takes" if "maximum length" in detail
                else "try a shorter --context, --kv-dtype fp8, or other --gpu choices")
        raise InputError(f"no GPU holds one request of {what} of {spec.model_id} at {AT_WORDS[requirement.at]} "
                         f"({detail})", hint)
    rows.sort(key=_rank_key if priced else lambda r: (r.gpus, -r.headroom, r.gpu))
    first = rows[0].plan
    return Sizing(spec.model_id, source or spec.source, requirement, first.engine.engine, first.engine.version,
                  tuple(rows), tuple(unfit), prices, searched, layouts)


def _rank_key(row: Sized) -> tuple:
    cost = row.cost_per_hour
    return (cost is None, cost if cost is not None else 0.0, row.gpus, -row.headroom, row.gpu)


def _row(gpu: "Gpu", holding: list[tuple[Layout, int]], empty: list[Layout], requirement: Requirement,
         price: "Price | None") -> Sized:
    layout, n_rep = holding[0]
    plan = layout.plan
    share = math.ceil(requirement.concurrency / n_rep)  # the requests each replica serves
    if share != plan.options.batch:
        plan = plan_for_spec(plan.spec, replace(plan.options, batch=share), plan.source, suggest=False)
    low, est = judged_answer(plan, LOW).max_requests, plan.answer.max_requests
    smaller_holding = any(other.gpus < layout.gpus for other, _ in holding)
    return Sized(gpu.name, layout.tp, layout.pp, n_rep, plan, low, est, requirement.at,
                 binds_of(layout, n_rep, empty, requirement, smaller_holding), why_not_smaller(holding[0], holding, empty, requirement),
                 requirement.concurrency, price)


def _resolve_prices(prices: "Prices") -> dict[str, tuple["Gpu", "Price"]]:
    """Catalogue GPU name -> (GPU, price); an unknown GPU name is the file's located error."""
    from kvplan.errors import GpuNotFoundError
    from kvplan.gpus import find_gpu
    from kvplan.io.yamldoc import ScenarioFileError

    out: dict[str, tuple[Gpu, Price]] = {}
    for p in prices.entries:
        try:
            gpu = find_gpu(p.gpu)
        except GpuNotFoundError as exc:
            raise ScenarioFileError(p.where, f"prices.{p.gpu}: {exc.message}", exc.hint) from None
        if gpu.is_cpu or not gpu.memory_bytes:
            raise ScenarioFileError(p.where, f"prices.{p.gpu}: not a GPU kvplan can size for")
        if gpu.name in out:
            raise ScenarioFileError(p.where, f"prices.{p.gpu}: {gpu.name} is priced twice")
        out[gpu.name] = (gpu, p)
    return out


# ---------------------------------------------------------------------------------------------
# from user input (the CLI and the Python API)

MODEL_OPTIONS = ("revision", "hub", "offline", "refresh", "kv_dtype", "engine", "engine_version", "dtype",
                 "weights_dtype", "quantization", "gpu_util", "max_num_seqs", "max_num_batched_tokens",
                 "prefix_caching", "block_size")


def size_model(model: str, concurrency: Any, context: Any = None, *, gpus: Sequence[str] | str | None = None,
               tps: Sequence[Any] | str | None = None, at: str = LOW, prices: Any = None, token: str | None = None,
               prefix_tokens: Any = None, **options: Any) -> Sizing:
    """:func:`size` from user input: the model resolved once (bundled, local or the Hub), values parsed as the
    options parse them (``context="8k"``, ``concurrency=200``), GPU names as ``--gpu`` takes them (a list or
    ``"H100,H200"``), ``tps`` the tp sizes to try (``"2,4"``), ``at`` ``low`` or ``estimate``, ``prices`` a
    price file's path (:func:`kvplan.io.prices.load_prices`) or a loaded :class:`~kvplan.io.prices.Prices`."""
    from kvplan.gpus import find_gpu
    from kvplan.model.sources import load_spec
    from kvplan.model.spec import Overrides
    from kvplan.options import options_from_values

    if at not in (LOW, ESTIMATE):
        raise InputError(f"invalid --at {at!r}: choose low or estimate",
                         "low (the default) judges at the low end of kvplan's range")
    unknown = sorted(set(options) - set(MODEL_OPTIONS))
    if unknown:
        raise InputError(f"size: unknown option {unknown[0]!r}", f"size takes {', '.join(MODEL_OPTIONS)}")
    values = {"model": str(model), "batch": concurrency, **{k: v for k, v in options.items() if v is not None}}
    if context is not None:
        values["context"] = context
    if prefix_tokens is not None:
        values["prefix_tokens"] = prefix_tokens
    if concurrency is None:
        raise InputError("size needs --concurrency N: how many requests must run at once")
    base = options_from_values(values)
    spec, source = load_spec(base.model, revision=base.revision, token=token, force_hub=base.hub,
                             offline=base.offline, refresh=base.refresh, overrides=Overrides(None, None, None))
    if context is None:  # as the engine defaults: the model's maximum, at most estimate's default
        limit = spec.max_position_embeddings or base.context
        base = replace(base, context=min(base.context, limit), prefix_tokens=min(base.prefix_tokens, limit))
    chosen = None
    if gpus:
        names = [g.strip() for g in (gpus.split(",") if isinstance(gpus, str) else gpus) if str(g).strip()]
        chosen = tuple({g.name: g for g in map(find_gpu, names)}.values())  # h100,H100-SXM: one GPU, once
        cpu = next((g for g in chosen if g.is_cpu or not g.memory_bytes), None)
        if cpu is not None:
            raise InputError(f"--gpu {cpu.name}: size searches GPUs of the catalogue", "pass datacenter GPUs such as H100,H200")
    tp_list = None
    if tps:
        tp_list = []
        for raw in (tps.split(",") if isinstance(tps, str) else tps):
            text = str(raw).strip()
            if not text.isdigit() or int(text) < 1:
                raise InputError(f"invalid --tp {text!r}: a comma-separated list of positive integers", "e.g. --tp 2,4,8")
            tp_list.append(int(text))
    if prices is not None and not hasattr(prices, "entries"):
        from kvplan.io.prices import load_prices

        prices = load_prices(prices)
    requirement = Requirement(base.batch, base.context, base.prefix_tokens, at)
    return size(spec, base, requirement, chosen, source.describe(), prices, tp_list)


__all__ = ["ESTIMATE", "LOW", "Requirement", "Sized", "Sizing", "default_gpus", "size", "size_model"]
