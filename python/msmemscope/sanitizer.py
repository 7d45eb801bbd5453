"""The stream-race sanitizer for custom operators (the original msMemScope's NPU Sanitizer marks).

A custom operator reports what it reads and writes with one mark on the stream it runs on::

    msmemscope.mstx.mark(
        f"sanitizer-op: name=my_ext.fused;read=a:{a.data_ptr()}:{a_bytes};"
        f"write=out:{out.data_ptr()}:{out_bytes}",
        torch.cuda.current_stream().cuda_stream,
    )

(``mstxMarkA(message, stream)`` from C/C++ is the same mark.) The runtime library checks every
such mark with its vector-clock race checker, which compares byte ranges, so a view at an offset
meets its base; the report is printed at exit and written to ``sanitizer/race_report_*.txt`` in
the run directory. Under ``msmemscope`` the marks alone are enough.

:func:`enable_npu_sanitizer` (alias :func:`enable_sanitizer`) turns the checker on from the
start, and where CUDA is available also enables PyTorch's CUDA sanitizer
(``torch.cuda._sanitizer``) and hands it every mark as a kernel launch on the mark's stream, so
custom operators join the ATen operators it already sees. Without CUDA (or without PyTorch)
only the native checker runs, and a warning says so.

Synchronizations made through CUDA are seen by the runtime itself. The functions
:func:`event_record`, :func:`stream_wait_event`, :func:`event_synchronize`,
:func:`stream_synchronize` and :func:`device_synchronize` report ones it cannot see (another
stream runtime, or a program that models its streams); they take the same handles as the marks.
"""

from __future__ import annotations

import atexit
import sys
import threading
import warnings
from typing import Any, cast

from . import _native
from ._runtime import native as _native_runtime

__all__ = [
    "device_synchronize",
    "enable_npu_sanitizer",
    "enable_sanitizer",
    "event_record",
    "event_synchronize",
    "parse_mark",
    "report",
    "stream_synchronize",
    "stream_wait_event",
]

# Synchronization kinds of the runtime's C ABI (msmemscope/sanitizer.h).
_EVENT_RECORD = 1
_STREAM_WAIT_EVENT = 2
_EVENT_SYNCHRONIZE = 3
_STREAM_SYNCHRONIZE = 4
_DEVICE_SYNCHRONIZE = 5

_lock = threading.Lock()
# The CUDA sanitizer's event handler once the bridge is on; None otherwise.
_csan_handler: Any = None
_warned_graph_mode = False


def parse_mark(message: str) -> dict[str, Any]:
    """The parts of a ``sanitizer-op:`` message: ``name`` and ``read_only``, ``read_write``
    (in place) and ``write_only`` lists of ``(alias, addr, size)``. ValueError naming the
    column and the broken rule otherwise."""
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__}")
    return _native.parse_sanitizer_mark(message)


def _handle(value: Any, what: str, attrs: tuple[str, ...]) -> int:
    """A stream or event as the integer handle the marks use: an int, or an object with one
    of ``attrs`` (``cuda_stream`` of torch.cuda.Stream, ``cuda_event`` of torch.cuda.Event)."""
    if not isinstance(value, int):
        for attr in attrs:
            if hasattr(value, attr):
                value = getattr(value, attr)
                break
    if isinstance(value, bool) or not isinstance(value, int):
        article = "an" if what[0] in "aeiou" else "a"
        raise TypeError(
            f"{what} must be an int handle or {article} {what} object, got {type(value).__name__}"
        )
    if not 0 <= value < 2**64:
        raise ValueError(f"{what} handle {value} is not a 64-bit pointer value")
    return value


def _stream(value: Any) -> int:
    return _handle(value, "stream", ("cuda_stream", "npu_stream"))


def _event(value: Any) -> int:
    return _handle(value, "event", ("cuda_event", "npu_event"))


def _torch_cuda() -> Any:
    """``torch`` when it is importable and CUDA is available, else None."""
    try:
        import torch
    except ImportError:
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


def _in_graph_mode() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.compiler.is_compiling())
    except Exception:
        return False


