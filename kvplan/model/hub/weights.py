"""Weight facts of a Hub model without downloading weights: the Hub's safetensors parameters per dtype (its model
info: one request), safetensors headers (online, or cached), kvplan's summary of the facts it read online (``HF_HOME/assets/kvplan/<org>--<name>/weights/<commit>.json``), or the
cached index's ``total_size``."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvplan.io.atomic import write_atomic
from kvplan.errors import KvplanError
from kvplan.io.files import decode_text, parse_json, read_json
from kvplan.model.hub.request import (MAX_SAFETENSORS_HEADER_BYTES, SAFETENSORS_FILE, SAFETENSORS_INDEX_FILE, HubRequest,
                                cached_file, header_timeout_s, supported, transport_errors)
from kvplan.model.source import SAFETENSORS_DTYPE_BITS, WeightFacts, weights_from_index
from kvplan.units import cdiv


def online_weights(req: HubRequest, commit: str | None) -> tuple[WeightFacts | None, str]:
    """Weight facts from the Hub: its model info's safetensors parameters per dtype (one request), else the
    safetensors headers (a request per file and shard index), falling back to the cached index."""
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hf_errors

    not_safetensors = getattr(hf_errors, "NotASafetensorsRepoError", None)
    parsing = getattr(hf_errors, "SafetensorsParsingError", ValueError)
    api = HfApi(endpoint=req.endpoint, token=req.token)
    facts = _model_info_weights(api, req, commit, (hf_errors.HfHubHTTPError, parsing))
    if facts is not None:
        if commit:
            _remember_weights(req, commit, facts)
        return facts, ""
    try:
        meta = api.get_safetensors_metadata(
            req.repo_id,
            revision=commit or req.revision,
            token=req.token,
            **supported(api.get_safetensors_metadata, timeout=header_timeout_s()),
        )
    except Exception as exc:  # noqa: BLE001 - narrowed below
        if not_safetensors is not None and isinstance(exc, not_safetensors):
            return None, "no safetensors weights in the repository: weight size unknown"
        if not isinstance(exc, (parsing, OSError, ValueError, KeyError, *transport_errors())):
            raise
        facts = cached_weights(req, commit)
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
        return cached_weights(req, commit), "safetensors headers malformed (a tensor shape is not a list of integers)"
    if commit:
        _remember_weights(req, commit, facts)
    return facts, ""


def _model_info_weights(api: Any, req: HubRequest, commit: str | None,
                        hub_errors: tuple[type[BaseException], ...]) -> WeightFacts | None:
    """Weight facts from the Hub's model info (``expand=["safetensors"]``: parameters per dtype, which the Hub
    reads from the safetensors headers), or None when it has none or names a dtype whose size kvplan does not
    know (the headers' byte offsets then tell). Bytes per dtype: ``ceil(elements x bits / 8)``."""
    revision = commit or req.revision
    try:
        info = api.model_info(req.repo_id, revision=revision, token=req.token, expand=["safetensors"],
                              **supported(api.model_info, timeout=header_timeout_s()))
    except (*hub_errors, OSError, ValueError, KeyError, TypeError, *transport_errors()):
        return None
    parameters = getattr(getattr(info, "safetensors", None), "parameters", None)
    if not isinstance(parameters, dict) or not parameters:
        return None
    by_dtype: dict[str, int] = {}
    total_bytes = 0
    for dtype, count in parameters.items():
        bits = SAFETENSORS_DTYPE_BITS.get(str(dtype).upper())
        if bits is None or not isinstance(count, int) or isinstance(count, bool) or count < 0:
            return None
        by_dtype[str(dtype)] = count
        total_bytes += cdiv(count * bits, 8)
    main = max(by_dtype, key=lambda d: by_dtype[d])
    return WeightFacts(total_bytes=total_bytes or None, parameters=sum(by_dtype.values()) or None, dtype=main,
                       params_by_dtype=MappingProxyType(dict(sorted(by_dtype.items()))),
                       source=f"safetensors metadata (the Hub's parameters per dtype) at {revision or 'main'}")


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


def cached_weights(req: HubRequest, commit: str | None) -> WeightFacts | None:
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


def _summary_path(req: HubRequest, commit: str) -> Path:
    """kvplan's summary of a commit's safetensors headers, in huggingface_hub's assets folder (the layout
    of ``huggingface_hub.cached_assets_path(library_name="kvplan", namespace=<org>--<name>, subfolder="weights")``)."""
    return Path(req.assets_dir) / "kvplan" / req.repo_id.replace("/", "--") / "weights" / f"{commit}.json"


def _remember_weights(req: HubRequest, commit: str, facts: WeightFacts) -> None:
    """Keep the header summary so cached and offline answers equal this online one (best effort)."""
    summary = {"total_bytes": facts.total_bytes, "parameters": facts.parameters, "dtype": facts.dtype,
               "params_by_dtype": dict(facts.params_by_dtype), "source": facts.source}
    path = _summary_path(req, commit)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(summary, indent=1) + "\n")
    except (OSError, KvplanError):
        pass  # a read-only assets folder only costs the next run its weight facts


def _recalled_weights(req: HubRequest, commit: str) -> WeightFacts | None:
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
