"""Time-to-fail of ``kvplan.model.hub.fetch_model`` when the Hub cannot answer and nothing is cached.

Two cases, each the median of 5 runs in one process (huggingface_hub already imported), plus one cold run
in a fresh interpreter (what a CLI user waits for, import of huggingface_hub included):

* offline, not cached: ``fetch_model(repo, offline=True)`` with an empty HF cache;
* unreachable endpoint: HF_ENDPOINT is a closed port on 127.0.0.1 (connection refused), empty cache.

Run: ``python3 benchmarks/hub_offline_fail.py``. No network is used.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = "acme/not-cached-anywhere"
RUNS = 5
ROOT = Path(__file__).resolve().parent.parent


def closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def time_to_fail(offline: bool) -> tuple[float, str]:
    """Seconds until fetch_model raises, and the error's one-line text."""
    from kvplan.errors import KvplanError
    from kvplan.model.hub import fetch_model

    start = time.perf_counter()
    try:
        fetch_model(REPO, offline=offline)
    except KvplanError as exc:
        return time.perf_counter() - start, exc.one_line()
    raise SystemExit("expected a failure, got a model")


COLD = """
import time, sys
start = time.perf_counter()
from kvplan.errors import KvplanError
from kvplan.model.hub import fetch_model
try:
    fetch_model({repo!r}, offline={offline})
except KvplanError:
    print(time.perf_counter() - start)
"""


def cold_run(offline: bool, env: dict[str, str]) -> float:
    out = subprocess.run(
        [sys.executable, "-c", COLD.format(repo=REPO, offline=offline)],
        env=env, cwd=ROOT, capture_output=True, text=True, check=True,
    )
    return float(out.stdout.strip())


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kvplan-hf-home-") as home:
        run(home)


def run(home: str) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    # Before huggingface_hub is imported: it reads these into its constants at import time.
    os.environ.update({"HF_HOME": home, "HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1"})
    for name in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"):
        os.environ.pop(name, None)
    sys.path.insert(0, str(ROOT))
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}

    print(f"HF_HOME={home} (empty)  HF_ENDPOINT={endpoint} (closed port)")
    for label, offline in (("offline, not cached", True), ("unreachable endpoint", False)):
        cold = cold_run(offline, env)
        times = []
        for _ in range(RUNS):
            seconds, message = time_to_fail(offline)
            times.append(seconds)
        print(f"{label:22s} median {statistics.median(times) * 1000:8.1f} ms over {RUNS} runs "
              f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}); "
              f"cold process incl. import {cold * 1000:.0f} ms")
        print(f"{'':22s} -> {message}")


if __name__ == "__main__":
    main()
