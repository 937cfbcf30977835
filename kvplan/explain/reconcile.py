"""``kvplan explain LOG``: what a start-up log says, kvplan's plan of the same deployment, and the two term by term.

The steps read -> facts -> plan -> compare, each in its module (the types they fill in: :mod:`kvplan.explain.account`):

1. :func:`kvplan.explain.logparse.parse_log` reads the log; :func:`kvplan.explain.facts.log_values` turns it (plus
   what the user passed: ``--model``, ``--gpu``, ...) into estimate options. A log with no KV cache line at all
   (another program's, cut before the pool, garbled) is an error that lists what was found and what is missing.
2. The log's own account needs no model (:mod:`kvplan.explain.facts`): the budget per GPU term by term as printed,
   the part no line prints (requested - the printed terms - the KV budget), the pool's blocks, tokens and
   concurrency, its warnings.
3. When kvplan can load the model, :func:`kvplan.planning.plan.estimate` plans the deployment (here, :func:`explain`)
   and the logged terms are checked through the same plan's block and token rules (:mod:`kvplan.explain.compare`):
   the logged KV budget (printed to 0.01 GiB) is an interval of block counts; the rules of the engine release turn
   each count into the token line, the concurrency line and the start-up verdict the engine prints, and the count
   whose lines equal the log's is the engine's (exact when the rules are right). A log that prints the block count
   needs no interval. When the GPU is known too (the log's total memory, its device name, ``--gpu``), kvplan's own
   terms are set beside the log's, and :func:`kvplan.explain.compare.diagnosis` says in one line where the two part.
Every number comes from the plan's own objects (``plan.rules``, ``plan.demand``, ``plan.budget``); nothing here
recomputes a formula. The calibration entry a reconciled log writes: :mod:`kvplan.explain.calibrate`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from kvplan.errors import KvplanError
from kvplan.explain.account import Explanation
from kvplan.explain.compare import _from_logged, _term_rows, capacity, diagnosis, prints_capacity_lines
from kvplan.explain.facts import _stand_in_memory, log_values, logged_kv_bytes, release_candidates
from kvplan.explain.logparse import parse_log
from kvplan.explain.startup_log import StartupLog
from kvplan.units import plural


def _estimate(values: dict[str, Any], token: str | None) -> Any:
    """kvplan's plan of ``values``, without the single changes that would make it fit (``answer.fix``: an
    explanation shows none, and finding them re-planned on up to every larger GPU, most of explain's time); where
    ``--max-model-len auto`` starts with no length, the error keeps its hint (those changes, re-planned)."""
    from kvplan.planning.plan import estimate, options_from_values

    options = options_from_values(values)
    return estimate(options, token=token, suggest=options.auto_max_model_len)


def _plan(values: dict[str, Any], token: str | None, asked: bool) -> tuple[Any, str | None, str | None]:
    """kvplan's plan of the deployment, or ``None`` and why not (the model cannot be loaded, an option the log
    gives is not one kvplan plans). ``asked``: the user named the model (``--model``): then a plan that fails is
    an error, as ``kvplan estimate`` would give it. The third value: the bundled spec planned in place of a log's
    model that kvplan cannot load but whose name is that spec's."""

    if "model" not in values:
        return None, "the log does not name the model: pass --model (a local folder, a bundled id or a Hub id)", None
    try:
        return _estimate(values, token), None, None
    except KvplanError as exc:
        if asked:
            raise
        why = (f"kvplan cannot plan the log's model {values['model']}: {exc.one_line()}; the comparison with "
               "kvplan's own plan needs the model (--model DIR or a Hub id)")
    same = _bundled_by_name(values["model"])
    if same is not None:
        try:
            return _estimate({**values, "model": same}, token), None, same
        except KvplanError:
            pass
    return None, why, None


# Hub repositories renamed since the logs were written (the Hub redirects the old name)
_RENAMED = {f"meta-llama-3.1-{size}{kind}": f"llama-3.1-{size}{kind}" for size in ("8b", "70b", "405b")
            for kind in ("", "-instruct")}
