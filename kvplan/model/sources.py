"""Where a model's config comes from: a local path, a bundled spec, or the Hugging Face Hub.

Resolution order (DESIGN.md section 2), first match wins:
1. a local path: a directory holding ``config.json`` (optionally ``model.safetensors.index.json``), or a
   config.json file;
2. a bundled spec in ``model_specs/<org>/<name>.yaml``;
3. the Hub, through :mod:`kvplan.model.hub` (imported lazily; it owns huggingface_hub).

:func:`resolve_model` returns a :class:`ModelSource`: the raw config dict plus weight facts and provenance;
only :mod:`kvplan.model.spec` interprets the config's keys. :func:`load_spec` is the one cache of resolved specs:
estimate, check, report and ``models show`` resolve each (model, revision, overrides) once per process.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any


from kvplan.errors import ConfigError, HubError, KvplanError, ModelNotFoundError
from kvplan.io.files import parse_bundled_yaml, read_text
from kvplan.model.source import ModelSource, WeightFacts, read_config_file, weights_from_index
from kvplan.model.spec import ModelSpec, Overrides, build_spec


def specs_dir() -> Path:
    """The bundled ``model_specs`` folder: inside the installed package, else the repo checkout."""
    here = Path(__file__).resolve().parents[1]  # the kvplan package
    for candidate in (here / "model_specs", here.parent / "model_specs"):
        if candidate.is_dir():
            return candidate
    raise ConfigError("bundled model_specs folder not found", "reinstall kvplan")


@lru_cache(maxsize=1)
def _bundled_index() -> dict[str, Path]:
    """Lower-cased model id -> spec path, for every bundled spec (``<org>/<name>.yaml``, in sorted order).

    Listed with :func:`os.scandir`, not ``Path.glob``: the same files in the same order, for a twentieth of the
    time (pathlib's globbing was ~3% of a bundled ``estimate --json``)."""
    root = specs_dir()
    index: dict[str, Path] = {}
    with os.scandir(root) as orgs:
        folders = sorted(e.name for e in orgs if e.is_dir())
    for org in folders:
        with os.scandir(root / org) as entries:
            names = sorted(e.name for e in entries if e.name.endswith(".yaml") and len(e.name) > len(".yaml"))
        for name in names:
            index[f"{org}/{name[:-len('.yaml')]}".lower()] = root / org / name
    return index


def bundled_ids() -> list[str]:
    """Every bundled model id (``org/name``), sorted."""
    return sorted(f"{p.parent.name}/{p.stem}" for p in _bundled_index().values())


def _bundled_key(name: str) -> str | None:
    """The index key for ``name``: exact ``org/name`` or, when unambiguous, just ``name``."""
    index = _bundled_index()
    key = name.strip().lower()
    if key in index:
        return key
    short = [k for k in index if k.split("/", 1)[1] == key]
    return short[0] if len(short) == 1 else None


def _from_local(path: Path) -> ModelSource:
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise ModelNotFoundError(f"{path}: no config.json in this directory")
    config = read_config_file(config_path)
    weights = weights_from_index(config_path.parent / "model.safetensors.index.json")
    return ModelSource(
        model_id=str(config.get("_name_or_path") or config_path.parent.name),
        kind="local",
        location=str(config_path),
        config=config,
        weights=weights,
    )


def _positive_int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0 or value != int(value):
        raise ConfigError(f"{where} = {value!r} must be a positive integer")
    return int(value)


def load_bundled(model_id: str) -> ModelSource:
    """Load one bundled spec by id (case-insensitive; ``Llama-3.1-8B`` alone works when unique)."""
    key = _bundled_key(model_id)
    if key is None:
        raise ModelNotFoundError(f"no bundled spec for {model_id!r}", _closest_hint(model_id))
    path = _bundled_index()[key]
    where = f"model_specs/{path.parent.name}/{path.name}"
    data = parse_bundled_yaml(read_text(path, "model spec", display=where), where)
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise ConfigError(f"{where}: expected a mapping with a 'config' mapping")
    weights = None
    w = data.get("weights")
    if isinstance(w, dict):
        by_dtype = w.get("params_by_dtype") or {}
        weights = WeightFacts(
            total_bytes=_positive_int(w.get("total_bytes"), f"{where}: weights.total_bytes"),
            parameters=_positive_int(w.get("parameters"), f"{where}: weights.parameters"),
            dtype=w.get("dtype"),
            params_by_dtype=MappingProxyType({str(k): _positive_int(v, f"{where}: weights.params_by_dtype.{k}") or 0
                                              for k, v in by_dtype.items()}),
            source=str(w.get("source", "")),
        )
    return ModelSource(
        model_id=str(data.get("id") or f"{path.parent.name}/{path.stem}"),
        kind="bundled",
        location=where,
        config=data["config"],
        weights=weights,
        revision=data.get("revision"),
        notes=str(data.get("source", "")),
    )


def closest_bundled(name: str, n: int = 3) -> list[str]:
    """The bundled ids closest to ``name`` (for 'did you mean')."""
    ids = bundled_ids()
    lowered = {i.lower(): i for i in ids}
    lowered.update({i.split("/", 1)[1].lower(): i for i in ids})
    import difflib  # here: only a name that is not found asks (a found one never imports it)

    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n * 2, cutoff=0.4)
    out: list[str] = []
    for h in hits:
        if lowered[h] not in out:
            out.append(lowered[h])
    return out[:n]


def _closest_hint(name: str) -> str:
    near = closest_bundled(name)
    return ("closest bundled: " + ", ".join(near)) if near else "run `kvplan models` to list bundled specs"


