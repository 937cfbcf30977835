"""Every start-up log line kvplan reads, per engine and release: the patterns :mod:`kvplan.explain.logparse` applies.

One :class:`Line` per line form: its pattern, the :class:`kvplan.explain.startup_log.StartupLog` field each group
fills and how the group is read (a printed size in GiB, a count, a word). The releases named beside each form
are where it was read in the engine's released code (vLLM ``vllm/v1/worker/gpu_worker.py``,
``vllm/v1/core/kv_cache_utils.py``, ``vllm/worker/worker.py``; SGLang ``srt/model_executor/model_runner.py``,
``srt/mem_cache/memory_pool.py``, ``srt/managers/scheduler.py``). Sizes: vLLM's "GiB" and its V0 "GB", and every
SGLang "GB", are bytes / 2**30; XPU's "MB" are bytes / 2**20 (read as GiB here).

Policies: ``last`` (a later line wins: a restarted engine's second start), ``first`` (the first wins: the pool
of rank 0, the target model before a draft). Lines of a worker whose rank is not 0 never replace rank 0's
(``Worker_TP1``, ``TP3``): every rank prints its own figures and vLLM and SGLang size the pool by rank 0's
or the smallest.
"""

from __future__ import annotations

import re
from kvplan.frozen import frozen
from typing import Any

NUMBER = r"(-?[0-9][0-9,]*(?:\.[0-9]*)?)"  # one way to match each printed number: no backtracking on a long digit run
INT = r"([0-9](?:[0-9,]*[0-9])?)"  # a count as printed, without the comma or full stop after it
GIB = NUMBER + r"\s*Gi?B"  # a size as printed ("14.99 GiB", "14.99GiB", V0 and SGLang "GB")
LEAD = r"(?<![0-9.,-])"  # before a pattern that starts with a number: only where a number starts


def needle(pattern: str) -> str | None:
    """The longest run of plain characters every match of ``pattern`` contains (3 or more), or ``None``: a line
    without it cannot match, and ``needle in line`` is far cheaper than the search (a server's log is mostly lines
    about requests)."""
    try:
        import re._parser as parser  # Python 3.11+
        from re._constants import LITERAL, SUBPATTERN
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_parse as parser  # type: ignore[no-redef]
        from sre_constants import LITERAL, SUBPATTERN  # type: ignore[no-redef]

    runs: list[str] = []

    def walk(items: Any) -> None:
        run = ""
        for op, av in items:
            if op is LITERAL:
                run += chr(av)
            elif op is SUBPATTERN:  # a group without alternatives is part of the sequence
                runs.append(run)
                run = ""
                walk(av[-1])
            else:
                runs.append(run)
                run = ""
        runs.append(run)

    walk(parser.parse(pattern))
    best = max(runs, key=len, default="")
    return best if len(best) >= 3 else None


@frozen
class Line:
    """One line form: ``pattern``'s groups fill ``fields`` (``None``: a group not kept), read as ``kinds``.

    Kinds: ``gib`` a printed size (GiB), ``mib`` a size printed in MiB and ``bytes`` one in bytes (both kept as GiB),
    ``int`` a count, ``float``
    a ratio, ``word`` the text, ``bool`` ``True`` / ``False``; ``true`` / ``false`` / ``serve`` / ``cpu`` a value the
    line's presence sets (no group).
    """

    pattern: re.Pattern[str]
    fields: tuple[str | None, ...]
    kinds: tuple[str, ...]
    policy: str = "last"  # last | first
    engine: str | None = None  # the engine whose line this is (None: the field's meaning is engine-neutral)
    needle: str | None = None  # text every match contains (:func:`needle`)


def _l(pattern: str, fields: str, kinds: str, policy: str = "last", engine: str | None = None) -> Line:
    names = tuple(None if f == "-" else f for f in fields.split())
    kind_list = tuple(kinds.split())
    assert len(names) == len(kind_list), pattern
    return Line(re.compile(pattern), names, kind_list, policy, engine, needle(pattern))


VLLM = "vllm"
SGLANG = "sglang"

