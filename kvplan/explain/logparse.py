"""Read what a vLLM (V0 or V1, INFO or DEBUG, GPU or CPU) or SGLang start-up log says about its KV cache.

:func:`parse_log` turns the text of a log (or an excerpt of one) into a frozen :class:`StartupLog`:
the engine and version, the deployment (model, tp/pp, dtypes, max_model_len, utilisation, batching
limits, block size, an explicit KV budget), the GPU's memory, the budget terms the profiler printed
(weights, activation peak, non-torch, CUDA graphs, available KV memory) and the capacity it reports
(blocks, tokens, concurrency, a refusal). Every field is ``None`` when the log does not say. Sizes are GiB
as printed (vLLM's and SGLang's "GB" are bytes / 2**30), rounded as printed - callers treat them as
intervals of +-half a unit in the last place (:func:`kvplan.explain.printed.printed_interval`). The line forms of
each release are in :mod:`kvplan.explain.lines`.

The log's fields are :class:`kvplan.explain.startup_log.StartupLog`'s; numbers as printed are read by
:mod:`kvplan.explain.printed`, command lines and argument dicts by :mod:`kvplan.explain.args`. Pure text processing:
no I/O, no planning; ``kvplan explain`` (kvplan/explain/reconcile.py) plans the same deployment and reconciles the
two.
"""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any

from kvplan.explain import lines as L
from kvplan.explain.args import _ARG_FIELDS, _args_dict, _command_flags, _server_args, _typed
from kvplan.explain.printed import _int, _num, _values
from kvplan.explain.startup_log import Refusal, StartupLog, Unreadable
from kvplan.units import plural

# ---------------------------------------------------------------------------------------------
# collecting


class _Collect:
    """Accumulates fields while the lines are read (later lines win, except where noted)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.ranks: dict[str, int] = {}  # the worker rank whose line set each field (0: rank 0 or none named)
        self.order: list[str] = []
        self.warnings: list[str] = []
        self.kv_by_rank: list[tuple[int | None, float]] = []
        self.tokens_seen: list[tuple[int, str | None]] = []  # every "GPU KV cache size" (one per worker in 0.10+)
        self.concurrency_seen: list[tuple[int, float]] = []
        self.votes = {L.VLLM: 0, L.SGLANG: 0}
        self.forms: dict[str, list[tuple[tuple[int, ...], tuple[int, ...] | None]]] = {L.VLLM: [], L.SGLANG: []}
        self.unreadable: list[str] = []
        self.worker_names: dict[str, int] = {}  # "tp" / "pp" / "rank": the largest index a worker's name shows

    def set(self, field: str, value: Any, *, keep_first: bool = False, rank: int = 0) -> None:
        if value is None:
            return
        if field in self.values:
            held = self.ranks.get(field, 0)
            if keep_first and not (held > 0 and rank == 0):
                return
            if rank > 0 and held == 0:  # another worker's figure never replaces rank 0's
                return
        self.values[field] = value
        self.ranks[field] = rank
        if field not in self.order:
            self.order.append(field)


def _note_worker(c: _Collect, line: str) -> None:
    """Keep the largest tensor / pipeline index and global rank the line's worker name shows (``(Worker_PP1_TP3
    pid=..)`` 0.11+, ``(VllmWorker rank=5 pid=..)`` 0.8 - 0.10)."""
    m = L.WORKER_NAME.search(line)
    if not m:
        return
    for key, text in zip(("rank", "pp", "tp"), m.groups()):
        if text is not None:
            c.worker_names[key] = max(c.worker_names.get(key, 0), int(text))


def _rank(line: str) -> int:
    m = L.WORKER_RANK.search(line) if "TP" in line or "rank=" in line else None
    return int(m.group(1)[:9]) if m else 0


def _anchors(needles: list[str]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A few short strings that the needles contain, each with the needles (by index) it stands for: a line
    without an anchor needs none of its needles checked (greedy cover by 4-character substrings)."""
    left = set(range(len(needles)))
    out = []
    while left:
        counts: dict[str, set[int]] = {}
        for i in left:
            for j in range(len(needles[i]) - 3):
                counts.setdefault(needles[i][j:j + 4], set()).add(i)
        anchor, covered = max(counts.items(), key=lambda kv: (len(kv[1]), kv[0])) if counts else ("", set(left))
        out.append((anchor, tuple(sorted(covered))))
        left -= covered
    return tuple(out)


