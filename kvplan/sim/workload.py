"""Workload files for ``kvplan simulate``: a pydantic schema, file:line:col errors, request streams.

A workload names the deployment with the same option keys as ``kvplan estimate`` (or points at a check
of a capacity file with ``plan: capacity.yaml#check-name``) and describes the traffic::

    model: meta-llama/Llama-3.1-8B-Instruct
    gpu: H100
    kv_budget: 8GiB
    max_model_len: 4096
    arrivals: {rate: 10}                  # Poisson, requests/s; or {users: 64, think_s: 2}
    prefixes: [{name: system, tokens: 2000, share: 1.0}]
    prompt_tokens: {dist: uniform, min: 50, max: 200}   # after the prefix
    output_tokens: {dist: uniform, min: 100, max: 300}
    duration_s: 3600                      # and/or num_requests
    seed: 0

or replaces the length fields with ``trace: requests.jsonl`` (one JSON object per line: ``prompt_tokens``,
``output_tokens``, optional ``prefix_id``, ``prefix_tokens``, ``arrival_s``). The option types are
:mod:`kvplan.checks.fields`'s, the YAML reader and the error formatting :mod:`kvplan.io.yamldoc`'s (one loader
for every kvplan file).

The schema is :mod:`kvplan.sim.workload_schema`'s; a run of the workload (its requests under each policy, the
capacity its figures are read against) :mod:`kvplan.sim.workload_run`'s.

Only the ``simulate`` command imports this module (pydantic is not imported by ``import kvplan.cli.app``).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import field
from pathlib import Path
from typing import Any, Iterator, Mapping

from kvplan.errors import KvplanError, ScenarioError
from kvplan.io.kinds import WORKLOAD
from kvplan.io.yamldoc import (ScenarioFileError, Where, YamlDoc, display_path, expect_kind, option_locations, read_yaml,
                               validate_doc)
from kvplan.checks.fields import finish_values, option_values
from kvplan.units import check_number, fmt_seconds, plural
from kvplan.sim.simulate import POLICIES, ClosedLoop, Request, RequestSource, Work, estimate_work
from kvplan.sim.workload_schema import MAX_SECONDS, MAX_TOKENS, WORKLOAD_OPTIONS, Fixed, Uniform, WorkloadModel
from kvplan.frozen import frozen

# ---------------------------------------------------------------------------------------------
# lengths


@frozen
class LengthDist:
    """A token-length distribution: ``fixed``, ``uniform`` (inclusive), ``normal`` or ``lognormal``
    (with the given mean and std of the result), rounded and clamped to ``[low, high]``."""

    kind: str
    a: float
    b: float = 0.0
    low: int = 0
    high: int | None = None

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        if self.kind == "normal":
            x = rng.gauss(self.a, self.b)
        else:  # lognormal with mean a and std b
            sigma2 = math.log(1 + (self.b / self.a) ** 2)
            x = rng.lognormvariate(math.log(self.a) - sigma2 / 2, math.sqrt(sigma2))
        n = max(self.low, round(x))
        return min(n, self.high) if self.high is not None else n

    @property
    def mean(self) -> float:
        """The mean length in tokens (before the clamp of a normal or lognormal, which moves it little)."""
        if self.kind == "fixed":
            return float(self.a)
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        return min(max(self.a, self.low), self.high if self.high is not None else self.a)

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{int(self.a):,}"
        if self.kind == "uniform":
            return f"uniform {int(self.a):,}-{int(self.b):,}"
        return f"{self.kind} mean {self.a:,g} std {self.b:,g}"


def _length(value: Any, doc: YamlDoc, loc: tuple[Any, ...]) -> LengthDist | None:
    if value is None:
        return None
    if isinstance(value, int):
        if value < 0:
            raise doc.error(loc, f"got {value}: expected a token count >= 0")
        return LengthDist("fixed", value)
    if isinstance(value, Fixed):
        return LengthDist("fixed", value.value)
    if isinstance(value, Uniform):
        if value.min > value.max:
            raise doc.error(loc, f"uniform min {value.min} exceeds max {value.max}")
        return LengthDist("uniform", value.min, value.max)
    if value.max is not None and value.max < value.min:
        raise doc.error(loc, f"max {value.max} is below min {value.min}")
    return LengthDist(value.dist, value.mean, value.std, value.min, value.max)


# ---------------------------------------------------------------------------------------------
# the validated workload


@frozen
class Prefix:
    name: str
    tokens: int
    share: float


@frozen
class Workload:
    """A validated workload file. ``values``: estimate options (``options_from_values`` keys)."""

    path: Path
    display: str
    name: str
    description: str | None
    values: Mapping[str, Any]
    seed: int
    duration_s: float | None
    num_requests: int | None
    rate: float | None
    closed_loop: ClosedLoop | None
    prompt: LengthDist | None
    output: LengthDist | None
    prefixes: tuple[Prefix, ...]
    trace: tuple[Request, ...] | None
    trace_path: str | None
    policies: tuple[str, ...]
    prefill_s_per_token: float | None
    decode_step_s: float | None
    prefill_efficiency: float
    where: Where
    timing_file: Path | None = None  # kvplan observe --fit-timing's file (kvplan.sim.timing)
    locations: Mapping[str, Where] = field(default_factory=dict)

    def where_of(self, key: str) -> Where:
        return self.locations.get(key, self.where)

    def describe_traffic(self) -> str:
        """One line: how requests arrive and how long they are."""
        if self.closed_loop:
            arrive = f"closed loop of {self.closed_loop.users:,} users, think {fmt_seconds(self.closed_loop.think_s)}"
        elif self.rate:
            arrive = f"Poisson {self.rate:g} req/s"
        else:
            arrive = "trace arrival times"
        if self.trace is not None:
            lengths = f"{plural(len(self.trace), 'request')} from {self.trace_path}"
        else:
            pre = " + ".join(f"{p.tokens:,}-token {p.name} ({p.share:.0%})" for p in self.prefixes)
            lengths = f"prompt {pre + ' + ' if pre else ''}{self.prompt.describe()}, output {self.output.describe()}"  # type: ignore[union-attr]
        stop = []
        if self.duration_s:
            stop.append(fmt_seconds(self.duration_s))
        if self.num_requests:
            stop.append(f"{plural(self.num_requests, 'request')}")
        return f"{arrive}; {lengths}; {' or '.join(stop) or 'the whole trace'}; seed {self.seed}"

    def source(self) -> RequestSource:
        """The request stream (deterministic for the seed; every replay draws the same requests)."""
        rate, duration, limit = self.rate, self.duration_s, self.num_requests
        if self.trace is not None:
            reqs = self.trace
            if rate:
                def timed_trace() -> Iterator[Request]:
                    rng, t = random.Random(self.seed), 0.0
                    for r in reqs:
                        t += rng.expovariate(rate)
                        if duration is not None and t >= duration:
                            return
                        yield Request(r.prompt_tokens, r.output_tokens, t, r.prefix_id, r.prefix_tokens)

                return RequestSource(timed_trace, limit)
            if self.closed_loop is None:
                items = tuple(r for r in reqs if duration is None or (r.arrival_s or 0.0) < duration)
                return RequestSource(lambda: iter(items), limit)
            return RequestSource(lambda: iter(reqs), limit)

        prompt, output, prefixes, open_loop = self.prompt, self.output, self.prefixes, self.closed_loop is None

        def drawn() -> Iterator[Request]:
            rng, t = random.Random(self.seed), 0.0
            while True:
                at = None
                if open_loop:
                    t += rng.expovariate(rate)  # type: ignore[arg-type]
                    if duration is not None and t >= duration:
                        return
                    at = t
                pid, ptoks, u, acc = -1, 0, rng.random(), 0.0
                for j, p in enumerate(prefixes):
                    acc += p.share
                    if u < acc:
                        pid, ptoks = j, p.tokens
                        break
                n = ptoks + prompt.sample(rng)  # type: ignore[union-attr]
                yield Request(max(1, n), max(1, output.sample(rng)), at, pid, ptoks)  # type: ignore[union-attr]

        return RequestSource(drawn, limit)

    def mean_lengths(self) -> tuple[float, float]:
        """(prompt tokens with the prefix, output tokens) of a request, on average."""
        if self.trace is not None:
            n = len(self.trace)
            return (sum(r.prompt_tokens for r in self.trace) / n, sum(r.output_tokens for r in self.trace) / n)
        prefix = sum(p.tokens * p.share for p in self.prefixes)
        return prefix + self.prompt.mean, self.output.mean  # type: ignore[union-attr]

    def spread_closed_loop(self, config: Any) -> ClosedLoop | None:
        """The closed loop, its users' first requests spread over one request's time when they do not
        think (else all would start at 0 and, with one request length, stay in step)."""
        closed = self.closed_loop
        if closed is None or closed.think_s > 0 or closed.spread_s is not None:
            return closed
        prompt, output = self.mean_lengths()
        pool = config.pool
        output = min(output, max(1.0, pool.max_model_len - prompt))
        batch = min(closed.users, pool.max_num_seqs)
        return ClosedLoop(closed.users, closed.think_s, config.timing.request_s(batch, prompt, output))

    def work(self, pool: Any, min_step_s: float) -> Work:
        """What simulating this workload on ``pool`` (a :class:`kvplan.sim.simulate.Pool`) will take, before it
        runs: the requests it sends (an upper estimate for a closed loop, whose users wait at least
        ``min_step_s`` per output token) x the steps each takes, for every policy."""
        limit = self.num_requests
        if self.trace is not None:
            reqs = self.trace
            if self.closed_loop is None and not self.rate and self.duration_s is not None:
                reqs = tuple(r for r in reqs if (r.arrival_s or 0.0) < self.duration_s)
            n = len(reqs)
            mean_prompt = sum(r.prompt_tokens for r in reqs) / n if n else 0.0
            mean_output = sum(r.output_tokens for r in reqs) / n if n else 0.0
            basis = f"{n:,} in the trace"
        else:
            mean_prefix = sum(p.tokens * p.share for p in self.prefixes)
            mean_prompt = mean_prefix + self.prompt.mean  # type: ignore[union-attr]
            mean_output = self.output.mean  # type: ignore[union-attr]
            n, basis = math.inf, ""
        if self.closed_loop is None and self.rate and self.duration_s is not None:
            if self.rate * self.duration_s < n:
                n, basis = self.rate * self.duration_s, f"rate {_num(self.rate)}/s x duration_s {_num(self.duration_s)}"
        if self.closed_loop is not None and self.duration_s is not None:
            cycle = self.closed_loop.think_s + max(1.0, min(mean_output, pool.max_model_len)) * min_step_s
            users = self.closed_loop.users
            bound = users * (1 + self.duration_s / cycle)
            if bound < n:
                n, basis = bound, f"{users:,} users over duration_s {_num(self.duration_s)}, each request >= {cycle:.3g} s"
        if limit is not None and limit < n:
            n, basis = limit, f"num_requests {limit:,}"
        return estimate_work(n, mean_prompt, mean_output, pool, len(self.policies), basis)


def _num(x: float) -> str:
    """A number as people write it: ``1,000,000``, ``3,600``, ``0.5``, ``1e+15``."""
    return f"{x:,.0f}" if x == int(x) and abs(x) < 1e12 else f"{x:,.4g}"


def _plan_values(ref: str, doc: YamlDoc) -> dict[str, Any]:
    """Option values of ``file.yaml#check-name`` (a capacity file, relative to the workload)."""
    from kvplan.checks.scenario import load_capacity

    file, _, name = ref.partition("#")
    path = (doc.path.resolve().parent / file) if not Path(file).is_absolute() else Path(file)
    capacity = load_capacity(path)
    if not name:
        if len(capacity.checks) != 1:
            raise doc.error(("plan",), f"{file} has {plural(len(capacity.checks), 'check')}: name one",
                            "write plan: FILE#CHECK-NAME; checks: " + ", ".join(c.name for c in capacity.checks))
        return dict(capacity.checks[0].values)
    for check in capacity.checks:
        if check.name == name:
            return dict(check.values)
    raise doc.error(("plan",), f"no check named {name!r} in {file}", "checks: " + ", ".join(c.name for c in capacity.checks))


