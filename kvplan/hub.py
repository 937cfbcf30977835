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
3. online: one HEAD of config.json with a short timeout and no retries (fail fast); on a network error,
   a 5xx or an access error the cached copy is used when there is one, else the error is raised. Then
   ``hf_hub_download`` fetches config.json into the cache and ``get_safetensors_metadata`` reads the
   safetensors headers (HTTP range requests) for parameter counts per dtype; kvplan keeps that summary
   in huggingface_hub's assets folder (``HF_HOME/assets/kvplan/<org>--<name>/weights/<commit>.json``), so
   cached and offline answers equal the online one.

A config.json that cannot be parsed (not UTF-8, binary, too deep...) is removed from the cache before the
error is raised, so the next run asks the Hub again instead of failing the same way. Every Hub failure
becomes a :class:`~kvplan.errors.HubError` (or :class:`~kvplan.errors.ModelNotFoundError` for a repo that
does not exist) with one line and a hint, through the table :data:`_HUB_ERRORS`; tokens never appear in
messages.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvplan.atomic import write_atomic
from kvplan.errors import ConfigError, HubError, KvplanError, ModelNotFoundError
from kvplan.files import decode_text, parse_json, read_json, read_json_object
from kvplan.model_source import ModelSource, WeightFacts, weights_from_index
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
    assets_dir: str = ""

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

    req = _Request(
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
        commit = _commit_of(config_path)
        if fallback:  # the Hub failed and the cache answered: stay off the network
            return _from_cache(req, config_path, fallback)
        config = _parse_cached_config(req, config_path, commit)
        weights, notes = _online_weights(req, commit)
    return _source(req, config, commit, weights, notes, cached="")


def _from_cache(req: _Request, config_path: Path, how: str) -> ModelSource:
    """A source answered from the HF cache alone (weights from cached headers or kvplan's summary)."""
    commit = _commit_of(config_path)
    config = _parse_cached_config(req, config_path, commit)
    weights = _cached_weights(req, commit)
    notes = how + ("" if weights else "; weight size unknown (no safetensors header or index cached)")
    return _source(req, config, commit, weights, notes, cached=f"HF cache, commit {commit}" if commit else "HF cache")


def _source(req: _Request, config: dict[str, Any], commit: str | None, weights: WeightFacts | None, notes: str,
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


def cached_file(req: _Request, filename: str, revision: str | None = None) -> Path | None:
    """``filename`` of ``req``'s repo at ``revision`` (default: the request's) in the HF cache, or None.

    Reads huggingface_hub's documented cache layout (``models--org--name/refs/<branch>`` holds the commit,
    ``snapshots/<commit>/<file>`` the file), as ``huggingface_hub.try_to_load_from_cache`` does, without
    importing the module that defines it (it loads the HTTP client: ~0.1 s of a cached answer's start-up).
    A test checks both agree.
    """
    repo = Path(req.cache_dir) / ("models--" + req.repo_id.replace("/", "--"))
    revision = revision or req.revision or "main"
    if not _COMMIT_RE.match(revision):
        try:
            revision = (repo / "refs" / revision).read_text(encoding="utf-8").strip()
        except (OSError, ValueError):
            return None
    if not _COMMIT_RE.match(revision):
        return None
    path = repo / "snapshots" / revision / filename
    return path if path.is_file() else None


def _parse_cached_config(req: _Request, path: Path, commit: str | None) -> dict[str, Any]:
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
        cached = cached_file(req, CONFIG_FILE) if cache_may_answer else None
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


@dataclass(frozen=True)
class _HubErrorRule:
    """One row of :data:`_HUB_ERRORS`: which failure, the kvplan error it becomes, and whether the cache
    may stand in for the Hub. ``message``/``hint`` are formatted with :func:`_error_fields`."""

    matches: Callable[[BaseException, int | None, Callable[[str], type]], bool]
    error: type[KvplanError]
    message: str
    hint: str
    cache_may_answer: bool


def _is(name: str, *, unless: str = "") -> Callable[[BaseException, int | None, Callable[[str], type]], bool]:
    """Matcher: ``exc`` is huggingface_hub's ``errors.<name>`` (and not ``errors.<unless>``)."""
    return lambda exc, status, hf: isinstance(exc, hf(name)) and not (unless and isinstance(exc, hf(unless)))


def _http(low: int, high: int) -> Callable[[BaseException, int | None, Callable[[str], type]], bool]:
    """Matcher: an ``HfHubHTTPError`` with a status in ``low..high``."""
    return lambda exc, status, hf: isinstance(exc, hf("HfHubHTTPError")) and status is not None and low <= status <= high


_CHECK_NETWORK = "check the network, a proxy or HF_ENDPOINT; or use --offline with a cached model"

# Typed Hub failures -> one line and a hint, first match wins (the huggingface_hub CLI's pattern).
_HUB_ERRORS: tuple[_HubErrorRule, ...] = (
    _HubErrorRule(_is("OfflineModeIsEnabled"), HubError,
                  "HF_HUB_OFFLINE is set and {label} is not in the Hugging Face cache at {cache}",
                  "run once online to cache it, or unset HF_HUB_OFFLINE", True),
    _HubErrorRule(_is("GatedRepoError"), HubError, "{repo} is a gated repository on {endpoint} and {gated_why}",
                  "accept its licence on the model page, then pass --token hf_..., set HF_TOKEN, or run "
                  "`hf auth login`", True),
    _HubErrorRule(_is("RepositoryNotFoundError"), ModelNotFoundError, "no model repository {repo!r} on {endpoint}",
                  "check the id, or it is private/gated: pass --token or set HF_TOKEN", True),
    _HubErrorRule(_is("RevisionNotFoundError"), HubError, "{repo} has no revision {revision!r} on {endpoint}",
                  "pass an existing branch, tag or commit sha to --revision, or omit it for 'main'", False),
    _HubErrorRule(_is("EntryNotFoundError", unless="LocalEntryNotFoundError"), HubError,
                  "{label} has no " + CONFIG_FILE + " at {where}",
                  "kvplan reads a transformers-style config.json; pass a local directory holding one instead", False),
    _HubErrorRule(_http(500, 599), _Unavailable, "the Hub at {endpoint} answered HTTP {status} (server error) for {label}",
                  "the Hub may be down: retry later, or use --offline with a cached model", True),
    _HubErrorRule(_http(401, 401), HubError, "the Hub at {endpoint} rejected the token (HTTP 401) for {repo}",
                  "check --token / HF_TOKEN, or run `hf auth login`", True),
    _HubErrorRule(_http(0, 499), HubError, "the Hub at {endpoint} answered HTTP {status} for {label}{server}",
                  "pass --token or set HF_TOKEN if the repo needs access; retry later if rate-limited", True),
    _HubErrorRule(lambda exc, status, hf: isinstance(exc, (*_transport_errors(), hf("FileMetadataError"))),
                  _Unavailable, "cannot reach the Hugging Face Hub at {endpoint} ({reason})", _CHECK_NETWORK, True),
    # Writing the cache failed (read-only HF_HOME, disk full, ...): a local problem, not the Hub's.
    _HubErrorRule(lambda exc, status, hf: isinstance(exc, OSError)
                  and not isinstance(exc, (hf("HfHubHTTPError"), hf("LocalEntryNotFoundError"))),
                  HubError, "cannot write the Hugging Face cache at {cache} ({strerror})",
                  "set HF_HOME to a writable folder", False),
    # huggingface_hub's own 'not found on the Hub nor in the cache' after a failed HEAD.
    _HubErrorRule(_is("LocalEntryNotFoundError"), _Unavailable, "cannot get " + CONFIG_FILE + " of {label} from {endpoint}",
                  "check the network or HF_ENDPOINT; or use --offline with a cached model", True),
)


def _translate(exc: BaseException, req: _Request) -> tuple[KvplanError | None, bool]:
    """A kvplan error for a huggingface_hub/HTTP failure (the first matching row of :data:`_HUB_ERRORS`),
    and whether a cached copy may stand in. ``(None, False)`` for anything else (a bug: let it propagate)."""
    from huggingface_hub import errors as hf_errors

    def hf(name: str) -> type:
        found = getattr(hf_errors, name, None)
        return found if isinstance(found, type) else type(f"_Missing{name}", (Exception,), {})

    status = _status_of(exc)
    for rule in _HUB_ERRORS:
        if rule.matches(exc, status, hf):
            fields = _error_fields(exc, req, status)
            return rule.error(rule.message.format(**fields), rule.hint.format(**fields)), rule.cache_may_answer
    return None, False


def _error_fields(exc: BaseException, req: _Request, status: int | None) -> dict[str, Any]:
    """The values the :data:`_HUB_ERRORS` templates use (tokens scrubbed from the server's words)."""
    server = str(getattr(exc, "server_message", None) or "").strip()
    server = req.scrub(server.splitlines()[0]) if server else ""
    if status == 403:
        gated_why = "the token sent has not been granted access"
    else:
        gated_why = "the token sent was not accepted" if _token_sent(req) else "no token was sent"
    return {
        "label": req.label, "repo": req.repo_id, "revision": req.revision, "endpoint": req.endpoint,
        "where": f"{req.endpoint}/{req.repo_id}", "cache": req.cache_dir, "status": status,
        "server": f": {server}" if server else "", "reason": type(exc).__name__, "gated_why": gated_why,
        "strerror": getattr(exc, "strerror", None) or type(exc).__name__,
    }


def _token_sent(req: _Request) -> bool:
    """Whether huggingface_hub sent a token: the argument, else HF_TOKEN or the saved token."""
    if req.token:
        return True
    from huggingface_hub import get_token

    return bool(get_token())


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
    facts = _facts(tensors, f"safetensors metadata ({files} file{'s' if files != 1 else ''}) at {commit or req.revision or 'main'}")
    if facts is None:
        return _cached_weights(req, commit), "safetensors headers malformed (a tensor shape is not a list of integers)"
    if commit:
        _remember_weights(req, commit, facts)
    return facts, ""


def _facts(tensors: Iterable[tuple[str, Any, Any]], source: str) -> WeightFacts | None:
    """Parameter count per dtype and stored bytes for ``(dtype, shape, data_offsets)`` triples.

    Bytes per tensor: ``ceil(elements x bits / 8)`` for a known dtype, else the span of its data_offsets.
    None when a shape or offset is not made of non-negative integers (a malformed header).
    """
    by_dtype: dict[str, int] = {}
    total_bytes = 0
    for dtype, shape, offsets in tensors:
        dims = list(shape) if isinstance(shape, (list, tuple)) else [None]
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            return None
        n = math.prod(dims)
        by_dtype[str(dtype)] = by_dtype.get(str(dtype), 0) + n
        bits = SAFETENSORS_DTYPE_BITS.get(str(dtype).upper())
        if bits is None:
            span = list(offsets) if isinstance(offsets, (list, tuple)) and len(offsets) == 2 else [None, None]
            if not all(isinstance(o, int) and not isinstance(o, bool) for o in span) or span[1] < span[0]:
                return None
            total_bytes += span[1] - span[0]
        else:
            total_bytes += cdiv(n * bits, 8)
    main = max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else None
    return WeightFacts(
        total_bytes=total_bytes or None,
        parameters=sum(by_dtype.values()) or None,
        dtype=main,
        params_by_dtype=MappingProxyType(dict(sorted(by_dtype.items()))),
        source=source,
    )


def _cached_weights(req: _Request, commit: str | None) -> WeightFacts | None:
    """Weight facts without the network: cached safetensors headers (the checkpoint was downloaded), else
    kvplan's summary of the headers read online at this commit, else the cached index's total_size."""
    revision = commit or req.revision
    single = cached_file(req, SAFETENSORS_FILE, revision)
    header = _read_local_header(single) if single is not None else None
    facts = _facts(_header_tensors(header), f"cached {SAFETENSORS_FILE} header") if header is not None else None
    if facts is not None:
        return facts
    index = cached_file(req, SAFETENSORS_INDEX_FILE, revision)
    shards = _index_shards(index) if index is not None else []
    headers = [_read_local_header(p) if (p := cached_file(req, s, revision)) else None for s in shards]
    if shards and all(h is not None for h in headers):
        tensors = (t for h in headers if h is not None for t in _header_tensors(h))
        facts = _facts(tensors, f"cached safetensors headers ({len(shards)} files)")
        if facts is not None:
            return facts
    facts = _recalled_weights(req, commit) if commit else None
    if facts is not None or index is None:
        return facts
    facts = weights_from_index(index)
    if facts is None:
        return None
    return WeightFacts(total_bytes=facts.total_bytes, source=f"cached {facts.source}")


def _summary_path(req: _Request, commit: str) -> Path:
    """kvplan's summary of a commit's safetensors headers, in huggingface_hub's assets folder (the layout
    of ``huggingface_hub.cached_assets_path(library_name="kvplan", namespace=<org>--<name>, subfolder="weights")``)."""
    return Path(req.assets_dir) / "kvplan" / req.repo_id.replace("/", "--") / "weights" / f"{commit}.json"


def _remember_weights(req: _Request, commit: str, facts: WeightFacts) -> None:
    """Keep the header summary so cached and offline answers equal this online one (best effort)."""
    summary = {"total_bytes": facts.total_bytes, "parameters": facts.parameters, "dtype": facts.dtype,
               "params_by_dtype": dict(facts.params_by_dtype), "source": facts.source}
    path = _summary_path(req, commit)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(summary, indent=1) + "\n")
    except (OSError, KvplanError):
        pass  # a read-only assets folder only costs the next run its weight facts


def _recalled_weights(req: _Request, commit: str) -> WeightFacts | None:
    """The summary :func:`_remember_weights` kept for ``commit`` (None when absent or not a summary)."""
    path = _summary_path(req, commit)
    if not path.is_file():
        return None
    try:
        data = read_json(path, "kvplan weight summary")
        by_dtype = {str(k): v for k, v in data["params_by_dtype"].items()}
        counts = [data["total_bytes"], data["parameters"], *by_dtype.values()]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in counts):
            return None
        return WeightFacts(total_bytes=data["total_bytes"], parameters=data["parameters"], dtype=str(data["dtype"]),
                           params_by_dtype=MappingProxyType(by_dtype), source=f"{data['source']} (kvplan's summary)")
    except (KvplanError, KeyError, TypeError, AttributeError):
        return None


def _index_shards(index: Path) -> list[str]:
    try:
        data = read_json(index, "safetensors index")
    except KvplanError:
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
            header = parse_json(decode_text(fh.read(length), str(path), "safetensors header"), str(path))
    except (OSError, KvplanError):
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