_NEEDLED = [rule for rule in L.LINES if rule.needle is not None]
_FREE = tuple(rule for rule in L.LINES if rule.needle is None)  # alternatives at the top: searched on every line
_GROUPS = tuple((anchor, tuple(_NEEDLED[i] for i in members))
                for anchor, members in _anchors([rule.needle for rule in _NEEDLED]))


def _candidate_rules(line: str) -> list[L.Line]:
    """The rules whose needle is in ``line`` (and those without one), in :data:`kvplan.explain.lines.LINES` order."""
    found = [rule for anchor, rules in _GROUPS if anchor in line for rule in rules if rule.needle in line]
    found += _FREE
    order = _ORDER
    return sorted(found, key=order.__getitem__) if len(found) > 1 else found


_ORDER = {rule: i for i, rule in enumerate(L.LINES)}


_MAY_WARN = re.compile(r"padding|FlashInfer|allreduce|Error|larger than|emory|enough|less than", re.I)  # a cheap look
_FORMS = tuple((L.needle(pattern.pattern), engine, pattern, first, last) for engine, pattern, first, last in L.FORMS)
_STOPS = tuple((L.needle(pattern.pattern), pattern, reason, engine) for pattern, reason, engine in L.STOPS)


def _read_line(c: _Collect, line: str, lineno: int = 0) -> None:
    """Read one line (``lineno``: 1-based, for the unreadable-number messages)."""
    rank = _rank(line)
    if rank or "Worker" in line:
        _note_worker(c, line)
    _read_rules(c, line, lineno, rank)
    _read_commands(c, line, lineno)
    _read_stops(c, line, lineno)


def _read_rules(c: _Collect, line: str, lineno: int, rank: int) -> None:
    """The fields of every line form the line matches (``rank``: the worker whose line it is, 0 for rank 0 or none)."""
    for rule in _candidate_rules(line):
        m = rule.pattern.search(line)
        if not m:
            continue
        try:
            values = _values(rule, m)
        except Unreadable as exc:
            c.unreadable.append(_unreadable(lineno, rule.fields[0] or "", exc, line))
            continue
        if rule.engine:
            c.votes[rule.engine] += 1
        for field, value in zip(rule.fields, values):
            if field is None:
                continue
            if field == "available_kv_gib" and rule.engine == L.VLLM:
                c.kv_by_rank.append((rank if L.WORKER_RANK.search(line) else None, value))
            if rule.engine == L.VLLM and field == "kv_cache_tokens":
                c.tokens_seen.append((value, values[0]))
            if field == "max_concurrency":
                c.concurrency_seen.append((values[0], value))
            if field == "quantization" and value == "None":
                continue
            if field == "block_device" and value.lower() == "cpu" and "num_gpu_blocks" in c.values \
                    and c.values.get("block_device", "").lower() != "cpu":
                break  # V0's "# CPU blocks" (swap space) after the device's own line
            c.set(field, value, keep_first=rule.policy == "first", rank=rank)


def _read_commands(c: _Collect, line: str, lineno: int) -> None:
    """The settings of a ``vllm serve`` or ``sglang.launch_server`` command line, an args dict or SGLang's ServerArgs."""
    if "vllm serve" in line:
        m = L.SERVE_LINE.search(line)
        _set_args(c, _command_flags(line, m.end()) if m else {}, line, lineno)
    m = L.SGLANG_LAUNCH.search(line) if "launch_server" in line else None
    if m:
        c.votes[L.SGLANG] += 1
        flags = _command_flags(line, m.end())
        flags.pop("model_tag", None)
        if "model" in flags and "model_path" not in flags:
            flags["model_path"] = flags.pop("model")
        _set_args(c, flags, line, lineno)
    if "args" in line or "ServerArgs(" in line:
        _set_args(c, {**_args_dict(line), **_server_args(line)}, line, lineno)


