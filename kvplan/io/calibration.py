"""Calibration files: budget terms measured from real start-up logs, used by later plans of the same deployment.

``kvplan explain LOG --calibrate FILE.yaml`` writes (or updates) one entry per deployment - model, GPU,
engine and modelled release, tp/pp, dtype and batching limits - with the per-GPU terms the log
printed (weights, activation peak, non-torch overhead, CUDA graphs). ``estimate``, ``check`` and
``report`` take ``--calibration FILE.yaml``; a plan whose deployment matches an entry uses its measured
terms in place of kvplan's estimates (a term the user gives still wins) and says so in its notes.

```yaml
calibrations:
  - model: meta-llama/Llama-3.1-8B-Instruct
    gpu: H100-SXM-80GB
    gpu_memory_bytes: 85045477376
    engine: vllm
    release: '0.18'          # kvplan's modelled release (the rules the log's version follows)
    engine_version: 0.19.0   # as logged
    tp: 1
    pp: 1
    dtype: bfloat16
    max_num_batched_tokens: 8192
    max_num_seqs: 1024
    terms: {weights_bytes: 16094076928, activation_bytes: 1975684956, overhead_bytes: 139586437}
    source: vllm-serve.log
```
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from kvplan.errors import ConfigError
from kvplan.frozen import frozen

TERM_KEYS = ("weights_bytes", "activation_bytes", "overhead_bytes", "cudagraph_bytes")
KEY_FIELDS = ("model", "gpu", "gpu_memory_bytes", "engine", "release", "tp", "pp", "dtype", "max_num_batched_tokens",
              "max_num_seqs")
HEADER = "# kvplan calibration: per-GPU budget terms measured from engine start-up logs (kvplan explain --calibrate)\n"


@frozen
class Entry:
    """One measured deployment: the key it matches on, the measured per-GPU terms (bytes), where from."""

    model: str
    gpu: str
    gpu_memory_bytes: int
    engine: str
    release: str
    tp: int
    pp: int
    dtype: str
    max_num_batched_tokens: int
    max_num_seqs: int
    terms: tuple[tuple[str, int], ...]
    engine_version: str = ""
    source: str = ""
    note: str = ""  # how the printed terms were fitted to the log's block count, if they were

    @property
    def key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in KEY_FIELDS)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "terms"}
        out["terms"] = dict(self.terms)
        return out


@frozen
class Calibration:
    """A loaded calibration file (``path`` for the notes)."""

    path: str
    entries: tuple[Entry, ...]

    def match(self, **key: Any) -> Entry | None:
        """The entry measured for this deployment (every :data:`KEY_FIELDS` value equal), or ``None``."""
        wanted = tuple(key[f] for f in KEY_FIELDS)
        return next((e for e in self.entries if e.key == wanted), None)

    def mismatch(self, **key: Any) -> str:
        """Why no entry matches this deployment: the fields in which the nearest entry (fewest differing key
        fields, the same model first) differs, each as ``field entry-value (plan: plan-value)``."""
        if not self.entries:
            return "the file has no entries"

        def differing(e: Entry) -> list[str]:
            return [f for f in KEY_FIELDS if getattr(e, f) != key[f]]

        nearest = min(self.entries, key=lambda e: (e.model != key["model"], len(differing(e))))
        def show(v: Any) -> str:
            return f"{v:,}" if isinstance(v, int) else str(v)
        what = ", ".join(f"{f} {show(getattr(nearest, f))} (plan: {show(key[f])})" for f in differing(nearest))
        hint = (f"; --gpu-memory {nearest.gpu_memory_bytes / 2**30:g}GiB plans the logged total"
                if "gpu_memory_bytes" in differing(nearest) else "")
        return f"the nearest entry ({nearest.model}, {nearest.source or 'no source'}) differs in {what}{hint}"


def _entry(raw: Any, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    missing = [f for f in KEY_FIELDS + ("terms",) if f not in raw]
    if missing:
        raise ConfigError(f"{where}: field '{missing[0]}' is missing", "write the file with kvplan explain --calibrate")
    terms = raw["terms"]
    if not isinstance(terms, dict) or not terms or any(k not in TERM_KEYS for k in terms):
        raise ConfigError(f"{where}: field 'terms' must map some of {', '.join(TERM_KEYS)} to bytes")
    for name, value in terms.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{where}: terms.{name} must be a whole number of bytes >= 0, got {value!r}")
    ints = ("gpu_memory_bytes", "tp", "pp", "max_num_batched_tokens", "max_num_seqs")
    for name in ints:
        if isinstance(raw[name], bool) or not isinstance(raw[name], int) or raw[name] < 1:
            raise ConfigError(f"{where}: field '{name}' must be a positive integer, got {raw[name]!r}")
    return Entry(**{f: (raw[f] if f in ints else str(raw[f])) for f in KEY_FIELDS},
                 terms=tuple(sorted(terms.items())), engine_version=str(raw.get("engine_version", "")),
                 source=str(raw.get("source", "")), note=str(raw.get("note", "")))


def parse_calibration(text: str, path: str) -> Calibration:
    """A calibration file's text -> :class:`Calibration` (ConfigError naming the entry and field)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}{at}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    data = {} if data is None else data  # an empty file: no entries yet
    _refuse_other(data, path)
    if not isinstance(data.get("calibrations", []), list):
        raise ConfigError(f"{path}: expected a top-level 'calibrations' list", "write it with kvplan explain --calibrate")
    return Calibration(path, tuple(_entry(raw, f"{path}: calibrations[{i}]")
                                   for i, raw in enumerate(data.get("calibrations") or [])))