def load_trace(path: Path, display: str) -> tuple[Request, ...]:
    """Requests from a JSONL trace; errors name ``file:line`` (the file read by :func:`kvplan.io.files.read_text`)."""
    from kvplan.io.files import read_text

    lines = read_text(path, "JSONL trace", display=display, error=ScenarioError).splitlines()
    ids: dict[Any, int] = {}
    out: list[Request] = []
    allowed = {"prompt_tokens", "output_tokens", "prefix_id", "prefix_tokens", "arrival_s"}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = Where(display, n, 1)
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScenarioFileError(Where(display, n, exc.colno), f"not valid JSON: {exc.msg}") from None
        except (ValueError, RecursionError):  # an integer past 4,300 digits; nesting past the parser's limit
            raise ScenarioFileError(where, "not a valid request (a huge integer or deep nesting)") from None
        if not isinstance(rec, dict):
            raise ScenarioFileError(where, "expected a JSON object per line")
        unknown = sorted(set(rec) - allowed)
        if unknown:
            raise ScenarioFileError(where, f"unknown key {unknown[0]!r}", "allowed: " + ", ".join(sorted(allowed)))

        def count(key: str, minimum: int, required: bool = True) -> int:
            v = rec.get(key)
            if v is None and not required:
                return 0
            if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= MAX_TOKENS:
                shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
                raise ScenarioFileError(where, f"{key}: got {shown}, expected an integer from {minimum} to {MAX_TOKENS:,}")
            return v

        prompt, output = count("prompt_tokens", 1), count("output_tokens", 1)
        ptoks = count("prefix_tokens", 0, required=False)
        pid = -1
        if rec.get("prefix_id") is not None:
            pid = ids.setdefault(json.dumps(rec["prefix_id"]), len(ids))
            if not ptoks:
                raise ScenarioFileError(where, "prefix_id without prefix_tokens")
        if ptoks > prompt:
            raise ScenarioFileError(where, f"prefix_tokens {ptoks} exceeds prompt_tokens {prompt}")
        at = rec.get("arrival_s")
        if at is not None:
            try:
                check_number(at, "arrival_s", low=0, high=MAX_SECONDS)
            except KvplanError as exc:
                raise ScenarioFileError(where, f"{exc.message}; expected seconds >= 0") from None
        out.append(Request(prompt, output, None if at is None else float(at), pid, ptoks))
    if not out:
        raise ScenarioFileError(Where(display, 1, 1), "the trace has no requests")
    timed = sum(r.arrival_s is not None for r in out)
    if 0 < timed < len(out):
        first = next(n for n, r in enumerate(out, 1) if r.arrival_s is None)
        raise ScenarioFileError(Where(display, first, 1), "arrival_s on some requests but not on this one",
                                "give arrival_s on every line or on none")
    if timed:
        out.sort(key=lambda r: r.arrival_s)  # type: ignore[arg-type, return-value]
    return tuple(out)


