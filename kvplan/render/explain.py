"""``kvplan explain``: the reconciliation as a terminal table and as the ``--json`` document; many logs as one table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from kvplan.units import GiB, plural

if TYPE_CHECKING:
    from kvplan.explain.many import LogResult
    from kvplan.explain.account import Capacity, Explanation

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


def _planned(ex: "Explanation") -> dict[str, Any] | None:
    p = ex.plan
    if p is None:
        return None
    return {"model": p.spec.model_id, "source": p.source, "gpu": p.gpu.name if ex.gpu_known else None,
            "gpu_memory_bytes": p.gpu.memory_bytes if ex.gpu_known else None, "engine": p.engine.engine,
            "engine_release": p.engine.version, "engine_releases": p.engine.release_range,
            "token_rule": p.engine.kv_tokens_rule, "tp": p.options.tp, "pp": p.options.pp, "dtype": p.model_dtype,
            "kv_dtype": p.kv_dtype, "block_size": p.layout.block_size, "max_model_len": p.max_model_len,
            "gpu_util": p.budget.gpu_util, "max_num_batched_tokens": p.engine.max_num_batched_tokens,
            "max_num_seqs": p.engine.max_num_seqs, "kv_groups": len(p.layout.groups),
            "block_bytes": p.layout.block_bytes}


def explanation_to_dict(ex: "Explanation") -> dict[str, Any]:
    """The ``--json`` document: ``log`` (every parsed field), ``planned`` (what kvplan planned; ``null`` when it
    could not load the model), ``reconciled`` (per term logged / kvplan / difference in bytes; the capacity from the
    logged terms and from kvplan's), ``diagnosis``, ``needs`` (what the comparison lacks), ``notes``."""
    log = ex.log
    terms = {row.name: {"logged_bytes": row.logged_bytes, "kvplan_bytes": row.kvplan_bytes,
                        "difference_bytes": row.difference_bytes, "logged_gib": _gib(row.logged_bytes),
                        "kvplan_gib": _gib(row.kvplan_bytes), "difference_gib": _gib(row.difference_bytes),
                        "note": row.note} for row in ex.terms}
    logged, own = _cap(ex.from_logged), _cap(ex.from_kvplan)

    def pick(cap: dict[str, Any] | None, key: str) -> Any:
        return None if cap is None else cap[key]

    refusal = log.refusal
    return {
        "schema_version": 1,
        "log": log.to_dict(),
        "planned": _planned(ex),
        "reconciled": {
            "terms": terms,
            "logged_blocks": list(ex.logged_blocks) if ex.logged_blocks else None,
            "num_blocks": {"log": log.num_gpu_blocks, "from_logged_terms": pick(logged, "num_blocks"),
                           "from_kvplan_terms": pick(own, "num_blocks")},
            "kv_cache_tokens": {"log": log.kv_cache_tokens, "from_logged_terms": pick(logged, "kv_cache_tokens"),
                                "from_kvplan_terms": pick(own, "kv_cache_tokens")},
            "max_concurrency": {"log": log.max_concurrency, "from_logged_terms": pick(logged, "max_concurrency"),
                                "from_kvplan_terms": pick(own, "max_concurrency")},
            "longest_startable_len": {"log": refusal.estimated_max_model_len if refusal else None,
                                      "from_logged_terms": pick(logged, "longest_startable_len"),
                                      "from_kvplan_terms": pick(own, "longest_startable_len")},
            "starts": {"log": log.starts, "from_logged_terms": pick(logged, "starts"),
                       "from_kvplan_terms": pick(own, "starts"), "log_reason": log.not_started,
                       "kvplan_reason": ex.plan.answer.refusal if own is not None else None},
            "kv_cache_tokens_from_logged_terms": pick(logged, "kv_cache_tokens"),
            "kv_cache_tokens_from_kvplan_terms": pick(own, "kv_cache_tokens"),
            "max_concurrency_from_logged_terms": pick(logged, "max_concurrency"),
            "max_concurrency_from_kvplan_terms": pick(own, "max_concurrency"),
            "matches_log": ex.matches,
            "mismatches": list(ex.mismatches),
        },
        "diagnosis": ex.diagnosis,
        "needs": list(ex.needs),
        "notes": _notes(ex),
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


def _head(ex: "Explanation"):  # noqa: ANN202 - a rich Text
    from rich.text import Text

    p, log = ex.plan, ex.log
    head = Text()
    if p is not None:
        gpu = f"{p.options.gpu_count}x {p.gpu.name}" if ex.gpu_known else "a GPU the log does not name"
        head.append(f"{p.spec.model_id} on {gpu}", style="bold")
        # without the GPU the plan's utilisation follows a stand-in size (SGLang derives it from the GPU): only the log's
        util = (f", util {p.budget.gpu_util:g}" if ex.gpu_known or log.gpu_memory_utilization is not None else "")
        head.append(f" - {p.engine.label} (rules of {p.engine.engine} {p.engine.release_range or p.engine.version}), "
                    f"tp {p.options.tp}, pp {p.options.pp}, {p.model_dtype}, KV {p.kv_dtype}, max_model_len "
                    f"{p.max_model_len:,}{util}")
        return head
    from kvplan.explain.account import account

    engine = account(ex.engine).label
    head.append(f"{log.model or 'a model the log does not name'}", style="bold")
    said = [f"{engine} {log.version}" if log.version else f"{engine} (version not printed)"]
    said += [f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in
             (("tp", log.tp), ("pp", log.pp), ("max_model_len", log.max_model_len),
              ("util", log.gpu_memory_utilization), ("block size", log.engine_block_size or log.block_size))
             if v is not None]
    head.append(" - " + ", ".join(said) + " (as the log says)")
    return head


def _notes(ex: "Explanation") -> list[str]:
    """The explanation's notes and the plan's (the plan's release note left out when the explanation names the
    release it inferred)."""
    inferred = any(n.startswith("version not in the log: its lines are") for n in ex.notes)
    plan = [n for n in (ex.plan.notes if ex.plan is not None else ()) if not (inferred and ": rules of modelled" in n)]
    if ex.plan is not None and not ex.gpu_known:  # the plan budgets a stand-in size: its budget's notes are not the log's
        plan = [n for n in plan if n not in ex.plan.budget.notes and not n.startswith(("--gpu-memory:",
                                                                                      "no memory left for the KV cache"))]
    return list(ex.notes) + plan


def _terms_table(ex: "Explanation"):  # noqa: ANN202 - a rich renderable
    """The budget per GPU, term by term (GiB): the log's, and kvplan's where it has its own terms."""
    from rich.table import Table
    from rich.text import Text

    p = ex.plan
    own_terms = p is not None and ex.gpu_known
    terms = Table(title="budget per GPU (GiB)", title_justify="left")
    cols = ("term", "logged", "kvplan", "kvplan - logged", "") if own_terms else ("term", "logged", "")
    for col in cols:
        terms.add_column(col, justify="right" if col in ("logged", "kvplan", "kvplan - logged") else "left")
    shown = 0
    for row in ex.terms:
        if row.logged_bytes is None and (row.kvplan_bytes is None or not own_terms):
            continue
        shown += 1
        diff = row.difference_bytes
        style = "" if diff is None or abs(diff) < 0.1 * GiB else "yellow"
        note = Text(row.note, style="grey62")
        if own_terms:
            terms.add_row(row.name, _fmt_gib(row.logged_bytes), _fmt_gib(row.kvplan_bytes),
                          Text("-" if diff is None else f"{diff / GiB:+,.2f}", style=style), note)
        else:
            terms.add_row(row.name, _fmt_gib(row.logged_bytes), note)
    if not shown:  # nothing to tabulate: say why in one line instead of an empty table
        why = ("the log prints none of them" + ("" if p is not None else
                                                 ", and kvplan has no plan of its own to set beside them (the model: "
                                                 "pass --model)"))
        return Text(f"budget per GPU: no term to show: {why}", style="yellow")
    return terms


def _capacity_table(ex: "Explanation"):  # noqa: ANN202 - a rich Table
    """What the log prints of its capacity beside what the logged terms and kvplan's own terms give."""
    from rich.table import Table

    p, log = ex.plan, ex.log
    lg, own = ex.from_logged, ex.from_kvplan
    cap = Table(title="capacity", title_justify="left")
    columns = [("log", None)] + ([("from the logged terms", lg)] if p is not None else []) + (
        [("from kvplan's terms", own)] if own is not None else [])
    cap.add_column("", justify="left")
    for name, _ in columns:
        cap.add_column(name, justify="right")

    def line(label: str, from_log: Any, key: str) -> None:
        cap.add_row(label, _fmt(from_log), *(_fmt(getattr(c, key) if c is not None else None) for _, c in columns[1:]))

    length = p.max_model_len if p is not None else (log.concurrency_len or log.max_model_len)
    line("blocks", log.num_gpu_blocks, "num_blocks")
    line("KV cache tokens", log.kv_cache_tokens, "kv_cache_tokens")
    line(f"max concurrency at {length:,}" if length else "max concurrency", log.max_concurrency, "max_concurrency")
    line("starts", log.starts, "starts")
    slots = p.engine.state_slots if p is not None and own is not None else None
    if log.sglang_mamba_slots is not None or slots:  # SGLang's Mamba state pool (request slots)
        cap.add_row("Mamba state slots", _fmt(log.sglang_mamba_slots),
                    *(_fmt(slots) if c is own else "-" for _, c in columns[1:]))
    if log.refusal is not None:
        line("longest max_model_len", log.refusal.estimated_max_model_len, "longest_startable_len")
    return cap


def _verdict(ex: "Explanation"):  # noqa: ANN202 - a rich Text
    """The diagnosis, whether the logged terms reproduce the log's capacity lines, and what the comparison needs."""
    from rich.text import Text

    p, log = ex.plan, ex.log
    verdict = Text()
    if ex.diagnosis:
        verdict.append(ex.diagnosis + "\n", style="bold")
    if p is not None:
        rule = RULES.get(p.engine.kv_tokens_rule, p.engine.kv_tokens_rule)
        from kvplan.explain.compare import prints_capacity_lines
        from kvplan.explain.facts import IMPLIED

        kv_row = ex.term("kv_budget")
        if ex.matches and kv_row is not None and kv_row.note.startswith(IMPLIED):
            verdict.append(f"the log prints {plural(log.kv_cache_tokens, 'token')} (max_total_num_tokens) but no KV "
                           "size: the logged budget is what they take at kvplan's cell size", style="green")
            verdict.append(f"; token line: {rule}\n")
        elif ex.matches and not prints_capacity_lines(log):
            verdict.append("the logged budget " + ("starts the engine, as the log shows" if log.starts is not False
                                                   else "does not start the engine either"), style="green")
            verdict.append(f" (the log prints no block, token or concurrency line to check further); token line: {rule}\n")
        elif ex.matches:
            span = ex.logged_blocks
            which = "" if not span or span[0] == span[1] else f" (the logged budget allows {span[0]:,} - {plural(span[1], 'block')})"
            verdict.append("the logged terms reproduce every capacity line of the log exactly" if log.starts is not False
                           else "the logged terms reproduce the log: the engine does not start with them", style="bold green")
            verdict.append(f"{which}; token line: {rule}\n")
        elif ex.matches is False:
            verdict.append("the logged terms do not reproduce the log: ", style="bold red")
            verdict.append("; ".join(ex.mismatches) + f" (token line modelled as {rule})\n")
        else:
            verdict.append("the log prints no KV budget, blocks or tokens to check the block rules against\n")
    for need in ex.needs if p is None else ():  # with a plan, the diagnosis says what the comparison still needs
        verdict.append(f"{need}\n", style="yellow")
    return verdict


def render_explanation(ex: "Explanation"):  # noqa: ANN201 - a rich renderable
    """The terms table (GiB), the capacity table, the diagnosis, the verdict and the notes."""
    from rich.console import Group
    from rich.text import Text

    notes = Text()
    for warning in ex.log.warnings[:5]:  # whole: the console wraps it at word boundaries, never cuts it
        notes.append(f"! log: {warning}\n", style="yellow")
    for note in _notes(ex):
        notes.append(f"· {note}\n", style="grey62")
    return Group(_head(ex), _terms_table(ex), _capacity_table(ex), _verdict(ex), notes)


# ---------------------------------------------------------------------------------------------
# many logs


def _row_values(r: "LogResult") -> dict[str, Any]:
    ex = r.explanation
    if ex is None:
        return {"log": r.name, "error": r.error}
    log, p = ex.log, ex.plan
    gpu = (p.gpu.name if p is not None and ex.gpu_known and p.gpu.name != "custom" else
           f"{log.total_memory_gib} GiB" if log.total_memory_gib else None)
    from kvplan.explain.account import account
    from kvplan.explain.compare import biggest_term

    engine = account(ex.engine).label + (f" {log.version}" if log.version else "")
    release = p.engine.version if p is not None else None
    own = ex.from_kvplan.kv_cache_tokens if ex.from_kvplan is not None else None
    logged = log.kv_cache_tokens
    block = p.layout.block_size if p is not None else (log.engine_block_size or log.block_size)
    if logged is None and ex.matches and ex.from_logged is not None:  # the tokens the log's own budget gives
        logged = ex.from_logged.kv_cache_tokens
    elif logged is None and log.num_gpu_blocks is not None and block:  # V0: the pool in blocks
        logged = log.num_gpu_blocks * block
    kv = ex.term("kv_budget")
    gap = kv.difference_bytes if kv is not None else None
    big = biggest_term(ex)
    return {"log": r.name, "model": ex.model, "gpu": gpu, "engine": engine, "release": release,
            "logged_tokens": logged, "logged_blocks": log.num_gpu_blocks, "kvplan_tokens": own,
            "error_pct": None if own is None or not logged else round((own - logged) / logged * 100, 2),
            "kv_gap_bytes": gap, "biggest_term": big[0] if big else None, "biggest_term_bytes": big[1] if big else None,
            "reproduced": ex.matches, "starts": log.starts, "diagnosis": ex.diagnosis, "needs": list(ex.needs)}


def many_to_dict(results: "Sequence[LogResult]", calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """``--json`` for many logs: one row per log (``explanations`` holds each log's full document)."""
    from kvplan.render import explain as this

    out: dict[str, Any] = {
        "schema_version": 1,
        "rows": [_row_values(r) for r in results],
        "explanations": {r.name: this.explanation_to_dict(r.explanation) for r in results if r.explanation is not None},
        "summary": summary(results),
    }
    if calibration is not None:
        out["calibration"] = calibration
    return out


def summary(results: "Sequence[LogResult]") -> dict[str, int]:
    """How many logs were read, reproduced, compared (with kvplan's own terms), refused as bad input."""
    read = [r.explanation for r in results if r.explanation is not None]
    return {"logs": len(results), "read": len(read), "bad_input": len(results) - len(read),
            "reproduced": sum(1 for ex in read if ex.matches), "not_reproduced": sum(1 for ex in read if ex.matches is False),
            "compared": sum(1 for ex in read if ex.from_kvplan is not None)}


MANY_COLUMNS = ("log", "model", "GPU", "engine", "log tokens", "kvplan (error)", "biggest term (GiB)")


def many_rows(results: "Sequence[LogResult]") -> list[tuple[str, ...]]:
    """The cells of the many-logs table, one tuple per log (:data:`MANY_COLUMNS`; a log that could not be read:
    its name and the error)."""
    rows: list[tuple[str, ...]] = []
    for r in results:
        v = _row_values(r)
        if r.explanation is None:
            rows.append((Path(v["log"]).name, v["error"], "", "", "", "", ""))
            continue
        log = r.explanation.log
        engine = v["engine"] if log.version else v["engine"] + (f" ({v['release']} rules)" if v["release"] else "")
        own = "-" if v["kvplan_tokens"] is None else f"{v['kvplan_tokens']:,}" + (
            f" ({v['error_pct']:+.1f}%)" if v["error_pct"] is not None else "")
        if log.starts is False:
            own = "did not start" if own == "-" else own
        big = "-" if v["biggest_term"] is None else f"{v['biggest_term']} {v['biggest_term_bytes'] / GiB:+.2f}"
        if v["kvplan_tokens"] is None and r.explanation.needs:
            big = "needs the GPU" if r.explanation.plan is not None else "needs the model"
        logged = _fmt(v["logged_tokens"]) if v["logged_tokens"] is not None or v["logged_blocks"] is None else \
            plural(v["logged_blocks"], "block")
        model = (v["model"] or "-").rstrip("/").rsplit("/", 1)[-1]  # the name: the org and the folder are in the log
        rows.append((Path(v["log"]).name, model, v["gpu"] or "-", engine, logged, own, big))
    return rows


def many_text(results: "Sequence[LogResult]") -> str:
    """The many-logs table as plain tab-separated lines (a header, one line per log, the summary), for a pipe or a
    file: every name whole on its line, whatever the width (``render_many`` is the terminal's)."""
    def clean(cell: str) -> str:
        return " ".join(cell.split())  # a tab or newline in a name or an error stays inside its cell

    lines = ["\t".join(MANY_COLUMNS)] + ["\t".join(clean(c) for c in row) for row in many_rows(results)]
    return "\n".join(lines) + "\n" + _many_foot(results) + "\n"


def render_many(results: "Sequence[LogResult]"):  # noqa: ANN201 - a rich renderable
    """One row per log: model, GPU, engine and release, logged vs kvplan tokens and the error, the biggest term."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{plural(len(results), 'log')}", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in MANY_COLUMNS:
        table.add_column(col, justify="right" if "tokens" in col or "kvplan" in col else "left", overflow="fold",
                         no_wrap="tokens" in col or "kvplan" in col)
    for r, row in zip(results, many_rows(results)):
        if r.explanation is None:
            table.add_row(row[0], Text(row[1], style="red"), *row[2:])
        else:
            table.add_row(*row)
    return Group(table, Text(_many_foot(results) + "\n"))


def _many_foot(results: "Sequence[LogResult]") -> str:
    s = summary(results)
    parts = [f"{s['read']} of {plural(s['logs'], 'log')} read", f"the logged terms reproduce {s['reproduced']} exactly"
             + (f" and not {s['not_reproduced']}" if s["not_reproduced"] else ""),
             f"kvplan's own terms compared on {s['compared']}"]
    if s["bad_input"]:
        parts.append(f"{s['bad_input']} not read (bad input)")
    return "; ".join(parts)
