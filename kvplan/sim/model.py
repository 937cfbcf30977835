"""Inputs and outputs of the simulator: requests, the pool and its limits, step timing, per-policy results.

Every number is checked when the object is made: finite, and in range (a NaN passes ``x <= 0`` checks,
so each check is written as what must hold).
"""

from __future__ import annotations

from dataclasses import field

from kvplan.errors import InputError
from kvplan.paged.allocator import GroupSpec
from kvplan.sim.timing import StepFit
from kvplan.units import check_number, plural
from kvplan.frozen import frozen

POLICIES = ("contiguous", "paged", "prefix_caching")
POLICY_LABELS = {"contiguous": "contiguous", "paged": "paged", "prefix_caching": "paged + prefix cache"}
DEFAULT_PREFILL_EFFICIENCY = 0.5  # fraction of the GPU's dense fp16 peak a prefill reaches


def _finite(name: str, value: float | None, *, low: float = 0.0, low_open: bool = False) -> None:
    """Raise InputError unless ``value`` (when given) is a finite number ``>= low`` (``> low`` when ``low_open``)."""
    if value is not None:
        check_number(value, name, low=low, low_open=low_open)


@frozen
class Request:
    """One request: ``prompt_tokens`` (prefix included), ``output_tokens``; ``prefix_id`` >= 0 names
    a shared prefix whose first ``prefix_tokens`` prompt tokens are the same token ids in every request
    of that id. ``arrival_s``: None when a closed loop decides it."""

    prompt_tokens: int
    output_tokens: int
    arrival_s: float | None = None
    prefix_id: int = -1
    prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise InputError(f"a request needs at least one prompt and one output token, got "
                             f"{self.prompt_tokens} and {self.output_tokens}")
        if not 0 <= self.prefix_tokens <= self.prompt_tokens:
            raise InputError(f"prefix_tokens {self.prefix_tokens} must be within the prompt's {plural(self.prompt_tokens, 'token')}")
        _finite("arrival_s", self.arrival_s)


@frozen
class Pool:
    """The block pool and the scheduler limits (tokens, blocks)."""

    num_blocks: int  # block ids, null block included
    block_size: int
    groups: tuple[GroupSpec, ...]
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    prefix_state_blocks: tuple[int, ...] = ()  # state groups' blocks with prefix caching on (default: same)

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            if not getattr(self, name) >= 1:
                raise InputError(f"invalid {name} {getattr(self, name)}: must be positive")


@frozen
class Timing:
    """How long a step takes (one GPU of the deployment; all GPUs work in parallel).

    ``weights_bytes`` and every ``*_bytes`` are per GPU; ``full_token_bytes``: KV bytes per token of the
    layers that keep every token; ``window_token_bytes``: ``(window_tokens, bytes per token)`` per window
    size; ``state_bytes``: fixed state read per request per step. Seconds: ``prefill_s_per_token`` per
    prompt token computed, ``decode_step_s`` a fixed decode step (replaces the bandwidth roofline).
    ``fit``: a step time measured on a running server (:mod:`kvplan.sim.timing`), replacing the
    bandwidth roofline: per step, per decoding sequence and per KV token it reads (its whole context).
    """

    weights_bytes: int
    bandwidth_bytes_per_s: float
    full_token_bytes: int
    window_token_bytes: tuple[tuple[int, int], ...] = ()
    state_bytes: int = 0
    prefill_s_per_token: float = 0.0
    decode_step_s: float | None = None
    fit: StepFit | None = None

    def __post_init__(self) -> None:
        _finite("bandwidth_bytes_per_s", self.bandwidth_bytes_per_s)
        _finite("prefill_s_per_token", self.prefill_s_per_token)
        _finite("decode_step_s", self.decode_step_s, low_open=True)
        if self.fit is not None and self.decode_step_s is not None:
            raise InputError("a fixed decode_step_s and a fitted step time are exclusive",
                             "drop decode_step_s (the fit grows with the batch) or the timing file")
        if self.fit is not None or self.decode_step_s is not None:
            return
        if not self.bandwidth_bytes_per_s > 0:
            raise InputError("the GPU has no HBM bandwidth", "set decode_step_s in the workload's timing")
        if not self.weights_bytes > 0 and not self.full_token_bytes > 0:
            raise InputError("a decode step would take no time (no weights and no KV bytes read)",
                             "set decode_step_s in the workload's timing")

    def decode_step_s_at(self, sequences: int, context_tokens: float) -> float:
        """One decode step's seconds with ``sequences`` decoding at ``context_tokens`` tokens each."""
        if self.decode_step_s is not None:
            return self.decode_step_s
        tokens = sequences * context_tokens
        if self.fit is not None:
            return self.fit.step_s(sequences, tokens, held_tokens=tokens)  # held: no sharing (an upper bound)
        read = self.weights_bytes + self.full_token_bytes * tokens + sequences * self.state_bytes + sum(
            per_token * sequences * min(context_tokens, window) for window, per_token in self.window_token_bytes)
        return read / self.bandwidth_bytes_per_s

    def request_s(self, sequences: int, prompt_tokens: float, output_tokens: float) -> float:
        """About how long one request takes among ``sequences`` running: its prefill, then its output
        tokens at the step time of that batch at its mean context."""
        return prompt_tokens * self.prefill_s_per_token + output_tokens * self.decode_step_s_at(
            sequences, prompt_tokens + output_tokens / 2)

    @property
    def min_step_s(self) -> float:
        """A lower bound on one step's seconds (the weights read, the fixed decode step, or the fitted step
        of one sequence at one token)."""
        if self.decode_step_s is not None:
            return self.decode_step_s
        if self.fit is not None:
            return self.fit.step_s(1, 1)
        return max(self.weights_bytes, self.full_token_bytes) / self.bandwidth_bytes_per_s


