"""A step-time model measured on a running server, and the timing file that carries it.

The engine's step takes, in seconds::

    step_s = step_base_s                                   (each step: the weights, the scheduler)
           + step_s_per_seq x decoding sequences            (per row of the batch)
           + step_s_per_kv_token x KV tokens they read       (attention over each one's context)
           + prefill_s_per_token x prompt tokens computed
           + step_s_per_held_token x KV tokens the pool holds (the KV in use, a shared prefix once: memory traffic
                                                             that caches do not absorb; a CPU reads a prefix that
                                                             48 requests share far faster than 48 prompts' own)

On a GPU the roofline gives these terms from bytes and bandwidth (:func:`kvplan.sim.simulate.config_from_plan`);
for a CPU target, or any target measured, ``kvplan observe URL --fit-timing FILE`` fits them from the
engine's own counters (steps, generated and prompt tokens, prefix hits, the requests' lengths) over the
polls when requests were running: one **run** per observe, its totals, and the least-squares fit over
every run in the file. A run at one load fixes a mix of terms, not each term: observe the server at a few
loads (few and many users; prefix caching on and off, so prefill work varies; two prompt lengths to
separate the per-token from the per-sequence cost) and each observe adds its run to the file and refits.

The file (YAML, unknown keys are errors, written atomically)::

    kvplan_timing: 1
    model: tiny-llama                 # the endpoint's model_name (what was measured)
    fit:
      step_base_s: 0.0038
      step_s_per_seq: 0.00011
      step_s_per_kv_token: 1.2e-07
      prefill_s_per_token: 2.9e-05
      step_s_per_held_token: 1.3e-07
      fitted: [step_base_s, step_s_per_seq, step_s_per_kv_token, prefill_s_per_token, step_s_per_held_token]
      rms_relative_error: 0.021
    runs:                             # the data the fit came from (optional in a hand-written file)
      - {source: ..., busy_s: 58.1, steps: 5917, decode_tokens: 143129, prefill_tokens: 37088,
         mean_context_tokens: 1120.0, held_tokens: 10880.0, running_mean: 47.9, preemptions: 0}

``kvplan simulate`` reads the ``fit`` (``timing: {file: FILE}`` in the workload, or ``--timing FILE``).
Library code: never prints, never exits; errors name the file, line and column.
"""

from __future__ import annotations

import math
from dataclasses import field, replace
from itertools import combinations
from pathlib import Path
from typing import Any, Sequence

from kvplan.errors import InputError
from kvplan.units import check_number, plural
from kvplan.frozen import frozen

FORMAT_VERSION = 1
TERMS = ("step_base_s", "step_s_per_seq", "step_s_per_kv_token", "prefill_s_per_token", "step_s_per_held_token")
MIN_CONTEXT_SPREAD = 1.25  # the per-token terms are fitted only when the runs' mean contexts (KV held) differ this much
TIE_RMS = 0.002  # term sets whose rms relative error is within this of the best fit the runs as well
_PIVOT = 1e-6  # a term set whose (scaled) normal matrix has a smaller pivot is not determined by the runs
HEADER = ("# kvplan timing: the engine's step time measured on a running server (kvplan observe --fit-timing);\n"
          "# kvplan simulate reads its fit (timing: {file: THIS} in a workload, or --timing THIS)\n")