def load_workload(path: str | Path) -> Workload:
    """Read and validate a workload file; raises :class:`ScenarioFileError` (file:line:col) on any mistake."""
    doc = read_yaml(path)
    expect_kind(doc, WORKLOAD)
    model: Any = validate_doc(doc, WorkloadModel)
    values = _deployment(doc, model)
    trace, trace_path = _trace(doc, model)
    rate, closed = _arrivals(doc, model.arrivals, timed_trace=trace is not None and trace[0].arrival_s is not None)
    if model.duration_s is None and model.num_requests is None and trace is None:
        raise doc.error((), "say how much traffic: duration_s and/or num_requests")
    if closed is not None and model.duration_s is None and model.num_requests is None:
        raise doc.error(("arrivals",), "a closed loop needs duration_s or num_requests")
    total_share = sum(p.share for p in model.prefixes)
    if total_share > 1 + 1e-9:
        raise doc.error(("prefixes",), f"shares add up to {total_share:g}, more than 1")
    return Workload(
        path=doc.path,
        display=doc.display,
        name=model.name or doc.path.stem,
        description=model.description,
        values=finish_values(values),
        seed=model.seed,
        duration_s=model.duration_s,
        num_requests=model.num_requests,
        rate=rate,
        closed_loop=closed,
        prompt=_length(model.prompt_tokens, doc, ("prompt_tokens",)),
        output=_length(model.output_tokens, doc, ("output_tokens",)),
        prefixes=tuple(Prefix(p.name or f"prefix {i + 1}", p.tokens, p.share) for i, p in enumerate(model.prefixes)),
        trace=trace,
        trace_path=trace_path,
        policies=tuple(dict.fromkeys(model.policies)) if model.policies else POLICIES,
        prefill_s_per_token=model.timing.prefill_s_per_token,
        decode_step_s=model.timing.decode_step_s,
        prefill_efficiency=model.timing.prefill_efficiency,
        where=doc.where(()),
        timing_file=_timing_file(doc, model.timing),
        locations=option_locations(doc, [()], WORKLOAD_OPTIONS),
    )


