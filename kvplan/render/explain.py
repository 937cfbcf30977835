"""``kvplan explain``: the reconciliation as a terminal table and as the ``--json`` document."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvplan.units import GiB, plural

if TYPE_CHECKING:
    from kvplan.explain.reconcile import Capacity, Explanation

RULES = {"blocks": "num_blocks x block_size", "groups": "num_blocks // num_groups x block_size",
         "concurrency": "int(max_concurrency x max_model_len)"}


def _gib(n: int | None) -> float | None:
    return None if n is None else round(n / GiB, 2)


def _cap(cap: "Capacity | None") -> dict[str, Any] | None:
    if cap is None:
        return None
    return {"num_blocks": cap.num_blocks, "kv_cache_tokens": cap.kv_cache_tokens,
            "max_concurrency": round(cap.max_concurrency, 4), "starts": cap.starts,
            "longest_startable_len": cap.longest_startable_len}


def explanation_to_dict(ex: "Explanation") -> dict[str, Any]:
    """The ``--json`` document: ``log`` (every parsed field), ``planned`` (what kvplan planned),
    ``reconciled`` (per term logged / kvplan / difference in bytes; the capacity from the logged terms
    and from kvplan's), ``notes``."""
    p, log = ex.plan, ex.log
    terms = {row.name: {"logged_bytes": row.logged_bytes, "kvplan_bytes": row.kvplan_bytes,
                        "difference_bytes": row.difference_bytes, "logged_gib": _gib(row.logged_bytes),
                        "kvplan_gib": _gib(row.kvplan_bytes), "difference_gib": _gib(row.difference_bytes),
                        "note": row.note} for row in ex.terms}
    logged, own = _cap(ex.from_logged), _cap(ex.from_kvplan)
    refusal = log.refusal
    return {
        "schema_version": 1,
        "log": log.to_dict(),
        "planned": {"model": p.spec.model_id, "source": p.source, "gpu": p.gpu.name, "gpu_memory_bytes": p.gpu.memory_bytes,
                    "engine": p.engine.engine, "engine_release": p.engine.version, "engine_releases": p.engine.release_range,
                    "token_rule": p.engine.kv_tokens_rule, "tp": p.options.tp, "pp": p.options.pp, "dtype": p.model_dtype,
                    "kv_dtype": p.kv_dtype, "block_size": p.layout.block_size, "max_model_len": p.max_model_len,
                    "gpu_util": p.budget.gpu_util, "max_num_batched_tokens": p.engine.max_num_batched_tokens,
                    "max_num_seqs": p.engine.max_num_seqs, "kv_groups": len(p.layout.groups),
                    "block_bytes": p.layout.block_bytes},
        "reconciled": {
            "terms": terms,
            "logged_blocks": list(ex.logged_blocks) if ex.logged_blocks else None,
            "num_blocks": {"log": log.num_gpu_blocks, "from_logged_terms": logged and logged["num_blocks"],
                           "from_kvplan_terms": own["num_blocks"]},
            "kv_cache_tokens": {"log": log.kv_cache_tokens, "from_logged_terms": logged and logged["kv_cache_tokens"],
                                "from_kvplan_terms": own["kv_cache_tokens"]},
            "max_concurrency": {"log": log.max_concurrency, "from_logged_terms": logged and logged["max_concurrency"],
                                "from_kvplan_terms": own["max_concurrency"]},
            "longest_startable_len": {"log": refusal.estimated_max_model_len if refusal else None,
                                      "from_logged_terms": logged and logged["longest_startable_len"],
                                      "from_kvplan_terms": own["longest_startable_len"]},
            "starts": {"log": log.starts, "from_logged_terms": logged and logged["starts"],
                       "from_kvplan_terms": own["starts"], "log_reason": log.not_started,
                       "kvplan_reason": p.answer.refusal},
            "kv_cache_tokens_from_logged_terms": logged and logged["kv_cache_tokens"],
            "kv_cache_tokens_from_kvplan_terms": own["kv_cache_tokens"],
            "max_concurrency_from_logged_terms": logged and logged["max_concurrency"],
            "max_concurrency_from_kvplan_terms": own["max_concurrency"],
            "matches_log": ex.matches,
            "mismatches": list(ex.mismatches),
        },
        "notes": list(ex.notes) + list(p.notes),
    }


def _fmt_gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:,.2f}"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.2f}x"
    return f"{value:,}"


