"""The pieces of ``kvplan simulate`` (the public API is :mod:`kvplan.sim.simulate`).

* :mod:`~kvplan.sim.workload`: workload files (their schema in :mod:`~kvplan.sim.workload_schema`, a run of one in
  :mod:`~kvplan.sim.workload_run`);
* :mod:`~kvplan.sim.model`: the inputs (requests, pool, timing) and outputs (per-policy results);
* :mod:`~kvplan.sim.streams`: request streams that every policy replays, and the live requests;
* :mod:`~kvplan.sim.blocks`: the block accounting over :mod:`kvplan.paged.allocator`;
* :mod:`~kvplan.sim.metrics`: metrics kept as running sums and bounded sketches (never one entry per event);
* :mod:`~kvplan.sim.scheduler`: the continuous-batching step loop;
* :mod:`~kvplan.sim.timing`: a step time measured on a running server (the fit, and the timing file that
  ``kvplan observe --fit-timing`` writes and ``kvplan simulate`` reads).

Library code: never prints, never exits.

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits, kvplan.io, kvplan.gpus, kvplan.options, kvplan.model, kvplan.memory,
kvplan.engines, kvplan.planning, kvplan.checks, kvplan.paged
"""
