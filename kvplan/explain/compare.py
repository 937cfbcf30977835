"""The log beside kvplan's plan: the budget term by term, the capacity each block count prints, the block count the
logged budget allows, and the one-line diagnosis from those same objects (the last step of
kvplan.explain.reconcile).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from kvplan.explain.account import UNPRINTED, Capacity, Explanation, TermRow, account
from kvplan.explain.facts import (
    IMPLIED,
    PRINT_HALF_STEP_BYTES,
    _b,
    _cudagraph,
    _logged_terms,
    _requested,
    implied_kv_bytes,
    logged_kv_bytes,
)
from kvplan.explain.printed import printed_interval
from kvplan.explain.startup_log import StartupLog
from kvplan.units import GiB, MiB, plural


def _unprinted(log: StartupLog, terms: list[TermRow], requested: int, kv: int, b: Any) -> list[TermRow]:
    """The row of what the budget subtracts but no line prints (``requested``, ``kv``: the log's, bytes per GPU;
    ``b``: the plan's budget when the GPU is known), or none when every term is printed and they add up."""
    sglang = account(log.engine).measures_free_memory
    printed = [row for row in terms if row.logged_bytes is not None]
    # what the budget subtracts but no line prints (SGLang's graphs live outside its budget: not missing)
    missing = [row for row in terms if row.logged_bytes is None and not (sglang and row.name == "cudagraph")]
    rest = requested - sum(row.logged_bytes for row in printed) - kv
    if not missing and abs(rest) <= 0.02 * GiB:
        return []
    words = ", ".join(row.name for row in missing) if missing else (
        f"the Mamba state pool of {log.sglang_mamba_slots:,} request slots (a hybrid's state layers)"
        if log.sglang_mamba_slots else "rounding of the printed terms")
    kvplan_rest = (sum(row.kvplan_bytes for row in missing) if missing and b is not None
                   and all(row.kvplan_bytes is not None for row in missing) else (b.state_pool_bytes if not missing
                                                                                and b is not None else None))
    return [TermRow(UNPRINTED, rest, kvplan_rest, f"requested - printed terms - KV budget: {words}")]


def _charges_consumed(log: StartupLog, plan: Any) -> bool:
    """Whether the plan's vLLM release charges consumed memory (0.27+: the buffers still allocated after the profile
    run are in the overhead beside the non-torch memory)."""
    if plan is None or account(log.engine).measures_free_memory or log.is_cpu:  # SGLang's budget is another form
        return False
    from kvplan.engines.vllm_releases import profile

    return profile(plan.engine.version).measure == "consumed"


def _term_rows(log: StartupLog, plan: Any, gpu_known: bool) -> tuple[TermRow, ...]:
    """The budget per GPU, term by term: the log's (as printed; derived where noted) and kvplan's."""
    logged = _logged_terms(log)
    # with pipeline stages the log's terms are rank 0's, the first stage's (the plan's own budget is the stage with
    # the fewest blocks)
    b = (plan.stages[0].budget if plan.stages else plan.budget) if plan is not None else None
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
    folded = log.activation_holds_graphs and b is not None  # 0.27+: kvplan's graphs shown in its activation row
    for name in acc.terms:
        term = getattr(b, name) if b is not None else None
        mine = term and term.bytes
        if folded and name in ("activation", "cudagraph"):
            mine = b.activation.bytes + b.cudagraph.bytes if name == "activation" else 0
        note = {"weights": (("Load weight end: mem usage" if log.weights_gib is not None else
                             "avail mem before - after loading the weights") if sglang else
                            "\"Model loading took\": the checkpoint + what the load builds (the rotary cache)"),
                "overhead": ("consumed (weights + non-torch) - weights" if log.consumed_gib is not None
                             and log.non_torch_gib is None and log.weights_gib is not None
                             else "non-torch memory" + (" + what stays allocated after the profile run (0.27+)"
                                                         if _charges_consumed(log, plan) else "")) + _fullest_rank(b),
                "activation": ("the transient torch peak + the CUDA-graph estimate (kvplan's: both)" if folded
                               else ""),
                "cudagraph": _cudagraph(log)[1]}.get(name, "")
        rows.append(TermRow(name, logged[name], own(mine), note))
    kv = logged_kv_bytes(log)
    implied = implied_kv_bytes(log, plan)
    if requested is not None and kv is not None:
        rows += _unprinted(log, rows[2:], requested, kv, b if gpu_known else None)
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
                                        or log.explicit_kv_gib is not None else "available KV cache memory"
                                        + _fullest_rank(b))))
    return tuple(rows)


def _fullest_rank(b: Any) -> str:
    """A note where kvplan's figure is the pool's fullest rank's and the log's rank 0's (vLLM above 2 NVLink ranks:
    ``Budget.first_rank_gap_bytes``), else empty."""
    gap = b.first_rank_gap_bytes if b is not None else 0
    return (f"; kvplan's is the pool's fullest rank, {gap / MiB:,.0f} MiB of NCCL send buffers more than rank 0, "
            "whose lines the log prints") if gap else ""


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

    log, plan = ex.log, ex.plan
    sglang = _free_memory_doubt(ex)
    if sglang is not None:
        return sglang
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
    near = min(_log_vendor_cards(ex), key=lambda g: abs(g.memory_bytes - implied), default=None)
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


def _free_memory_doubt(ex: Explanation) -> str | None:
    """SGLang prints no total, but its free memory before loading: more than the planned GPU's whole total means the
    GPU is not the log's. The clause naming the smallest catalogue card that holds that free memory; else ``None``."""

    log, plan = ex.log, ex.plan
    free = getattr(log, "sglang_avail_before_load_gib", None)
    if plan is None or not free or plan.gpu.is_cpu or not plan.budget.total_bytes:
        return None
    free_bytes = round(free * GiB)
    if free_bytes <= plan.budget.total_bytes + GPU_DOUBT_BYTES:
        return None
    near = min((g for g in _log_vendor_cards(ex) if g.memory_bytes >= free_bytes), key=lambda g: g.memory_bytes,
               default=None)
    said = (f"the log's free memory before loading ({free:.2f} GiB per GPU) exceeds {plan.gpu.name}'s whole "
            f"{plan.budget.total_bytes / GiB:.2f} GiB")
    guess = (f"; the smallest card that holds it is {near.name} ({near.memory_bytes / GiB:.2f} GiB): pass --gpu "
             f"{near.name}" if near is not None else " (pass --gpu-memory)")
    return f"the GPU looks wrong: {said}{guess}"


def _log_vendor_cards(ex: Explanation) -> list:
    """The catalogue's GPUs (with a memory size, not the CPU target) of the log's vendor: its platform's, else the
    planned GPU's."""
    from kvplan.gpus import load_gpus

    log = ex.log
    vendor = "amd" if log.platform == "rocm" else ("nvidia" if log.platform == "cuda" else ex.plan.gpu.vendor)
    return [g for g in load_gpus() if g.memory_bytes and not g.is_cpu and g.vendor == vendor]
