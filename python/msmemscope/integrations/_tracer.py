"""What the trainer callbacks share: the steps, the phase ranges, the findings as log values.

No framework is imported here.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Iterable
from typing import Any

from .. import _native, mstx

__all__ = ["LOG_KEYS", "Tracer", "log_values", "summary"]

LOG_KEYS = (
    "msmemscope/leak_sites",
    "msmemscope/leak_bytes_per_step",
    "msmemscope/peak_bytes",
)

# The phases labelled as MSTX ranges.
PHASES = ("train", "eval", "save")


def log_values(found: dict[str, Any] | None) -> dict[str, float]:
    """The findings as a trainer logs them (numbers only): the number of sites judged leaking,
    their bytes per step together, the highest bytes in use so far (0 when unknown)."""
    if not found or not found.get("available"):
        return {}
    sites = found.get("leak_sites") or []
    return {
        "msmemscope/leak_sites": float(len(sites)),
        "msmemscope/leak_bytes_per_step": float(found.get("leak_bytes_per_step") or 0),
        "msmemscope/peak_bytes": float(found.get("peak_bytes") or 0),
    }


def summary(found: dict[str, Any] | None, limit: int = 5) -> str:
    """The findings as text for the end of training: the leaking lines and the peak."""
    if not found or not found.get("available"):
        return "msmemscope: no findings (the program is not traced)\n"
    lines = []
    sites = found.get("leak_sites") or []
    steps = found.get("steps", 0)
    if sites:
        lines.append(f"msmemscope: {len(sites)} leak site(s) after {steps} step(s):")
        for n, site in enumerate(sites[:limit], 1):
            where = site.get("site") or "(no Python line recorded)"
            lines.append(
                f"  [{n}] {where}: +{site.get('bytes_per_step', 0)} bytes per step "
                f"on device {site.get('device')}"
            )
        if len(sites) > limit:
            lines.append(f"  ... and {len(sites) - limit} more")
    elif not found.get("leaks_analysis"):
        lines.append("msmemscope: the leaks analysis is off (--analysis)")
    else:
        lines.append(f"msmemscope: no leak sites after {steps} step(s)")
    for peak in found.get("peaks") or []:
        lines.append(
            f"msmemscope: peak on device {peak['device']}: {peak['bytes']} bytes "
            f"in use (step {peak['step']})"
        )
    return "\n".join(lines) + "\n"


class Tracer:
    """One trainer's view of msmemscope: steps, phase ranges, findings. Every call does nothing
    where the runtime is not loaded or not tracing (said once, as a warning)."""

    def __init__(self, owner: str, keep_steps: Iterable[int] = ()) -> None:
        self._owner = owner
        # Asked of the runtime once it traces (its writer exists from the first row).
        self._keep = [int(s) for s in keep_steps]
        self._warned = False
        self._ranges: dict[str, int] = {}
        self.steps_marked = 0
        self.last_findings: dict[str, Any] | None = None

    def active(self) -> bool:
        """Whether this process is traced now; warns once when not."""
        try:
            traced = _native.runtime_loaded() and _native.tracing()
        except Exception:  # a runtime that cannot answer is one that does not trace
            traced = False
        if not traced and not self._warned:
            self._warned = True
            warnings.warn(
                f"{self._owner}: msmemscope is not tracing this process (run it under "
                "`msmemscope`, or call msmemscope.start() first): the callback does nothing",
                RuntimeWarning,
                stacklevel=3,
            )
        return traced

    def step(self) -> None:
        """Starts the next msmemscope step."""
        if not self.active():
            return
        import msmemscope

        msmemscope.step()
        self.steps_marked += 1
        if self._keep and msmemscope.keep_steps(*self._keep):
            self._keep = []

    def begin(self, phase: str) -> None:
        """Opens the range of ``phase`` (once: an open one stays)."""
        if phase in self._ranges or not self.active():
            return
        self._ranges[phase] = mstx.range_start(phase)

    def end(self, phase: str) -> None:
        """Closes the range of ``phase`` if it is open."""
        range_id = self._ranges.pop(phase, None)
        if range_id is not None:
            mstx.range_end(range_id)

    def is_open(self, phase: str) -> bool:
        return phase in self._ranges

    def end_all(self) -> None:
        for phase in reversed(list(self._ranges)):  # the innermost first
            self.end(phase)

    def findings(self) -> dict[str, Any] | None:
        """The running analyses' findings so far (:func:`msmemscope.findings`); None when not
        traced or when they cannot be had."""
        if not self.active():
            return None
        try:
            found = json.loads(_native.findings())
        except Exception as e:  # an older runtime, or one that failed: the training goes on
            warnings.warn(f"{self._owner}: msmemscope findings: {e}", RuntimeWarning, stacklevel=2)
            return None
        if not isinstance(found, dict):
            return None
        self.last_findings = found
        return found

    def report(self) -> dict[str, Any] | None:
        """At the end of training: the findings, printed on stderr."""
        found = self.findings()
        if found is not None:
            sys.stderr.write(summary(found))
            sys.stderr.flush()
        return found
