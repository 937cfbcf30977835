"""Start-up logs: a vLLM or SGLang log read (:mod:`kvplan.explain.logparse` into a
:mod:`kvplan.explain.startup_log`; its line forms in :mod:`kvplan.explain.lines`, its numbers as printed in
:mod:`kvplan.explain.printed`, its command lines in :mod:`kvplan.explain.args`), its facts: the options of its
deployment and its own account (:mod:`kvplan.explain.facts`), its reconciliation with the plan
(:mod:`kvplan.explain.reconcile`) term by term (:mod:`kvplan.explain.compare`, the types in
:mod:`kvplan.explain.account`), the calibration entry it can write (:mod:`kvplan.explain.calibrate`), and many
logs at once (:mod:`kvplan.explain.many`).

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits, kvplan.io, kvplan.gpus, kvplan.options, kvplan.model,
kvplan.memory, kvplan.engines, kvplan.planning
"""
