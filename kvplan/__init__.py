"""kvplan: plan KV-cache memory for LLM serving, and prove the plan with a real paged cache.

Python API (the CLI is a thin layer over it; the API never prints or exits)::

    import kvplan
    plan = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", context=8192)
    plan.answer.max_requests, plan.to_dict()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from kvplan.plan import Plan


def estimate(model: str, *, token: str | None = None, **options: Any) -> "Plan":
    """Plan ``model`` under ``options`` (any estimate option: ``gpu="H100"``, ``context="8k"``, ``tp=2``,
    ``kv_dtype="fp8"``, ``kv_budget="40GiB"``...) and return the frozen :class:`~kvplan.plan.Plan`.

    Raises :class:`kvplan.errors.KvplanError` for bad input.
    """
    from kvplan.plan import estimate as _estimate, options_from_values

    return _estimate(options_from_values({"model": model, **options}), token=token)


def __getattr__(name: str) -> Any:
    # sweep / check live in their own modules; import them only when asked for
    if name == "sweep":
        from kvplan.report import sweep

        return sweep
    if name == "check":
        from kvplan.check import check

        return check
    raise AttributeError(f"module 'kvplan' has no attribute {name!r}")
