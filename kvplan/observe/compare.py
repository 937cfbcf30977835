"""The observation beside the plan for the same deployment.

The plan is :func:`kvplan.plan.estimate` on the command line's estimate options, exactly what
``kvplan estimate`` prints; nothing here recomputes capacity. Where the user left an option at its
default and vLLM's ``vllm:cache_config_info`` says what the server runs with (block size,
``gpu_memory_utilization``, KV cache dtype, prefix caching, an explicit KV budget), the plan is made once
more with those values, and its assumptions say which came from the endpoint.

Per series the comparison gives lines (blocks, concurrency) and findings, one line each: a block count
(SGLang: token pool) other than the plan's, another block size, another engine or engine generation, more
requests running at once than the plan fits at ``--context``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kvplan.errors import KvplanError
from kvplan.observe.metrics import FAMILIES
from kvplan.observe.session import SeriesResult


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


@dataclass(frozen=True)
class PlanView:
    """The plan and where its options came from: ``from_endpoint`` maps an option to ``label=text``;
    ``given``: the options the user gave (None: those in ``values`` that are not None)."""

    plan: Any  # kvplan.plan.Plan
    values: Mapping[str, Any]
    from_endpoint: Mapping[str, str]
    notes: tuple[str, ...] = ()
    given: frozenset[str] | None = None

    def _given(self, option: str) -> bool:
        return option in self.given if self.given is not None else self.values.get(option) is not None

    def assumptions(self) -> list[tuple[str, Any, str]]:
        """(name, value, source) for what the plan assumed; source: ``--flag``, ``endpoint ...`` or ``default``
        (``--gpus`` for tp when only ``--gpus N`` was given: it implies ``--tp N``)."""
        a = self.plan.to_dict()["assumptions"]
        rows = [("model", self.plan.spec.model_id, self.plan.source)]
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
        return rows


class Planner:
    """The plan for the observed deployment: made before polling (bad options fail before any request),
    and once more when the endpoint's cache config fills options the user left unset."""

    def __init__(self, values: Mapping[str, Any], token: str | None = None, given: frozenset[str] | None = None) -> None:
        from kvplan.plan import estimate, options_from_values

        self.values, self.token, self.given = dict(values), token, given
        self.view = PlanView(estimate(options_from_values(self.values), token=token), self.values, {}, given=given)
        self._adopted = False

    def adopt(self, cache_config: Mapping[str, str]) -> bool:
        """Re-plan with the endpoint's cache config (once); True when the plan changed."""
        if self._adopted or not cache_config:
            return False
        self._adopted = True
        filled = endpoint_values(cache_config, self.values)
        if not filled:
            return False
        from kvplan.plan import estimate, options_from_values

        merged = {**self.values, **{k: v for k, (v, _) in filled.items()}}
        try:
            plan = estimate(options_from_values(merged), token=self.token)
        except KvplanError as exc:
            note = f"the endpoint's cache config could not be planned ({exc.one_line()}); the plan uses the command line"
            self.view = PlanView(self.view.plan, self.values, {}, (note,), self.given)
            return False
        self.view = PlanView(plan, self.values, {k: text for k, (_, text) in filled.items()}, given=self.given)
        return True


@dataclass(frozen=True)
class Comparison:
    """One series against the plan: blocks (SGLang: tokens) and concurrency, with findings."""

    series: str
    server_num_gpu_blocks: int | None
    plan_num_blocks: int
    server_block_size: int | None
    plan_block_size: int
    server_max_total_tokens: int | None
    plan_capacity_tokens: int
    running_peak: float | None
    plan_max_requests: int
    plan_context_tokens: int
    lines: tuple[str, ...]
    findings: tuple[str, ...]

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


def compare(view: PlanView, series: SeriesResult) -> Comparison:
    """One series' observation against the plan (lines + findings, one line each)."""
    plan, s = view.plan, series.summary
    a, engine = plan.answer, plan.engine
    lines: list[str] = []
    findings: list[str] = []
    who = series.name
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
    if s.running_peak is not None:
        lines.append(f"concurrency: running peak {s.running_peak:,.0f}; the plan fits {a.max_requests:,} requests of "
                     f"{a.context:,} tokens (max concurrency {a.max_concurrency:.2f}x at max_model_len {plan.max_model_len:,})")
        if s.running_peak > a.max_requests:
            findings.append(f"{who}: {s.running_peak:,.0f} requests ran at once, more than the {a.max_requests:,} the "
                            f"plan fits at {a.context:,} tokens: requests were shorter than --context")
    return Comparison(who, s.num_gpu_blocks, a.num_blocks, s.block_size, plan.layout.block_size, s.max_total_num_tokens,
                      a.capacity_tokens, s.running_peak, a.max_requests, a.context, tuple(lines), tuple(findings))
