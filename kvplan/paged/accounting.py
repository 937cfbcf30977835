"""The device's own accounting of memory, for the validator (torch imported by the caller, passed in).

CUDA: the caching allocator's ``memory_allocated`` and the driver's ``mem_get_info``; CPU: the process's
resident set (``/proc/self/statm``) and ``MemAvailable``. An out-of-memory error is recognised whatever
raised it (torch, the CPU allocator).
"""

from __future__ import annotations

import os
from typing import Any


def rss_bytes() -> int | None:
    """Resident set size of this process (bytes), from /proc/self/statm; None where there is no /proc."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def available_bytes(torch: Any, device: str) -> int | None:
    """Bytes a new pool may take: CUDA's free memory, the host's ``MemAvailable`` on CPU (None if unknown)."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def device_allocated(torch: Any, device: str) -> int:
    """CUDA: bytes the caching allocator holds for tensors (after a synchronize); 0 on CPU."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        return int(torch.cuda.memory_allocated(device))
    return 0


def is_oom(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, a RuntimeError saying "out of memory", or the CPU allocator's failure."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and
                                            ("out of memory" in text or "can't allocate memory" in text))


def free_bytes(torch: Any, device: str) -> int | None:
    """CUDA: the driver's free memory (``mem_get_info``); None elsewhere."""
    return int(torch.cuda.mem_get_info(torch.device(device))[0]) if device.startswith("cuda") else None


def malloc_trim() -> None:
    """Hand freed heap pages back to the OS (glibc), so the next run's resident-set delta counts its pool."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