_HF_CACHE_DIR = re.compile(r"models--([^/]+?)--([^/]+)(?:/snapshots/[^/]*)?/?$")
def _at_model_length(plan: Any, values: dict[str, Any], given: dict[str, Any],
                     token: str | None) -> tuple[Any, dict[str, Any]]:
    """``plan`` at the model's maximum length when neither the log nor the user sets max_model_len (the engine's
    default), else as it is."""

    longest = plan.answer.model_max_len
    if "max_model_len" in values or "max_model_len" in given or not longest or longest == plan.max_model_len:
        return plan, values
    values = {**values, "max_model_len": longest, "context": longest}
    return _estimate(values, token), values


def _release_and_length(log: StartupLog, plan: Any, values: dict[str, Any], given: dict[str, Any],
                        token: str | None) -> tuple[Any, dict[str, Any], list[str]]:
    """The plan of the log's release and length: when the log prints no release number, the newest modelled release
    whose rules reproduce its capacity lines among those its line forms allow (:func:`release_candidates`; else the
    newest of them); at the model's maximum length when the log does not print max_model_len. The values it was
    planned with, and notes saying which and why."""
    from kvplan.engines.registry import engine as engine_rules

    notes: list[str] = []
    candidates = release_candidates(log) if "engine_version" not in given else ()
    if candidates:
        rules = engine_rules(log.engine or "vllm")
        lo, hi = log.releases
        said = f"{rules.ENGINE} {lo} - {hi}" if hi else f"{rules.ENGINE} {lo} and later"
        tried, good = [], []
        for version in candidates:
            first = rules.RANGES[version].split()[0]
            try:
                trial = _estimate({**values, "engine_version": first}, token)
                trial, trial_values = _at_model_length(trial, {**values, "engine_version": first}, given, token)
            except KvplanError:
                continue
            tried.append((version, trial, trial_values))
            found, _, miss = _from_logged(log, trial)
            if found is not None and not miss:
                good.append(tried[-1])
        if tried:
            version, plan, values = (good or tried)[0]  # the newest that reproduces the log, else the newest
            used = f"kvplan used the rules of {version} ({rules.RANGES[version]})"
            if not prints_capacity_lines(log):
                how = (f"the log prints no block, token or concurrency line to tell its releases apart; {used}, the "
                       "newest (pass --engine-version)")
            elif len(good) > 1:
                how = (f"the rules of {len(good)} of its {len(tried)} modelled releases ({good[-1][0]} to {good[0][0]}) "
                       f"reproduce it; {used}, the newest (pass --engine-version)")
            elif good:
                how = f"{used}, {'the one that reproduces it' if len(tried) > 1 else 'which reproduces it'}"
            else:
                how = f"{used} (pass --engine-version)"
            notes.append(f"version not in the log: its lines are {said}'s; {how}")
        else:
            plan, values = _at_model_length(plan, values, given, token)
    else:
        plan, values = _at_model_length(plan, values, given, token)
    if "max_model_len" in values and values["max_model_len"] == plan.answer.model_max_len and log.max_model_len is None \
            and "max_model_len" not in given:
        notes.append(f"max_model_len not in the log: the model's maximum, as the engine takes it: "
                     f"{plan.answer.model_max_len_rule or format(plan.max_model_len, ',')}")
    return plan, values, notes


def _bundled_by_name(model: str) -> str | None:
    """The bundled spec whose name is the last part of ``model`` (a local folder ``/models/Qwen2.5-7B-Instruct``, a
    re-upload ``unsloth/Llama-3.2-3B-Instruct``, a Hugging Face cache folder ``.../models--Qwen--Qwen3-14B/snapshots/
    <commit>``, a ModelScope folder ``Qwen3-0___6B``), when exactly one is."""
    from kvplan.model.sources import bundled_ids

    cached = _HF_CACHE_DIR.search(model)
    if cached:
        repo = f"{cached.group(1)}/{cached.group(2)}".lower()
        exact = [b for b in bundled_ids() if b.lower() == repo]
        if exact:
            return exact[0]
        model = repo
    name = model.rstrip("/").rsplit("/", 1)[-1].lower().replace("___", ".")  # ModelScope's folders: "Qwen3-0___6B"
    name = _RENAMED.get(name, name)
    hits = [b for b in bundled_ids() if b.rsplit("/", 1)[-1].lower() == name and b.lower() != model.lower()]
    return hits[0] if len(hits) == 1 else None


