"""``kvplan explain LOG``: what a start-up log says, kvplan's plan of the same deployment, and the two term by term.

1. :func:`kvplan.explain.logparse.parse_log` reads the log; :func:`log_values` turns it (plus what the user
   passed: ``--model``, ``--gpu``, ...) into estimate options. A log with no KV cache line at all (another
   program's, cut before the pool, garbled) is an error that lists what was found and what is missing.
2. The log's own account needs no model: the budget per GPU term by term as printed, the part no line prints
   (requested - the printed terms - the KV budget), the pool's blocks, tokens and concurrency, its warnings.
3. When kvplan can load the model, :func:`kvplan.planning.plan.estimate` plans the deployment and the logged
   terms are checked through the same plan's block and token rules: the logged KV budget (printed to 0.01
   GiB) is an interval of block counts; the rules of the engine release turn each count into the token line,
   the concurrency line and the start-up verdict the engine prints, and the count whose lines equal the
   log's is the engine's (exact when the rules are right). A log that prints the block count needs no
   interval. When the GPU is known too (the log's total memory, its device name, ``--gpu``), kvplan's own
   terms are set beside the log's, and :func:`diagnosis` says in one line where the two part.
Every number comes from the plan's own objects (``plan.rules``, ``plan.demand``, ``plan.budget``); nothing here
recomputes a formula.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from kvplan.errors import InputError, KvplanError
from kvplan.explain.logparse import StartupLog, parse_log, printed_interval
from kvplan.units import GiB, plural

TERMS = ("weights", "activation", "overhead", "cudagraph")
UNPRINTED = "not printed"  # the row of what no line of the log prints: requested - printed terms - KV budget
STAND_IN_UTIL = 0.9  # only to size a stand-in GPU for the layout when the log prints neither total nor requested
_TERM_WORDS = {"weights": "the weights", "activation": "the activation peak", "overhead": "non-torch memory",
               "cudagraph": "CUDA-graph memory", "requested": "the requested memory (total x utilisation)",
               "total": "the GPU's total memory"}


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Capacity:
    """What the engine prints for one block count: tokens, concurrency, whether it starts, the longest length."""

    num_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    starts: bool
    longest_startable_len: int


@dataclass(frozen=True)
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


# ---------------------------------------------------------------------------------------------
# log -> estimate options

_VALUE_FIELDS = {"tp": "tp", "pp": "pp", "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
                 "block_size": "block_size", "usage_context": "usage_context", "enforce_eager": "enforce_eager"}
# A log's total memory and a named GPU's differ by more than this: the two are not the same card.
GPU_MISMATCH_BYTES = round(0.5 * GiB)


def _dtype(text: str | None) -> str | None:
    return None if not text or text == "auto" else text


def _log_total(log: StartupLog) -> tuple[float | None, str]:
    """The device's total memory (GiB) as the log gives it: printed (``total_memory=``, "Free memory on device
    (free/total)", ``total_gpu_memory``, torch's out-of-memory text), or implied by the requested share and the
    utilisation (``requested / util``, to +-0.01 GiB) - and which of the two."""
    if log.total_memory_gib is not None:
        return log.total_memory_gib, "printed"
    util, requested = log.gpu_memory_utilization, log.requested_memory_gib
    if requested and util and not log.is_cpu and not account(log.engine).measures_free_memory:
        return round(requested / util, 2), "implied"
    return None, ""


def _catalogue_name(log: StartupLog) -> tuple[str | None, str]:
    """The catalogue GPU the log names (its device name) or whose memory its total is, and how it was found."""
    from kvplan.gpus import find_gpu, gpus_by_memory

    if log.device_name:
        try:
            return find_gpu(log.device_name).name, f"the log's device {log.device_name}"
        except KvplanError:
            pass
    total, how = _log_total(log)
    if total is None or log.is_cpu:
        return None, ""
    vendor = "amd" if log.platform == "rocm" else ("nvidia" if log.platform == "cuda" else None)
    near = gpus_by_memory(round(total * GiB), vendor=vendor)
    if not near:
        return None, ""
    also = f"; {near[1].name} reports within 0.06 GiB too" if len(near) > 1 else ""
    said = (f"{total} GiB total" if how == "printed" else
            f"{total} GiB total (requested {log.requested_memory_gib} GiB / util {log.gpu_memory_utilization:g})")
    return near[0].name, f"GPU not printed: {said} is what {near[0].name} reports (pass --gpu if it is another{also})"


def _gpu_values(log: StartupLog, overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str], bool]:
    """The GPU options (``gpu``, ``gpu_memory``), notes, and whether the GPU is the deployment's (not a stand-in).

    A total the log prints is planned (the named card's SM count and interconnect still used); one the log implies
    (requested / util) only finds the card, or is planned when no catalogue card has it."""
    notes: list[str] = []
    total, how = _log_total(log)
    out: dict[str, Any] = {k: overrides[k] for k in ("gpu", "gpu_memory") if overrides.get(k)}
    if out:  # the user's GPU; the total the log printed still wins
        if "gpu" in out and total and not log.is_cpu:
            from kvplan.gpus import find_gpu

            named = find_gpu(out["gpu"])  # an unknown name is the user's mistake: exit 2
            if named.memory_bytes and abs(named.memory_bytes - round(total * GiB)) > GPU_MISMATCH_BYTES:
                seen, _ = _catalogue_name(log)
                what = "total memory" if how == "printed" else (f"total memory (requested {log.requested_memory_gib} "
                                                                f"GiB / util {log.gpu_memory_utilization:g})")
                notes.append(f"--gpu {out['gpu']} ({named.memory_bytes / GiB:.2f} GiB) contradicts the log's {what} "
                             f"{total} GiB" + (f" (what {seen} reports)" if seen else "")
                             + ": kvplan plans the log's total")
                out["gpu_memory"] = f"{total}GiB"
        if how == "printed" and "gpu_memory" not in out:
            out["gpu_memory"] = f"{total}GiB"
        return out, notes, True
    if log.is_cpu:
        out["gpu"] = "cpu"
        if total:
            out["gpu_memory"] = f"{total}GiB"
        return out, notes, True
    name, found = _catalogue_name(log)
    if name:
        out["gpu"] = name
        if found.startswith("GPU not printed"):
            notes.append(found)
    if total and (how == "printed" or not name):
        out["gpu_memory"] = f"{total}GiB"
        if how == "implied" and not name:
            notes.append(f"GPU not printed: planned with the {total} GiB total that requested "
                         f"{log.requested_memory_gib} GiB / util {log.gpu_memory_utilization:g} imply")
    return out, notes, bool(out)


def _stand_in_memory(log: StartupLog) -> str:
    """A GPU size for the plan's layout when the GPU is unknown: the least total the log's figures allow (only the
    engine's batching defaults read it; kvplan's own terms are not shown without the GPU)."""
    util = log.gpu_memory_utilization or STAND_IN_UTIL
    if log.requested_memory_gib:
        return f"{log.requested_memory_gib / util:.2f}GiB"
    if log.sglang_avail_before_load_gib:  # SGLang: free before the weights load, which the weights and KV came out of
        return f"{max(log.sglang_avail_before_load_gib, (log.weights_gib or 0) + (log.kv_gib or 0), 1.0):.2f}GiB"
    used = (log.weights_gib or 0) + (log.kv_gib or 0)
    return f"{max(used / util, 1.0):.2f}GiB"


def _version(text: str) -> tuple[int, ...]:
    return tuple(99 if part == "x" else int(part) for part in text.split("."))


def release_candidates(log: StartupLog) -> tuple[str, ...]:
    """The modelled releases (newest first) whose rules may be the log's, when it does not print a release number:
    those covering the releases that print every line form of the log (:attr:`StartupLog.releases`). Empty when the
    log prints its version, has no dated form, or is a V0 log (planned with the V0 rules)."""
    from kvplan.engines.registry import engine as engine_rules

    if log.releases is None or log.mode == "V0" or (log.version and not _SOURCE_BUILD.match(log.version)):
        return ()
    rules = engine_rules(log.engine or "vllm")
    lo, hi = _version(log.releases[0]), _version(log.releases[1]) if log.releases[1] else None
    firsts = [(v, _version(rules.RANGES[v].split()[0])) for v in rules.VERSIONS]
    out = []
    for i, (v, first) in enumerate(firsts):
        after = firsts[i + 1][1] if i + 1 < len(firsts) else None  # the next modelled release's first
        if (hi is None or first <= hi) and (after is None or lo < after):
            out.append(v)
    return tuple(reversed(out))


def _util_from_requested(log: StartupLog) -> float | None:
    """The utilisation the log's requested memory and total give, where the printed one is that rounded (V0 prints
    ``%.2f``: 0.696 shows as 0.70 and would plan 0.3 GiB more on 80 GB); ``None`` when the printed one is exact."""
    total, requested, util = log.total_memory_gib, log.requested_memory_gib, log.gpu_memory_utilization
    if not total or not requested or util is None or log.is_cpu:
        return None
    ratio = requested / total
    lo, hi = printed_interval(util, max(2, len(repr(util).split(".")[-1])))
    if abs(ratio - util) <= 0.0005 or not lo - 0.0005 <= ratio <= hi + 0.0005:
        return None
    return round(ratio, 4)


def log_values(log: StartupLog, overrides: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Estimate option values for the deployment in ``log`` (the user's ``overrides`` win) and notes.

    The model and the GPU may be missing (``values`` then lacks ``model`` / ``gpu`` and ``gpu_memory``).
    Raises :class:`ExplainError` when the log has numbers no engine prints, or no line about the KV cache at all
    (naming what was found and what is missing).
    """
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if log.unreadable:
        more = f" (and {len(log.unreadable) - 2} more)" if len(log.unreadable) > 2 else ""
        raise ExplainError(f"the log has numbers no engine prints: {'; '.join(log.unreadable[:2])}{more}",
                           "the log is garbled or cut at that line: fix or remove it")
    values: dict[str, Any] = {"engine": log.engine or "vllm"}
    notes: list[str] = []
    if log.model:
        values["model"] = log.model
    if overrides.get("model") and log.model and overrides["model"] != log.model:
        notes.append(f"--model {overrides['model']} replaces the log's model {log.model}")
    if log.version and _SOURCE_BUILD.match(log.version):
        if not release_candidates(log):
            notes.append(f"version {log.version} is a source build without a release number: kvplan used its newest "
                         "rules (pass --engine-version)")
    elif log.version:
        values["engine_version"] = log.version
    for field, key in _VALUE_FIELDS.items():
        if getattr(log, field) is not None:
            values[key] = getattr(log, field)
    if "block_size" not in values:
        from kvplan.engines.registry import engine as engine_rules

        choices = engine_rules(values["engine"]).BLOCK_SIZES
        if log.engine_block_size is not None:
            if choices is None or log.engine_block_size in choices:  # else a hybrid's: kvplan's layout computes its own
                values["block_size"] = log.engine_block_size
        elif choices is not None and log.block_size is None:
            implied = block_size_from_concurrency(log, choices)
            if implied is not None:
                values["block_size"] = implied
                notes.append(f"block size {implied}: the log's {plural(log.num_gpu_blocks, 'block')} x "
                             f"{plural(implied, 'token')} hold {log.max_concurrency:g}x "
                             f"{plural(log.concurrency_len, 'token')} (no other block size does)")
    workers_tp = log.workers_tp
    if workers_tp and log.workers_pp is None and (values.get("pp") or 1) > 1:  # global ranks: tp x pp of them
        workers_tp //= values["pp"]
    for key, seen, word in (("tp", workers_tp, "tensor-parallel ranks"), ("pp", log.workers_pp, "pipeline stages")):
        if seen and seen > 1 and key not in values:
            values[key] = seen
            notes.append(f"{key} {seen}: the log prints no {key} setting; its worker names show {seen} {word} "
                         f"(a lower bound where not every worker printed: pass --{key})")
    if log.prefix_caching is not None:  # a vLLM line (SGLang prints its radix cache otherwise)
        values["prefix_caching"] = log.prefix_caching
    if log.flashinfer_sampler is not None:
        values["flashinfer"] = log.flashinfer_sampler
    if log.max_model_len:
        values["max_model_len"] = values["context"] = log.max_model_len
    if log.gpu_memory_utilization is not None:  # SGLang's mem_fraction_static is its utilisation
        values["gpu_util"] = log.gpu_memory_utilization
        exact = _util_from_requested(log)
        if exact is not None:
            values["gpu_util"] = exact
            notes.append(f"utilisation {exact:g} = requested / total ({log.requested_memory_gib} / {log.total_memory_gib} "
                         f"GiB); the log prints it rounded to {log.gpu_memory_utilization:g}")
    if _dtype(log.dtype):
        values["dtype"] = log.dtype
    if _dtype(log.kv_cache_dtype):
        values["kv_dtype"] = log.kv_cache_dtype
    if log.kv_cache_memory_bytes:
        values["kv_budget_bytes"] = log.kv_cache_memory_bytes
    elif log.cpu_kv_space_gib is not None and log.is_cpu:
        values["kv_budget_bytes"] = round(log.cpu_kv_space_gib * GiB)
    elif log.explicit_kv_gib is not None:
        values["kv_budget"] = f"{log.explicit_kv_gib}GiB"
    if log.quantization:
        from kvplan.engines import CHECKPOINT_QUANTIZATION, ONLINE_QUANTIZATION

        if log.quantization in ONLINE_QUANTIZATION or log.quantization in CHECKPOINT_QUANTIZATION:
            values["quantization"] = log.quantization
        else:
            notes.append(f"quantization {log.quantization!r} from the log is not modelled: weights from the checkpoint")
    gpu, gpu_notes, _ = _gpu_values(log, overrides)
    values.update(gpu)
    notes += gpu_notes
    values.update({k: v for k, v in overrides.items() if k not in ("gpu", "gpu_memory")})
    if "max_model_len" in overrides and "context" not in overrides:
        values["context"] = overrides["max_model_len"]
    if "engine_version" not in values and log.mode == "V0":
        values["engine_version"] = "0.6"
        notes.append("version not in the log; its V0 format is vLLM 0.6 - 0.7: kvplan used the 0.6 rules")
    elif "engine_version" not in values and not log.version and not release_candidates(log):
        notes.append(f"version not in the log: kvplan used its newest {values['engine']} rules (pass --engine-version)")
    if not log.has_capacity:
        missing = [what for what, ok in (("the model (pass --model)", "model" in values),
                                         ("the GPU (pass --gpu NAME or --gpu-memory SIZE)", "gpu" in values or "gpu_memory" in values))
                   if not ok]
        missing.append("the KV cache lines (Available KV cache memory / GPU KV cache size / GPU blocks / SGLang's "
                       "KV Cache is allocated / a refusal)")
        found = ", ".join(log.matched) if log.matched else "nothing kvplan recognises"
        raise ExplainError(f"the log does not say enough to explain it: found {found}; missing " + "; ".join(missing),
                           "a vLLM or SGLang start-up log from the engine's first lines to 'GPU KV cache size' "
                           "(SGLang: 'KV Cache is allocated')")
    return values, notes


