"""The observation beside the plan for the same deployment.

The plan is :func:`kvplan.planning.plan.estimate` on the command line's estimate options, exactly what
``kvplan estimate`` prints; nothing here recomputes capacity. Where the user left an option at its
default and vLLM's ``vllm:cache_config_info`` says what the server runs with (block size,
``gpu_memory_utilization``, KV cache dtype, prefix caching, an explicit KV budget), the plan is made once
more with those values, and its assumptions say which came from the endpoint.

Per series the comparison gives lines (blocks, concurrency) and findings, one line each: a block count
(SGLang: token pool) other than the plan's, another block size, another engine or engine generation, more
requests running at once than the plan fits at ``--context``.

The plan is for one model: a series whose ``model_name`` label names another model (see
:func:`same_model`) is not compared with it (one finding names both), and its cache config is not
adopted. A plan whose engine refuses to start (no pool) is said so in one line, never as "plan 0 blocks".
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from kvplan.errors import KvplanError
from kvplan.observe.metrics import FAMILIES
from kvplan.observe.session import SeriesResult
from kvplan.units import plural
from kvplan.frozen import frozen


def _bool(text: str) -> bool | None:
    return {"true": True, "false": False}.get(text.strip().lower())


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() and int(text) > 0 else None


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value <= 1 else None


def _kv_dtype(text: str) -> str | None:
    return None if text.strip().lower() in ("auto", "", "none") else text.strip()


def _budget(text: str) -> str | None:
    n = _int(text)
    return f"{n}B" if n else None


# cache_config_info label -> (options_from_values key, parser of the label's text; None = not usable)
ENDPOINT_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "block_size": ("block_size", _int),
    "gpu_memory_utilization": ("gpu_util", _float),
    "cache_dtype": ("kv_dtype", _kv_dtype),
    "enable_prefix_caching": ("prefix_caching", _bool),
    "kv_cache_memory_bytes": ("kv_budget", _budget),
}


def endpoint_values(cache_config: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """Options the user left unset that the endpoint's cache config fills: key -> (value, ``label=text``)."""
    out: dict[str, tuple[Any, str]] = {}
    for label, (key, parse) in ENDPOINT_OPTIONS.items():
        text = cache_config.get(label)
        if text is None or values.get(key) is not None:
            continue
        value = parse(text)
        if value is not None:
            out[key] = (value, f"{label}={text}")
    return out


def _name_forms(name: str) -> set[str]:
    """A model name as a server may label it: the whole name and its last path part, lower case."""
    text = name.strip().rstrip("/").lower()
    return {text, text.rsplit("/", 1)[-1]} - {""}


def same_model(served: str | None, planned: Iterable[str], exact: bool = False) -> bool:
    """Whether a series labelled ``model_name=served`` serves the planned model: no label (nothing says
    otherwise), the same name, or (unless ``exact``) the same last path part, case aside (vLLM labels a
    model with its path or Hub id: ``/models/Llama-3.1-8B-Instruct`` is ``meta-llama/Llama-3.1-8B-Instruct``)."""
    if served is None:
        return True
    names = [n for n in planned if n]
    if exact:
        return served in names
    forms = _name_forms(served)
    return any(forms & _name_forms(n) for n in names)


def served_bundled_model(labels: Iterable[Iterable[tuple[str, str]]]) -> tuple[str, str] | None:
    """When no ``--model`` is given: the bundled model the endpoint's series name (their ``model_name``
    label, as :func:`same_model` matches names), as (bundled id, ``model_name=label``); ``None`` when they
    name none, several, or a model kvplan does not bundle."""
    from kvplan.model.sources import bundled_ids

    served = {dict(ls).get("model_name") for ls in labels} - {None, ""}
    if len(served) != 1:
        return None
    name = served.pop()
    ids = bundled_ids()
    exact = [i for i in ids if i.lower() == name.strip().lower()]
    hits = exact or [i for i in ids if same_model(name, [i])]
    return (hits[0], f"model_name={name}") if len(hits) == 1 else None


