"""The promise for bad input, across commands: one line on stderr (``kvplan: error: ...``), exit 2, never a
traceback, never a runaway. Usage errors, a fuzz of files and option values, and the docs' examples."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("args,needles", [
    (["estimate", "meta-llama/Llama-3.1-8B", "--nope"], ["No such option: --nope", "(see kvplan estimate --help)"]),
    (["estimate"], ["Missing argument", "(see kvplan estimate --help)"]),
    (["estimate", "x", "--tp", "abc"], ["'abc' is not a valid int"]),
    (["nocommand"], ["No such command 'nocommand'", "(see kvplan --help)"]),
    (["report", "--rows", "0", "x.yaml"], ["--rows"]),
    (["simulate", "docs/examples/shared_prompt.yaml", "--duration", "abc"], ["--duration"]),
])
def test_usage_errors_are_the_documented_one_line(args, needles):
    # typer printed a multi-line "Usage: ... ╭─ Error ─╮" box; docs/cli.md promises one line and exit 2
    assert_one_line(kvplan(*args), *needles)


def test_help_and_version_still_work():
    assert kvplan("--version").stdout.startswith("kvplan ")
    r = kvplan("estimate", "--help")
    assert r.returncode == 0 and "--context" in r.stdout


def test_reading_a_small_file_does_not_allocate_the_size_bound(tmp_path):
    # files.read_bytes used read(64 MiB + 1): 64 MiB allocated for every YAML, config or trace read
    import tracemalloc

    from kvplan.files import MAX_FILE_BYTES, read_text

    path = tmp_path / "small.yaml"
    path.write_text("defaults: {}\n")
    tracemalloc.start()
    assert read_text(path) == "defaults: {}\n"
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < MAX_FILE_BYTES // 64, f"peak {peak:,} B"
