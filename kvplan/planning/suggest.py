"""What would make a plan fit: single changes of its options, each re-planned before it is offered.

A suggestion is a set of option changes (:func:`revise`: the same validation as a user's own options, so a
change that drags another option along, such as a shorter context that takes ``--prefix-tokens`` down with it,
names both), re-planned by the caller's planner (``kvplan.planning.plan.plan_for_spec`` of the same spec) and kept only when the predicate it is meant
to satisfy holds (the plan fits, a requirement passes, the engine starts). Its text is written from the
difference between the user's options and the changed ones (:func:`spell`), in a spelling the options accept
(``--context 8192``, never ``8,192``), so what is printed is exactly what was planned.

``kvplan estimate``'s "try ..." (:func:`fix`), the ``--max-model-len auto`` error's hint (:func:`start_hint`)
and ``kvplan check``'s "to pass" lines (:mod:`kvplan.checks.capacity`) all come from here.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any, Callable

from kvplan import memory
from kvplan.errors import KvplanError
from kvplan.options import BY_FIELD, ENGINE_NAMES, Options, check_context

if TYPE_CHECKING:  # pragma: no cover
    from kvplan.planning.answer import Answer, Deployment
    from kvplan.model.spec import ModelSpec

Plan = Any  # kvplan.planning.plan.Plan: this module is handed a planner (plan.py calls it, so it cannot import plan.py)
Planner = Callable[[Options], Plan]  # options -> their plan (``plan_for_spec`` of one spec, no suggestions)

TP_FACTORS = (2, 4, 8)  # more tensor parallelism: the smallest of x2, x4, x8 that works
NOTHING_FITS = "no single change of batch, context, max_model_len, max_num_seqs, KV dtype, tp, engine or GPU fits"


def nothing_fits(engine_name: str) -> str:
    """:data:`NOTHING_FITS` in the engine's names for its settings (SGLang: context_length, max_running_requests)."""
    from kvplan.engines.registry import setting_name

    return (NOTHING_FITS.replace("max_model_len", setting_name(engine_name, "max_model_len"))
            .replace("max_num_seqs", setting_name(engine_name, "max_num_seqs")))


# ---------------------------------------------------------------------------------------------
# changes: validated like user input, written as the options accept them


def revise(options: Options, **changes: Any) -> Options:
    """``options`` with ``changes`` (Options fields, base units), checked like a user's own options
    (:class:`Options`' checks and :func:`~kvplan.options.check_context`); raises InputError otherwise.
    A change of ``tp`` or ``pp`` takes ``gpus`` along (tp x pp GPUs) unless ``gpu_count`` is given."""
    if ("tp" in changes or "pp" in changes) and "gpu_count" not in changes:
        changes["gpu_count"] = changes.get("tp", options.tp) * changes.get("pp", options.pp)
        changes.setdefault("tp_from_gpus", False)
    revised = replace(options, **changes)
    check_context(revised.context, revised.max_model_len)
    return revised


def spell_value(field: str, value: Any) -> str:
    """One option value as its flag and YAML key accept it: integers without separators, sizes in the
    largest binary unit that holds them exactly (``24GiB``, ``1536MiB``, else bytes: ``1000B``), switches as
    ``true``/``false``."""
    kind = BY_FIELD[field].kind
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind.startswith("size"):
        unit = next((u for u in _SIZE_UNITS if value and value % u[1] == 0), ("B", 1))
        return f"{value // unit[1]}{unit[0]}"
    return str(value)


_SIZE_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def _changed(old: Options, new: Options) -> list[tuple[str, Any]]:
    """The user-facing options that differ, in the option table's order (``(field, new value)``).
    ``gpus`` is left out when it only follows tp x pp from one GPU (a user's ``--tp 4`` alone does that)."""
    out = []
    for f in fields(Options):
        if f.name not in BY_FIELD:
            continue
        a, b = getattr(old, f.name), getattr(new, f.name)
        if f.name == "max_model_len" and new.auto_max_model_len != old.auto_max_model_len:
            out.append((f.name, "auto" if new.auto_max_model_len else b))
        elif a != b:
            if f.name == "gpu_count" and old.gpu_count == 1 and b == new.tp * new.pp:
                continue
            out.append((f.name, b))
    return out


