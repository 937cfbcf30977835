"""Atomic file writes: a file is either its old content or its complete new content, never half-written.

Each file is written to a temporary file in the same folder (same filesystem), flushed and fsynced, then
moved over the target with ``os.replace`` (atomic on POSIX and Windows). :func:`write_files` does this
in two phases for a set of files: every temporary file is complete before the first is moved into place,
so an error while rendering or writing leaves every target untouched.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Mapping

from kvplan.errors import InputError


def check_writable(path: str | Path, what: str = "output") -> Path:
    """Raise :class:`InputError` now, before any work, when ``path`` could not be written later.

    ``path`` must not be a folder, and its nearest existing ancestor must be a folder we may write in
    (missing folders are created when the file is written).
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"cannot write {what} {path}: it is a folder", "give a file name")
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"cannot write {what} {path}: {ancestor} is not a folder")
    try:  # a real probe: permissions, read-only filesystems and root all answer the same way
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as exc:
        raise InputError(f"cannot write {what} {path}: {ancestor} is not writable ({exc.strerror or exc})") from None
    return path


def _temp_beside(path: Path, data: bytes) -> Path:
    """Write ``data`` to a new temporary file in ``path``'s folder; returns its path."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(name, 0o644)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` atomically (str is written as UTF-8)."""
    write_files({Path(path): data})


def write_files(files: Mapping[Path, bytes | str]) -> None:
    """Write every file atomically, all-or-nothing as far as the filesystem allows.

    Phase 1 writes all temporary files (any failure removes them and leaves the targets untouched);
    phase 2 moves each into place with ``os.replace``. Missing folders are created (and removed again on
    failure). Raises :class:`InputError` naming the path when a folder cannot be created or written.
    """
    temps: list[tuple[Path, Path]] = []
    made: list[Path] = []  # folders created here, removed again if anything fails
    done = False
    try:
        for path, data in files.items():
            path = Path(path)
            if not path.parent.is_dir():
                missing = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise InputError(f"cannot write {path}: cannot create {path.parent} ({exc.strerror or exc})") from None
                made.extend(reversed(missing))
            payload = data.encode("utf-8") if isinstance(data, str) else data
            try:
                temps.append((_temp_beside(path, payload), path))
            except OSError as exc:
                raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        for temp, path in temps:
            try:
                os.replace(temp, path)
            except OSError as exc:
                raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        done = True
    finally:
        for temp, _ in temps:
            temp.unlink(missing_ok=True)
        if not done:
            for folder in reversed(made):
                try:
                    folder.rmdir()
                except OSError:
                    pass
