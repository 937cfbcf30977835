"""vLLM's CPU backend: its defaults (block size, batched tokens) and the KV space it takes when none is set, per
release (bytes of the host's NUMA node).
"""

from __future__ import annotations

from kvplan.engines import (
    Term,
    release_tuple,
)
from kvplan.engines.vllm_releases import (
    ENGINE,
)
from kvplan.units import GiB

CPU_BLOCK_SIZE = 128
CPU_MAX_NUM_BATCHED_TOKENS = 4096
CPU_KVCACHE_SPACE_BYTES = 4 * GiB  # VLLM_CPU_KVCACHE_SPACE unset: vLLM's CPU backend uses 4 GiB (before 0.14)
# VLLM_CPU_KVCACHE_SPACE unset, from 0.14 (cpu_kv_budget): 0.14 - 0.19 take half of one NUMA node's memory
# (CpuPlatform.get_device_total_memory: total // nodes x DEFAULT_CPU_MEM_UTILIZATION 0.5); 0.20+ the node's total x
# gpu_memory_utilization less what the worker process holds (CPUWorker.determine_available_memory: "Auto set").
CPU_HALF_NODE_FROM, CPU_AUTO_SET_FROM = (0, 14, 0), (0, 20, 0)
CPU_HALF_NODE_FRACTION = 0.5
# The worker's resident memory besides the weights (torch, the runtime, warm-up) that 0.20+'s "Auto set" takes off:
# 1.04 GiB in the one calibration log that prints it (vllm-f55665240602, macOS arm64: 3.92 GiB consumed, 2.88 GiB of
# it the weights of Qwen2.5-1.5B) and 0.69 GiB on a real vLLM 0.32.0 CPU server here (Linux x86, the 41.7 M
# parameter benchmarks/real_server_model: 0.77 GiB consumed); kvplan keeps 1.05 GiB, above both.
CPU_WORKER_RSS_BYTES = round(1.05 * GiB)


def cpu_kv_budget(version: str, node_bytes: int, usable_bytes: int, weights_bytes: int,
                  overhead: Term | None) -> tuple[int, str, Term, list[str]]:
    """``(KV bytes, source, overhead term, notes)`` of vLLM's CPU backend when neither ``VLLM_CPU_KVCACHE_SPACE``
    nor ``--kv-cache-memory-bytes`` is set, on a NUMA node of ``node_bytes`` (``--gpu-memory``; 0: not given):
    4 GiB before 0.14; half the node 0.14 - 0.19; from 0.20 ``ceil(node x gpu_memory_utilization)``
    (``usable_bytes``) less the worker's resident memory: the weights and the overhead term (``overhead`` when
    given, else :data:`CPU_WORKER_RSS_BYTES`; a start with nothing left fails: "Available memory on node ... less
    than requested memory for kv"). Before 0.20 the overhead is not subtracted."""
    release = release_tuple(version, ENGINE)
    ask = "pass --kv-budget with the size your log states (its \"Auto set\" / \"Explicitly set\" line)"
    if release < CPU_AUTO_SET_FROM or not node_bytes:
        overhead = overhead or Term("overhead", 0, "not subtracted on the CPU backend")
        if release < CPU_HALF_NODE_FROM or not node_bytes:
            note = [] if release < CPU_HALF_NODE_FROM else [
                "vLLM 0.14+ on CPU sizes an unset VLLM_CPU_KVCACHE_SPACE from the NUMA node's memory: pass "
                "--gpu-memory with the node's size, or " + ask]
            return CPU_KVCACHE_SPACE_BYTES, "VLLM_CPU_KVCACHE_SPACE unset: vLLM's CPU default 4 GiB", overhead, note
        kv = int(node_bytes * CPU_HALF_NODE_FRACTION)
        return kv, f"VLLM_CPU_KVCACHE_SPACE unset: half of the {node_bytes / GiB:.2f} GiB node", overhead, []
    notes = []
    if overhead is None:
        overhead = Term("overhead", CPU_WORKER_RSS_BYTES, "estimate: the CPU worker's resident memory besides the "
                        "weights (torch and the runtime), which \"Auto set\" takes off")
        notes.append(f"the CPU worker's memory besides the weights is an estimate ({CPU_WORKER_RSS_BYTES / GiB:.2f} "
                     "GiB; its log says \"... GiB memory was consumed by non-kv usages\"): pass --overhead-gib with "
                     "that less the weights, or " + ask)
    worker = weights_bytes + overhead.bytes
    kv = usable_bytes - worker
    return kv, (f"VLLM_CPU_KVCACHE_SPACE unset (\"Auto set\"): node x gpu_memory_utilization {usable_bytes / GiB:.2f} "
                f"GiB - the worker's memory {worker / GiB:.2f} GiB (weights + overhead)"), overhead, notes
