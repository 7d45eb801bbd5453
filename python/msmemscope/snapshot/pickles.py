"""Snapshots around calls, the snapshot framework hooks' common part: SNAPSHOT rows
(:func:`msmemscope.snapshot.take_snapshot`) before and after a framework's key functions and, on
CUDA, the caching allocator's own snapshot as a pickle that PyTorch's memory viewer
(``torch.cuda._memory_viz``, pytorch.org/memory_viz) reads.

Nothing here raises into the program: each function takes the caller's ``report``, which gets
every exception (the framework hooks pass theirs, which prints the first one on stderr)."""

from __future__ import annotations

import itertools
import os
import pickle
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

Report = Callable[[BaseException], None]

_inside = threading.local()  # .points: names of the key functions running on this thread
_counter = itertools.count(1)
_history_started = False


def _cuda_ready() -> ModuleType | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch
    except Exception:
        return None
    return None


def start_history(report: Report) -> bool:
    """Starts the caching allocator's allocation history (so the pickles carry the events
    between snapshots, not only the segments); ``False`` without an initialized CUDA."""
    global _history_started
    torch = _cuda_ready()
    if torch is None or _history_started:
        return _history_started
    try:
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        _history_started = True
    except Exception as exc:
        report(exc)
    return _history_started


def stop_history(report: Report) -> None:
    global _history_started
    if not _history_started:
        return
    _history_started = False
    try:
        torch = sys.modules["torch"]  # imported: the history was started
        torch.cuda.memory._record_memory_history(enabled=None)
    except Exception as exc:
        report(exc)


def pickle_path(name: str, report: Report) -> str | None:
    """Where the CUDA snapshot of point ``name`` goes: ``{run dir}/snapshot/``."""
    from .._runtime import native

    try:
        run_dir = native().run_dir()
    except Exception as exc:
        report(exc)
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return os.path.join(run_dir, "snapshot", f"memory_snapshot_{next(_counter):04d}_{safe}.pickle")


def dump_cuda_snapshot(name: str, report: Report) -> str | None:
    """Writes ``torch.cuda.memory._snapshot()`` to :func:`pickle_path`; the path, or ``None``
    without CUDA."""
    torch = _cuda_ready()
    if torch is None:
        return None
    start_history(report)
    path = pickle_path(name, report)
    if path is None:
        return None
    snapshot = torch.cuda.memory._snapshot()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)
    return path


def take(name: str, report: Report, with_pickle: bool = True) -> None:
    """One SNAPSHOT row per device named ``name`` (and the CUDA pickle); never raises."""
    try:
        from . import take_snapshot

        take_snapshot(name=name)
        if with_pickle:
            dump_cuda_snapshot(name, report)
    except Exception as exc:
        report(exc)


def around(
    point: str, report: Report, pickle_calls: int | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrapper maker: snapshots ``{point}@before`` and ``{point}@after`` around a call (an
    exception is ``{point}@error``). Nested calls of the same point on one thread (a chained
    optimizer stepping its parts) take no snapshots of their own. ``pickle_calls``: how many
    calls also write CUDA pickles (``None``: all)."""
    calls = itertools.count(1)

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            points = getattr(_inside, "points", None)
            if points is None:
                points = _inside.points = set()
            if point in points:
                return original(*args, **kwargs)
            points.add(point)
            with_pickle = pickle_calls is None or next(calls) <= pickle_calls
            try:
                take(f"{point}@before", report, with_pickle)
                try:
                    out = original(*args, **kwargs)
                except BaseException:
                    take(f"{point}@error", report, with_pickle)
                    raise
                take(f"{point}@after", report, with_pickle)
                return out
            finally:
                points.discard(point)

        return wrapper

    return make
