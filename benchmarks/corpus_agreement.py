"""How close kvplan's engine model comes to what real vLLM / SGLang start-ups printed, over the whole corpus.

Every start in benchmarks/corpus/ that names a model kvplan can plan and a GPU whose memory is known is
planned from its *inputs* (model, GPU, engine release, tp / pp and the flags the log states; never a
number the engine derived) and the plan's KV capacity is set beside the logged one:

- ``compare``: which logged figure (``tokens``: "GPU KV cache size" / SGLang ``max_total_num_tokens``;
  ``blocks``: "# GPU blocks"; ``refusal``: the tokens of a V0 refusal; ``kv_gib``: "Available KV cache
  memory"; ``concurrency``: "Maximum concurrency");
- ``err``: (kvplan - logged) / logged; positive = kvplan promises more than the engine gave (the unsafe side);
- ``gib``: the same gap in GiB of KV per GPU;
- ``range``: whether the logged value lies in the plan's range (``Plan.kv_range``), when it has one;
- ``terms``: with every budget term the log prints put in place of kvplan's estimate, the gap that is left,
  and the term whose estimate differs most from the log.

Rows are summarised by split (calibration / validation, benchmarks/corpus.py) and by engine x release family
x GPU class x tp.

    PYTHONPATH=. python3 benchmarks/corpus_agreement.py [--split validation] [--markdown] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus  # noqa: E402

from kvplan.engines import given  # noqa: E402
from kvplan.engines.spread import rough_weights  # noqa: E402
from kvplan.errors import KvplanError  # noqa: E402
from kvplan.units import GiB  # noqa: E402

TERM_OF_OPTION = {"weights_gib": "weights", "activation_gib": "activation", "overhead_gib": "overhead",
                  "cudagraph_gib": "cudagraph"}
COMPARE_ORDER = ("tokens", "blocks", "refusal", "max_len", "kv_gib", "concurrency")
SPREAD_FILE = Path(__file__).resolve().parents[1] / "kvplan" / "data" / "kv_spread.yaml"
NOMINAL_GPU_BYTES = 80 * GiB  # a GPU memory for rows planned from the logged budget (it does not enter the blocks)
_DTYPES = {"half": "float16", "float16": "float16", "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float32": "float32", "float": "float32", "auto": None}


@dataclass(frozen=True)
class Row:
    id: str
    split: str
    basis: str  # "inputs": planned from the log's inputs; "logged budget": the block arithmetic of its KV budget
    engine: str
    release: str  # kvplan's modelled release
    family: str  # the release family of the summary table
    gpu: str
    gpu_class: str
    tp: int
    compare: str
    logged: float
    kvplan: float
    err_pct: float
    gib: float  # kvplan - logged, GiB of KV per GPU
    in_range: bool | None
    range_width_pct: float | None
    terms_err_pct: float | None
    biggest_term: str
    model: str
    rough: bool = False  # the weights were counted from parameters x a dtype (the range allows more of them)
    deltas: dict[str, float] = field(default_factory=dict)  # per printed term: kvplan's - the log's, GiB per GPU
    kvplan_terms: dict[str, float] = field(default_factory=dict)  # kvplan's estimate of each term, GiB per GPU
    rest_gib: float | None = None  # kvplan - logged KV with every term the release charges put in (None: not all
    # printed): what no log line prints
    model_family: str = ""  # dense | moe | vision | hybrid (kvplan.engines.spread.model_family)
    board: str = ""  # the term classes' board (kvplan.engines.spread.board)
    low_holds: bool | None = None  # the range's low end is at or below the engine's figure (None: no range)
    low_width_pct: float | None = None  # (estimate - low end) / estimate, %
    dominant: str = ""  # the term whose spread dominates the low end
    unified_gib: float | None = None  # on a unified-memory device: kvplan - logged KV with the printed terms put in
    # and no allowance for the host's use (Budget.host_bytes added back): what the host's use took
    platform: str = "cuda"  # the planned GPU's platform (cuda, rocm): the spread's coverage (covered_table)


def _num(x: Any) -> float | None:
    try:
        return None if x is None else float(x)
    except (TypeError, ValueError):
        return None


def logged_value(meta: dict[str, Any], compare: str | None) -> tuple[str, float] | None:
    """The logged figure to compare, and which one (the first of :data:`COMPARE_ORDER` the log prints)."""
    r = meta.get("reported") or {}
    values = {
        "tokens": _num(r.get("kv_cache_tokens")) or _num(r.get("max_total_num_tokens")),
        "blocks": _num(r.get("num_gpu_blocks")),
        "refusal": _num(r.get("refusal_kv_tokens")),
        "max_len": _num(r.get("estimated_max_model_len")),
        "kv_gib": _num(r.get("available_kv_gib")),
        "concurrency": _num(r.get("max_concurrency")),
    }
    for key in ((compare,) if compare else COMPARE_ORDER):
        if values.get(key) is not None and values[key] > 0:
            return key, values[key]
    return None


def _bundled_ids() -> dict[str, str]:
    from kvplan.model.sources import bundled_ids

    return {m.lower(): m for m in bundled_ids()}


def resolve_model(meta: dict[str, Any]) -> str | None:
    """The bundled spec to plan with: the curated ``kvplan.model``, else the logged id if it is bundled."""
    planned = corpus.planned_as(meta).get("model")
    if planned:
        return planned
    logged = str(meta.get("model") or "").strip().rstrip("/")
    return _bundled_ids().get(logged.lower())


def planned_gpu(meta: dict[str, Any]) -> tuple[str | None, int | None]:
    """``(catalogue name, memory bytes)``: the curated or logged GPU from the catalogue, else the logged total."""
    from kvplan.gpus import find_gpu

    block = meta.get("kvplan") or {}
    total = _num((meta.get("reported") or {}).get("total_memory_gib"))
    name = block.get("gpu")
    if name is None and "gpu" not in block and meta.get("gpu"):
        try:
            name = find_gpu(str(meta["gpu"])).name
        except KvplanError:
            name = None
    if name:
        return str(name), None
    return None, round(total * GiB) if total else None


def options_for(meta: dict[str, Any], model: str, terms: dict[str, int] | None = None):  # noqa: ANN201 - Options
    """kvplan's options for one logged start: its inputs only (the flags it states, its release, GPU, tp/pp)."""
    from kvplan.planning.plan import options_from_values

    flags = dict(meta.get("flags") or {})
    engine = meta["engine"]
    gpu, memory = planned_gpu(meta)
    values: dict[str, Any] = {"model": model, "engine": engine, "tp": int(meta.get("tp") or 1),
                              "pp": int(meta.get("pp") or 1), "offline": True}
    values["gpus"] = values["tp"] * values["pp"]
    if gpu:
        values["gpu"] = gpu
    elif memory:
        values["gpu_memory"] = f"{memory}B"
    planned = corpus.planned_as(meta)
    for key in ("engine_version", "usage_context"):
        if key in planned:
            values[key] = planned[key]
    util = flags.get("gpu_memory_utilization" if engine == "vllm" else "mem_fraction_static")
    if util is not None:
        values["gpu_util"] = float(util)
    length = flags.get("max_model_len") or flags.get("context_length") or flags.get("max_seq_len")
    if length:
        values["max_model_len"] = values["context"] = int(length)
    elif meta.get("reported", {}).get("max_concurrency_tokens"):
        values["max_model_len"] = values["context"] = int(meta["reported"]["max_concurrency_tokens"])
    kv = str(flags.get("kv_cache_dtype") or "auto")
    if kv not in ("auto", "None"):
        values["kv_dtype"] = kv
    dtype = _DTYPES.get(str(flags.get("dtype") or "auto").lower())
    if dtype:
        values["dtype"] = dtype
    for flag, option in (("max_num_seqs", "max_num_seqs"), ("max_running_requests", "max_num_seqs"),
                         ("max_num_batched_tokens", "max_num_batched_tokens"),
                         ("chunked_prefill_size", "max_num_batched_tokens"), ("block_size", "block_size"),
                         ("page_size", "block_size")):
        if flags.get(flag) and option not in values:
            values[option] = int(flags[flag])
    if flags.get("enforce_eager") in (True, "true", "True") or flags.get("disable_cuda_graph") in (True, "true"):
        values["enforce_eager"] = True
    chunked = str(flags.get("enable_chunked_prefill")).lower()
    if engine == "vllm" and chunked in ("true", "false"):
        values["chunked_prefill"] = chunked == "true"
    if "enable_prefix_caching" in flags and flags["enable_prefix_caching"] is not None:
        values["prefix_caching"] = bool(flags["enable_prefix_caching"])
    values.update({k: v for k, v in planned.items() if k not in ("model", "engine_version", "usage_context")})
    values.update(terms or {})
    return options_from_values(values)


