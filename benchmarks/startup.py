"""Start-up benchmark: wall time of `kvplan estimate` on a bundled model (median of N runs).

    python3 benchmarks/startup.py [--runs 20]

Prints the median, min and max wall time of a fresh `python -m kvplan estimate ...` process, plus
`python -c pass` as the interpreter's own floor. The target is a median under 0.25 s on the dev
machine (2 cores, shared): compare medians, never single runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "kvplan --version": [sys.executable, "-m", "kvplan", "--version"],
    "kvplan estimate (rich)": [sys.executable, "-m", "kvplan", "estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H100"],
    "kvplan estimate --json": [sys.executable, "-m", "kvplan", "estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--json"],
}


def measure(cmd: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    print(f"{'command':28} {'median':>8} {'min':>8} {'max':>8}  ({args.runs} runs)")
    for name, cmd in COMMANDS.items():
        measure(cmd, 2)  # warm the file cache
        t = measure(cmd, args.runs)
        print(f"{name:28} {statistics.median(t):8.3f} {min(t):8.3f} {max(t):8.3f}")


if __name__ == "__main__":
    main()