def _read_stops(c: _Collect, line: str, lineno: int) -> None:
    """A refusal, why the engine stopped, which releases print the line's form, out-of-memory lines and warnings."""
    try:
        refusal = _refusal(line) if "KV cache" in line else None
    except Unreadable as exc:
        c.unreadable.append(_unreadable(lineno, "refusal", exc, line))
        refusal = None
    if refusal is not None:
        c.set("refusal", refusal)
        c.votes[L.VLLM] += 1
    for needle, pattern, reason, engine in _STOPS:
        if (needle is None or needle in line) and pattern.search(line):
            if engine:
                c.votes[engine] += 1
            if reason == L.STOPS[0][1]:
                c.set("no_memory_line", lineno, keep_first=True)
            elif refusal is None:
                c.set("stop_line", lineno, keep_first=True)
                c.set("stop_reason", reason, keep_first=True)
    for needle, engine, pattern, first, last in _FORMS:
        if (needle is None or needle in line) and pattern.search(line):
            c.forms[engine].append((first, last))
    if "emory" in line and L.OUT_OF_MEMORY.search(line):
        c.set("out_of_memory_line", lineno, keep_first=True)
    if _MAY_WARN.search(line) and L.WARNINGS.search(line) and "Traceback" not in line:
        text = line.strip()[:300]
        if text not in c.warnings:
            c.warnings.append(text)


def _set_args(c: _Collect, args: dict[str, Any], line: str, lineno: int) -> None:
    for key, value in args.items():
        if key not in _ARG_FIELDS:
            continue
        field = _ARG_FIELDS[key]
        try:
            c.set(field, _typed(field, value))
        except Unreadable as exc:
            c.unreadable.append(_unreadable(lineno, field, exc, line))


def _unreadable(lineno: int, field: str, exc: Unreadable, line: str) -> str:
    text = line.strip()
    text = text if len(text) <= 120 else text[:117] + "..."
    return f"line {lineno}: cannot read the number {str(exc)[:40]!r} ({field}) in {text!r}"


def _refusal(line: str) -> Refusal | None:
    m = L.V0_REFUSAL.search(line)
    if m:
        return Refusal(_int(m.group(1)), kv_tokens=_int(m.group(2)))
    m = L.V1_REFUSAL.search(line)
    if m:
        est = L.V1_ESTIMATE.search(line)
        return Refusal(_int(m.group(1)), needed_gib=_num(m.group(2)), available_gib=_num(m.group(3)),
                       estimated_max_model_len=_int(est.group(1)) if est else None)
    return None


