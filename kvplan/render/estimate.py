"""The terminal rendering of a :class:`~kvplan.planning.plan.Plan` (``kvplan estimate``), readable at 80 columns.

Built of :mod:`kvplan.render.styled`'s text, panels and grids: rich renderables that
:func:`kvplan.render.styled.show` draws without importing rich where rich would print no colour."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.engines.registry import flag as engine_flag, setting_name
from kvplan.planning.answer import null_block_words
from kvplan.planning.weights import served_weights
from kvplan.planning.serialize import formula_lines
from kvplan.render.styled import Grid, Group, Panel, Text
from kvplan.units import GB, GiB, fmt_bytes, fmt_gib, parse_dtype, plural, rounded_parts

if TYPE_CHECKING:
    from kvplan.planning.plan import Plan


def _panel(body: object, title: str) -> Panel:
    """A panel titled at its left. The title is markup read without emoji codes (:class:`styled.Panel
    <kvplan.render.styled.Panel>`: rich would load its ~3,600 emoji names to look for ``:name:`` in titles that
    never hold one)."""
    return Panel(body, title)


def source_line(source: str) -> "Text | str":
    """The line above the panels, ``source: ...`` in grey62: console markup, as it was always printed (a source
    holding ``[`` or ``\\`` is read as markup by rich; any other is that text, drawn without rich)."""
    if "[" in source or "\\" in source:
        return f"[grey62]source: {source}[/]"
    return Text.assemble((f"source: {source}", "grey62"))


def _gib(n: int) -> str:
    return fmt_gib(n)


TERM_STYLES = {"weights": "magenta", "activation": "yellow", "overhead": "red", "cudagraph": "bright_red"}
LEGEND_WIDTH = 74  # the memory panel's width at 80 columns, less its borders
UNUSED = "unused"  # the legend's name for total - usable (the share gpu_util leaves out)
KV_BUDGET = "KV budget"
STATE_POOL = "state pool"  # an engine's own pool of per-request state slots (SGLang's Mamba pool), before the KV budget
HOST_USE = "host's use"  # on a unified-memory device: what the host takes of the free memory (Budget.host_bytes)


def memory_figures(plan: "Plan") -> dict[str, str]:
    """Every GiB figure of the memory panel, as its rows and the bar's legend print it (two decimals): the
    total, ``usable``, each budget term, the KV budget and what gpu_util leaves unused. The parts are rounded
    together so that they add up as printed (``total = usable + unused``; ``usable = terms + KV budget`` where
    the KV budget is what the terms leave: :func:`kvplan.units.rounded_parts`)."""
    b = plan.budget

    def centi(n: int) -> int:  # hundredths of a GiB, rounded half up, exactly
        return (200 * n + GiB) // (2 * GiB) if n >= 0 else -((200 * -n + GiB) // (2 * GiB))

    total, usable = centi(b.total_bytes), centi(b.usable_bytes)
    shown = {"total": total, "usable": usable, UNUSED: total - usable}
    extra = ([(STATE_POOL, b.state_pool_bytes)] if b.state_slots else []) + \
        ([(HOST_USE, b.host_bytes)] if b.host_bytes else [])
    terms = [t.bytes for t in b.terms] + [x for _, x in extra]
    if b.kv_budget_bytes >= 0 and min(terms, default=0) >= 0 and b.usable_bytes == sum(terms) + b.kv_budget_bytes:
        scaled = rounded_parts(b.usable_bytes * 100, [x * 100 for x in terms + [b.kv_budget_bytes]], GiB)
        assert sum(scaled) == usable
    else:  # an explicit or negative KV budget: each figure on its own
        scaled = [centi(x) for x in terms + [b.kv_budget_bytes]]
    shown.update({t.name: c for t, c in zip(b.terms, scaled)})
    shown.update({name: c for (name, _), c in zip(extra, scaled[len(b.terms):-1])})
    shown[KV_BUDGET] = scaled[-1]
    return {name: f"{c / 100:,.2f}" for name, c in shown.items()}


def bar_parts(plan: "Plan") -> list[tuple[str, int, str]]:
    """The memory bar's parts, ``(name, bytes, style)``: each budget term under its row's name, the KV budget,
    and what gpu_util leaves unused (total - usable); terms of 0 bytes are left out."""
    b = plan.budget
    parts = [(t.name, t.bytes, TERM_STYLES.get(t.name, "red")) for t in b.terms if t.bytes > 0]
    if b.state_pool_bytes > 0:
        parts.append((STATE_POOL, b.state_pool_bytes, "cyan"))
    if b.host_bytes > 0:
        parts.append((HOST_USE, b.host_bytes, "blue"))
    parts.append((KV_BUDGET, max(0, b.kv_budget_bytes), "green"))
    parts.append((UNUSED, max(0, b.total_bytes - b.usable_bytes), "grey42"))
    return parts


def memory_bar(plan: "Plan", width: int = 60) -> Text:
    """A one-line bar of the GPU's memory (:func:`bar_parts`) and its legend in GiB, each figure its row's
    (:func:`memory_figures`)."""
    total = plan.budget.total_bytes
    parts, figures = bar_parts(plan), memory_figures(plan)
    bar = Text()
    used = 0
    for i, (_, size, style) in enumerate(parts):
        cells = round(size / total * width) if total else 0
        if i == len(parts) - 1:
            cells = max(0, width - used)
        cells = max(0, min(cells, width - used))
        used += cells
        bar.append("█" * cells, style=style)
    legend, line = Text("  "), 2
    items = [(f"{name} {figures[name]}", style) for name, _, style in parts]
    for i, (item, style) in enumerate(items):
        item += " GiB" if i == len(items) - 1 else ""
        if line + len(item) + 2 > LEGEND_WIDTH:  # break between items, never inside one
            legend.append("\n  ")
            line = 2
        legend.append("■ ", style=style)
        legend.append(item + "  ")
        line += len(item) + 4
    legend.rstrip()
    return Text.assemble(bar, "\n", legend)


def render_plan(plan: "Plan") -> Group:
    """The estimate as rich renderables: the answer first, then how it follows (model, memory, engine report,
    paging, prefix, roofline)."""
    parts = [_answer_panel(plan), _model_panel(plan), _memory_panel(plan), _engine_panel(plan), _paging_panel(plan)]
    if plan.notes:
        parts.append(Text("\n".join(f"note: {n}" for n in plan.notes), style="yellow"))
    return Group(*parts)


def render_brief(plan: "Plan") -> Text:
    """``--brief``: what the engine will log about its KV cache, then the verdict (:func:`answer_lines`)."""
    return Text("\n").join(answer_lines(plan, brief=True))


def _model_panel(plan: "Plan") -> Panel:
    """What one token costs: the model's KV facts and the per-token formula on one GPU."""
    o, spec, prov = plan.options, plan.spec, plan.spec.provenance
    head = Text.assemble((spec.model_id, "bold"), "\n")
    full = next((layer for layer in spec.layers if layer.caches_tokens), None)
    facts = [spec.kind_summary, f"{plural(spec.num_layers, 'layer')}"]
    if full is not None:
        facts.append(f"kv_heads {full.kv_heads} ({prov.get('kv_heads', '?')})")
        facts.append(f"head_dim {full.head_dim} ({prov.get('head_dim', '?')})")
    facts.append(f"KV {plan.kv_dtype}")
    head.append(" · ".join(facts) + "\n")
    gpu_slice = f" per GPU (tp {o.tp}, pp {o.pp})" if o.tp * o.pp > 1 else ""
    head.append(f"per token{gpu_slice}:\n", style="bold")
    for line in formula_lines(plan.rank_layers, parse_dtype(plan.kv_dtype), parse_dtype(plan.model_dtype)):
        head.append(f"  {line}\n")
    head.append(f"  = {plan.kv_bytes_per_token_gpu:,} B/token ({fmt_bytes(plan.kv_bytes_per_token_gpu)})"
                f"; {fmt_bytes(plan.request_bytes)} per {o.context:,}-token request in {plan.engine.engine}'s pool"
                f"{_held_how(plan)}")
    return _panel(head, "model")


def _held_how(plan: "Plan") -> str:
    """How a windowed model's request is held: its windows (vLLM, SGLang's hybrid SWA pool) or every token in every
    layer (SGLang otherwise); "" for models without windows."""
    if not any(x.kind.value in ("sliding", "chunked") for x in plan.rank_layers):
        return ""
    if plan.engine.windows_full_length:
        return " (every layer holds every token: no window in this pool)"
    return " (windowed layers hold their window)"


def _total_row(plan: "Plan", shown: str) -> tuple[str, str, Text]:
    """The memory panel's first row: the catalogue's runtime-reported total, or the user's ``--gpu-memory`` labelled
    as given (beside the named GPU's own figure when it differs)."""
    b, gpu = plan.budget, plan.gpu
    if not plan.options.gpu_memory_bytes:
        return "total (runtime-reported)", f"{shown} GiB", Text(f"{gpu.name}, {b.total_bytes / GB:,.2f} GB")
    text = f"given, {b.total_bytes / GB:,.2f} GB"
    if plan.options.gpu:
        from kvplan.gpus import find_gpu

        named = find_gpu(plan.options.gpu).memory_bytes
        if named and named != b.total_bytes:
            text += f" (the {gpu.name} reports {named / GiB:,.2f} GiB)"
    return "total (--gpu-memory)", f"{shown} GiB", Text(text)


def _memory_panel(plan: "Plan") -> Panel:
    """The budget's terms, with the rounding the engine uses, and the memory bar (the CPU backend: its KV
    space and the weights beside it, :func:`_cpu_memory_panel`). Sources wrap; nothing is cut."""
    if plan.gpu.is_cpu:
        return _cpu_memory_panel(plan)
    b, shown = plan.budget, memory_figures(plan)
    t = _terms_table()
    t.add_row(*_total_row(plan, shown["total"]))
    util = setting_name(plan.engine.engine, "gpu_util")  # SGLang's mem_fraction_static; kvplan's own name for vLLM's
    util = "gpu_util" if util == "gpu_memory_utilization" else util
    t.add_row(f"usable (x {b.gpu_util:g})", f"{shown['usable']} GiB", Text(f"{b.requested_rounding}(total x {util})"))
    for term in b.terms:
        t.add_row(f"− {term.name}", f"{shown[term.name]} GiB", Text(term.source))  # Text: sources hold "[rows, vocab]"
    if b.state_slots:
        t.add_row(f"− {STATE_POOL}", f"{shown[STATE_POOL]} GiB",
                  Text(f"{b.state_slots:,} request slots of the state layers (Mamba pool), before the KV pool"))
    if b.host_bytes:
        t.add_row(f"− {HOST_USE}", f"{shown[HOST_USE]} GiB",
                  Text("unified memory: what the host takes of the memory the engine finds free, which kvplan cannot "
                       "know (the median of real start-up logs on unified memory; see the note)"))
    style = "bold green" if b.kv_budget_bytes > 0 else "bold red"
    t.add_row(Text(f"= {KV_BUDGET}", style=style), Text(f"{shown[KV_BUDGET]} GiB", style=style),
              Text(b.kv_budget_source))
    return _panel(Group(t, memory_bar(plan)), f"memory per GPU ({plan.options.gpu_count}x {plan.gpu.name})")


def _terms_table() -> Grid:
    """Three columns: what, GiB, where it came from (wrapped at word boundaries, never cut)."""
    t = Grid(padding=2)
    t.add_column(no_wrap=True)
    t.add_column(justify="right", no_wrap=True)
    t.add_column(style="grey62", overflow="fold", ratio=1)
    return t


def _cpu_memory_panel(plan: "Plan") -> Panel:
    """vLLM's CPU backend allocates its KV space (VLLM_CPU_KVCACHE_SPACE / --kv-budget) beside the weights in
    host memory: nothing is subtracted from it, so the panel adds the two instead."""
    b = plan.budget
    t = _terms_table()
    t.add_row(Text("KV cache space", style="bold green"), Text(_gib(b.kv_budget_bytes), style="bold green"),
              Text(b.kv_budget_source))
    t.add_row("+ weights", _gib(b.weights.bytes), Text(f"{b.weights.source} (host memory, beside the KV space)"))
    used = b.weights.bytes + max(0, b.kv_budget_bytes)
    host = plan.options.gpu_memory_bytes
    where = "weights + KV cache space; activations and the runtime come on top"
    if host:
        where += f"; {_gib(host)} of host memory given (--gpu-memory)" + (": it does not fit" if used > host else "")
    t.add_row("= host memory in use", _gib(used), Text(where))
    return _panel(t, f"memory ({plan.gpu.name}: vLLM's CPU backend)")


def _answer_panel(plan: "Plan") -> Panel:
    """The answer, first: KV tokens, requests at the context, max context at the batch, the verdict
    (:func:`answer_lines`)."""
    return _panel(Text("\n").join(answer_lines(plan)), "answer")


def answer_figures(plan: "Plan") -> dict[str, str]:
    """The answer's figures as every output prints them (the answer panel, ``--brief``, comparison rows): the
    KV budget, the engine's KV-token figure, requests of the context at once, the longest context at the batch,
    the verdict in a word, and the requests at the low and high end of kvplan's range ("" when they are the
    same). The one place to change how they are written."""
    a, rng = plan.answer, plan.kv_range
    spread = rng is not None and rng.low.max_requests != rng.high.max_requests
    return {"kv_budget": f"{max(0, plan.budget.kv_budget_bytes) / GiB:,.2f} GiB", "kv_tokens": f"{a.kv_tokens:,}",
            "requests": f"{a.max_requests:,}", "max_context": f"{a.max_context_at_batch:,}" if a.max_context_at_batch
            else "none", "fits": "fits" if a.fits else ("refused" if a.refusal else "does NOT fit"),
            "requests_range": f"{rng.low.max_requests:,} - {rng.high.max_requests:,}" if spread else ""}


def answer_lines(plan: "Plan", brief: bool = False) -> list[Text]:
    """The answer's lines, the one place its figures are written (the answer panel and ``--brief``).

    In full: the KV cache (the engine's token figure, its blocks), requests of the context running at once
    (and what binds), the longest context at the batch (and the max_model_len it holds for), the verdict.
    ``brief``: the lines the engine logs about its KV cache (vLLM: available KV memory, KV cache size,
    maximum concurrency), then the requests of the context running at once (the integer answer) and the verdict.
    """
    a, lay, figures = plan.answer, plan.layout, answer_figures(plan)
    kv_tokens = figures["kv_tokens"] + (" token" if a.kv_tokens == 1 else " tokens")
    requests = figures["requests"] + (f" ({figures['requests_range']})" if figures["requests_range"] else "") + (
        " concurrent request" if a.max_requests == 1 else " concurrent requests")
    lines: list[Text] = []
    at = Text.assemble((f"at {a.context:,} tokens/request: ", "bold"), (requests, "bold cyan"))
    if a.limited_by == "refused":
        at.append(f" ({plan.engine.engine} does not start" + (")" if brief else ": see engine)"))
    elif a.limited_by == "max_num_seqs":
        at.append(f" ({_seqs(plan)} {a.max_num_seqs:,} binds; the pool holds {plural(a.pool_requests, 'request')})")
    else:
        at.append(f" (the pool binds: {plural(a.blocks_per_request, 'block')} each; {_seqs(plan)} {a.max_num_seqs:,})")
    if brief:  # the engine's own lines, then the answer in whole requests (the integer) and the verdict
        if a.refusal:
            lines.append(Text.assemble((f"{plan.engine.label} will refuse to start: ", "bold red"), a.refusal))
        elif plan.launch.kv_cache_dtype is None:  # no --kv-cache-dtype for it: the engine logs nothing of this pool
            lines.append(Text(f"a what-if: {plan.engine.label} cannot run --kv-dtype {plan.kv_dtype}, so it logs no "
                              "such lines; kvplan's figures for that pool:", style="yellow"))
            lines += [Text(line) for line in plan.rules.log_lines(plan.launch)]
        else:
            lines += [Text(line) for line in plan.rules.log_lines(plan.launch)]
        lines += [at, _verdict(plan)]
        return lines
    kv = Text.assemble(("KV cache: ", "bold"), (kv_tokens, "bold cyan"))
    slots = f"{plural(a.num_blocks, 'block')} x {plural(lay.block_size, 'token')}"
    if a.kv_tokens != a.capacity_tokens:
        kv.append(f" as {plan.engine.engine} reports it ({slots} = {a.capacity_tokens:,} token slots")
    else:
        kv.append(f" ({slots}")
    groups = f", each one page in each of {len(lay.groups)} groups" if len(lay.groups) > 1 else ""
    kv.append(f", {fmt_bytes(lay.block_bytes)} per block{groups})")
    lines.append(kv)
    lines.append(at)
    spread = _range_line(plan)
    if spread:
        lines.append(Text(f"  {spread}", style="grey62"))
    shared = _shared_prefix_line(plan)
    if shared:
        lines.append(Text(f"  {shared}", style="grey62"))
    lines.append(_max_context_line(plan))
    lines.append(_verdict(plan))
    return lines


def _range_line(plan: "Plan") -> str | None:
    """kvplan's range (:attr:`Plan.kv_range`): the KV tokens and requests at the low and high end of the spread
    real start-ups of the class showed, and where the spread came from; None when the plan has none (the
    requests' range is also beside the requests: ``54 (52 - 55) concurrent requests``)."""
    rng = plan.kv_range
    if rng is None or rng.kv_budget_low_bytes == rng.kv_budget_high_bytes:
        return None
    lo, hi = rng.low, rng.high
    requests = (f"{lo.max_requests:,} - {plural(hi.max_requests, 'request')}" if lo.max_requests != hi.max_requests
                else f"{plural(lo.max_requests, 'request')} at either end")
    return f"range: {lo.kv_tokens:,} - {hi.kv_tokens:,} KV tokens, {requests} (KV budget {rng.summary})"


def _shared_prefix_line(plan: "Plan") -> str | None:
    """Whether the answer counts a shared prefix once: with prefix caching it does (and says what it gains),
    without it it does not (and says how to turn it on)."""
    a, o = plan.answer, plan.options
    if not o.prefix_tokens:
        return None
    prefix = f"{o.prefix_tokens:,}-token prefix"
    if a.shared_prefix_tokens:
        return (f"sharing a {prefix}, stored once ({plural(a.shared_blocks, 'block')}; prefix caching on): "
                f"{plural(a.unshared_requests, 'request')} without sharing")
    return f"a {prefix}, not shared: prefix caching is off (--prefix-caching shares it)"


def _seqs(plan: "Plan") -> str:
    """The engine's name for the limit on requests at once (``max_num_seqs``, SGLang's ``max_running_requests``)."""
    return setting_name(plan.engine.engine, "max_num_seqs")


def _len(plan: "Plan") -> str:
    """The engine's name for its length limit (``max_model_len``, SGLang's ``context_length``)."""
    return setting_name(plan.engine.engine, "max_model_len")


def _max_context_line(plan: "Plan") -> Text:
    """The longest context ``batch`` requests run at, and the max_model_len it holds for: the planned one when
    it caps it, else the one a launch needs (the launch line's is the context's)."""
    a, d = plan.answer, plan.deployment
    line = Text.assemble((f"max context at batch {a.batch:,}: ", "bold"))
    m, fixed = a.max_context_at_batch, plan.max_model_len_fixed
    if m < 1:
        line.append("none", style="bold red")
        if a.refusal and (fixed is not None or d.refusal(1)):
            line.append(f" ({plan.engine.engine} does not start)")
        elif a.batch > d.request_cap(fixed or max(1, a.longest_startable_len)):
            limit = d.request_limit(fixed or max(1, a.longest_startable_len))
            line.append(f" ({_seqs(plan)} {limit:,} runs at most {plural(limit, 'request')} at once)")
        else:
            line.append(f" (not one token each: {plural(a.batch, 'request')} need more than the pool's "
                        f"{plural(a.num_blocks, 'block')})")
        return line
    line.append(answer_figures(plan)["max_context"] + (" token" if m == 1 else " tokens"), style="bold cyan")
    if fixed is not None:
        if m == fixed:
            line.append(f" ({_len(plan)} {fixed:,} caps it)")
    elif m > plan.max_model_len:  # a flag the options accept with this --context (kvplan takes the engine's too)
        line.append(f" (needs {engine_flag(plan.engine.engine, 'max_model_len')} {m})")
    elif m < plan.max_model_len:
        line.append(f" (at {_len(plan)} {m:,})")
    return line


def _verdict(plan: "Plan") -> Text:
    """``32 x 8,192 tokens: fits (... spare)`` or ``does NOT fit (why); try ...``."""
    a, lay = plan.answer, plan.layout
    line = Text(f"{a.batch:,} x {plural(a.context, 'token')}: ")
    if a.fits:
        line.append("fits", style="bold green")
        # a block id spans a page in every group: with several groups its slots are not one request's tokens
        spare = plural(a.fits_margin_blocks * lay.block_size, "token slot" if len(lay.groups) > 1 else "token")
        if lay.block_size > 1:
            spare = f"{plural(a.fits_margin_blocks, 'block')} = {spare}"
        line.append(f" ({spare} spare" + (", the shared prefix stored once" if a.shared_prefix_tokens else "")
                    + f"; {null_block_words(plan.engine.engine)})")
        return line
    line.append("does NOT fit", style="bold red")
    if a.refusal:
        why = f"{plan.engine.engine} does not start"
    elif a.batch > a.max_num_seqs:
        why = f"{_seqs(plan)} {a.max_num_seqs:,} runs at most {plural(a.max_num_seqs, 'request')} at once"
    else:
        why = f"short by {plural(-a.fits_margin_blocks, 'block')} = {fmt_bytes(-a.fits_margin_blocks * lay.block_bytes)}"
        if a.shared_prefix_tokens:
            why += ", the shared prefix stored once"
        why += f"; {null_block_words(plan.engine.engine)}"
    if a.fix:
        line.append(f" ({why}); try {a.fix}")
    else:  # nothing fits: only then is kvplan.planning.suggest imported (a plan that fits never needs it)
        from kvplan.planning.suggest import nothing_fits

        line.append(f" ({why}); " + nothing_fits(plan.engine.engine))
    return line


def _engine_panel(plan: "Plan") -> Panel:
    """What the engine will log, or why it refuses to start (then no command: it would not start), and the
    command that launches the planned deployment."""
    a = plan.answer
    eng = Text()
    if a.refusal:
        eng.append(f"{plan.engine.label} will refuse to start: ", style="bold red")
        eng.append(a.refusal + "\n")
        eng.append("serve: ", style="bold")
        if a.longest_startable_len >= a.context:  # a flag the options accept with this --context
            eng.append(f"none for {_len(plan)} {plan.max_model_len:,}; it starts with "
                       f"{engine_flag(plan.engine.engine, 'max_model_len')} {a.longest_startable_len}")
        elif a.longest_startable_len >= 1:  # shorter than the context: a length, not a flag to paste
            eng.append(f"none for {_len(plan)} {plan.max_model_len:,}; the longest {_len(plan)} it starts with is "
                       f"{a.longest_startable_len:,}")
        else:
            eng.append(f"none: no {_len(plan)} starts")
        return _panel(eng, "engine")
    first, *explained = plan.rules.report(plan.launch)
    eng.append(f"{plan.engine.label} will report: ", style="bold")
    eng.append(first + "\n")
    if a.idle_reason:
        eng.append(f"no request of {_len(plan)} runs: ", style="bold red")
        eng.append(a.idle_reason + "\n")
    for line in explained:
        eng.append(f"  {line}\n", style="grey62")
    eng.append("serve: ", style="bold")
    command = plan.serve_command
    if command is None:  # a KV dtype the engine has no --kv-cache-dtype for (the plan's note says so)
        eng.append(f"none: {plan.engine.label} cannot run --kv-dtype {plan.kv_dtype} (a what-if)", style="yellow")
    else:
        eng.append(command)
    serve_note = served_weights(plan)[1]
    if serve_note:
        eng.append(f"\n  not what was planned: {serve_note}", style="yellow")
    if " factor " in a.model_max_len_rule:  # rope scaling decided it (or was ignored)
        eng.append(f"\n  the model's maximum length: {a.model_max_len_rule}", style="grey62")
    if not plan.launch.max_num_seqs_flag:
        eng.append(f"\n  {_seqs(plan)} stays {plan.engine.engine}'s {a.max_num_seqs:,}: the pool holds "
                   f"{plural(a.pool_requests, 'request')} of {plural(a.context, 'token')} at once and more shorter ones; the "
                   "scheduler admits only what the free blocks hold", style="grey62")
    return _panel(eng, "engine")


def _paging_panel(plan: "Plan") -> Panel:
    """Contiguous vs paged (the answer's own requests), prefix sharing, the decode roofline."""
    f, lay = plan.fragmentation, plan.layout
    more = Text()
    if plan.answer.refusal:
        more.append(f"{plan.engine.engine} does not start, so no request runs either way:\n")
    more.append(f"contiguous (reserve {_len(plan)} {f.max_model_len:,}): {plural(f.contiguous_max_requests, 'request')}, "
                f"{fmt_bytes(f.contiguous_waste_bytes)} wasted each\n")
    more.append(f"paged (block {lay.block_size}): {plural(f.paged_max_requests, 'request')}, {fmt_bytes(f.paged_waste_bytes)} slack each")
    if plan.answer.shared_prefix_tokens:
        more.append(" (the shared prefix stored once)")
    state_blocks = sum(plan.demand.state_blocks(g) for g in lay.groups)
    if state_blocks > sum(1 for g in lay.groups if g.cache.is_state):
        more.append(f" (with prefix caching the state groups keep {plural(state_blocks, 'block')} per request, checkpoints "
                    "included)")
    if lay.padding_layers:
        more.append(f"\n{lay.padding_layers} padded layer slot(s) per block (hybrid grouping)")
    if plan.prefix:
        p = plan.prefix
        if p.credited:
            more.append(f"\nprefix {plural(p.prefix_tokens, 'token')} shared: {plural(p.shared_blocks, 'block')} stored once; "
                        f"{p.max_requests_unshared:,} -> {plural(p.max_requests_shared, 'request')}; "
                        f"{p.prefill_tokens_saved:,} prefill tokens (~{p.prefill_flops_saved / 1e12:,.1f} TFLOP) not "
                        "recomputed")
        else:
            more.append(f"\nprefix {plural(p.prefix_tokens, 'token')}: not shared (prefix caching off); with "
                        f"--prefix-caching {plural(p.shared_blocks, 'block')} stored once, {p.max_requests_unshared:,} -> "
                        f"{plural(p.max_requests_shared, 'request')}")
    if plan.roofline:
        r = plan.roofline
        knee = (f"KV reads match weight reads at batch {r.knee_batch:,.0f}" if r.knee_batch >= 1 else
                "one request's KV reads exceed the weight reads")
        more.append(f"\ndecode roofline at batch {r.batch:,}: >= {r.step_seconds * 1e3:.2f} ms/step, "
                    f"<= {r.tokens_per_s:,.0f} tokens/s; {knee}")
    return _panel(more, "paging, prefix, decode")