def _engine_spelling(opt, engine_name: str) -> str:  # noqa: ANN001 - an options.Opt
    """The flag of ``opt`` as the engine spells it where kvplan takes the engine's flag too (SGLang's
    ``--max-running-requests`` for ``--max-num-seqs``), else kvplan's own."""
    from kvplan.engines.registry import SETTINGS

    engine_flag = SETTINGS.get(engine_name, {}).get(opt.field_name, ("",))[0]
    return engine_flag if engine_flag in opt.cli_flags else opt.flag


def spell(old: Options, new: Options, style: str = "flag") -> str:
    """The changes from ``old`` to ``new`` as flags (``--context 1024 --prefix-tokens 1024``) or YAML keys
    (``context: 1024, prefix_tokens: 1024``); an option dropped is ``without --gpu-memory``."""
    parts = []
    for name, value in _changed(old, new):
        opt = BY_FIELD[name]
        if style == "flag":
            flag = _engine_spelling(opt, new.engine)
            if value is None:
                parts.append(f"without {flag}")
            elif opt.kind == "switch":
                parts.append(flag if value else "--no-" + flag.removeprefix("--"))
            elif opt.kind == "flag":
                parts.append(flag if value else f"without {flag}")
            else:
                parts.append(f"{flag} {spell_value(name, value)}")
        else:
            parts.append(f"without {opt.name}" if value is None else f"{opt.name}: {spell_value(name, value)}")
    return (" " if style == "flag" else ", ").join(parts)


def spell_was(old: Options, new: Options) -> str:
    """What the changed options were, as the options accept them: ``8192`` for one, ``context: 8192,
    prefix_tokens: 2048`` for several."""
    was = [(name, getattr(old, name)) for name, _ in _changed(old, new)]
    if len(was) == 1:
        name, value = was[0]
        return "not set" if value is None else spell_value(name, value)
    return ", ".join(f"{BY_FIELD[n].name}: {'not set' if v is None else spell_value(n, v)}" for n, v in was)


# ---------------------------------------------------------------------------------------------
# re-planning


def replan(planner: Planner, options: Options, **changes: Any) -> tuple[Options, Plan] | None:
    """``(revised options, their plan)``, or None when the change is one the options or the engine reject
    or changes nothing."""
    try:
        revised = revise(options, **changes)
        if revised == options:
            return None
        return revised, planner(revised)
    except KvplanError:
        return None


def largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest n in [lo, hi] with ok(n), for ok true up to a point and false after; None if ok(lo) fails."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


Holds = Callable[[Plan], bool]


def more_tp(spec: "ModelSpec", options: Options, planner: Planner, holds: Holds) -> tuple[Options, Plan] | None:
    """The smallest of x2, x4, x8 tensor parallelism (dividing the attention heads) under which ``holds``."""
    heads = spec.num_attention_heads
    for factor in TP_FACTORS:
        tp = options.tp * factor
        if heads and heads % tp:
            continue
        found = replan(planner, options, tp=tp)
        if found and holds(found[1]):
            return found
    return None


def other_gpu(options: Options, planner: Planner, holds: Holds, current_bytes: int) -> tuple[Options, Plan] | None:
    """The smallest catalogue GPU with more memory than the current one under which ``holds``."""
    from kvplan.gpus import load_gpus

    candidates = sorted((g for g in load_gpus() if not g.is_cpu and g.memory_bytes and g.memory_bytes > current_bytes),
                        key=lambda g: (g.memory_bytes, g.name))
    for g in candidates:
        found = replan(planner, options, gpu=g.name, gpu_memory_bytes=None)
        if found and holds(found[1]):
            return found
    return None


def refuses_the_model(deployment: "Deployment") -> bool:
    """Whether the engine refuses whatever the length although its pool holds a one-token request: the
    release (or the engine) does not serve the model, which no memory change helps."""
    return bool(deployment.refusal(1)) and deployment.blocks >= memory.NULL_BLOCKS + deployment.demand.blocks(1)