def _stated_lengths(meta: dict[str, Any]) -> set[str]:
    """``{"max_model_len"}`` when the log states the max_model_len (a flag, or the concurrency line's length)."""
    flags = meta.get("flags") or {}
    stated = any(flags.get(k) for k in ("max_model_len", "context_length", "max_seq_len"))
    stated = stated or bool((meta.get("reported") or {}).get("max_concurrency_tokens"))
    stated = stated or "max_model_len" in ((meta.get("kvplan") or {}).get("options") or {})
    return {"max_model_len"} if stated else set()


def logged_terms(meta: dict[str, Any], tp_pp: int, cudagraph_subtracted: bool = True,
                 graphs_in_activation: float | None = None) -> dict[str, str]:
    """The budget terms the log prints, as kvplan option values (per GPU; weights over all GPUs); the CUDA-graph
    memory only where the release subtracts it (before, graphs come out of the 1 - util slack).

    ``graphs_in_activation`` (GiB; None: the release prints them apart): the release's printed peak activation
    holds the CUDA-graph estimate it subtracts (vLLM 0.27+, ``Profile.printed_activation``) and the "CUDAGraph
    memory" it prints is the graphs captured later, not the estimate: the graphs are not subtracted twice. Where
    the log prints vLLM's "(estimated)" figure (``cudagraph_estimate_gib``) it comes out of the activation and is the
    graphs' term; else the log prints only the sum, and the estimate given (kvplan's own) comes out of the
    activation, so the sum's gap falls on the activation and the graphs count as not printed."""
    r = meta.get("reported") or {}
    out: dict[str, str] = {}
    if _num(r.get("weights_gib")) is not None:
        out["weights_gib"] = f"{_num(r['weights_gib']) * tp_pp}GiB"
    activation = _num(r.get("activation_gib")) if r.get("activation_gib") is not None else _num(r.get("activation_peak_gib"))
    graphs = _num(r.get("cudagraph_gib"))
    if graphs_in_activation is not None:
        graphs = _num(r.get("cudagraph_estimate_gib"))
        taken = graphs if graphs is not None else graphs_in_activation
        activation = None if activation is None else activation - taken
    if activation is not None:
        out["activation_gib"] = f"{max(0.0, activation)}GiB"
    elif _num(r.get("peak_torch_memory_gib")) is not None and _num(r.get("weights_gib")) is not None:
        out["activation_gib"] = f"{max(0.0, _num(r['peak_torch_memory_gib']) - _num(r['weights_gib']))}GiB"
    if _num(r.get("non_torch_gib")) is not None:
        out["overhead_gib"] = f"{max(0.0, _num(r['non_torch_gib']))}GiB"
    if graphs is not None and meta["engine"] == "vllm" and cudagraph_subtracted:
        out["cudagraph_gib"] = f"{max(0.0, graphs)}GiB"
    return out


