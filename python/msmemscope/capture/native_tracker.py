"""The native PyTorch capture (``native/capture.cpp``) as the tracker's backend.

PyTorch's allocators report every block to the capture library (CPU and the CUDA caching
allocator alike, op-internal temporaries and compiled regions included), and a global
RecordFunction callback reports the ATen ops, both without Python. This module loads the
library (built once per torch, :mod:`native_build`), hands it the runtime's C ABI, keeps its
configuration in step with the runtime's, and offers the rest of the package the same tracker
interface as the dispatch-mode fallback: owners (``set_owner``, ``written_storage``), the freed
blocks the watcher refuses, the usage figures of snapshots.

Where Python is still involved, and why:

- owners: the decompose hooks run in Python (module, gradient and optimizer hooks) and tell the
  library the owner context — one call per hook, never per allocation;
- the ``module`` member: global module forward hooks (:mod:`modules`) tell the library the
  innermost module's path, one call per forward's start and end;
- a storage made before tracking is adopted by ``set_owner`` with a MALLOC row; the allocator
  never reports its free to us (it did not know it), so a weak reference reports it;
- memory block watch: while something is watched, a dispatch mode that only computes the
  watch's checksums runs around ops (on the thread that started watching and threads started
  since). ``torch.compile`` regions run eagerly during that time, as under the fallback.

While a ``torch.profiler`` session runs on a thread, PyTorch hands that thread's allocator events
to the profiler instead (it reports to the innermost profiler state only): msmemscope records
that thread's ops but not its allocations until the session ends, and a block allocated before
the session and freed during it has no FREE row.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Callable, Collection, MutableMapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from . import extensions, modules, owners, sites
from .config import SKIP_DIRS, Config, report_once
from .op_info import OP_OVERLOAD, OpInfo, dtensor_in

if TYPE_CHECKING:
    from torch._ops import OpOverload

    from .tracker import OpWatch, Tracker

__all__ = ["NativeTracker", "load_library"]

_DEVICE_CPU = 1
_DEVICE_CUDA = 2
_U64 = ctypes.c_uint64
_U32 = ctypes.c_uint32


def load_library(nat: ModuleType, notice: Callable[[str], None]) -> ctypes.CDLL:
    """Builds (or finds in the cache) and loads the capture library, bound to the runtime."""
    from . import native_build

    path = native_build.library(torch, notice=notice)
    lib = ctypes.CDLL(str(path))
    _declare(lib)
    emit, tracing, emit_block, emit_op = nat.abi_entry_points()
    codes = (
        nat.EVENT_MALLOC,
        nat.EVENT_FREE,
        nat.EVENT_ACCESS,
        nat.EVENT_OP_LAUNCH,
        nat.EVENT_SYSTEM,
        nat.EVENT_OOM_DETAIL,
        nat.TYPE_PTA,
        nat.TYPE_READ,
        nat.TYPE_WRITE,
        nat.TYPE_ATEN_START,
        nat.TYPE_ATEN_END,
        nat.TYPE_OWNER,
        nat.TYPE_OOM_TRIGGER,
    )
    array = (_U32 * len(codes))(*codes)
    rc = lib.msmemscope_torch_init(
        emit, tracing, emit_block, emit_op, nat.ABI_VERSION, array, len(codes)
    )
    if rc != 0:
        raise native_build.Unavailable(
            f"{path} was built for another runtime ABI (init returned {rc}); delete it to rebuild"
        )
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    vp, ci, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    sigs = {
        "msmemscope_torch_init": (
            [vp, vp, vp, vp, _U32, ctypes.POINTER(_U32), ctypes.c_size_t],
            ci,
        ),
        "msmemscope_torch_configure": ([ci] * 8, None),
        "msmemscope_torch_skip_prefixes": ([cp], None),
        "msmemscope_torch_library_prefixes": ([cp], None),
        "msmemscope_torch_install": ([], ci),
        "msmemscope_torch_uninstall": ([], None),
        "msmemscope_torch_thread_entries": ([ci], None),
        "msmemscope_torch_leave_thread": ([], ci),
        "msmemscope_torch_scope_push": ([cp], None),
        "msmemscope_torch_scope_pop": ([], None),
        "msmemscope_torch_optimizer": ([ci], None),
        "msmemscope_torch_labels": ([cp], None),
        "msmemscope_torch_module_text": ([cp], vp),
        "msmemscope_torch_set_module": ([vp], None),
        "msmemscope_torch_set_owner": ([_U64, cp, cp, ci, ci, cp, ctypes.c_size_t], ci),
        "msmemscope_torch_adopt": ([_U64, _U64, _U32, _U32, cp], ci),
        "msmemscope_torch_release": ([_U64], None),
        "msmemscope_torch_next_aid": ([], _U64),
        "msmemscope_torch_relabel_activations": (
            [ctypes.POINTER(_U64), ctypes.c_size_t, _U64, cp, cp],
            ci,
        ),
        "msmemscope_torch_freed_block": (
            [_U64, *[ctypes.POINTER(_U64)] * 2, *[ctypes.POINTER(_U32)] * 2],
            ci,
        ),
        "msmemscope_torch_live_block": (
            [_U64, *[ctypes.POINTER(_U64)] * 2, *[ctypes.POINTER(_U32)] * 2],
            ci,
        ),
        "msmemscope_torch_usage": ([_U32, _U32, ctypes.POINTER(_U64), ctypes.POINTER(_U64)], None),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res


def _device_code(device: torch.device) -> tuple[int, int] | None:
    if device.type == "cpu":
        return _DEVICE_CPU, 0
    if device.type == "cuda":
        return _DEVICE_CUDA, device.index or 0
    return None


def _device_text(kind: int, index: int) -> str:
    return "cpu" if kind == _DEVICE_CPU else f"cuda:{index}"


def _utf8(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _block_query(fn: Callable[..., int], addr: int) -> tuple[int, int, str] | None:
    start, size, kind, index = _U64(), _U64(), _U32(), _U32()
    found = fn(
        addr, ctypes.byref(start), ctypes.byref(size), ctypes.byref(kind), ctypes.byref(index)
    )
    if not found:
        return None
    return start.value, size.value, _device_text(kind.value, index.value)


class _Freed:
    """``tracker.freed`` for the watcher: the newest freed blocks, looked up in the library."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    def block(self, addr: int) -> tuple[int, int, str] | None:
        return _block_query(self.lib.msmemscope_torch_freed_block, addr)