def mm_profile_note(log: StartupLog, planned: tuple[int, str, int] | None) -> str:
    """One line setting the log's multimodal dummy batch ("profiled with K <modality> items" within an encoder
    budget of N tokens) beside the one kvplan's plan profiles (``Budget.mm_profile``)."""
    said = (f"{plural(log.mm_items or 0, f'{log.mm_modality} item')} within an encoder budget of "
            f"{plural(log.mm_budget_tokens or 0, 'token')}")
    if planned is None:
        return f"the log profiles {said}; kvplan models no multimodal profile for this model (its activation lacks it)"
    items, modality, budget = planned
    if (items, modality, budget) == (log.mm_items, log.mm_modality, log.mm_budget_tokens):
        return f"the multimodal profile is the log's: {said}"
    return (f"the log profiles {said}; kvplan's plan profiles {plural(items, f'{modality} item')} within "
            f"{plural(budget, 'token')} (its activation term follows its own)")


def _other_prefix_caching(log: StartupLog, plan: Any, values: dict[str, Any], token: str | None) -> Any:
    """``(plan, values, _from_logged(...))`` with prefix caching the other way, when the log does not say and the
    model has state layers (whose blocks per request depend on it) and that plan reproduces the log's capacity
    lines where the default's does not; else ``None``. A start-up log prints the setting only in its argument
    lines, which excerpts often leave out."""

    if not any(layer.is_state for layer in plan.spec.layers):
        return None
    trial_values = {**values, "prefix_caching": not plan.prefix_caching}
    try:
        trial = _estimate(trial_values, token)
    except KvplanError:
        return None
    found = _from_logged(log, trial)
    return (trial, trial_values, found) if found[0] is not None and not found[2] else None


def explain(text: str, overrides: dict[str, Any] | None = None, token: str | None = None) -> Explanation:
    """Parse ``text`` (a start-up log), plan the same deployment, reconcile (see the module docstring)."""
    from kvplan.planning.plan import options_from_values

    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    options_from_values({"model": "-", **given})  # the user's own values: a mistake there is an error (exit 2)
    log = parse_log(text)
    values, notes = log_values(log, overrides)
    gpu_known = any(k in values for k in ("gpu", "gpu_memory"))
    plan_values = values if gpu_known else {**values, "gpu_memory": _stand_in_memory(log)}
    plan, why, same = _plan(plan_values, token, asked=bool(given.get("model")))
    if same is not None:
        plan_values = {**plan_values, "model": same}
    if plan is not None:
        plan, plan_values, more = _release_and_length(log, plan, plan_values, given, token)
        notes += more
        values = {**values, **{k: plan_values[k] for k in ("engine_version", "max_model_len", "context")
                               if k in plan_values}}
    if same is not None:
        notes.append(f"the log's model {values['model']} is not one kvplan can load here; its name is the bundled "
                     f"{same}'s: planned with that (pass --model to choose another)")
    needs = () if why is None else (why,)
    if plan is not None and not gpu_known:
        needs = ("the GPU is not in the log: kvplan's own terms need it (pass --gpu NAME or --gpu-memory SIZE)",)
    from_logged, span, mismatches = (None, None, []) if plan is None else _from_logged(log, plan)
    if plan is not None and mismatches and "prefix_caching" not in given and "prefix_caching" not in plan_values:
        flipped = _other_prefix_caching(log, plan, plan_values, token)
        if flipped is not None:
            plan, plan_values, (from_logged, span, mismatches) = flipped
            values = {**values, "prefix_caching": plan.prefix_caching}
            notes.append(f"prefix caching {'on' if plan.prefix_caching else 'off'}: the log's capacity lines hold only "
                         "with it (the blocks a request keeps in each state group depend on it), although "
                         f"{plan.engine.label}'s default for this model is {'off' if plan.prefix_caching else 'on'}")
    if plan is not None and log.mm_items is not None:
        notes.append(mm_profile_note(log, plan.budget.mm_profile))
    rows = _term_rows(log, plan, gpu_known)
    if plan is not None and from_logged is None and log.kv_cache_tokens is not None:
        mismatches = ["the log prints tokens but no KV budget or blocks to derive them from"]
    own = capacity(plan, plan.answer.num_blocks) if plan is not None and gpu_known else None
    ex = Explanation(log, plan, values, rows, logged_kv_bytes(log), own, from_logged, span,
                     None if from_logged is None else not mismatches, tuple(mismatches), tuple(notes), needs, gpu_known)
    return replace(ex, diagnosis=diagnosis(ex))


__all__ = ["explain", "mm_profile_note"]
