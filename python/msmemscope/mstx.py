"""MSTX marks and ranges from Python (the original msMemScope's ``msmemscope.mstx``).

They go to the runtime library's MSTX C API (``mstxMarkA``, ``mstxRangeStartA``,
``mstxRangeEnd``) and become MSTX rows of the dump; ranges whose message is ``step start`` also
delimit steps.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, cast

from ._runtime import native as _native_runtime

__all__ = ["mark", "range_end", "range_start"]

_lock = threading.Lock()
# Ids returned by range_start() and not ended yet.
_open_ranges: set[int] = set()


def _check_message(message: object) -> str:
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__}")
    if not message:
        raise ValueError("message must not be empty")
    if "\0" in message:
        raise ValueError("message must not contain a NUL character")
    return message


def _stream_handle(stream: Any) -> int:
    """The stream as the C API's opaque pointer: None (0), an int, or a stream object with
    a ``cuda_stream`` (torch.cuda.Stream) or ``npu_stream`` attribute."""
    if stream is None:
        return 0
    for attr in ("cuda_stream", "npu_stream"):
        if not isinstance(stream, int) and hasattr(stream, attr):
            stream = getattr(stream, attr)
            break
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError(
            f"stream must be None, an int handle or a stream object, got {type(stream).__name__}"
        )
    if not 0 <= stream < 2**64:
        raise ValueError(f"stream handle {stream} is not a 64-bit pointer value")
    return stream


def mark(message: str, stream: Any = None) -> None:
    """Records an instantaneous mark with ``message``."""
    message = _check_message(message)
    handle = _stream_handle(stream)
    _native_runtime().mstx_mark(message, handle)


def range_start(message: str, stream: Any = None) -> int:
    """Opens a range with ``message``; returns its id for :func:`range_end` (0 when the runtime
    did not open one, e.g. nothing is being traced; ending 0 does nothing)."""
    message = _check_message(message)
    handle = _stream_handle(stream)
    if message == "step start":
        # A step boundary: the decompose analysis names the tensors made before training
        # before the runtime writes the STEP row (see msmemscope.step).
        owners = sys.modules.get("msmemscope.capture.owners")
        if owners is not None:
            owners.first_step()
    range_id = cast(int, _native_runtime().mstx_range_start(message, handle))
    if range_id:
        with _lock:
            _open_ranges.add(range_id)
    return range_id


def range_end(range_id: int) -> None:
    """Closes the range ``range_id`` returned by :func:`range_start`."""
    if isinstance(range_id, bool) or not isinstance(range_id, int):
        raise TypeError(f"range_id must be an int, got {type(range_id).__name__}")
    if range_id == 0:
        return
    with _lock:
        if range_id not in _open_ranges:
            raise ValueError(
                f"unknown range id {range_id}: not returned by range_start() or already ended"
            )
        _open_ranges.discard(range_id)
    _native_runtime().mstx_range_end(range_id)
