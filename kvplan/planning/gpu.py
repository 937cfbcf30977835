"""The GPU a plan is for, as the runtime reports it: the catalogue's card (or --gpu-memory) resolved once per plan.
"""

from __future__ import annotations

from typing import Any

from kvplan.engines import Device
from kvplan.errors import InputError
from kvplan.options import Options
from kvplan.units import GiB, MiB
from kvplan.frozen import frozen


@frozen
class GpuInfo:
    """The GPU planned for: name, memory the runtime reports (bytes), HBM bandwidth (bytes/s)."""

    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: int | None
    memory_source: str
    is_cpu: bool = False
    fp16_tflops: float | None = None  # dense fp16/bf16 peak, for prefill-cost estimates
    vendor: str = ""  # nvidia, amd, any (the catalogue's), "" for --gpu-memory alone
    sm_count: int | None = None  # streaming multiprocessors (AMD: compute units)
    interconnect: str | None = None  # nvlink-switch, nvlink, pcie, infinity-fabric (the catalogue's)
    bf16: bool = True  # the engine can run bfloat16 here (NVIDIA: compute capability >= 8.0)
    compute_capability: str | None = None  # NVIDIA compute capability (the catalogue's)
    smi_memory_bytes: int | None = None  # the total nvidia-smi shows (the catalogue's smi_memory_mib)
    memory_kind: str = "dedicated"  # "unified": the host's memory (the catalogue's memory_kind)

    @property
    def device(self) -> Device:
        """What the engine's budget needs: platform (``rocm`` for AMD GPUs, else ``cuda``), SMs, interconnect,
        compute capability and nvidia-smi's total."""
        return Device("rocm" if self.vendor == "amd" else "cuda", self.sm_count, self.interconnect,
                      self.compute_capability, self.smi_memory_bytes)


def resolve_gpu(options: Options) -> GpuInfo:
    """The GPU from the catalogue (or ``--gpu-memory``), as the runtime reports it."""
    from kvplan.gpus import find_gpu

    gpu = find_gpu(options.gpu) if options.gpu else None
    is_cpu = bool(gpu and gpu.is_cpu)
    if gpu is not None and not is_cpu and gpu.memory_bytes and options.gpu_memory_bytes:
        _check_gpu_memory(gpu, options.gpu_memory_bytes)
    memory_bytes = options.gpu_memory_bytes or (gpu.memory_bytes if gpu else None)
    source = "--gpu-memory" if options.gpu_memory_bytes else (gpu.memory_source if gpu else "")
    if memory_bytes is None and is_cpu and options.kv_budget_bytes:
        # The CPU backend sizes its KV cache from VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory alone.
        memory_bytes, source = options.kv_budget_bytes, "--kv-budget (the CPU backend needs no host memory size)"
    if memory_bytes is None:
        raise InputError(f"GPU {gpu.name if gpu else options.gpu!r} has no fixed memory",
                         "pass --gpu-memory SIZE (e.g. 64GiB), or for the CPU backend --kv-budget SIZE")
    name = gpu.name if gpu else "custom"
    same_memory = gpu is not None and memory_bytes == gpu.memory_bytes
    return GpuInfo(name, memory_bytes, gpu.bandwidth_bytes_per_s if gpu else None, source, is_cpu,
                   gpu.fp16_tflops if gpu else None, gpu.vendor if gpu else "", gpu.sm_count if gpu else None,
                   gpu.interconnect if gpu else None, gpu.supports_bf16 if gpu else True,
                   gpu.compute_capability if gpu else None,
                   gpu.smi_memory_mib * MiB if gpu and gpu.smi_memory_mib and same_memory else None,
                   gpu.memory_kind if gpu else "dedicated")


def _check_gpu_memory(gpu: Any, given_bytes: int) -> None:
    """``--gpu-memory`` with a named GPU may be less than it reports (a share of it) but not more than the part
    has by any count (what the runtime reports, nvidia-smi's total, the size on its box): a plan on memory the
    GPU does not have is refused, never answered."""
    most = max(gpu.memory_bytes, (gpu.smi_memory_mib or 0) * MiB, round((gpu.marketing_gb or 0) * GiB))
    if given_bytes <= most:
        return
    counts = [f"it reports {gpu.memory_bytes / GiB:,.2f} GiB"]
    if gpu.smi_memory_mib:
        counts.append(f"nvidia-smi {gpu.smi_memory_mib:,} MiB")
    if gpu.marketing_gb:
        counts.append(f"{gpu.marketing_gb:g} GB on the box")
    raise InputError(f"--gpu-memory {given_bytes / GiB:,.2f} GiB is more than the {gpu.name} has ({', '.join(counts)})",
                     "name the GPU that has it (`kvplan gpus`), or leave --gpu out: --gpu-memory alone plans a GPU "
                     "of that size")
