"""Speed of kvplan's plain-Python block allocator in bulk mode (what ``kvplan simulate`` needs).

36,000 requests, each a 2,100-token prompt (a 2,000-token prefix shared by all, 100 unique tokens)
then 200 anonymous output tokens, 256 running at a time, block size 16. Prints the median of 3 runs.

    python3 benchmarks/allocator_speed.py
"""

from __future__ import annotations

import statistics
import time

from kvplan.paged.allocator import BlockAllocator

NUM_REQUESTS, PREFIX_TOKENS, UNIQUE_TOKENS, OUTPUT_TOKENS = 36_000, 2_000, 100, 200
BLOCK_SIZE, RUNNING = 16, 256


def run_once() -> tuple[float, float]:
    """One pass; returns (seconds, prefix hit rate)."""
    per_request = -(-(PREFIX_TOKENS + UNIQUE_TOKENS + OUTPUT_TOKENS) // BLOCK_SIZE)
    alloc = BlockAllocator(RUNNING * per_request + 1024, BLOCK_SIZE)
    prefix = list(range(PREFIX_TOKENS))
    start = time.perf_counter()
    running: list[int] = []
    for req in range(NUM_REQUESTS):
        base = 1_000_000 + req * UNIQUE_TOKENS
        if alloc.allocate(req, prefix + list(range(base, base + UNIQUE_TOKENS))) is None:
            raise RuntimeError("pool too small for the benchmark")
        running.append(req)
        if len(running) == RUNNING:
            for r in running:
                if not alloc.append_tokens(r, OUTPUT_TOKENS):
                    raise RuntimeError("pool too small for the benchmark")
                alloc.free(r)
            running.clear()
    for r in running:
        alloc.append_tokens(r, OUTPUT_TOKENS)
        alloc.free(r)
    seconds = time.perf_counter() - start
    return seconds, alloc.prefix_hit_tokens / alloc.prefix_query_tokens


def main() -> None:
    runs = [run_once() for _ in range(3)]
    seconds = statistics.median(s for s, _ in runs)
    print(f"{NUM_REQUESTS:,} requests ({PREFIX_TOKENS:,}-token shared prefix + {UNIQUE_TOKENS} unique, "
          f"{OUTPUT_TOKENS} output, block size {BLOCK_SIZE}): median {seconds:.2f} s of 3 "
          f"({[round(s, 2) for s, _ in runs]}), prefix hit rate {runs[0][1]:.3f}")


if __name__ == "__main__":
    main()
