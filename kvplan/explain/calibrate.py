"""The calibration entry a reconciled start-up log writes (kvplan explain --calibrate): its measured terms, fitted to
the engine's block count.
"""

from __future__ import annotations

from typing import Any

from kvplan.errors import InputError
from kvplan.explain.account import TERMS, Explanation, account
from kvplan.explain.facts import PRINT_HALF_STEP_BYTES
from kvplan.units import GiB, plural


def measured_terms(ex: Explanation) -> dict[str, int]:
    """The terms the log measured, per GPU (bytes), as printed."""
    return {f"{row.name}_bytes": row.logged_bytes for row in ex.terms if row.name in TERMS and row.logged_bytes is not None}


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
