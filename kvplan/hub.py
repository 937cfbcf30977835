"""The Hugging Face Hub as a model source: config.json plus weight facts, never the weights.

The only kvplan module that imports ``huggingface_hub`` (always inside functions, so ``import kvplan.hub``
stays cheap). It honours what huggingface_hub honours: the HF cache and ``HF_HOME``, ``HF_ENDPOINT``,
``HF_HUB_OFFLINE``, and a token from the argument, ``HF_TOKEN`` or the token file.

Flow of :func:`fetch_model`:

1. offline (``offline=True``, or ``HF_HUB_OFFLINE``): config.json from the cache only
   (``hf_hub_download(local_files_only=True)``); weight facts from cached safetensors headers or the cached
   index, when present.
2. online: one HEAD of config.json with a short timeout and no retries (fail fast); on a network error,
   a 5xx or an access error the cached copy is used when there is one, else the error is raised. Then
   ``hf_hub_download`` fetches config.json into the cache and ``get_safetensors_metadata`` reads the
   safetensors headers (HTTP range requests) for parameter counts per dtype.

Every failure becomes a :class:`~kvplan.errors.HubError` (or :class:`~kvplan.errors.ModelNotFoundError`
for a repo that does not exist) with one line and a hint; tokens never appear in messages.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvplan.errors import HubError, KvplanError, ModelNotFoundError
from kvplan.model_source import ModelSource, WeightFacts, read_config_file, weights_from_index
from kvplan.units import cdiv

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"

# Seconds to wait for the config.json HEAD (HF_HUB_ETAG_TIMEOUT overrides): short, so that an unreachable
# Hub fails in seconds, not after huggingface_hub's default 10 s plus a 60 s retry.
DEFAULT_METADATA_TIMEOUT_S = 5.0
# Seconds to wait for each safetensors header range request (HF_HUB_DOWNLOAD_TIMEOUT overrides).
DEFAULT_HEADER_TIMEOUT_S = 10.0
# A safetensors header longer than this is not a header (huggingface_hub uses 25 MB too).
MAX_SAFETENSORS_HEADER_BYTES = 25_000_000

# Bits per element of each safetensors dtype (the format's own names).
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "F64": 64, "I64": 64, "U64": 64,
    "F32": 32, "I32": 32, "U32": 32,
    "F16": 16, "BF16": 16, "I16": 16, "U16": 16,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "I8": 8, "U8": 8, "BOOL": 8,
    "F6_E2M3": 6, "F6_E3M2": 6,
    "F4": 4,
}

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class _Request:
    """One fetch: what was asked and the settings in force (for messages)."""

    repo_id: str
    revision: str | None
    token: str | None
    endpoint: str
    cache_dir: str

    @property
    def label(self) -> str:
        return f"{self.repo_id}@{self.revision}" if self.revision else self.repo_id

    def scrub(self, text: str) -> str:
        """``text`` with any token we know of blanked out."""
        for secret in (self.token, os.environ.get("HF_TOKEN"), os.environ.get("HUGGING_FACE_HUB_TOKEN")):
            if secret:
                text = text.replace(secret, "***")
        return text


def fetch_model(
    repo_id: str, *, revision: str | None = None, token: str | None = None, offline: bool = False
) -> ModelSource:
    """Resolve ``repo_id`` on the Hugging Face Hub: config.json (cached) and weight facts.

    ``revision``: branch, tag or commit sha (default ``main``). ``token``: Hub token (default: ``HF_TOKEN``
    or the saved token). ``offline``: use the HF cache only, like ``HF_HUB_OFFLINE=1``.
    The returned ``revision`` is the commit sha the config came from. Never downloads weights and never
    runs code from the repo.
    """
    from huggingface_hub import constants

    req = _Request(
        repo_id=repo_id.strip(),
        revision=revision or None,
        token=token or None,
        endpoint=str(constants.ENDPOINT).rstrip("/"),
        cache_dir=str(constants.HF_HUB_CACHE),
    )
    _check_repo_id(req)
    offline_by = "--offline" if offline else ("HF_HUB_OFFLINE" if _offline_env(constants) else None)
    with _quiet_progress_bars():
        if offline_by is not None:
            config_path = _cached_config(req)
            if config_path is None:
                raise HubError(
                    f"{offline_by} is set and {req.label} is not in the Hugging Face cache at {req.cache_dir}",
                    f"{'drop --offline' if offline else 'unset HF_HUB_OFFLINE'} once to cache it: "
                    "kvplan fetches only config.json and safetensors headers",
                )
            commit = _commit_of(config_path)
            weights = _cached_weights(req, commit)
            notes = f"offline ({offline_by}): config.json from the cache" + (
                "" if weights else "; weight size unknown (no safetensors header or index cached)")
        else:
            config_path, notes = _download_config(req)
            commit = _commit_of(config_path)
            if notes:  # the Hub failed and the cache answered: stay off the network
                weights = _cached_weights(req, commit)
            else:
                weights, notes = _online_weights(req, commit)
    config = read_config_file(config_path)
    return ModelSource(
        model_id=req.repo_id,
        kind="hub",
        location=f"{req.endpoint}/{req.repo_id}",
        config=config,
        weights=weights,
        revision=commit or req.revision or "main",
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------------
# config.json


def _check_repo_id(req: _Request) -> None:
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


def _metadata_timeout_s() -> float:
    value = os.environ.get("HF_HUB_ETAG_TIMEOUT")
    return float(value) if value else DEFAULT_METADATA_TIMEOUT_S


def _header_timeout_s() -> float:
    value = os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT")
    return float(value) if value else DEFAULT_HEADER_TIMEOUT_S


def _cached_config(req: _Request) -> Path | None:
    """config.json for ``req`` from the HF cache, without touching the network (None if absent)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = hf_hub_download(
            req.repo_id, CONFIG_FILE, revision=req.revision, cache_dir=req.cache_dir, local_files_only=True
        )
    except (LocalEntryNotFoundError, FileNotFoundError):
        return None
    return Path(path)