LINES: tuple[Line, ...] = (
    # --- engine and version ------------------------------------------------------------------------------
    _l(r"vLLM API server version ([0-9][^\s,]*)", "version", "word", engine=VLLM),  # 0.6.3 - 0.14
    _l(r"vLLM server version ([0-9][^\s,]*), serving model (\S+)", "version model", "word word", engine=VLLM),  # 0.17+
    _l(r"vLLM server version ([0-9][^\s,]*)\s*$", "version", "word", engine=VLLM),
    _l(r"\]\s+version ([0-9][^\s,]*)\s*$", "version", "word", engine=VLLM),  # the ASCII logo (0.17+)
    _l(r"Initializing an? (?:V[01] )?LLM engine \(v([0-9][^)\s]*)\)", "version", "word", engine=VLLM),
    _l(r"Initializing a (V[01]) LLM engine", "mode", "word", engine=VLLM),  # 0.7.1+
    _l(r"\bvllm[ =]=?\s*v?(0\.[0-9]+\.[0-9][^\s,]*)", "version", "word", engine=VLLM),
    _l(r"Automatically detected platform (\w+)", "platform", "word", engine=VLLM),
    _l(r"\bdevice_config=(?!auto\b)(\w+)", "platform", "word", engine=VLLM),  # the V0 config line (npu, cpu, cuda)
    _l(r"device_name=(NVIDIA_[A-Za-z0-9_-]+|AMD_[A-Za-z0-9_-]+)", "device_name", "word"),
    # --- the deployment: the engine config line (model='...', dtype=torch.x, ...) -------------------------
    _l(r"with config: model='([^']+)'", "model", "word", engine=VLLM),
    _l(r"\bdtype=torch\.(\w+)", "dtype", "word"),
    _l(r"\bmax_seq_len=([0-9]+)", "max_model_len", "int", engine=VLLM),
    _l(r"Using max model len ([0-9]+)", "max_model_len", "int", engine=VLLM),
    _l(r"\btensor_parallel_size=([0-9]+)", "tp", "int", engine=VLLM),
    _l(r"\bpipeline_parallel_size=([0-9]+)", "pp", "int", engine=VLLM),
    _l(r"\bkv_cache_dtype=(\w+)", "kv_cache_dtype", "word"),
    _l(r"\bquantization=(\w+)", "quantization", "word"),
    _l(r"\benforce_eager=(True|False)", "enforce_eager", "bool", engine=VLLM),
    _l(r"\benable_prefix_caching=(True|False)", "prefix_caching", "bool", engine=VLLM),  # the engine config line
    _l(r"'enable_prefix_caching': (True|False)", "prefix_caching", "bool", engine=VLLM),  # non-default args
    _l(r"\bchunked_prefill_enabled=(True|False)", "chunked_prefill", "bool", engine=VLLM),  # V0's config line, resolved
    _l(r"\benable_chunked_prefill=(True|False)", "chunked_prefill", "bool", engine=VLLM),  # EngineArgs / V1 config
    _l(r"'enable_chunked_prefill': (True|False)", "chunked_prefill", "bool", engine=VLLM),  # non-default args
    _l(r"Chunked prefill is enabled with max_num_batched_tokens=([0-9]+)", "max_num_batched_tokens", "int", engine=VLLM),
    _l(r"\bmax_num_batched_tokens=([0-9]+)", "max_num_batched_tokens", "int", engine=VLLM),
    _l(r"(api_server\.py|APIServer pid|model_tag)", "usage_context", "serve", engine=VLLM),
    # block sizes the engine sets itself: facts of the log, not options (hybrids: 0.10.1+; MLA indexers)
    _l(r"Setting attention block size to ([0-9]+) tokens", "engine_block_size", "int", engine=VLLM),
    _l(r"Setting kv cache block size to ([0-9]+)", "engine_block_size", "int", engine=VLLM),
    _l(r"Forcing kv cache block size to ([0-9]+) for", "engine_block_size", "int", engine=VLLM),  # MLA 0.8 - 0.17
    # the multimodal profile's dummy batch (V1)
    _l(r"Encoder cache will be initialized with a budget of ([0-9]+) tokens, and profiled with ([0-9]+) (\w+) items",
       "mm_budget_tokens mm_items mm_modality", "int int word", engine=VLLM),
    # the sampler path of the profile run (0.8 - 0.11: FlashInfer where it is installed, the native sort otherwise)
    _l(r"Using FlashInfer for top-p & top-k sampling", "flashinfer_sampler", "true", engine=VLLM),
    _l(r"(?:FlashInfer is not available|FlashInfer is available, but it is not enabled|is disabled because "
       r"FlashInfer>=v0\.2\.3 is not|FlashInfer version >= 0\.2\.3 required)", "flashinfer_sampler", "false",
       engine=VLLM),
    # where vLLM runs from (a path in a warning or a traceback): a virtualenv's or conda env's site-packages is a pip /
    # uv install of the wheel (the Docker images install into /usr/local/lib/python3.x/dist-packages)
    _l(r"/site-packages/vllm/", "wheel_install", "true", engine=VLLM),
    # a shell prompt with an activated Python environment ("(vllm) user@host:~/dir$ vllm serve", Vast.ai's /venv/main
    # "(main) root@C.123:/workspace$"): vLLM runs from that virtualenv or conda env, a pip / uv install
    _l(r"^\([\w.-]+\)(?: \([\w.-]+\))? [^\s@]+@[^\s:]+:\S*[$#] *(?:vllm|python[0-9.]* -m vllm)\b", "wheel_install",
       "true", engine=VLLM),
    # --- the GPU's memory ----------------------------------------------------------------------------------
    _l(r"total_gpu_memory[ =(]+\s*" + GIB, "total_memory_gib", "gib", engine=VLLM),  # V0 0.6.4 - 0.10
    _l(r"Free memory on device(?: [\w:]+)? \(" + NUMBER + r"\s*/\s*" + NUMBER + r"\s*GiB\)",
       "free_memory_gib total_memory_gib", "gib gib", engine=VLLM),  # 0.9.1+ (0.14+: "device cuda:0")
    _l(r"Free memory on device:\s*" + NUMBER + r"\s*/\s*" + NUMBER + r"\s*GiB", "free_memory_gib total_memory_gib",
       "gib gib", engine=VLLM),
    _l(r"memory snapshot: .*?\btotal_memory=" + GIB, "total_memory_gib", "gib", engine=VLLM),  # 0.14+ DEBUG
    _l(r"Initial free memory:? " + NUMBER + r"\s*GiB", "free_memory_gib", "gib", engine=VLLM),
    _l(r"Available memory on node [0-9]+ \(" + NUMBER + r"/" + NUMBER + r" GiB\)", "free_memory_gib total_memory_gib platform",
       "gib gib cpu", engine=VLLM),  # CPU 0.20+
    _l(r"Before memory profiling run, total GPU memory: " + NUMBER + r" MB, model load takes " + NUMBER + " MB",
       "total_memory_gib weights_gib", "mib mib", "first", VLLM),  # XPU (after "Loading model weights took")
    _l(r"GPU [0-9]+ has a total capacity of " + GIB, "total_memory_gib", "gib", engine=VLLM),  # torch's OOM message
    # the requested share: total x gpu_memory_utilization
    _l(r"Desired GPU memory utilization is \(" + NUMBER + r",\s*" + NUMBER + r"\s*GiB\)",
       "gpu_memory_utilization requested_memory_gib", "float gib", engine=VLLM),  # 0.10.2+
    _l(r"Requested memory: " + NUMBER + r" \(util\), " + GIB, "gpu_memory_utilization requested_memory_gib",
       "float gib", engine=VLLM),  # 0.10.1+ DEBUG
    _l(r"requested GPU memory: " + GIB, "requested_memory_gib", "gib", engine=VLLM),  # 0.9.1 - 0.9.2 DEBUG
    _l(r"worker requested memory: " + GIB, "requested_memory_gib", "gib", engine=VLLM),  # 0.14+ DEBUG
    _l(r"x gpu_memory_utilization \(" + NUMBER + r"\) = " + GIB, "gpu_memory_utilization requested_memory_gib",
       "float gib", engine=VLLM),  # V0 0.6.5 - 0.10
    _l(r"the current vLLM instance can use\s+" + GIB, "requested_memory_gib", "gib", engine=VLLM),
    _l(r"gpu_memory_utilization[ =(]+\s*" + NUMBER, "gpu_memory_utilization", "float", engine=VLLM),
    _l(r"current --gpu-memory-utilization=" + NUMBER, "gpu_memory_utilization", "float", engine=VLLM),
    _l(r"increase --gpu-memory-utilization from " + NUMBER, "gpu_memory_utilization", "float", engine=VLLM),
    # --- the budget terms (vLLM) ---------------------------------------------------------------------------
    _l(r"Loading model weights took " + GIB, "weights_gib", "gib", engine=VLLM),  # 0.6.3 - 0.7.3 ("GB")
    _l(r"Model loading took:?\s*" + GIB, "weights_gib", "gib", engine=VLLM),  # 0.8+
    _l(r"model weights take\s+" + GIB, "weights_gib", "gib", engine=VLLM),  # V0 0.6.5 - 0.10: the profiler's, budgeted
    # V1 repeats the model runner's figure to 0.01 GiB: the 4-decimal "Model loading took", printed first, is kept
    _l(r"weights memory: " + GIB, "weights_gib", "gib", "first", VLLM),  # V1 DEBUG
    _l(r"Weight memory:\s*" + GIB, "weights_gib", "gib", "first", VLLM),
    # "Free memory on device ... Actual usage is X GiB for weight, X GiB for peak activation, X GiB for non-torch
    # memory, and X GiB for CUDAGraph memory" (0.10.2 INFO, 0.11 - 0.25 DEBUG, 0.26 INFO); 0.27+: "X GiB for consumed
    # memory (weights + non-torch), X GiB for peak activation, and X GiB for CUDAGraph memory". Read part by part:
    # the sources often wrap or cut the line.
    _l(r"Actual usage is " + GIB + r" for weight\b", "weights_gib", "gib", "first", VLLM),
    _l(LEAD + GIB + r" for consumed memory \(weights \+ non-torch\)", "consumed_gib", "gib", engine=VLLM),
    _l(LEAD + GIB + r" for peak activation\b", "activation_gib", "gib", engine=VLLM),
    _l(LEAD + GIB + r" for non-torch memory\b", "non_torch_gib", "gib", engine=VLLM),
    _l(LEAD + GIB + r" for CUDAGraph memory\b", "cudagraph_actual_gib", "gib", engine=VLLM),
    _l(r"CUDAGraph memory:\s*" + GIB, "cudagraph_actual_gib", "gib", engine=VLLM),
    _l(r"Desired GPU utilization:\s*" + NUMBER + r"\s*\(" + GIB + r"\)", "gpu_memory_utilization requested_memory_gib",
       "float gib", engine=VLLM),
    _l(r"ctivation peak memory(?: takes)?\s+" + GIB, "activation_gib", "gib", engine=VLLM),
    _l(r"torch peak memory increase: " + GIB, "activation_gib", "gib", engine=VLLM),
    _l(r"Peak activation memory:\s*" + GIB, "activation_gib", "gib", engine=VLLM),
    _l(r"peak_torch_memory=" + GIB, "peak_torch_memory_gib", "gib", engine=VLLM),  # V0 0.6.4
    # V0 0.6.5 - 0.10 "non_torch_memory takes", the December 2024 table "non_torch_memory   3.58GiB", V0 0.6.4's
    # "Memory profiling results: ... non_torch_memory="; not the init snapshot's (0.14+ DEBUG "worker init memory
    # snapshot: ... non_torch_memory=0.59GiB", the CUDA context before loading)
    _l(r"non_torch_memory(?: takes|\s)\s*" + GIB, "non_torch_gib", "gib", engine=VLLM),
    _l(r"Memory profiling results: .*?\bnon_torch_memory=" + GIB, "non_torch_gib", "gib", engine=VLLM),
    _l(r"non-torch forward increase memory: " + GIB, "non_torch_gib", "gib", engine=VLLM),
    _l(r"Non-torch memory:\s*" + GIB, "non_torch_gib", "gib", engine=VLLM),
    _l(r"non-torch mem is " + NUMBER + r" MB", "non_torch_gib", "mib", engine=VLLM),  # XPU
    _l(r"total consumed \(from mem_get_info\): " + GIB, "consumed_gib", "gib", engine=VLLM),  # 0.27+ DEBUG
    _l(r"Total non KV cache memory: " + GIB, "non_kv_gib", "gib", engine=VLLM),  # V1 DEBUG
    _l(r"Estimated CUDA graph memory: " + GIB, "cudagraph_estimate_gib", "gib", engine=VLLM),  # 0.19+
    _l(r"(CUDA graph memory profiling is enabled)", "cudagraph_applied", "true", engine=VLLM),
    _l(r"(will be enabled by default|CUDA graph memory profiling is disabled)", "cudagraph_applied", "false", engine=VLLM),
    _l(r"Graph capturing finished in [0-9.]+ secs?, took " + GIB, "cudagraph_actual_gib", "gib", engine=VLLM),
    _l(r"CUDA graph pool memory: " + GIB + r" \(actual\)", "cudagraph_actual_gib", "gib", engine=VLLM),
    # --- the KV budget ---------------------------------------------------------------------------------------
    _l(r"Available KV cache memory:\s*" + GIB, "available_kv_gib", "gib", engine=VLLM),  # V1 0.9.1+
    _l(r"r KV Cache is\s+" + GIB, "available_kv_gib", "gib", engine=VLLM),  # "the rest ... reserved for KV Cache is"
    _l(r"\bkv_cache_size=" + GIB, "available_kv_gib", "gib", engine=VLLM),  # V0 0.6.4
    # the end of "Free memory on device ... Actual usage is ..." (a worker's pool; the available KV memory when the
    # "Available KV cache memory" line is not in the excerpt)
    _l(r"Current kv cache memory in use is " + GIB, "kv_in_use_gib", "gib", engine=VLLM),  # 0.11+
    _l(r"Current kv cache memory in use is ([0-9]+) bytes", "kv_in_use_gib", "bytes", engine=VLLM),  # 0.10.2
    # the memory table of December 2024 development builds (vllm#10511, vllm#11120)
    _l(r"available_kv_cache_memory\s+" + GIB, "available_kv_gib", "gib", engine=VLLM),
    _l(r"\bkv_cache_size\s+" + GIB, "available_kv_gib", "gib", engine=VLLM),
    _l(r"\btarget_allocation\s+" + GIB, "requested_memory_gib", "gib", engine=VLLM),
    _l(r"\bmax_inference_spike\s+" + GIB, "activation_gib", "gib", engine=VLLM),
    # an explicit KV budget (kv_cache_memory_bytes, 0.10.2+; the CPU backend's VLLM_CPU_KVCACHE_SPACE)
    _l(r"reserved " + NUMBER + r"\s*GiB memory for KV Cache as specified by kv_cache_memory_bytes",
       "explicit_kv_gib", "gib", engine=VLLM),
    _l(r"Explicitly set \(" + NUMBER + r"/" + NUMBER + r"\) GiB for KV cache", "explicit_kv_gib total_memory_gib platform",
       "gib gib cpu", engine=VLLM),  # CPU 0.20+ (the NUMA node's memory)
    _l(r"Auto set \(" + NUMBER + r"/" + NUMBER + r"\) GiB for KV cache on node [0-9]+, with " + GIB
       + r" requested memory for the worker\. " + GIB + r" memory was consumed by non-kv usages",
       "available_kv_gib total_memory_gib requested_memory_gib non_kv_gib platform", "gib gib gib gib cpu", engine=VLLM),  # CPU 0.20+
    _l(r"VLLM_CPU_KVCACHE_SPACE not set\. Using " + GIB + r" for KV cache", "available_kv_gib platform", "gib cpu",
       engine=VLLM),
    _l(r"VLLM_CPU_KVCACHE_SPACE \(GiB\) for CPU backend is not set, using ([0-9]+) by default",
       "cpu_kv_space_gib platform", "gib cpu", engine=VLLM),
    _l(r"\bVLLM_CPU_KVCACHE_SPACE=([0-9]+)\b", "cpu_kv_space_gib platform", "gib cpu", engine=VLLM),
    # --- the capacity (vLLM) ---------------------------------------------------------------------------------
    # "# GPU blocks: N, # CPU blocks: M" (0.6), "# cuda blocks: N, ..." (0.7+ device name), "# CPU blocks: N" alone (the
    # CPU backend): the first on the line is the device's; V0's "# CPU blocks" after it is the swap space
    _l(r"(?:^|[#\s])\s?(GPU|CUDA|cuda|rocm|ROCM|xpu|XPU|TPU|tpu|hpu|HPU|npu|NPU|CPU|cpu) blocks: " + INT,
       "block_device num_gpu_blocks", "word int", "first", VLLM),
    # --num-gpu-blocks-override; "num_gpu_blocks=0" is 0.19+'s minimal pool for the CUDA-graph estimate, not the pool
    _l(r"Overriding num_gpu_blocks=[1-9][0-9]* with num_gpu_blocks_override=" + INT, "num_gpu_blocks", "int", engine=VLLM),
    _l(r"num_gpu_blocks is: " + INT, "num_gpu_blocks", "int", engine=VLLM),
    _l(r"\b(GPU|CPU|XPU|TPU|NPU|HPU) KV cache size: " + INT + r" tokens", "device_kind kv_cache_tokens", "word int",
       "first", VLLM),  # 0.8+ (device word 0.30+); the first: pp stages and Ray workers print their own after it
    _l(r"Maximum concurrency for " + INT + r" tokens per request: " + NUMBER + r"x", "concurrency_len max_concurrency",
       "int float", "first", VLLM),
    _l(r"Add ([0-9]+) padding layers", "padding_layers", "int", engine=VLLM),
    # --- SGLang ------------------------------------------------------------------------------------------------
    _l(r"KV Cache is allocated\.(?: dtype: (\S+),)? #tokens: " + INT + r", K size: " + GIB + r", V size: " + GIB,
       "sglang_kv_dtype kv_cache_tokens sglang_k_gib sglang_v_gib", "word int gib gib", "first", SGLANG),  # 0.4.4+
    _l(r"KV Cache is allocated\.(?: dtype: (\S+),)? #tokens: " + INT + r", KV size: " + GIB,
       "sglang_kv_dtype kv_cache_tokens sglang_kv_gib", "word int gib", "first", SGLANG),  # MLA
    _l(r"KV Cache is allocated\. K size: " + GIB + r", V size: " + GIB, "sglang_k_gib sglang_v_gib", "gib gib",
       "first", SGLANG),  # 0.4.3 (no #tokens)
    _l(r"max_total_num_tokens=" + INT, "sglang_tokens", "int", engine=SGLANG),  # the scheduler's line (rank 0)
    _l(r"max_total_num_tokens=[0-9]+,.*?\bmax_running_requests=" + INT, "max_running_requests", "int", engine=SGLANG),
    _l(r"max_total_num_tokens=[0-9]+,.*?\bchunked_prefill_size=(-?[0-9]+)", "sglang_chunked_prefill_size", "int",
       engine=SGLANG),
    _l(r"max_total_num_tokens=[0-9]+,.*?\bmax_prefill_tokens=" + INT, "sglang_max_prefill_tokens", "int", engine=SGLANG),
    _l(r"\bcontext_len=([0-9]+)", "max_model_len", "int", engine=SGLANG),
    _l(r"\bavailable_gpu_mem=" + GIB, "sglang_available_gpu_mem_gib", "gib", engine=SGLANG),
    _l(r"Load weight begin\. avail mem=" + GIB, "sglang_avail_before_load_gib", "gib", "first", SGLANG),
    _l(r"Load weight end\. .*?avail mem=" + GIB, "sglang_avail_after_load_gib", "gib", "first", SGLANG),
    _l(r"Load weight end\. .*?mem usage=" + GIB, "weights_gib", "gib", "first", SGLANG),  # 0.4.6+
    _l(r"Load weight end\. .*?\bdtype=torch\.(\w+)", "dtype", "word", "first", SGLANG),
    _l(r"(?:Init torch distributed ends|Memory baseline taken)\. .*?mem usage=" + GIB, "sglang_comm_gib", "gib",
       "first", SGLANG),
    _l(r"Memory profiling: available_gpu_memory=" + GIB + r", total_gpu_memory=" + GIB
       + r", mem_fraction_static=" + NUMBER + r", rest_memory=" + GIB,
       "sglang_avail_after_load_gib sglang_avail_before_load_gib gpu_memory_utilization sglang_rest_gib",
       "gib gib float gib", "first", SGLANG),
    _l(r"Memory pool end\. avail mem=" + GIB, "sglang_pool_end_gib", "gib", "first", SGLANG),
    _l(r"Capture (?:cuda|\w+ \w+ CUDA) graph end\. .*?mem usage=" + GIB, "cudagraph_actual_gib", "gib", "first", SGLANG),
    _l(r"(?:Use|use) [Ss]liding window memory pool\. full_layer_tokens=" + INT + r", swa_layer_tokens=" + INT,
       "sglang_full_tokens sglang_swa_tokens", "int int", "first", SGLANG),
    _l(r"Mamba Cache is allocated\. max_mamba_cache_size: " + INT, "sglang_mamba_slots", "int", "first", SGLANG),
    _l(r"\bmem_fraction_static(?:[=:]\s*|\s+)" + NUMBER, "gpu_memory_utilization", "float", engine=SGLANG),
    _l(r"under --mem-fraction-static=" + NUMBER, "gpu_memory_utilization", "float", engine=SGLANG),
    _l(r"SWAKVPool mem usage: " + GIB, "sglang_kv_gib", "gib", "first", SGLANG),  # both pools of a hybrid-SWA model
    _l(r"DSv4 memory calculation: .*?\bavailable_bytes=" + GIB, "sglang_kv_gib", "gib", "first", SGLANG),
    _l(r"\btp_size=([0-9]+)", "tp", "int", engine=SGLANG),
    _l(r"\bpp_size=([0-9]+)", "pp", "int", engine=SGLANG),
    _l(r"model_path='([^']+)'", "model", "word", engine=SGLANG),
    _l(r"\bpage_size=([0-9]+)", "block_size", "int", engine=SGLANG),
    _l(r"\b(sglang\.launch_server|server_args=ServerArgs|The server is fired up and ready to roll)", "sglang_seen",
       "true", engine=SGLANG),
)

