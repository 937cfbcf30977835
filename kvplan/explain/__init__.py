"""Start-up logs: a vLLM or SGLang log read (:mod:`kvplan.explain.logparse`, its line forms in
:mod:`kvplan.explain.lines`), its own account and its reconciliation with the plan term by term
(:mod:`kvplan.explain.reconcile`), the calibration entry it can write, and many logs at once
(:mod:`kvplan.explain.many`).

May import: kvplan.errors, kvplan.units, kvplan.limits, kvplan.io, kvplan.gpus, kvplan.options, kvplan.model,
kvplan.memory, kvplan.engines, kvplan.planning
"""