def _download_config(req: _Request) -> tuple[Path, str]:
    """config.json into the cache; returns its path and a note ('' when the Hub answered)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    url = hf_hub_url(req.repo_id, CONFIG_FILE, revision=req.revision, endpoint=req.endpoint)
    try:
        # One HEAD, short timeout, no retries: huggingface_hub alone would retry for up to a minute
        # before giving up on an unreachable Hub with nothing cached.
        get_hf_file_metadata(url, token=req.token, **_supported(get_hf_file_metadata, timeout=_metadata_timeout_s(),
                                                                retry_on_errors=False, endpoint=req.endpoint))
        path = hf_hub_download(
            req.repo_id,
            CONFIG_FILE,
            revision=req.revision,
            token=req.token,
            cache_dir=req.cache_dir,
            endpoint=req.endpoint,
            etag_timeout=_metadata_timeout_s(),
        )
        return Path(path), ""
    except Exception as exc:  # noqa: BLE001 - classified below; unknown errors re-raised as they are
        error, cache_may_answer = _translate(exc, req)
        if error is None:
            raise
        cached = _cached_config(req) if cache_may_answer else None
        if cached is None:
            if isinstance(error, _Unavailable):  # the Hub could not answer: say the cache could not either
                error = HubError(f"{error.message} and {req.label} is not in the cache at {req.cache_dir}", error.hint)
            raise error from exc
        return cached, f"used the cached config.json: {error.message}"


def _commit_of(config_path: Path) -> str | None:
    """The commit sha of a cached file (its ``snapshots/<sha>/`` folder)."""
    name = config_path.parent.name
    return name if _COMMIT_RE.match(name) else None


# ---------------------------------------------------------------------------------------------------
# errors


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection/timeout/protocol errors of whichever HTTP client huggingface_hub uses (already imported)."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, names in (("httpx2", ("TransportError",)), ("httpx", ("TransportError",)),
                          ("requests", ("ConnectionError", "Timeout"))):
        mod = sys.modules.get(module)
        for name in names:
            cls = getattr(mod, name, None) if mod is not None else None
            if isinstance(cls, type) and issubclass(cls, BaseException):
                found.append(cls)
    return tuple(found)


class _Unavailable(HubError):
    """The Hub could not answer (network, 5xx): the message gains 'and not in the cache' when raised."""


def _translate(exc: BaseException, req: _Request) -> tuple[KvplanError | None, bool]:
    """A kvplan error for a huggingface_hub/HTTP failure, and whether a cached copy may stand in.

    Returns ``(None, False)`` for an exception that is not a Hub failure (a bug: let it propagate).
    """
    from huggingface_hub import errors as hf_errors

    def cls(name: str) -> type[BaseException]:
        found = getattr(hf_errors, name, None)
        return found if isinstance(found, type) else type(f"_Missing{name}", (Exception,), {})

    where = f"{req.endpoint}/{req.repo_id}"
    status = _status_of(exc)
    if isinstance(exc, cls("OfflineModeIsEnabled")):
        return HubError(
            f"HF_HUB_OFFLINE is set and {req.label} is not in the Hugging Face cache at {req.cache_dir}",
            "run once online to cache it, or unset HF_HUB_OFFLINE",
        ), True
    if isinstance(exc, cls("GatedRepoError")):
        why = "the token sent has not been granted access" if status == 403 else "no token was sent"
        return HubError(
            f"{req.repo_id} is a gated repository on {req.endpoint} and {why}",
            "accept its licence on the model page, then pass --token hf_..., set HF_TOKEN, or run `hf auth login`",
        ), True
    if isinstance(exc, cls("RepositoryNotFoundError")):
        return ModelNotFoundError(
            f"no model repository {req.repo_id!r} on {req.endpoint}",
            "check the id, or it is private/gated: pass --token or set HF_TOKEN",
        ), True
    if isinstance(exc, cls("RevisionNotFoundError")):
        return HubError(
            f"{req.repo_id} has no revision {req.revision!r} on {req.endpoint}",
            "pass an existing branch, tag or commit sha to --revision, or omit it for 'main'",
        ), False
    if isinstance(exc, cls("EntryNotFoundError")) and not isinstance(exc, cls("LocalEntryNotFoundError")):
        return HubError(
            f"{req.label} has no {CONFIG_FILE} at {where}",
            "kvplan reads a transformers-style config.json; pass a local directory holding one instead",
        ), False
    if isinstance(exc, cls("HfHubHTTPError")) and status is not None:
        if status >= 500:
            return _Unavailable(
                f"the Hub at {req.endpoint} answered HTTP {status} (server error) for {req.label}",
                "the Hub may be down: retry later, or use --offline with a cached model",
            ), True
        if status == 401:
            return HubError(
                f"the Hub at {req.endpoint} rejected the token (HTTP 401) for {req.repo_id}",
                "check --token / HF_TOKEN, or run `hf auth login`",
            ), True
        server = str(getattr(exc, "server_message", None) or "").strip()
        server = req.scrub(server.splitlines()[0]) if server else ""
        return HubError(
            f"the Hub at {req.endpoint} answered HTTP {status} for {req.label}" + (f": {server}" if server else ""),
            "pass --token or set HF_TOKEN if the repo needs access; retry later if rate-limited",
        ), True
    if isinstance(exc, _transport_errors()) or isinstance(exc, cls("FileMetadataError")):
        reason = type(exc).__name__
        return _Unavailable(
            f"cannot reach the Hugging Face Hub at {req.endpoint} ({reason})",
            "check the network, a proxy or HF_ENDPOINT; or use --offline with a cached model",
        ), True
    if isinstance(exc, OSError) and not isinstance(exc, (cls("HfHubHTTPError"), cls("LocalEntryNotFoundError"))):
        # Writing the cache failed (read-only HF_HOME, disk full, ...): a local problem, not the Hub's.
        return HubError(
            f"cannot write the Hugging Face cache at {req.cache_dir} ({exc.strerror or type(exc).__name__})",
            "set HF_HOME to a writable folder",
        ), False
    if isinstance(exc, cls("LocalEntryNotFoundError")):
        # huggingface_hub's own 'not found on the Hub nor in the cache' after a failed HEAD.
        return _Unavailable(
            f"cannot get {CONFIG_FILE} of {req.label} from {req.endpoint}",
            "check the network or HF_ENDPOINT; or use --offline with a cached model",
        ), True
    return None, False


def _status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


# ---------------------------------------------------------------------------------------------------
# weight facts


def _online_weights(req: _Request, commit: str | None) -> tuple[WeightFacts | None, str]:
    """Weight facts from the safetensors headers on the Hub (falling back to the cached index)."""
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hf_errors

    not_safetensors = getattr(hf_errors, "NotASafetensorsRepoError", None)
    parsing = getattr(hf_errors, "SafetensorsParsingError", ValueError)
    api = HfApi(endpoint=req.endpoint, token=req.token)
    try:
        meta = api.get_safetensors_metadata(
            req.repo_id,
            revision=commit or req.revision,
            token=req.token,
            **_supported(api.get_safetensors_metadata, timeout=_header_timeout_s()),
        )
    except Exception as exc:  # noqa: BLE001 - narrowed below
        if not_safetensors is not None and isinstance(exc, not_safetensors):
            return None, "no safetensors weights in the repository: weight size unknown"
        if not isinstance(exc, (parsing, OSError, ValueError, KeyError, *_transport_errors())):
            raise
        facts = _cached_weights(req, commit)
        reason = f"safetensors headers unavailable ({type(exc).__name__})"
        return facts, reason + ("; weight bytes from the cached index" if facts else "; weight size unknown")
    tensors = (
        (info.dtype, info.shape, info.data_offsets)
        for file_meta in meta.files_metadata.values()
        for info in file_meta.tensors.values()
    )
    files = len(meta.files_metadata)
    return _facts(tensors, f"safetensors metadata ({files} file{'s' if files != 1 else ''}) at {commit or req.revision or 'main'}"), ""


def _facts(tensors: Iterable[tuple[str, Any, Any]], source: str) -> WeightFacts:
    """Parameter count per dtype and stored bytes for ``(dtype, shape, data_offsets)`` triples.

    Bytes per tensor: ``ceil(elements x bits / 8)`` for a known dtype, else the span of its data_offsets.
    """
    by_dtype: dict[str, int] = {}
    total_bytes = 0
    for dtype, shape, offsets in tensors:
        n = math.prod(int(d) for d in shape)
        by_dtype[dtype] = by_dtype.get(dtype, 0) + n
        bits = SAFETENSORS_DTYPE_BITS.get(str(dtype).upper())
        total_bytes += cdiv(n * bits, 8) if bits is not None else int(offsets[1]) - int(offsets[0])
    main = max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else None
    return WeightFacts(
        total_bytes=total_bytes or None,
        parameters=sum(by_dtype.values()) or None,
        dtype=main,
        params_by_dtype=MappingProxyType(dict(sorted(by_dtype.items()))),
        source=source,
    )


def _cached_weights(req: _Request, commit: str | None) -> WeightFacts | None:
    """Weight facts from the HF cache only: cached safetensors headers, else the cached index's total_size."""
    from huggingface_hub import try_to_load_from_cache

    revision = commit or req.revision

    def cached(filename: str) -> Path | None:
        hit = try_to_load_from_cache(req.repo_id, filename, cache_dir=req.cache_dir, revision=revision)
        return Path(hit) if isinstance(hit, str) else None

    single = cached(SAFETENSORS_FILE)
    if single is not None:
        header = _read_local_header(single)
        if header is not None:
            return _facts(_header_tensors(header), f"cached {SAFETENSORS_FILE} header")
    index = cached(SAFETENSORS_INDEX_FILE)
    if index is None:
        return None
    shards = _index_shards(index)
    headers = [_read_local_header(p) if (p := cached(s)) else None for s in shards]
    if shards and all(h is not None for h in headers):
        tensors = (t for h in headers if h is not None for t in _header_tensors(h))
        return _facts(tensors, f"cached safetensors headers ({len(shards)} files)")
    facts = weights_from_index(index)
    if facts is None:
        return None
    return WeightFacts(total_bytes=facts.total_bytes, source=f"cached {facts.source}")


def _index_shards(index: Path) -> list[str]:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    return sorted({str(v) for v in weight_map.values()}) if isinstance(weight_map, dict) else []


def _read_local_header(path: Path) -> dict[str, Any] | None:
    """The JSON header of a local safetensors file (None if unreadable or malformed)."""
    try:
        with path.open("rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                return None
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_SAFETENSORS_HEADER_BYTES:
                return None
            header = json.loads(fh.read(length))
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None


def _header_tensors(header: dict[str, Any]) -> Iterator[tuple[str, Any, Any]]:
    for name, info in header.items():
        if name != "__metadata__" and isinstance(info, dict):
            yield info.get("dtype", "?"), info.get("shape", []), info.get("data_offsets", (0, 0))


# ---------------------------------------------------------------------------------------------------
# huggingface_hub plumbing


def _supported(fn: Any, **kwargs: Any) -> dict[str, Any]:
    """The ``kwargs`` that ``fn`` accepts (keyword names differ across huggingface_hub versions)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


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
