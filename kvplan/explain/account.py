"""What a start-up log's reconciliation is made of: how each engine's log accounts for its KV budget (LogAccount), the
rows, capacities and the Explanation the steps fill in.
"""

from __future__ import annotations

from typing import Any

from kvplan.errors import InputError
from kvplan.explain.startup_log import StartupLog
from kvplan.frozen import frozen

TERMS = ("weights", "activation", "overhead", "cudagraph")
UNPRINTED = "not printed"  # the row of what no line of the log prints: requested - printed terms - KV budget

_TERM_WORDS = {"weights": "the weights", "activation": "the activation peak", "overhead": "non-torch memory",
               "cudagraph": "CUDA-graph memory", "requested": "the requested memory (total x utilisation)",
               "total": "the GPU's total memory"}


@frozen
class LogAccount:
    """How one engine's start-up log accounts for its KV budget: the terms its lines print and the words for them.

    vLLM: ``kv = total x gpu_memory_utilization - weights - activation - non-torch (- CUDA graphs)``, each printed by
    the profiler (V0, DEBUG) or only the weights and the KV budget (V1 INFO). SGLang measures instead of profiling:
    ``pool = free memory before loading x mem_fraction_static - weights``; activations and CUDA graphs live in
    ``1 - mem_fraction_static`` (kvplan's overhead term, the memory in use before loading, is inside the first).
    """

    label: str
    pool: str  # what the diagnosis compares kvplan's KV with
    terms: tuple[str, ...]  # the rows between "requested" and the KV budget
    measures_free_memory: bool  # the budget starts from the free memory before loading (SGLang), not the total
    words: dict[str, str]
    implied: tuple[str, ...]  # which unprinted term a calibration entry fits to the log's block count
    no_terms_hint: str


ACCOUNTS = {
    "vllm": LogAccount("vLLM", "this engine", TERMS, False, _TERM_WORDS,
                       ("activation_bytes", "overhead_bytes", "weights_bytes"),
                       "vLLM prints the weights ('Model loading took'); a DEBUG GPU log (VLLM_LOGGING_LEVEL=DEBUG) "
                       "also prints the activation peak and the non-torch memory"),
    "sglang": LogAccount("SGLang", "this SGLang pool", ("weights", "cudagraph"), True,
                         {**_TERM_WORDS, "requested": "the free memory before loading x mem_fraction_static (kvplan "
                                                      "estimates the memory in use before loading: CUDA context, NCCL)"},
                         ("overhead_bytes", "weights_bytes"),
                         "SGLang's 'Load weight end ... mem usage' line (0.4.6+) prints the weights"),
}


def account(engine: str | None) -> LogAccount:
    """The :class:`LogAccount` of ``engine`` (vLLM when the log does not say)."""
    return ACCOUNTS[engine or "vllm"]


class ExplainError(InputError):
    """The log does not say enough to explain it (the message lists what was found and what is missing)."""


@frozen
class TermRow:
    """One budget term per GPU: what the log printed (bytes; ``None`` when not printed), kvplan's estimate
    (``None`` when kvplan has no plan, or no GPU to plan its terms on)."""

    name: str
    logged_bytes: int | None
    kvplan_bytes: int | None
    note: str = ""

    @property
    def difference_bytes(self) -> int | None:
        """kvplan minus logged (bytes); ``None`` when either side is missing."""
        return None if self.logged_bytes is None or self.kvplan_bytes is None else self.kvplan_bytes - self.logged_bytes


@frozen
class Capacity:
    """What the engine prints for one block count: tokens, concurrency, whether it starts, the longest length."""

    num_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    starts: bool
    longest_startable_len: int


@frozen
class Explanation:
    """The reconciliation of one start-up log with kvplan's plan of the same deployment.

    ``plan``: ``None`` when kvplan cannot load the model (``needs`` says why); the log's own account (``terms``'
    logged column, the log's capacity lines) stands without it. ``gpu_known``: whether the GPU the plan budgets
    is the deployment's (the log's total memory, its device name, ``--gpu``); without it the plan only lends its
    block rules to the logged terms, and ``from_kvplan`` is ``None``. ``from_logged``: the capacity from the
    logged terms (``None`` when the log prints no KV budget, blocks or tokens, or there is no plan);
    ``logged_blocks``: the block counts the logged budget allows; ``matches``: whether ``from_logged``
    reproduces every capacity line of the log. ``diagnosis``: one line, from these same objects.
    """

    log: StartupLog
    plan: Any  # kvplan.planning.plan.Plan | None
    values: dict[str, Any]
    terms: tuple[TermRow, ...]
    logged_kv_bytes: int | None
    from_kvplan: Capacity | None
    from_logged: Capacity | None
    logged_blocks: tuple[int, int] | None
    matches: bool | None
    mismatches: tuple[str, ...]
    notes: tuple[str, ...]
    needs: tuple[str, ...] = ()
    gpu_known: bool = True
    diagnosis: str = ""

    @property
    def engine(self) -> str:
        return self.log.engine or "vllm"

    @property
    def model(self) -> str | None:
        """The model planned, else the one the log names."""
        return self.plan.spec.model_id if self.plan is not None else self.values.get("model")

    def term(self, name: str) -> TermRow | None:
        return next((row for row in self.terms if row.name == name), None)
