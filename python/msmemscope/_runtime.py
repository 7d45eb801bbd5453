"""The runtime library's C ABI, loaded on first use.

A program started under ``msmemscope`` already has the runtime library preloaded and
``_native`` finds it in the process; otherwise it is loaded from :mod:`msmemscope._paths`.
"""

from __future__ import annotations

import threading
from types import ModuleType

from . import _native, _paths

_lock = threading.Lock()


def native() -> ModuleType:
    """``_native`` with the runtime library available; RuntimeError when it cannot be found."""
    if _native.runtime_loaded():
        return _native
    with _lock:
        if not _native.runtime_loaded():
            _native.load_runtime(str(_paths.find_runtime()))
    return _native
