"""Files: the one reader of user and bundled files, YAML with positions, atomic writes, calibration files.

- :mod:`kvplan.io.files`: reading a file or bundled data once, with size bounds and one-line errors;
- :mod:`kvplan.io.yamldoc`: YAML documents with line and column for every key, validated by pydantic models;
- :mod:`kvplan.io.atomic`: writes that leave the old file or the whole new one, never half of it;
- :mod:`kvplan.io.calibration`: the calibration file format (terms measured from start-up logs) that the
  option table reads and ``kvplan explain --calibrate`` writes;
- :mod:`kvplan.io.prices`: the price file ``kvplan size --prices`` reads (GPU -> price per GPU-hour).

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits
"""
