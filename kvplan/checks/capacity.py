"""Capacity checks: plans + requirements -> results (never prints, never exits).

Each check is one :class:`~kvplan.planning.plan.Plan` (``plan_for_spec``, the spec resolved once per model) and a
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

With ``prefix_tokens`` and prefix caching on, requests, context, headroom and fits count the shared prefix once
(the answer's own rule, :meth:`kvplan.planning.answer.Deployment.batch_blocks`), and each requirement says so.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from kvplan import memory
from kvplan.errors import KvplanError, ScenarioError
from kvplan.planning.answer import null_block_words
from kvplan.planning.plan import Options, Plan, options_from_values, plan_for_spec
from kvplan.checks.scenario import CapacityFile, CheckScenario, model_error
from kvplan.planning.suggest import (
    largest, more_tp, other_engines, other_gpu, refuses_the_model, replan, spell, spell_was,
)
from kvplan.io.yamldoc import Where
from kvplan.model.spec import ModelSpec, Overrides
from kvplan.units import plural
from kvplan.frozen import frozen


@frozen
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
    low_end_actual: Any = None  # judged at the estimate: the value at the low end of kvplan's range (None: no range)
    low_end_passed: bool | None = None  # ... and whether the requirement holds there

    @property
    def at_risk(self) -> bool:
        """Passes at kvplan's estimate but not at the low end of its range: the engine may give less."""
        return self.passed and self.low_end_passed is False


@frozen
class CheckResult:
    """The plan of one check and its outcomes."""

    name: str
    description: str | None
    where: Where
    plan: Plan
    outcomes: tuple[Outcome, ...]
    judged: str = "estimate"  # "estimate": kvplan's plan; "low end": the low end of its range (conservative)
    elapsed_s: float = 0.0  # seconds this check took (its model resolved, planned, judged, suggestions re-planned)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outcomes)


@frozen
class CheckReport:
    """Every check of a capacity file, in file order."""

    file: str
    results: tuple[CheckResult, ...]
    elapsed_s: float = 0.0  # seconds the whole file took (JUnit's testsuite time)

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


def shared_prefix_words(plan: Plan) -> str:
    """How a check counts the file's ``prefix_tokens``: ``, a 4,096-token prefix stored once`` (prefix caching
    on: the answer credits it), ``, a 4,096-token prefix not shared (prefix caching off)``, or nothing."""
    o, a = plan.options, plan.answer
    if not o.prefix_tokens:
        return ""
    if a.shared_prefix_tokens:
        return f", a {o.prefix_tokens:,}-token prefix stored once"
    return f", a {o.prefix_tokens:,}-token prefix not shared (prefix caching off)"


def describe_requirement(key: str, required: Any, plan: Plan) -> str:
    """The requirement in words, with the conditions it is measured under (a shared prefix: whether it is
    counted once, :func:`shared_prefix_words`)."""
    o = plan.options
    if key == "concurrency":
        return f">= {plural(required, 'request')} at {plural(o.context, 'token')}{shared_prefix_words(plan)}"
    if key == "context":
        return f">= {plural(required, 'token')} at batch {o.batch:,}{shared_prefix_words(plan)}"
    if key == "kv_tokens":
        return f">= {required:,} KV tokens (max_model_len {plan.max_model_len:,})"
    if key == "headroom_pct":
        return f">= {required:g}% free after {o.batch:,} x {o.context:,}{shared_prefix_words(plan)}"
    if key == "fits":
        return f"{o.batch:,} x {o.context:,} {'fits' if required else 'does not fit'}{shared_prefix_words(plan)}"
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
        a = plan.answer
        longest = a.longest_startable_len
        if a.refusal:  # the engine does not start: nothing runs, whatever the pool holds
            message += f" ({a.refusal}" + (f"; the longest max_model_len that starts is {longest:,})" if longest else ")")
        elif a.batch > a.max_num_seqs:
            message += f" (max_num_seqs {a.max_num_seqs:,} runs at most {plural(a.max_num_seqs, 'request')} at once)"
        else:
            short = -a.fits_margin_blocks
            message += (f" (short by {plural(short, 'block')} = {short * plan.layout.block_size:,} token slots; "
                        f"{null_block_words(plan.engine.engine)})")
    return Outcome(key, required, actual, margin, unit, passed, message)


# ---------------------------------------------------------------------------------------------
# what would make a failed requirement pass (each candidate re-planned and re-checked)


