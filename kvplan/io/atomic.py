"""Atomic file writes: a file is either its old content or its complete new content, never half-written.

Each file is written to a temporary file in the same folder (same filesystem), flushed and fsynced, then
moved over the target with ``os.replace`` (atomic on POSIX and Windows). :class:`AtomicFiles` does this
in two phases for a set of files, which may be streamed (``open``) or given whole (``write``): every
temporary file is complete before the first is moved into place, so an error while rendering or writing
leaves every target untouched.

Temporary files are named ``.NAME.PID.RANDOM.tmp``. A process killed with ``kill -9`` cannot remove its
own; the next write into that folder removes those of processes that no longer run (and legacy ones
without a PID once they are an hour old), so they never pile up.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import IO, Any, Mapping

from kvplan.errors import InputError

_TEMP = re.compile(r"^\.(?P<name>.+?)\.(?:(?P<pid>\d+)\.)?[A-Za-z0-9_]+\.tmp$")
LEGACY_TEMP_AGE_S = 3600.0  # a temporary file without a PID is stale after an hour


def check_writable(path: str | Path, what: str = "output", writes: str | None = None) -> Path:
    """Raise :class:`InputError` now, before any work, when ``path`` could not be written later.

    ``path`` must not be a folder, and its nearest existing ancestor must be a folder we may write in
    (missing folders are created when the file is written). ``writes``: the format to be written (a key of
    :data:`kvplan.io.kinds.FORMATS`); an existing file of another kind is refused, never replaced.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"cannot write {what} {path}: it is a folder", "give a file name")
    if writes is not None:
        from kvplan.io.kinds import check_replaceable

        check_replaceable(path, what, writes)
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"cannot write {what} {path}: {ancestor} is not a folder")
    import tempfile  # here, not at the top: a run that writes nothing imports neither tempfile nor secrets

    try:  # a real probe: permissions, read-only filesystems and root all answer the same way
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as exc:
        raise InputError(f"cannot write {what} {path}: {ancestor} is not writable ({exc.strerror or exc})") from None
    return path


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists
        return True
    return True


def clean_stale_temps(folder: Path, name: str | None = None) -> list[Path]:
    """Remove temporary files left in ``folder`` by killed writers (of ``name`` only, when given)."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        m = _TEMP.match(entry.name)
        if not m or (name is not None and m.group("name") != name) or not entry.is_file(follow_symlinks=False):
            continue
        pid = m.group("pid")
        try:
            stale = (not _pid_running(int(pid))) if pid else now - entry.stat().st_mtime > LEGACY_TEMP_AGE_S
            if stale and (pid is None or int(pid) != os.getpid()):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


class AtomicFiles:
    """A set of files written all-or-nothing.

    ``open(path)`` gives a file to stream into, ``write(path, data)`` writes one whole; ``commit()`` moves
    every one into place, ``discard()`` removes every temporary file (and folders made for them). As a
    context manager: commit on success, discard on an exception. Errors are :class:`InputError` naming
    the path.
    """

    def __init__(self) -> None:
        self._temps: dict[Path, tuple[Path, IO[Any]]] = {}
        self._made: list[Path] = []  # folders created here, removed again on discard
        self._cleaned: set[Path] = set()

    def __enter__(self) -> "AtomicFiles":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()

    def _folder(self, path: Path) -> None:
        if not path.parent.is_dir():
            missing = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InputError(f"cannot write {path}: cannot create {path.parent} ({exc.strerror or exc})") from None
            self._made.extend(reversed(missing))
        if path.parent not in self._cleaned:
            self._cleaned.add(path.parent)
            clean_stale_temps(path.parent)

    def open(self, path: str | Path, text: bool = True) -> IO[Any]:
        """A new temporary file beside ``path`` (UTF-8 text, or binary), replacing ``path`` on commit."""
        path = Path(path)
        if path in self._temps:
            raise InputError(f"cannot write {path} twice")
        self._folder(path)
        import secrets

        temp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            fh = os.fdopen(fd, "w", encoding="utf-8", newline="") if text else os.fdopen(fd, "wb")
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        self._temps[path] = (temp, fh)
        return fh

    def write(self, path: str | Path, data: bytes | str) -> None:
        fh = self.open(path, text=isinstance(data, str))
        try:
            fh.write(data)
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None

    def commit(self) -> list[Path]:
        """Flush, fsync and close every file, then move each into place. Returns the paths written."""
        try:
            for path, (temp, fh) in self._temps.items():
                try:
                    fh.flush()
                    os.fsync(fh.fileno())
                    fh.close()
                except OSError as exc:
                    raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
            for path, (temp, _) in self._temps.items():
                try:
                    os.replace(temp, path)
                except OSError as exc:
                    raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        except BaseException:
            self.discard()
            raise
        written = list(self._temps)
        self._temps.clear()
        self._made.clear()
        return written

    def discard(self) -> None:
        for _, (temp, fh) in self._temps.items():
            try:
                fh.close()
            except OSError:
                pass
            temp.unlink(missing_ok=True)
        self._temps.clear()
        for folder in reversed(self._made):
            try:
                folder.rmdir()
            except OSError:
                pass
        self._made.clear()


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` atomically (str is written as UTF-8)."""
    write_files({Path(path): data})


def write_files(files: Mapping[Path, bytes | str]) -> None:
    """Write every file atomically, all-or-nothing as far as the filesystem allows (see :class:`AtomicFiles`)."""
    with AtomicFiles() as out:
        for path, data in files.items():
            out.write(path, data)
