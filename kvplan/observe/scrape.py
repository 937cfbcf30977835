"""Fetch a ``/metrics`` page over HTTP (stdlib ``urllib``) with a per-request timeout.

Every way a fetch can fail becomes a :class:`ScrapeError` with one line that names the endpoint (never
its credentials or header values): unreachable, refused, timed out, an HTTP error status, a body that is
not text. Credentials in the URL (``http://user:pass@host``) become a basic ``Authorization`` header and
are dropped from every URL kvplan shows; ``--header`` values are sent and never shown.
"""

from __future__ import annotations

import base64
import http.client
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import field

from kvplan.errors import InputError, KvplanError
from kvplan.frozen import frozen

MAX_BODY_BYTES = 64 * 2**20  # a metrics page is KiBs to a few MiB; refuse anything past this
USER_AGENT = "kvplan-observe"


class ScrapeError(KvplanError):
    """One poll could not read the page (the run goes on)."""


@frozen
class Endpoint:
    """Where to poll: the full URL, what to show of it, and the request headers (secret)."""

    url: str
    display: str
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)


def endpoint(text: str, headers: list[str] | tuple[str, ...] = ()) -> Endpoint:
    """``host:port`` -> ``http://host:port/metrics``; a URL without a path gets ``/metrics``.

    ``headers`` are ``Name: value`` strings. Raises :class:`InputError` for anything else.
    """
    raw = text.strip()
    if not raw:
        raise InputError("empty URL", "pass the server's metrics URL, e.g. http://127.0.0.1:8000/metrics")
    if any(c.isspace() or not c.isprintable() for c in raw):
        raise InputError(f"invalid URL {_shown(raw)}: it contains spaces or control characters",
                         "percent-encode them (%20)")
    if "://" not in raw:
        raw = "http://" + raw
    try:
        parts = urllib.parse.urlsplit(raw)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", ...
        raise InputError(f"invalid URL {_shown(raw)}: {exc}", "e.g. http://127.0.0.1:8000/metrics") from None
    if parts.scheme not in ("http", "https"):
        raise InputError(f"unsupported URL scheme {parts.scheme!r}", "use http:// or https://")
    port = parts.port
    if not parts.hostname:
        raise InputError(f"no host in URL {_redact(parts)!r}", "e.g. http://127.0.0.1:8000/metrics")
    if ":" not in parts.hostname:  # a name (IPv6 literals were checked by urlsplit)
        try:
            parts.hostname.encode("idna")
        except UnicodeError:  # an empty or over-long label: "a..b", 64+ characters between dots
            raise InputError(f"invalid host in URL {_shown(raw)}", "e.g. http://127.0.0.1:8000/metrics") from None
    # non-ASCII in the path or query is sent percent-encoded (UTF-8), as browsers do; % escapes stay
    path = urllib.parse.quote(parts.path, safe="/%:@!$&'()*+,;=~") if parts.path not in ("", "/") else "/metrics"
    query = urllib.parse.quote(parts.query, safe="/%:@!$&'()*+,;=~?")
    parts = parts._replace(query=query)
    netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    if port is not None:
        netloc += f":{port}"
    clean = urllib.parse.urlunsplit((parts.scheme, netloc, path, parts.query, ""))
    sent = [_header(h) for h in headers]
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        sent.append(("Authorization", f"Basic {token}"))
    display = urllib.parse.urlunsplit((parts.scheme, netloc, path, "…" if parts.query else "", ""))
    return Endpoint(clean, display, tuple(sent))


def _shown(raw: str) -> str:
    """The URL as typed, without credentials (``user:pass@``), quoted and cut to 80 characters."""
    scheme, sep, rest = raw.partition("://")
    host, at, path = rest.partition("/")
    shown = f"{scheme}{sep}{host.rsplit('@', 1)[-1]}{'/' if at else ''}{path}"
    return repr(shown if len(shown) <= 80 else shown[:77] + "...")


def _redact(parts: urllib.parse.SplitResult) -> str:
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://{host}{parts.path}"


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
        raise InputError(f"invalid --header {name.strip()[:40]!r}: expected 'Name: value'")
    return name.strip(), value.strip()


def fetch(where: Endpoint, timeout_s: float) -> str:
    """The page's text; raises :class:`ScrapeError` with one line when it cannot be read in time."""
    request = urllib.request.Request(where.url, headers={"User-Agent": USER_AGENT, "Accept": "text/plain",
                                                         **dict(where.headers)})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - http(s) only
            body = response.read(MAX_BODY_BYTES + 1)
            ctype = response.headers.get("Content-Type", "") or ""
    except urllib.error.HTTPError as exc:
        raise ScrapeError(_http_error(where, exc.code, str(exc.reason))) from None
    except urllib.error.URLError as exc:
        raise ScrapeError(_unreachable(where, exc.reason, timeout_s)) from None
    except (TimeoutError, socket.timeout):
        raise ScrapeError(f"{where.display}: no answer within {timeout_s:g} s (--timeout)") from None
    except (ConnectionError, OSError) as exc:
        raise ScrapeError(_unreachable(where, exc, timeout_s)) from None
    except (http.client.HTTPException, ValueError) as exc:  # malformed or cut-off responses
        raise ScrapeError(f"{where.display}: malformed HTTP response ({type(exc).__name__})") from None
    if len(body) > MAX_BODY_BYTES:
        raise ScrapeError(f"{where.display}: page larger than {MAX_BODY_BYTES // 2**20} MiB; not a metrics page")
    if "html" in ctype.lower():
        raise ScrapeError(f"{where.display}: got an HTML page ({ctype.split(';')[0]}), not Prometheus metrics")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise ScrapeError(f"{where.display}: the body is not UTF-8 text, not Prometheus metrics") from None


def _http_error(where: Endpoint, code: int, reason: str) -> str:
    hint = {404: "is the path right? vLLM and SGLang serve /metrics; SGLang needs --enable-metrics",
            401: "pass credentials with --header 'Authorization: Bearer ...'",
            403: "pass credentials with --header 'Authorization: Bearer ...'"}.get(code)
    return f"{where.display}: HTTP {code} {reason}" + (f" ({hint})" if hint else "")


def _unreachable(where: Endpoint, reason: object, timeout_s: float) -> str:
    if isinstance(reason, (TimeoutError, socket.timeout)) or "timed out" in str(reason):
        return f"{where.display}: no answer within {timeout_s:g} s (--timeout)"
    if isinstance(reason, ConnectionRefusedError):
        return f"{where.display}: connection refused (is the server up, and is this its port?)"
    if isinstance(reason, socket.gaierror):
        return f"{where.display}: unknown host ({reason.strerror or reason})"
    text = getattr(reason, "strerror", None) or str(reason)
    return f"{where.display}: cannot connect ({text})"