def suggestions(key: str, required: Any, plan: Plan, spec: ModelSpec, at_low: bool = False) -> tuple[str, ...]:
    """The smallest single changes (one per kind) under which ``key`` holds, each re-planned with the options
    validated as a user's (:mod:`kvplan.planning.suggest`) and written as the file's keys accept them.

    ``plan`` is the check's own plan (its options as the file gives them). ``at_low`` (``--conservative``): each
    change is planned fresh from those options and judged at the low end of its own range (:func:`low_end`), so
    a larger tp or another GPU is judged with its own KV budget and spread, never the check's."""
    o = plan.options
    measure, unit = _MEASURES[key]
    judged: dict[int, tuple[Plan, Plan]] = {}  # id(plan) -> (plan, its low end): the plan kept, so its id is its own

    def judge(p: Plan) -> Plan:
        if not at_low:
            return p
        if id(p) not in judged:
            judged[id(p)] = (p, low_end(p, spec))
        return judged[id(p)][1]

    a = judge(plan).answer

    def planner(options: Options) -> Plan:
        return plan_for_spec(spec, options, plan.source, suggest=False)

    def holds(p: Plan) -> bool:
        return _holds(key, required, judge(p))

    def at(**changes: Any) -> tuple[Options, Plan] | None:
        hit = replan(planner, o, **changes)
        return hit if hit and holds(hit[1]) else None

    out: list[str] = []

    def offer(label: str, hit: tuple[Options, Plan] | None, was: bool = False) -> None:
        if hit:
            after = f"was {spell_was(o, hit[0])}" if was else f"{key} {format_value(measure(judge(hit[1])), unit)}"
            out.append(f"{label}: {spell(o, hit[0], 'yaml')} ({after})")

    if key == "concurrency" and a.max_requests >= 1:  # a requirement of 0 requests checks nothing
        out.append(f"require concurrency <= {a.max_requests} (what fits now)")
    if key == "context" and a.max_context_at_batch >= 1:
        out.append(f"require context <= {a.max_context_at_batch} (what fits now)")
    if key in ("context", "headroom_pct", "fits") and o.batch > 1:
        n = largest(1, o.batch - 1, lambda b: at(batch=b) is not None)
        offer("fewer requests", at(batch=n) if n else None, was=True)

    def shorter(n: int) -> tuple[Options, Plan] | None:  # prefix_tokens follows the context down
        return at(context=n, prefix_tokens=min(o.prefix_tokens, n))

    if key in ("concurrency", "headroom_pct", "fits") and o.context > 1:
        c = largest(1, o.context - 1, lambda c: shorter(c) is not None)
        offer("shorter context", shorter(c) if c else None, was=True)
    if key == "engine_starts" and required:
        def at_len(n: int) -> tuple[Options, Plan] | None:  # without a max_model_len, it is the context
            return shorter(n) if o.max_model_len is None else at(max_model_len=n)

        n = largest(1, plan.max_model_len - 1, lambda n: at_len(n) is not None)
        offer("shorter max_model_len", at_len(n) if n else None, was=True)
    running = required if key == "concurrency" else o.batch
    if key in ("concurrency", "headroom_pct", "fits") and running > a.max_num_seqs:
        offer("more requests at once", at(max_num_seqs=running))  # the scheduler caps requests at once
    if o.prefix_tokens and not plan.prefix_caching and key != "kv_tokens":
        offer("prefix caching (the shared prefix stored once)", at(prefix_caching=True))
    if plan.layout.kv_dtype.bits > 8:
        offer("fp8 KV cache", at(kv_dtype="fp8"))
    offer("more tensor parallelism", more_tp(spec, o, planner, holds))
    if refuses_the_model(plan.deployment):
        for hit in other_engines(spec, o, planner, holds):
            offer("another engine" if hit[0].engine != o.engine else "a release that serves the model", hit)
    offer("another GPU", other_gpu(o, planner, holds, plan.gpu.memory_bytes))
    if key == "concurrency":  # the size search's deployment, unless a change above is the same one
        out.extend(s for s in _replicas(required, plan, spec, at_low)
                   if s.split(": ", 1)[1] not in {x.split(": ", 1)[-1] for x in out})
    return tuple(out)


def _replicas(required: int, plan: Plan, spec: ModelSpec, at_low: bool) -> list[str]:
    """The smallest deployment of the check's GPU that holds ``required`` requests, from ``kvplan size``'s
    search (:func:`kvplan.planning.size.size`: every tp within a node, pipeline stages, replicas), judged where
    the check is: one replica of another tp / pp as the file's keys, or replicas (data parallel) in words;
    nothing when the GPU is not the catalogue's."""
    from kvplan.gpus import find_gpu
    from kvplan.planning.size import ESTIMATE, LOW, Requirement, size

    o = plan.options
    if not o.gpu or o.gpu_memory_bytes or required < 1:
        return []
    try:
        gpu = find_gpu(o.gpu)
        best = size(spec, o, Requirement(required, o.context, o.prefix_tokens, LOW if at_low else ESTIMATE),
                    (gpu,), plan.source).best
    except KvplanError:
        return []
    per = best.requests_per_replica_low if at_low else best.requests_per_replica
    if best.replicas == 1:  # one replica of another shape, as the file's keys take it (tp always: a file's
        # `gpus: N` alone means tp N)
        keys = ([f"gpus: {best.tp * best.pp}"] if o.gpu_count != 1 else []) + [f"tp: {best.tp}"]
        keys += [f"pp: {best.pp}"] if best.pp != 1 or o.pp != 1 else []
        return [f"smallest deployment (kvplan size): {', '.join(keys)} (concurrency {plural(per, 'request')})"]
    shape = f"tp: {best.tp}" + (f", pp: {best.pp}" if best.pp > 1 else "")
    return [f"replicas (kvplan size): {best.replicas} x {{gpu: {best.gpu}, {shape}}} = {plural(best.gpus, 'GPU')} "
            f"(concurrency {best.replicas} x {plural(per, 'request')})"]