# ---------------------------------------------------------------------------------------------
# the log's terms


def _b(gib: float | None) -> int | None:
    return None if gib is None else round(gib * GiB)


def _cudagraph(log: StartupLog) -> tuple[int | None, str]:
    """The CUDA-graph memory the log's budget subtracted (bytes; ``None``: the log says nothing of graphs) and what
    the log prints about graphs."""
    actual = log.cudagraph_actual_gib
    captured = f"{actual} GiB captured after the KV cache was sized" if actual is not None else ""
    if account(log.engine).measures_free_memory:  # SGLang: graphs live in 1 - mem_fraction_static
        return (0 if actual is not None else None), (f"{captured}, in 1 - mem_fraction_static: not subtracted"
                                                     if captured else "")
    if log.cudagraph_estimate_gib is not None:
        if log.cudagraph_applied:
            return _b(log.cudagraph_estimate_gib), ", ".join(filter(None, (f"estimate {log.cudagraph_estimate_gib} GiB "
                                                                         "subtracted", captured)))
        return 0, ", ".join(filter(None, (f"estimate {log.cudagraph_estimate_gib} GiB logged, not subtracted in this "
                                          "release", captured)))
    if actual is not None:  # no estimate line: nothing was subtracted (every release that subtracts logs it)
        return 0, f"{captured}: not subtracted in this release"
    return None, ""


