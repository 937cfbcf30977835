"""kvplan: plan KV-cache memory for LLM serving, and prove the plan with a real paged cache.

Python API (the CLI is a thin layer over it; the API never prints or exits)::

    import kvplan
    plan = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192)
    plan.answer.max_requests, plan.to_dict()

May import: kvplan.api, kvplan.io, kvplan.planning, kvplan.checks (each inside the function that needs it)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "check", "estimate", "size", "sweep"]


def __dir__() -> list[str]:
    """The public API only (not ``Any``, ``annotations`` or the submodules imported so far)."""
    return list(__all__)

if TYPE_CHECKING:
    from kvplan.planning.plan import Plan


def estimate(model: str, *, token: str | None = None, **options: Any) -> "Plan":
    """Plan ``model`` (a Hub id, a bundled id or a local path) under ``options`` (any estimate option:
    ``gpu="H100"``, ``context="8k"``, ``tp=2``, ``kv_dtype="fp8"``, ``kv_budget="40GiB"``...) and return the
    frozen :class:`~kvplan.planning.plan.Plan`.

    Raises :class:`kvplan.errors.KvplanError` for bad input, a wrong-typed argument included.
    """
    from os import fspath

    from kvplan.api import check_estimate
    from kvplan.planning.plan import estimate as _estimate, options_from_values

    check_estimate(model, token, options)
    return _estimate(options_from_values({"model": fspath(model), **options}), token=token)


def size(model: str, *, concurrency: int | str, context: int | str | None = None, gpus: Any = None, tp: Any = None,
         at: str = "low", prices: Any = None, token: str | None = None, **options: Any) -> Any:
    """The smallest deployments (GPU x tp x pp x replicas) that hold ``concurrency`` requests of ``context``
    tokens, judged at the low end of kvplan's range (``at="estimate"``: at the estimate): ``gpus`` a list of
    GPU names (default: the catalogue's datacenter GPUs), ``tp`` the tp sizes to try, ``prices`` a price
    file's path (ranks by cost); ``options``: ``prefix_tokens``, ``kv_dtype``, ``engine``, ``engine_version``,
    ``revision``, ``offline``, ...

    Returns the frozen :class:`kvplan.planning.size.Sizing` (``.best``, ``.rows``, ``.to_dict()``).
    Raises :class:`kvplan.errors.KvplanError` for bad input (no GPU holds one request; a tp the model cannot
    split; a wrong-typed argument).
    """
    from os import fspath

    from kvplan.api import check_size
    from kvplan.planning.size import size_model

    check_size(model, concurrency, context, gpus, tp, at, prices, token, options)
    return size_model(fspath(model), concurrency, context, gpus=gpus, tps=tp, at=at,
                      prices=fspath(prices) if prices is not None else None, token=token, **options)


def _doc(function: str, name: str, source: Any, kind: str) -> Any:
    """A what-if / capacity document from a path or from a mapping (validated the same way; a mapping's
    errors name the file ``<kind>``)."""
    from pathlib import Path

    from kvplan.api import document

    data = document(function, name, source)
    if not isinstance(data, dict):
        return data
    import yaml

    from kvplan.io.yamldoc import parse_yaml

    return parse_yaml(yaml.safe_dump(data, sort_keys=False), Path.cwd() / f"<{kind}>.yaml", f"<{kind}>")


def sweep(whatif: Any, *, offline: bool = False, token: str | None = None, **unknown: Any) -> Any:
    """Expand a what-if sweep into rows: ``whatif`` is a YAML path or the same structure as a mapping,
    e.g. ``{"defaults": {"context": "8k"}, "sweep": {"model": [...], "gpu": ["H100", "A100-40GB"]}}``.

    Returns the frozen :class:`kvplan.checks.report.Report` (``.rows``, ``.to_dict()``); writes nothing.
    Raises :class:`kvplan.errors.KvplanError` for bad input, a wrong-typed argument included.
    """
    from kvplan.api import check_run
    from kvplan.checks.report import build_report
    from kvplan.checks.scenario import load_whatif

    check_run("sweep", offline, token, unknown)
    return build_report(load_whatif(_doc("sweep", "whatif", whatif, "sweep")), offline=offline, token=token)


def check(capacity: Any, *, offline: bool = False, token: str | None = None, **unknown: Any) -> Any:
    """Run capacity checks: ``capacity`` is a YAML path or a mapping with ``defaults`` and ``checks``.

    Returns the frozen :class:`kvplan.checks.capacity.CheckReport` (each result's verdict, margin, suggestions).
    Raises :class:`kvplan.errors.KvplanError` for bad input, a wrong-typed argument included.
    """
    from kvplan.api import check_run
    from kvplan.checks.capacity import run_checks
    from kvplan.checks.scenario import load_capacity

    check_run("check", offline, token, unknown)
    return run_checks(load_capacity(_doc("check", "capacity", capacity, "capacity"), keep_going=True),
                      offline=offline, token=token)
