"""The facts a start-up log gives: the estimate options of its deployment (log_values) and its own account of the
budget per GPU, term by term as printed (the second step of kvplan.explain.reconcile).
"""

from __future__ import annotations

import math
import re
from typing import Any

from kvplan.engines import release_tuple
from kvplan.errors import KvplanError
from kvplan.explain.account import ExplainError, account
from kvplan.explain.printed import printed_interval
from kvplan.explain.startup_log import StartupLog
from kvplan.units import GiB, plural

STAND_IN_UTIL = 0.9  # only to size a stand-in GPU for the layout when the log prints neither total nor requested

_VALUE_FIELDS = {"tp": "tp", "pp": "pp", "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
                 "block_size": "block_size", "usage_context": "usage_context", "enforce_eager": "enforce_eager"}
# A log's total memory and a named GPU's differ by more than this: the two are not the same card.
GPU_MISMATCH_BYTES = round(0.5 * GiB)
# from 0.12 the profiled sampler no longer depends on whether FlashInfer is installed (and the 0.13+ wheels depend on
# flashinfer-python; 0.8 - 0.9 do not list it, 0.10 - 0.11 as an extra only: their METADATA)
WHEEL_FLASHINFER_FROM = (0, 12, 0)


def _dtype(text: str | None) -> str | None:
    return None if not text or text == "auto" else text


def _log_total(log: StartupLog) -> tuple[float | None, str]:
    """The device's total memory (GiB) as the log gives it: printed (``total_memory=``, "Free memory on device
    (free/total)", ``total_gpu_memory``, torch's out-of-memory text), or implied by the requested share and the
    utilisation (``requested / util``, to +-0.01 GiB) - and which of the two."""
    if log.total_memory_gib is not None:
        return log.total_memory_gib, "printed"
    util, requested = log.gpu_memory_utilization, log.requested_memory_gib
    if requested and util and not log.is_cpu and not account(log.engine).measures_free_memory:
        return round(requested / util, 2), "implied"
    return None, ""


def _catalogue_name(log: StartupLog) -> tuple[str | None, str]:
    """The catalogue GPU the log names (its device name) or whose memory its total is, and how it was found."""
    from kvplan.gpus import find_gpu, gpus_by_memory

    if log.device_name:
        try:
            return find_gpu(log.device_name).name, f"the log's device {log.device_name}"
        except KvplanError:
            pass
    total, how = _log_total(log)
    if total is None or log.is_cpu:
        return None, ""
    vendor = "amd" if log.platform == "rocm" else ("nvidia" if log.platform == "cuda" else None)
    near = gpus_by_memory(round(total * GiB), vendor=vendor)
    if not near:
        return None, ""
    also = f"; {near[1].name} reports within 0.06 GiB too" if len(near) > 1 else ""
    said = (f"{total} GiB total" if how == "printed" else
            f"{total} GiB total (requested {log.requested_memory_gib} GiB / util {log.gpu_memory_utilization:g})")
    return near[0].name, f"GPU not printed: {said} is what {near[0].name} reports (pass --gpu if it is another{also})"


