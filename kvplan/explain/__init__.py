"""Start-up logs: a vLLM or SGLang log read (:mod:`kvplan.explain.logparse`) and reconciled with the plan
term by term (:mod:`kvplan.explain.reconcile`), and the calibration entry it can write.

May import: kvplan.errors, kvplan.units, kvplan.limits, kvplan.io, kvplan.gpus, kvplan.options, kvplan.model,
kvplan.memory, kvplan.engines, kvplan.planning
"""
