"""Generated sections of a Markdown file, between a begin and an end marker, rewritten in place."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, section: str, begin: str, end: str, empty: str = "") -> None:
    """Put ``section`` (which holds the ``begin`` and ``end`` markers) where the markers stand in ``path``,
    or append it (to ``empty`` when the file does not exist); the rest of the file is kept."""
    text = path.read_text() if path.exists() else empty
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section.rstrip("\n") + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
