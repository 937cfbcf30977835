"""Capacity checks: plans + requirements -> results (never prints, never exits).

Each check is one :class:`~kvplan.plan.Plan` (``plan_for_spec``, the spec resolved once per model) and a
verdict per requirement. A failed requirement carries what would make it pass: the smallest single change
(fewer requests, shorter context, fp8 KV, more tensor parallelism, another GPU), each found by re-planning
with ``plan_for_spec`` and checking the same requirement again, never guessed.

The workload of a check is ``batch x context``: ``batch`` is the check's ``batch`` option when given, else
the required ``concurrency``, else 1. Requirements:

- ``concurrency: N``: at least N whole requests of ``context`` tokens run at once (``answer.max_requests``: what
  the pool holds, capped by the engine's ``max_num_seqs``; none when the engine refuses to start);
- ``context: C``: the longest context that fits ``batch`` requests is at least C (``answer.max_context_at_batch``);
- ``kv_tokens: K``: vLLM's "GPU KV cache size" at ``max_model_len`` is at least K (``answer.kv_tokens``);
- ``headroom_pct: P``: after ``batch x context`` at least P % of the pool's usable blocks stay free;
- ``fits: true``: ``batch x context`` fits; ``engine_starts: true``: one request at ``max_model_len`` fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from kvplan import memory
from kvplan.errors import KvplanError, ScenarioError
from kvplan.plan import Options, Plan, options_from_values, plan_for_spec
from kvplan.scenario import CapacityFile, CheckScenario, model_error
from kvplan.yamldoc import Where
from kvplan.spec import ModelSpec, Overrides
from kvplan.units import plural


@dataclass(frozen=True)
class Outcome:
    """One requirement of one check: what was required, what the plan gives, and the verdict.

    ``required``/``actual`` are numbers (requests, tokens, percent) or booleans; ``margin`` is
    ``actual - required`` for numbers (negative: short by). ``suggestions``: changes that make it pass.
    """

    requirement: str
    required: Any
    actual: Any
    margin: float | int | None
    unit: str
    passed: bool
    message: str
    suggestions: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckResult:
    """The plan of one check and its outcomes."""

    name: str
    description: str | None
    where: Where
    plan: Plan
    outcomes: tuple[Outcome, ...]

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outcomes)


@dataclass(frozen=True)
class CheckReport:
    """Every check of a capacity file, in file order."""

    file: str
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def num_failed(self) -> int:
        return sum(not r.passed for r in self.results)


# ---------------------------------------------------------------------------------------------
# requirements: measure a plan, compare with what is required


def headroom_pct(plan: Plan) -> float:
    """% of the pool's usable blocks (all but the null block) free after ``batch x context``."""
    a = plan.answer
    usable = a.num_blocks - memory.NULL_BLOCKS
    if usable <= 0:
        return -100.0
    return 100.0 * a.fits_margin_blocks / usable


_MEASURES: dict[str, tuple[Callable[[Plan], Any], str]] = {
    "concurrency": (lambda p: p.answer.max_requests, "requests"),
    "context": (lambda p: p.answer.max_context_at_batch, "tokens"),
    "kv_tokens": (lambda p: p.answer.kv_tokens, "tokens"),
    "headroom_pct": (headroom_pct, "%"),
    "fits": (lambda p: p.answer.fits, ""),
    "engine_starts": (lambda p: p.answer.engine_starts, ""),
}


def _holds(key: str, required: Any, plan: Plan) -> bool:
    actual = _MEASURES[key][0](plan)
    return actual == required if isinstance(required, bool) else actual >= required