def resolve_model(
    name: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    force_hub: bool = False,
    offline: bool = False,
    refresh: bool = False,
) -> ModelSource:
    """Resolve ``name`` to a :class:`ModelSource` (local path, then bundled spec, then the Hub).

    ``force_hub`` skips bundled specs (``--hub``); ``offline`` never touches the network (cache only).
    A ``revision`` other than the bundled one goes to the Hub. A Hub model already in the HF cache is
    answered from it without a network round trip unless ``refresh`` (``--refresh``) asks the Hub.
    """
    name = str(name).strip()
    if not name:
        raise ModelNotFoundError("empty model name", "pass a Hub id, a bundled id or a local path")
    if not force_hub and _is_local(name):
        return _from_local(Path(name).expanduser())
    if not force_hub and revision is None and _bundled_key(name) is not None:
        return load_bundled(name)
    if "/" not in name or name.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"model {name!r} is not a local path, a bundled spec or a Hub id",
                                 _closest_hint(name) + "; or describe it: --layers N --kv-heads N --head-dim N "
                                 "--weights-gib SIZE")
    from kvplan.model import hub  # lazy: huggingface_hub only when the Hub is used

    try:
        return hub.fetch_model(name, revision=revision, token=token, offline=offline, refresh=refresh)
    except (ModelNotFoundError, HubError) as exc:
        near = [] if force_hub or revision is not None else did_you_mean(name)
        if not near or "gated" in exc.message:
            raise
        raise type(exc)(exc.message, f"did you mean the bundled {near}? " + (exc.hint or "")) from None


def did_you_mean(name: str) -> str | None:
    """The bundled id a mistyped ``name`` most likely meant (``meta-llama/Lama-3.1-8B``: ``meta-llama/Llama-3.1-8B``),
    or None when none is that close."""
    ids = {i.lower(): i for i in bundled_ids()}
    import difflib

    hits = difflib.get_close_matches(name.strip().lower(), list(ids), n=1, cutoff=0.85)
    return ids[hits[0]] if hits else None


def _is_local(name: str) -> bool:
    """``name`` is a model folder or a ``.json`` config file on this machine (a name the OS cannot look
    up, e.g. longer than the file-name limit, is not)."""
    try:
        path = Path(name).expanduser()
        return path.is_dir() or (path.is_file() and path.suffix == ".json")
    except (OSError, ValueError, RuntimeError):  # ENAMETOOLONG, an embedded NUL, an unknown ~user
        return False


_SPECS: dict[tuple[Any, ...], tuple[ModelSpec, ModelSource]] = {}


def load_spec(name: str, *, overrides: Overrides | None = None, token: str | None = None,
              **where: Any) -> tuple[ModelSpec, ModelSource]:
    """The :class:`ModelSpec` of ``name`` and the source it came from, resolved once per process.

    ``where``: the keyword arguments of :func:`resolve_model` (``revision``, ``force_hub``, ``offline``,
    ``refresh``); ``overrides`` are ``--layers/--kv-heads/--head-dim``. A local config is re-read when its
    file changes (size or modification time); ``refresh`` asks the Hub once per process (a report's rows
    share that answer). Errors are not cached. The token is not part of the key: it grants access, it does
    not change content.
    """
    overrides = overrides or Overrides()
    name = str(name).strip()
    key = (name, tuple(sorted(where.items())), overrides, _local_stamp(name))
    hit = _SPECS.get(key)
    if hit is None:
        try:
            source = resolve_model(name, token=token, **where)
        except (ModelNotFoundError, HubError) as exc:
            source = described_by_options(name, overrides, exc)
        spec = build_spec(source, overrides)
        if source.kind == OPTIONS_DESCRIBED:
            from dataclasses import replace

            spec = replace(spec, notes=(source.notes,) + spec.notes)
        hit = _SPECS[key] = (spec, source)
    return hit


OPTIONS_DESCRIBED = "options"  # ModelSource.kind of a model that --layers/--kv-heads/--head-dim describe alone


def described_by_options(name: str, overrides: Overrides, exc: KvplanError) -> ModelSource:
    """A model no source knows (``exc`` says why), described by ``--layers``, ``--kv-heads`` and ``--head-dim``
    alone: a config holding only those, in bfloat16; re-raises ``exc`` unless all three are given. The rest
    of its shape follows the same rules as a config that leaves it out (attention heads = KV heads, hidden =
    heads x head_dim), and the weights need ``--weights-gib``; the source says so."""
    if not (overrides.num_layers and overrides.kv_heads and overrides.head_dim) or "gated" in exc.message:
        raise exc
    described = f"--layers {overrides.num_layers} --kv-heads {overrides.kv_heads} --head-dim {overrides.head_dim}"
    return ModelSource(
        model_id=name, kind=OPTIONS_DESCRIBED, location=described,
        config={"num_hidden_layers": overrides.num_layers, "num_key_value_heads": overrides.kv_heads,
                "num_attention_heads": overrides.kv_heads, "head_dim": overrides.head_dim, "torch_dtype": "bfloat16"},
        notes=(f"{name!r} has no config ({exc.message}): described by {described} alone, every layer full "
               "attention in bfloat16 (--dtype for another); attention heads = KV heads and hidden = heads x "
               "head_dim for the activation estimate (--activation-gib for a measured one)"))


def clear_spec_cache() -> None:
    """Forget every spec :func:`load_spec` resolved (a notebook that edited a bundled spec, tests)."""
    _SPECS.clear()


def _local_stamp(name: str) -> tuple[int, int] | None:
    """``(size, mtime_ns)`` of a local config named ``name`` (None when it is not a local path)."""
    if not _is_local(name):
        return None
    path = Path(name).expanduser()
    config = path / "config.json" if path.is_dir() else path
    try:
        stat = config.stat()
    except (OSError, ValueError):
        return None
    return stat.st_size, stat.st_mtime_ns