def _logged_terms(log: StartupLog) -> dict[str, int | None]:
    """The log's per-GPU terms in bytes, named as kvplan names them."""
    weights, activation, overhead = log.weights_gib, log.activation_gib, log.non_torch_gib
    if activation is None and log.peak_torch_memory_gib is not None and log.weights_gib is not None:
        activation = log.peak_torch_memory_gib - log.weights_gib  # 0.6.4: the peak includes the weights
    if log.consumed_gib is not None:  # 0.27+: weights + non-torch in one figure
        if weights is not None and overhead is None:
            overhead = log.consumed_gib - weights
        elif weights is None:
            weights = log.consumed_gib if overhead is None else log.consumed_gib - overhead
    if "activation" not in account(log.engine).terms:
        activation = overhead = None
        before, after = log.sglang_avail_before_load_gib, log.sglang_avail_after_load_gib
        if weights is None and before is not None and after is not None:  # what 0.4.6+ prints as "mem usage"
            weights = before - after
    return {"weights": _b(weights), "activation": _b(activation), "overhead": _b(overhead),
            "cudagraph": _cudagraph(log)[0]}


def logged_kv_bytes(log: StartupLog) -> int | None:
    """The KV budget per GPU the log prints (bytes), exact when the deployment set it in bytes; implied by the
    requested memory and every printed term when the excerpt ends before the KV line."""
    if log.kv_cache_memory_bytes is not None and log.available_kv_gib is None:
        return log.kv_cache_memory_bytes
    if log.kv_gib is None and log.prints_every_term:
        requested, _ = _requested(log)
        return requested - sum(v for v in _logged_terms(log).values() if v is not None)
    return _b(log.kv_gib)


