"""The real paged KV cache: the plain-Python block allocator (``allocator``; shared with the workload
simulator), the torch block pool (``pool``), attention over scattered blocks (``attention``), the
validator (``validate``) and its torch.distributed runner (``distributed``). Imported only by the
``validate`` and ``simulate`` commands; this file imports nothing so that ``import
kvplan.paged.allocator`` stays torch-free.

May import: kvplan.errors, kvplan.frozen, kvplan.units, kvplan.limits, kvplan.io, kvplan.gpus, kvplan.options, kvplan.model, kvplan.memory,
kvplan.engines, kvplan.planning
"""
