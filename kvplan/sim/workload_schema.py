"""The workload file's schema (pydantic): the deployment's option keys, the traffic's fields and their bounds; kvplan
schema prints it and kvplan.sim.workload validates against it.
"""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model

from kvplan.checks.fields import OPTION_FIELDS, number
from kvplan.sim.simulate import POLICIES

# estimate options that make no sense for a simulation (the policies decide prefix caching; the
# workload decides the batch and the prefix)
_NOT_HERE = ("batch", "prefix_tokens", "prefix_caching")
WORKLOAD_OPTIONS = {k: v for k, v in OPTION_FIELDS.items() if k not in _NOT_HERE}
_FORBID = ConfigDict(extra="forbid")
MAX_TOKENS = 1_000_000_000  # a token count in a workload or trace (far past any model's context)
MAX_COUNT = 10**12  # requests, users
MAX_SECONDS = 1e15  # durations and rates: finite and bounded (the work bound decides what runs)
Tokens = number("a token count", low=1, high=MAX_TOKENS, integer=True)
TokensOrZero = number("a token count", low=0, high=MAX_TOKENS, integer=True)
PositiveFloatTokens = number("tokens", low=0, low_open=True, high=MAX_TOKENS)
FloatTokens = number("tokens", low=0, high=MAX_TOKENS)
Seconds = number("seconds", low=0, low_open=True, high=MAX_SECONDS)
SecondsOrZero = number("seconds", low=0, high=MAX_SECONDS)
Rate = number("requests per second", low=0, low_open=True, high=MAX_SECONDS)
Count = number("a count", low=1, high=MAX_COUNT, integer=True)
Share = number("a share in (0, 1]", low=0, low_open=True, high=1)


class Fixed(BaseModel):
    model_config = _FORBID
    dist: Literal["fixed"]
    value: Tokens = Field(description="tokens")


class Uniform(BaseModel):
    model_config = _FORBID
    dist: Literal["uniform"]
    min: TokensOrZero = Field(description="tokens (inclusive)")
    max: TokensOrZero = Field(description="tokens (inclusive)")


class Normal(BaseModel):
    model_config = _FORBID
    dist: Literal["normal", "lognormal"]
    mean: PositiveFloatTokens = Field(description="tokens")
    std: FloatTokens = Field(description="tokens")
    min: TokensOrZero = Field(0, description="clamp below (tokens)")
    max: Tokens | None = Field(None, description="clamp above (tokens)")


LengthModel = Union[TokensOrZero, Fixed, Uniform, Normal]


class ArrivalsModel(BaseModel):
    """Poisson arrivals at ``rate`` requests/s, or a closed loop of ``users`` with ``think_s`` mean think time."""

    model_config = _FORBID
    rate: Rate | None = Field(None, description="requests per second (Poisson)")
    users: Count | None = Field(None, description="closed loop: concurrent users")
    think_s: SecondsOrZero = Field(0.0, description="closed loop: mean think time between a reply and the next request (s)")


class PrefixModel(BaseModel):
    """A prompt prefix shared by a share of the traffic (e.g. a system prompt)."""

    model_config = _FORBID
    name: str | None = Field(None, description="label")
    tokens: Tokens = Field(description="prefix length (tokens)")
    share: Share = Field(description="fraction of requests that carry it")


class TimingModel(BaseModel):
    """Overrides of the step-time model."""

    model_config = _FORBID
    file: str | None = Field(None, description="a step time fitted on a running server (kvplan observe --fit-timing), "
                                               "relative to this file")
    prefill_s_per_token: SecondsOrZero | None = Field(None, description="seconds per prompt token computed")
    decode_step_s: Seconds | None = Field(None, description="fixed seconds per decode step (replaces the roofline)")
    prefill_efficiency: Share = Field(0.5, description="fraction of the fp16 peak a prefill reaches")


WorkloadModel = create_model(
    "Workload", __config__=_FORBID, __doc__="A workload file: `kvplan simulate workload.yaml`.",
    name=(str | None, Field(None, description="label")),
    description=(str | None, Field(None, description="free text")),
    plan=(str | None, Field(None, description="take the deployment from a capacity check: file.yaml#check-name")),
    seed=(int, Field(0, description="random seed (same seed, same result)")),
    duration_s=(Seconds | None, Field(None, description="simulated seconds of traffic")),
    num_requests=(Count | None, Field(None, description="requests to send (drained to the end without duration_s)")),
    arrivals=(ArrivalsModel | None, Field(None, description="how requests arrive")),
    prompt_tokens=(LengthModel | None, Field(None, description="prompt tokens after the prefix")),
    output_tokens=(LengthModel | None, Field(None, description="output tokens")),
    prefixes=(list[PrefixModel], Field(default_factory=list, description="shared prefixes")),
    trace=(str | None, Field(None, description="JSONL trace of requests (relative to this file)")),
    policies=(list[Literal[POLICIES]] | None, Field(None, min_length=1, description="policies to compare (default: all)")),  # type: ignore[valid-type]
    timing=(TimingModel, Field(default_factory=TimingModel, description="step-time overrides")),
    **{k: (t, Field(None, description=d)) for k, (t, d) in WORKLOAD_OPTIONS.items()},
)
