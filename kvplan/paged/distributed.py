"""Several GPUs: ``torchrun --nproc-per-node N -m kvplan validate MODEL --tp N`` validates one rank per device.

Each rank allocates its own slice (tp: its share of the KV heads, the plan's ``rank_layers``; pp: its own
stage's layers via ``memory.stage_rank_layers``) with the plan's block count (vLLM gives every worker the
smallest count over the stages, which the plan computes stage by stage), runs :func:`~kvplan.paged.validate.validate_plan`, and
every rank receives every result with ``all_gather_object``; rank 0 renders them. NCCL on CUDA, gloo on CPU.
A user error on one rank travels as data, so no rank waits forever for a peer that gave up.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from kvplan.errors import InputError, KvplanError
from kvplan.frozen import frozen

if TYPE_CHECKING:  # pragma: no cover
    from kvplan.paged.validate import Progress, ValidationResult
    from kvplan.planning.plan import Plan

INIT_TIMEOUT = timedelta(seconds=120)


@frozen
class World:
    """This process's place under torchrun: global ``rank`` of ``size``, ``local_rank`` on its node."""

    rank: int
    size: int
    local_rank: int


def world_from_env(environ: dict[str, str] | None = None) -> World | None:
    """The torchrun world from ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``, or None outside torchrun."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
    except ValueError:
        raise InputError(f"invalid torchrun environment RANK={env['RANK']!r} WORLD_SIZE={env['WORLD_SIZE']!r}") from None
    return World(rank, size, local)


@frozen
class RankError:
    """A user-facing error raised on one rank, carried to the others."""

    rank: int
    message: str
    hint: str | None
    exit_code: int


def validate_distributed(plan: "Plan", world: World, device: str | None = None, *, probe: bool = False,
                         progress: "Progress | None" = None) -> list["ValidationResult"]:
    """Validate this rank's slice and gather every rank's result (ordered by rank) on every rank.

    Raises the first rank's :class:`KvplanError` on every rank if any rank failed with one.
    """
    from kvplan.paged.validate import require_torch, resolve_device, validate_plan

    torch = require_torch()
    import torch.distributed as dist

    expected = plan.options.tp * plan.options.pp
    if world.size != expected:
        raise InputError(f"torchrun started {world.size} processes but --tp {plan.options.tp} x --pp {plan.options.pp} "
                         f"= {expected}", f"run torchrun --nproc-per-node {expected}")
    device = resolve_device(device, world.local_rank)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    backend = "nccl" if device.startswith("cuda") else "gloo"
    owner = not dist.is_initialized()
    if owner:
        dist.init_process_group(backend, rank=world.rank, world_size=world.size, timeout=INIT_TIMEOUT)
    try:
        payload: Any
        try:
            payload = validate_plan(plan, device, probe=probe, rank=world.rank, world_size=world.size,
                                    progress=progress if world.rank == 0 else None)
        except KvplanError as exc:
            payload = RankError(world.rank, exc.message, exc.hint, exc.exit_code)
        gathered: list[Any] = [None] * world.size
        dist.all_gather_object(gathered, payload)
    finally:
        if owner:
            dist.destroy_process_group()
    for item in gathered:
        if isinstance(item, RankError):
            error = KvplanError(f"rank {item.rank}: {item.message}", item.hint)
            error.exit_code = item.exit_code
            raise error
    return gathered


@frozen
class Totals:
    """All ranks together: estimated and measured pool bytes (device accounting), requests checked."""

    estimate_bytes: int
    device_bytes: int
    storage_bytes: int
    ok: bool

    @property
    def difference_bytes(self) -> int:
        return self.device_bytes - self.estimate_bytes


def totals(results: list["ValidationResult"]) -> Totals:
    """Sum the per-rank pools (ranks without a measurement count 0 measured bytes)."""
    est = sum(r.measure.estimate_bytes for r in results if r.measure)
    dev = sum(r.measure.device_bytes for r in results if r.measure)
    sto = sum(r.measure.storage_bytes for r in results if r.measure)
    return Totals(est, dev, sto, all(r.ok for r in results))
