"""vLLM's KV budget: defaults and the terms its memory profiler subtracts.

requested = ceil(total x gpu_memory_utilization); available KV = requested - weights - activation
peak of the profile run - non-torch memory - CUDA-graph memory. (See docs/dev/engine_budget_notes.md.)
"""

from __future__ import annotations

import math

from kvplan.engines import Budget, EngineDefaults, Term
from kvplan.spec import ModelSpec
from kvplan.units import GiB, MiB

ENGINE = "vllm"
VERSIONS = ("0.32",)
DEFAULT_VERSION = "0.32"


def defaults(version: str, gpu_memory_bytes: int | None, is_cpu: bool) -> EngineDefaults:
    """vLLM's defaults for ``vllm serve``: utilisation 0.92 (2026 releases), block 16 (CPU 128),
    max_num_batched_tokens / max_num_seqs by device memory (>= 70 GiB: 8192 / 1024, else 2048 / 256;
    CPU: 4096 / 256)."""
    if is_cpu:
        return EngineDefaults(ENGINE, version, 1.0, 128, 4096, 256)
    big = gpu_memory_bytes is not None and gpu_memory_bytes >= 70 * GiB
    return EngineDefaults(ENGINE, version, 0.92, 16, 8192 if big else 2048, 1024 if big else 256)


def activation_bytes(spec: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int) -> int:
    """Peak activation of vLLM's profile run (bytes, per GPU).

    A forward pass over ``max_num_batched_tokens`` tokens keeps the residual and hidden states, the
    QKV projection and the MLP's gate/up output alive at once (MoE: the active experts' intermediate),
    then the sampler materialises fp32 logits for ``max_num_seqs`` rows (with a copy for sampling).
    """
    t = max_num_batched_tokens
    inter = spec.moe_intermediate_size * max(1, spec.num_experts_per_token) if spec.num_experts else spec.intermediate_size
    per_token = 4 * spec.hidden_size + 2 * math.ceil(inter / tp) + 3 * math.ceil(spec.hidden_size / tp)
    forward = t * per_token * act_bytes
    logits = 2 * max_num_seqs * math.ceil(spec.vocab_size / tp) * 4
    return forward + logits


NON_TORCH_BYTES = 512 * MiB  # NCCL/cuBLAS workspaces and the CUDA context outside torch's allocator
CUDAGRAPH_BYTES = 512 * MiB  # captured graph pools (profiled and subtracted in 2026 releases)


def budget(total_bytes: int, gpu_util: float, weights: Term, activation: Term | None, overhead: Term | None,
           cudagraph: Term | None, kv_budget_override: int | None, *, spec: ModelSpec, tp: int,
           max_num_batched_tokens: int, max_num_seqs: int, act_bytes: int, is_cpu: bool) -> Budget:
    """The per-GPU budget with every term; any term given by the caller replaces the model's."""
    usable = math.ceil(total_bytes * gpu_util)
    if activation is None:
        activation = Term("activation", activation_bytes(spec, tp, max_num_batched_tokens, max_num_seqs, act_bytes),
                          f"computed: profile run of {max_num_batched_tokens:,} tokens + {max_num_seqs:,} fp32 logit rows")
    if overhead is None:
        overhead = Term("overhead", 0 if is_cpu else NON_TORCH_BYTES, "computed: non-torch memory (CUDA context, NCCL, cuBLAS)")
    if cudagraph is None:
        cudagraph = Term("cudagraph", 0 if is_cpu else CUDAGRAPH_BYTES, "computed: CUDA graph capture")
    if kv_budget_override is not None:
        kv, source = kv_budget_override, "--kv-budget"
    else:
        kv = usable - weights.bytes - activation.bytes - overhead.bytes - cudagraph.bytes
        source = "usable - weights - activation - overhead - cudagraph"
    return Budget(total_bytes, gpu_util, usable, weights, activation, overhead, cudagraph, kv, source)
