"""Read what a vLLM (V0 or V1, INFO or DEBUG, GPU or CPU) or SGLang start-up log says about its KV cache.

:func:`parse_log` turns the text of a log (or an excerpt of one) into a frozen :class:`StartupLog`:
the engine and version, the deployment (model, tp/pp, dtypes, max_model_len, utilisation, batching
limits, block size, an explicit KV budget), the GPU's memory, the budget terms the profiler printed
(weights, activation peak, non-torch, CUDA graphs, available KV memory) and the capacity it reports
(blocks, tokens, concurrency, a refusal). Every field is ``None`` when the log does not say. Sizes are GiB
as printed (vLLM's and SGLang's "GB" are bytes / 2**30), rounded as printed - callers treat them as
intervals of +-half a unit in the last place (:func:`printed_interval`). The line forms of each release
are in :mod:`kvplan.explain.lines`.

Pure text processing: no I/O, no planning; ``kvplan explain`` (kvplan/explain/reconcile.py) plans the same
deployment and reconciles the two.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, fields
from typing import Any

from kvplan.explain import lines as L
from kvplan.limits import MAX_SIZE_BYTES, MAX_TOKENS
from kvplan.units import plural


@dataclass(frozen=True)
class Refusal:
    """vLLM refused to start: one request at ``max_model_len`` does not fit.

    V0: ``max_model_len > kv_tokens`` (the pool in tokens). V1: ``needed_gib`` of KV cache against
    ``available_gib``, and the longest length that would fit (``estimated_max_model_len``).
    """

    max_model_len: int
    kv_tokens: int | None = None
    needed_gib: float | None = None
    available_gib: float | None = None
    estimated_max_model_len: int | None = None


@dataclass(frozen=True)
class StartupLog:
    """What one start-up log says (``None``: not in the log). GiB values are as printed (rounded)."""

    engine: str | None = None  # vllm | sglang
    version: str | None = None
    mode: str | None = None  # V0 | V1 (vLLM)
    model: str | None = None
    platform: str | None = None  # cuda | rocm | cpu | xpu | ...
    device_name: str | None = None
    tp: int | None = None
    pp: int | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None  # SGLang: mem_fraction_static
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    block_size: int | None = None  # as the deployment set it (--block-size; SGLang --page-size)
    engine_block_size: int | None = None  # as the engine chose it ("Setting attention block size to 544 tokens")
    workers_tp: int | None = None  # the tensor-parallel ranks the worker names show (largest index + 1): a lower bound
    workers_pp: int | None = None  # the pipeline stages they show (Worker_PP1_TP0)
    mm_budget_tokens: int | None = None  # "Encoder cache will be initialized with a budget of N tokens, and
    mm_items: int | None = None  # profiled with K <modality> items of the maximum feature size" (vLLM V1)
    mm_modality: str | None = None
    prefix_caching: bool | None = None  # enable_prefix_caching as the config line or the non-default args print it
    flashinfer_sampler: bool | None = None  # vLLM's sampler said it uses FlashInfer (True) or falls back (False)
    enforce_eager: bool | None = None
    usage_context: str | None = None  # serve | llm
    kv_cache_memory_bytes: int | None = None  # an explicit KV budget the deployment set (kv_cache_memory_bytes)
    cpu_kv_space_gib: float | None = None  # VLLM_CPU_KVCACHE_SPACE (GiB), set or the 4 GiB default it logs
    total_memory_gib: float | None = None  # the device's total (CPU backend 0.20+: the NUMA node's)
    free_memory_gib: float | None = None  # free at start-up ("Free memory on device (free/total)")
    requested_memory_gib: float | None = None  # total x gpu_memory_utilization
    weights_gib: float | None = None  # SGLang: "Load weight end ... mem usage"
    activation_gib: float | None = None
    peak_torch_memory_gib: float | None = None  # V0 0.6.4: weights + activation
    non_torch_gib: float | None = None
    consumed_gib: float | None = None  # 0.27+: weights + non-torch in one figure
    non_kv_gib: float | None = None  # "Total non KV cache memory" (the sum of the terms)
    cudagraph_estimate_gib: float | None = None
    cudagraph_applied: bool | None = None  # whether the estimate was subtracted (0.19+ messages)
    cudagraph_actual_gib: float | None = None  # measured after capture (SGLang: "Capture cuda graph end ... mem usage")
    available_kv_gib: float | None = None
    kv_in_use_gib: float | None = None  # "Current kv cache memory in use is X" (0.10.2+, after the pool is allocated)
    explicit_kv_gib: float | None = None  # "Explicitly set (X/...) GiB for KV cache", "reserved X GiB ... kv_cache_memory_bytes"
    num_gpu_blocks: int | None = None
    block_device: str | None = None  # the device word of "# GPU blocks" / "# cuda blocks" / "# CPU blocks"
    kv_cache_tokens: int | None = None  # vLLM "GPU KV cache size"; SGLang max_total_num_tokens
    device_kind: str | None = None  # the device word of "GPU / CPU / XPU KV cache size"
    max_concurrency: float | None = None
    concurrency_len: int | None = None  # the length of "Maximum concurrency for N tokens per request"
    padding_layers: int | None = None
    refusal: Refusal | None = None
    sglang_k_gib: float | None = None
    sglang_v_gib: float | None = None
    sglang_kv_gib: float | None = None  # MLA: one "KV size"
    sglang_kv_dtype: str | None = None
    sglang_avail_before_load_gib: float | None = None  # "Load weight begin. avail mem": free before the weights
    sglang_avail_after_load_gib: float | None = None  # "Load weight end ... avail mem"
    sglang_comm_gib: float | None = None  # "Init torch distributed ends. mem usage": NCCL and all-reduce buffers
    sglang_rest_gib: float | None = None
    sglang_pool_end_gib: float | None = None  # "Memory pool end. avail mem"
    sglang_available_gpu_mem_gib: float | None = None  # free after CUDA-graph capture (the scheduler's line)
    sglang_chunked_prefill_size: int | None = None
    sglang_max_prefill_tokens: int | None = None
    sglang_full_tokens: int | None = None
    sglang_swa_tokens: int | None = None
    sglang_mamba_slots: int | None = None
    max_running_requests: int | None = None  # SGLang
    no_memory_line: int | None = None  # the line of "No available memory for the cache blocks" (SGLang: "Not enough memory")
    stop_line: int | None = None  # the line of another start-up stop (kvplan.explain.lines.STOPS)
    stop_reason: str | None = None
    out_of_memory_line: int | None = None  # the first line of a CUDA / HIP out-of-memory error
    not_started: str | None = None  # why the log shows the engine did not start (None: it did, or it does not say)
    releases: tuple[str, str | None] | None = None  # the releases that print every line form of the log (first, last)
    warnings: tuple[str, ...] = ()
    matched: tuple[str, ...] = ()  # the field names found, in the order they were found
    unreadable: tuple[str, ...] = ()  # "line N: cannot read the number ..." for numbers no engine prints

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (``refusal`` as a mapping)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Refusal):
                value = {g.name: getattr(value, g.name) for g in fields(value)}
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @property
    def has_capacity(self) -> bool:
        """Whether the log states anything about the KV pool (memory, blocks, tokens, a refusal)."""
        return self.prints_every_term or any(
            x is not None for x in (self.available_kv_gib, self.num_gpu_blocks, self.kv_cache_tokens, self.refusal,
                                    self.sglang_k_gib, self.sglang_kv_gib, self.max_concurrency, self.explicit_kv_gib,
                                    self.not_started))

    @property
    def prints_every_term(self) -> bool:
        """Whether the log prints the requested memory and every term vLLM subtracts from it (weights, activation
        peak, non-torch): its KV budget is then implied even where the excerpt ends before the KV line."""
        requested = self.requested_memory_gib is not None or (self.total_memory_gib is not None
                                                              and self.gpu_memory_utilization is not None)
        activation = self.activation_gib is not None or self.peak_torch_memory_gib is not None
        return requested and activation and self.weights_gib is not None and self.non_torch_gib is not None

    @property
    def starts(self) -> bool | None:
        """Whether the log shows the engine started: False with a reason (``not_started``), True when it
        prints its pool, None when it says nothing about the pool."""
        if self.not_started is not None:
            return False
        return True if self.has_capacity else None

    @property
    def kv_gib(self) -> float | None:
        """The KV budget the log prints, per GPU (GiB): vLLM's available or explicit KV memory, SGLang's pool."""
        if self.available_kv_gib is not None:
            return self.available_kv_gib
        if self.explicit_kv_gib is not None:
            return self.explicit_kv_gib
        if self.sglang_kv_gib is not None:
            return self.sglang_kv_gib
        if self.sglang_k_gib is not None and self.sglang_v_gib is not None:
            return round(self.sglang_k_gib + self.sglang_v_gib, 2)
        return None

    @property
    def is_cpu(self) -> bool:
        """Whether the log is of vLLM's CPU backend."""
        if self.platform is not None:  # the platform the log names wins (an NPU plugin's blocks are "CPU blocks")
            return self.platform == "cpu"
        return (self.device_kind == "CPU" or self.cpu_kv_space_gib is not None
                or (self.block_device or "").lower() == "cpu")

    @property
    def prints_terms(self) -> bool:
        """Whether the log prints a budget term beside its KV budget (weights, activation, non-torch, graphs)."""
        return any(x is not None for x in (self.weights_gib, self.activation_gib, self.peak_torch_memory_gib,
                                           self.non_torch_gib, self.consumed_gib, self.non_kv_gib))