@frozen
class PlanView:
    """The plan and where its options came from: ``from_endpoint`` maps an option to ``label=text``;
    ``given``: the options the user gave (None: those in ``values`` that are not None)."""

    plan: Any  # kvplan.planning.plan.Plan
    values: Mapping[str, Any]
    from_endpoint: Mapping[str, str]
    notes: tuple[str, ...] = ()
    given: frozenset[str] | None = None

    def _given(self, option: str) -> bool:
        return option in self.given if self.given is not None else self.values.get(option) is not None

    def assumptions(self, prefix: tuple[int, str] | None = None) -> list[tuple[str, Any, str]]:
        """(name, value, source) for what the plan assumed; source: ``--flag``, ``endpoint ...`` or ``default``
        (``--gpus`` for tp when only ``--gpus N`` was given: it implies ``--tp N``). ``prefix``: the shared
        prefix the comparison credited (tokens, source; :func:`observed_prefix`), else the plan's."""
        a = self.plan.to_dict()["assumptions"]
        rows = [("model", self.plan.spec.model_id,
                 f"endpoint: {self.from_endpoint['model']}" if "model" in self.from_endpoint else self.plan.source)]
        keys = {"gpu": "gpu", "tp": "tp", "pp": "pp", "engine": "engine", "engine_version": "engine_version",
                "dtype": "dtype", "kv_dtype": "kv_dtype", "gpu_util": "gpu_util", "block_size": "block_size",
                "context_tokens": "context", "max_model_len": "max_model_len", "max_num_seqs": "max_num_seqs",
                "max_num_batched_tokens": "max_num_batched_tokens", "prefix_caching": "prefix_caching"}
        for name, option in keys.items():
            if option in self.from_endpoint:
                source = f"endpoint: {self.from_endpoint[option]}"
            elif self._given(option):
                source = "--" + option.replace("_", "-")
            elif option == "tp" and self.plan.options.tp_from_gpus:
                source = "--gpus"
            else:
                source = "default"
            rows.append((name, a.get(name), source))
        if "kv_budget" in self.from_endpoint:
            rows.append(("kv_budget_bytes", self.plan.budget.kv_budget_bytes, f"endpoint: {self.from_endpoint['kv_budget']}"))
        if prefix is None:
            prefix = (self.plan.options.prefix_tokens, "--prefix-tokens" if self._given("prefix_tokens") else "default")
        rows.append(("prefix_tokens", prefix[0], prefix[1]))
        return rows


class Planner:
    """The plan for the observed deployment: made before polling (bad options fail before any request),
    and once more when the endpoint's cache config fills options the user left unset."""

    def __init__(self, values: Mapping[str, Any], token: str | None = None, given: frozenset[str] | None = None,
                 served_name: str | None = None, model_from: str | None = None) -> None:
        from kvplan.planning.plan import estimate, options_from_values

        self.values, self.token, self.given, self.served_name = dict(values), token, given, served_name
        self.model_from = {"model": model_from} if model_from else {}  # the model named by the endpoint's label
        self._adopted = False
        self.pending: KvplanError | None = None  # why there is no plan yet (the endpoint may still give it)
        try:
            plan = estimate(options_from_values(self.values), token=token)
        except KvplanError as exc:
            if not self._budget_would_plan():
                raise
            self.pending, plan = exc, None  # e.g. --gpu cpu: the endpoint's kv_cache_memory_bytes will size it
        self.view: PlanView | None = PlanView(plan, self.values, dict(self.model_from), given=given) if plan is not None else None

    @property
    def model_name(self) -> str:
        """The planned model as the output names it (the resolved model id, else as given)."""
        return self.view.plan.spec.model_id if self.view is not None else str(self.values.get("model") or "")

    def _budget_would_plan(self) -> bool:
        """Whether only a KV budget is missing (a target without a memory size, such as ``cpu``), which the
        endpoint's ``kv_cache_memory_bytes`` gives: then planning waits for the endpoint."""
        if self.values.get("kv_budget") is not None:
            return False
        from kvplan.planning.plan import estimate, options_from_values

        try:
            estimate(options_from_values({**self.values, "kv_budget": "1GiB"}), token=self.token)
        except KvplanError:
            return False
        return True

    def serves(self, labels: Iterable[tuple[str, str]]) -> bool:
        """Whether a series with these labels serves the planned model (``served_name``: its exact
        ``model_name`` label, vLLM's ``--served-model-name``; else the model as given or resolved)."""
        served = dict(labels).get("model_name")
        if self.served_name is not None:
            return same_model(served, [self.served_name], exact=True)
        return same_model(served, [str(self.values.get("model") or ""),
                                   self.view.plan.spec.model_id if self.view is not None else ""])

    def adopt(self, cache_config: Mapping[str, str]) -> bool:
        """Re-plan with the endpoint's cache config (once); True when the plan changed."""
        if self._adopted or not cache_config:
            return False
        self._adopted = True
        filled = endpoint_values(cache_config, self.values)
        if not filled:
            return False
        from kvplan.planning.plan import estimate, options_from_values

        merged = {**self.values, **{k: v for k, (v, _) in filled.items()}}
        try:
            plan = estimate(options_from_values(merged), token=self.token)
        except KvplanError as exc:
            if self.view is None:
                return False
            note = f"the endpoint's cache config could not be planned ({exc.one_line()}); the plan uses the command line"
            self.view = PlanView(self.view.plan, self.values, dict(self.model_from), (note,), self.given)
            return False
        self.pending = None
        self.view = PlanView(plan, self.values, {**self.model_from, **{k: text for k, (_, text) in filled.items()}},
                             given=self.given)
        return True