class NativeTracker:
    """The tracker interface over the capture library (see the module documentation)."""

    capture = "native"

    def __init__(self, nat: ModuleType, lib: ctypes.CDLL) -> None:
        self.nat = nat
        self.lib = lib
        self.cfg = Config()
        self.enabled = False
        self.reported = False
        self.lock = threading.RLock()
        self.freed = _Freed(lib)
        self.ops: dict[OpOverload, OpInfo] = {}
        # Categories given to storages (by identity): a storage resized outside the dispatcher
        # (FSDP) gets a new block, which keeps the category.
        self.categories: MutableMapping[torch.UntypedStorage, str] = WeakIdKeyDictionary()
        # block address -> ref to its storage
        self.adopted: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        lib.msmemscope_torch_skip_prefixes("\n".join(SKIP_DIRS).encode())
        lib.msmemscope_torch_library_prefixes("\n".join(sites.library_dirs(SKIP_DIRS)).encode())
        owners.attach_native(lib)
        modules.attach_native(lib)
        self._watch: OpWatch | None = None
        self.watch_mode: _WatchMode | None = None
        attach_watch = extensions.attach_watch  # msmemscope.watch
        self.watch = attach_watch(self) if attach_watch is not None else None

    # --- watch: a dispatch mode only while something is watched -----------------------------------
    @property
    def watch(self) -> OpWatch | None:
        return self._watch

    @watch.setter
    def watch(self, value: OpWatch | None) -> None:
        self._watch = value
        mode = self.watch_mode
        if value is not None and mode is None:
            self.watch_mode = mode = _WatchMode(self)
            mode.__enter__()  # type: ignore[no-untyped-call]  # torch's __enter__ is unannotated
        elif value is None and mode is not None:
            self.watch_mode = None
            from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

            stack = _get_current_dispatch_mode_stack()
            if stack and stack[-1] is mode:
                # torch's __exit__ is unannotated
                mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
            mode.retired = True

    def op_info(self, func: OpOverload) -> OpInfo:
        info = self.ops.get(func)
        if info is None:
            info = self.ops[func] = OpInfo(func)
        return info

    # --- configuration --------------------------------------------------------------------------
    def configure(self, cfg: Config) -> None:
        self.cfg = cfg
        self.lib.msmemscope_torch_configure(
            int(cfg.alloc),
            int(cfg.free),
            int(cfg.launch),
            int(cfg.access),
            int(cfg.decompose),
            int(cfg.python_depth),
            int(cfg.c_stack),
            int(cfg.oom),
        )

    def start(self) -> None:
        if torch.cuda.is_available():
            # CUDA's caching allocator reports to the thread's profiler entry: threads get ours,
            # and a user's torch.profiler takes it off its thread first (PyTorch refuses to
            # start a profiler over another entry).
            self.lib.msmemscope_torch_thread_entries(1)
            _make_room_for_profilers(self.lib)
        rc = self.lib.msmemscope_torch_install()
        if rc != 0:
            raise RuntimeError(f"the native capture did not start (code {rc})")
        self.enabled = True

    def stop(self) -> None:
        self.enabled = False
        self.lib.msmemscope_torch_uninstall()

    def report(self, exc: BaseException) -> None:
        report_once(self, exc)

    # --- owners ---------------------------------------------------------------------------------
    def set_owner(
        self,
        t: torch.Tensor,
        category: str | None = None,
        label: str | None = None,
        unless_framework: bool = False,
    ) -> None:
        """As the fallback's: a new category and/or one more user label for ``t``'s block (an
        OWNER row when it changes); a block made before tracking is adopted."""
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            return
        dev = _device_code(t.device)
        if dev is None:
            return
        st = t.untyped_storage()
        ptr, size = st.data_ptr(), st.nbytes()
        if category is not None and not (unless_framework and "@" in self.categories.get(st, "")):
            self.categories[st] = category
        if not size:
            return
        out = ctypes.create_string_buffer(1024)
        rc = self.lib.msmemscope_torch_set_owner(
            ptr,
            _utf8(category),
            _utf8(label),
            int(unless_framework),
            owners.MAX_USER_LABELS,
            out,
            len(out),
        )
        if rc == -2:
            have = out.value.decode().replace("@", ", ")
            raise ValueError(
                f"describer: a tensor carries at most {owners.MAX_USER_LABELS} owner labels "
                f"(it has {have}); cannot add {label!r}"
            )
        if rc == -1 and self.enabled and self.nat.tracing():
            self._adopt(st, ptr, size, dev, category)
            if label is not None:
                self.set_owner(t, label=label)

    def _adopt(
        self,
        st: torch.UntypedStorage,
        ptr: int,
        size: int,
        dev: tuple[int, int],
        category: str | None,
    ) -> None:
        if self.lib.msmemscope_torch_adopt(ptr, size, dev[0], dev[1], _utf8(category)) != 0:
            return
        lib = self.lib
        adopted = self.adopted

        def released(_ref: weakref.ref[torch.UntypedStorage], ptr: int = ptr) -> None:
            try:
                adopted.pop(ptr, None)
                lib.msmemscope_torch_release(ptr)
            except Exception as exc:
                self.report(exc)

        adopted[ptr] = weakref.ref(st, released)

    def next_aid(self) -> int:
        return int(self.lib.msmemscope_torch_next_aid())

    def relabel_activations(
        self, data_ptrs: Collection[int], before: int, data: str, other: str
    ) -> int:
        """As the fallback's; the library walks its live blocks once, under its lock."""
        ptrs = sorted(set(data_ptrs))
        array = (_U64 * len(ptrs))(*ptrs)
        return int(
            self.lib.msmemscope_torch_relabel_activations(
                array, len(ptrs), before, data.encode(), other.encode()
            )
        )

    def written_storage(self, t: torch.Tensor) -> None:
        """``t``'s storage was resized outside the dispatcher: the allocator reported the FREE
        and the MALLOC; the new block takes the category the storage had."""
        st = t.untyped_storage()
        category = self.categories.get(st)
        if category is not None and st.nbytes():
            self.set_owner(t, category=category)

    def live_block(self, addr: int) -> tuple[int, int, str] | None:
        """``(start, size, device)`` of the live block holding ``addr``, or None."""
        return _block_query(self.lib.msmemscope_torch_live_block, addr)

    # --- figures --------------------------------------------------------------------------------
    def usage(self, device: str) -> tuple[int, int]:
        """(live tracked bytes, their peak) on ``device`` (``cpu`` or ``cuda:N``)."""
        kind, index = (
            (_DEVICE_CPU, 0) if device == "cpu" else (_DEVICE_CUDA, int(device.split(":")[1]))
        )
        used, peak = _U64(), _U64()
        self.lib.msmemscope_torch_usage(kind, index, ctypes.byref(used), ctypes.byref(peak))
        return used.value, peak.value


