"""What one test did with memory, from the rows the tracker wrote while it ran.

The tracker's event stream is the dump (both captures, native and the dispatch-mode fallback,
write the same MALLOC/FREE rows), so the plugin reads the rows of a test's window back from the
run's dump files and accounts them here. Only blocks allocated inside the window count: a block
that was alive when the test started and is freed during it has no MALLOC row here and is left
out, so the peak is of the memory the test itself allocated (as pytest-memray counts it).

Pure: rows in, figures out; the tests feed it hand-made rows.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .limits import DeviceSelector

__all__ = ["Block", "Site", "SiteNamer", "TensorUsage", "parse_rows", "top_sites"]

HEADER = (
    "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,"
    "Call Stack(Python),Call Stack(C)"
)
_ID, _EVENT, _TYPE, _DEVICE, _PTR, _ATTR, _PYSTACK = 0, 1, 2, 7, 8, 9, 10


@dataclass(frozen=True)
class Block:
    """One tensor block allocated in the window: its MALLOC row's ID, size and device (as the
    Device Id column: ``cpu``, ``0``...), and the Python stack, innermost frame first."""

    row_id: int
    size: int
    device: str
    frames: tuple[str, ...]


@dataclass(frozen=True)
class _Event:
    row_id: int
    malloc: bool
    key: tuple[str, str]
    block: Block | None  # MALLOC rows only


def parse_rows(text: str) -> list[_Event]:
    """The PTA MALLOC/FREE rows of a piece of a dump file (whole rows, header or not)."""
    events = []
    for row in csv.reader(io.StringIO(text, newline="")):
        if len(row) < 11 or row[_EVENT] not in ("MALLOC", "FREE") or row[_TYPE] != "PTA":
            continue
        device = row[_DEVICE]
        try:
            row_id = int(row[_ID])
            attrs = json.loads(row[_ATTR])
        except ValueError:
            continue  # not a row this plugin wrote (the header, a hand-edited file)
        # The allocation id pairs a FREE with its MALLOC; the address does when it is missing.
        aid = attrs.get("allocation_id") or row[_PTR]
        key = (device, str(aid))
        if row[_EVENT] == "FREE":
            events.append(_Event(row_id, False, key, None))
            continue
        frames = tuple(line for line in row[_PYSTACK].splitlines() if line)
        block = Block(row_id, int(attrs.get("size", 0)), device, frames)
        events.append(_Event(row_id, True, key, block))
    return events


def _apply(live: dict[tuple[str, str], Block], e: _Event, device: DeviceSelector) -> int:
    """Applies one row to the live blocks of ``device``; returns the change in live bytes."""
    if not e.malloc:
        gone = live.pop(e.key, None)
        return -gone.size if gone is not None else 0  # not ours: allocated before the window
    assert e.block is not None
    if not device.matches(e.block.device):
        return 0
    old = live.pop(e.key, None)
    live[e.key] = e.block
    return e.block.size - (old.size if old is not None else 0)


class TensorUsage:
    """The blocks a test allocated and when each was freed, in row order."""

    def __init__(self, events: Iterable[_Event]):
        self.events = sorted(events, key=lambda e: e.row_id)

    def live_after(self, device: DeviceSelector, last: int | None = None) -> list[Block]:
        """The blocks of ``device`` alive after row ``last`` (an index; None: all rows)."""
        live: dict[tuple[str, str], Block] = {}
        for e in self.events if last is None else self.events[: last + 1]:
            _apply(live, e, device)
        return list(live.values())

    def peak(self, device: DeviceSelector) -> tuple[int, list[Block]]:
        """The most bytes alive at once on ``device`` and the blocks alive at that moment (the
        first moment, when it is reached more than once)."""
        live: dict[tuple[str, str], Block] = {}
        total = best = 0
        at = None
        for i, e in enumerate(self.events):
            total += _apply(live, e, device)
            if total > best:
                best, at = total, i
        if at is None:
            return 0, []
        return best, self.live_after(device, at)

    def alive_at_end(self, device: DeviceSelector) -> tuple[int, list[Block]]:
        """Bytes and blocks allocated in the window and not freed by its end."""
        blocks = self.live_after(device)
        return sum(b.size for b in blocks), blocks


_FRAME = re.compile(r"(?P<file>.*)\((?P<line>\d+)\): (?P<func>.*)")


@dataclass(frozen=True)
class Site:
    """Where blocks were allocated, and how many bytes in how many blocks."""

    where: str
    size: int
    count: int


class SiteNamer:
    """Names an allocating site by the innermost frame in the test's own file (the test's line,
    not PyTorch's internals nor a helper's), else by the innermost frame; paths under the
    rootdir relative to it."""

    def __init__(self, test_file: str | os.PathLike[str], rootdir: str | os.PathLike[str]):
        self.test_file = os.path.realpath(test_file)
        self.rootdir = os.path.realpath(rootdir)
        self._real: dict[str, str] = {}

    def _realpath(self, path: str) -> str:
        real = self._real.get(path)
        if real is None:
            real = self._real[path] = os.path.realpath(path)
        return real

    def name(self, frames: Sequence[str]) -> str:
        parsed = [m for m in (_FRAME.fullmatch(f.strip()) for f in frames) if m]
        if not parsed:
            return "<no Python stack>"
        chosen = next((m for m in parsed if self._realpath(m["file"]) == self.test_file), parsed[0])
        path = self._realpath(chosen["file"])
        if path.startswith(self.rootdir + os.sep):
            path = os.path.relpath(path, self.rootdir)
        return f"{path}:{chosen['line']} ({chosen['func']})"


def top_sites(items: Iterable[tuple[str, int, int]], n: int) -> list[Site]:
    """The ``n`` sites with the most bytes from (site, bytes, blocks) items, largest first."""
    sums: dict[str, list[int]] = {}
    for where, size, count in items:
        acc = sums.setdefault(where, [0, 0])
        acc[0] += size
        acc[1] += count
    ranked = sorted(sums.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [Site(where, size, count) for where, (size, count) in ranked[:n]]