def format_value(value: Any, unit: str) -> str:
    """A measured value with its unit: ``54 requests``, ``12.5%``, ``yes``."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if unit == "%":
        return f"{value:.1f}%"
    if unit in ("requests", "tokens", "blocks"):
        return plural(value, unit[:-1])
    return f"{value:,} {unit}".strip()


def describe_requirement(key: str, required: Any, plan: Plan) -> str:
    """The requirement in words, with the conditions it is measured under."""
    o = plan.options
    if key == "concurrency":
        return f">= {plural(required, 'request')} at {o.context:,} tokens"
    if key == "context":
        return f">= {required:,} tokens at batch {o.batch}"
    if key == "kv_tokens":
        return f">= {required:,} KV tokens (max_model_len {plan.max_model_len:,})"
    if key == "headroom_pct":
        return f">= {required:g}% free after {o.batch} x {o.context:,}"
    if key == "fits":
        return f"{o.batch} x {o.context:,} {'fits' if required else 'does not fit'}"
    return f"engine {'starts' if required else 'does not start'} at max_model_len {plan.max_model_len:,}"


def requirement_text(key: str, required: Any, plan: Plan) -> str:
    """The requirement as a table row says it, each word once: the key and its condition
    (``concurrency >= 48 requests at 8,192 tokens``); a yes/no requirement's description already names it
    (``1 x 8,192 fits``, ``engine starts at max_model_len 131,072``)."""
    text = describe_requirement(key, required, plan)
    return text if isinstance(required, bool) else f"{key} {text}"


def evaluate(key: str, required: Any, plan: Plan) -> Outcome:
    """One requirement against one plan (no suggestions)."""
    measure, unit = _MEASURES[key]
    actual = measure(plan)
    passed = _holds(key, required, plan)
    margin = None if isinstance(required, bool) else actual - required
    if isinstance(margin, float):
        margin = round(margin, 3)
    message = f"{key}: required {describe_requirement(key, required, plan)}, got {format_value(actual, unit)}"
    if not passed and key in ("fits", "engine_starts") and required:
        if key == "fits":
            short = -plan.answer.fits_margin_blocks
            message += f" (short by {short:,} blocks = {short * plan.layout.block_size:,} token slots)"
        else:
            message += (f" ({plan.answer.refusal}; the longest max_model_len that starts is "
                        f"{plan.answer.longest_startable_len:,})")
    return Outcome(key, required, actual, margin, unit, passed, message)


# ---------------------------------------------------------------------------------------------
# what would make a failed requirement pass (each candidate re-planned and re-checked)


def _replan(spec: ModelSpec, options: Options, source: str, **changes: Any) -> Plan | None:
    try:
        return plan_for_spec(spec, replace(options, **changes), source)
    except KvplanError:
        return None


def _largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest n in [lo, hi] with ok(n), for ok true up to a point and false after; None if ok(lo) fails."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def suggestions(key: str, required: Any, plan: Plan, spec: ModelSpec) -> tuple[str, ...]:
    """The smallest single changes (one per kind) under which ``key`` holds, each verified by re-planning."""
    o, source = plan.options, plan.source
    measure, unit = _MEASURES[key]

    def holds(p: Plan | None) -> bool:
        return p is not None and _holds(key, required, p)

    def gives(p: Plan) -> str:
        return f"{key} {format_value(measure(p), unit)}"

    out: list[str] = []
    if key == "concurrency":
        out.append(f"require concurrency <= {plan.answer.max_requests} (what fits now)")
    if key == "context":
        out.append(f"require context <= {plan.answer.max_context_at_batch} (what fits now)")
    if key in ("context", "headroom_pct", "fits") and o.batch > 1:
        n = _largest(1, o.batch - 1, lambda b: holds(_replan(spec, o, source, batch=b)))
        if n is not None:
            out.append(f"fewer requests: batch: {n} (was {o.batch:,})")
    if key in ("concurrency", "headroom_pct", "fits") and o.context > 1:
        def at_context(c: int) -> Plan | None:
            prefix = min(o.prefix_tokens, c)
            return _replan(spec, o, source, context=c, prefix_tokens=prefix)

        c = _largest(1, o.context - 1, lambda c: holds(at_context(c)))
        if c is not None:
            out.append(f"shorter context: context: {c} (was {o.context:,})")
    if key == "engine_starts" and required:
        length = plan.max_model_len

        def at_len(n: int) -> Plan | None:
            if o.max_model_len is None:
                return _replan(spec, o, source, context=n, prefix_tokens=min(o.prefix_tokens, n))
            return _replan(spec, o, source, max_model_len=n)

        n = _largest(1, length - 1, lambda n: holds(at_len(n)))
        if n is not None:
            key = "max_model_len" if o.max_model_len else "context"  # without one, max_model_len is the context
            out.append(f"shorter max_model_len: {key}: {n} (was {length:,})")
    running = required if key == "concurrency" else o.batch
    if key in ("concurrency", "headroom_pct", "fits") and running > plan.answer.max_num_seqs:
        p = _replan(spec, o, source, max_num_seqs=running)  # the scheduler caps requests at once
        if holds(p):
            out.append(f"more requests at once: max_num_seqs: {running} ({gives(p)})")  # type: ignore[arg-type]
    if plan.layout.kv_dtype.bits > 8:
        p = _replan(spec, o, source, kv_dtype="fp8")
        if holds(p):
            out.append(f"fp8 KV cache: kv_dtype: fp8 ({gives(p)})")  # type: ignore[arg-type]
    for factor in (2, 4, 8):
        tp = o.tp * factor
        p = _replan(spec, o, source, tp=tp, gpu_count=tp * o.pp)
        if holds(p):
            out.append(f"more tensor parallelism: tp: {tp} on {tp * o.pp} GPUs ({gives(p)})")  # type: ignore[arg-type]
            break
    gpu = _other_gpu(spec, o, source, holds, plan.gpu.memory_bytes)
    if gpu is not None:
        name, p = gpu
        out.append(f"another GPU: gpu: {name} ({gives(p)})")
    return tuple(out)


def _other_gpu(spec: ModelSpec, o: Options, source: str, holds: Callable[[Plan | None], bool],
               current_bytes: int) -> tuple[str, Plan] | None:
    """The smallest catalogue GPU with more memory than the current one under which the requirement holds."""
    from kvplan.gpus import load_gpus

    candidates = sorted((g for g in load_gpus() if not g.is_cpu and g.memory_bytes and g.memory_bytes > current_bytes),
                        key=lambda g: (g.memory_bytes, g.name))
    for g in candidates:
        p = _replan(spec, o, source, gpu=g.name, gpu_memory_bytes=None)
        if holds(p):
            return g.name, p  # type: ignore[return-value]
    return None


# ---------------------------------------------------------------------------------------------
# running a capacity file


SpecResolver = Callable[[CheckScenario], tuple[ModelSpec, str]]


def spec_resolver(offline: bool = False, token: str | None = None) -> SpecResolver:
    """Resolve each (model, revision, overrides) once (:func:`kvplan.sources.load_spec` keeps them);
    errors point at the file line of ``model``."""
    from kvplan.sources import load_spec

    failed: dict[tuple[Any, ...], KvplanError] = {}  # a model that failed is not asked for again (the Hub)

    def resolve(check: CheckScenario) -> tuple[ModelSpec, str]:
        v = check.values
        key = (str(v["model"]), v.get("revision"), v.get("hub"), v.get("offline"), v.get("refresh"), v.get("layers"),
               v.get("kv_heads"), v.get("head_dim"))
        try:
            if key in failed:
                raise failed[key]
            spec, source = load_spec(str(v["model"]), revision=v.get("revision"), token=token,
                                     force_hub=bool(v.get("hub")), offline=offline or bool(v.get("offline")),
                                     refresh=bool(v.get("refresh")),
                                     overrides=Overrides(v.get("layers"), v.get("kv_heads"), v.get("head_dim")))
        except KvplanError as exc:
            failed[key] = exc
            raise model_error(check.where_of("model"), f"check {check.name!r}: ", v["model"], exc) from None
        return spec, source.describe()

    return resolve


def _located(where: Where, message: str, hint: str | None) -> ScenarioError:
    from kvplan.yamldoc import ScenarioFileError

    return ScenarioFileError(where, message, hint)


def check_options(check: CheckScenario, calibration: Any = None) -> Options:
    """The check's options, with ``batch`` defaulting to the required concurrency (and ``--calibration``'s
    loaded file when the check names none)."""
    values = dict(check.values)
    if calibration is not None and values.get("calibration") is None:
        values["calibration"] = calibration
    if not check.batch_given and check.require.concurrency is not None:
        values["batch"] = check.require.concurrency
    try:
        return options_from_values(values)
    except KvplanError as exc:
        raise _located(check.where, f"check {check.name!r}: {exc.message}", exc.hint) from None


def run_check(check: CheckScenario, spec: ModelSpec, source: str, calibration: Any = None) -> CheckResult:
    """Plan one check and judge each requirement (failures carry suggestions)."""
    options = check_options(check, calibration)
    try:
        plan = plan_for_spec(spec, options, source)
    except KvplanError as exc:
        raise _located(check.where, f"check {check.name!r}: {exc.message}", exc.hint) from None
    outcomes = []
    for key, required in check.require.items():
        outcome = evaluate(key, required, plan)
        if not outcome.passed:
            outcome = replace(outcome, suggestions=suggestions(key, required, plan, spec))
        outcomes.append(outcome)
    return CheckResult(check.name, check.description, check.where, plan, tuple(outcomes))


def run_checks(capacity: CapacityFile, *, offline: bool = False, token: str | None = None,
               resolve: SpecResolver | None = None, calibration: Any = None) -> CheckReport:
    """Every check of ``capacity``; raises :class:`ScenarioError` for a model or option that cannot be planned,
    listing every check's such mistake with the file's own (``capacity.mistakes``), in file order, up to
    :data:`kvplan.yamldoc.MAX_FILE_ERRORS`.

    ``calibration``: a loaded :class:`kvplan.calibration.Calibration` for checks that do not name their own."""
    from kvplan.yamldoc import ScenarioFileError, combine_errors

    resolve = resolve or spec_resolver(offline=offline, token=token)
    results, errors = [], list(capacity.mistakes)
    for check in capacity.checks:
        try:
            spec, source = resolve(check)
            results.append(run_check(check, spec, source, calibration))
        except ScenarioFileError as exc:
            errors.append(exc)
    if errors:
        raise combine_errors(errors)
    return CheckReport(capacity.display, tuple(results))
