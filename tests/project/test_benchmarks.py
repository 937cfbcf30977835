"""The speed benchmarks still run: a benchmark that raises on an API it no longer has measures nothing.

Only that each runs to its summary line is asserted here; the numbers are machine-dependent (measured as
medians and ratios by the scripts themselves, never timed in tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from entry_point import script as run_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script,args,needle", [
    ("sweep_speed.py", ["--repeat", "1"], "100,000 scenarios, 400 pools: load + sweep best"),
    ("simulate_speed.py", ["--duration", "5"], "prefix_caching"),
    # one model's search runs the script's whole path (a search of each kind of model: tests/planning/test_size.py)
    ("size_speed.py", ["--repeat", "1", "--cases", "1"], "size search: worst median"),
])
def test_a_speed_benchmark_runs_to_its_summary(script, args, needle):
    proc = run_script(ROOT / "benchmarks" / script, *args)  # in this interpreter: a spawn adds only start-up
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert needle in proc.stdout, proc.stdout[-2000:]


def test_the_real_server_section_is_what_its_recorded_rounds_simulate_to(tmp_path):
    """docs/validation.md's real-server section comes from benchmarks/real_server_results.json (the rounds
    measured on a vLLM CPU server): re-simulated with today's simulator, the section is unchanged (after a
    simulator change, regenerate it: python3 benchmarks/real_server.py --report benchmarks/real_server_results.json
    --write)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "real_server.py"), "--report",
                           str(ROOT / "benchmarks" / "real_server_results.json"), "--results", str(tmp_path / "r.json")],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    begin, end = "<!-- real-server:begin -->", "<!-- real-server:end -->"
    doc = (ROOT / "docs" / "validation.md").read_text()
    assert proc.stdout[proc.stdout.index(begin):proc.stdout.index(end)] == doc[doc.index(begin):doc.index(end)]
