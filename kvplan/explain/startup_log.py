"""What a start-up log says, frozen: the StartupLog kvplan.explain.logparse.parse_log reads (every field None when the
log does not say; sizes GiB as printed), and its refusal.
"""

from __future__ import annotations

from dataclasses import fields
from kvplan.frozen import frozen
from typing import Any


@frozen
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


@frozen
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
    chunked_prefill: bool | None = None  # chunked prefill as the config line (chunked_prefill_enabled, resolved)
    # or the arguments (enable_chunked_prefill) print it
    flashinfer_sampler: bool | None = None  # vLLM's sampler said it uses FlashInfer (True) or falls back (False)
    wheel_install: bool | None = None  # vLLM runs from a site-packages directory: a pip / uv install of the wheel
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
    def activation_holds_graphs(self) -> bool:
        """Whether the printed peak activation includes the CUDA-graph estimate the budget subtracts: vLLM 0.27+
        (the form that prints "consumed memory (weights + non-torch)"), whose ``peak_activation_memory`` is the
        transient torch peak plus that estimate, and whose "CUDAGraph memory" is the graphs captured later."""
        return self.consumed_gib is not None and self.activation_gib is not None

    @property
    def prints_terms(self) -> bool:
        """Whether the log prints a budget term beside its KV budget (weights, activation, non-torch, graphs)."""
        return any(x is not None for x in (self.weights_gib, self.activation_gib, self.peak_torch_memory_gib,
                                           self.non_torch_gib, self.consumed_gib, self.non_kv_gib))


class Unreadable(ValueError):
    """A number in a line the parser matched that is not a number the engine prints (garbled or cut)."""