def implied_kv_bytes(log: StartupLog, plan: Any) -> int | None:
    """The KV pool an SGLang log's ``max_total_num_tokens`` implies where it prints no KV size (bytes per GPU):
    its tokens in whole pages x the plan's bytes per page (kvplan's cell size); None when the log prints a KV
    budget, no tokens, or is not SGLang's."""
    if plan is None or not account(log.engine).measures_free_memory or log.kv_cache_tokens is None \
            or logged_kv_bytes(log) is not None:
        return None
    return log.kv_cache_tokens // plan.layout.block_size * plan.layout.block_bytes


IMPLIED = "implied: max_total_num_tokens"  # how the note of a KV budget the tokens imply begins


def _requested(log: StartupLog) -> tuple[int | None, str]:
    """The share of the device the log's budget comes from (bytes), and how the log gives it."""
    if account(log.engine).measures_free_memory:
        free = log.sglang_avail_before_load_gib
        if free is None or log.gpu_memory_utilization is None:
            return None, ""
        return round(free * GiB * log.gpu_memory_utilization), (f"free before loading {free} GiB x "
                                                                f"mem_fraction_static {log.gpu_memory_utilization:g}")
    if log.requested_memory_gib is not None:
        return _b(log.requested_memory_gib), ""
    if log.total_memory_gib is not None and log.gpu_memory_utilization is not None and not log.is_cpu:
        return math.ceil(log.total_memory_gib * GiB * log.gpu_memory_utilization), "total x util (not printed)"
    return None, ""


def _term_rows(log: StartupLog, plan: Any, gpu_known: bool) -> tuple[TermRow, ...]:
    """The budget per GPU, term by term: the log's (as printed; derived where noted) and kvplan's."""
    logged = _logged_terms(log)
    b = plan.budget if plan is not None else None
    own = (lambda value: value) if gpu_known and b is not None else (lambda value: None)  # noqa: E731
    acc = account(log.engine)
    sglang = acc.measures_free_memory
    requested, how = _requested(log)
    if requested is None and not sglang and gpu_known and b is not None and log.gpu_memory_utilization is not None \
            and not log.is_cpu:  # the GPU given, the utilisation the log's: the engine's own product
        requested, how = b.usable_bytes, "the given GPU's total x the log's util (not printed)"
    rows = [TermRow("total", _b(log.total_memory_gib), own(b and b.total_bytes),
                    "the NUMA node's memory (the CPU backend)" if log.is_cpu and log.total_memory_gib else
                    ("not printed by SGLang" if sglang and log.total_memory_gib is None else ""))]
    if sglang:
        rows.append(TermRow("requested", requested, own(b and b.usable_bytes - b.overhead.bytes),
                            how or "the free memory before loading x mem_fraction_static"))
    else:
        rows.append(TermRow("requested", requested, own(b and b.usable_bytes),
                            ", ".join(filter(None, (how, f"x {b.gpu_util:g}" if b else
                                                    f"x {log.gpu_memory_utilization:g}" if log.gpu_memory_utilization
                                                    else "")))))
    for name in acc.terms:
        term = getattr(b, name) if b is not None else None
        note = {"weights": (("Load weight end: mem usage" if log.weights_gib is not None else
                             "avail mem before - after loading the weights") if sglang else
                            "vLLM's figure includes the rotary cache, which kvplan counts in overhead"),
                "overhead": ("consumed (weights + non-torch) - weights" if log.consumed_gib is not None
                             and log.non_torch_gib is None and log.weights_gib is not None
                             else "non-torch memory (+ kvplan's rotary cache)"),
                "cudagraph": _cudagraph(log)[1]}.get(name, "")
        rows.append(TermRow(name, logged[name], own(term and term.bytes), note))
    kv = logged_kv_bytes(log)
    implied = implied_kv_bytes(log, plan)
    printed = [row for row in rows[2:] if row.logged_bytes is not None]
    # what the budget subtracts but no line prints (SGLang's graphs live outside its budget: not missing)
    missing = [row for row in rows[2:] if row.logged_bytes is None and not (sglang and row.name == "cudagraph")]
    if requested is not None and kv is not None:
        rest = requested - sum(row.logged_bytes for row in printed) - kv
        if missing or abs(rest) > 0.02 * GiB:
            words = ", ".join(row.name for row in missing) if missing else (
                f"the Mamba state pool of {log.sglang_mamba_slots:,} request slots (a hybrid's state layers)"
                if log.sglang_mamba_slots else "rounding of the printed terms")
            kvplan_rest = (sum(row.kvplan_bytes for row in missing) if missing and gpu_known and b is not None
                           and all(row.kvplan_bytes is not None for row in missing) else (b.state_pool_bytes if not missing and gpu_known
                                                                                        and b is not None else None))
            rows.append(TermRow(UNPRINTED, rest, kvplan_rest, f"requested - printed terms - KV budget: {words}"))
    if log.kv_gib is None and log.prints_every_term and kv is not None:
        rows = [row for row in rows if row.name != UNPRINTED]
        rows.append(TermRow("kv_budget", kv, own(b and b.kv_budget_bytes), "not printed: requested - the printed terms"))
        return tuple(rows)
    if implied is not None:
        per_token = plan.layout.block_bytes / plan.layout.block_size
        rows.append(TermRow("kv_budget", implied, own(b and b.kv_budget_bytes),
                            f"{IMPLIED} {log.kv_cache_tokens:,} x {per_token:,.0f} B per token (kvplan's cell size; "
                            "the log prints no KV size)"))
        return tuple(rows)
    rows.append(TermRow("kv_budget", kv, own(b and b.kv_budget_bytes),
                        ("K + V sizes" if log.sglang_k_gib is not None and log.sglang_kv_gib is None else "the pool")
                        if sglang else ("explicit (kv_cache_memory_bytes)" if log.kv_cache_memory_bytes
                                        or log.explicit_kv_gib is not None else "available KV cache memory")))
    return tuple(rows)


