"""Sweep speed: a 100,000-scenario what-if (10 models x 10 GPUs x 4 KV dtypes x 25 contexts x 10 batches).

Target: under 2 s without plots (each spec resolved once, each of the 400 pools planned once, rows from
the cheap memory.py functions). Run: ``python3 benchmarks/sweep_speed.py [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WHATIF = """\
title: 100k sweep
sweep:
  model: [meta-llama/Llama-3.1-8B, meta-llama/Llama-3.1-70B, Qwen/Qwen3-8B, Qwen/Qwen3-32B, mistralai/Mistral-7B-v0.3,
          google/gemma-2-9b-it, google/gemma-3-27b-it, deepseek-ai/DeepSeek-V2-Lite-Chat, microsoft/phi-4, openai/gpt-oss-20b]
  gpu: [H100, H200, A100, A100-40GB, L4, L40S, B200, A10G, RTX-4090, MI300X]
  kv_dtype: [auto, fp8, int8, int4]
  context: [1k, 2k, 3k, 4k, 5k, 6k, 7k, 8k, 10k, 12k, 16k, 20k, 24k, 32k, 40k, 48k, 64k, 80k, 96k, 112k, 128k, 160k,
            192k, 224k, 256k]
  batch: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--csv", action="store_true", help="also time rendering every row as CSV")
    args = parser.parse_args()

    t0 = time.perf_counter()
    from kvplan.checks.report import build_report
    from kvplan.checks.scenario import load_whatif

    import_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweep.yaml"
        path.write_text(WHATIF, encoding="utf-8")
        times = []
        for _ in range(args.repeat):
            from kvplan import memory
            from kvplan.model import sources

            sources.clear_spec_cache()  # cold: resolve every spec again
            memory.layout._cached_layout.cache_clear()
            t = time.perf_counter()
            report = build_report(load_whatif(path), offline=True)
            times.append(time.perf_counter() - t)
        n = len(report.rows)
        print(f"imports (pydantic, kvplan): {import_s:.3f} s")
        print(f"{n:,} scenarios, {len(report.pools)} pools: load + sweep best {min(times):.3f} s, "
              f"worst {max(times):.3f} s ({min(times) / n * 1e6:.1f} us/row)")
        if args.csv:
            from kvplan.render.report import to_csv

            t = time.perf_counter()
            text = to_csv(report)
            print(f"CSV of every row: {time.perf_counter() - t:.3f} s ({len(text) / 1e6:.1f} MB)")
        assert n == 100_000


if __name__ == "__main__":
    main()
