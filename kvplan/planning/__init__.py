"""What a plan is made of: options + model spec + engine rules -> the frozen Plan and its Answer.

- :mod:`kvplan.planning.plan`: :func:`~kvplan.planning.plan.estimate` and the frozen ``Plan``;
- :mod:`kvplan.planning.gpu`: the GPU as the runtime reports it;
- :mod:`kvplan.planning.pool`: the per-GPU pool (engine defaults, dtypes, layers, layout, budget, blocks), its given
  budget terms in :mod:`kvplan.planning.budget`;
- :mod:`kvplan.planning.notes`: what the reader of a plan should know;
- :mod:`kvplan.planning.answer`: one deployment's answer (starts, requests, fits, max context);
- :mod:`kvplan.planning.auto_length`: ``--max-model-len auto``;
- :mod:`kvplan.planning.suggest`: option changes that make a plan fit, re-planned before they are offered;
- :mod:`kvplan.planning.serialize`: a plan as the JSON every output shares;
- :mod:`kvplan.planning.size`: the smallest deployments (GPU x tp x pp x replicas) that hold N requests.

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits, kvplan.io, kvplan.gpus, kvplan.options, kvplan.model,
kvplan.memory, kvplan.engines
"""