# ---------------------------------------------------------------------------------------------
# running a capacity file


SpecResolver = Callable[[CheckScenario], tuple[ModelSpec, str]]


def spec_resolver(offline: bool = False, token: str | None = None) -> SpecResolver:
    """Resolve each (model, revision, overrides) once (:func:`kvplan.model.sources.load_spec` keeps them);
    errors point at the file line of ``model``."""
    from kvplan.model.sources import load_spec

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


def _located(check: CheckScenario, exc: KvplanError) -> ScenarioError:
    """A planning error of ``check`` in the file's words, at the line of the key it names first (the check's
    entry when the key is not the check's own or the defaults')."""
    from kvplan.checks.fields import first_key, in_file_words
    from kvplan.io.yamldoc import ScenarioFileError

    key = first_key(exc.message)
    return ScenarioFileError(check.where_of(key) if key else check.where,
                             f"check {check.name!r}: {in_file_words(exc.message)}", in_file_words(exc.hint))


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
        raise _located(check, exc) from None


def low_end(plan: Plan, spec: ModelSpec) -> Plan:
    """The plan at the low end of its range (:attr:`Plan.kv_range`): the same deployment with the KV budget less
    the spread kvplan measured on real start-ups of its class, so a check judged on it does not pass on a number
    the engine may not give. The plan itself when it has no spread (a given KV budget)."""
    rng = plan.kv_range
    if rng is None or rng.kv_budget_low_bytes >= plan.budget.kv_budget_bytes:
        return plan
    # a low end of no KV at all is planned as a 1-byte budget (no block), which the options accept
    return plan_for_spec(spec, replace(plan.options, kv_budget_bytes=max(1, rng.kv_budget_low_bytes)), plan.source)


def run_check(check: CheckScenario, spec: ModelSpec, source: str, calibration: Any = None,
              conservative: bool = False) -> CheckResult:
    """Plan one check and judge each requirement (failures carry suggestions); ``conservative`` (or the check's
    ``conservative: true``) judges them at the low end of the plan's range."""
    options = check_options(check, calibration)
    try:
        plan = plan_for_spec(spec, options, source)
    except KvplanError as exc:
        raise _located(check, exc) from None
    judged, how, low = plan, "estimate", low_end(plan, spec)
    if conservative or check.conservative:
        judged, how = low, "low end"
    outcomes = []
    for key, required in check.require.items():
        outcome = evaluate(key, required, judged)
        if how == "low end" and judged is not plan:
            estimate = _MEASURES[key][0](plan)
            outcome = replace(outcome, message=f"{outcome.message} at the low end of kvplan's range "
                                               f"({format_value(estimate, _MEASURES[key][1])} at its estimate)")
        elif low is not plan:
            at_low = evaluate(key, required, low)
            outcome = replace(outcome, low_end_actual=at_low.actual, low_end_passed=at_low.passed)
        if not outcome.passed:
            outcome = replace(outcome, suggestions=suggestions(key, required, plan, spec, at_low=how == "low end"))
        outcomes.append(outcome)
    return CheckResult(check.name, check.description, check.where, plan, tuple(outcomes), how)


def run_checks(capacity: CapacityFile, *, offline: bool = False, token: str | None = None,
               resolve: SpecResolver | None = None, calibration: Any = None, conservative: bool = False) -> CheckReport:
    """Every check of ``capacity``; raises :class:`ScenarioError` for a model or option that cannot be planned,
    listing every check's such mistake with the file's own (``capacity.mistakes``), in file order, up to
    :data:`kvplan.io.yamldoc.MAX_FILE_ERRORS`.

    ``calibration``: a loaded :class:`kvplan.io.calibration.Calibration` for checks that do not name their own.
    ``conservative``: judge every check at the low end of its plan's range (``--conservative``)."""
    from kvplan.io.yamldoc import ScenarioFileError, combine_errors

    import time

    resolve = resolve or spec_resolver(offline=offline, token=token)
    results, errors = [], list(capacity.mistakes)
    started = time.perf_counter()
    for check in capacity.checks:
        try:
            began = time.perf_counter()
            spec, source = resolve(check)
            result = run_check(check, spec, source, calibration, conservative)
            results.append(replace(result, elapsed_s=time.perf_counter() - began))
        except ScenarioFileError as exc:
            errors.append(exc)
    if errors:
        raise combine_errors(errors)
    return CheckReport(capacity.display, tuple(results), time.perf_counter() - started)
