"""Many plans from one file: capacity checks and what-if sweeps.

- :mod:`kvplan.checks.fields`: the YAML projection of the option table (one pydantic field type per kind);
- :mod:`kvplan.checks.scenario`: the capacity and what-if file schemas and their loading;
- :mod:`kvplan.checks.capacity`: ``kvplan check`` (requirements judged on plans, suggestions to pass);
- :mod:`kvplan.checks.report`: ``kvplan report`` (a sweep expanded into rows; a row and its pool:
  :mod:`kvplan.checks.rows`).

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits, kvplan.io, kvplan.gpus, kvplan.options, kvplan.model,
kvplan.memory, kvplan.engines, kvplan.planning
"""
