"""PyTorch tracking: tensor blocks, ATen ops and tensor accesses as msmemscope events.

:func:`install` (the autostart ``sitecustomize`` calls it right after ``import torch`` in a
program launched by ``msmemscope``; ``msmemscope.start()`` calls it too) picks the capture:

- ``native`` (default): :mod:`.native_tracker`, PyTorch's allocators and RecordFunction
  callbacks in C++ (every block, op-internal ones and compiled regions included; threads of any
  age; ``torch.compile`` compiles);
- ``python``: the process-lifetime dispatch mode of :mod:`.dispatch_tracker`, used when
  ``MSMEMSCOPE_TORCH_CAPTURE=python`` or when the native library cannot be built here (one
  warning line says why).

Around either, it registers what does not depend on the capture: the module paths, the
optimizer step boundaries, the leaks analysis's holder search and the CUDA allocator's OOM
observer. ``_tracker`` is the installed tracker, which the layers above look up here.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import torch

from . import dispatch_tracker, extensions, modules, owners
from .config import Config, report_once
from .dispatch_tracker import DispatchTracker, MemscopeDispatchMode

if TYPE_CHECKING:
    from .native_tracker import NativeTracker
    from .tracker import Tracker

__all__ = ["capture", "install", "installed", "reload_config", "uninstall"]

_install_lock = threading.Lock()
_tracker: DispatchTracker | NativeTracker | None = None
_mode: MemscopeDispatchMode | None = None


def installed() -> bool:
    """Whether the mode is installed (and tracking)."""
    return _tracker is not None and _tracker.enabled


def reload_config() -> None:
    """Re-reads the runtime's configuration (call after ``msmemscope.config()``); turns the
    decompose hooks on or off with the decompose analysis."""
    if _tracker is None:
        return
    _tracker.cfg = cfg = Config(_tracker.nat.current_config())
    if isinstance(_tracker, _native_tracker_type()):
        _tracker.configure(cfg)
    if cfg.decompose:
        owners.enable_decompose()
    else:
        owners.disable_decompose()
    _framework_hooks(cfg.decompose)


def _framework_hooks(decompose: bool) -> None:
    """The frameworks' decompose hooks (FSDP, vLLM...), registered lazily: each activates only
    once its framework is imported (msmemscope.frameworks.hooks, plugged in as an extension)."""
    toggle = extensions.framework_decompose_hooks
    if toggle is not None:
        toggle(decompose)


CAPTURE_VARIABLE = "MSMEMSCOPE_TORCH_CAPTURE"
_CAPTURES = ("native", "python")


def _native_tracker_type() -> type[NativeTracker] | tuple[()]:
    module = sys.modules.get(f"{__package__}.native_tracker")
    return module.NativeTracker if module is not None else ()


def _warn(message: str) -> None:
    try:
        sys.stderr.write(f"msmemscope: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


def _make_tracker(nat: ModuleType) -> DispatchTracker | NativeTracker:
    """The native capture unless ``MSMEMSCOPE_TORCH_CAPTURE=python`` or it cannot be built here;
    then the dispatch mode, with one warning line naming why."""
    choice = os.environ.get(CAPTURE_VARIABLE, "native").strip().lower() or "native"
    if choice not in _CAPTURES:
        _warn(
            f"warning: {CAPTURE_VARIABLE}={choice!r} is not one of {', '.join(_CAPTURES)}; "
            "using native"
        )
        choice = "native"
    if choice == "native":
        from . import native_build, native_tracker

        try:
            lib = native_tracker.load_library(nat, notice=_warn)
            return native_tracker.NativeTracker(nat, lib)
        except (native_build.Unavailable, OSError, AttributeError, RuntimeError) as exc:
            _warn(
                f"warning: native PyTorch capture unavailable: {exc}; using the Python dispatch "
                "mode (allocations inside an op are not seen; torch.compile runs eagerly)"
            )
    return DispatchTracker(nat)


def _step_boundaries() -> None:
    """Each ``step()`` of the first optimizer that steps offers the runtime a step boundary
    (``nat.optimizer_step()``), whatever analyses are configured: the runtime records it as a
    STEP row with the Attr ``source: optimizer.step`` while the program marks no steps itself,
    and never records the first offer. The global optimizer step hook is registered once."""
    global _optimizer_hook
    if _optimizer_hook is not None:
        return
    try:
        from .._runtime import native

        nat = native()
        first: list[int] = []

        def after_optimizer_step(
            optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> None:
            if not first:
                first.append(id(optimizer))
            if first[0] == id(optimizer):
                try:
                    nat.optimizer_step()
                except Exception as exc:
                    # install() set the tracker before it called _step_boundaries.
                    report_once(cast("Tracker", _tracker), exc)

        from torch.optim.optimizer import register_optimizer_step_post_hook

        _optimizer_hook = register_optimizer_step_post_hook(after_optimizer_step)
    except Exception as exc:
        _warn(f"warning: optimizer steps do not end steps: {exc}")


def _leaks_support() -> None:
    """With the leaks analysis on: the holders of leaked tensors are searched for once at exit,
    while the interpreter still has them (msmemscope.holders)."""
    try:
        from .._runtime import native

        if "leaks" not in json.loads(native().current_config()).get("analysis", []):
            return
        search_at_exit = extensions.leaks_at_exit  # msmemscope.holders
        if search_at_exit is not None:
            search_at_exit()
    except Exception as exc:
        _warn(f"warning: the leaks analysis's holder search is off: {exc}")


_optimizer_hook: Any = None  # the optimizer step hook's handle, once registered


def capture() -> str | None:
    """``native`` or ``python``: how PyTorch events are taken (None before :func:`install`)."""
    if _tracker is None:
        return None
    return "native" if isinstance(_tracker, _native_tracker_type()) else "python"


def install() -> None:
    """Starts PyTorch tracking on this thread and on threads started from now on. Idempotent:
    a second call only re-reads the configuration and makes sure this thread has the mode."""
    global _tracker, _mode
    with _install_lock:
        if _tracker is None:
            from .._runtime import native

            _tracker = _make_tracker(native())
            if isinstance(_tracker, DispatchTracker):  # capture() == "python"
                _mode = MemscopeDispatchMode(_tracker)
        reload_config()
        modules.enable()
        _step_boundaries()
        _leaks_support()
        # --- CUDA caching allocator's OOM observer, attached when CUDA initializes (issue 11) ---
        from . import cuda_allocator

        cuda_allocator.attach_oom_observer()
        # --- end ---
        if _mode is None:  # native: every thread is covered by the library
            cast("NativeTracker", _tracker).start()  # (without a mode, the tracker is native)
            return
        dispatch_tracker.start(_mode)


def uninstall() -> None:
    """Stops PyTorch tracking: the mode leaves this thread's mode stack (when it is on top) and
    turns inert everywhere; storages already tracked still get their FREE rows."""
    with _install_lock:
        if _tracker is None:
            return
        modules.disable()
        if _mode is None:
            cast("NativeTracker", _tracker).stop()  # (without a mode, the tracker is native)
            return
        dispatch_tracker.stop(_mode)
