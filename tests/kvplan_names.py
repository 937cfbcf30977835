"""A helper the doc tests share: the kvplan object a dotted name in the docs stands for."""

from __future__ import annotations

import importlib
from typing import Any


def resolve(dotted: str) -> Any:
    """``memory.capacity.max_requests`` -> the function (a module, class, function or constant of kvplan; a
    missing one raises ModuleNotFoundError or AttributeError)."""
    module_path, _, attr = f"kvplan.{dotted}".rpartition(".")
    while module_path:
        try:
            target = importlib.import_module(module_path)
            break
        except ModuleNotFoundError:
            module_path, _, outer = module_path.rpartition(".")
            attr = f"{outer}.{attr}"
    for part in attr.split(".") if attr else ():
        target = getattr(target, part)
    return target