def _gpu_values(log: StartupLog, overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str], bool]:
    """The GPU options (``gpu``, ``gpu_memory``), notes, and whether the GPU is the deployment's (not a stand-in).

    A total the log prints is planned (the named card's SM count and interconnect still used); one the log implies
    (requested / util) only finds the card, or is planned when no catalogue card has it."""
    notes: list[str] = []
    total, how = _log_total(log)
    out: dict[str, Any] = {k: overrides[k] for k in ("gpu", "gpu_memory") if overrides.get(k)}
    if out:  # the user's GPU; the total the log printed still wins
        if "gpu" in out and total and not log.is_cpu:
            from kvplan.gpus import find_gpu

            named = find_gpu(out["gpu"])  # an unknown name is the user's mistake: exit 2
            if named.memory_bytes and abs(named.memory_bytes - round(total * GiB)) > GPU_MISMATCH_BYTES:
                seen, _ = _catalogue_name(log)
                what = "total memory" if how == "printed" else (f"total memory (requested {log.requested_memory_gib} "
                                                                f"GiB / util {log.gpu_memory_utilization:g})")
                notes.append(f"--gpu {out['gpu']} ({named.memory_bytes / GiB:.2f} GiB) contradicts the log's {what} "
                             f"{total} GiB" + (f" (what {seen} reports)" if seen else "")
                             + ": kvplan plans the log's total" + (f" on the {seen}" if seen else ""))
                out["gpu_memory"] = f"{total}GiB"
                # the named card cannot hold the log's total (a plan refuses a --gpu-memory past its card's): plan the
                # card the total matches, or the total alone
                if seen:
                    out["gpu"] = seen
                else:
                    del out["gpu"]
        if how == "printed" and "gpu_memory" not in out:
            out["gpu_memory"] = f"{total}GiB"
        return out, notes, True
    if log.is_cpu:
        out["gpu"] = "cpu"
        if total:
            out["gpu_memory"] = f"{total}GiB"
        return out, notes, True
    name, found = _catalogue_name(log)
    if name:
        out["gpu"] = name
        if found.startswith("GPU not printed"):
            notes.append(found)
    if total and (how == "printed" or not name):
        out["gpu_memory"] = f"{total}GiB"
        if how == "implied" and not name:
            notes.append(f"GPU not printed: planned with the {total} GiB total that requested "
                         f"{log.requested_memory_gib} GiB / util {log.gpu_memory_utilization:g} imply")
    return out, notes, bool(out)


def _stand_in_memory(log: StartupLog) -> str:
    """A GPU size for the plan's layout when the GPU is unknown: the least total the log's figures allow (only the
    engine's batching defaults read it; kvplan's own terms are not shown without the GPU)."""
    util = log.gpu_memory_utilization or STAND_IN_UTIL
    if log.requested_memory_gib:
        return f"{log.requested_memory_gib / util:.2f}GiB"
    if log.sglang_avail_before_load_gib:  # SGLang: free before the weights load, which the weights and KV came out of
        return f"{max(log.sglang_avail_before_load_gib, (log.weights_gib or 0) + (log.kv_gib or 0), 1.0):.2f}GiB"
    used = (log.weights_gib or 0) + (log.kv_gib or 0)
    return f"{max(used / util, 1.0):.2f}GiB"


def _version(text: str) -> tuple[int, ...]:
    return tuple(99 if part == "x" else int(part) for part in text.split("."))


def release_candidates(log: StartupLog) -> tuple[str, ...]:
    """The modelled releases (newest first) whose rules may be the log's, when it does not print a release number:
    those covering the releases that print every line form of the log (:attr:`StartupLog.releases`). Empty when the
    log prints its version, has no dated form, or is a V0 log (planned with the V0 rules)."""
    from kvplan.engines.registry import engine as engine_rules

    if log.releases is None or log.mode == "V0" or (log.version and not _SOURCE_BUILD.match(log.version)):
        return ()
    rules = engine_rules(log.engine or "vllm")
    lo, hi = _version(log.releases[0]), _version(log.releases[1]) if log.releases[1] else None
    firsts = [(v, _version(rules.RANGES[v].split()[0])) for v in rules.VERSIONS]
    out = []
    for i, (v, first) in enumerate(firsts):
        after = firsts[i + 1][1] if i + 1 < len(firsts) else None  # the next modelled release's first
        if (hi is None or first <= hi) and (after is None or lo < after):
            out.append(v)
    return tuple(reversed(out))


def _util_from_requested(log: StartupLog) -> float | None:
    """The utilisation the log's requested memory and total give, where the printed one is that rounded (V0 prints
    ``%.2f``: 0.696 shows as 0.70 and would plan 0.3 GiB more on 80 GB); ``None`` when the printed one is exact."""
    total, requested, util = log.total_memory_gib, log.requested_memory_gib, log.gpu_memory_utilization
    if not total or not requested or util is None or log.is_cpu:
        return None
    ratio = requested / total
    lo, hi = printed_interval(util, max(2, len(repr(util).split(".")[-1])))
    if abs(ratio - util) <= 0.0005 or not lo - 0.0005 <= ratio <= hi + 0.0005:
        return None
    return round(ratio, 4)


