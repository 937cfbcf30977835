"""The modelled engines by name. Each is a module that satisfies :class:`kvplan.engines.Engine`.

Imported lazily, so ``kvplan estimate`` loads only the engine it plans for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.errors import InputError
from kvplan.options import ENGINE_NAMES as NAMES

if TYPE_CHECKING:  # pragma: no cover
    from kvplan.engines import Engine


def engine(name: str) -> "Engine":
    """The engine module called ``name`` (one of :data:`NAMES`)."""
    if name == "vllm":
        from kvplan.engines import vllm

        return vllm  # type: ignore[return-value]
    if name == "sglang":
        from kvplan.engines import sglang

        return sglang  # type: ignore[return-value]
    raise InputError(f"unknown engine {name!r}", "use one of: " + ", ".join(NAMES))