# --- the releases a line form was printed by ---------------------------------------------------------------------
# (engine, pattern, first release, last release or None: still printed). A log that does not print its version is of
# the releases every one of its forms was printed by (the notes of each form's release are in the engines' code).
_NEWEST = None
FORMS: tuple[tuple[str, "re.Pattern[str]", tuple[int, ...], tuple[int, ...] | None], ...] = tuple(
    (engine, re.compile(pattern), first, last) for engine, pattern, first, last in (
        # the bounds are the code's, widened where a corpus log of a stated release printed the form outside them
        # (post releases and builds between releases carry the next release's lines)
        (VLLM, r"Loading model weights took [0-9.]+ GB", (0, 6, 0), (0, 7, 99)),
        (VLLM, r"Model loading took [0-9.]+ GB and", (0, 8, 0), (0, 8, 4)),
        (VLLM, r"Model loading took [0-9.]+ GiB and", (0, 8, 1), (0, 11, 99)),
        (VLLM, r"Model loading took [0-9.]+ GiB memory and", (0, 12, 0), _NEWEST),
        (VLLM, r"Available KV cache memory:", (0, 9, 0), _NEWEST),  # 0.9.0.1 prints it
        (VLLM, r"\bGPU KV cache size: [0-9,]+ tokens\s*$", (0, 8, 0), (0, 29, 99)),  # one line from 0.28 (a 0.29 dev: two)
        (VLLM, r"\bKV cache size: [0-9,]+ tokens, Maximum concurrency", (0, 28, 0), _NEWEST),
        (VLLM, r"\b(?:CPU|XPU|TPU) KV cache size: ", (0, 30, 0), _NEWEST),
        (VLLM, r"# (?:GPU|CPU) blocks: [0-9]+, # CPU blocks", (0, 4, 0), (0, 6, 99)),
        (VLLM, r"# (?:cuda|rocm|xpu|hpu|npu) blocks: ", (0, 7, 0), (0, 10, 99)),
        (VLLM, r"Memory profiling results: total_gpu_memory=", (0, 6, 4), (0, 6, 4)),
        (VLLM, r"the current vLLM instance can use total_gpu_memory", (0, 6, 5), (0, 10, 1)),
        (VLLM, r"Estimated CUDA graph memory", (0, 18, 1), _NEWEST),  # a 0.18.1 dev build prints it
        (VLLM, r"In v0\.19, CUDA graph memory profiling will be enabled by default", (0, 18, 1), (0, 19, 99)),
        (VLLM, r"CUDA graph memory profiling is enabled \(default since", (0, 19, 1), _NEWEST),
        (VLLM, r"Actual usage is [0-9.]+ GiB for weight", (0, 10, 2), (0, 25, 99)),
        (VLLM, r"for consumed memory \(weights \+ non-torch\)", (0, 26, 0), _NEWEST),  # a 0.26.0 log prints it
        (VLLM, r"worker init memory snapshot", (0, 14, 0), _NEWEST),
        (VLLM, r"non-torch forward increase memory", (0, 9, 1), (0, 25, 99)),
        (VLLM, r"total consumed \(from mem_get_info\)", (0, 26, 0), _NEWEST),
        (VLLM, r"Initial free memory: [0-9.]+ GiB; Requested memory", (0, 10, 1), _NEWEST),
        (VLLM, r"Initial free memory: [0-9.]+ GiB, free memory:", (0, 9, 1), (0, 9, 2)),
        (VLLM, r"estimated maximum model length is", (0, 9, 1), _NEWEST),
        (VLLM, r"Initializing a V1 LLM engine", (0, 7, 1), _NEWEST),
        (VLLM, r"Initializing a V0 LLM engine", (0, 7, 1), (0, 10, 99)),
        (VLLM, r"Initializing an LLM engine \(v", (0, 4, 0), (0, 7, 0)),
        (VLLM, r"warmup model\) took [0-9.]+ seconds", (0, 6, 6), (0, 19, 99)),
        (VLLM, r"warmup model\) took [0-9.]+ s\b(?!e)", (0, 19, 1), _NEWEST),
        (SGLANG, r"KV Cache is allocated\. K size:", (0, 4, 1), (0, 4, 3)),
        (SGLANG, r"KV Cache is allocated\. #tokens:", (0, 4, 3), (0, 5, 12)),  # 0.4.3.post4 prints it
        (SGLANG, r"KV Cache is allocated\. dtype:", (0, 5, 13), _NEWEST),
        (SGLANG, r"Load weight end\. elapsed=", (0, 5, 7), _NEWEST),  # 0.5.8.post1 prints it
        (SGLANG, r"Load weight end\. type=.*mem usage=", (0, 4, 3), (0, 5, 7)),  # 0.4.3.post4 - 0.5.6.post2
        (SGLANG, r"Load weight end\. type=[^,]*, dtype=[^,]*, avail mem=[0-9.]+ GB\s*$", (0, 3, 6), (0, 4, 5)),
        (SGLANG, r"\bavailable_gpu_mem=", (0, 4, 6), _NEWEST),  # 0.4.6.post2 prints it
        (SGLANG, r"Capture cuda graph end\. Time elapsed: [0-9.]+ s\.? *$", (0, 4, 0), (0, 4, 5)),
        (SGLANG, r"Capture cuda graph end\. Time elapsed: [0-9.]+ s\. mem usage=", (0, 4, 6), (0, 5, 15)),
        (SGLANG, r"Capture \w+ \w+ CUDA graph end\.", (0, 5, 16), _NEWEST),
        (SGLANG, r"Init torch distributed ends\. mem usage=", (0, 4, 3), (0, 5, 7)),
        (SGLANG, r"Init torch distributed ends\. elapsed=", (0, 5, 7), (0, 5, 16)),
    ))

