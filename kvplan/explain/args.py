"""A start-up log's command lines and argument dicts (vllm serve, sglang.launch_server, non-default args, ServerArgs)
-> StartupLog fields, typed and bounded.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from kvplan.explain import lines as L
from kvplan.explain.printed import MAX_LOGGED
from kvplan.explain.startup_log import Unreadable
from kvplan.limits import MAX_SIZE_BYTES

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
