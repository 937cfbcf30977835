"""Read what a vLLM (V0 or V1, INFO or DEBUG) or SGLang start-up log says about its KV cache.

:func:`parse_log` turns the text of a log (or an excerpt of one) into a frozen :class:`StartupLog`:
the engine and version, the deployment (model, tp/pp, dtypes, max_model_len, utilisation, batching
limits, block size), the budget terms the profiler printed (weights, activation peak, non-torch, CUDA
graphs, available KV memory) and the capacity it reports (blocks, tokens, concurrency, a refusal).
Every field is ``None`` when the log does not say. Sizes are GiB as printed (vLLM's and SGLang's "GB"
are bytes / 2**30), rounded as printed - callers treat them as intervals of +-half a unit in the last
place (:func:`printed_interval`).

Pure text processing: no I/O, no planning; ``kvplan explain`` (kvplan/explain/reconcile.py) plans the same
deployment and reconciles the two.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, fields
from typing import Any, Callable

from kvplan.limits import MAX_TOKENS
from kvplan.units import plural

NUMBER = r"(-?[0-9][0-9,]*\.?[0-9]*)"
INT = r"([0-9](?:[0-9,]*[0-9])?)"  # a count as printed, without the comma or full stop after it


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
    platform: str | None = None  # cuda | rocm
    device_name: str | None = None
    tp: int | None = None
    pp: int | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    block_size: int | None = None
    enforce_eager: bool | None = None
    usage_context: str | None = None  # serve | llm
    total_memory_gib: float | None = None
    requested_memory_gib: float | None = None
    weights_gib: float | None = None
    activation_gib: float | None = None
    peak_torch_memory_gib: float | None = None  # V0 0.6.3/0.6.4: weights + activation
    non_torch_gib: float | None = None
    cudagraph_estimate_gib: float | None = None
    cudagraph_applied: bool | None = None  # whether the estimate was subtracted (0.20+ message)
    cudagraph_actual_gib: float | None = None
    available_kv_gib: float | None = None
    num_gpu_blocks: int | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_len: int | None = None  # the length of "Maximum concurrency for N tokens per request"
    padding_layers: int | None = None
    refusal: Refusal | None = None
    sglang_k_gib: float | None = None
    sglang_v_gib: float | None = None
    no_memory_line: int | None = None  # the line of "No available memory for the cache blocks" (SGLang: "Not enough memory")
    out_of_memory_line: int | None = None  # the first line of a CUDA / HIP out-of-memory error
    not_started: str | None = None  # why the log shows the engine did not start (None: it did, or it does not say)
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
        return any(x is not None for x in (self.available_kv_gib, self.num_gpu_blocks, self.kv_cache_tokens,
                                           self.refusal, self.sglang_k_gib, self.max_concurrency, self.not_started))

    @property
    def starts(self) -> bool | None:
        """Whether the log shows the engine started: False with a reason (``not_started``), True when it
        prints its pool, None when it says nothing about the pool."""
        if self.not_started is not None:
            return False
        return True if self.has_capacity else None


# ---------------------------------------------------------------------------------------------
# numbers as printed


class Unreadable(ValueError):
    """A number in a line the parser matched that is not a number the engine prints (garbled or cut)."""


_PRINTED_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]*)?")
MAX_LOGGED = MAX_TOKENS  # no count, length, size (GiB) or ratio a start-up log prints is larger
_MAX_DIGITS = 15  # a double holds 15 significant digits: more were not printed by the engine


def _checked(text: str, integer: bool) -> str:
    """``text`` without its thousands separators, or :class:`Unreadable`: misplaced commas (``409,6001``),
    a fraction where a count belongs, more digits than a printed number has, past :data:`MAX_LOGGED`."""
    plain = text.replace(",", "")
    digits = plain.lstrip("-").replace(".", "").lstrip("0")
    if (not _PRINTED_NUMBER.fullmatch(text) or (integer and "." in text) or len(digits) > _MAX_DIGITS
            or abs(float(plain)) > MAX_LOGGED):
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


# ---------------------------------------------------------------------------------------------
# the patterns: (field, regex, how to read the match); later matches of a field win unless noted

_Rule = tuple[str, "re.Pattern[str]", Callable[["re.Match[str]"], Any]]


def _r(field: str, pattern: str, read: Callable[["re.Match[str]"], Any] = lambda m: _num(m.group(1))) -> _Rule:
    return field, re.compile(pattern), read


_RULES: tuple[_Rule, ...] = (
    # engine and version
    _r("version", r"vLLM API server version ([0-9][^\s,]*)", lambda m: m.group(1)),
    _r("version", r"\]\s+version ([0-9][^\s,]*)\s*$", lambda m: m.group(1)),
    _r("version", r"Initializing an? (?:V[01] )?LLM engine \(v([0-9][^)\s]*)\)", lambda m: m.group(1)),
    _r("version", r"\bvllm[ =]=?\s*v?(0\.[0-9]+\.[0-9][^\s,]*)", lambda m: m.group(1)),
    _r("mode", r"Initializing a (V[01]) LLM engine", lambda m: m.group(1)),
    _r("platform", r"Automatically detected platform (\w+)", lambda m: m.group(1).lower()),
    _r("device_name", r"device_name=(NVIDIA_[A-Za-z0-9_-]+|AMD_[A-Za-z0-9_-]+)", lambda m: m.group(1).replace("_", " ")),
    # the deployment: engine config line (model='...', dtype=torch.x, ...)
    _r("model", r"with config: model='([^']+)'", lambda m: m.group(1)),
    _r("model", r"Starting to load model ([^\s.][^\s]*?)(?:\.\.\.)?\s*$", lambda m: m.group(1)),
    _r("model", r"\bvllm serve\s+\"?([A-Za-z0-9_./-]+)\"?", lambda m: m.group(1)),
    _r("dtype", r"\bdtype=torch\.(\w+)", lambda m: m.group(1)),
    _r("max_model_len", r"\bmax_seq_len=([0-9]+)", lambda m: _int(m.group(1))),
    _r("max_model_len", r"Using max model len ([0-9]+)", lambda m: _int(m.group(1))),
    _r("tp", r"\btensor_parallel_size=([0-9]+)", lambda m: _int(m.group(1))),
    _r("pp", r"\bpipeline_parallel_size=([0-9]+)", lambda m: _int(m.group(1))),
    _r("kv_cache_dtype", r"\bkv_cache_dtype=(\w+)", lambda m: m.group(1)),
    _r("quantization", r"\bquantization=(\w+)", lambda m: None if m.group(1) == "None" else m.group(1)),
    _r("enforce_eager", r"\benforce_eager=(True|False)", lambda m: m.group(1) == "True"),
    _r("max_num_batched_tokens", r"max_num_batched_tokens=([0-9]+)", lambda m: _int(m.group(1))),
    _r("block_size", r"Setting (?:attention|kv cache) block size to ([0-9]+) tokens", lambda m: _int(m.group(1))),
    _r("block_size", r"Setting kv cache block size to ([0-9]+)", lambda m: _int(m.group(1))),
    _r("usage_context", r"(api_server\.py|APIServer pid|model_tag)", lambda m: "serve"),
    # the budget terms
    _r("total_memory_gib", r"total_gpu_memory[ =(]+\s*" + NUMBER + r"\s*GiB"),
    _r("total_memory_gib", r"Free memory on device:\*?\*?\s*[0-9.]+\s*/\s*" + NUMBER + r"\s*GiB"),
    _r("gpu_memory_utilization", r"gpu_memory_utilization[ =(]+\s*" + NUMBER + r"\)?"),
    _r("gpu_memory_utilization", r"current --gpu-memory-utilization=" + NUMBER),
    _r("gpu_memory_utilization", r"increase --gpu-memory-utilization from " + NUMBER),
    _r("gpu_memory_utilization", r"Requested memory: " + NUMBER + r" \(util\)"),
    _r("requested_memory_gib", r"Requested memory: [0-9.]+ \(util\), " + NUMBER + r" GiB"),
    _r("requested_memory_gib", r"x gpu_memory_utilization \([0-9.]+\) = " + NUMBER + r"\s*GiB"),
    _r("requested_memory_gib", r"the current vLLM instance can use\s+" + NUMBER + r"\s*GiB"),
    _r("weights_gib", r"Loading model weights took " + NUMBER + r"\s*GB"),
    _r("weights_gib", r"Model loading took " + NUMBER + r"\s*Gi?B"),
    _r("weights_gib", r"model weights take\s+" + NUMBER + r"\s*GiB"),
    _r("weights_gib", r"weights memory: " + NUMBER + r"\s*GiB"),
    _r("weights_gib", r"Weight memory:\*?\*?\s*" + NUMBER + r"\s*GiB"),
    _r("activation_gib", r"PyTorch activation peak memory(?: takes)?\s+" + NUMBER + r"\s*GiB"),
    _r("activation_gib", r"torch peak memory increase: " + NUMBER + r"\s*GiB"),
    _r("activation_gib", r"Peak activation memory:\*?\*?\s*" + NUMBER + r"\s*GiB"),
    _r("peak_torch_memory_gib", r"peak_torch_memory=" + NUMBER + r"GiB"),
    _r("non_torch_gib", r"non_torch_memory(?: takes|=|\s)\s*" + NUMBER + r"\s*GiB"),
    _r("non_torch_gib", r"non-torch forward increase memory: " + NUMBER + r"\s*GiB"),
    _r("non_torch_gib", r"Non-torch memory:\*?\*?\s*" + NUMBER + r"\s*GiB"),
    _r("cudagraph_estimate_gib", r"Estimated CUDA graph memory: " + NUMBER + r"\s*GiB"),
    _r("cudagraph_applied", r"(CUDA graph memory profiling is enabled|will be enabled by default)",
       lambda m: m.group(1).startswith("CUDA graph memory profiling is enabled")),
    _r("cudagraph_actual_gib", r"Graph capturing finished in [0-9.]+ secs?, took " + NUMBER + r"\s*GiB"),
    _r("available_kv_gib", r"Available KV cache memory:\*?\*?\s*" + NUMBER + r"\s*GiB"),
    _r("available_kv_gib", r"the rest of the memory reserved for KV Cache is " + NUMBER + r"\s*GiB"),
    _r("available_kv_gib", r"\bkv_cache_size=" + NUMBER + r"GiB"),
    _r("available_kv_gib", r"available_kv_cache_memory\s+" + NUMBER + r"\s*GiB"),
    # the capacity
    _r("num_gpu_blocks", r"#? ?(?:GPU|CUDA) blocks: " + INT, lambda m: _int(m.group(1))),
    _r("num_gpu_blocks", r"num_gpu_blocks is: " + INT, lambda m: _int(m.group(1))),
    _r("kv_cache_tokens", r"GPU KV cache size: ([0-9,]+) tokens", lambda m: _int(m.group(1))),
    _r("padding_layers", r"Add ([0-9]+) padding layers", lambda m: _int(m.group(1))),
    # SGLang
    _r("sglang_kv", r"KV Cache is allocated\. #tokens: ([0-9,]+), K size: ([0-9.]+) GB, V size: ([0-9.]+) GB",
       lambda m: (_int(m.group(1)), _num(m.group(2)), _num(m.group(3)))),
    _r("sglang_tokens", r"max_total_num_tokens=" + INT, lambda m: _int(m.group(1))),
    _r("gpu_memory_utilization", r"mem_fraction_static[=:]\s*" + NUMBER),
    _r("sglang_tp", r"\btp_size=([0-9]+)", lambda m: _int(m.group(1))),
    _r("sglang_model", r"model_path='([^']+)'", lambda m: m.group(1)),
    _r("sglang_context", r"context_len=([0-9]+)", lambda m: _int(m.group(1))),
)

_CONCURRENCY = re.compile(r"Maximum concurrency for ([0-9,]+) tokens per request: " + NUMBER + r"x")
_V0_REFUSAL = re.compile(r"max (?:seq|model)[ _]len \(([0-9,.]+)\) is larger than the maximum number of tokens that can "
                         r"be stored in KV cache \(([0-9,.]+)\)")
_V1_REFUSAL = re.compile(r"max seq len \(([0-9,.]+)\),?\s*\(?(-?[0-9,.]+) GiB KV cache is needed, which is larger than "
                         r"the available KV cache memory \((-?[0-9,.]+) GiB\)")
_V1_ESTIMATE = re.compile(r"estimated maximum model length is " + INT)
_NO_MEMORY = re.compile(r"No available memory for the cache blocks|Not enough memory\. Please try to increase "
                        r"--mem-fraction-static")
_OUT_OF_MEMORY = re.compile(r"(?:CUDA|HIP) out of memory|OutOfMemoryError")
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})")
_SERVE_FLAG = re.compile(r"--([a-z-]+)[ =]\"?([^\s\"]+)")
_WORKER_RANK = re.compile(r"(?:rank=|TP|_TP)(\d+)")
_WARNINGS = re.compile(r"(padding layers|FlashInfer is not available|Custom allreduce is disabled|ValueError|"
                       r"larger than the (?:maximum number|available KV)|out of memory|No available memory)", re.I)

# non-default args / vllm serve flags -> fields
_ARG_FIELDS = {"model": "model", "model_tag": "model", "tensor_parallel_size": "tp", "pipeline_parallel_size": "pp",
               "max_model_len": "max_model_len", "gpu_memory_utilization": "gpu_memory_utilization",
               "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
               "block_size": "block_size", "dtype": "dtype", "kv_cache_dtype": "kv_cache_dtype",
               "quantization": "quantization", "enforce_eager": "enforce_eager", "tp": "tp", "pp": "pp",
               "max_model": "max_model_len"}
_FIELD_TYPES = {"tp": int, "pp": int, "max_model_len": int, "max_num_seqs": int, "max_num_batched_tokens": int,
                "block_size": int, "gpu_memory_utilization": float}


# vLLM's human-readable integers (``--max-model-len 32k``): k/m/g = 10^3/10^6/10^9, K/M/G = 2^10/2^20/2^30
_HUMAN_INT = re.compile(r"([0-9]+(?:\.[0-9]+)?)([kmgKMG])")
_HUMAN_UNITS = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}


def _typed(field: str, value: Any) -> Any:
    kind = _FIELD_TYPES.get(field)
    if field == "enforce_eager":
        return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "")
    if kind is None:
        return None if value is None else str(value)
    text = str(value).replace(",", "")
    short = _HUMAN_INT.fullmatch(text) if kind is int else None
    try:
        number = round(float(short.group(1)) * _HUMAN_UNITS[short.group(2)]) if short else kind(text)
    except ValueError:
        if any(ch.isdigit() for ch in text):
            raise Unreadable(text[:40]) from None  # digits, but not a number (or 5,000 of them)
        return None
    if not abs(number) <= MAX_LOGGED:  # NaN too
        raise Unreadable(text[:40])
    return number


def _args_dict(line: str) -> dict[str, Any]:
    """The ``non-default args: {...}`` dict of a vLLM log line ({} when it is truncated or garbled)."""
    match = _NON_DEFAULT.search(line)
    if not match:
        return {}
    try:
        value = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _serve_flags(line: str) -> dict[str, Any]:
    """``--flag value`` pairs of a ``vllm serve`` command line (``-tp 2`` too)."""
    out: dict[str, Any] = {}
    for flag, value in _SERVE_FLAG.findall(line):
        out[flag.replace("-", "_")] = value
    for short, name in (("-tp", "tensor_parallel_size"), ("-pp", "pipeline_parallel_size")):
        m = re.search(rf"(?:^|\s){short}[ =]([0-9]+)", line)
        if m:
            out[name] = m.group(1)
    if "--enforce-eager" in line:
        out["enforce_eager"] = True
    return out


class _Collect:
    """Accumulates fields while the lines are read (later lines win, except where noted)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.order: list[str] = []
        self.warnings: list[str] = []
        self.kv_by_rank: list[tuple[int | None, float]] = []
        self.sglang_lines = 0
        self.unreadable: list[str] = []

    def set(self, field: str, value: Any, *, keep_first: bool = False) -> None:
        if value is None or (keep_first and field in self.values):
            return
        self.values[field] = value
        if field not in self.order:
            self.order.append(field)