# ---------------------------------------------------------------------------------------------
# numbers as printed


class Unreadable(ValueError):
    """A number in a line the parser matched that is not a number the engine prints (garbled or cut)."""


_PRINTED_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]*)?")
MAX_LOGGED = MAX_TOKENS  # no count, length, size (GiB) or ratio a start-up log prints is larger
_MAX_DIGITS = 15  # a double holds 15 significant digits: more were not printed by the engine


def _checked(text: str, integer: bool, bound: int = MAX_LOGGED) -> str:
    """``text`` without its thousands separators, or :class:`Unreadable`: misplaced commas (``409,6001``),
    a fraction where a count belongs, more digits than a printed number has, past ``bound``."""
    plain = text.replace(",", "")
    digits = plain.lstrip("-").replace(".", "").lstrip("0")
    if (not _PRINTED_NUMBER.fullmatch(text) or (integer and "." in text) or len(digits) > _MAX_DIGITS
            or abs(float(plain)) > bound):
        raise Unreadable(text)
    return plain


def _num(text: str) -> float:
    return float(_checked(text, integer=False))


def _int(text: str) -> int:
    return int(_checked(text, integer=True))


def decimals(text: str) -> int:
    """Digits after the decimal point of a printed number (``"5.01"`` -> 2, ``"21.5"`` -> 1)."""
    return len(text.split(".", 1)[1]) if "." in text else 0