def _deployment(doc: YamlDoc, model: Any) -> dict[str, Any]:
    """The estimate options: a ``plan:`` check's, overridden by the file's own; context and max_model_len
    default to each other."""
    values: dict[str, Any] = {}
    if model.plan:
        values.update(_plan_values(model.plan, doc))
    values.update(option_values({k: getattr(model, k) for k in model.model_fields_set if k in WORKLOAD_OPTIONS}))
    if not values.get("model"):
        raise doc.error((), "no model", "set model (e.g. model: meta-llama/Llama-3.1-8B) or plan: capacity.yaml#check")
    if "context" in values and "max_model_len" not in values:
        values["max_model_len"] = values["context"]
    if "max_model_len" in values and "context" not in values:
        values["context"] = values["max_model_len"]
    return values


def _timing_file(doc: YamlDoc, timing: Any) -> Path | None:
    """``timing.file`` (relative to the workload), which excludes a fixed ``decode_step_s``."""
    if timing.file is None:
        return None
    if timing.decode_step_s is not None:
        raise doc.error(("timing", "decode_step_s"), "decode_step_s and a timing file are exclusive",
                        "the file's step time grows with the batch; drop decode_step_s")
    path = Path(timing.file)
    return path if path.is_absolute() else doc.path.resolve().parent / path


