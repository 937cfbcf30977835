"""Rendering: plans and results -> terminal (rich), JSON, Markdown, HTML, CSV, JUnit.

rich is imported only by the modules in this package; each command's renderer lives in its own module.

May import: anything in kvplan but kvplan.cli
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def console(stderr: bool = False):  # noqa: ANN201 - rich.console.Console
    """A rich console at least 80 columns wide (wider when the terminal is)."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False, emoji=False)


def pyplot():  # noqa: ANN201 - the matplotlib.pyplot module
    """matplotlib's pyplot on the Agg backend (files only); :class:`TorchMissingError` without the plot extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from kvplan.errors import TorchMissingError

        raise TorchMissingError("--plot needs matplotlib", "pip install 'kvplan[plot]'") from None
    return plt


def plot_path(path: str | Path) -> Path:
    """Where ``--plot PATH`` writes, checked before any work: a ``.png``, ``.svg`` or ``.pdf`` file (no
    suffix: ``.png`` is added) that can be written, with matplotlib installed."""
    import importlib.util

    from kvplan.io.atomic import check_writable
    from kvplan.errors import InputError, TorchMissingError

    path = Path(path)
    if path.is_dir():
        raise InputError(f"cannot write --plot {path}: it is a folder", "give a file name such as pool.png")
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    elif path.suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(f"cannot write --plot {path}: unknown image format {path.suffix!r}", "use .png, .svg or .pdf")
    check_writable(path, "--plot", writes=path.suffix.lower().lstrip("."))
    if importlib.util.find_spec("matplotlib") is None:
        raise TorchMissingError("--plot needs matplotlib", "pip install 'kvplan[plot]'")
    return path


def save_figure(plt: Any, fig: Any, path: Path) -> None:
    """Render ``fig`` in ``path``'s format, close it, and write the file atomically."""
    import io

    from kvplan.io.atomic import write_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lower().lstrip("."))
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def print_json(data: Any) -> None:
    """Machine-readable output on stdout: indented, sorted keys, nothing else."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