def printed_interval(value: float, digits: int = 2) -> tuple[float, float]:
    """The values that print as ``value`` with ``digits`` decimals: ``value +- 0.5 x 10**-digits``."""
    half = 0.5 * 10 ** -digits
    return value - half, value + half


_CONSTANT_KINDS = {"true": True, "false": False, "serve": "serve", "cpu": "cpu"}  # set by the line, read from no group


def _read(kind: str, text: str | None) -> Any:
    """One group of a :class:`kvplan.explain.lines.Line`, as its kind says."""
    if text is None:
        return None
    if kind == "word":
        return text
    if kind == "bool":
        return text == "True"
    if kind == "int":
        return _int(text)
    if kind == "bytes":
        return int(_checked(text, integer=True, bound=MAX_SIZE_BYTES)) / 2**30
    value = _num(text)
    return round(value / 1024, 4) if kind == "mib" else value


def _values(rule: L.Line, m: "re.Match[str]") -> list[Any]:
    out, group = [], 0
    for kind in rule.kinds:
        if kind in _CONSTANT_KINDS:
            out.append(_CONSTANT_KINDS[kind])
            continue
        group += 1
        out.append(_read(kind, m.group(group)))
    return out


# ---------------------------------------------------------------------------------------------
# command lines and argument dicts

# non-default args / vllm serve / sglang.launch_server flags -> fields
_ARG_FIELDS = {"model": "model", "model_tag": "model", "model_path": "model", "tensor_parallel_size": "tp",
               "pipeline_parallel_size": "pp", "tp_size": "tp", "pp_size": "pp", "tp": "tp", "pp": "pp",
               "max_model_len": "max_model_len", "max_model": "max_model_len", "context_length": "max_model_len",
               "gpu_memory_utilization": "gpu_memory_utilization", "mem_fraction_static": "gpu_memory_utilization",
               "max_num_seqs": "max_num_seqs", "max_running_requests": "max_num_seqs",
               "max_num_batched_tokens": "max_num_batched_tokens", "block_size": "block_size", "page_size": "block_size",
               "dtype": "dtype", "kv_cache_dtype": "kv_cache_dtype", "quantization": "quantization",
               "enforce_eager": "enforce_eager", "kv_cache_memory_bytes": "kv_cache_memory_bytes",
               "kv_cache_memory": "kv_cache_memory_bytes", "chunked_prefill_size": "sglang_chunked_prefill_size",
               "max_prefill_tokens": "sglang_max_prefill_tokens"}
