"""The one reader for user files: bytes -> text -> JSON, with one-line errors and bounded work.

Every file kvplan reads on a user's behalf (config.json, a safetensors index, YAML scenario files, JSONL
traces, files from the Hugging Face cache) goes through :func:`read_text`, and JSON through
:func:`parse_json` / :func:`read_json`. What can go wrong with a file becomes a :class:`KvplanError`
subclass (``ConfigError`` unless the caller names another) whose one line names the file, never a
traceback:

- missing, unreadable, a directory: ``cannot read`` with the OS's reason;
- larger than ``max_bytes`` (default :data:`MAX_FILE_BYTES`): refused before it is read;
- binary (a NUL byte) or not UTF-8: the byte offset of the first bad byte;
- JSON: syntax errors with line and column; integers longer than Python's 4,300-digit conversion limit;
  nesting deeper than :data:`MAX_JSON_DEPTH` (and the parser's own recursion limit); optionally duplicate
  keys.

``Infinity``, ``-Infinity`` and ``NaN`` (what Python's and transformers' ``json.dumps`` write for
non-finite floats) are accepted and kept as floats: whether a non-finite value is acceptable depends on
the field, which only the code reading that field knows (:mod:`kvplan.model.spec` rejects them in sizing fields).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvplan.errors import ConfigError, KvplanError

# Largest file kvplan reads (bytes): config.json files are kilobytes and sharded safetensors indexes a few
# megabytes; anything near this bound is not a config.
MAX_FILE_BYTES = 64 * 2**20
# Deepest JSON nesting accepted (arrays and objects). Real configs nest 3-4 levels; the bound keeps any
# later recursive walk (repr in an error message, a comparison) far from Python's recursion limit.
MAX_JSON_DEPTH = 100
# Python refuses to convert longer integer strings (sys.get_int_max_str_digits(), CVE-2020-10735).
MAX_INT_DIGITS = 4300
_CHUNK_BYTES = 1 << 18

_BOM = "\ufeff"


def read_bytes(path: str | Path, what: str = "file", *, display: str | None = None,
               max_bytes: int = MAX_FILE_BYTES, error: type[KvplanError] = ConfigError) -> bytes:
    """The bytes of ``path`` (at most ``max_bytes``), or ``error`` naming ``display`` (default: the path).

    ``what`` names the kind of file in messages (``"config.json"``, ``"capacity file"``).
    """
    path = Path(path)
    name = display or str(path)
    try:
        with path.open("rb") as fh:
            chunks, size = [], 0
            while size <= max_bytes:  # in chunks: read(max_bytes + 1) allocates the whole bound up front
                chunk = fh.read(min(_CHUNK_BYTES, max_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
    except FileNotFoundError:
        raise error(f"{name}: no such file") from None
    except IsADirectoryError:
        raise error(f"{name}: is a directory, expected a {what}") from None
    except OSError as exc:
        raise error(f"{name}: cannot read ({exc.strerror or type(exc).__name__})") from None
    if len(data) > max_bytes:
        raise error(f"{name}: larger than {max_bytes:,} bytes; not a {what}",
                    f"a {what} is a small text file: check the path")
    return data


def decode_text(data: bytes, name: str, what: str = "file", *, error: type[KvplanError] = ConfigError) -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped); binary or invalid UTF-8 -> ``error``."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise error(f"{name}: binary data (a NUL byte at offset {nul}), not a text {what}",
                    f"a {what} is UTF-8 text: check the path")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start:exc.start + 1].hex()
        raise error(f"{name}: not valid UTF-8 (byte 0x{bad} at offset {exc.start})",
                    f"save the {what} as UTF-8") from None
    return text.removeprefix(_BOM)


def read_text(path: str | Path, what: str = "file", *, display: str | None = None,
              max_bytes: int = MAX_FILE_BYTES, error: type[KvplanError] = ConfigError) -> str:
    """The UTF-8 text of ``path``: :func:`read_bytes` then :func:`decode_text` (same errors)."""
    data = read_bytes(path, what, display=display, max_bytes=max_bytes, error=error)
    return decode_text(data, display or str(path), what, error=error)


def parse_json(text: str, where: str, *, reject_duplicates: bool = False,
               error: type[KvplanError] = ConfigError) -> Any:
    """Parse JSON ``text`` (named ``where`` in errors). Non-finite floats are kept (see module docstring).

    ``reject_duplicates``: a key repeated in one object is an error (default: the last one wins, as in
    ``json.loads`` and transformers).
    """

    def parse_int(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise _TooLong(len(digits.lstrip("-")))
        return int(digits)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise _Duplicate(key)
            out[key] = value
        return out

    try:
        data = json.loads(text, parse_int=parse_int, object_pairs_hook=pairs if reject_duplicates else None)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except _TooLong as exc:
        raise error(f"{where}: an integer with {exc.digits:,} digits (more than {MAX_INT_DIGITS:,}) is not a "
                    "valid value") from None
    except _Duplicate as exc:
        raise error(f"{where}: key {exc.key!r} appears twice in one object") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)") from None
    depth = _depth(data)
    if depth > MAX_JSON_DEPTH:
        raise error(f"{where}: JSON nested {depth} levels deep (more than {MAX_JSON_DEPTH})")
    return data


def read_json(path: str | Path, what: str = "JSON file", *, display: str | None = None,
              max_bytes: int = MAX_FILE_BYTES, reject_duplicates: bool = False,
              error: type[KvplanError] = ConfigError) -> Any:
    """Read and parse the JSON file ``path`` (:func:`read_text` then :func:`parse_json`)."""
    text = read_text(path, what, display=display, max_bytes=max_bytes, error=error)
    return parse_json(text, display or str(path), reject_duplicates=reject_duplicates, error=error)


def read_json_object(path: str | Path, what: str = "JSON file", *, display: str | None = None,
                     error: type[KvplanError] = ConfigError) -> dict[str, Any]:
    """:func:`read_json`, and the top level must be an object (``error`` otherwise)."""
    data = read_json(path, what, display=display, error=error)
    if not isinstance(data, dict):
        raise error(f"{display or path}: expected a JSON object, got {_json_type(data)}")
    return data


class _TooLong(Exception):
    def __init__(self, digits: int) -> None:
        super().__init__(digits)
        self.digits = digits


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _depth(data: Any) -> int:
    """Nesting depth of parsed JSON (a scalar is 0, ``[]`` is 1), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        stack.extend((child, level + 1) for child in children)
    return deepest