def _read_line(c: _Collect, line: str, lineno: int = 0) -> None:
    """Read one line (``lineno``: 1-based, for the unreadable-number messages)."""
    for field, pattern, read in _RULES:
        m = pattern.search(line)
        if not m:
            continue
        try:
            value = read(m)
        except Unreadable as exc:
            c.unreadable.append(_unreadable(lineno, field, exc, line))
            continue
        if field == "available_kv_gib":
            rank = _WORKER_RANK.search(line)
            c.kv_by_rank.append((int(rank.group(1)[:9]) if rank else None, value))
        if field.startswith("sglang_"):
            c.sglang_lines += 1
        if field == "sglang_kv":
            c.set("engine", "sglang")
            c.set("kv_cache_tokens", value[0])
            c.set("sglang_k_gib", value[1])
            c.set("sglang_v_gib", value[2])
        elif field == "sglang_tokens":
            c.set("engine", "sglang")
            c.set("kv_cache_tokens", value)
        elif field in ("sglang_tp", "sglang_model", "sglang_context"):
            c.set({"sglang_tp": "tp", "sglang_model": "model", "sglang_context": "max_model_len"}[field], value)
        elif field == "model" and "Starting to load model" in line:
            c.set(field, value, keep_first=True)
        else:
            c.set(field, value)
    m = _CONCURRENCY.search(line)
    if m:
        try:
            c.set("concurrency_len", _int(m.group(1)))
            c.set("max_concurrency", _num(m.group(2)))
        except Unreadable as exc:
            c.unreadable.append(_unreadable(lineno, "max_concurrency", exc, line))
    for key, value in {**_args_dict(line), **(_serve_flags(line) if "vllm serve" in line else {})}.items():
        if key in _ARG_FIELDS:
            field = _ARG_FIELDS[key]
            try:
                c.set(field, _typed(field, value))
            except Unreadable as exc:
                c.unreadable.append(_unreadable(lineno, field, exc, line))
    try:
        refusal = _refusal(line)
    except Unreadable as exc:
        c.unreadable.append(_unreadable(lineno, "refusal", exc, line))
        refusal = None
    if refusal is not None:
        c.set("refusal", refusal)
    if _NO_MEMORY.search(line):
        c.set("no_memory_line", lineno, keep_first=True)
    if _OUT_OF_MEMORY.search(line):
        c.set("out_of_memory_line", lineno, keep_first=True)
    if _WARNINGS.search(line):
        c.warnings.append(line.strip()[:300])


