"""Typed Hub failures -> one-line kvplan errors with a hint: the table :data:`HUB_ERRORS`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvplan.errors import HubError, KvplanError, ModelNotFoundError
from kvplan.model.hub.request import CONFIG_FILE, HubRequest, transport_errors
from kvplan.frozen import frozen


class Unavailable(HubError):
    """The Hub could not answer (network, 5xx): the message gains 'and not in the cache' when raised."""


@frozen
class _HubErrorRule:
    """One row of :data:`HUB_ERRORS`: which failure, the kvplan error it becomes, and whether the cache
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
HUB_ERRORS: tuple[_HubErrorRule, ...] = (
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
    _HubErrorRule(_http(500, 599), Unavailable, "the Hub at {endpoint} answered HTTP {status} (server error) for {label}",
                  "the Hub may be down: retry later, or use --offline with a cached model", True),
    _HubErrorRule(_http(401, 401), HubError, "the Hub at {endpoint} rejected the token (HTTP 401) for {repo}",
                  "check --token / HF_TOKEN, or run `hf auth login`", True),
    _HubErrorRule(_http(0, 499), HubError, "the Hub at {endpoint} answered HTTP {status} for {label}{server}",
                  "pass --token or set HF_TOKEN if the repo needs access; retry later if rate-limited", True),
    _HubErrorRule(lambda exc, status, hf: isinstance(exc, (*transport_errors(), hf("FileMetadataError"))),
                  Unavailable, "cannot reach the Hugging Face Hub at {endpoint} ({reason})", _CHECK_NETWORK, True),
    # Writing the cache failed (read-only HF_HOME, disk full, ...): a local problem, not the Hub's.
    _HubErrorRule(lambda exc, status, hf: isinstance(exc, OSError)
                  and not isinstance(exc, (hf("HfHubHTTPError"), hf("LocalEntryNotFoundError"))),
                  HubError, "cannot write the Hugging Face cache at {cache} ({strerror})",
                  "set HF_HOME to a writable folder", False),
    # huggingface_hub's own 'not found on the Hub nor in the cache' after a failed HEAD.
    _HubErrorRule(_is("LocalEntryNotFoundError"), Unavailable, "cannot get " + CONFIG_FILE + " of {label} from {endpoint}",
                  "check the network or HF_ENDPOINT; or use --offline with a cached model", True),
)


def translate(exc: BaseException, req: HubRequest) -> tuple[KvplanError | None, bool]:
    """A kvplan error for a huggingface_hub/HTTP failure (the first matching row of :data:`HUB_ERRORS`),
    and whether a cached copy may stand in. ``(None, False)`` for anything else (a bug: let it propagate)."""
    from huggingface_hub import errors as hf_errors

    def hf(name: str) -> type:
        found = getattr(hf_errors, name, None)
        return found if isinstance(found, type) else type(f"_Missing{name}", (Exception,), {})

    status = _status_of(exc)
    for rule in HUB_ERRORS:
        if rule.matches(exc, status, hf):
            fields = _error_fields(exc, req, status)
            return rule.error(rule.message.format(**fields), rule.hint.format(**fields)), rule.cache_may_answer
    return None, False


def _error_fields(exc: BaseException, req: HubRequest, status: int | None) -> dict[str, Any]:
    """The values the :data:`HUB_ERRORS` templates use (tokens scrubbed from the server's words)."""
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


def _token_sent(req: HubRequest) -> bool:
    """Whether huggingface_hub sent a token: the argument, else HF_TOKEN or the saved token."""
    if req.token:
        return True
    from huggingface_hub import get_token

    return bool(get_token())


def _status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None