def _deployment_values(log: StartupLog, values: dict[str, Any], notes: list[str]) -> None:
    """Into ``values`` (and ``notes``): the release, the batching and parallel settings and the block size the log
    gives (printed, or implied by its worker names and its concurrency line)."""
    if log.version and _SOURCE_BUILD.match(log.version):
        if not release_candidates(log):
            notes.append(f"version {log.version} is a source build without a release number: kvplan used its newest "
                         "rules (pass --engine-version)")
    elif log.version:
        values["engine_version"] = log.version
    for field, key in _VALUE_FIELDS.items():
        if getattr(log, field) is not None:
            values[key] = getattr(log, field)
    if "block_size" not in values:
        from kvplan.engines.registry import engine as engine_rules

        choices = engine_rules(values["engine"]).BLOCK_SIZES
        if log.engine_block_size is not None:
            if choices is None or log.engine_block_size in choices:  # else a hybrid's: kvplan's layout computes its own
                values["block_size"] = log.engine_block_size
        elif choices is not None and log.block_size is None:
            implied = block_size_from_concurrency(log, choices)
            if implied is not None:
                values["block_size"] = implied
                notes.append(f"block size {implied}: the log's {plural(log.num_gpu_blocks, 'block')} x "
                             f"{plural(implied, 'token')} hold {log.max_concurrency:g}x "
                             f"{plural(log.concurrency_len, 'token')} (no other block size does)")
    workers_tp = log.workers_tp
    if workers_tp and log.workers_pp is None and (values.get("pp") or 1) > 1:  # global ranks: tp x pp of them
        workers_tp //= values["pp"]
    for key, seen, word in (("tp", workers_tp, "tensor-parallel ranks"), ("pp", log.workers_pp, "pipeline stages")):
        if seen and seen > 1 and key not in values:
            values[key] = seen
            notes.append(f"{key} {seen}: the log prints no {key} setting; its worker names show {seen} {word} "
                         f"(a lower bound where not every worker printed: pass --{key})")


def _memory_values(log: StartupLog, values: dict[str, Any], notes: list[str]) -> None:
    """Into ``values`` (and ``notes``): prefix caching, the sampler, the lengths, the utilisation, the dtypes, an
    explicit KV budget and the quantization the log gives."""
    if log.prefix_caching is not None:  # a vLLM line (SGLang prints its radix cache otherwise)
        values["prefix_caching"] = log.prefix_caching
    if log.chunked_prefill is not None:  # vLLM's; V1 0.8 - 0.11.0 chunk whatever it says (a note then says so)
        values["chunked_prefill"] = log.chunked_prefill
    if log.flashinfer_sampler is not None:
        values["flashinfer"] = log.flashinfer_sampler
    elif log.wheel_install and release_tuple(values.get("engine_version") or "0.11", "vllm") < WHEEL_FLASHINFER_FROM:
        values["flashinfer"] = False
        notes.append("vLLM runs from a site-packages directory (a virtualenv or conda env: a pip / uv install of the "
                     "wheel), and the 0.8 - 0.11 wheels install no FlashInfer (0.10 - 0.11 list it as an extra): "
                     "kvplan plans the native sampler path (pass --flashinfer if it was installed)")
    if log.max_model_len:
        values["max_model_len"] = values["context"] = log.max_model_len
    if log.gpu_memory_utilization is not None:  # SGLang's mem_fraction_static is its utilisation
        values["gpu_util"] = log.gpu_memory_utilization
        exact = _util_from_requested(log)
        if exact is not None:
            values["gpu_util"] = exact
            notes.append(f"utilisation {exact:g} = requested / total ({log.requested_memory_gib} / {log.total_memory_gib} "
                         f"GiB); the log prints it rounded to {log.gpu_memory_utilization:g}")
    if _dtype(log.dtype):
        values["dtype"] = log.dtype
    if _dtype(log.kv_cache_dtype):
        values["kv_dtype"] = log.kv_cache_dtype
    if log.kv_cache_memory_bytes:
        values["kv_budget_bytes"] = log.kv_cache_memory_bytes
    elif log.cpu_kv_space_gib is not None and log.is_cpu:
        values["kv_budget_bytes"] = round(log.cpu_kv_space_gib * GiB)
    elif log.explicit_kv_gib is not None:
        values["kv_budget"] = f"{log.explicit_kv_gib}GiB"
    if log.quantization:
        from kvplan.engines import CHECKPOINT_QUANTIZATION, ONLINE_QUANTIZATION

        if log.quantization in ONLINE_QUANTIZATION or log.quantization in CHECKPOINT_QUANTIZATION:
            values["quantization"] = log.quantization
        else:
            notes.append(f"quantization {log.quantization!r} from the log is not modelled: weights from the checkpoint")