def _refuse_other(data: Any, path: str) -> None:
    """A calibration file is a mapping whose one key is ``calibrations`` (or an empty file): anything else
    (a capacity file, ``hello: world``, a list) is another file, named as such, never read or replaced as one."""
    from kvplan.io.kinds import yaml_kind

    hint = "give a calibration file (one key, calibrations), or a new path for kvplan explain --calibrate"
    if not isinstance(data, dict):
        got = "a list" if isinstance(data, list) else f"the value {str(data)[:40]!r}"
        raise ConfigError(f"{path} is not a calibration file: it holds {got}, not a mapping", hint)
    other = [str(k) for k in data if k != "calibrations"]
    if other:
        kind = yaml_kind(data)
        what = f"; it is a {kind.name}, which {kind.reader} reads" if kind and kind.name != "calibration file" else ""
        raise ConfigError(f"{path} is not a calibration file: it has {', '.join(other)}{what}", hint)


def load_calibration(path: str) -> Calibration:
    """Read and validate ``path`` (``--calibration``)."""
    from kvplan.io.files import read_text

    return parse_calibration(read_text(path, "calibration file"), str(path))


def check_calibration_target(path: str) -> None:
    """Before any work (``explain --calibrate``): ``path`` can be written, and is a calibration file when it
    exists (anything else is refused and left untouched)."""
    import os

    from kvplan.io.atomic import check_writable

    if os.path.lexists(path):
        load_calibration(path)
    check_writable(path, "--calibrate")  # load_calibration above refused any other kind of file


def write_calibration(path: str, entry: Entry) -> tuple[Calibration, bool]:
    """Add ``entry`` to the file at ``path`` (created if absent), replacing one with the same key; atomic.

    Returns the new calibration and whether an entry was replaced.
    """
    import os

    import yaml

    from kvplan.io.atomic import write_atomic

    old = load_calibration(path) if os.path.lexists(path) else Calibration(str(path), ())  # refuses other files
    kept = tuple(e for e in old.entries if e.key != entry.key)
    new = Calibration(str(path), kept + (entry,))
    body = yaml.safe_dump({"calibrations": [e.to_dict() for e in new.entries]}, sort_keys=False)
    write_atomic(path, HEADER + body)
    return new, len(kept) != len(old.entries)


__all__ = ["Calibration", "Entry", "check_calibration_target", "load_calibration", "parse_calibration", "write_calibration", "TERM_KEYS"]