@frozen
class StepFit:
    """Seconds per step, per decoding sequence, per KV token read, per prompt token computed (see the
    module). ``fitted``: the terms the runs determined (the others are 0); ``rms_relative_error``: of the
    fit over the runs' busy seconds (None: hand-written)."""

    step_base_s: float
    step_s_per_seq: float = 0.0
    step_s_per_kv_token: float = 0.0
    prefill_s_per_token: float = 0.0
    step_s_per_held_token: float = 0.0
    fitted: tuple[str, ...] = TERMS
    rms_relative_error: float | None = None

    def __post_init__(self) -> None:
        for name in TERMS:
            check_number(getattr(self, name), name, low=0)
        if not (self.step_base_s > 0 or self.step_s_per_seq > 0 or self.step_s_per_kv_token > 0
                or self.step_s_per_held_token > 0):
            raise InputError("a fitted step takes no time (step_base_s, step_s_per_seq, step_s_per_kv_token and "
                             "step_s_per_held_token are 0)")

    def step_s(self, sequences: int, kv_tokens: float, prefill_tokens: int = 0, held_tokens: float = 0.0) -> float:
        """One step's seconds with ``sequences`` decoding, reading ``kv_tokens`` KV tokens in all, computing
        ``prefill_tokens`` prompt tokens, with ``held_tokens`` KV tokens in the pool's used blocks."""
        return (self.step_base_s + self.step_s_per_seq * sequences + self.step_s_per_kv_token * kv_tokens
                + self.prefill_s_per_token * prefill_tokens + self.step_s_per_held_token * held_tokens)

    def describe(self) -> str:
        """One line: the terms in milliseconds / microseconds."""
        return (f"step {self.step_base_s * 1e3:.2f} ms + {self.step_s_per_seq * 1e6:.1f} us per sequence + "
                f"{self.step_s_per_kv_token * 1e9:.1f} ns per KV token read + {self.prefill_s_per_token * 1e6:.1f} us "
                f"per prompt token computed + {self.step_s_per_held_token * 1e9:.1f} ns per KV token held")


@frozen
class TimingRun:
    """One observed run's totals over the polls when requests were running: ``busy_s`` seconds,
    ``steps`` engine steps, ``decode_tokens`` tokens sampled by decode steps (not a prefill's first
    token), ``prefill_tokens`` prompt tokens computed (prefix-cache hits left out), and the mean context
    a decoding sequence read (``mean_context_tokens``: prompt + half the output of the requests that
    finished), and the KV tokens the pool held on average per step (``held_tokens``: used blocks x block
    size; 0 when unknown). ``running_mean``, ``preemptions`` and ``source`` describe it."""

    busy_s: float
    steps: int
    decode_tokens: int
    prefill_tokens: int
    mean_context_tokens: float
    running_mean: float = 0.0
    preemptions: int = 0
    source: str = ""
    held_tokens: float = 0.0

    def __post_init__(self) -> None:
        check_number(self.busy_s, "busy_s", low=0, low_open=True)
        for name in ("steps", "decode_tokens", "prefill_tokens", "preemptions"):
            check_number(getattr(self, name), name, low=0)
        check_number(self.mean_context_tokens, "mean_context_tokens", low=0)
        check_number(self.held_tokens, "held_tokens", low=0)
        if not self.steps >= 1:
            raise InputError("a timing run needs at least one engine step")

    def regressors(self) -> tuple[float, float, float, float, float]:
        """The run's totals in :data:`TERMS` order: busy_s = the fit's terms . these."""
        return (float(self.steps), float(self.decode_tokens), self.decode_tokens * self.mean_context_tokens,
                float(self.prefill_tokens), self.steps * self.held_tokens)


