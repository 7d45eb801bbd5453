"""PyTorch's CUDA caching allocator and the device's memory, as msmemscope records them.

- OOM: the allocator's out-of-memory observer (``torch._C._cuda_attach_out_of_memory_observer``)
  writes an OOM_TRIGGER row (func ``CUDACachingAllocator``, the requested bytes, the device's
  total and free memory in the error text) and a SNAPSHOT row named ``oom`` of the allocator's
  statistics at that moment. The runtime's OOM analysis adds the recent and largest live blocks
  after the trigger. The observer is attached when CUDA initializes (``torch.cuda._lazy_call``),
  so attaching it never initializes CUDA itself, and a build or machine without CUDA is left
  alone.
- Device totals: ``nvmlDeviceGetMemoryInfo`` from NVML (``libnvidia-ml.so.1``, loaded with
  ctypes when present), which needs no CUDA context; else ``torch.cuda.mem_get_info``.
- Pool totals: ``allocated``/``reserved`` of the caching allocator (``memory_stats``).

Nothing here raises into the program: a failure costs the row, not the program's step.
"""

from __future__ import annotations

import ctypes
import sys
import threading

from .._runtime import native as _native_runtime

_attach_lock = threading.Lock()
_attach_queued = False


def attach_oom_observer() -> bool:
    """Arranges for the OOM observer to be attached when CUDA initializes (at once when it
    already has). Idempotent; False when this PyTorch has no CUDA support."""
    global _attach_queued
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):
        return False
    with _attach_lock:
        if _attach_queued:
            return True
        _attach_queued = True
    try:
        torch.cuda._lazy_call(_attach)
    except Exception:
        return False
    return True


def _attach() -> None:
    try:
        import torch

        # A binding of torch._C's CUDA module that torch's stubs do not declare.
        torch._C._cuda_attach_out_of_memory_observer(_on_oom)  # type: ignore[attr-defined]
    except Exception:
        pass


def _on_oom(device: int, alloc: int, device_total: int, device_free: int) -> None:
    """The allocator could not satisfy ``alloc`` bytes on ``device`` (called by PyTorch, with
    the allocator's lock released, before it raises ``torch.OutOfMemoryError``)."""
    try:
        nat = _native_runtime()
        if not nat.tracing():
            return
        dev = f"cuda:{int(device)}"
        attrs = {
            "func": "CUDACachingAllocator",
            "req_size": int(alloc),
            "error": (
                f"CUDA out of memory: tried to allocate {int(alloc)} bytes; "
                f"device total {int(device_total)}, free {int(device_free)}"
            ),
        }
        nat.emit(nat.EVENT_OOM_DETAIL, nat.TYPE_OOM_TRIGGER, "", dev, None, attrs, "", True)
        stats = allocator_stats(int(device))
        stats["total"] = int(device_total)
        stats["free"] = int(device_free)
        nat.emit(nat.EVENT_SNAPSHOT, nat.TYPE_SNAPSHOT, "oom", dev, None, stats, "", False)
    except Exception:
        pass


def allocator_stats(index: int) -> dict[str, int]:
    """The caching allocator's current and peak reserved/allocated bytes on ``cuda:index``
    (zeros when CUDA is not initialized there)."""
    try:
        import torch

        stats = torch.cuda.memory_stats(index)
    except Exception:
        stats = {}
    return {
        "reserved": int(stats.get("reserved_bytes.all.current", 0)),
        "max_reserved": int(stats.get("reserved_bytes.all.peak", 0)),
        "allocated": int(stats.get("allocated_bytes.all.current", 0)),
        "max_allocated": int(stats.get("allocated_bytes.all.peak", 0)),
    }


def pool_totals(index: int) -> tuple[int, int]:
    """(allocated, reserved) bytes of the caching allocator on ``cuda:index``."""
    stats = allocator_stats(index)
    return stats["allocated"], stats["reserved"]


# --- NVML ---------------------------------------------------------------------------------------


class _NvmlMemory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


_nvml_lock = threading.Lock()
_nvml: ctypes.CDLL | None = None
_nvml_tried = False


def _nvml_library() -> ctypes.CDLL | None:
    """NVML, loaded and initialized once; None when the machine has none."""
    global _nvml, _nvml_tried
    with _nvml_lock:
        if not _nvml_tried:
            _nvml_tried = True
            try:
                lib = ctypes.CDLL("libnvidia-ml.so.1")
                if lib.nvmlInit_v2() == 0:
                    _nvml = lib
            except (OSError, AttributeError):
                _nvml = None
        return _nvml


def _pci_bus_id(index: int) -> bytes | None:
    """``cuda:index``'s PCI address as NVML names it, so CUDA_VISIBLE_DEVICES renumbering does
    not matter (None when PyTorch does not know it)."""
    try:
        import torch

        props = torch.cuda.get_device_properties(index)
        # torch's stub of _CudaDeviceProperties omits its pci_* fields (an older PyTorch without
        # them raises AttributeError here).
        return (
            f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"  # type: ignore[attr-defined]
        ).encode()
    except Exception:
        return None


def device_memory(index: int) -> tuple[int, int] | None:
    """(total, free) bytes of ``cuda:index`` from NVML, or None without NVML."""
    lib = _nvml_library()
    if lib is None:
        return None
    handle = ctypes.c_void_p()
    bus_id = _pci_bus_id(index)
    try:
        rc = (
            lib.nvmlDeviceGetHandleByPciBusId_v2(bus_id, ctypes.byref(handle))
            if bus_id is not None
            else 1
        )
        if rc != 0:
            rc = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle))
        if rc != 0:
            return None
        memory = _NvmlMemory()
        if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
            return None
        return int(memory.total), int(memory.free)
    except (AttributeError, OSError):
        return None