# ---------------------------------------------------------------------------------------------
# the capacity


def prints_capacity_lines(log: StartupLog) -> bool:
    """Whether the log prints a line the block rules can be checked on (blocks, tokens, concurrency, the longest
    length of a refusal), beyond its KV budget and whether it started."""
    return any(x is not None for x in (log.num_gpu_blocks, log.kv_cache_tokens, log.max_concurrency)) or (
        log.refusal is not None and (log.refusal.estimated_max_model_len is not None or log.refusal.kv_tokens is not None))


def capacity(plan: Any, blocks: int) -> Capacity:
    """What the engine of ``plan`` prints with ``blocks`` blocks (the plan's own rules and demand)."""
    from kvplan import memory

    d = replace(plan.deployment, blocks=blocks)
    rules, mml = plan.rules, plan.max_model_len
    per_request = d.blocks_per_request(mml)
    return Capacity(blocks, d.kv_tokens(mml), memory.vllm_max_concurrency(blocks, per_request),
                    rules.starts(plan.engine, blocks, per_request), d.longest_startable_len())


def _block_range(log: StartupLog, plan: Any) -> tuple[int, int] | None:
    """The block counts the logged budget allows (printed GiB +- 0.005; SGLang: K + V sizes)."""
    from kvplan import memory

    if log.num_gpu_blocks is not None:
        return log.num_gpu_blocks, log.num_gpu_blocks
    if log.refusal is not None and log.refusal.kv_tokens is not None:  # V0: the pool in tokens
        blocks = log.refusal.kv_tokens // plan.layout.block_size
        return blocks, blocks
    exact = log.kv_cache_memory_bytes if log.available_kv_gib is None and log.kv_cache_memory_bytes else None
    if exact is not None:
        blocks = memory.num_blocks(exact, plan.layout)
        return blocks, blocks
    if log.sglang_kv_gib is not None:
        lo, hi = (x * GiB for x in printed_interval(log.sglang_kv_gib))
    elif log.sglang_k_gib is not None and log.sglang_v_gib is not None:
        lo = (printed_interval(log.sglang_k_gib)[0] + printed_interval(log.sglang_v_gib)[0]) * GiB
        hi = (printed_interval(log.sglang_k_gib)[1] + printed_interval(log.sglang_v_gib)[1]) * GiB
    elif log.kv_gib is not None:
        lo, hi = (x * GiB for x in printed_interval(log.kv_gib))
    elif log.prints_every_term:  # requested - the terms: each printed to 0.01 GiB
        implied = logged_kv_bytes(log)
        lo, hi = implied - 4 * PRINT_HALF_STEP_BYTES, implied + 4 * PRINT_HALF_STEP_BYTES
    elif implied_kv_bytes(log, plan) is not None:  # SGLang's tokens alone: the pool's pages
        blocks = log.kv_cache_tokens // plan.layout.block_size
        return blocks, blocks
    elif log.max_concurrency is not None:  # only "Maximum concurrency": blocks / per-request blocks, to 0.01
        per_request = plan.demand.blocks(plan.max_model_len)
        c_lo, c_hi = printed_interval(log.max_concurrency)
        return max(0, math.ceil(c_lo * per_request)), max(0, math.floor(c_hi * per_request))
    else:
        return None
    return memory.num_blocks(max(0, math.ceil(lo)), plan.layout), memory.num_blocks(max(0, math.floor(hi)), plan.layout)


def _mismatches(log: StartupLog, cap: Capacity) -> list[str]:
    """The capacity lines of the log that ``cap`` does not reproduce exactly."""
    out = []
    if log.num_gpu_blocks is not None and cap.num_blocks != log.num_gpu_blocks:
        out.append(f"blocks {cap.num_blocks:,} != {log.num_gpu_blocks:,}")
    if log.kv_cache_tokens is not None and cap.kv_cache_tokens != log.kv_cache_tokens:
        out.append(f"KV cache tokens {cap.kv_cache_tokens:,} != {log.kv_cache_tokens:,}")
    if log.max_concurrency is not None and round(cap.max_concurrency, 2) != round(log.max_concurrency, 2):
        out.append(f"max concurrency {cap.max_concurrency:.2f}x != {log.max_concurrency:.2f}x")
    if log.starts is False:
        if cap.starts:
            out.append(f"the engine did not start ({log.not_started}); these blocks would start")
        elif log.refusal is not None and log.refusal.estimated_max_model_len is not None \
                and cap.longest_startable_len != log.refusal.estimated_max_model_len:
            out.append(f"longest length {cap.longest_startable_len:,} != {log.refusal.estimated_max_model_len:,}")
    elif log.starts and not cap.starts:
        out.append("these blocks would not start the engine, which started")
    return out


def _from_logged(log: StartupLog, plan: Any) -> tuple[Capacity | None, tuple[int, int] | None, list[str]]:
    """The capacity from the logged budget: the block count in its interval whose lines equal the log's."""
    span = _block_range(log, plan)
    if span is None:
        return None, None, []
    lo, hi = span
    best, best_miss = None, None
    for blocks in range(lo, hi + 1):
        cap = capacity(plan, blocks)
        miss = _mismatches(log, cap)
        if best is None or len(miss) < len(best_miss):
            best, best_miss = cap, miss
        if not miss:
            break
    mismatches = list(best_miss or [])
    engine_bs = log.engine_block_size
    if engine_bs is not None and engine_bs != plan.layout.block_size and mismatches:
        mismatches.append(f"the engine set block size {engine_bs:,}, kvplan's layout has {plan.layout.block_size:,}")
    return best, span, mismatches


