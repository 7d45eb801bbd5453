"""The plugin's markers read into limits: sizes, devices, and one plan per test.

Everything here is pure (no tracker, no torch), so a bad marker is refused at collection, before
any test runs, with one line that names the test, the marker, the value and what is accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    import pytest

__all__ = [
    "HOST_LEAKS",
    "LEAKS",
    "MARKERS",
    "MEMORY",
    "DeviceSelector",
    "Limit",
    "MarkerError",
    "Plan",
    "format_bytes",
    "parse_device",
    "parse_size",
    "plan_for",
]

MEMORY = "msmemscope_limit_memory"
LEAKS = "msmemscope_limit_leaks"
HOST_LEAKS = "msmemscope_limit_host_leaks"

#: Marker name -> the line `pytest --markers` shows.
MARKERS = {
    MEMORY: (
        f"{MEMORY}(size, device=None): with --msmemscope, fail the test when the peak of tensor "
        'memory it allocates (on device: "cpu", "cuda", "cuda:N"; default all devices) exceeds '
        'size ("512 KB", "1.5 MiB", "2 GB").'
    ),
    LEAKS: (
        f"{LEAKS}(size, device=None): with --msmemscope, fail the test when tensor blocks it "
        "allocated are still alive at its end (after gc.collect()) and total more than size."
    ),
    HOST_LEAKS: (
        f"{HOST_LEAKS}(size): with --msmemscope and the runtime preloaded (source msmemscope "
        "--load-api-env=host), fail the test when the host heap blocks it allocated and did not "
        "free total more than size."
    ),
}

# Decimal units are powers of 1000 and binary ones powers of 1024, as their SI and IEC names say.
_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "pb": 1000**5,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]+)\s*")
SIZE_FORMS = (
    'a number and a unit, e.g. "64 KB", "1.5 MiB", "2GB": B, KB, MB, GB, TB, PB (powers of 1000) '
    "or KiB, MiB, GiB, TiB, PiB (powers of 1024); or an int of bytes"
)
DEVICE_FORMS = (
    '"cpu", "cuda", "cuda:N" ("npu", "npu:N" as aliases of cuda), or None for all devices'
)


class MarkerError(ValueError):
    """A marker whose arguments cannot be used; the message is one line for the user."""


def parse_size(value: object) -> int:
    """Bytes of a size written as pytest-memray's markers take it (``"24 MB"``) or an int."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise MarkerError(f"size {value!r} is negative; write {SIZE_FORMS}")
        return value
    if not isinstance(value, str):
        raise MarkerError(f"size {value!r} is not a size; write {SIZE_FORMS}")
    m = _SIZE.fullmatch(value)
    unit = _UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        raise MarkerError(f"size {value!r} is not a size; write {SIZE_FORMS}")
    try:
        return int(Decimal(m.group(1)) * unit)
    except InvalidOperation as exc:  # the pattern admits only decimals; kept for safety
        raise MarkerError(f"size {value!r} is not a size; write {SIZE_FORMS}") from exc


def format_bytes(n: int, binary: bool = False) -> str:
    """``n`` for a reader, in decimal (``1.0 MB``) or binary (``976.6 KiB``) units."""
    base = 1024 if binary else 1000
    units = ("KiB", "MiB", "GiB", "TiB") if binary else ("KB", "MB", "GB", "TB")
    if n < base:
        return f"{n} B"
    value = float(n)
    for unit in units:
        value /= base
        if value < base or unit == units[-1]:
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class DeviceSelector:
    """Which dump devices a limit counts. ``kind`` None: all; ``index`` None: every index."""

    kind: str | None = None  # None, "cpu" or "cuda"
    index: int | None = None

    def matches(self, device_id: str) -> bool:
        """``device_id`` as the dump's Device Id column writes it: ``cpu``, ``0``, ``1``..."""
        if self.kind is None:
            return True
        if self.kind == "cpu":
            return device_id == "cpu"
        if device_id == "cpu" or not device_id.isdigit():
            return False
        return self.index is None or int(device_id) == self.index

    def __str__(self) -> str:
        if self.kind is None:
            return "all devices"
        if self.kind == "cuda" and self.index is None:
            return "all cuda devices"
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


_DEVICE = re.compile(r"(cpu|cuda|npu)(?::(\d+))?")


def parse_device(value: object) -> DeviceSelector:
    """The ``device=`` of a marker: None, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (a
    ``torch.device`` works too: its text is read)."""
    if value is None:
        return DeviceSelector()
    text = str(value) if type(value).__name__ == "device" else value
    m = _DEVICE.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if m is None or (m.group(1) == "cpu" and m.group(2) not in (None, "0")):
        raise MarkerError(f"device {value!r} is not a device; write {DEVICE_FORMS}")
    if m.group(1) == "cpu":
        return DeviceSelector("cpu")
    return DeviceSelector("cuda", None if m.group(2) is None else int(m.group(2)))


@dataclass(frozen=True)
class Limit:
    """One marker's limit: ``kind`` is the marker name, ``written`` the size as given."""

    kind: str
    limit: int
    written: str
    device: DeviceSelector

    @property
    def binary(self) -> bool:
        """Whether the user wrote the limit in binary units (figures are shown in them too)."""
        return self.written.strip().lower().endswith("ib")


@dataclass(frozen=True)
class Plan:
    """What to check for one test: tensor limits, or one host-leak limit (not both: the
    runtime records either the tensor trace or a host-leak window)."""

    tensor: tuple[Limit, ...] = ()
    host: Limit | None = None

    def __bool__(self) -> bool:
        return bool(self.tensor) or self.host is not None


def _limit_of(mark: pytest.Mark, allow_device: bool) -> Limit:
    """The limit one marker sets; MarkerError (without the test's name) when it is malformed."""
    args, kwargs = list(mark.args), dict(mark.kwargs)
    if "size" in kwargs:
        args.insert(0, kwargs.pop("size"))
    if "device" in kwargs:
        args.append(kwargs.pop("device"))
    if kwargs:
        raise MarkerError(f"unknown argument {', '.join(sorted(kwargs))}")
    if not args:
        raise MarkerError(f"a size is required; write {SIZE_FORMS}")
    if not allow_device and len(args) > 1:
        raise MarkerError("takes one size and no device (host heap blocks have none)")
    if len(args) > 2:
        raise MarkerError(f"takes one size and a device, got {len(args)} arguments")
    size = args[0]
    device = args[1] if len(args) > 1 else None
    return Limit(
        kind=mark.name,
        limit=parse_size(size),
        written=size if isinstance(size, str) else f"{size} B",
        device=parse_device(device),
    )


def plan_for(marks: Iterable[pytest.Mark]) -> Plan:
    """The plan of a test from its markers, closest first (as ``item.iter_markers()`` gives
    them): for each (marker, device) the closest one holds. MarkerError names the marker."""
    tensor: dict[tuple[str, DeviceSelector], Limit] = {}
    host = None
    for mark in marks:
        if mark.name not in MARKERS:
            continue
        try:
            limit = _limit_of(mark, allow_device=mark.name != HOST_LEAKS)
        except MarkerError as exc:
            raise MarkerError(f"{mark.name}: {exc}") from None
        if mark.name == HOST_LEAKS:
            host = host or limit
        else:
            tensor.setdefault((limit.kind, limit.device), limit)
    if host is not None and tensor:
        raise MarkerError(
            f"{HOST_LEAKS} cannot be combined with {MEMORY} or {LEAKS} on one test (the runtime "
            "records either a host-leak window or the tensor trace); split the test"
        )
    return Plan(tensor=tuple(tensor.values()), host=host)
