"""The Hugging Face Hub as a model source: config.json plus weight facts, never the weights.

The only kvplan module that imports ``huggingface_hub`` (always inside functions, and only the submodules a
call needs, so a cached model never pays for the HTTP client). It honours what huggingface_hub honours: the
HF cache and ``HF_HOME``, ``HF_ENDPOINT``, ``HF_HUB_OFFLINE``, and a token from the argument, ``HF_TOKEN``
or the token file.

Flow of :func:`fetch_model`:

1. cached (the default when the HF cache already holds config.json for the revision): answer from the
   cache with no network round trip; the revision's commit is stated in the source. ``refresh=True``
   (``--refresh``) skips this step and asks the Hub.
2. offline (``offline=True``, or ``HF_HUB_OFFLINE``): the cache only; an error when it has nothing.
3. online, three requests: ``hf_hub_download`` of config.json (its HEAD, with a short timeout and no
   retries: fail fast, and the GET); on a network error, a 5xx or an access error the cached copy is used
   when there is one, else the error is raised. Then one ``model_info(expand=["safetensors"])`` for the
   parameter counts per dtype the Hub read from the safetensors headers (where it has none,
   ``get_safetensors_metadata`` reads the headers with HTTP range requests); kvplan keeps that summary in
   huggingface_hub's assets folder (``HF_HOME/assets/kvplan/<org>--<name>/weights/<commit>.json``), so
   cached and offline answers equal the online one and cost no request.

A config.json that cannot be parsed (not UTF-8, binary, too deep...) is removed from the cache before the
error is raised, so the next run asks the Hub again instead of failing the same way. Every Hub failure
becomes a :class:`~kvplan.errors.HubError` (or :class:`~kvplan.errors.ModelNotFoundError` for a repo that
does not exist) with one line and a hint, through the table :data:`kvplan.model.hub.errors.HUB_ERRORS`; tokens
never appear in messages. Modules: :mod:`kvplan.model.hub.request` (the request, the cache layout),
:mod:`kvplan.model.hub.errors`, :mod:`kvplan.model.hub.weights` (weight facts).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvplan.errors import ConfigError, HubError, ModelNotFoundError
from kvplan.io.files import read_json_object
from kvplan.model.hub.errors import Unavailable, translate
from kvplan.model.hub.request import CONFIG_FILE, HubRequest, cached_file, commit_of, metadata_timeout_s
from kvplan.model.hub.weights import cached_weights, online_weights
from kvplan.model.source import ModelSource, WeightFacts

__all__ = ["HubRequest", "cached_file", "fetch_model"]

_TRUE = {"1", "ON", "YES", "TRUE"}


def fetch_model(
    repo_id: str, *, revision: str | None = None, token: str | None = None, offline: bool = False,
    refresh: bool = False,
) -> ModelSource:
    """Resolve ``repo_id`` on the Hugging Face Hub: config.json (cached) and weight facts.

    ``revision``: branch, tag or commit sha (default ``main``). ``token``: Hub token (default: ``HF_TOKEN``
    or the saved token). ``offline``: use the HF cache only, like ``HF_HUB_OFFLINE=1``. ``refresh``: ask
    the Hub even when the cache holds the revision (a branch may have moved since it was cached).
    The returned ``revision`` is the commit sha the config came from. Never downloads weights and never
    runs code from the repo.
    """
    from huggingface_hub import constants  # the settings only: no HTTP client

    req = HubRequest(
        repo_id=repo_id.strip(),
        revision=revision or None,
        token=token or None,
        endpoint=str(constants.ENDPOINT).rstrip("/"),
        cache_dir=str(constants.HF_HUB_CACHE),
        assets_dir=str(constants.HF_ASSETS_CACHE),
    )
    offline_by = "--offline" if offline else ("HF_HUB_OFFLINE" if _offline_env(constants) else None)
    cached = None if refresh and offline_by is None else cached_file(req, CONFIG_FILE)
    if cached is not None:
        how = f"{offline_by}: no network" if offline_by else "no network; --refresh asks the Hub for a newer revision"
        return _from_cache(req, cached, f"config.json from the HF cache ({how})")
    _check_repo_id(req)
    if offline_by is not None:
        raise HubError(
            f"{offline_by} is set and {req.label} is not in the Hugging Face cache at {req.cache_dir}",
            f"{'drop --offline' if offline else 'unset HF_HUB_OFFLINE'} once to cache it: "
            "kvplan fetches only config.json and safetensors headers",
        )
    with _quiet_progress_bars():
        config_path, fallback = _download_config(req)
        commit = commit_of(config_path)
        if fallback:  # the Hub failed and the cache answered: stay off the network
            return _from_cache(req, config_path, fallback)
        config = _parse_cached_config(req, config_path, commit)
        weights, notes = online_weights(req, commit)
    return _source(req, config, commit, weights, notes, cached="")


def _from_cache(req: HubRequest, config_path: Path, how: str) -> ModelSource:
    """A source answered from the HF cache alone (weights from cached headers or kvplan's summary)."""
    commit = commit_of(config_path)
    config = _parse_cached_config(req, config_path, commit)
    weights = cached_weights(req, commit)
    notes = how + ("" if weights else "; weight size unknown (no safetensors header or index cached)")
    return _source(req, config, commit, weights, notes, cached=f"HF cache, commit {commit}" if commit else "HF cache")


def _source(req: HubRequest, config: dict[str, Any], commit: str | None, weights: WeightFacts | None, notes: str,
            cached: str) -> ModelSource:
    return ModelSource(
        model_id=req.repo_id,
        kind="hub",
        location=f"{req.endpoint}/{req.repo_id}",
        config=config,
        weights=weights,
        revision=commit or req.revision or "main",
        notes=notes,
        cached=cached,
    )


# ---------------------------------------------------------------------------------------------------
# config.json


def _check_repo_id(req: HubRequest) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(req.repo_id)
    except HFValidationError:
        raise ModelNotFoundError(
            f"{req.repo_id!r} is not a valid Hugging Face repo id", "expected org/name, e.g. Qwen/Qwen3-8B"
        ) from None


def _offline_env(constants: Any) -> bool:
    """HF_HUB_OFFLINE as huggingface_hub read it at import, or as the environment says now."""
    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return bool(getattr(constants, "HF_HUB_OFFLINE", False)) or env.upper() in _TRUE


def _parse_cached_config(req: HubRequest, path: Path, commit: str | None) -> dict[str, Any]:
    """The parsed config.json; one that does not parse is removed from the cache, then the error raised."""
    where = f"{req.endpoint}/{req.repo_id}/{CONFIG_FILE}" + (f"@{commit}" if commit else "")
    try:
        return read_json_object(path, CONFIG_FILE, display=where)
    except ConfigError as exc:
        removed = _evict(path)
        note = "removed it from the HF cache" if removed else f"remove {path} from the HF cache"
        raise ConfigError(f"{exc.message}; kvplan {note}" if removed else exc.message,
                          exc.hint if removed else note) from None


def _evict(path: Path) -> bool:
    """Remove a cached file: the snapshot entry and the blob it points to. True when it is gone."""
    try:
        target = path.resolve()
        path.unlink()
        if target != path and target.parent.name == "blobs":
            target.unlink(missing_ok=True)
    except OSError:
        return False
    return True


def _download_config(req: HubRequest) -> tuple[Path, str]:
    """config.json into the cache; returns its path and a note ('' when the Hub answered)."""
    from huggingface_hub import hf_hub_download

    try:
        # Two requests: hf_hub_download's HEAD (short timeout) and the GET. force_download: config.json is not
        # cached for this revision (or --refresh asks again), and it makes a failed HEAD final: without it
        # huggingface_hub retries for up to a minute before giving up on an unreachable Hub.
        path = hf_hub_download(
            req.repo_id,
            CONFIG_FILE,
            revision=req.revision,
            token=req.token,
            cache_dir=req.cache_dir,
            endpoint=req.endpoint,
            etag_timeout=metadata_timeout_s(),
            force_download=True,
        )
        return Path(path), ""
    except Exception as exc:  # noqa: BLE001 - classified below; unknown errors re-raised as they are
        error, cache_may_answer = translate(exc, req)
        if error is None and isinstance(exc, ValueError) and exc.__cause__ is not None:
            error, cache_may_answer = translate(exc.__cause__, req)  # force_download's wrapper of the HEAD's error
        if error is None:
            raise
        cached = cached_file(req, CONFIG_FILE) if cache_may_answer else None
        if cached is None:
            if isinstance(error, Unavailable):  # the Hub could not answer: say the cache could not either
                error = HubError(f"{error.message} and {req.label} is not in the cache at {req.cache_dir}", error.hint)
            raise error from exc
        return cached, f"used the cached config.json: {error.message}"


@contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """Silence huggingface_hub's progress bars while we fetch (library code never prints)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if getattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", None) is not None or are_progress_bars_disabled():
        yield  # the user's environment decides
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()