def block_size_from_concurrency(log: StartupLog, choices: tuple[int, ...]) -> int | None:
    """The block size (tokens) a V0-style log's own numbers imply, or ``None``: where a log prints the blocks and
    ``Maximum concurrency for N tokens per request: X`` but no token count, ``X = blocks x block size / N`` (V0's
    rule, printed to 2 decimals) holds for one of the engine's ``choices`` only. Only a size other than the
    default 16 is returned, and only when it is the one choice that reproduces the line (a backend that chose
    its own pages, such as FlashMLA's 64, and printed no line saying so)."""
    if not log.num_gpu_blocks or not log.concurrency_len or log.max_concurrency is None or log.kv_cache_tokens is not None:
        return None
    fits = [size for size in choices if round(log.num_gpu_blocks * size / log.concurrency_len, 2) == log.max_concurrency]
    return fits[0] if len(fits) == 1 and fits[0] != 16 else None


# ---------------------------------------------------------------------------------------------
# the explanation


def _plan(values: dict[str, Any], token: str | None, asked: bool) -> tuple[Any, str | None, str | None]:
    """kvplan's plan of the deployment, or ``None`` and why not (the model cannot be loaded, an option the log
    gives is not one kvplan plans). ``asked``: the user named the model (``--model``): then a plan that fails is
    an error, as ``kvplan estimate`` would give it. The third value: the bundled spec planned in place of a log's
    model that kvplan cannot load but whose name is that spec's."""
    from kvplan.planning.plan import estimate, options_from_values

    if "model" not in values:
        return None, "the log does not name the model: pass --model (a local folder, a bundled id or a Hub id)", None
    try:
        return estimate(options_from_values(values), token=token), None, None
    except KvplanError as exc:
        if asked:
            raise
        why = (f"kvplan cannot plan the log's model {values['model']}: {exc.one_line()}; the comparison with "
               "kvplan's own plan needs the model (--model DIR or a Hub id)")
    same = _bundled_by_name(values["model"])
    if same is not None:
        try:
            return estimate(options_from_values({**values, "model": same}), token=token), None, same
        except KvplanError:
            pass
    return None, why, None


# Hub repositories renamed since the logs were written (the Hub redirects the old name)
_RENAMED = {f"meta-llama-3.1-{size}{kind}": f"llama-3.1-{size}{kind}" for size in ("8b", "70b", "405b")
            for kind in ("", "-instruct")}
_HF_CACHE_DIR = re.compile(r"models--([^/]+?)--([^/]+)(?:/snapshots/[^/]*)?/?$")
_SOURCE_BUILD = re.compile(r"^0\.(?:0\.0|1)\.dev")  # setuptools-scm's version of a checkout without release tags


def _at_model_length(plan: Any, values: dict[str, Any], given: dict[str, Any],
                     token: str | None) -> tuple[Any, dict[str, Any]]:
    """``plan`` at the model's maximum length when neither the log nor the user sets max_model_len (the engine's
    default), else as it is."""
    from kvplan.planning.plan import estimate, options_from_values

    longest = plan.answer.model_max_len
    if "max_model_len" in values or "max_model_len" in given or not longest or longest == plan.max_model_len:
        return plan, values
    values = {**values, "max_model_len": longest, "context": longest}
    return estimate(options_from_values(values), token=token), values


def _release_and_length(log: StartupLog, plan: Any, values: dict[str, Any], given: dict[str, Any],
                        token: str | None) -> tuple[Any, dict[str, Any], list[str]]:
    """The plan of the log's release and length: when the log prints no release number, the newest modelled release
    whose rules reproduce its capacity lines among those its line forms allow (:func:`release_candidates`; else the
    newest of them); at the model's maximum length when the log does not print max_model_len. The values it was
    planned with, and notes saying which and why."""
    from kvplan.engines.registry import engine as engine_rules
    from kvplan.planning.plan import estimate, options_from_values

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
                trial = estimate(options_from_values({**values, "engine_version": first}), token=token)
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
    from kvplan.planning.plan import estimate, options_from_values

    if not any(layer.is_state for layer in plan.spec.layers):
        return None
    trial_values = {**values, "prefix_caching": not plan.prefix_caching}
    try:
        trial = estimate(options_from_values(trial_values), token=token)
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


# ---------------------------------------------------------------------------------------------
# the diagnosis: one line from the table's own objects


def _gib(n: int) -> str:
    return f"{abs(n) / GiB:,.2f} GiB"


def _biggest(ex: Explanation, gap_bytes: int) -> tuple[TermRow, int] | None:
    """The term whose difference (kvplan - log) contributes most to a KV gap of ``gap_bytes``, and its share."""
    best = None
    for row in ex.terms:
        if row.name in ("total", "kv_budget") or row.difference_bytes is None:
            continue
        share = row.difference_bytes if row.name == "requested" else -row.difference_bytes  # more KV for kvplan
        if share * gap_bytes > 0 and (best is None or abs(share) > abs(best[1])):
            best = (row, share)
    return best


def biggest_term(ex: Explanation) -> tuple[str, int] | None:
    """The term that makes most of kvplan's KV gap against the log, and how much KV it gives kvplan (bytes; > 0:
    more than the engine), or ``None`` when there is no gap to split (no KV budget on either side)."""
    kv = ex.term("kv_budget")
    if kv is None or kv.difference_bytes is None or kv.difference_bytes == 0:
        return None
    big = _biggest(ex, kv.difference_bytes)
    return None if big is None else (big[0].name, big[1])


def _term_words(ex: Explanation, row: TermRow) -> str:
    if row.name == UNPRINTED:
        return "what the log does not print (" + row.note.split(": ", 1)[-1] + ")"
    return account(ex.engine).words.get(row.name, row.name)


