"""What one Hub fetch asks for, and the local Hugging Face cache read by its documented layout.

Shared by :mod:`kvplan.model.hub` (config.json), :mod:`kvplan.model.hub.errors` (messages) and
:mod:`kvplan.model.hub.weights` (weight facts). Imports no huggingface_hub module.
"""

from __future__ import annotations

import os
import re
import sys
from kvplan.frozen import frozen
from pathlib import Path
from typing import Any

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


COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")



@frozen
class HubRequest:
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



def metadata_timeout_s() -> float:
    value = os.environ.get("HF_HUB_ETAG_TIMEOUT")
    return float(value) if value else DEFAULT_METADATA_TIMEOUT_S


def header_timeout_s() -> float:
    value = os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT")
    return float(value) if value else DEFAULT_HEADER_TIMEOUT_S


def cached_file(req: HubRequest, filename: str, revision: str | None = None) -> Path | None:
    """``filename`` of ``req``'s repo at ``revision`` (default: the request's) in the HF cache, or None.

    Reads huggingface_hub's documented cache layout (``models--org--name/refs/<branch>`` holds the commit,
    ``snapshots/<commit>/<file>`` the file), as ``huggingface_hub.try_to_load_from_cache`` does, without
    importing the module that defines it (it loads the HTTP client: ~0.1 s of a cached answer's start-up).
    A test checks both agree.
    """
    repo = Path(req.cache_dir) / ("models--" + req.repo_id.replace("/", "--"))
    revision = revision or req.revision or "main"
    if not COMMIT_RE.match(revision):
        try:
            revision = (repo / "refs" / revision).read_text(encoding="utf-8").strip()
        except (OSError, ValueError):
            return None
    if not COMMIT_RE.match(revision):
        return None
    path = repo / "snapshots" / revision / filename
    return path if path.is_file() else None


def commit_of(config_path: Path) -> str | None:
    """The commit sha of a cached file (its ``snapshots/<sha>/`` folder)."""
    name = config_path.parent.name
    return name if COMMIT_RE.match(name) else None



def transport_errors() -> tuple[type[BaseException], ...]:
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



def supported(fn: Any, **kwargs: Any) -> dict[str, Any]:
    """The ``kwargs`` that ``fn`` accepts (keyword names differ across huggingface_hub versions)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}