def sglang_logged_terms(meta: dict[str, Any], plan: Any) -> dict[str, str]:
    """SGLang's budget terms as its log prints them, as kvplan option values: the weights ("Load weight end ...
    mem usage", else "Load weight begin" - "Load weight end" avail mem; per GPU x tp x pp) and the memory in use
    before loading (kvplan's total - the free memory at "Load weight begin", else "Load weight end"'s avail mem +
    mem usage) x mem_fraction_static, the part of the pool's arithmetic it charges. SGLang's "GB" are GiB
    (``get_available_gpu_memory`` divides by 1 << 30). 0.3 - 0.4.6 at tp >= 2 read "Load weight begin" after the late
    NCCL communicator (:func:`kvplan.engines.sglang.late_comm_bytes`), so the logged term holds it x the fraction;
    its rest x (1 - fraction) is left to the rest."""
    r = meta.get("reported") or {}
    before, after, usage = (_num(r.get(k)) for k in ("avail_mem_before_load_gb", "avail_mem_after_load_gb",
                                                     "weights_mem_usage_gb"))
    if usage is None and before is not None and after is not None:
        usage = before - after
    if before is None and after is not None and usage is not None:
        before = after + usage
    out: dict[str, str] = {}
    if usage is not None:
        out["weights_gib"] = f"{usage * plan.options.tp * plan.options.pp}GiB"
    if before is not None:
        in_use = max(0.0, plan.budget.total_bytes / GiB - before)
        out["overhead_gib"] = f"{in_use * plan.budget.gpu_util}GiB"
    return out


_LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=([0-9.]+) GB")
_DIST_END = re.compile(r"Init torch distributed ends\..*?mem usage=([0-9.]+) GB")


@dataclass(frozen=True)
class PreLoadRow:
    """One SGLang start whose log prints the free memory before loading on a GPU of known total: the memory in use
    then as logged (the total less the smallest "Load weight begin" avail mem: SGLang sizes from the minimum over
    ranks) and as kvplan plans it (:func:`kvplan.engines.sglang_overhead.pre_load`), GiB per GPU."""

    id: str
    split: str
    tp: int
    pp: int
    gpu: str
    release: str  # kvplan's modelled release ("?" after it: the log names none, the newest assumed)
    board: str
    dist_gib: float | None  # the largest "Init torch distributed ends. mem usage" (None: not printed)
    logged_gib: float
    kvplan_gib: float
    fraction: float  # mem_fraction_static (logged, stated or the release's default): the term is in use x fraction
    planned: bool  # whether the start is planned from its inputs (its gap is then in the row's own deltas)


def pre_load_rows() -> list[PreLoadRow]:
    """Every SGLang corpus start that prints "Load weight begin" (else "Load weight end"'s avail mem and mem usage,
    whose sum is the same free memory) on a catalogue GPU, planned or not (a model not bundled does not matter: the
    term depends on the GPU, tp, pp and release alone)."""
    from kvplan.engines import Device, sglang
    from kvplan.engines.spread import board
    from kvplan.gpus import find_gpu
    from kvplan.units import MiB

    out = []
    for entry in corpus.entries("sglang"):
        meta, frees = entry.meta, [float(x) for x in _LOAD_BEGIN.findall(entry.log)]
        r = meta.get("reported") or {}
        after, usage = _num(r.get("avail_mem_after_load_gb")), _num(r.get("weights_mem_usage_gb"))
        if not frees and after is not None and usage is not None:  # "Load weight end"'s avail mem + mem usage
            frees = [after + usage]
        name = planned_gpu(meta)[0] or meta.get("gpu")  # a skipped start's curated block may name no GPU
        version = corpus.planned_as(meta).get("engine_version")  # unknown: the newest (the rule differs only before
        if not frees or not name:  # 0.4.7, in the late communicator)
            continue
        try:  # a logged name with its size in brackets ("NVIDIA H20 (96 GB)") is the catalogue's name without them
            gpu = find_gpu(re.sub(r"\s*\(.*\)$", "", str(name)))
            key = sglang.resolve_version(str(version) if version else None)[0]
        except KvplanError:
            continue
        tp, pp = int(meta.get("tp") or 1), int(meta.get("pp") or 1)
        device = Device("rocm" if gpu.vendor == "amd" else "cuda", gpu.sm_count, gpu.interconnect,
                        gpu.compute_capability, gpu.smi_memory_mib * MiB if gpu.smi_memory_mib else None)
        flags = meta.get("flags") or {}
        frac = _num(flags.get("mem_fraction_static")) or _num(r.get("mem_fraction_static"))
        frac = frac or sglang.mem_fraction_static(key, gpu.memory_bytes, tp, pp, device)
        dists = [float(x) for x in _DIST_END.findall(entry.log)]
        planned = not (meta.get("kvplan") or {}).get("skip") and resolve_model(meta) is not None
        out.append(PreLoadRow(entry.id, entry.split, tp, pp, gpu.name, key if version else f"{key}?",
                              board(gpu.interconnect, gpu.memory_kind),
                              max(dists) if dists else None, gpu.memory_bytes / GiB - min(frees),
                              sglang.pre_load_bytes(tp, pp, device) / GiB, frac, planned))
    return out