def _make_room_for_profilers(lib: ctypes.CDLL) -> None:
    import torch.autograd.profiler as profiler

    original = getattr(profiler, "_enable_profiler", None)
    if original is None or getattr(original, "__msmemscope__", False):
        return

    def _enable_profiler(*args: Any, **kwargs: Any) -> Any:
        lib.msmemscope_torch_leave_thread()
        return original(*args, **kwargs)

    _enable_profiler.__msmemscope__ = True  # type: ignore[attr-defined]
    _enable_profiler.__wrapped__ = original  # type: ignore[attr-defined]
    # _enable_profiler is torch._C's, imported (not re-exported) by torch.autograd.profiler.
    profiler._enable_profiler = _enable_profiler  # type: ignore[attr-defined]


# torch's TorchDispatchMode.__init_subclass__ is unannotated.
class _WatchMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Runs the memory block watch around ops while something is watched; records nothing."""

    supports_higher_order_operators = True

    def __init__(self, tracker: NativeTracker) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's __init__ is unannotated
        self.tracker = tracker
        self.retired = False

    # `func` is typed as PyTorch's own modes type it; a higher-order operator comes here too.
    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if kwargs is None:
            kwargs = {}
        tr = self.tracker
        w = tr.watch
        if self.retired or w is None or not tr.enabled or not tr.nat.tracing():
            return func(*args, **kwargs)
        if dtensor_in(types):
            return NotImplemented
        if type(func) is not OP_OVERLOAD:
            return func(*args, **kwargs)
        try:
            info = tr.op_info(func)
        except Exception as exc:
            tr.report(exc)
            return func(*args, **kwargs)
        w.before(info, args, kwargs)
        out = func(*args, **kwargs)
        w.after(info, args, kwargs, out)
        return out


if TYPE_CHECKING:

    def _conforms(t: NativeTracker) -> Tracker:
        """mypy checks here that the native capture offers the :class:`.tracker.Tracker`
        interface."""
        return t