GPU_DOUBT_BYTES = 4 * GiB  # the log's unprinted rest off kvplan's estimate of it by more than this (or 20% of the
# requested memory) is not a term kvplan misjudged: the GPU is not the log's


def gpu_doubt(ex: Explanation) -> str | None:
    """When the log prints no total and the GPU planned (``--gpu``) cannot be the log's: what the log prints
    (terms and KV budget) exceeds that GPU's requested memory, or leaves far more unexplained than the unprinted
    terms take. Then one clause saying the GPU looks wrong, naming the catalogue GPU whose memory the log implies
    (its printed terms plus kvplan's estimate of the unprinted ones, over the utilisation); else ``None``."""
    from kvplan.gpus import load_gpus

    log, plan = ex.log, ex.plan
    rest, req = ex.term(UNPRINTED), ex.term("requested")
    if (plan is None or log.total_memory_gib is not None or log.is_cpu or plan.gpu.is_cpu or rest is None
            or req is None or not req.logged_bytes or rest.logged_bytes is None or rest.kvplan_bytes is None
            or not plan.budget.total_bytes):
        return None
    off = rest.logged_bytes - rest.kvplan_bytes
    if abs(off) <= max(GPU_DOUBT_BYTES, 0.2 * req.logged_bytes):
        return None
    printed = req.logged_bytes - rest.logged_bytes  # the log's printed terms and KV budget, per GPU
    util = req.logged_bytes / plan.budget.total_bytes
    implied = round((printed + max(0, rest.kvplan_bytes)) / util)
    vendor = "amd" if log.platform == "rocm" else ("nvidia" if log.platform == "cuda" else plan.gpu.vendor)
    cards = [g for g in load_gpus() if g.memory_bytes and not g.is_cpu and g.vendor == vendor]
    near = min(cards, key=lambda g: abs(g.memory_bytes - implied), default=None)
    said = (f"the log's printed terms and KV budget ({printed / GiB:.2f} GiB per GPU) "
            + (f"exceed {plan.gpu.name}'s requested {req.logged_bytes / GiB:.2f} GiB" if rest.logged_bytes < 0 else
               f"leave {rest.logged_bytes / GiB:.2f} GiB of {plan.gpu.name}'s requested {req.logged_bytes / GiB:.2f} GiB "
               "unexplained"))
    guess = (f"; they imply about {implied / GiB:.1f} GiB total, what {near.name} reports "
             f"({near.memory_bytes / GiB:.2f} GiB): pass --gpu {near.name}" if near is not None else
             f"; they imply about {implied / GiB:.1f} GiB total (pass --gpu-memory)")
    return f"the GPU looks wrong: {said}{guess}"


def diagnosis(ex: Explanation) -> str:
    """One line: kvplan's total KV gap against the engine and the term that makes most of it, worded for the
    engine; or why the engine did not start; or what the comparison needs. Computed from ``ex.terms`` and the
    capacities (the table's own objects)."""
    pool = account(ex.engine).pool
    log = ex.log
    if log.starts is False:
        head = f"the engine did not start: {log.not_started}"
        own = ex.from_kvplan
        if own is not None and own.starts:
            return head + (f"; kvplan's own terms start it with {plural(own.num_blocks, 'block')} "
                           f"({plural(own.kv_cache_tokens, 'token')}): kvplan's plan is more optimistic than this "
                           "deployment")
        if own is not None:
            return head + f"; kvplan's own terms do not start it either ({ex.plan.answer.refusal})"
        return head + (f"; {ex.needs[0]}" if ex.needs else "")
    if ex.plan is None:
        said = (f"the log's KV budget of {_gib(ex.logged_kv_bytes)}" if ex.logged_kv_bytes is not None
                else "the log's pool")
        if log.kv_cache_tokens is not None:
            said += f" holds {plural(log.kv_cache_tokens, 'token')}"
        elif log.num_gpu_blocks is not None:
            said += f" holds {plural(log.num_gpu_blocks, 'block')}"
        if log.max_concurrency is not None and log.concurrency_len:
            said += f" ({log.max_concurrency:.2f}x at {log.concurrency_len:,})"
        return f"{said}; the comparison with kvplan's own plan needs the model"
    if ex.matches is False:
        return "the logged terms do not reproduce the log's capacity lines: " + "; ".join(ex.mismatches[:2])
    kv = ex.term("kv_budget")
    if kv is None or kv.difference_bytes is None:
        if not ex.gpu_known:
            tail = "kvplan's own terms need the GPU (pass --gpu NAME or --gpu-memory SIZE)"
        else:
            tail = ex.needs[0] if ex.needs else "the log prints no KV budget to compare its terms with"
        if ex.matches and ex.from_logged is not None:
            got = ex.from_logged
            whose = "the log's " if log.kv_cache_tokens is not None else ""
            return (f"the logged budget gives {whose}{plural(got.kv_cache_tokens, 'token')} "
                    f"({got.max_concurrency:.2f}x at {ex.plan.max_model_len:,}) under kvplan's block rules; {tail}")
        return tail
    gap = kv.difference_bytes
    doubt = gpu_doubt(ex)
    lo = ex.from_logged.num_blocks if ex.from_logged is not None else None
    blocks = "" if lo is None or ex.from_kvplan is None else f", {ex.from_kvplan.num_blocks - lo:+,} blocks"
    pct = f"{gap / kv.logged_bytes:+.1%}" if kv.logged_bytes else "n/a"
    if abs(gap) < 0.01 * GiB:
        return f"kvplan's terms give this engine's KV budget to within 0.01 GiB ({pct}{blocks})"
    line = f"kvplan's terms give {_gib(gap)} ({pct}{blocks}) {'more' if gap > 0 else 'less'} KV than {pool}"
    if doubt is not None:  # the gap is the GPU's, not a term's
        return f"{doubt} ({line} on {ex.plan.gpu.name})"
    big = _biggest(ex, gap)
    if big is not None:
        row, share = big
        if abs(share) <= abs(gap):
            line += f"; {_gib(share)} of it is {_term_words(ex, row)}"
        else:
            line += (f"; {_gib(share)} comes from {_term_words(ex, row)} (the other terms take back "
                     f"{_gib(share - gap)})")
    return line