def _unreadable(lineno: int, field: str, exc: Unreadable, line: str) -> str:
    text = line.strip()
    text = text if len(text) <= 120 else text[:117] + "..."
    return f"line {lineno}: cannot read the number {str(exc)[:40]!r} ({field}) in {text!r}"


def _refusal(line: str) -> Refusal | None:
    m = _V0_REFUSAL.search(line)
    if m:
        return Refusal(_int(m.group(1)), kv_tokens=_int(m.group(2)))
    m = _V1_REFUSAL.search(line)
    if m:
        est = _V1_ESTIMATE.search(line)
        return Refusal(_int(m.group(1)), needed_gib=_num(m.group(2)), available_gib=_num(m.group(3)),
                       estimated_max_model_len=_int(est.group(1)) if est else None)
    return None


def _finish(c: _Collect) -> StartupLog:
    v = c.values
    if c.kv_by_rank:  # vLLM sizes every rank's pool to the smallest; rank 0 holds the largest pp stage
        ranked = [kv for rank, kv in c.kv_by_rank if rank == 0]
        v["available_kv_gib"] = ranked[0] if ranked else max(kv for _, kv in c.kv_by_rank)
    if v.get("refusal") is not None and v["refusal"].available_gib is not None:
        c.set("available_kv_gib", v["refusal"].available_gib, keep_first=True)
    if "engine" not in v and any(k in v for k in ("mode", "available_kv_gib", "num_gpu_blocks", "concurrency_len",
                                                   "weights_gib", "refusal")):
        v["engine"] = "vllm"
    if "engine" in v and not c.sglang_lines and "mode" not in v:  # vLLM: V0 or V1 by the lines it printed
        v0 = any(k in v for k in ("peak_torch_memory_gib", "num_gpu_blocks")) and "kv_cache_tokens" not in v
        if v0 or (v.get("refusal") is not None and v["refusal"].kv_tokens is not None):
            v["mode"] = "V0"
        elif any(k in v for k in ("kv_cache_tokens", "cudagraph_estimate_gib")) or (
                v.get("refusal") is not None and v["refusal"].needed_gib is not None):
            v["mode"] = "V1"
    if v.get("max_model_len") is None:
        v["max_model_len"] = v.get("concurrency_len") or (v["refusal"].max_model_len if v.get("refusal") else None)
    v["not_started"] = _not_started(v)
    known = {f.name for f in fields(StartupLog)}
    return StartupLog(**{k: val for k, val in v.items() if k in known}, warnings=tuple(c.warnings),
                      matched=tuple(k for k in c.order if k in known), unreadable=tuple(c.unreadable))


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
    sized = any(v.get(k) is not None for k in ("available_kv_gib", "num_gpu_blocks", "kv_cache_tokens"))
    if v.get("out_of_memory_line") is not None and not sized:  # after sizing (graph capture): a warning line only
        return f"out of GPU memory (line {v['out_of_memory_line']}) before the KV cache was sized"
    for field, what in (("available_kv_gib", "available KV cache memory {} GiB"), ("num_gpu_blocks", "{} GPU blocks"),
                        ("kv_cache_tokens", "a KV cache of {} tokens")):
        if v.get(field) is not None and v[field] <= 0:
            return what.format(v[field]) + ": no memory for the cache blocks"
    return None


def parse_log(text: str) -> StartupLog:
    """Parse a start-up log (any mix of vLLM / SGLang lines; unknown lines are skipped)."""
    c = _Collect()
    for lineno, line in enumerate(str(text).splitlines(), 1):
        if len(line) > 100_000:  # a garbled megabyte line: nothing of ours is that long
            line = line[:100_000]
        _read_line(c, line, lineno)
    return _finish(c)


__all__ = ["StartupLog", "Refusal", "Unreadable", "parse_log", "printed_interval", "decimals"]
