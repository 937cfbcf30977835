"""The CLI's entry point as a user runs it, for tests of whole commands.

``kvplan(ARGS)`` runs ``python -m kvplan ARGS`` (the real entry point, not typer's test runner) and returns its
exit code, stdout and stderr; ``assert_one_line`` checks the promise for bad input: exit 2, one line on stderr
(``kvplan: error: ...``), never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kvplan(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """``python -m kvplan ARGS`` as a user runs it (the real entry point, not typer's test runner)."""
    return subprocess.run([sys.executable, "-m", "kvplan", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=kwargs.pop("cwd", ROOT), env={**os.environ, "COLUMNS": "80", **kwargs.pop("env", {})},
                          **kwargs)


def assert_one_line(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvplan: error: "), r.stderr
    assert "Traceback" not in r.stderr and "╭" not in r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
