"""How a what-if report writes its values and names its label columns (shared by its tables and plots)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvplan.units import GiB, fmt_bytes

if TYPE_CHECKING:
    from kvplan.checks.report import Report

LABEL_TITLES = {
    "name": "scenario", "model": "model", "gpu": "GPU", "gpus": "GPUs", "tp": "tp", "pp": "pp", "engine": "engine",
    "dtype": "dtype", "kv_dtype": "KV dtype", "weights_dtype": "weights", "block_size": "block", "gpu_util": "util",
    "context": "context", "batch": "batch", "max_model_len": "max_model_len",
}


def title(key: str) -> str:
    """A label column's title (``max_num_seqs`` -> ``max num seqs`` for those without their own)."""
    return LABEL_TITLES.get(key, key.replace("_", " "))


def cell(key: str, value: Any) -> str:
    """How a report writes ``value`` of column ``key`` (tables, plot labels): GiB, thousands, yes/no."""
    if value is None:
        return "" if key == "name" else ("custom" if key == "gpu" else "-")
    if key == "kv_bytes_per_token":
        return fmt_bytes(value)
    if key.endswith("_bytes"):
        return f"{value / GiB:,.2f} GiB" if value > 0 else ("none" if key == "kv_budget_bytes" else "0")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "decode_tokens_per_s":
        return f"{value:,.0f}"
    if key == "model" and isinstance(value, str):
        return value
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def label_shown(report: "Report", key: str) -> bool:
    """Whether tables show the label ``key``: the usual ones, and any other the file sets (every label is in
    the CSV / JSON rows)."""
    from kvplan.checks.rows import SHOWN_LABELS

    return key in SHOWN_LABELS or key in report.given or key in ("name", "context", "batch", "max_model_len")
