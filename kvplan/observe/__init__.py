"""``kvplan observe``: read a running vLLM or SGLang server's Prometheus ``/metrics`` and measure its pool.

Data flows one way: :mod:`~kvplan.observe.scrape` fetches a page (per-request timeout, one clear line per
fault) -> :mod:`~kvplan.observe.metrics` turns it into readings per series (one per ``model_name`` /
engine behind the endpoint) using each engine's documented metric names -> :mod:`~kvplan.observe.track`
aggregates readings over polls (now / mean / peak, counters across server restarts) ->
:mod:`~kvplan.observe.session` runs the polling loop -> :mod:`~kvplan.observe.compare` sets the result
beside the plan ``kvplan estimate`` makes for the same deployment, and :mod:`~kvplan.observe.gates`
judges ``--require`` expressions; :mod:`~kvplan.observe.fit` turns a run into a step-time measurement for
``kvplan simulate``'s timing file (:mod:`kvplan.sim.timing`). Nothing here prints or exits;
``kvplan/render/observe.py`` renders.

``prometheus_client`` (its text-format parser) is imported only when a page is parsed, so the rest of
kvplan starts without it.

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits, kvplan.io, kvplan.gpus, kvplan.options, kvplan.model, kvplan.memory,
kvplan.engines, kvplan.planning, kvplan.checks, kvplan.sim
"""