@frozen
class Comparison:
    """One series against the plan: blocks (SGLang: tokens) and concurrency, with findings."""

    series: str
    server_num_gpu_blocks: int | None
    plan_num_blocks: int | None  # None (as every plan_* field): not compared, another model (``compared``)
    server_block_size: int | None
    plan_block_size: int | None
    server_max_total_tokens: int | None
    plan_capacity_tokens: int | None
    running_peak: float | None
    plan_max_requests: int | None
    plan_context_tokens: int | None
    lines: tuple[str, ...]
    findings: tuple[str, ...]
    compared: bool = True  # False: the series serves another model than the plan's
    engine_starts: bool = True  # the plan's engine starts (False: it refuses; no pool to compare)
    cause: str | None = None  # Diagnosis.cause: agreement, sharing, pool, max_num_seqs, shorter
    prefix_tokens: int = 0  # the shared prefix credited, and where it came from
    prefix_source: str = "default"
    fits_unshared: int | None = None  # requests of --context tokens the server's pool fits without / with it
    fits_shared: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (int(v) if isinstance(v, float) and v.is_integer() else v) for k, v in self.__dict__.items()
                if k not in ("lines", "findings")} | {"lines": list(self.lines), "findings": list(self.findings)}


def _pct(server: int, plan: int) -> str:
    return f"{(server - plan) / plan:+.1%}" if plan else "n/a"


def _pool_check(who: str, what: str, unit: str, server: int | None, plan: int, lines: list[str],
                findings: list[str]) -> None:
    """The server's pool size against the plan's: a line when equal, a finding when not."""
    if server is None:
        return
    text = f"{what}: server {server:,} {unit}, plan {plan:,}"
    if server == plan:
        lines.append(text + " (equal)")
    else:
        findings.append(f"{who}: {text} ({_pct(server, plan)}): the deployment or a budget term differs from the "
                        "plan's assumptions")


def _other_model(model: str, series: SeriesResult, served_name: str | None) -> Comparison:
    """A series serving another model than ``model`` (the planned one): one finding naming both, nothing compared."""
    served = dict(series.labels).get("model_name")
    if served_name is not None:
        how = f"--served-model-name {served_name} names the planned one"
    elif served and "/" not in served:  # no org/name and no path: likely vLLM's --served-model-name alias
        how = (f"{served!r} may be a --served-model-name alias: if it serves the planned model, pass "
               f"--served-model-name {served}; else pass --model with the checkpoint it serves")
    else:
        how = f"pass --model {served} to plan it"
    finding = (f"{series.name}: the endpoint serves model {served!r}, not the planned {model!r}: "
               f"not compared with the plan ({how})")
    s = series.summary
    return Comparison(series.name, s.num_gpu_blocks, None, s.block_size, None, s.max_total_num_tokens, None,
                      s.running_peak, None, None, (), (finding,), compared=False)