_FIELD_TYPES = {"tp": int, "pp": int, "max_model_len": int, "max_num_seqs": int, "max_num_batched_tokens": int,
                "block_size": int, "gpu_memory_utilization": float, "kv_cache_memory_bytes": int,
                "sglang_chunked_prefill_size": int, "sglang_max_prefill_tokens": int}
_BOUNDS = {"kv_cache_memory_bytes": MAX_SIZE_BYTES}

# vLLM's human-readable integers (``--max-model-len 32k``): k/m/g = 10^3/10^6/10^9, K/M/G = 2^10/2^20/2^30
_HUMAN_INT = re.compile(r"([0-9]+(?:\.[0-9]+)?)([kmgtKMGT])")
_HUMAN_UNITS = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# a positional model on a command line: a path or id (a "/" or a digit in it), not a word ("vllm serve with ...")
_MODEL_TOKEN = re.compile(r"[\"']?([A-Za-z0-9_.~-]*[/0-9][A-Za-z0-9_./~:-]*)[\"']?")


def _typed(field: str, value: Any) -> Any:
    kind = _FIELD_TYPES.get(field)
    if field == "enforce_eager":
        return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "")
    if kind is None:
        return None if value is None or str(value) in ("None", "auto", "") else str(value)
    if value is None or isinstance(value, bool):
        return None
    text = str(value).replace(",", "")
    short = _HUMAN_INT.fullmatch(text) if kind is int else None
    try:
        number = round(float(short.group(1)) * _HUMAN_UNITS[short.group(2)]) if short else kind(text)
    except ValueError:
        if any(ch.isdigit() for ch in text):
            raise Unreadable(text[:40]) from None  # digits, but not a number (or 5,000 of them)
        return None
    if not abs(number) <= _BOUNDS.get(field, MAX_LOGGED):  # NaN too
        raise Unreadable(text[:40])
    return number


def _args_dict(line: str) -> dict[str, Any]:
    """The ``non-default args: {...}`` dict of a vLLM log line ({} when it is truncated or garbled)."""
    match = L.NON_DEFAULT.search(line)
    if not match:
        return {}
    try:
        value = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _command_flags(line: str, start: int) -> dict[str, Any]:
    """``--flag value`` pairs of a ``vllm serve`` / ``sglang.launch_server`` command line after ``start``
    (``-tp 2`` too), and its positional model."""
    rest = line[start:]
    out: dict[str, Any] = {}
    for flag, value in L.SERVE_FLAG.findall(rest):
        value = value.strip("'\"")  # a shell-quoted value: --model-path 'Qwen/Qwen3.5-9B'
        if value:
            out[flag.replace("-", "_")] = value
    for short, name in (("-tp", "tensor_parallel_size"), ("-pp", "pipeline_parallel_size")):
        m = re.search(rf"(?:^|\s){short}[ =]([0-9]+)", rest)
        if m:
            out[name] = m.group(1)
    if "--enforce-eager" in rest:
        out["enforce_eager"] = True
    tokens = rest.split()
    skip = False
    for token in tokens:
        if skip:
            skip = False
            continue
        if token.startswith("-"):
            skip = "=" not in token and token not in ("--enforce-eager", "--trust-remote-code")
            continue
        m = _MODEL_TOKEN.fullmatch(token)
        if m and "model_tag" not in out and "model" not in out:
            out["model_tag"] = m.group(1)
        break
    return out


def _server_args(line: str) -> dict[str, Any]:
    """SGLang's ``server_args=ServerArgs(key=value, ...)`` as a dict of the keys kvplan reads."""
    i = line.find("ServerArgs(")
    if i < 0:
        return {}
    out: dict[str, Any] = {}
    for key, value in re.findall(r"\b(\w+)=('[^']*'|[^,()]+)", line[i:]):
        if key in _ARG_FIELDS and key not in out:
            out[key] = value.strip("'")
    return out


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
    if c.kv_by_rank:  # vLLM sizes every rank's pool to the smallest; with pp, rank 0 holds the largest stage
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


__all__ = ["StartupLog", "Refusal", "Unreadable", "parse_log", "printed_interval", "decimals"]
