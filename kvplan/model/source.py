"""A resolved model: its raw Hub-format config, weight facts and provenance (no interpretation).

Produced by :mod:`kvplan.model.sources` (local paths, bundled specs) and :mod:`kvplan.model.hub`; only
:mod:`kvplan.model.spec` interprets the config's keys.
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import Any, Mapping

from kvplan.errors import ConfigError
from kvplan.io.files import read_json, read_json_object
from kvplan.frozen import frozen


# Bits per element of each safetensors dtype (the format's own names).
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "F64": 64, "I64": 64, "U64": 64,
    "F32": 32, "I32": 32, "U32": 32,
    "F16": 16, "BF16": 16, "I16": 16, "U16": 16,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "I8": 8, "U8": 8, "BOOL": 8,
    "F6_E2M3": 6, "F6_E3M2": 6,
    "F4": 4,
}


@frozen
class WeightFacts:
    """What is known about a checkpoint's weights, without downloading them.

    ``total_bytes``: bytes of all tensors as stored (safetensors ``total_size``).
    ``parameters``: parameter count. ``params_by_dtype``: safetensors dtype name -> parameter count.
    """

    total_bytes: int | None = None
    parameters: int | None = None
    dtype: str | None = None
    params_by_dtype: Mapping[str, int] = field(default_factory=dict)
    source: str = ""

    def loaded_bytes(self, checkpoint_dtype: str, run_dtype: str) -> int | None:
        """Bytes of these weights once an engine running in ``run_dtype`` has loaded them: tensors stored in the
        checkpoint's ``checkpoint_dtype`` are cast (a float32 checkpoint run in bfloat16 halves them), others
        (fp8, integers, scales) keep their size. None when nothing changes size or the facts cannot tell."""
        before, after = _FLOAT_BYTES.get(checkpoint_dtype), _FLOAT_BYTES.get(run_dtype)
        if before is None or after is None or before == after or not self.total_bytes:
            return None
        if self.params_by_dtype:
            cast = self.params_by_dtype.get(_SAFETENSORS_NAMES[checkpoint_dtype], 0)
        elif self.parameters and str(self.dtype or "").lower() in (checkpoint_dtype, _SAFETENSORS_NAMES[checkpoint_dtype].lower()):
            cast = self.parameters
        else:
            return None
        return self.total_bytes - cast * before + cast * after if cast else None


_FLOAT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_SAFETENSORS_NAMES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


@frozen
class ModelSource:
    """A resolved model: its raw Hub-format config and where it came from.

    ``kind`` is ``"local"``, ``"bundled"``, ``"hub"`` or ``"options"`` (described by ``--layers``,
    ``--kv-heads`` and ``--head-dim`` alone); ``location`` the file path, repo URL or those options.
    ``cached``: for a Hub model answered from the local HF cache, how (``HF cache, commit <sha>``).
    """

    model_id: str
    kind: str
    location: str
    config: Mapping[str, Any]
    weights: WeightFacts | None = None
    revision: str | None = None
    notes: str = ""
    cached: str = ""

    def describe(self) -> str:
        """One line for output: ``bundled spec model_specs/meta-llama/Llama-3.1-8B.yaml``, or for the Hub
        ``Hugging Face Hub https://huggingface.co/org/name@<commit>`` plus ``(HF cache, commit ...)`` when
        the answer came from the local cache (``cached``) without asking the Hub."""
        rev = f"@{self.revision}" if self.revision and self.kind == "hub" else ""
        label = {"local": "local config", "bundled": "bundled spec", "hub": "Hugging Face Hub",
                 "options": "no config, described by"}[self.kind]
        how = f" ({self.cached}; --refresh asks the Hub)" if self.cached else ""
        return f"{label} {self.location}{rev}{how}"


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a config.json file into a dict (ConfigError naming the file for anything else)."""
    return read_json_object(path, "config.json")


def weights_from_index(path: Path) -> WeightFacts | None:
    """Weight bytes from ``model.safetensors.index.json``'s ``metadata.total_size`` (None if absent)."""
    if not path.is_file():
        return None
    data = read_json(path, "safetensors index")
    metadata = data.get("metadata") if isinstance(data, dict) else None
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    if total is None:
        return None
    if isinstance(total, str) and total.isdigit():
        total = int(total)
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
        raise ConfigError(f"{path}: metadata.total_size = {total!r} is not a positive integer")
    return WeightFacts(total_bytes=total, source=f"{path.name} metadata.total_size")
