"""A local Hugging Face Hub emulator for tests (pip-tools' FakeRepository, for the Hub).

A threaded stdlib HTTP server on 127.0.0.1 that answers the calls huggingface_hub 2.x makes for
``hf_hub_download`` and ``get_safetensors_metadata``:

* ``HEAD|GET /{org}/{name}/resolve/{revision}/{filename}`` - plain files (config.json, the safetensors
  index) answer 200 with ``X-Repo-Commit``, ``ETag`` (git blob sha1) and ``Content-Length``; LFS files
  (``*.safetensors``) answer 302 to a CDN url on another origin (``localhost`` instead of ``127.0.0.1``, so
  huggingface_hub does not follow it and drops the Authorization header) with ``X-Linked-Etag`` (sha256),
  ``X-Linked-Size`` and ``X-Repo-Commit``, as the real Hub does.
* ``HEAD|GET /cdn/{sha256}`` - the LFS blob, honouring ``Range: bytes=a-b`` (206 + ``Content-Range``).
  Safetensors blobs are virtual: a real header (8-byte little-endian length + JSON) followed by zeros
  generated on demand, so tests never hold weights.
* Errors as the Hub sends them (``X-Error-Code``): ``RepoNotFound`` (401 without a token, 404 with one),
  ``GatedRepo`` (401 without a token, 403 with a token not granted), ``RevisionNotFound`` (404),
  ``EntryNotFound`` (404 with ``X-Repo-Commit``); an unknown token (when ``valid_tokens`` is set) gets
  401 "Invalid credentials in Authorization header".
* ``GET /api/models/{org}/{name}[/revision/{revision}]`` - the model info ``HfApi.model_info`` reads: ``id``,
  ``sha`` (the commit) and, as the Hub computes it from the safetensors headers of the commit, ``safetensors``
  (``parameters`` per dtype and their ``total``); left out when the commit has no safetensors file, when a
  header does not parse (the Hub cannot read it either), or while ``model_info_safetensors`` is False (a
  repository whose info the Hub has not computed).
* ``GET /api/agent-harnesses`` - the registry huggingface_hub reads for its user agent (at most once a day:
  it keeps it in ``HF_HOME``), empty here.
* Modes: ``"ok"``, ``"error500"`` (every request answers 500) and ``"drop"`` (the connection is closed
  without a response).

Every request is recorded (method, path, lower-cased headers) so tests can assert what was sent.
The server speaks HTTP/1.0 (one request per connection), so ``stop()`` really makes the Hub unreachable.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Mapping
from urllib.parse import unquote, urlsplit

# Bits per element of the safetensors dtypes the helpers below can lay out.
SAFETENSORS_BITS = {
    "F64": 64, "I64": 64, "U64": 64,
    "F32": 32, "I32": 32, "U32": 32,
    "F16": 16, "BF16": 16, "I16": 16, "U16": 16,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "I8": 8, "U8": 8, "BOOL": 8,
    "F4": 4,
}

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def safetensors_header(tensors: Mapping[str, tuple[str, list[int]]], metadata: Mapping[str, str] | None = None) -> tuple[bytes, int]:
    """The first bytes of a safetensors file for ``tensors`` (name -> (dtype, shape)).

    Returns ``(prefix, file_size_bytes)``: ``prefix`` is the 8-byte little-endian header length plus the
    JSON header (space-padded to a multiple of 8 as the format allows); ``file_size_bytes`` adds the data
    region the ``data_offsets`` describe.
    """
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, (dtype, shape) in tensors.items():
        nbytes = math.ceil(math.prod(shape) * SAFETENSORS_BITS[dtype] / 8)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    prefix = struct.pack("<Q", len(text)) + text
    return prefix, len(prefix) + offset


@dataclass(frozen=True)
class VirtualFile:
    """A large (LFS) file: real leading bytes, then zeros up to ``size`` bytes."""

    head: bytes
    size: int

    @classmethod
    def safetensors(cls, tensors: Mapping[str, tuple[str, list[int]]], metadata: Mapping[str, str] | None = None) -> "VirtualFile":
        prefix, size = safetensors_header(tensors, metadata)
        return cls(prefix, size)

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``start..end`` inclusive."""
        end = min(end, self.size - 1)
        head = self.head[start : end + 1]
        return head + b"\0" * (end + 1 - start - len(head))

    @property
    def sha256(self) -> str:
        # Content address of the blob; the zero tail is determined by size, so hash head + size.
        return hashlib.sha256(self.head + str(self.size).encode()).hexdigest()