def measured_terms(ex: Explanation) -> dict[str, int]:
    """The terms the log measured, per GPU (bytes), as printed."""
    return {f"{row.name}_bytes": row.logged_bytes for row in ex.terms if row.name in TERMS and row.logged_bytes is not None}


PRINT_HALF_STEP_BYTES = round(0.005 * GiB)  # a GiB figure printed with 2 decimals is exact to +- this
_ABSORBING = ("overhead_bytes", "activation_bytes", "weights_bytes", "cudagraph_bytes")  # which printed term takes the rounding


def calibration_terms(ex: Explanation) -> tuple[dict[str, int], str]:
    """The terms a calibration entry stores, and a note on what was fitted (bytes, per GPU).

    When the logged terms reproduce the log's capacity (``ex.matches``), the entry is made to reproduce the
    engine's block count ``N`` in a later plan of the same deployment (``--calibration``): the terms must leave
    the middle of ``N``'s byte range for the KV cache.

    - Every term printed (V0, DEBUG logs): the log prints them in GiB to 0.01 (weights often to 0.0001), so
      their sum is exact only to a few MiB and can land a block off (vllm-10517: the printed terms give 1,951
      blocks, the log 1,952). The first of overhead, activation, weights takes the difference, if it is within
      the print precision of the numbers involved (else the terms are stored as printed and the note says so).
    - Some terms not printed (INFO logs: weights and the KV budget): the log's budget implies the rest, which
      the first unprinted of activation, overhead, weights takes (the other unprinted terms stay kvplan's estimates;
      SGLang: the memory in use before loading).
    """
    from kvplan import memory

    terms = measured_terms(ex)
    if not terms or not ex.matches or ex.from_logged is None:
        return terms, ""
    budget, layout = ex.plan.budget, ex.plan.layout
    unmeasured = {f"{t.name}_bytes": t.bytes for t in budget.terms if f"{t.name}_bytes" not in terms}
    kv = budget.usable_bytes - sum(terms.values()) - sum(unmeasured.values())  # a calibrated plan's KV budget
    blocks = ex.from_logged.num_blocks
    target = blocks * layout.block_bytes + layout.block_bytes // 2
    what = plural(blocks, 'block')
    if blocks == 0 and ex.logged_kv_bytes is not None and ex.logged_kv_bytes <= 0:
        # the engine did not start: 0 blocks is a floor, the printed (negative) budget is the measurement
        target, what = ex.logged_kv_bytes, f"KV budget of {ex.logged_kv_bytes / GiB:,.2f} GiB (the engine did not start)"
    elif memory.num_blocks(kv, layout) == blocks:
        return terms, ""
    shift = kv - target  # > 0: the terms leave too much for the KV cache
    implied = [k for k in account(ex.engine).implied if k in unmeasured]
    if implied and sum(unmeasured[k] for k in implied) + shift >= 0:
        # the unprinted terms take the difference in order, each down to 0 at most
        taken = []
        for k in implied:
            terms[k] = max(0, unmeasured[k] + shift)
            shift -= terms[k] - unmeasured[k]
            taken.append(k.removesuffix("_bytes"))
            if shift == 0:
                break
        return terms, (f"{' and '.join(taken)} implied by the log's {what}: requested - the "
                       "printed terms - kvplan's estimates of the others - the KV budget")
    name = next(k for k in _ABSORBING if k in terms)
    if abs(shift) > PRINT_HALF_STEP_BYTES * (2 + len(terms)) or terms[name] + shift < 0:
        return terms, (f"the printed terms give {plural(memory.num_blocks(kv, layout), 'block')}, not the log's {blocks:,} "
                       f"({shift / GiB:+.3f} GiB, more than their print precision): stored as printed")
    terms[name] += shift
    return terms, (f"{name.removesuffix('_bytes')} {shift:+,} B: the printed GiB figures, fitted within their 0.01 GiB "
                   f"precision to the log's {plural(blocks, 'block')}")


def calibration_entry(ex: Explanation, source: str) -> Any:
    """The calibration entry (:class:`kvplan.io.calibration.Entry`) for the deployment ``ex`` planned, with the
    terms of :func:`calibration_terms`; ``source`` names the log. Raises InputError when the log measured no term
    or kvplan could not plan the deployment (its key needs the model and the GPU)."""
    from kvplan.io.calibration import Entry

    if ex.plan is None or not ex.gpu_known:
        raise InputError("cannot calibrate from this log: " + (ex.needs[0] if ex.needs else "no plan"),
                         "a calibration entry is keyed by the model and the GPU")
    terms, note = calibration_terms(ex)
    if not terms:
        hint = ("the CPU backend prints no budget terms: its KV cache is the explicit VLLM_CPU_KVCACHE_SPACE / "
                "--kv-cache-memory" if ex.log.is_cpu else
                account(ex.engine).no_terms_hint)
        raise InputError("the log prints no budget terms to calibrate with (weights, activation, non-torch)", hint)
    p = ex.plan
    return Entry(p.spec.model_id, p.gpu.name, p.gpu.memory_bytes, p.engine.engine, p.engine.version, p.options.tp,
                 p.options.pp, p.model_dtype, p.engine.max_num_batched_tokens, p.engine.max_num_seqs,
                 tuple(sorted(terms.items())), engine_version=ex.log.version or p.engine.requested_version,
                 source=source, note=note)


__all__ = ["Explanation", "TermRow", "Capacity", "ExplainError", "explain", "log_values", "capacity", "measured_terms",
           "calibration_terms", "calibration_entry", "diagnosis", "biggest_term", "logged_kv_bytes", "UNPRINTED",
           "prints_capacity_lines",
           "LogAccount", "ACCOUNTS", "account"]
