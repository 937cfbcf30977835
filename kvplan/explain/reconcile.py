"""``kvplan explain LOG``: plan the deployment a start-up log describes and reconcile the two, term by term.

1. :func:`kvplan.explain.logparse.parse_log` reads the log; :func:`log_values` turns it (plus what the user
   passed: ``--model``, ``--gpu``, ...) into estimate options; what is still missing is an error that
   lists what was found.
2. :func:`kvplan.planning.plan.estimate` plans it - kvplan's own terms.
3. The logged terms are checked through the same plan's block and token rules: the logged KV budget
   (printed to 0.01 GiB) is an interval of block counts; the rules of the engine release turn each
   count into the token line, the concurrency line and the start-up verdict the engine prints, and
   the count whose lines equal the log's is the engine's (exact when the rules are right). A log that
   prints the block count itself needs no interval.
Every number comes from the plan's own objects (``plan.rules``, ``plan.demand``); nothing here
recomputes a formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from kvplan.errors import InputError, KvplanError
from kvplan.explain.logparse import StartupLog, parse_log, printed_interval
from kvplan.units import GiB, plural

TERMS = ("weights", "activation", "overhead", "cudagraph")


class ExplainError(InputError):
    """The log does not say enough to plan it (the message lists what was found and what is missing)."""


@dataclass(frozen=True)
class TermRow:
    """One budget term: what the log printed (bytes, ``None`` when not printed), kvplan's estimate."""

    name: str
    logged_bytes: int | None
    kvplan_bytes: int
    note: str = ""

    @property
    def difference_bytes(self) -> int | None:
        """kvplan minus logged (bytes); ``None`` when the log does not print the term."""
        return None if self.logged_bytes is None else self.kvplan_bytes - self.logged_bytes


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

    ``from_logged``: the capacity from the logged terms (``None`` when the log prints no KV budget,
    blocks or tokens); ``logged_blocks``: the block counts the logged budget allows; ``matches``:
    whether ``from_logged`` reproduces every capacity line of the log.
    """

    log: StartupLog
    plan: Any  # kvplan.planning.plan.Plan
    values: dict[str, Any]
    terms: tuple[TermRow, ...]
    logged_kv_bytes: int | None
    from_kvplan: Capacity
    from_logged: Capacity | None
    logged_blocks: tuple[int, int] | None
    matches: bool | None
    mismatches: tuple[str, ...]
    notes: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# log -> estimate options

_VALUE_FIELDS = {"tp": "tp", "pp": "pp", "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
                 "block_size": "block_size", "usage_context": "usage_context", "enforce_eager": "enforce_eager"}


def _dtype(text: str | None) -> str | None:
    return None if not text or text == "auto" else text


def _gpu_values(log: StartupLog, overrides: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: overrides[k] for k in ("gpu", "gpu_memory") if overrides.get(k)}
    if out:  # the user's GPU (its SM count and interconnect); the total the log printed still wins
        if log.total_memory_gib and "gpu_memory" not in out:
            out["gpu_memory"] = f"{log.total_memory_gib}GiB"
        return out
    if log.device_name:
        from kvplan.gpus import find_gpu

        try:
            out["gpu"] = find_gpu(log.device_name).name
        except KvplanError:
            pass
    if log.total_memory_gib:
        out["gpu_memory"] = f"{log.total_memory_gib}GiB"
    return out


def log_values(log: StartupLog, overrides: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Estimate option values for the deployment in ``log`` (the user's ``overrides`` win) and notes.

    Raises :class:`ExplainError` naming what was found and what is missing (the model, the GPU).
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
    if log.version:
        values["engine_version"] = log.version
    for field, key in _VALUE_FIELDS.items():
        if getattr(log, field) is not None:
            values[key] = getattr(log, field)
    if log.max_model_len:
        values["max_model_len"] = values["context"] = log.max_model_len
    if log.gpu_memory_utilization is not None:  # SGLang's mem_fraction_static is its utilisation
        values["gpu_util"] = log.gpu_memory_utilization
    if _dtype(log.dtype):
        values["dtype"] = log.dtype
    if _dtype(log.kv_cache_dtype):
        values["kv_dtype"] = log.kv_cache_dtype
    if log.quantization:
        from kvplan.engines import CHECKPOINT_QUANTIZATION, ONLINE_QUANTIZATION

        if log.quantization in ONLINE_QUANTIZATION or log.quantization in CHECKPOINT_QUANTIZATION:
            values["quantization"] = log.quantization
        else:
            notes.append(f"quantization {log.quantization!r} from the log is not modelled: weights from the checkpoint")
    values.update(_gpu_values(log, overrides))
    values.update({k: v for k, v in overrides.items() if k not in ("gpu", "gpu_memory")})
    if "max_model_len" in overrides and "context" not in overrides:
        values["context"] = overrides["max_model_len"]
    if "engine_version" not in values and log.mode == "V0":
        values["engine_version"] = "0.6"
        notes.append("version not in the log; its V0 format is vLLM 0.6 - 0.7: kvplan used the 0.6 rules")
    elif "engine_version" not in values:
        notes.append("version not in the log: kvplan used its newest rules (pass --engine-version)")
    missing = [what for what, ok in (("the model (pass --model)", "model" in values),
                                     ("the GPU (pass --gpu NAME or --gpu-memory SIZE)", "gpu" in values or "gpu_memory" in values))
               if not ok]
    if not log.has_capacity:
        missing.append("the KV cache lines (Available KV cache memory / GPU KV cache size / GPU blocks / a refusal)")
    if missing:
        found = ", ".join(log.matched) if log.matched else "nothing kvplan recognises"
        raise ExplainError(f"the log does not say enough to plan it: found {found}; missing " + "; ".join(missing),
                           "a vLLM or SGLang start-up log from the engine's first lines to 'GPU KV cache size'")
    return values, notes


# ---------------------------------------------------------------------------------------------
# the reconciliation


def _logged_terms(log: StartupLog, plan: Any) -> dict[str, int | None]:
    """The log's per-GPU terms in bytes, named as kvplan names them."""
    def b(gib: float | None) -> int | None:
        return None if gib is None else round(gib * GiB)

    activation = log.activation_gib
    if activation is None and log.peak_torch_memory_gib is not None and log.weights_gib is not None:
        activation = log.peak_torch_memory_gib - log.weights_gib  # 0.6.3/0.6.4: the peak includes the weights
    cudagraph = log.cudagraph_estimate_gib if log.cudagraph_applied else (0.0 if log.cudagraph_estimate_gib is not None
                                                                         else None)
    return {"weights": b(log.weights_gib), "activation": b(activation), "overhead": b(log.non_torch_gib),
            "cudagraph": b(cudagraph)}


