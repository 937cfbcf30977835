"""A fuzz of config files (bytes, not only JSON), YAML files and CLI option values: never a traceback, never
a hang past 10 s (per input), never more than 1 GiB (the worker process, measured from outside).

The inputs are made and fed to the real CLI entry point by tests/fuzz_worker.py in a fresh interpreter,
so its peak memory (``ru_maxrss``) is the fuzz's alone; an address-space limit of 4 GiB is a safety cap
for the shared machine, not the assertion.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("KVPLAN_FUZZ_EXAMPLES", "300"))


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("mode", ["config", "yaml", "options"])
def test_fuzz_never_a_traceback_a_hang_or_a_gigabyte(mode):
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fuzz_worker.py"), mode, str(EXAMPLES)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, preexec_fn=_cap_memory,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = proc.stdout.read().decode(errors="replace")  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, out[-6000:]
    assert out.startswith("ok "), out[-2000:]
    assert usage.ru_maxrss * 1024 < 1 << 30, f"peak RSS {usage.ru_maxrss / 1024:.0f} MiB"
    assert elapsed < EXAMPLES * 10, f"{elapsed:.0f} s"  # each input has its own 10 s deadline inside the worker