def pre_load_markdown(rows: list[PreLoadRow]) -> str:
    """The pre-load table: each start's logged memory in use before loading beside kvplan's."""
    lines = ["| log | split | tp | GPU | release | dist init (logged) | in use before loading: logged | kvplan | "
             "kvplan - logged |", "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        dist = "-" if r.dist_gib is None else f"{r.dist_gib:.2f}"
        lines.append(f"| {r.id} | {r.split} | {r.tp} | {r.gpu} | {r.release} | {dist} | {r.logged_gib:.2f} | "
                     f"{r.kvplan_gib:.2f} | {r.kvplan_gib - r.logged_gib:+.2f} |")
    return "\n".join(lines)


def _activation_holds_graphs(engine: str, version: str) -> bool:
    """Whether the release's printed peak activation includes its CUDA-graph estimate (vLLM 0.27+)."""
    if engine != "vllm":
        return False
    from kvplan.engines.vllm import profile

    return profile(version).printed_activation == "transient+graphs"


def measure(plan: Any, compare: str, stage: int = 0, rank_gap: int | None = None) -> float:
    """The plan's figure comparable to the logged one. The logged "Available KV cache memory" is one rank's: with
    pipeline stages the ``stage`` the corpus names (``kvplan: stage``; default 0, the driver's), not the engine's
    minimum over stages that the plan's own budget is; and rank 0's, not the pool's fullest rank
    (:func:`stage_offset`)."""
    return _figure(plan.answer, plan.budget.kv_budget_bytes + stage_offset(plan, compare, stage, rank_gap),
                   plan.layout.block_size, compare)


def stage_offset(plan: Any, compare: str, stage: int, rank_gap: int | None = None) -> int:
    """How much more KV budget the logged rank has than the plan's deciding one (0 unless ``kv_gib``): the logged
    stage's at pp >= 2, and rank 0's over the pool's fullest rank (``rank_gap``, by default the stage budget's
    ``first_rank_gap_bytes``: a log's "Available KV cache memory" is rank 0's, its blocks and tokens the pool's)."""
    if compare != "kv_gib":
        return 0
    staged = plan.stages[stage].kv_budget_bytes - plan.budget.kv_budget_bytes if plan.stages else 0
    return staged + (logged_stage_budget(plan, stage).first_rank_gap_bytes if rank_gap is None else rank_gap)


def _figure(a: Any, kv_budget_bytes: int, block_size: int, compare: str) -> float:
    if compare == "tokens":
        return float(a.kv_tokens)
    if compare == "blocks":
        return float(a.num_blocks)
    if compare == "refusal":
        return float(a.num_blocks * block_size)
    if compare == "max_len":
        return float(a.longest_startable_len)
    if compare == "kv_gib":
        return kv_budget_bytes / GiB
    return float(a.max_concurrency)


def _range(plan: Any, compare: str, stage: int = 0) -> tuple[float, float] | None:
    """The plan's range for the compared figure (``Plan.kv_range``; a logged stage's budget shifted as
    :func:`stage_offset`), None when it has none."""
    rng = plan.kv_range
    if rng is None or rng.kv_budget_low_bytes == rng.kv_budget_high_bytes:
        return None
    bs, shift = plan.layout.block_size, stage_offset(plan, compare, stage)
    return (_figure(rng.low, rng.kv_budget_low_bytes + shift, bs, compare),
            _figure(rng.high, rng.kv_budget_high_bytes + shift, bs, compare))


def logged_stage_budget(plan: Any, stage: int) -> Any:
    """The budget of the stage whose terms the log prints (the plan's own without pipeline stages)."""
    return plan.stages[stage].budget if plan.stages else plan.budget


def stage_weights_total(plan: Any, logged_gib: float, stage: int) -> float:
    """The weights over all GPUs (GiB) that give the logged ``stage`` the logged weights per GPU: each stage loads
    its own share (:func:`kvplan.memory.stage_weight_bytes`), so a pipeline's total is not per GPU x tp x pp."""
    from kvplan import memory
    from kvplan.units import parse_dtype

    o = plan.options
    if not plan.stages:
        return logged_gib * o.tp * o.pp
    total = plan.weights_total_bytes
    held = memory.stage_weight_bytes(plan.spec, plan.stages[stage].stage, total, parse_dtype(plan.model_dtype).nbytes(1))
    return logged_gib * o.tp * total / held


def logged_budget_bytes(meta: dict[str, Any]) -> int | None:
    """The KV budget per GPU the log prints (vLLM "Available KV cache memory"; SGLang K + V sizes, which hold one
    padding page more than the pool's tokens)."""
    r = meta.get("reported") or {}
    gib = _num(r.get("available_kv_gib"))
    if gib is None and _num(r.get("k_size_gb")) is not None and _num(r.get("v_size_gb")) is not None:
        gib = _num(r["k_size_gb"]) + _num(r["v_size_gb"])
    if gib is None:
        gib = _num(r.get("kv_size_gb"))
    return round(gib * GiB) if gib and gib > 0 else None


def from_logged_budget(meta: dict[str, Any]) -> bool:
    """Whether this start is planned from its logged KV budget: its curated GPU note says so."""
    return str((meta.get("kvplan") or {}).get("gpu_note") or "").startswith("budget from the log")


def family(engine: str, release: str) -> str:
    """The release family of the summary table: the spread's classes (:mod:`kvplan.engines.spread`)."""
    from kvplan.engines.spread import family as release_family

    return f"{engine} {release_family(engine, release)}"


def gpu_class(memory_bytes: int, name: str) -> str:
    gib = memory_bytes / GiB
    if "cpu" in name.lower():
        return "cpu"
    return "<= 24 GB" if gib < 26 else "32 - 48 GB" if gib < 60 else "80 - 96 GB" if gib < 120 else "140+ GB"


def run(entry: corpus.Entry) -> Row | str:
    """One start planned and compared, or the reason it cannot be."""
    from kvplan.planning.plan import estimate

    meta = entry.meta
    block = meta.get("kvplan") or {}
    if block.get("skip"):
        return f"skip: {block['skip']}"
    target = logged_value(meta, block.get("compare"))
    if target is None:
        return "no capacity figure in the log"
    compare, value = target
    model = resolve_model(meta)
    if model is None:
        return f"model {meta.get('model')!r} not bundled and not curated"
    gpu, memory = planned_gpu(meta)
    basis, extra = "inputs", {}
    if from_logged_budget(meta):
        budget = logged_budget_bytes(meta)
        if budget is None:
            return "planned from the logged budget, but the log prints none"
        basis, extra = "logged budget", {"kv_budget": f"{budget}B"}
        if gpu is None and memory is None:
            extra["gpu_memory"] = f"{NOMINAL_GPU_BYTES}B"
    elif gpu is None and memory is None:
        return f"GPU {meta.get('gpu')!r} not in the catalogue and its memory not logged"
    if "engine_version" not in corpus.planned_as(meta):
        return "engine version unknown"
    try:
        options = options_for(meta, model, extra)
        plan = estimate(options)
        if "max_model_len" not in _stated_lengths(meta) and plan.answer.model_max_len:
            # the engine's default max_model_len is the model's maximum (the log states no other)
            extra = {**extra, "max_model_len": plan.answer.model_max_len, "context": plan.answer.model_max_len}
            plan = estimate(options_for(meta, model, extra))
    except KvplanError as exc:
        return f"kvplan refuses: {exc.message}"
    stage = int(block.get("stage") or 0)
    predicted = measure(plan, compare, stage)
    err = (predicted - value) / value * 100
    gib = plan.budget.kv_budget_bytes * (err / 100) / (1 + err / 100) / GiB if err > -100 else 0.0
    in_activation = plan.budget.cudagraph.bytes / GiB if _activation_holds_graphs(meta["engine"], plan.engine.version) \
        else None
    terms = {} if basis != "inputs" else sglang_logged_terms(meta, plan) if meta["engine"] == "sglang" else \
        logged_terms(meta, plan.options.tp * plan.options.pp, plan.engine.cudagraph_profiled, in_activation)
    if block.get("terms_worker") == "other":  # another worker's peak (no sampler): not the compared rank's activation
        terms.pop("activation_gib", None)
    if "weights_gib" in terms and plan.stages and meta["engine"] == "vllm":
        terms["weights_gib"] = f"{stage_weights_total(plan, _num(meta['reported']['weights_gib']), stage)}GiB"
    # the log prints rank 0's non-torch memory; the pool's fullest rank holds this much more (vLLM above 2 NVLink ranks)
    rank_gap = logged_stage_budget(plan, stage).first_rank_gap_bytes
    if "overhead_gib" in terms and rank_gap:
        terms["overhead_gib"] = f"{float(terms['overhead_gib'].removesuffix('GiB')) + rank_gap / GiB}GiB"
    terms_err, biggest, deltas, rest, unified = None, "", {}, None, gib + plan.budget.host_bytes / GiB
    # kvplan's formula for each estimated term (a quantized hybrid's unlisted 16-bit layers, a median, taken back out)
    unlisted = logged_stage_budget(plan, stage).unlisted_weights_bytes
    estimated = {t.name: (t.bytes - (unlisted if t.name == "weights" else 0)) / GiB
                 for t in logged_stage_budget(plan, stage).terms if not given(t)}
    if terms:
        try:
            # kvplan's own graph estimate stands where the log prints only activation + graphs (not a printed term)
            kept_graphs = {"cudagraph_gib": f"{in_activation}GiB"} if in_activation is not None \
                and "cudagraph_gib" not in terms and "activation_gib" in terms else {}
            with_terms = estimate(options_for(meta, model, {**extra, **kept_graphs, **terms}))
            terms_err = (measure(with_terms, compare, stage, rank_gap) - value) / value * 100
            printed = {TERM_OF_OPTION[k] for k in terms}
            # measured against kvplan's formula: the non-torch memory the point estimate adds from these very gaps
            # (Budget.unmodelled_bytes, ROCm's calibration median) taken back out, so the median does not feed on itself
            allowed = {"overhead": logged_stage_budget(plan, stage).unmodelled_bytes, "weights": unlisted}
            deltas = {t.name: (t.bytes - allowed.get(t.name, 0) - w.bytes) / GiB
                      for t, w in zip(logged_stage_budget(plan, stage).terms, logged_stage_budget(with_terms, stage).terms)
                      if t.name in printed and t.name in estimated}
            moved = {k: v for k, v in deltas.items() if v}
            if moved:
                name, delta = max(moved.items(), key=lambda kv: abs(kv[1]))
                biggest = f"{name} {delta:+.2f} GiB"
            charged = ({"weights", "overhead"} if meta["engine"] == "sglang" else {"weights", "activation", "overhead"}) \
                | ({"cudagraph"} if plan.engine.cudagraph_profiled else set())  # SGLang's activation is in 1 - frac
            if terms_err > -100:
                left = with_terms.budget.kv_budget_bytes * (terms_err / 100) / (1 + terms_err / 100) / GiB
                rest = left if charged <= printed else None
                unified = left + with_terms.budget.host_bytes / GiB  # all the host took, not what the estimate left
        except KvplanError:
            pass
    rng = _range(plan, compare, stage)
    in_range = width = low_holds = low_width = None
    if rng is not None:
        lo, hi = min(rng), max(rng)
        in_range = lo <= value <= hi
        width = (hi - lo) / predicted * 100 if predicted else None
        low_holds = lo <= value
        low_width = (predicted - lo) / predicted * 100 if predicted else None
    from kvplan.engines.spread import board, model_family

    return Row(entry.id, entry.split, basis, meta["engine"], plan.engine.version, family(meta["engine"], plan.engine.version),
               plan.gpu.name, gpu_class(plan.gpu.memory_bytes, plan.gpu.name), plan.options.tp, compare, value,
               predicted, err, gib, in_range, width, terms_err, biggest, model,
               rough_weights(plan.budget.weights.source), deltas, estimated, rest, model_family(plan.spec),
               board(plan.gpu.interconnect, plan.gpu.memory_kind), low_holds, low_width,
               plan.kv_range.dominant if plan.kv_range else "",
               unified if plan.gpu.memory_kind == "unified" and basis == "inputs" else None, plan.gpu.device.platform)


def rows(split: str | None = None) -> tuple[list[Row], list[tuple[str, str]]]:
    done: list[Row] = []
    skipped: list[tuple[str, str]] = []
    for entry in corpus.entries():
        if split and entry.split != split:
            continue
        result = run(entry)
        (done.append(result) if isinstance(result, Row) else skipped.append((entry.id, result)))
    return done, skipped


def bad(row: Row) -> bool:
    """Off by more than 3% of its KV tokens or 0.25 GiB of KV per GPU, whichever is larger."""
    return abs(row.err_pct) > 3 and abs(row.gib) > 0.25


def summary(done: list[Row]) -> dict[str, Any]:
    errs = [abs(r.err_pct) for r in done]
    ranged = [r for r in done if r.in_range is not None]
    return {
        "rows": len(done),
        "median_abs_err_pct": statistics.median(errs) if errs else math.nan,
        "max_abs_err_pct": max(errs) if errs else math.nan,
        "over_promise_gt_1pct": sum(1 for r in done if r.err_pct > 1),
        "off_gt_3pct_and_025gib": sum(1 for r in done if bad(r)),
        "range_coverage": (sum(1 for r in ranged if r.in_range) / len(ranged)) if ranged else None,
        "range_median_width_pct": statistics.median(r.range_width_pct for r in ranged if r.range_width_pct is not None)
        if ranged else None,
        "low_end_holds": (sum(1 for r in ranged if r.low_holds) / len(ranged)) if ranged else None,
        "low_end_median_width_pct": statistics.median(r.low_width_pct for r in ranged if r.low_width_pct is not None)
        if ranged else None,
    }


def by_class(done: list[Row]) -> dict[tuple[str, str, str], list[Row]]:
    from kvplan.engines.spread import tp_bucket

    out: dict[tuple[str, str, str], list[Row]] = {}
    for r in done:
        out.setdefault((r.family, r.gpu_class, tp_bucket(r.tp)), []).append(r)
    return dict(sorted(out.items()))


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by linear interpolation (0 for none)."""
    if not values:
        return 0.0
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (pos - lo)


SPREAD_QUANTILE = 0.90


def spread_table(done: list[Row]) -> list[dict[str, Any]]:
    """The spread classes (:mod:`kvplan.engines.spread`) from the calibration part's rows planned from inputs (less
    those whose weights were counted from parameters, which the range widens by their own allowance): per engine x
    release family x tp bucket, per engine x tp bucket, per engine, the 90th percentiles of the engine's KV
    shortfall (``over_gib``: kvplan promised more) and excess (``under_gib``), GiB per GPU."""
    from kvplan.engines.spread import family as release_family, tp_bucket

    rows = [r for r in done if r.split == "calibration" and r.basis == "inputs" and not r.rough]
    groups: dict[tuple[str, str | None, str | None], list[Row]] = {}
    for r in rows:
        fam = release_family(r.engine, r.release)
        for key in ((r.engine, fam, tp_bucket(r.tp)), (r.engine, None, tp_bucket(r.tp)), (r.engine, None, None)):
            groups.setdefault(key, []).append(r)
    out = []
    for (engine, fam, tp), rs in sorted(groups.items(), key=lambda kv: tuple(x or "" for x in kv[0])):
        out.append({"engine": engine, "family": fam, "tp": tp, "logs": len(rs),
                    "over_gib": round(_quantile([max(0.0, r.gib) for r in rs], SPREAD_QUANTILE), 3),
                    "under_gib": round(_quantile([max(0.0, -r.gib) for r in rs], SPREAD_QUANTILE), 3),
                    "from": sorted(r.id for r in rs)})
    return out


def _term_samples(r: Row) -> dict[tuple[str, str], tuple[float, float]]:
    """``{(term, class): (over, under)}`` of one calibration row: how far each printed term rose above kvplan's
    estimate and fell below it (a fraction of the estimate for the weights and the activation, GiB otherwise)."""
    from kvplan.engines.spread import TERM_UNITS, term_class

    out = {}
    gaps = dict(r.deltas)  # kvplan's term - the log's: negative where kvplan promised more KV
    # the KV left over is the other way round: kvplan's KV - the log's, positive where kvplan promised more
    if r.unified_gib is not None:  # what the host's use of a unified memory took: all that no printed term explains
        gaps["unified memory"] = -r.unified_gib
    elif r.rest_gib is not None:
        gaps["rest"] = -r.rest_gib
    for term, delta in gaps.items():
        cls = term_class(term, engine=r.engine, version=r.release, tp=r.tp, board_name=r.board,
                         family_name=r.model_family, rough=r.rough)
        if TERM_UNITS[term] == "fraction":
            est = r.kvplan_terms.get(term, 0.0)
            if est <= 0:
                continue
            delta /= est
        out[(term, cls)] = (max(0.0, -delta), max(0.0, delta))
    return out


def _pre_load_sample(p: PreLoadRow) -> dict[tuple[str, str], tuple[float, float]]:
    """The overhead term's sample of a start kvplan does not plan whose log prints the free memory before loading:
    kvplan's term - the log's is (kvplan's memory in use - the logged) x mem_fraction_static, GiB per GPU."""
    from kvplan.engines.spread import term_class

    delta = (p.kvplan_gib - p.logged_gib) * p.fraction
    cls = term_class("overhead", engine="sglang", version=p.release, tp=p.tp, board_name=p.board, family_name="",
                     rough=False)
    return {("overhead", cls): (max(0.0, -delta), max(0.0, delta))}


def term_table(done: list[Row]) -> list[dict[str, Any]]:
    """Each budget term's spread per class (:mod:`kvplan.engines.spread`) from the calibration part's rows planned
    from inputs whose logs print that term: the :data:`~kvplan.engines.spread.TERM_QUANTILE` quantiles of how far
    the logged term rose above kvplan's estimate (``over``: the engine gave less KV) and fell below it (``under``),
    and the median signed gap (``median``: logged - kvplan), as fractions of the estimate or GiB per GPU."""
    from kvplan.engines.spread import TERM_QUANTILE, TERM_UNITS

    groups: dict[tuple[str, str, str], list[tuple[str, float, float]]] = {}
    for r in done:
        if r.split != "calibration" or r.basis != "inputs":
            continue
        for (term, cls), (over, under) in _term_samples(r).items():
            groups.setdefault((r.engine, term, cls), []).append((r.id, over, under))
    planned = {r.id for r in done}
    for p in pre_load_rows() if planned else ():  # SGLang's printed pre-load memory on starts kvplan cannot plan
        if p.split == "calibration" and p.id not in planned and not p.release.endswith("?"):
            for (term, cls), (over, under) in _pre_load_sample(p).items():
                groups.setdefault(("sglang", term, cls), []).append((p.id, over, under))
    out = []
    for (engine, term, cls), xs in sorted(groups.items()):
        kept, aside = _set_aside_outlier(term, xs)
        row = {"engine": engine, "term": term, "class": cls, "unit": TERM_UNITS[term], "logs": len(xs),
               "over": round(_quantile([o for _, o, _ in kept], TERM_QUANTILE), 4),
               "under": round(_quantile([u for _, _, u in kept], TERM_QUANTILE), 4),
               "median": round(statistics.median(o - u for _, o, u in xs), 4),
               "from": sorted(i for i, _, _ in xs)}
        if aside is not None:
            row["set_aside"] = {"log": aside[0], "over": round(aside[1], 4)}
        out.append(row)
    return out


def covered_table(done: list[Row]) -> list[dict[str, str]]:
    """The platform x release family pairs (per engine) that a calibration log printing budget terms covers:
    :func:`kvplan.engines.spread.covered` reads them; a pair not listed is unseen (its range takes the widest spreads)."""
    from kvplan.engines.spread import family as release_family

    pairs = {(r.engine, r.platform, release_family(r.engine, r.release)) for r in done
             if r.split == "calibration" and r.basis == "inputs" and _term_samples(r)}
    return [{"engine": e, "platform": p, "family": f} for e, p, f in sorted(pairs)]


def _set_aside_outlier(term: str, xs: list[tuple[str, float, float]]) -> tuple[list[tuple[str, float, float]],
                                                                    tuple[str, float, float] | None]:
    """``xs`` less its one outlier (and that log), else ``xs`` and None: for a term of
    :data:`~kvplan.engines.spread.OUTLIER_TERMS`, in a class of at least
    :data:`~kvplan.engines.spread.OUTLIER_MIN_LOGS` logs, the log whose ``over`` is more than
    :data:`~kvplan.engines.spread.OUTLIER_FACTOR` x the others' quantile and above
    :data:`~kvplan.engines.spread.OUTLIER_MIN_OVER` does not set the class's spread alone (its low end may miss
    that one log; the class's neighbours do not inherit it). Only one log is set aside, never two."""
    from kvplan.engines.spread import OUTLIER_FACTOR, OUTLIER_MIN_LOGS, OUTLIER_MIN_OVER, OUTLIER_TERMS, TERM_QUANTILE

    if term not in OUTLIER_TERMS or len(xs) < OUTLIER_MIN_LOGS:
        return xs, None
    widest = max(xs, key=lambda x: x[1])
    rest = [x for x in xs if x is not widest]
    rest_over = _quantile([o for _, o, _ in rest], TERM_QUANTILE)
    if widest[1] > max(OUTLIER_FACTOR * rest_over, OUTLIER_MIN_OVER):
        return rest, widest
    return xs, None


def write_spread(done: list[Row], path: Path) -> None:
    import yaml

    head = ("# kvplan's KV-budget spread, measured on the calibration part of benchmarks/corpus\n"
            "# (generated: PYTHONPATH=. python3 benchmarks/corpus_agreement.py --write-spread --write-docs; do not edit).\n"
            "# terms: per budget term and class, how far the logged term rose above kvplan's estimate (over: the\n"
            "# engine gave less KV; the 95th percentile, TERM_QUANTILE), fell below it (under) and the median (logged - kvplan), as a\n"
            "# fraction of the estimate (unit fraction) or GiB per GPU; from: the logs that print the term.\n"
            "# classes: the whole KV budget's shortfall (over_gib) and excess (under_gib) per class, for engines whose\n"
            "# logs print no terms. covered: the platform x release family pairs a calibration log printing terms\n"
            "# covers (any other is unseen: its range takes the widest spreads). Read by kvplan.engines.spread.\n")
    doc = {"terms": term_table(done), "classes": spread_table(done), "covered": covered_table(done)}
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=110))
    subprocess.run([sys.executable, str(Path(__file__).with_name("gen_bundled_index.py"))], check=True)  # it ships