def _finish(c: _Collect) -> StartupLog:
    v = c.values
    names = c.worker_names
    if "tp" in names or "pp" in names:
        v["workers_tp"], v["workers_pp"] = names.get("tp", 0) + 1, names.get("pp", 0) + 1
    elif "rank" in names:  # global ranks: tp x pp workers
        v["workers_tp"] = names["rank"] + 1
    if c.kv_by_rank:  # vLLM sizes every rank's pool to the smallest; with pp, rank 0's is the first stage's
        ranked = [kv for rank, kv in c.kv_by_rank if rank == 0]
        if (v.get("pp") or 1) > 1:
            v["available_kv_gib"] = ranked[0] if ranked else max(kv for _, kv in c.kv_by_rank)
        else:
            v["available_kv_gib"] = min(kv for _, kv in c.kv_by_rank)
    if len(c.tokens_seen) > 1:  # 0.10+ prints each worker's pool, then uses the smallest (with its concurrency)
        i = min(range(len(c.tokens_seen)), key=lambda k: c.tokens_seen[k][0])
        v["kv_cache_tokens"], v["device_kind"] = c.tokens_seen[i]
        if len(c.concurrency_seen) == len(c.tokens_seen):
            v["concurrency_len"], v["max_concurrency"] = c.concurrency_seen[i]
    if v.get("available_kv_gib") is None and v.get("kv_in_use_gib") is not None:
        v["available_kv_gib"] = v["kv_in_use_gib"]
    if v.get("refusal") is not None and v["refusal"].available_gib is not None:
        c.set("available_kv_gib", v["refusal"].available_gib, keep_first=True)
    if v.get("sglang_tokens") is not None:  # the scheduler's max_total_num_tokens is the pool's
        v["kv_cache_tokens"] = v.pop("sglang_tokens")
    elif v.get("sglang_full_tokens") is not None:  # a hybrid SWA pool: max_total_num_tokens is the full pool's
        v["kv_cache_tokens"] = v["sglang_full_tokens"]  # (full_layer_tokens); its "#tokens" line is the SWA pool's
    sglang = c.votes[L.SGLANG] > 0 and not any(k in v for k in ("num_gpu_blocks", "available_kv_gib", "mode",
                                                                "concurrency_len"))
    vllm = not sglang and c.votes[L.VLLM] > 0 and any(
        k in v for k in ("mode", "available_kv_gib", "num_gpu_blocks", "concurrency_len", "weights_gib", "refusal",
                         "kv_cache_tokens", "explicit_kv_gib", "version", "total_memory_gib", "no_memory_line",
                         "stop_line"))
    if not (sglang or vllm) and (v.get("no_memory_line") is not None or v.get("stop_line") is not None):
        sglang, vllm = c.votes[L.SGLANG] > 0, not c.votes[L.SGLANG]
    if sglang or vllm:
        v["engine"] = L.SGLANG if sglang else L.VLLM
    if vllm and "mode" not in v:  # vLLM: V0 or V1 by the lines it printed
        v0 = any(k in v for k in ("peak_torch_memory_gib", "num_gpu_blocks")) and "kv_cache_tokens" not in v
        if v0 or (v.get("refusal") is not None and v["refusal"].kv_tokens is not None):
            v["mode"] = "V0"
        elif any(k in v for k in ("kv_cache_tokens", "cudagraph_estimate_gib", "available_kv_gib", "explicit_kv_gib")) or (
                v.get("refusal") is not None and v["refusal"].needed_gib is not None):
            v["mode"] = "V1"
    if vllm and v.get("platform") is None and ((v.get("block_device") or "").lower() == "cpu"
                                               or v.get("device_kind") == "CPU"):
        v["platform"] = "cpu"
    if v.get("engine") in c.forms:
        v["releases"] = _releases(c.forms[v["engine"]])
    if v.get("max_model_len") is None:
        v["max_model_len"] = v.get("concurrency_len") or (v["refusal"].max_model_len if v.get("refusal") else None)
    v["not_started"] = _not_started(v)
    known = {f.name for f in fields(StartupLog)}
    return StartupLog(**{k: val for k, val in v.items() if k in known}, warnings=tuple(c.warnings),
                      matched=tuple(k for k in c.order if k in known), unreadable=tuple(c.unreadable))


def _release(version: tuple[int, ...]) -> str:
    return ".".join(str(x) if x != 99 else "x" for x in version)


def _releases(forms: list[tuple[tuple[int, ...], tuple[int, ...] | None]]) -> tuple[str, str | None] | None:
    """The releases that print every form seen (None: no form, or forms no one release prints: a fork, two logs)."""
    if not forms:
        return None
    first = max(f for f, _ in forms)
    lasts = [last for _, last in forms if last is not None]
    last = min(lasts) if lasts else None
    if last is not None and last < first:
        return None
    return _release(first), None if last is None else _release(last)