def compare(view: PlanView | None, series: SeriesResult, planner: Planner | None = None) -> Comparison | None:
    """One series' observation against the plan (lines + findings, one line each); with ``planner``, a
    series that serves another model is not compared (:meth:`Planner.serves`). None: no plan yet (the
    endpoint never gave the KV budget it waited for) and the series serves the planned model."""
    if planner is not None and not planner.serves(series.labels):
        return _other_model(planner.model_name, series, planner.served_name)
    if view is None:
        return None
    plan, s = view.plan, series.summary
    a, engine = plan.answer, plan.engine
    lines: list[str] = []
    findings: list[str] = []
    who = series.name
    if a.refusal is not None:
        pool = (f"{s.num_gpu_blocks:,} GPU blocks" if s.num_gpu_blocks is not None else
                f"a {s.max_total_num_tokens:,}-token pool" if s.max_total_num_tokens is not None else "a pool")
        findings.append(f"{who}: the plan says {engine.engine} {engine.version} does not start this deployment "
                        f"({a.refusal}), yet the server runs with {pool}: the deployment differs from the plan's "
                        "assumptions (--gpu, --tp, --dtype, --quantization, --max-model-len)")
        return Comparison(who, s.num_gpu_blocks, a.num_blocks, s.block_size, plan.layout.block_size,
                          s.max_total_num_tokens, a.capacity_tokens, s.running_peak, a.max_requests, a.context,
                          (), tuple(findings), engine_starts=False)
    if series.family != engine.engine:
        findings.append(f"{who}: the endpoint runs {series.engine}, the plan models {engine.engine}: "
                        f"pass --engine {series.family}")
    elif series.engine == "vLLM V0" and engine.mode != "V0":
        findings.append(f"{who}: the endpoint runs vLLM's V0 engine, the plan models vllm {engine.version} "
                        f"({engine.mode}): pass --engine-version of the server's release")
    if FAMILIES[series.family].pool_unit == "tokens":
        _pool_check(who, "token pool", "tokens", s.max_total_num_tokens, a.capacity_tokens, lines, findings)
    else:
        _pool_check(who, "blocks", "GPU blocks", s.num_gpu_blocks, a.num_blocks, lines, findings)
    if s.block_size is not None and s.block_size != plan.layout.block_size:
        findings.append(f"{who}: the server's block size is {s.block_size}, the plan's {plan.layout.block_size} "
                        "(pass --block-size)")
    d = diagnose(view, s)
    if s.running_peak is not None:
        lines.append(f"concurrency: running peak {s.running_peak:,.0f}; the plan fits {plural(a.max_requests, 'request')} of "
                     f"{plural(a.context, 'token')} (max concurrency {a.max_concurrency:.2f}x at max_model_len {plan.max_model_len:,})")
    lines.extend(d.lines)
    findings.extend(f"{who}: {f}" for f in d.findings)
    return Comparison(who, s.num_gpu_blocks, a.num_blocks, s.block_size, plan.layout.block_size, s.max_total_num_tokens,
                      a.capacity_tokens, s.running_peak, a.max_requests, a.context, tuple(lines), tuple(findings),
                      cause=d.cause, prefix_tokens=d.prefix_tokens, prefix_source=d.prefix_source,
                      fits_unshared=d.fits_unshared, fits_shared=d.fits_shared)


FULL_POOL = 0.99  # a usage peak at or above this: the pool ran full
MIN_HIT_RATE = 0.01  # prefix hits below this share of prompt tokens are not a shared prefix


@frozen
class Diagnosis:
    """Why the running peak is what it is: ``cause`` is ``agreement`` (within what the plan fits),
    ``sharing`` (prefix-cache hits let more requests share the pool's blocks than the plan fits without
    them), ``pool`` (the pool ran full and the engine preempted: the pool binds), ``max_num_seqs`` (the
    scheduler's limit binds), ``shorter`` (more ran than fit, with no sharing and no full pool: the
    requests were shorter than --context) or None (nothing to judge). ``prefix_tokens``: the shared prefix
    credited (the plan's ``--prefix-tokens``, or the observed hit rate x the mean prompt), and where it
    came from; ``fits_*``: requests of --context tokens the server's pool holds without / with it."""

    cause: str | None
    lines: tuple[str, ...]
    findings: tuple[str, ...]
    prefix_tokens: int = 0
    prefix_source: str = "default"
    fits_unshared: int | None = None
    fits_shared: int | None = None


def observed_prefix(view: PlanView, s: Any) -> tuple[int, str]:
    """The shared prefix to credit (tokens, source): ``--prefix-tokens`` when given, else what the page's
    prefix-cache hits say (hit rate during the run, or over the server's life, x the mean prompt of the
    requests that finished, or x --context when the page does not say), else none."""
    plan = view.plan
    if view._given("prefix_tokens") or plan.options.prefix_tokens:
        return plan.options.prefix_tokens, "--prefix-tokens"
    rate = s.prefix_hit_rate_during_run if s.prefix_hit_rate_during_run is not None else s.prefix_hit_rate
    if not plan.prefix_caching or rate is None or rate < MIN_HIT_RATE:
        return 0, "default"
    prompt = s.mean_prompt_tokens
    basis = f"{prompt:,.0f}-token prompts" if prompt else f"--context {plan.answer.context:,}"
    tokens = min(plan.answer.context, round(rate * (prompt or plan.answer.context)))
    return tokens, f"endpoint: prefix hit rate {rate:.1%} of {basis}"


