"""Rendering: plans and results -> terminal (rich), JSON, Markdown, HTML, CSV, JUnit.

rich is imported only by the modules in this package; each command's renderer lives in its own module.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def console(stderr: bool = False):  # noqa: ANN201 - rich.console.Console
    """A rich console at least 80 columns wide (wider when the terminal is)."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout: indented, sorted keys, nothing else."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
