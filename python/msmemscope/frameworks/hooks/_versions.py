"""The original msMemScope's version keys: ``"2.6+"`` (2.6 and later), ``"2.6-2.9"`` (every 2.6 to
2.9 release, patches included, not 2.10), ``"11.0"`` (that release line only)."""

from __future__ import annotations

import re

_NUMBER = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?")


def release(text: str) -> tuple[int, int] | None:
    """(major, minor) of a version such as ``2.15.0+cu132``, ``0.9.1`` or ``2.10.0a0``."""
    m = _NUMBER.match(text or "")
    if not m:
        return None
    return int(m.group(1)), int(m.group(2) or 0)


class VersionKey:
    """A parsed version key; ``contains`` tells whether a (major, minor) release falls in it."""

    def __init__(self, key: str):
        self.key = key
        text = key.strip()
        if text.endswith("+"):
            low = release(text[:-1])
            high = None
        elif "-" in text:
            a, _, b = text.partition("-")
            low, high = release(a), release(b)
        else:
            low = high = release(text)
        if low is None or ("-" in text and high is None) or not _is_key(text):
            raise ValueError(f"bad version key {key!r}")
        self.low = low
        self.high = high

    def contains(self, rel: tuple[int, int]) -> bool:
        if rel < self.low:
            return False
        return self.high is None or rel <= self.high

    def __str__(self) -> str:
        return self.key


def _is_key(text: str) -> bool:
    return bool(re.fullmatch(r"\d+(\.\d+)?(\+|-\d+(\.\d+)?)?", text))
