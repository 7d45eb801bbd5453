"""``take_snapshot``: SNAPSHOT rows of the devices' memory totals, on demand
(docs/python-api.md#take_snapshot).

A SNAPSHOT row carries ``reserved``, ``max_reserved``, ``allocated``, ``max_allocated``,
``total`` and ``free`` (bytes). For a CUDA device they come from the caching allocator
(``torch.cuda.memory_stats``) and the driver (``torch.cuda.mem_get_info``). For the CPU:
``allocated``/``max_allocated`` are the PyTorch tracker's live tensor bytes and their peak
(0 when the tracker is not running), ``reserved``/``max_reserved`` the process's resident and
peak resident memory (VmRSS, VmHWM), ``total``/``free`` the machine's MemTotal and MemAvailable.

The folder: :func:`take_snapshot` here (``msmemscope.take_snapshot``), and :mod:`.pickles`, the
snapshots that framework hooks take around a framework's key functions (these rows, and on CUDA
the caching allocator's own snapshot as a pickle for PyTorch's memory viewer).

May import: :mod:`msmemscope.capture` (``cuda_allocator``'s device totals; the running tracker's
CPU figures are looked up in ``sys.modules``, never imported) and the bottom modules
(``msmemscope._runtime``). Not :mod:`msmemscope.watch`, :mod:`msmemscope.frameworks` (whose
hooks use this folder, handing :mod:`.pickles` their error reporter) nor the public modules.
"""

from __future__ import annotations

import sys

from .._runtime import native as _native_runtime


def _proc_kb(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu_stats() -> dict[str, int]:
    tracker = sys.modules.get("msmemscope.capture.torch_tracker")
    state = getattr(tracker, "_tracker", None) if tracker else None
    if state is not None and hasattr(state, "usage"):  # the native capture
        allocated, max_allocated = state.usage("cpu")
    else:
        used = getattr(state, "used", {}) if state else {}
        peak = getattr(state, "peak", {}) if state else {}
        allocated = int(used.get("cpu", 0))
        max_allocated = int(peak.get("cpu", allocated))
    return {
        "reserved": _proc_kb("/proc/self/status", "VmRSS:"),
        "max_reserved": _proc_kb("/proc/self/status", "VmHWM:"),
        "allocated": allocated,
        "max_allocated": max_allocated,
        "total": _proc_kb("/proc/meminfo", "MemTotal:"),
        "free": _proc_kb("/proc/meminfo", "MemAvailable:"),
    }


def _cuda_stats(index: int) -> dict[str, int]:
    import torch

    stats = torch.cuda.memory_stats(index)
    # --- device totals from NVML when present (issue 11): no CUDA context needed ---
    from ..capture.cuda_allocator import device_memory

    nvml = device_memory(index)
    free, total = (nvml[1], nvml[0]) if nvml else torch.cuda.mem_get_info(index)
    # --- end ---
    return {
        "reserved": int(stats.get("reserved_bytes.all.current", 0)),
        "max_reserved": int(stats.get("reserved_bytes.all.peak", 0)),
        "allocated": int(stats.get("allocated_bytes.all.current", 0)),
        "max_allocated": int(stats.get("allocated_bytes.all.peak", 0)),
        "total": int(total),
        "free": int(free),
    }


def _cuda_devices() -> list[int]:
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    try:
        return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    except Exception:
        return []


def take_snapshot(device_mask: int | None = None, name: str = "snapshot") -> int:
    """Writes one SNAPSHOT row per selected device; returns how many were recorded.

    ``device_mask``: ``None`` for the CPU and every CUDA device, else a bit mask of CUDA device
    indices (bit i = ``cuda:i``; the CPU row is written only with ``None``). ``name`` becomes the
    row's Name.
    """
    if device_mask is not None and (
        not isinstance(device_mask, int) or isinstance(device_mask, bool)
    ):
        raise TypeError("device_mask must be an int bit mask of CUDA device indices, or None")
    if device_mask is not None and device_mask < 0:
        raise ValueError(f"device_mask must not be negative, got {device_mask}")
    if not isinstance(name, str) or not name:
        raise TypeError("name must be a non-empty str")
    nat = _native_runtime()
    targets: list[tuple[str, dict[str, int]]] = []
    if device_mask is None:
        targets.append(("cpu", _cpu_stats()))
    for index in _cuda_devices():
        if device_mask is None or device_mask >> index & 1:
            targets.append((f"cuda:{index}", _cuda_stats(index)))
    recorded = 0
    for device, stats in targets:
        if (
            nat.emit(nat.EVENT_SNAPSHOT, nat.TYPE_SNAPSHOT, name, device, None, stats, "", False)
            == 0
        ):
            recorded += 1
    return recorded