def _not_started(v: dict[str, Any]) -> str | None:
    """Why the log shows the engine did not start (vLLM raises on each of these), or None."""
    refusal = v.get("refusal")
    if refusal is not None and refusal.kv_tokens is not None:
        return (f"max_model_len {refusal.max_model_len:,} is larger than the {plural(refusal.kv_tokens, 'token')} the KV cache "
                "holds")
    if refusal is not None:
        return (f"one request at max_model_len {refusal.max_model_len:,} needs {refusal.needed_gib} GiB of KV cache, "
                f"more than the {refusal.available_gib} GiB available")
    if v.get("no_memory_line") is not None:
        return f"no available memory for the cache blocks (line {v['no_memory_line']})"
    if v.get("stop_line") is not None:
        return f"{v['stop_reason']} (line {v['stop_line']})"
    sized = any(v.get(k) is not None for k in ("available_kv_gib", "num_gpu_blocks", "kv_cache_tokens", "sglang_k_gib",
                                               "sglang_kv_gib"))
    if v.get("out_of_memory_line") is not None and not sized:  # after sizing (graph capture): a warning line only
        return f"out of GPU memory (line {v['out_of_memory_line']}) before the KV cache was sized"
    for field, what in (("available_kv_gib", "available KV cache memory {} GiB"), ("num_gpu_blocks", "{} GPU blocks"),
                        ("kv_cache_tokens", "a KV cache of {} tokens")):
        if v.get(field) is not None and v[field] <= 0:
            return what.format(v[field]) + ": no memory for the cache blocks"
    return None


_CONTINUED = re.compile(r"\\\s*$")
# A line that goes on from the one before: the source wrapped a long record ("... the rest of the memory reserved"
# / "for KV Cache is 21.43GiB.", "non_torch_memory=6" / ".07GiB"). It starts lower case, with a digit or a full stop,
# and is not a record of its own (a level, a timestamp, a process prefix).
_WRAPPED = re.compile(r"^\s*[a-z0-9.]|^\s+--[a-z]")
_RECORD = re.compile(r"^\s*(?:\(|\[|[0-9]{2,4}[-/][0-9]{2}[-/ ]|[0-9]{2}:[0-9]{2}|[0-9]+: )|"
                     r"^.{0,60}\b(?:INFO|DEBUG|WARNING|WARN|ERROR|CRITICAL)\b")
_MAX_JOINED = 20_000
_BOLD = re.compile(r"(?:(?<=\s)|^)\*\*|\*\*(?=\s|$)")  # markdown bold around a label, not a power (10**30)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """The log's lines (1-based numbers of their first physical line): ANSI colours and markdown bold dropped, a
    command line continued with ``\\`` and a record the source wrapped joined to the lines that go on with it."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None  # a command line that ends in "\"
    for lineno, raw in enumerate(str(text).splitlines(), 1):
        line = raw[:100_000]  # a garbled megabyte line: nothing of ours is that long
        if "\x1b" in line:
            line = L.ANSI.sub("", line)
        if "**" in line:
            line = _BOLD.sub("", line)
        if pending is not None:
            line = pending[1] + " " + line.strip()
            lineno = pending[0]
            pending = None
        elif out and line.strip() and _WRAPPED.match(line) and not _RECORD.match(line) and out[-1][1].strip() \
                and len(out[-1][1]) + len(line) < _MAX_JOINED:
            first, before = out.pop()
            glue = "" if before.rstrip()[-1:].isdigit() and line.lstrip()[:1] in ".0123456789" else " "
            line, lineno = before.rstrip() + glue + line.strip(), first
        if _CONTINUED.search(line) and len(line) < _MAX_JOINED:
            pending = (lineno, _CONTINUED.sub("", line))
            continue
        out.append((lineno, line))
    if pending is not None:
        out.append(pending)
    return out


def parse_log(text: str) -> StartupLog:
    """Parse a start-up log (any mix of vLLM / SGLang lines; unknown lines are skipped)."""
    c = _Collect()
    for lineno, line in _logical_lines(text):
        _read_line(c, line, lineno)
    return _finish(c)


__all__ = ["parse_log"]