@frozen
class SimConfig:
    pool: Pool
    timing: Timing


@frozen
class ClosedLoop:
    """``users`` users, each sending its next request a think time (exponential, mean ``think_s``) after
    the previous one finishes; the first requests start spread uniformly over ``[0, spread_s]``
    (default ``think_s``). With no think time and no spread every user would start at 0 and, with
    requests of one length, stay in step (all prefilling, then all decoding); a workload spreads them
    over one request's time (:meth:`Timing.request_s`), as real users drift apart."""

    users: int
    think_s: float = 0.0
    spread_s: float | None = None

    def __post_init__(self) -> None:
        if not self.users >= 1:
            raise InputError(f"invalid users {self.users}: must be positive")
        _finite("think_s", self.think_s)
        _finite("spread_s", self.spread_s)

    @property
    def start_spread_s(self) -> float:
        return self.think_s if self.spread_s is None else self.spread_s


def window_sum(first: int, k: int, window: int) -> int:
    """``sum(min(first + j, window) for j in range(k))`` in O(1) (tokens a windowed layer reads)."""
    if k <= 0:
        return 0
    if first >= window:
        return k * window
    if first + k - 1 <= window:
        return k * first + k * (k - 1) // 2
    m = window - first + 1  # terms first..window
    return m * first + m * (m - 1) // 2 + (k - m) * window


# ---------------------------------------------------------------------------------------------
# outputs


@frozen
class Series:
    """Samples at the end of steps or spans: time (s), used fraction of the pool, running requests."""

    time_s: tuple[float, ...]
    usage: tuple[float, ...]
    running: tuple[int, ...]

    def downsample(self, points: int = 400) -> "Series":
        """At most ``points`` samples: the last sample of each of ``points`` equal time bins."""
        n = len(self.time_s)
        if n <= points or not n:
            return self
        end = self.time_s[-1] or 1.0
        keep: dict[int, int] = {}
        for i, t in enumerate(self.time_s):
            keep[min(points - 1, int(t / end * points))] = i
        idx = sorted(keep.values())
        return Series(tuple(self.time_s[i] for i in idx), tuple(self.usage[i] for i in idx),
                      tuple(self.running[i] for i in idx))


@frozen
class PolicyResult:
    """What one policy achieved. Times in seconds; ``*_rate`` and fractions in [0, 1]."""

    policy: str
    duration_s: float
    arrived: int
    finished: int
    queued: int  # waiting at the end (preempted ones included)
    running: int  # admitted and unfinished at the end
    rejected: int  # prompt of max_model_len tokens or more
    requests_per_s: float
    output_tokens: int  # tokens sampled (finished and unfinished requests)
    output_tokens_per_s: float
    concurrency_mean: float  # time-weighted running requests
    concurrency_p50: int
    concurrency_p99: int
    concurrency_max: int
    usage_mean: float  # used blocks / usable blocks, time-weighted
    usage_peak: float
    fragmentation_mean: float  # unused token slots / slots of used blocks, time-weighted
    prefix_hit_rate: float  # prefill_tokens_saved / prefix_query_tokens (0 without lookups)
    prefix_query_tokens: int  # prompt tokens looked up in the prefix cache (readmissions included)
    prefill_tokens: int  # prompt tokens computed (recomputes included)
    prefill_tokens_saved: int  # prompt tokens served from the prefix cache
    preemptions: int
    first_tokens: int  # requests that got their first output token: the latency figures are over these
    queue_delay_p50_s: float | None  # arrival -> first scheduled
    queue_delay_p99_s: float | None
    ttft_p50_s: float | None  # arrival -> first output token (never below the queue delay it includes)
    ttft_p99_s: float | None
    num_steps: int  # engine steps simulated
    num_events: int  # loop iterations (steps taken one at a time or k at once)
    blocks_per_reservation: int  # contiguous: blocks one request reserves; else 0
    series: Series = field(repr=False, default=Series((), (), ()))

    @property
    def label(self) -> str:
        return POLICY_LABELS.get(self.policy, self.policy)

    def to_dict(self, series_points: int = 200) -> dict:
        out = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "series"}
        s = self.series.downsample(series_points)
        out["label"] = self.label
        out["series"] = {"time_s": [round(x, 4) for x in s.time_s], "usage": [round(x, 5) for x in s.usage],
                         "running": list(s.running)}
        return out


@frozen
class SimResult:
    """All policies of one run, with the inputs that decided them."""

    config: SimConfig
    results: tuple[PolicyResult, ...]
    seed: int
    duration_s: float | None
    num_requests: int | None
    notes: tuple[str, ...] = ()
    closed_loop: ClosedLoop | None = None  # as run (its users' start spread decided)

    def result(self, policy: str) -> PolicyResult:
        return next(r for r in self.results if r.policy == policy)