def _json_type(data: Any) -> str:
    """The JSON name of a parsed value's type (``array``, ``string``, ``number``...)."""
    if isinstance(data, list):
        return "an array"
    if isinstance(data, str):
        return "a string"
    if isinstance(data, bool):
        return "a boolean"
    if data is None:
        return "null"
    return "a number"


BUNDLED_INDEX = Path(__file__).resolve().parents[1] / "data" / "bundled_index.json"
"""Every YAML file kvplan ships, parsed: ``{digest of its text: its data as JSON text}`` (written by
benchmarks/gen_bundled_index.py, kept current by a test)."""


def text_digest(text: str) -> str:
    """A shipped file's key in :data:`BUNDLED_INDEX`: two checksums of its UTF-8 bytes and their length."""
    import zlib

    raw = text.encode("utf-8")
    return f"{zlib.crc32(raw):08x}{zlib.adler32(raw):08x}-{len(raw)}"


def bundled_index_text(texts: list[str]) -> str:
    """The :data:`BUNDLED_INDEX` file for the shipped files' ``texts``: each parsed as
    :func:`parse_bundled_yaml` parses it, kept when JSON holds the same data (else it is read as YAML)."""
    import yaml

    index = {}
    for text in texts:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader
        encoded = json.dumps(data, sort_keys=True, separators=(",", ":"))
        if json.loads(encoded) == data:
            index[text_digest(text)] = encoded
    return json.dumps(dict(sorted(index.items())), indent=0) + "\n"


_INDEX: list[dict[str, str]] = []


def _bundled_data(text: str) -> Any:
    """``text``'s data from :data:`BUNDLED_INDEX` (a fresh object each call), or None when it is not there."""
    if not _INDEX:
        try:
            _INDEX.append(json.loads(BUNDLED_INDEX.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            _INDEX.append({})
    encoded = _INDEX[0].get(text_digest(text))
    return None if encoded is None else json.loads(encoded)


def parse_bundled_yaml(text: str, where: str) -> Any:
    """Parse a YAML file kvplan ships (the GPU catalogue, bundled model specs) with safe loading.

    The parsed files are in :data:`BUNDLED_INDEX` (JSON, keyed by the text's digest), so a shipped file that
    has not changed costs no PyYAML import; any other text is parsed with libyaml's ``CSafeLoader`` when PyYAML
    was built with it (about 10x faster than the pure-Python loader), else ``SafeLoader``. User-written YAML
    (scenario and capacity files) goes through :mod:`kvplan.io.yamldoc`'s loader instead, which keeps
    node positions for file:line:col errors.
    """
    data = _bundled_data(text)
    if data is not None:
        return data
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({exc})".replace("\n", " ")) from None