def _forward_to_csan(message: str, stream: int) -> None:
    """Called by the runtime for each well-formed mark: the mark as a kernel launch of the CUDA
    sanitizer on ``stream``. Its races are printed as the CUDA sanitizer prints them."""
    global _warned_graph_mode
    handler = _csan_handler
    if handler is None:
        return
    if _in_graph_mode():
        if not _warned_graph_mode:
            _warned_graph_mode = True
            warnings.warn(
                "a sanitizer-op mark was reached while torch.compile traces: the CUDA sanitizer "
                "checks marks in eager mode only, so this one is not passed to it",
                RuntimeWarning,
                stacklevel=2,
            )
        return
    op: dict[str, Any] = _native.parse_sanitizer_mark(message)  # typed as parse_mark returns it
    aliases: dict[int, list[str]] = {}
    read_only: set[int] = set()
    read_write: set[int] = set()
    for alias, addr, _size in op["read_only"]:
        read_only.add(addr)
        aliases.setdefault(addr, []).append(alias)
    for alias, addr, _size in op["read_write"] + op["write_only"]:
        read_write.add(addr)
        aliases.setdefault(addr, []).append(alias)
    read_only -= read_write
    errors = handler._handle_kernel_launch(
        stream, read_only, read_write, set(), op["name"], aliases
    )
    for error in errors:
        print(error, file=sys.stderr)


def enable_npu_sanitizer() -> None:
    """Turns the stream-race checker on; where CUDA is available, also enables PyTorch's CUDA
    sanitizer and passes it every ``sanitizer-op:`` mark (from Python or C) as a kernel launch
    on the mark's stream. Call it early, before the streams are used."""
    global _csan_handler
    nat = _native_runtime()
    torch = _torch_cuda()
    with _lock:
        if torch is None:
            nat.sanitizer_enable(None)
            warnings.warn(
                "CUDA is not available: PyTorch's CUDA sanitizer is not enabled; msmemscope's "
                "own race checker analyses the sanitizer-op marks",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        if _in_graph_mode():
            warnings.warn(
                "enable_npu_sanitizer() called while torch.compile traces: the CUDA sanitizer "
                "works in eager mode only",
                RuntimeWarning,
                stacklevel=2,
            )
        from torch.cuda import _sanitizer as csan

        if not csan.cuda_sanitizer.enabled:
            # torch defines enable_cuda_sanitizer() without annotations.
            csan.enable_cuda_sanitizer()  # type: ignore[no-untyped-call]
        _csan_handler = csan.cuda_sanitizer.dispatch.event_handler
        nat.sanitizer_enable(_forward_to_csan)
        # Marks made while the interpreter shuts down (C threads, exit handlers) no longer
        # reach Python; the native checker still counts them.
        atexit.register(nat.sanitizer_enable, None)


enable_sanitizer = enable_npu_sanitizer


def _sync(kind: int, a: int = 0, b: int = 0) -> None:
    _native_runtime().sanitizer_sync(kind, a, b)


def event_record(event: Any, stream: Any) -> None:
    """``event`` captures the work queued on ``stream`` so far."""
    e, s = _event(event), _stream(stream)
    _sync(_EVENT_RECORD, e, s)
    if _csan_handler is not None:
        _csan_handler._handle_event_record(e, s)


def stream_wait_event(stream: Any, event: Any) -> None:
    """Work queued on ``stream`` from now on waits for what ``event`` captured."""
    s, e = _stream(stream), _event(event)
    _sync(_STREAM_WAIT_EVENT, s, e)
    if _csan_handler is not None:
        _csan_handler._handle_event_wait(e, s)


def event_synchronize(event: Any) -> None:
    """The host waited for what ``event`` captured."""
    e = _event(event)
    _sync(_EVENT_SYNCHRONIZE, e)
    if _csan_handler is not None:
        _csan_handler._handle_event_synchronization(e)


def stream_synchronize(stream: Any) -> None:
    """The host waited for everything queued on ``stream``."""
    s = _stream(stream)
    _sync(_STREAM_SYNCHRONIZE, s)
    if _csan_handler is not None:
        _csan_handler._handle_stream_synchronization(s)


def device_synchronize() -> None:
    """The host waited for every stream."""
    _sync(_DEVICE_SYNCHRONIZE)
    if _csan_handler is not None:
        _csan_handler._handle_device_synchronization()


def report() -> str:
    """The race report so far (as printed at exit, without stacks)."""
    return cast(str, _native_runtime().sanitizer_report())
