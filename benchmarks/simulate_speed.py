"""Speed of ``kvplan simulate``: an hour of the shared-prompt example (10 requests/s, ~36,000 requests).

Runs each policy separately (spec and plan resolved once) and prints seconds per policy, the events the
loop took (steps taken one at a time or k at once) against the engine steps simulated, and the share of
the time spent inside the block allocator. Target: < 10 s per policy.

    python3 benchmarks/simulate_speed.py [workload.yaml] [--duration SECONDS]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvplan.paged import allocator as alloc_mod
from kvplan.planning.plan import estimate, options_from_values
from kvplan.sim.simulate import POLICIES, config_from_plan, simulate
from kvplan.sim.workload import load_workload

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "shared_prompt.yaml"


def _timed_allocator(acc: dict[str, float]) -> None:
    """Wrap the allocator's public mutators to add up their seconds in ``acc['allocator']``."""
    for name in ("allocate", "append_tokens", "free"):
        fn = getattr(alloc_mod.BlockAllocator, name)

        def wrapper(self, *args, _fn=fn):  # noqa: ANN001, ANN002, ANN202
            t0 = time.perf_counter()
            try:
                return _fn(self, *args)
            finally:
                acc["allocator"] += time.perf_counter() - t0

        setattr(alloc_mod.BlockAllocator, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", nargs="?", default=str(EXAMPLE))
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--allocator-share", action="store_true", help="also time the allocator (adds overhead)")
    args = ap.parse_args()
    wl = load_workload(args.workload)
    duration = args.duration or wl.duration_s
    config, _ = config_from_plan(estimate(options_from_values(dict(wl.values))))
    source = wl.source()
    acc = {"allocator": 0.0}
    if args.allocator_share:
        _timed_allocator(acc)
    for policy in POLICIES:
        acc["allocator"] = 0.0
        t0 = time.perf_counter()
        r = simulate(config, source, policies=[policy], duration_s=duration, seed=wl.seed, record_series=False).results[0]
        seconds = time.perf_counter() - t0
        share = f", allocator {acc['allocator']:.1f} s" if args.allocator_share else ""
        print(f"{policy:15s} {seconds:6.2f} s  ({r.arrived:,} requests, {r.num_steps:,} steps in {r.num_events:,} "
              f"events{share}; {r.requests_per_s:.2f} req/s, {r.output_tokens_per_s:,.0f} tok/s)")


if __name__ == "__main__":
    main()
