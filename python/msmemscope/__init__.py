"""msmemscope: memory analysis for PyTorch programs and the host heap.

Drive a run from Python with the original msMemScope's API::

    import msmemscope
    msmemscope.config(analysis=["host-leaks"], output_path="./out")
    msmemscope.start()
    ...
    msmemscope.stop()

Configuration values are strings, spelled as on the command line (``events="alloc,free"``,
``call_stack="python:20"``); a bad key or value raises ``ValueError`` (``TypeError`` for a
value that is not a string) naming the key and the accepted values.

The package in layers, each importing only the ones below it (ARCHITECTURE.md):

- the public modules: this file, ``analyzers``, ``mstx``, ``describe``, ``holders``,
  ``sanitizer``, ``watcher`` (the public name of ``watch.watcher``), ``notebook`` (the
  ``%%msmemscope`` cell magic, loaded by ``%load_ext msmemscope``), ``pytest_plugin/``;
- ``frameworks/``: patches of third-party frameworks (FSDP, vLLM, Megatron-Core, verl);
- ``watch/`` (the memory block watch) and ``snapshot/`` (SNAPSHOT rows, CUDA pickles);
- ``capture/``: the PyTorch trackers (native capture, dispatch-mode fallback), owners, sites;
- the bottom: ``_native`` (the extension), ``_runtime``, ``_paths``, ``_import_hook`` (the
  post-import hook, shared with ``_autostart/sitecustomize.py``, the launcher's start-up file).

Where a lower layer must call a higher one, the higher one is plugged in here, at the end of
this file: the capture calls the watch, the frameworks' decompose hooks and the holder search
through ``capture/extensions.py``.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

from . import analyzers, mstx, watcher
from ._runtime import native as _native_runtime
from .analyzers import (
    analyze,
    check_decompose,
    check_inefficient,
    check_leaks,
    check_peak,
    get_analyzer_config,
    list_analyzers,
)
from .capture import extensions as _capture_extensions
from .sanitizer import enable_npu_sanitizer, enable_sanitizer
from .snapshot import take_snapshot
from .watch import state as _watch

__all__ = [
    "analyze",
    "analyzers",
    "check_decompose",
    "check_inefficient",
    "check_leaks",
    "check_peak",
    "cleanup_framework_hooks",
    "config",
    "enable_npu_sanitizer",
    "enable_sanitizer",
    "findings",
    "get_analyzer_config",
    "init_framework_hooks",
    "keep_steps",
    "leak_holders",
    "list_analyzers",
    "load_ipython_extension",
    "mstx",
    "start",
    "step",
    "stop",
    "take_snapshot",
    "watcher",
]


def config(**kw: str) -> None:
    """Sets run options; keys as the command line's long options with ``_`` for ``-``:
    call_stack, level, events, device, format (or data_format), output_path, analysis, watch,
    host_leak_mode, block_size_threshold, sample_rate, sample_bytes, python_objects, dump_budget
    (also log_level, steps, collect_mode).

    While a host-leak window is open (between ``start()`` and ``stop()``) the configuration is
    left unchanged and a warning says so; stop the window, configure, and start a new one.
    """
    nat = _native_runtime()
    updated = nat.validate_config(nat.current_config(), **kw)
    applied = nat.configure(updated)
    tracker = sys.modules.get("msmemscope.capture.torch_tracker")
    if applied and tracker is not None:
        tracker.reload_config()
    if applied:  # the watch range and mode follow config(watch=...)
        _watch.WATCH.reconfigure()
    if not applied:
        warnings.warn(
            "msmemscope.config() has no effect while a host-leak window is open: call "
            "msmemscope.stop() first, then config() and start() again",
            RuntimeWarning,
            stacklevel=2,
        )


def start() -> None:
    """Starts tracing; with ``analysis="host-leaks"`` opens a host-leak window instead (each
    ``start()``/``stop()`` pair is one window with its own stage number)."""
    nat = _native_runtime()
    analyses = json.loads(nat.current_config()).get("analysis", [])
    if "host-leaks" in analyses and not nat.host_hooks_active():
        raise ValueError(nat.HOST_HOOKS_MISSING)
    nat.start()
    if "host-leaks" in analyses:
        # Python objects come from CPython's own allocators, which malloc's hooks never see.
        nat.track_python_objects()
    if "host-leaks" not in analyses and "torch" in sys.modules:
        # Tracing from Python: PyTorch ops and tensors are recorded from here on.
        from .capture import torch_tracker

        torch_tracker.install()


def stop() -> None:
    """Stops tracing; closes the open host-leak window and writes its report."""
    _native_runtime().stop()


def step() -> None:
    """Starts the next training or inference step (and so ends the current one): call it
    once per step, at the step's start or its end alike. Rows before the first call are step
    0; the leaks analysis judges growth from step to step."""
    _before_step_boundary()
    _native_runtime().step()


def _before_step_boundary() -> None:
    """The decompose analysis names, at the first step boundary and before its STEP row, the
    tensors made before training (capture/owners.py). Its module is loaded only where PyTorch
    is tracked: no import here, so a program without torch never loads torch."""
    owners = sys.modules.get("msmemscope.capture.owners")
    if owners is not None:
        owners.first_step()


def findings() -> dict[str, object]:
    """What the running analyses found so far, from inside the traced process (every event
    queued so far is written first; waits 2 s at most). A dict (schema
    ``msmemscope.findings/1``): ``available`` (False when nothing is traced, then nothing
    else but ``tracing``), ``steps`` (STEP rows so far), ``leak_sites`` (the sites the leaks
    analysis judges leaking now, the largest growth first: ``site``, ``file``, ``line``,
    ``function``, ``device``, ``pool``, ``bytes_per_step``, ``blocks_per_step``,
    ``first_step``, ``last_step``, ``bytes``, ``blocks``), ``leak_bytes_per_step`` (their sum),
    ``last_step_growth`` (the sites that rose at the last step end and by how many bytes),
    ``peak_bytes`` and ``peaks`` (each device's highest bytes in use so far and its step).
    The files the analyses write at exit (``leaks/findings.json``, ``leaks/peak.json``) say
    more."""
    found = json.loads(_native_runtime().findings())
    return found if isinstance(found, dict) else {}


def keep_steps(*steps: int) -> bool:
    """Asks a bounded dump (``--dump-budget``) to keep these steps' rows in full, as it keeps
    the peak's step and the leaks' (the newest 16 asked for; the first steps and the newest are
    kept anyway). Steps are numbered as ``msmemscope.step()`` counts them. False when nothing is
    traced yet (no row was recorded): ask again once tracing runs."""
    for step in steps:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"keep_steps: a step is an int of 0 or more, got {step!r}")
    return bool(_native_runtime().keep_steps(list(steps)))


def leak_holders(budget_s: float | None = None) -> list[dict[str, object]]:
    """What keeps the leaked tensors alive now: for the live tensors of each site the leaks
    analysis judges leaking, the chain of references from a global or a frame's local to the
    tensor (see :mod:`msmemscope.holders`); also written to the run's report."""
    from . import holders

    return holders.leak_holders(budget_s)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext msmemscope`` in IPython or Jupyter: registers the ``%%msmemscope`` cell
    magic (:mod:`msmemscope.notebook`; IPython is imported only then)."""
    from . import notebook

    notebook.load_ipython_extension(ipython)


# --- framework hooks (frameworks/hooks): imported on first use, so `import msmemscope` stays light
def init_framework_hooks(framework: str, version: str, component: str, type: str) -> None:
    """Hooks one framework component for decompose or snapshot, e.g.
    ``init_framework_hooks("pytorch", "2.10+", "fsdp2", "decompose")``; see
    :func:`msmemscope.frameworks.hooks.init_framework_hooks`."""
    from .frameworks import hooks

    hooks.init_framework_hooks(framework, version, component, type)


def cleanup_framework_hooks() -> None:
    """Restores every function framework hooks patched."""
    from .frameworks import hooks

    hooks.cleanup_framework_hooks()


# --- the layers above the capture, plugged into it (msmemscope.capture.extensions) ---------------
# Set here, as `import msmemscope` runs, so before any tracker exists: importing a module of
# msmemscope.capture imports this package first. The capture never imports these layers itself.
def _framework_decompose_hooks(decompose: bool) -> None:
    """The frameworks' decompose hooks (FSDP, vLLM...), registered lazily: each activates only
    once its framework is imported."""
    try:
        from .frameworks import hooks
    except ImportError:
        return
    toggle = getattr(hooks, "auto_register" if decompose else "auto_unregister", None)
    if toggle is not None:
        toggle()


def _search_holders_at_exit() -> None:
    """The holders of leaked tensors, searched for once at exit (msmemscope.holders)."""
    from . import holders

    holders.search_at_exit()


_capture_extensions.attach_watch = _watch.WATCH.attach
_capture_extensions.framework_decompose_hooks = _framework_decompose_hooks
_capture_extensions.leaks_at_exit = _search_holders_at_exit