def _term_rows(log: StartupLog, plan: Any) -> tuple[TermRow, ...]:
    logged = _logged_terms(log, plan)
    b = plan.budget
    rows = [TermRow("total", round(log.total_memory_gib * GiB) if log.total_memory_gib else None, b.total_bytes),
            TermRow("requested", round(log.requested_memory_gib * GiB) if log.requested_memory_gib else None,
                    b.usable_bytes, f"x {b.gpu_util:g}")]
    for term in b.terms:
        note = {"weights": "vLLM's figure includes the rotary cache, which kvplan counts in overhead",
                "overhead": "non-torch memory (+ kvplan's rotary cache)",
                "cudagraph": ("logged estimate, subtracted" if log.cudagraph_applied else
                              f"estimate {log.cudagraph_estimate_gib} GiB logged, not subtracted"
                              if log.cudagraph_estimate_gib is not None else "")}.get(term.name, "")
        rows.append(TermRow(term.name, logged[term.name], term.bytes, note))
    kv = round(log.available_kv_gib * GiB) if log.available_kv_gib is not None else None
    rows.append(TermRow("kv_budget", kv, b.kv_budget_bytes, "available KV cache memory"))
    return tuple(rows)


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
    if log.sglang_k_gib is not None and log.sglang_v_gib is not None:
        lo = (printed_interval(log.sglang_k_gib)[0] + printed_interval(log.sglang_v_gib)[0]) * GiB
        hi = (printed_interval(log.sglang_k_gib)[1] + printed_interval(log.sglang_v_gib)[1]) * GiB
    elif log.available_kv_gib is not None:
        lo, hi = (x * GiB for x in printed_interval(log.available_kv_gib))
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
    return best, span, best_miss or []


def explain(text: str, overrides: dict[str, Any] | None = None, token: str | None = None) -> Explanation:
    """Parse ``text`` (a start-up log), plan the same deployment, reconcile (see the module docstring)."""
    from kvplan.planning.plan import estimate, options_from_values

    log = parse_log(text)
    values, notes = log_values(log, overrides)
    plan = estimate(options_from_values(values), token=token)
    from_logged, span, mismatches = _from_logged(log, plan)
    if from_logged is None and log.kv_cache_tokens is not None:
        mismatches = ["the log prints tokens but no KV budget or blocks to derive them from"]
    rows = _term_rows(log, plan)
    return Explanation(log, plan, values, rows, rows[-1].logged_bytes, capacity(plan, plan.answer.num_blocks), from_logged,
                       span, None if from_logged is None else not mismatches, tuple(mismatches), tuple(notes))


def measured_terms(ex: Explanation) -> dict[str, int]:
    """The terms the log measured, per GPU (bytes), as printed."""
    return {f"{row.name}_bytes": row.logged_bytes for row in ex.terms if row.name in TERMS and row.logged_bytes is not None}


PRINT_HALF_STEP_BYTES = round(0.005 * GiB)  # a GiB figure printed with 2 decimals is exact to +- this
_ABSORBING = ("overhead_bytes", "activation_bytes", "weights_bytes", "cudagraph_bytes")  # which printed term takes the rounding
_IMPLIED = ("activation_bytes", "overhead_bytes", "weights_bytes")  # which unprinted term the log's KV budget implies


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
      the first unprinted of activation, overhead, weights takes (the other unprinted terms stay kvplan's estimates).
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
    implied = [k for k in _IMPLIED if k in unmeasured]
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
    terms of :func:`calibration_terms`; ``source`` names the log. Raises InputError when the log measured no term."""
    from kvplan.io.calibration import Entry

    terms, note = calibration_terms(ex)
    if not terms:
        raise InputError("the log prints no budget terms to calibrate with (weights, activation, non-torch)",
                         "a DEBUG log (VLLM_LOGGING_LEVEL=DEBUG) prints all of them")
    p = ex.plan
    return Entry(p.spec.model_id, p.gpu.name, p.gpu.memory_bytes, p.engine.engine, p.engine.version, p.options.tp,
                 p.options.pp, p.model_dtype, p.engine.max_num_batched_tokens, p.engine.max_num_seqs,
                 tuple(sorted(terms.items())), engine_version=ex.log.version or p.engine.requested_version,
                 source=source, note=note)


__all__ = ["Explanation", "TermRow", "Capacity", "ExplainError", "explain", "log_values", "capacity", "measured_terms",
           "calibration_terms", "calibration_entry"]