# --- lines read whole (several numbers, or a verdict) -----------------------------------------------------------
V0_REFUSAL = re.compile(r"max (?:seq|model)[ _]len \(([0-9,.]+)\) is larger than the maximum number of tokens that "
                        r"can be stored in KV cache \(([0-9,.]+)\)")
V1_REFUSAL = re.compile(r"max seq len \(([0-9,.]+)\),?\s*\(?(-?[0-9,.]+) Gi?B KV cache is needed, which is larger "
                        r"than the available KV cache memory \((-?[0-9,.]+) Gi?B\)")
V1_ESTIMATE = re.compile(r"estimated maximum model length is " + INT)
# Why an engine stops before it has a pool: (the line, the reason kvplan gives, the engine whose line it is)
STOPS: tuple[tuple[re.Pattern[str], str, str | None], ...] = (
    (re.compile(r"No available memory for the cache blocks"), "no available memory for the cache blocks", VLLM),
    (re.compile(r"Not enough memory\. Please try to increase\s+--mem-fraction-static"),
     "no available memory for the cache blocks", SGLANG),
    (re.compile(r"Loaded weights leave no GPU memory for the KV cache"), "the loaded weights leave no memory for "
                                                                         "the KV cache", SGLANG),
    (re.compile(r"Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache"),
     "not enough memory for the hybrid (mamba / linear-attention) state cache", SGLANG),
    (re.compile(r"on startup is less than desired (?:GPU|CPU) memory utilization"),
     "the free memory at start-up is less than the requested share", VLLM),
    (re.compile(r"is less than requested memory for kv"), "the free memory is less than the KV cache asked for", VLLM),
    (re.compile(r"Cannot auto-fit max_model_len"), "no max_model_len fits (auto-fit)", VLLM),
    # the engine stopped and the excerpt ends before saying why
    (re.compile(r"EngineCore failed to start|Engine core initialization failed"),
     "its start failed, and the excerpt does not say why", VLLM),
    # a refusal cut before its numbers ("To serve at least one request with the model's max seq len (1048576), ...")
    (re.compile(r"To serve at least one request with the models?'s max seq len"),
     "one request at max_model_len does not fit in the KV cache", VLLM),
)
OUT_OF_MEMORY = re.compile(r"(?:CUDA|HIP) out of memory|OutOfMemoryError")
NON_DEFAULT = re.compile(r"non-default args: (\{.*\})")
SERVE_LINE = re.compile(r"(?:^|[\s$#>❯]|/bin/)vllm serve\s")
SGLANG_LAUNCH = re.compile(r"sglang\.launch_server\b")
SERVE_FLAG = re.compile(r"--([a-z][a-z_-]*)(?:[ =]\"?(?!--?[a-z])([^\s\"]+))?")  # a flag, and its value if it has one
WORKER_NAME = re.compile(r"\((?:VllmWorker rank=(\d+)|Worker(?:_DP\d+)?(?:_PP(\d+))?(?:_TP(\d+))?(?:_EP\d+)?) pid=")
WORKER_RANK = re.compile(r"(?:rank=|\bTP|_TP|Worker_TP|TP)(\d+)")
# The lines shown as the log's warnings: the ones about memory, the pool or what changes it (an error elsewhere, a
# chat template's, is not the pool's business)
WARNINGS = re.compile(r"(padding layers|FlashInfer is not available|Custom allreduce is disabled|"
                      r"(?:ValueError|RuntimeError).*(?:memory|cache|KV|block|max seq len|max_model_len)|"
                      r"larger than the (?:maximum number|available KV)|out of memory|No available memory|"
                      r"Not enough (?:GPU )?memory|leave no GPU memory|is less than desired)", re.I)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

__all__ = ["Line", "LINES", "FORMS", "needle", "NUMBER", "INT", "GIB", "V0_REFUSAL", "V1_REFUSAL", "V1_ESTIMATE", "STOPS",
           "OUT_OF_MEMORY", "NON_DEFAULT", "SERVE_LINE", "SERVE_FLAG", "SGLANG_LAUNCH", "WORKER_NAME", "WORKER_RANK", "WARNINGS", "ANSI"]