@frozen
class TimingFile:
    """A timing file's content: what was measured (``model``), the fit, the runs it came from."""

    fit: StepFit
    model: str | None = None
    runs: tuple[TimingRun, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


# ---------------------------------------------------------------------------------------------
# the fit


def _solve(rows: list[list[float]], target: list[float]) -> list[float] | None:
    """Least squares ``rows . x = target`` by the normal equations (columns scaled to unit norm, Gaussian
    elimination with partial pivoting); None when a column is not determined (a pivot below :data:`_PIVOT`)."""
    k = len(rows[0])
    norms = [math.sqrt(sum(r[j] ** 2 for r in rows)) for j in range(k)]
    if not all(n > 0 for n in norms):
        return None
    scaled = [[r[j] / norms[j] for j in range(k)] for r in rows]
    a = [[sum(r[i] * r[j] for r in scaled) for j in range(k)] + [sum(r[i] * t for r, t in zip(scaled, target))]
         for i in range(k)]
    for col in range(k):
        piv = max(range(col, k), key=lambda i: abs(a[i][col]))
        if abs(a[piv][col]) < _PIVOT:
            return None
        a[col], a[piv] = a[piv], a[col]
        for i in range(k):
            if i != col:
                f = a[i][col] / a[col][col]
                a[i] = [x - f * y for x, y in zip(a[i], a[col])]
    return [a[i][k] / a[i][i] / norms[i] for i in range(k)]


def _candidates(rows: list[list[float]], allowed: list[int], num_runs: int
                ) -> list[tuple[float, tuple[int, ...], list[float]]]:
    """``(rms relative error, term indices, values)`` of every non-negative least-squares fit of the largest term
    sets of ``allowed`` (at most ``num_runs`` terms, at least one that takes a step's time) the runs determine."""
    target = [1.0] * num_runs
    needs_step = {TERMS.index(t) for t in ("step_base_s", "step_s_per_seq", "step_s_per_kv_token", "step_s_per_held_token")}
    found: list[tuple[float, tuple[int, ...], list[float]]] = []
    for size in range(min(len(allowed), num_runs), 0, -1):
        for subset in combinations(allowed, size):  # in TERMS order: the preferred term sets first
            if not needs_step & set(subset):
                continue  # a step must take time of its own
            x = _solve([[row[j] for j in subset] for row in rows], target)
            if x is None or any(v < 0 for v in x):
                continue
            err = sum((sum(row[j] * v for j, v in zip(subset, x)) - 1.0) ** 2 for row in rows)
            found.append((math.sqrt(err / num_runs), subset, x))
        if found:
            break
    return found


def fit_runs(runs: Sequence[TimingRun]) -> tuple[StepFit, tuple[str, ...]]:
    """The step model that best explains every run's busy seconds (least squares of the relative error,
    so each run counts the same), and notes on what the runs could not determine.

    Each term is kept non-negative (a term set whose solution has a negative term is not used), the
    per-KV-token term needs runs whose mean contexts differ by :data:`MIN_CONTEXT_SPREAD`, and at most as
    many terms as runs are fitted: among the term sets the runs determine, those with the most terms are
    tried; of those that fit within :data:`TIE_RMS` of the best, the first in :data:`TERMS` order wins,
    and a note names the terms the runs could not tell apart.
    """
    if not runs:
        raise InputError("no timing runs to fit")
    contexts = [r.mean_context_tokens for r in runs]
    spread = max(contexts) / min(contexts) if min(contexts) > 0 else math.inf
    held = [r.held_tokens for r in runs]
    held_spread = max(held) / min(held) if min(held) > 0 else (math.inf if max(held) > 0 else 0.0)
    allowed = [i for i, name in enumerate(TERMS)
               if (name != "step_s_per_kv_token" or spread >= MIN_CONTEXT_SPREAD)
               and (name != "step_s_per_held_token" or held_spread >= MIN_CONTEXT_SPREAD)]
    rows = [[x / r.busy_s for x in r.regressors()] for r in runs]
    found = _candidates(rows, allowed, len(runs))
    if not found:
        raise InputError("the timing runs do not determine a step time (every fit needs a negative term)",
                         "observe the server at a few different loads and fit again")
    least = min(rms for rms, _, _ in found)
    close = [f for f in found if f[0] <= least + TIE_RMS]  # as good as the best within the runs' noise
    rms, subset, x = close[0]
    values = dict.fromkeys(TERMS, 0.0)
    for j, v in zip(subset, x):
        values[TERMS[j]] = v
    fitted = tuple(TERMS[j] for j in subset)
    notes = []
    missing = [name for name in TERMS if name not in fitted]
    if "step_s_per_kv_token" in missing and spread < MIN_CONTEXT_SPREAD:
        notes.append(f"step_s_per_kv_token not fitted: the runs' mean contexts ({min(contexts):,.0f} to "
                     f"{plural(round(max(contexts)), 'token')}) are too close to tell the per-token cost from the per-sequence cost (observe a run with "
                     "another prompt length); the per-sequence cost holds for contexts near these")
        missing.remove("step_s_per_kv_token")
    if "step_s_per_held_token" in missing and held_spread < MIN_CONTEXT_SPREAD:
        notes.append("step_s_per_held_token not fitted: the runs held about the same KV (or did not say): observe "
                     "loads that fill the pool to different levels (prefix caching on and off)")
        missing.remove("step_s_per_held_token")
    if missing:
        notes.append(f"not determined by {len(runs)} run(s): {', '.join(missing)} (0; observe more loads: few and many "
                     "users, prefix caching on and off)")
    others = sorted({TERMS[j] for _, other, _ in close[1:] for j in other} - set(fitted))
    if others:
        notes.append(f"the runs fit about as well with {', '.join(others)} in place of some of {', '.join(fitted)}: they "
                     "do not tell these costs apart (observe runs that differ in them: prefix caching on and off for "
                     "the prefill cost, few and many users for the per-sequence cost)")
    return StepFit(**values, fitted=fitted, rms_relative_error=rms), tuple(notes)


# ---------------------------------------------------------------------------------------------
# the file


def _models():  # noqa: ANN202 - the pydantic models (pydantic is imported only when a file is read)
    from pydantic import BaseModel, ConfigDict, Field

    from kvplan.checks.fields import number

    forbid = ConfigDict(extra="forbid")
    seconds = number("seconds", low=0, high=1e6)
    count = number("a count", low=0, high=10**15, integer=True)
    tokens = number("tokens", low=0, high=1e9)

    class FitModel(BaseModel):
        model_config = forbid
        step_base_s: seconds = Field(description="seconds per engine step")  # type: ignore[valid-type]
        step_s_per_seq: seconds = Field(0.0, description="seconds per decoding sequence in a step")  # type: ignore[valid-type]
        step_s_per_kv_token: seconds = Field(0.0, description="seconds per KV token a decoding sequence reads")  # type: ignore[valid-type]
        prefill_s_per_token: seconds = Field(0.0, description="seconds per prompt token computed")  # type: ignore[valid-type]
        step_s_per_held_token: seconds = Field(0.0, description="seconds per KV token the pool holds, per step")  # type: ignore[valid-type]
        fitted: list[str] | None = Field(None, description="the terms the runs determined")
        rms_relative_error: number("a fraction", low=0, high=1e6) | None = Field(None, description="of the fit over the runs")  # type: ignore[valid-type]

    class RunModel(BaseModel):
        model_config = forbid
        source: str = Field("", description="where it was measured")
        busy_s: number("seconds", low=0, low_open=True, high=1e9) = Field(description="seconds with requests running")  # type: ignore[valid-type]
        steps: count = Field(description="engine steps")  # type: ignore[valid-type]
        decode_tokens: count = Field(description="tokens sampled by decode steps")  # type: ignore[valid-type]
        prefill_tokens: count = Field(description="prompt tokens computed")  # type: ignore[valid-type]
        mean_context_tokens: tokens = Field(description="mean context a decoding sequence read")  # type: ignore[valid-type]
        running_mean: tokens = Field(0.0, description="requests running, mean over the polls")  # type: ignore[valid-type]
        held_tokens: number("tokens", low=0, high=1e12) = Field(0.0, description="KV tokens the pool held, mean per step")  # type: ignore[valid-type]
        preemptions: count = Field(0, description="preemptions in the run")  # type: ignore[valid-type]

    class FileModel(BaseModel):
        model_config = forbid
        kvplan_timing: int = Field(description=f"format version ({FORMAT_VERSION})")
        model: str | None = Field(None, description="the endpoint's model_name")
        fit: FitModel = Field(description="the step-time terms simulate uses")
        runs: list[RunModel] = Field(default_factory=list, description="the observed runs the fit came from")

    return FileModel


def read_timing(path: str | Path) -> TimingFile:
    """Read and validate a timing file; raises :class:`kvplan.io.yamldoc.ScenarioFileError` (file:line:col)."""
    from kvplan.io.kinds import TIMING
    from kvplan.io.yamldoc import expect_kind, read_yaml, validate_doc

    doc = read_yaml(path)
    expect_kind(doc, TIMING)
    model: Any = validate_doc(doc, _models())
    if model.kvplan_timing != FORMAT_VERSION:
        raise doc.error(("kvplan_timing",), f"format version {model.kvplan_timing} is not {FORMAT_VERSION}",
                        "write it again with this kvplan's observe --fit-timing")
    f = model.fit
    unknown = [t for t in f.fitted or () if t not in TERMS]
    if unknown:
        raise doc.error(("fit", "fitted"), f"unknown term {unknown[0]!r}", "terms: " + ", ".join(TERMS))
    try:
        fit = StepFit(f.step_base_s, f.step_s_per_seq, f.step_s_per_kv_token, f.prefill_s_per_token,
                      f.step_s_per_held_token, tuple(f.fitted) if f.fitted is not None else TERMS, f.rms_relative_error)
        runs = tuple(TimingRun(r.busy_s, r.steps, r.decode_tokens, r.prefill_tokens, r.mean_context_tokens,
                               r.running_mean, r.preemptions, r.source, r.held_tokens) for r in model.runs)
    except InputError as exc:
        raise doc.error(("fit",), exc.message, exc.hint) from None
    return TimingFile(fit, model.model, runs)


def _number(x: float) -> str:
    """A number YAML reads back as one (PyYAML takes ``7e-05`` for a string: the mantissa needs a point)."""
    if not isinstance(x, float):
        return str(x)
    text = repr(round(x, 12))
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text


def timing_text(timing: TimingFile) -> str:
    """The YAML text of a timing file (stable key order, one run per line)."""
    fit = timing.fit
    lines = [HEADER.rstrip("\n"), f"kvplan_timing: {FORMAT_VERSION}"]
    if timing.model is not None:
        lines.append(f"model: {_quote(timing.model)}")
    lines.append("fit:")
    for name in TERMS:
        lines.append(f"  {name}: {_number(getattr(fit, name))}")
    lines.append(f"  fitted: [{', '.join(fit.fitted)}]")
    if fit.rms_relative_error is not None:
        lines.append(f"  rms_relative_error: {_number(round(fit.rms_relative_error, 6))}")
    if timing.runs:
        lines.append("runs:")
        for r in timing.runs:
            lines.append(f"  - {{source: {_quote(r.source)}, busy_s: {_number(round(r.busy_s, 3))}, steps: {r.steps}, "
                         f"decode_tokens: {r.decode_tokens}, prefill_tokens: {r.prefill_tokens}, "
                         f"mean_context_tokens: {_number(round(r.mean_context_tokens, 1))}, "
                         f"held_tokens: {_number(round(r.held_tokens, 1))}, "
                         f"running_mean: {_number(round(r.running_mean, 2))}, "
                         f"preemptions: {r.preemptions}}}")
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    import json

    return json.dumps(text)  # a JSON string is a YAML string


def add_run(path: str | Path, run: TimingRun, model: str | None) -> TimingFile:
    """Add ``run`` to the timing file at ``path`` (a new file when there is none), refit over every run
    and write it atomically; the file's model must be ``model`` (runs of two models never mix)."""
    from kvplan.io.atomic import write_atomic

    path = Path(path)
    runs: tuple[TimingRun, ...] = ()
    if path.exists():
        old = read_timing(path)
        if model is not None and old.model is not None and old.model != model:
            raise InputError(f"{path} holds timing runs of model {old.model!r}, not {model!r}",
                             "write this model's runs to another file")
        runs = old.runs
    runs = (*runs, run)
    fit, notes = fit_runs(runs)
    timing = TimingFile(fit, model, runs, notes)
    write_atomic(path, timing_text(timing))
    return replace(timing, notes=notes)