def _start_verdict(ex: "Explanation"):  # noqa: ANN202 - a rich Text
    """One line when the log shows the engine did not start: why, and kvplan's own start verdict beside it."""
    from rich.text import Text

    text = Text()
    if ex.log.starts is not False:
        return text
    own, answer = ex.from_kvplan, ex.plan.answer
    text.append(f"the engine did not start: {ex.log.not_started}", style="bold red")
    if own.starts:
        text.append(f"; kvplan's own terms start it with {plural(own.num_blocks, 'block')} ({plural(own.kv_cache_tokens, 'token')}): "
                    "kvplan's plan is more optimistic than this deployment\n")
    else:
        text.append(f"; kvplan's own terms do not start it either ({answer.refusal})\n")
    return text


def render_explanation(ex: "Explanation"):  # noqa: ANN201 - a rich renderable
    """The terms table (GiB), the capacity table, the verdict and the notes."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    p, log = ex.plan, ex.log
    head = Text()
    head.append(f"{p.spec.model_id} on {p.options.gpu_count}x {p.gpu.name}", style="bold")
    head.append(f" - {p.engine.label} (rules of {p.engine.engine} {p.engine.release_range or p.engine.version}), "
                f"tp {p.options.tp}, pp {p.options.pp}, {p.model_dtype}, KV {p.kv_dtype}, max_model_len "
                f"{p.max_model_len:,}, util {p.budget.gpu_util:g}")
    terms = Table(title="budget per GPU (GiB)", title_justify="left")
    for col in ("term", "logged", "kvplan", "kvplan - logged", ""):
        terms.add_column(col, justify="right" if col in ("logged", "kvplan", "kvplan - logged") else "left")
    for row in ex.terms:
        diff = row.difference_bytes
        style = "" if diff is None or abs(diff) < 0.1 * GiB else "yellow"
        terms.add_row(row.name, _fmt_gib(row.logged_bytes), _fmt_gib(row.kvplan_bytes),
                      Text("-" if diff is None else f"{diff / GiB:+,.2f}", style=style), Text(row.note, style="grey62"))
    cap = Table(title="capacity", title_justify="left")
    for col in ("", "log", "from the logged terms", "from kvplan's terms"):
        cap.add_column(col, justify="left" if not col else "right")
    lg, own = ex.from_logged, ex.from_kvplan
    cap.add_row("blocks", _fmt(log.num_gpu_blocks), _fmt(lg and lg.num_blocks), _fmt(own.num_blocks))
    cap.add_row("KV cache tokens", _fmt(log.kv_cache_tokens), _fmt(lg and lg.kv_cache_tokens), _fmt(own.kv_cache_tokens))
    cap.add_row(f"max concurrency at {p.max_model_len:,}", _fmt(log.max_concurrency),
                _fmt(lg and lg.max_concurrency), _fmt(own.max_concurrency))
    cap.add_row("starts", _fmt(log.starts), _fmt(lg and lg.starts), _fmt(own.starts))
    if log.refusal is not None:
        cap.add_row("longest max_model_len", _fmt(log.refusal.estimated_max_model_len),
                    _fmt(lg and lg.longest_startable_len), _fmt(own.longest_startable_len))
    verdict = _start_verdict(ex)
    rule = RULES.get(p.engine.kv_tokens_rule, p.engine.kv_tokens_rule)
    if ex.matches:
        span = ex.logged_blocks
        which = "" if not span or span[0] == span[1] else f" (the logged budget allows {span[0]:,} - {plural(span[1], 'block')})"
        verdict.append("the logged terms reproduce every capacity line of the log exactly" if ex.log.starts is not False
                       else "the logged terms reproduce the log: the engine does not start with them", style="bold green")
        verdict.append(f"{which}; token line: {rule}\n")
    elif ex.matches is False:
        verdict.append("the logged terms do not reproduce the log: ", style="bold red")
        verdict.append("; ".join(ex.mismatches) + f" (token line modelled as {rule})\n")
    else:
        verdict.append("the log prints no KV budget, blocks or tokens to check the block rules against\n")
    notes = Text()
    for line in log.warnings[:5]:  # whole: the console wraps it at word boundaries, never cuts it
        notes.append(f"! log: {line}\n", style="yellow")
    for note in list(ex.notes) + list(p.notes):
        notes.append(f"· {note}\n", style="grey62")
    return Group(head, terms, cap, verdict, notes)