FileContent = bytes | str | dict | VirtualFile


def _as_file(content: FileContent) -> bytes | VirtualFile:
    if isinstance(content, VirtualFile | bytes):
        return content
    if isinstance(content, str):
        return content.encode()
    return json.dumps(content, indent=2).encode()


@dataclass
class EmulatedRepo:
    """One model repo: files per commit, refs (branch/tag -> commit), access rules."""

    repo_id: str
    commits: dict[str, dict[str, bytes | VirtualFile]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    granted_tokens: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: Mapping[str, str]


class HubEmulator:
    """In-memory Hub repos behind a local HTTP server. ``with HubEmulator() as hub: hub.url ...``."""

    def __init__(self) -> None:
        self.repos: dict[str, EmulatedRepo] = {}
        self.mode = "ok"
        # Tokens the Hub knows; None accepts any token as a valid (if not necessarily granted) one.
        self.valid_tokens: set[str] | None = None
        self.requests: list[RecordedRequest] = []
        self.model_info_safetensors = True  # False: model info without safetensors parameters (not computed)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # ---- repo content -----------------------------------------------------------------------
    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, FileContent],
        *,
        refs: tuple[str, ...] = ("main",),
        gated: bool = False,
        granted_tokens: tuple[str, ...] = (),
    ) -> str:
        """Create ``repo_id`` with one commit holding ``files``; returns the commit sha."""
        repo = EmulatedRepo(repo_id, gated=gated, granted_tokens=frozenset(granted_tokens))
        self.repos[repo_id] = repo
        return self.add_commit(repo_id, files, refs=refs)

    def add_commit(self, repo_id: str, files: Mapping[str, FileContent], *, refs: tuple[str, ...] = ()) -> str:
        """Add a commit with ``files`` (the whole tree) and point ``refs`` at it; returns its sha."""
        repo = self.repos[repo_id]
        tree = {name: _as_file(content) for name, content in files.items()}
        digest = hashlib.sha1(repo_id.encode())
        for name in sorted(tree):
            body = tree[name]
            digest.update(name.encode() + (body.head if isinstance(body, VirtualFile) else body))
        digest.update(str(len(repo.commits)).encode())
        sha = digest.hexdigest()
        repo.commits[sha] = tree
        for ref in refs:
            repo.refs[ref] = sha
        return sha

    # ---- server lifecycle -------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "HubEmulator":
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="hub-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port (later requests get 'connection refused')."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "HubEmulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- introspection ------------------------------------------------------------------------
    def record(self, req: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(req)

    def requests_for(self, fragment: str) -> list[RecordedRequest]:
        """Recorded requests whose path contains ``fragment``."""
        with self._lock:
            return [r for r in self.requests if fragment in r.path]


class _Handler(BaseHTTPRequestHandler):
    hub: HubEmulator
    protocol_version = "HTTP/1.0"
    server_version = "HubEmulator/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # keep test output quiet

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    # ------------------------------------------------------------------------------------------
    def _serve(self, body: bool) -> None:
        path = urlsplit(self.path).path
        self.hub.record(RecordedRequest(self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        if self.hub.mode == "drop":
            self.close_connection = True
            return  # nothing written: the client sees the server disconnect without a response
        if self.hub.mode == "error500":
            self._reply(500, b"Internal Server Error", body=body)
            return
        if path.startswith("/cdn/"):
            self._serve_blob(path[len("/cdn/") :], body)
            return
        if path == "/api/agent-harnesses":  # huggingface_hub's user-agent registry (it caches it for a day)
            self._send_bytes(json.dumps({"standardEnvVars": [], "harnesses": {}}).encode(), body,
                             {"Content-Type": "application/json"})
            return
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if info is not None:
            self._serve_model_info(info.group(1), unquote(info.group(2) or "main"), body)
            return
        match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if match is None:
            self._reply(404, b"Not Found", body=body)
            return
        repo_id, revision, filename = match.group(1), unquote(match.group(2)), unquote(match.group(3))
        self._serve_resolve(repo_id, revision, filename, body)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None

    def _serve_resolve(self, repo_id: str, revision: str, filename: str, body: bool) -> None:
        repo = self.hub.repos.get(repo_id)
        token = self._token()
        if token is not None and self.hub.valid_tokens is not None and token not in self.hub.valid_tokens:
            self._reply(401, b"Invalid credentials", body=body, headers={
                "X-Error-Message": "Invalid credentials in Authorization header"})
            return
        if repo is None:
            status = 404 if token else 401  # the Hub hides whether a repo exists from anonymous callers
            self._reply(status, b"Repository not found", body=body, headers={
                "X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})
            return
        if repo.gated and token not in repo.granted_tokens:
            message = f"Access to model {repo_id} is restricted and you are not in the authorized list."
            if token is None:
                message = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in."
            self._reply(403 if token else 401, message.encode(), body=body, headers={
                "X-Error-Code": "GatedRepo", "X-Error-Message": message})
            return
        commit = repo.refs.get(revision) or (revision if revision in repo.commits else None)
        if commit is None or not _COMMIT_RE.match(commit):
            self._reply(404, b"Invalid rev id", body=body, headers={
                "X-Error-Code": "RevisionNotFound", "X-Error-Message": f"Invalid rev id: {revision}"})
            return
        content = repo.commits[commit].get(filename)
        if content is None:
            self._reply(404, b"Entry not found", body=body, headers={
                "X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found", "X-Repo-Commit": commit})
            return
        if isinstance(content, VirtualFile):
            host = f"localhost:{self.hub.port}"  # another origin: a CDN, as far as the client can tell
            self._reply(302, b"", body=body, headers={
                "Location": f"http://{host}/cdn/{content.sha256}",
                "X-Repo-Commit": commit,
                "X-Linked-Etag": f'"{content.sha256}"',
                "X-Linked-Size": str(content.size),
                "ETag": f'"{hashlib.sha1(content.head).hexdigest()}"',
            })
            return
        etag = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()  # git blob sha1
        self._send_bytes(content, body, {"X-Repo-Commit": commit, "ETag": f'"{etag}"'})

    def _serve_model_info(self, repo_id: str, revision: str, body: bool) -> None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            status = 404 if self._token() else 401
            self._reply(status, b'{"error":"Repository not found"}', body=body, headers={
                "X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})
            return
        commit = repo.refs.get(revision) or (revision if revision in repo.commits else None)
        if commit is None:
            self._reply(404, b'{"error":"Invalid rev id"}', body=body, headers={
                "X-Error-Code": "RevisionNotFound", "X-Error-Message": f"Invalid rev id: {revision}"})
            return
        info: dict[str, Any] = {"_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "sha": commit}
        parameters = _safetensors_parameters(repo.commits[commit]) if self.hub.model_info_safetensors else None
        if parameters:
            info["safetensors"] = {"parameters": parameters, "total": sum(parameters.values())}
        self._send_bytes(json.dumps(info).encode(), body, {"Content-Type": "application/json"})

    def _serve_blob(self, sha256: str, body: bool) -> None:
        for repo in self.hub.repos.values():
            for tree in repo.commits.values():
                for content in tree.values():
                    if isinstance(content, VirtualFile) and content.sha256 == sha256:
                        self._send_virtual(content, body)
                        return
        self._reply(404, b"Not Found", body=body)

    def _byte_range(self, size: int) -> tuple[int, int] | None:
        spec = self.headers.get("Range")
        if not spec:
            return None
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", spec.strip())
        if m is None:
            return None
        start = int(m.group(1))
        end = int(m.group(2)) if m.group(2) else size - 1
        return start, min(end, size - 1)

    def _send_virtual(self, content: VirtualFile, body: bool) -> None:
        rng = self._byte_range(content.size)
        headers = {"ETag": f'"{content.sha256}"', "Accept-Ranges": "bytes"}
        if rng is None:
            self._reply(200, content.read(0, content.size - 1) if body else b"", body=body, headers=headers,
                        length=content.size)
            return
        start, end = rng
        if start >= content.size:
            self._reply(416, b"", body=body, headers={"Content-Range": f"bytes */{content.size}"})
            return
        headers["Content-Range"] = f"bytes {start}-{end}/{content.size}"
        self._reply(206, content.read(start, end), body=body, headers=headers)

    def _send_bytes(self, content: bytes, body: bool, headers: dict[str, str]) -> None:
        rng = self._byte_range(len(content))
        if rng is None:
            self._reply(200, content, body=body, headers=headers)
            return
        start, end = rng
        headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
        self._reply(206, content[start : end + 1], body=body, headers=headers)

    def _reply(self, status: int, payload: bytes, *, body: bool, headers: Mapping[str, str] | None = None,
               length: int | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload) if length is None else length))
        self.end_headers()
        if body and payload:
            self.wfile.write(payload)


def _safetensors_parameters(tree: Mapping[str, bytes | VirtualFile]) -> dict[str, int] | None:
    """Elements per dtype over every ``*.safetensors`` file of a commit (the Hub's ``safetensors.parameters``),
    or None when there is none or a header does not parse."""
    counts: dict[str, int] = {}
    files = [content for name, content in tree.items() if name.endswith(".safetensors")]
    for content in files:
        head = content.head if isinstance(content, VirtualFile) else content
        if len(head) < 8:
            return None
        (length,) = struct.unpack("<Q", head[:8])
        try:
            header = json.loads(head[8:8 + length])
        except ValueError:
            return None
        for name, tensor in header.items():
            if name != "__metadata__":
                counts[tensor["dtype"]] = counts.get(tensor["dtype"], 0) + math.prod(tensor["shape"])
    return dict(sorted(counts.items())) if files else None


def point_huggingface_hub_at(monkeypatch: Any, endpoint: str, hf_home: str) -> None:
    """Aim huggingface_hub at ``endpoint`` with a private cache under ``hf_home``, via ``monkeypatch``.

    huggingface_hub reads HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE and the token path into
    ``huggingface_hub.constants`` when it is imported, so both the environment (for subprocesses and
    call-time readers) and the constants are patched; monkeypatch restores both after the test.
    """
    import os

    from huggingface_hub import constants

    endpoint = endpoint.rstrip("/")
    hub_cache = os.path.join(hf_home, "hub")
    token_path = os.path.join(hf_home, "token")
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", hf_home)
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ASSETS_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH",
                 "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_IMPLICIT_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    overrides = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": hf_home,
        "HF_HUB_CACHE": hub_cache,
        "HUGGINGFACE_HUB_CACHE": hub_cache,
        "HF_ASSETS_CACHE": os.path.join(hf_home, "assets"),
        "HF_TOKEN_PATH": token_path,
        "HF_STORED_TOKENS_PATH": os.path.join(hf_home, "stored_tokens"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": False,
    }
    for name, value in overrides.items():
        if hasattr(constants, name):
            monkeypatch.setattr(constants, name, value)