def markdown(done: list[Row]) -> str:
    lines = ["| engine, releases | GPU class | tp | logs | median \\|err\\| | max \\|err\\| | over-promising > 1% | "
             "low end holds | low end's median width |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (fam, cls, tp), rs in by_class(done).items():
        s = summary(rs)
        lines.append(f"| {fam} | {cls} | {tp} | {s['rows']} | {s['median_abs_err_pct']:.2f}% | "
                     f"{s['max_abs_err_pct']:.2f}% | {s['over_promise_gt_1pct']} | {_share(s['low_end_holds'])} | "
                     f"{_pct(s['low_end_median_width_pct'])} |")
    return "\n".join(lines)


DOC = Path(__file__).resolve().parents[1] / "docs" / "engines.md"
BEGIN, END = "<!-- corpus-agreement:begin -->", "<!-- corpus-agreement:end -->"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}%"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def makeup(done: list[Row], skipped: list[tuple[str, str]]) -> list[str]:
    """The corpus's size and make-up, in words."""
    entries = list(corpus.entries())
    by_engine = {e: sum(1 for x in entries if x.meta["engine"] == e) for e in ("vllm", "sglang")}
    versions = {str(x.meta.get("engine_version") or (x.meta.get("kvplan") or {}).get("engine_version"))
                for x in entries if x.meta.get("engine_version") or (x.meta.get("kvplan") or {}).get("engine_version")}
    gpus = {r.gpu for r in done if r.gpu != "custom"}
    splits = {s: sum(1 for x in entries if x.split == s) for s in corpus.SPLITS}
    feats: dict[str, int] = {}
    for x in entries:
        for f in x.meta.get("features") or ():
            feats[f] = feats.get(f, 0) + 1
    tps = sorted({int(x.meta.get("tp") or 1) for x in entries})
    return [f"{len(entries)} engine starts ({by_engine['vllm']} vLLM, {by_engine['sglang']} SGLang) from public sources, "
            f"{len(versions)} distinct release strings, tp {', '.join(map(str, tps))}; split by source into "
            f"{splits['calibration']} calibration and {splits['validation']} validation starts. Planned: {len(done)} "
            f"({sum(1 for r in done if r.basis == 'inputs')} from their inputs, {sum(1 for r in done if r.basis != 'inputs')}"
            f" from their logged KV budget: block arithmetic only) on {len(gpus)} catalogue GPUs; {len(skipped)} skipped, "
            "each with its reason (`--skipped`). Features: " + ", ".join(f"{k} {v}" for k, v in sorted(feats.items()))
            + "."]


