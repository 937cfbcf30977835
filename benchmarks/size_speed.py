"""Size speed: ``kvplan size``'s search over the catalogue's datacenter GPUs (26 GPUs, every tp within a node,
pipeline stages where they can be smaller) for one model of each kind.

Target: at most 1 s per search (the spec resolved once, each (gpu, tp, pp) replica planned once and reused for
its replica count; :func:`kvplan.planning.size.request_bound` skips the stage counts that cannot beat the best).
Run: ``python3 benchmarks/size_speed.py [--repeat 3] [--cases N]`` (the first N models; all by default).
Measured, not asserted in a test (machine-dependent).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = [  # (model, engine, requests, context)
    ("meta-llama/Llama-3.3-70B-Instruct", "vllm", 200, 8192),
    ("meta-llama/Llama-3.1-405B", "vllm", 200, 8192),
    ("Qwen/Qwen3-30B-A3B", "sglang", 500, 16384),
    ("deepseek-ai/DeepSeek-R1", "vllm", 100, 16384),
    ("google/gemma-3-27b-it", "vllm", 300, 32768),
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", "sglang", 200, 32768),
]
TARGET_S = 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", type=int, default=len(CASES), help="search for the first N models only")
    args = parser.parse_args()

    from kvplan.model.sources import load_spec
    from kvplan.options import options_from_values
    from kvplan.planning.size import Requirement, size

    worst = 0.0
    for model, engine, n, context in CASES[:max(1, args.cases)]:
        spec, source = load_spec(model)  # resolved once, as kvplan size does
        base = options_from_values({"model": model, "engine": engine})
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            sizing = size(spec, base, Requirement(n, context), source=source.describe())
            times.append(time.perf_counter() - t)
        best = sizing.best
        worst = max(worst, statistics.median(times))
        print(f"{model} ({engine}, {n} x {context:,}): {len(sizing.rows) + len(sizing.unfit)} GPUs, "
              f"{sizing.searched} (tp, pp) shapes tried, median {statistics.median(times):.3f} s; smallest "
              f"{best.replicas} x {best.gpu} tp {best.tp} pp {best.pp} = {best.gpus} GPUs")
    verdict = "within" if worst <= TARGET_S else "OVER"
    print(f"size search: worst median {worst:.3f} s per search ({verdict} the {TARGET_S:g} s target)")


if __name__ == "__main__":
    main()