def _too_little(log: StartupLog, values: dict[str, Any]) -> ExplainError:
    """The error for a log with no KV cache line: what was found and what is missing."""
    missing = [what for what, ok in (("the model (pass --model)", "model" in values),
                                     ("the GPU (pass --gpu NAME or --gpu-memory SIZE)", "gpu" in values or "gpu_memory" in values))
               if not ok]
    missing.append("the KV cache lines (Available KV cache memory / GPU KV cache size / GPU blocks / SGLang's "
                   "KV Cache is allocated / a refusal)")
    found = ", ".join(log.matched) if log.matched else "nothing kvplan recognises"
    return ExplainError(f"the log does not say enough to explain it: found {found}; missing " + "; ".join(missing),
                        "a vLLM or SGLang start-up log from the engine's first lines to 'GPU KV cache size' "
                        "(SGLang: 'KV Cache is allocated')")


def log_values(log: StartupLog, overrides: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Estimate option values for the deployment in ``log`` (the user's ``overrides`` win) and notes.

    The model and the GPU may be missing (``values`` then lacks ``model`` / ``gpu`` and ``gpu_memory``).
    Raises :class:`ExplainError` when the log has numbers no engine prints, or no line about the KV cache at all
    (naming what was found and what is missing).
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
    if overrides.get("model") and log.model and overrides["model"] != log.model:
        notes.append(f"--model {overrides['model']} replaces the log's model {log.model}")
    _deployment_values(log, values, notes)
    _memory_values(log, values, notes)
    gpu, gpu_notes, _ = _gpu_values(log, overrides)
    values.update(gpu)
    notes += gpu_notes
    values.update({k: v for k, v in overrides.items() if k not in ("gpu", "gpu_memory")})
    if "max_model_len" in overrides and "context" not in overrides:
        values["context"] = overrides["max_model_len"]
    if "engine_version" not in values and log.mode == "V0":
        values["engine_version"] = "0.6"
        notes.append("version not in the log; its V0 format is vLLM 0.6 - 0.7: kvplan used the 0.6 rules")
    elif "engine_version" not in values and not log.version and not release_candidates(log):
        notes.append(f"version not in the log: kvplan used its newest {values['engine']} rules (pass --engine-version)")
    if not log.has_capacity:
        raise _too_little(log, values)
    return values, notes


def _b(gib: float | None) -> int | None:
    return None if gib is None else round(gib * GiB)


def _cudagraph(log: StartupLog) -> tuple[int | None, str]:
    """The CUDA-graph memory the log's budget subtracted (bytes; ``None``: the log says nothing of graphs) and what
    the log prints about graphs."""
    actual = log.cudagraph_actual_gib
    captured = f"{actual} GiB captured after the KV cache was sized" if actual is not None else ""
    if account(log.engine).measures_free_memory:  # SGLang: graphs live in 1 - mem_fraction_static
        return (0 if actual is not None else None), (f"{captured}, in 1 - mem_fraction_static: not subtracted"
                                                     if captured else "")
    if log.cudagraph_estimate_gib is not None:
        if log.cudagraph_applied:
            return _b(log.cudagraph_estimate_gib), ", ".join(filter(None, (f"estimate {log.cudagraph_estimate_gib} GiB "
                                                                         "subtracted", captured)))
        return 0, ", ".join(filter(None, (f"estimate {log.cudagraph_estimate_gib} GiB logged, not subtracted in this "
                                          "release", captured)))
    if log.activation_holds_graphs:  # 0.27+: the estimate is subtracted inside the printed activation
        return 0, ", ".join(filter(None, ("the estimate is in the printed peak activation (0.27+)", captured)))
    if actual is not None:  # no estimate line: nothing was subtracted (every release that subtracts logs it)
        return 0, f"{captured}: not subtracted in this release"
    return None, ""


def _logged_terms(log: StartupLog) -> dict[str, int | None]:
    """The log's per-GPU terms in bytes, named as kvplan names them."""
    weights, activation, overhead = log.weights_gib, log.activation_gib, log.non_torch_gib
    if activation is None and log.peak_torch_memory_gib is not None and log.weights_gib is not None:
        activation = log.peak_torch_memory_gib - log.weights_gib  # 0.6.4: the peak includes the weights
    if log.consumed_gib is not None:  # 0.27+: weights + non-torch in one figure
        if weights is not None and overhead is None:
            overhead = log.consumed_gib - weights
        elif weights is None:
            weights = log.consumed_gib if overhead is None else log.consumed_gib - overhead
    if "activation" not in account(log.engine).terms:
        activation = overhead = None
        before, after = log.sglang_avail_before_load_gib, log.sglang_avail_after_load_gib
        if weights is None and before is not None and after is not None:  # what 0.4.6+ prints as "mem usage"
            weights = before - after
    return {"weights": _b(weights), "activation": _b(activation), "overhead": _b(overhead),
            "cudagraph": _cudagraph(log)[0]}


def logged_kv_bytes(log: StartupLog) -> int | None:
    """The KV budget per GPU the log prints (bytes), exact when the deployment set it in bytes; implied by the
    requested memory and every printed term when the excerpt ends before the KV line."""
    if log.kv_cache_memory_bytes is not None and log.available_kv_gib is None:
        return log.kv_cache_memory_bytes
    if log.kv_gib is None and log.prints_every_term:
        requested, _ = _requested(log)
        return requested - sum(v for v in _logged_terms(log).values() if v is not None)
    return _b(log.kv_gib)


def implied_kv_bytes(log: StartupLog, plan: Any) -> int | None:
    """The KV pool an SGLang log's ``max_total_num_tokens`` implies where it prints no KV size (bytes per GPU):
    its tokens in whole pages x the plan's bytes per page (kvplan's cell size); None when the log prints a KV
    budget, no tokens, or is not SGLang's."""
    if plan is None or not account(log.engine).measures_free_memory or log.kv_cache_tokens is None \
            or logged_kv_bytes(log) is not None:
        return None
    return log.kv_cache_tokens // plan.layout.block_size * plan.layout.block_bytes


IMPLIED = "implied: max_total_num_tokens"  # how the note of a KV budget the tokens imply begins


def _requested(log: StartupLog) -> tuple[int | None, str]:
    """The share of the device the log's budget comes from (bytes), and how the log gives it."""
    if account(log.engine).measures_free_memory:
        free = log.sglang_avail_before_load_gib
        if free is None or log.gpu_memory_utilization is None:
            return None, ""
        return round(free * GiB * log.gpu_memory_utilization), (f"free before loading {free} GiB x "
                                                                f"mem_fraction_static {log.gpu_memory_utilization:g}")
    if log.requested_memory_gib is not None:
        return _b(log.requested_memory_gib), ""
    if log.total_memory_gib is not None and log.gpu_memory_utilization is not None and not log.is_cpu:
        return math.ceil(log.total_memory_gib * GiB * log.gpu_memory_utilization), "total x util (not printed)"
    return None, ""


def block_size_from_concurrency(log: StartupLog, choices: tuple[int, ...]) -> int | None:
    """The block size (tokens) a V0-style log's own numbers imply, or ``None``: where a log prints the blocks and
    ``Maximum concurrency for N tokens per request: X`` but no token count, ``X = blocks x block size / N`` (V0's
    rule, printed to 2 decimals) holds for one of the engine's ``choices`` only. Only a size other than the
    default 16 is returned, and only when it is the one choice that reproduces the line (a backend that chose
    its own pages, such as FlashMLA's 64, and printed no line saying so)."""
    if not log.num_gpu_blocks or not log.concurrency_len or log.max_concurrency is None or log.kv_cache_tokens is not None:
        return None
    fits = [size for size in choices if round(log.num_gpu_blocks * size / log.concurrency_len, 2) == log.max_concurrency]
    return fits[0] if len(fits) == 1 and fits[0] != 16 else None


_SOURCE_BUILD = re.compile(r"^0\.(?:0\.0|1)\.dev")  # setuptools-scm's version of a checkout without release tags

PRINT_HALF_STEP_BYTES = round(0.005 * GiB)  # a GiB figure printed with 2 decimals is exact to +- this
