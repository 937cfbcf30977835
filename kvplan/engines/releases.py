"""Engine version strings: parsing (PEP 440 and the odd forms logs print), the ranges of the modelled releases, and
which modelled release a version resolves to.
"""

from __future__ import annotations

import re

from kvplan.errors import InputError

_PLAIN_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)$")


def release_tuple(text: str, engine: str) -> tuple[int, int, int]:
    """``(major, minor, micro)`` of a PEP 440 version string; pre-, dev-, post-releases and local labels
    (``0.15.2rc1.dev93+g11a4c9d30``) count as the release they are numbered after (0.15.2).

    Plain versions (``0.19.0``, ``0.10.1.1``) are parsed without importing ``packaging``.
    """
    text = str(text).strip()
    plain = _PLAIN_VERSION.match(text)
    if plain:
        parts = tuple(int(p) for p in plain.group(1).split("."))
    else:
        from packaging.version import InvalidVersion, Version

        try:
            parts = Version(text).release
        except InvalidVersion:
            raise InputError(f"invalid --engine-version {text!r} for {engine}",
                             "write a version such as 0.19.0 or 0.15.2rc1.dev93+g11a4c9d30 (PEP 440)") from None
    padded = (parts + (0, 0, 0))[:3]
    return padded[0], padded[1], padded[2]


def _fmt_release(release: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in release)


def release_ranges(firsts: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """Each modelled release's range as text: ``"0.18.0 - 0.19.x"`` (the next one's first release bounds it)."""
    keys = list(firsts)
    out = {}
    for i, key in enumerate(keys):
        first = _fmt_release(firsts[key])
        if i + 1 == len(keys):
            out[key] = f"{first} and later"
            continue
        nxt = firsts[keys[i + 1]]
        if len(nxt) >= 3 and nxt[2] > 0:
            last = f"{nxt[0]}.{nxt[1]}.{nxt[2] - 1}"
        elif nxt[1] > 0:
            last = f"{nxt[0]}.{nxt[1] - 1}.x"
        else:
            last = f"< {_fmt_release(nxt)}"
        out[key] = first if last == first else f"{first} - {last}"
    return out


def resolve_release(engine: str, text: str, firsts: dict[str, tuple[int, ...]]) -> tuple[str, str]:
    """The modelled release covering version ``text`` and a note naming it.

    ``firsts`` maps each modelled release (oldest first) to the first version it covers; a release
    covers everything up to the next one's first version, the newest one everything after it.
    Versions older than the oldest modelled release are refused, with the ranges in the message. A modelled
    release's own name selects it (SGLang ``0.5`` is the modelled 0.5, which starts at 0.5.3, although
    ``0.5`` as a version, 0.5.0, falls in 0.4's range).
    """
    release, name = release_tuple(text, engine), str(text).strip()
    covering = [key for key, first in firsts.items() if release >= (tuple(first) + (0, 0, 0))[:3]]
    chosen = name if name in firsts else (covering[-1] if covering else None)
    ranges = release_ranges(firsts)
    if chosen is None:
        listed = "; ".join(f"{key}: {rng}" for key, rng in ranges.items())
        raise InputError(f"--engine-version {text!r} is older than every modelled {engine} release",
                         f"modelled releases: {listed}")
    return chosen, f"{engine} {text}: rules of modelled release {chosen} (covers {ranges[chosen]})"