def other_engines(spec: "ModelSpec", options: Options, planner: Planner, holds: Holds) -> list[tuple[Options, Plan]]:
    """For an engine that refuses the model: the newest release of it that serves the model
    (``serving_release``), and each other engine (its default release), under which ``holds``."""
    from kvplan.engines.registry import engine as engine_rules

    found = []
    release = engine_rules(options.engine).serving_release(spec)
    hit = replan(planner, options, engine_version=release) if release else None
    if hit and holds(hit[1]):
        found.append(hit)
    for name in ENGINE_NAMES:
        if name != options.engine:
            hit = replan(planner, options, engine=name, engine_version=None)
            if hit and holds(hit[1]):
                found.append(hit)
    return found


# ---------------------------------------------------------------------------------------------
# estimate's "try ..." and the --max-model-len auto hint


def fix(spec: "ModelSpec", options: Options, planner: Planner, answer: "Answer", plan_refuses_model: bool,
        kv_bits: int, gpu_memory_bytes: int) -> str | None:
    """The single changes that make ``batch x context`` fit, each re-planned and kept only when that plan
    fits (so its engine starts), written as the flags accept them; None when none does.

    Tried: fewer requests, a shorter context (at most the model's maximum; ``--prefix-tokens`` follows it
    down), a max_model_len the engine starts with (when one was given), a ``--max-num-seqs`` that takes the
    batch, prefix caching (a shared prefix stored once) when it is off, an fp8 KV cache, the smallest of x2, x4, x8 tensor parallelism that fits; when the engine refuses
    the model itself, another release or engine that serves it; when none of these fits, the smallest larger
    catalogue GPU."""
    def fits(p: Plan) -> bool:
        return p.answer.fits

    candidates: list[dict[str, Any]] = []
    n = answer.max_requests
    if 1 <= n < options.batch:
        candidates.append({"batch": n})
    ctx = answer.max_context_at_batch
    if 1 <= ctx < options.context:
        candidates.append({"context": ctx, "prefix_tokens": min(options.prefix_tokens, ctx)})
    longest = answer.longest_startable_len
    if answer.refusal and (options.max_model_len or options.auto_max_model_len) and longest >= options.context:
        candidates.append({"max_model_len": longest, "auto_max_model_len": False})
    if options.batch > answer.max_num_seqs:
        candidates.append({"max_num_seqs": options.batch})
    if options.prefix_tokens and options.prefix_caching is False:  # the shared prefix stored once
        candidates.append({"prefix_caching": True})
    if kv_bits > 8:
        candidates.append({"kv_dtype": "fp8"})
    found = [hit for hit in (replan(planner, options, **c) for c in candidates) if hit and fits(hit[1])]
    tp = more_tp(spec, options, planner, fits)
    if tp:
        found.append(tp)
    if plan_refuses_model:
        found += other_engines(spec, options, planner, fits)
    if not found:
        gpu = other_gpu(options, planner, fits, gpu_memory_bytes)
        found += [gpu] if gpu else []
    return " or ".join(spell(options, revised) for revised, _ in found) or None


def start_hint(spec: "ModelSpec", options: Options, planner: Planner, kv_bits: int, gpu_memory_bytes: int) -> str:
    """For ``--max-model-len auto`` when the engine starts with no length: the single changes under which it
    starts with one (an fp8 KV cache, more tensor parallelism, a larger GPU), each re-planned."""
    def starts(p: Plan) -> bool:
        return p.answer.engine_starts

    found = []
    if kv_bits > 8:
        hit = replan(planner, options, kv_dtype="fp8")
        found += [hit] if hit and starts(hit[1]) else []
    found += [hit for hit in (more_tp(spec, options, planner, starts),) if hit]
    if not found:
        found += [hit for hit in (other_gpu(options, planner, starts, gpu_memory_bytes),) if hit]
    if not found:
        return "no single change of KV dtype, tensor parallelism or GPU makes it start"
    return "try " + " or ".join(spell(options, revised) for revised, _ in found)