def summary_table(done: list[Row]) -> list[str]:
    lines = ["| part | engine | planned from | logs | median \\|err\\| | max \\|err\\| | over-promising > 1% | off > 3% and "
             "> 0.25 GiB | range holds the log | range's median width | low end holds | low end's median width |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for split in corpus.SPLITS:
        for engine in ("vllm", "sglang"):
            for basis in ("inputs", "logged budget"):
                rs = [r for r in done if r.split == split and r.engine == engine and r.basis == basis]
                if not rs:
                    continue
                s = summary(rs)
                cov = "-" if s["range_coverage"] is None else f"{s['range_coverage']:.0%}"
                lines.append(f"| {split} | {engine} | {basis} | {s['rows']} | {_pct(s['median_abs_err_pct'])} | "
                             f"{_pct(s['max_abs_err_pct'])} | {s['over_promise_gt_1pct']} | {s['off_gt_3pct_and_025gib']} | "
                             f"{cov} | {_pct(s['range_median_width_pct'])} | {_share(s['low_end_holds'])} | "
                             f"{_pct(s['low_end_median_width_pct'])} |")
    return lines


def low_end_table(done: list[Row]) -> list[str]:
    """The low end's one-sided hold rate (low end <= the engine's figure) per part, engine and tp, with its median
    width ((estimate - low end) / estimate) and the term that dominates it most often."""
    lines = ["| part | engine | tp | starts | low end holds | low end's median width | dominant term (most often) |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for split in corpus.SPLITS:
        for engine in ("vllm", "sglang"):
            rs = [r for r in done if r.split == split and r.engine == engine and r.low_holds is not None]
            for tp in sorted({r.tp for r in rs}):
                part = [r for r in rs if r.tp == tp]
                doms = [r.dominant for r in part if r.dominant]
                dom = max(sorted(set(doms)), key=doms.count) if doms else "-"
                holds = sum(1 for r in part if r.low_holds) / len(part)
                width = statistics.median(r.low_width_pct for r in part if r.low_width_pct is not None)
                lines.append(f"| {split} | {engine} | {tp} | {len(part)} | {holds:.0%} | {width:.2f}% | {dom} |")
    return lines


def off_rows(done: list[Row]) -> list[str]:
    """Every validation start planned from its inputs that is more than 2% off, with what the log says of it."""
    out = []
    for r in sorted((r for r in done if r.split == "validation" and r.basis == "inputs" and abs(r.err_pct) > 2),
                    key=lambda r: -abs(r.err_pct)):
        why = (f"with the log's terms {r.terms_err_pct:+.1f}%, biggest gap {r.biggest_term}" if r.terms_err_pct is not None
               else "the log prints no budget term")
        out.append(f"- `{r.id}` ({r.family}, {r.gpu}, tp {r.tp}): {r.err_pct:+.1f}% ({r.gib:+.2f} GiB per GPU); {why}")
    return out


def write_docs(done: list[Row], skipped: list[tuple[str, str]]) -> None:
    from doc_section import replace_section

    validation = [r for r in done if r.split == "validation" and r.basis == "inputs"]
    section = [BEGIN, "### Agreement with the corpus of real start-up logs (generated)", "",
               "`PYTHONPATH=. python3 benchmarks/corpus_agreement.py --write-spread --write-docs` regenerates kvplan/data/kv_spread.yaml (from the calibration part) and this section; the corpus "
               "and its split are benchmarks/corpus/README.md's. `err` is (kvplan - logged) / logged for the figure the "
               "log prints (KV tokens, blocks, a refusal's tokens, the KV GiB or the concurrency); positive promises "
               "more than the engine gave. The validation part is never used to fit anything.", ""]
    section += makeup(done, skipped) + [""] + summary_table(done) + ["",
                "The low end is built from the terms (kvplan/engines/spread.py): each estimated budget term pays its own "
                "spread, measured on the calibration logs that print it; \"low end holds\" is the share of starts "
                "whose engine gave at least the low end (the figure compared is at or above it). By tp:", ""]
    section += low_end_table(done) + ["",
                "By engine x release family x GPU class x tp (validation part, planned from the inputs):", ""]
    section += markdown(validation).splitlines() + ["", "Validation starts more than 2% off:", ""] + off_rows(done)
    section += ["", END]
    replace_section(DOC, "\n".join(section) + "\n", BEGIN, END)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=corpus.SPLITS)
    parser.add_argument("--markdown", action="store_true", help="print the summary table by class (docs/engines.md)")
    parser.add_argument("--json", type=Path, help="write every row and the summaries as JSON")
    parser.add_argument("--skipped", action="store_true", help="list the starts that could not be planned")
    parser.add_argument("--write-spread", action="store_true", help="write kvplan/data/kv_spread.yaml from the "
                        "calibration part")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/engines.md's agreement section")
    parser.add_argument("--pre-load", action="store_true", help="print SGLang's memory in use before loading, logged "
                        "and kvplan's, for every start that prints it")
    args = parser.parse_args(argv)
    if args.pre_load:
        sys.stdout.write(pre_load_markdown(pre_load_rows()) + "\n")
        return 0
    done, skipped = rows(args.split)
    out = sys.stdout
    if args.write_spread:
        from kvplan.engines import spread

        write_spread(done, SPREAD_FILE)
        spread._doc.cache_clear()
        done, skipped = rows(args.split)  # the ranges from the spread just written
    if args.write_docs:
        write_docs(done, skipped)
    if args.markdown:
        out.write(markdown(done) + "\n")
    else:
        for r in sorted(done, key=lambda r: (r.family, r.id)):
            rng = "" if r.in_range is None else (" in range" if r.in_range else " OUT of range")
            terms = "" if r.terms_err_pct is None else f"  +terms {r.terms_err_pct:+6.1f}% ({r.biggest_term})"
            out.write(f"{r.id[:58]:58} {r.split[:5]} {r.basis[:6]:6} {r.engine} {r.release:7} {r.gpu[:16]:16} tp{r.tp:<2} "
                      f"{r.compare:11} {r.logged:>12,.2f} {r.kvplan:>12,.2f} {r.err_pct:+7.2f}% {r.gib:+6.2f} GiB"
                      f"{rng}{terms}\n")
    for split in corpus.SPLITS:
        for basis in ("inputs", "logged budget"):
            part = [r for r in done if r.split == split and r.basis == basis]
            for engine in ("vllm", "sglang"):
                s = summary([r for r in part if r.engine == engine])
                if s["rows"]:
                    out.write(f"{split:11} {engine:6} {basis:13}: {json.dumps(s)}\n")
    out.write(f"{len(done)} planned, {len(skipped)} skipped\n")
    if args.skipped:
        for eid, why in skipped:
            out.write(f"- {eid}: {why}\n")
    if args.json:
        args.json.write_text(json.dumps({"rows": [asdict(r) for r in done], "skipped": skipped}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