def _shared_fit(view: PlanView, s: Any, blocks: int, context: int, cap: int) -> tuple[int, str, int | None]:
    """The shared prefix the page or ``--prefix-tokens`` shows (:func:`observed_prefix`), where it comes from, and
    the requests of ``context`` tokens that ``blocks`` fit with it stored once (``None``: no prefix, prefix caching
    off, or no block shared)."""
    from kvplan import memory

    plan = view.plan
    prefix, source = observed_prefix(view, s)
    shared = None
    if prefix and plan.prefix_caching:
        sharing = memory.prefix_sharing(blocks, plan.demand, context, prefix, plan.spec.parameters_read(1), cap)
        if sharing.shared_blocks:
            shared = sharing.max_requests_shared
    return prefix, source, shared


def diagnose(view: PlanView, s: Any) -> Diagnosis:
    """The running peak against what the server's pool fits at --context (the server's ``num_gpu_blocks``
    when the page says, else the plan's), crediting a shared prefix (:func:`observed_prefix`) with
    :func:`kvplan.memory.prefix_sharing`, the one prefix-sharing rule."""
    from kvplan import memory

    plan = view.plan
    a, demand = plan.answer, plan.demand
    peak = s.running_peak
    if peak is None or a.refusal is not None:
        return Diagnosis(None, (), ())
    same_size = s.block_size is None or s.block_size == plan.layout.block_size
    blocks = s.num_gpu_blocks if s.num_gpu_blocks is not None and same_size else a.num_blocks
    pool = "the server's pool" if blocks != a.num_blocks else "the pool"
    cap = a.max_num_seqs
    context = a.context
    unshared = min(memory.max_requests(blocks, demand.blocks(context)), cap)
    prefix, source, shared = _shared_fit(view, s, blocks, context, cap)
    fits = shared if shared is not None else unshared
    at = f"{plural(context, 'token')}"
    share_text = ""
    if shared is not None:
        stored = prefix // plan.layout.block_size
        share_text = (f"; with the {prefix:,}-token shared prefix ({plural(stored, 'block')} stored once"
                      f"{', ' + source.removeprefix('endpoint: ') if source.startswith('endpoint') else ''}) {shared:,}")
    lines = [f"diagnosis: {pool} ({plural(blocks, 'block')}) fits {plural(unshared, 'request')} of {at} without "
             f"sharing{share_text}"]
    pre, usage, waiting = s.preemptions_during_run, s.kv_cache_usage_peak, s.waiting_peak
    ran = f"{plural(round(peak), 'request')} ran at once"
    findings: list[str] = []
    if (pre or 0) > 0 or (usage is not None and usage >= FULL_POOL and (waiting or 0) > 0):
        cause = "pool"
        what = (f"{pre:,.0f} preemptions in the run, " if pre else "") + (f"pool peak {usage:.0%}" if usage is not None else "")
        with_prefix = f", {shared:,} with the {prefix:,}-token prefix the hit rate suggests" if shared is not None else ""
        findings.append(f"the pool binds ({what.rstrip(', ')}): {ran}; requests are admitted "
                        f"with their prompt's blocks and grow until the pool is full, then the engine preempts (the plan "
                        f"fits {unshared:,} of {at} without sharing{with_prefix}): at this load the KV pool, not compute, "
                        "limits the server (more KV, prefix caching, or fewer requests at once: --max-num-seqs)")
    elif peak >= cap and (waiting or 0) > 0:
        cause = "max_num_seqs"
        lines.append(f"max_num_seqs binds: {peak:,.0f} running (its limit) with requests waiting and the pool not full")
    elif peak > fits:
        cause = "shorter"
        findings.append(f"{ran}, more than the {fits:,} the plan fits at {at}"
                        f"{' with the shared prefix' if shared is not None else ''}: requests were shorter than --context")
    elif shared is not None and peak > unshared:
        cause = "sharing"
        if source == "--prefix-tokens":
            lines.append(f"agrees with the plan's prefix sharing: {peak:,.0f} running, more than the {unshared:,} that fit "
                         f"without it and within the {shared:,} that fit with it")
        else:
            findings.append(f"{ran}, more than the {unshared:,} the plan fits at {at} without "
                            f"sharing: the page shows prefix-cache hits ({source.removeprefix('endpoint: ')}): a "
                            f"{prefix:,}-token shared prefix stored once fits {shared:,} (plan with --prefix-tokens {prefix})")
    else:
        cause = "agreement"
        lines.append(f"agrees with the plan: {peak:,.0f} running, within the {fits:,} that fit"
                     f"{' with the shared prefix' if shared is not None else ''}")
    return Diagnosis(cause, tuple(lines), tuple(findings), prefix, source, unshared, shared)