def _trace(doc: YamlDoc, model: Any) -> tuple[tuple[Request, ...] | None, str | None]:
    """The ``trace:`` requests and the trace's display path (``None, None`` without one: then the prompt
    and output lengths are required)."""
    if not model.trace:
        for key in ("prompt_tokens", "output_tokens"):
            if getattr(model, key) is None:
                raise doc.error((), f"{key} is required (or a trace)", "e.g. prompt_tokens: {dist: uniform, min: 50, max: 200}")
        return None, None
    for key in ("prompt_tokens", "output_tokens", "prefixes"):
        if key in model.model_fields_set:
            raise doc.error((key,), f"{key} and trace are exclusive", "lengths come from the trace")
    path = Path(model.trace) if Path(model.trace).is_absolute() else doc.path.resolve().parent / model.trace
    shown = display_path(path)
    return load_trace(path, shown), shown


def _arrivals(doc: YamlDoc, arrivals: Any, timed_trace: bool) -> tuple[float | None, ClosedLoop | None]:
    """``(rate, closed loop)`` from ``arrivals:`` (required unless the trace has arrival times)."""
    if arrivals is None:
        if not timed_trace:
            raise doc.error((), "arrivals is required", "e.g. arrivals: {rate: 10} or arrivals: {users: 32, think_s: 2}")
        return None, None
    if (arrivals.rate is None) == (arrivals.users is None):
        raise doc.error(("arrivals",), "give exactly one of rate (Poisson) or users (closed loop)")
    if timed_trace:
        raise doc.error(("arrivals",), "the trace has arrival_s: arrivals would replace them", "remove arrivals or the trace's arrival_s")
    if arrivals.users is not None:
        return arrivals.rate, ClosedLoop(arrivals.users, arrivals.think_s)
    if "think_s" in arrivals.model_fields_set:
        raise doc.error(("arrivals", "think_s"), "think_s applies to a closed loop (users)")
    return arrivals.rate, None
