"""The dispatch-mode fallback of the PyTorch capture: a process-lifetime
:class:`~torch.utils._python_dispatch.TorchDispatchMode`, used when
``MSMEMSCOPE_TORCH_CAPTURE=python`` or when the native library cannot be built here
(:mod:`.torch_tracker` picks it).

For every ATen op it sees, it emits:

- ``OP_LAUNCH`` ``ATEN_START`` before and ``ATEN_END`` after the op (``launch`` events with
  ``--level=op``), named like ``aten::addmm.default``;
- ``MALLOC`` (Event Type ``PTA``) the first time an op returns a tensor whose storage is new, with
  ``allocation_id, addr, size`` (= ``storage.nbytes()``), ``used`` (the tracker's sum of live
  tracked bytes on that device), ``total`` (CUDA only: ``torch.cuda.memory_reserved``) and
  ``owner``; a weakref callback on the storage emits the matching ``FREE`` when the storage dies
  (PyObject preservation, PyTorch >= 2.1, keeps one Python object per live storage). A storage
  that an op resizes gets a ``FREE`` of the old block and a ``MALLOC`` of the new one;
- ``ACCESS`` ``READ``/``WRITE`` per tensor argument and fresh output (``access`` events), from the
  op schema's alias annotations, with ``dtype`` and ``shape``.

What it does not see, by design or by PyTorch's rules:

- storages created before :func:`.torch_tracker.install` (or while tracing is off), zero-byte
  storages (no memory; they get a ``MALLOC`` when an op later gives them bytes), memory of
  tensor subclasses (FakeTensor, DTensor wrappers, meta tensors);
- allocations internal to one op's kernel (temporaries that are never an op's output);
- ops run by threads that existed before :func:`.torch_tracker.install`: dispatch modes are
  thread-local. New ``threading`` threads enter the mode through a ``threading.setprofile``
  hook; the autograd engine copies the caller's mode to its worker threads, so backward ops
  are seen;
- ``torch.compile``: Dynamo does not compile while a user dispatch mode is active, so compiled
  functions run eagerly under msmemscope (the same results; every op is visible);
- higher-order operators (``torch.cond``...) run untracked inside.

Nothing here raises into the program: an internal error is reported once on stderr
(``msmemscope: tracker error: ...``) and the op runs as without msmemscope.
"""

from __future__ import annotations

import collections
import contextlib
import re
import sys
import threading
import weakref
from collections.abc import Callable, Collection, Sequence
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from . import extensions, modules, owners, sites
from .config import SKIP_DIRS, Config, report_once
from .op_info import OP_OVERLOAD, PLAIN_TENSOR_TYPES, OpInfo, arg, dtensor_in, fresh_outputs

if TYPE_CHECKING:
    from _typeshed import ProfileFunction
    from torch._ops import OpOverload

    from .tracker import OpWatch, Tracker

__all__ = ["DispatchTracker", "MemscopeDispatchMode", "start", "stop"]

_Tensor = torch.Tensor
_TRACKED_DEVICE_TYPES = frozenset({"cpu", "cuda"})
_NO_SCOPE = contextlib.nullcontext()
_FREED_KEPT = 4096


class _StorageRef(weakref.ref[torch.UntypedStorage]):
    """A weak reference to a tracked storage, carrying its block (the FREE needs it after the
    storage is gone)."""

    __slots__ = ("aid", "category", "device", "key", "labels", "ptr", "size")
    aid: int  # the block's allocation_id (0 before its MALLOC)
    category: str | None  # framework category; both None until the owner is first decided
    device: str
    key: int  # id() of the storage
    labels: tuple[str, ...] | None  # user labels
    ptr: int
    size: int  # 0 once freed


def _device_of(t: torch.Tensor) -> str | None:
    if t.is_cpu:
        return "cpu"
    if t.is_cuda:
        return f"cuda:{t.get_device()}"
    return None


class DispatchTracker:
    def __init__(self, nat: ModuleType) -> None:
        self.nat = nat
        self.cfg = Config()
        self.enabled = False
        self.live: dict[int, _StorageRef] = {}  # id(storage) -> its ref (zero-byte ones too)
        # The newest freed blocks, address -> (size, device): watch() refuses an address in
        # one (its bytes are the allocator's now, not a tensor's).
        self.freed: collections.OrderedDict[int, tuple[int, str]] = collections.OrderedDict()
        self.used: dict[str, int] = {}  # device -> live tracked bytes
        self.last_aid = 0  # the newest block's allocation_id (read and bumped under the lock)
        self.lock = threading.RLock()
        self.reported = False
        self.ops: dict[OpOverload, OpInfo] = {}
        self.op: str | None = None  # the op whose outputs get their MALLOC rows now
        self.free_cb = self._on_storage_dead
        self.E = nat.EVENT_MALLOC, nat.EVENT_FREE, nat.EVENT_ACCESS, nat.EVENT_OP_LAUNCH
        self.T = nat.TYPE_PTA, nat.TYPE_READ, nat.TYPE_WRITE, nat.TYPE_ATEN_START, nat.TYPE_ATEN_END
        # Memory block watch (msmemscope.watch): None unless a block or an op range is watched.
        attach_watch = extensions.attach_watch
        self.watch: OpWatch | None = attach_watch(self) if attach_watch is not None else None

    def report(self, exc: BaseException) -> None:
        report_once(self, exc)

    def op_info(self, func: OpOverload) -> OpInfo:
        info = self.ops.get(func)
        if info is None:
            info = self.ops[func] = OpInfo(func)
        return info

    # --- Python stacks --------------------------------------------------------------------------
    def python_stack(self) -> str:
        depth = self.cfg.python_depth
        if not depth:
            return ""
        f: FrameType | None = sys._getframe(1)
        skip = SKIP_DIRS
        while f is not None and f.f_code.co_filename.startswith(skip):
            f = f.f_back
        lines: list[str] = []
        while f is not None and len(lines) < depth:
            co = f.f_code
            lines.append(f"{co.co_filename}({f.f_lineno}): {co.co_name}")
            f = f.f_back
        return "\n".join(lines)

    # --- storages -------------------------------------------------------------------------------
    # The attrs dicts are built before taking the lock: allocating a container may run the
    # garbage collector, whose weakref callbacks (FREEs, on this thread) must not land between
    # reading and writing the running sum.
    def _malloc(self, ref: _StorageRef, ptr: int, size: int) -> None:
        cfg = self.cfg
        stack = self.python_stack() if cfg.python_depth else ""
        dev = ref.device
        attrs = {"allocation_id": 0, "addr": f"0x{ptr:016x}", "size": size, "used": 0}
        if dev != "cpu":
            attrs["total"] = _cuda_reserved(dev)
        if ref.category is None and ref.labels is None:
            ref.category = owners.category_for_new()
            ref.labels = owners.current_user_labels()
        attrs["owner"] = owners.owner_text("PTA", ref.category, ref.labels)
        if cfg.alloc:
            inner, user = sites.site_of(SKIP_DIRS, sys._getframe(1))
            if user is not None:
                attrs["site"] = user
            if inner is not None and inner != user:
                attrs["frame"] = inner
            if self.op is not None:
                attrs["op"] = self.op
            module = modules.current()
            if module is not None:
                attrs["module"] = module
        with self.lock:
            aid = self.last_aid = self.last_aid + 1
            used = self.used.get(dev, 0) + size
            self.used[dev] = used
            ref.aid, ref.ptr, ref.size = aid, ptr, size
            if cfg.alloc:
                attrs["allocation_id"] = aid
                attrs["used"] = used
                self.nat.emit(self.E[0], self.T[0], "N/A", dev, ptr, attrs, stack, cfg.c_stack)

    def _free(self, ref: _StorageRef) -> None:
        size = ref.size
        if not size:
            return
        dev = ref.device
        ptr = ref.ptr
        attrs = {"allocation_id": ref.aid, "addr": f"0x{ptr:016x}", "size": size, "used": 0}
        if dev != "cpu":
            attrs["total"] = _cuda_reserved(dev)
        with self.lock:
            if ref.size != size:  # freed meanwhile (a resize on another thread)
                return
            used = self.used.get(dev, 0) - size
            self.used[dev] = used
            ref.size = 0
            self.freed[ptr] = (size, dev)
            self.freed.move_to_end(ptr)
            if len(self.freed) > _FREED_KEPT:
                self.freed.popitem(last=False)
            if self.cfg.free:
                attrs["used"] = used
                self.nat.emit(self.E[1], self.T[0], "N/A", dev, ptr, attrs, "", False)

    def _on_storage_dead(self, ref: _StorageRef) -> None:
        try:
            if self.live.get(ref.key) is ref:
                del self.live[ref.key]
            self._free(ref)
        except Exception as exc:
            self.report(exc)

    def new_storage(self, t: torch.Tensor) -> _StorageRef | None:
        """An op returned ``t`` as a new tensor: a storage not seen before gets a MALLOC."""
        st = t.untyped_storage()
        key = id(st)
        if key in self.live:
            return None
        dev = _device_of(t)
        if dev is None:
            return None
        ref = _StorageRef(st, self.free_cb)
        ref.key, ref.device, ref.size, ref.aid, ref.ptr = key, dev, 0, 0, 0
        ref.category = ref.labels = None
        self.live[key] = ref
        size = st.nbytes()
        if size:
            self._malloc(ref, st.data_ptr(), size)
        return ref

    # --- owners ---------------------------------------------------------------------------------
    def set_owner(
        self,
        t: torch.Tensor,
        category: str | None = None,
        label: str | None = None,
        unless_framework: bool = False,
    ) -> None:
        """Gives ``t``'s storage a framework ``category`` and/or appends a user ``label``; a
        changed owner of a live block is written as a SYSTEM/OWNER row. A storage not tracked
        yet (made before tracking) is adopted with that owner: its MALLOC row is written now.
        With ``unless_framework``, a category a framework hook gave (``fsdp1@...``) stays."""
        if type(t) not in PLAIN_TENSOR_TYPES or t.device.type not in _TRACKED_DEVICE_TYPES:
            return
        st = t.untyped_storage()
        ref = self.live.get(id(st))
        if ref is None:
            if not self.enabled:
                return
            with owners.scope(category) if category else _NO_SCOPE:
                ref = self.new_storage(t)
            if ref is None or label is None:
                return
        old = (ref.category, ref.labels)
        labels = ref.labels
        # Zero-byte so far: no MALLOC yet. (The category and the labels are first set together,
        # so the category is None too.)
        if labels is None:
            labels = ref.labels = ()
        if unless_framework and ref.category and "@" in ref.category:
            category = None
        if category is not None:
            ref.category = category
        if label is not None and label not in labels:
            if len(labels) >= owners.MAX_USER_LABELS:
                raise ValueError(
                    f"describer: a tensor carries at most {owners.MAX_USER_LABELS} owner labels "
                    f"(it has {', '.join(labels)}); cannot add {label!r}"
                )
            ref.labels = (*labels, label)
        if (ref.category, ref.labels) != old:
            self._owner_row(ref)

    def _owner_row(self, ref: _StorageRef) -> None:
        """The SYSTEM/OWNER row that moves ``ref``'s live block to its current owner."""
        if not ref.size or not self.cfg.alloc:
            return
        owner = owners.owner_text("PTA", ref.category, ref.labels)
        attrs = {"allocation_id": ref.aid, "addr": f"0x{ref.ptr:016x}", "size": ref.size}
        attrs["owner"] = owner
        nat = self.nat
        nat.emit(nat.EVENT_SYSTEM, nat.TYPE_OWNER, owner, ref.device, ref.ptr, attrs, "", False)

    def next_aid(self) -> int:
        with self.lock:
            return self.last_aid + 1

    def relabel_activations(
        self, data_ptrs: Collection[int], before: int, data: str, other: str
    ) -> int:
        """See :meth:`.tracker.Tracker.relabel_activations`."""
        data_ptrs = frozenset(data_ptrs)
        moved = 0
        # A copy: FREEs (weakref callbacks) may remove entries meanwhile.
        for ref in list(self.live.values()):
            if ref.category != owners.ACTIVATION or not ref.size:
                continue
            if ref.ptr in data_ptrs:
                ref.category = data
            elif ref.aid < before:
                ref.category = other
            else:
                continue
            self._owner_row(ref)
            moved += 1
        return moved

    def written_storage(self, t: torch.Tensor) -> None:
        """An op that may reallocate wrote ``t``: a tracked storage whose block changed gets a
        FREE of the old block and a MALLOC of the new one."""
        st = t.untyped_storage()
        ref = self.live.get(id(st))
        if ref is None:
            return  # predates tracking
        size = st.nbytes()
        ptr = st.data_ptr() if size else 0
        if ref.size == size and ref.ptr == ptr:
            return
        self._free(ref)
        if size:
            self._malloc(ref, ptr, size)

    # --- access rows ----------------------------------------------------------------------------
    def oom(
        self, op_name: str, failure: BaseException, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> None:
        """An OOM_TRIGGER row for a failed tensor allocation: the op, the requested size, the
        allocator's message. The runtime adds the live blocks when `--analysis=oom` is on."""
        message = (
            str(failure).strip().splitlines()[0] if str(failure).strip() else type(failure).__name__
        )
        device = None
        for a in torch.utils._pytree.tree_leaves((args, kwargs)):
            if isinstance(a, torch.device):
                device = a
            elif isinstance(a, torch.Tensor):
                device = a.device
            if device is not None:
                break
        dev = "cpu" if device is None or device.type == "cpu" else f"cuda:{device.index or 0}"
        attrs = {"func": op_name, "req_size": _requested_bytes(str(failure)), "error": message}
        _, user = sites.site_of(SKIP_DIRS, sys._getframe(1))
        if user is not None:
            attrs["site"] = user
        nat = self.nat
        nat.emit(
            nat.EVENT_OOM_DETAIL,
            nat.TYPE_OOM_TRIGGER,
            op_name,
            dev,
            None,
            attrs,
            self.python_stack(),
            True,
        )

    def access(self, name: str, t: torch.Tensor, write: bool) -> None:
        if type(t) not in PLAIN_TENSOR_TYPES:
            return
        dev = _device_of(t)
        if dev is None:
            return
        attrs = {"dtype": str(t.dtype)[6:], "shape": list(t.shape)}
        self.nat.emit(
            self.E[2],
            self.T[2] if write else self.T[1],
            name,
            dev,
            t.untyped_storage().data_ptr(),
            attrs,
            "",
            False,
        )

    def accesses(self, info: OpInfo, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> None:
        name = info.name
        for pos, kw, write in info.access_args:
            a = arg(args, kwargs, pos, kw)
            if isinstance(a, _Tensor):
                self.access(name, a, write)
            elif isinstance(a, (list, tuple)):
                for t in a:
                    if isinstance(t, _Tensor):
                        self.access(name, t, write)
        for t in fresh_outputs(info, out):
            self.access(name, t, True)

    # --- one op ---------------------------------------------------------------------------------
    def after(self, info: OpInfo, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> None:
        self.op = info.op
        try:
            for pos, kw in info.resize_args:
                a = arg(args, kwargs, pos, kw)
                if type(a) in PLAIN_TENSOR_TYPES:
                    self.written_storage(a)
            if info.fresh:
                plain = PLAIN_TENSOR_TYPES
                for t in fresh_outputs(info, out):
                    if type(t) in plain:
                        self.new_storage(t)
        finally:
            self.op = None


_REQUESTED = re.compile(r"tried to allocate (\d+) bytes|Tried to allocate ([0-9.]+) ([KMGT]i?B)")
_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _is_allocation_failure(exc: BaseException) -> bool:
    """A tensor allocation that failed: CUDA's OutOfMemoryError, or the CPU allocator's
    RuntimeError ("DefaultCPUAllocator: can't allocate memory")."""
    oom = getattr(torch, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _requested_bytes(message: str) -> int:
    """The requested size named in an allocator's message (0 when it names none)."""
    m = _REQUESTED.search(message)
    if not m:
        return 0
    if m.group(1):
        return int(m.group(1))
    return int(float(m.group(2)) * _UNITS.get(m.group(3), 1))


def _cuda_reserved(dev: str) -> int:
    try:
        return int(torch.cuda.memory_reserved(torch.device(dev)))
    except Exception:
        return 0


# torch's TorchDispatchMode.__init_subclass__ is unannotated.
class MemscopeDispatchMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """msmemscope's process-lifetime dispatch mode; see the module documentation."""

    supports_higher_order_operators = True

    def __init__(self, tracker: DispatchTracker) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's __init__ is unannotated
        self.tracker = tracker
        self.tracing: Callable[[], bool] = tracker.nat.tracing

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
        if not tr.enabled or not self.tracing():
            return func(*args, **kwargs)
        if dtensor_in(types):
            # As MemTracker does: DTensor runs its local ops, which come back here as plain
            # tensors (its shards, FSDP2's optimizer states); run under the mode, DTensor's
            # own dispatch would allocate them unseen.
            return NotImplemented
        info = tr.ops.get(func)
        if info is None and type(func) is not OP_OVERLOAD:
            return func(*args, **kwargs)  # a higher-order operator: runs untracked inside
        try:
            if info is None:
                info = tr.op_info(func)
            cfg = tr.cfg
            if cfg.launch:
                tr.nat.emit(tr.E[3], tr.T[3], info.name, None, None, None, "", False)
        except Exception as exc:
            tr.report(exc)
            return func(*args, **kwargs)
        w = tr.watch  # memory block watch: checksums before the op (msmemscope.watch)
        if w is not None:
            w.before(info, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except BaseException as failure:
            try:
                if _is_allocation_failure(failure):
                    tr.oom(info.name, failure, args, kwargs)
                if cfg.launch:
                    tr.nat.emit(tr.E[3], tr.T[4], info.name, None, None, None, "", False)
            except Exception as exc:
                tr.report(exc)
            raise
        try:
            if info.fresh or info.resize_args:
                tr.after(info, args, kwargs, out)
            if cfg.access:
                tr.accesses(info, args, kwargs, out)
            if cfg.launch:
                tr.nat.emit(tr.E[3], tr.T[4], info.name, None, None, None, "", False)
        except Exception as exc:
            tr.report(exc)
        if w is not None:  # memory block watch: checksums after the op
            w.after(info, args, kwargs, out)
        return out


_mode: MemscopeDispatchMode | None = None  # the mode that threads started from now on enter
_prev_thread_profile: ProfileFunction | None = None


def start(mode: MemscopeDispatchMode) -> None:
    """Tracking on: the mode enters this thread's mode stack and every thread started from now
    on (through a ``threading.setprofile`` hook)."""
    global _mode, _prev_thread_profile
    _mode = mode
    mode.tracker.enabled = True
    _enter_on_this_thread(mode)
    if threading.getprofile() is not _thread_start_hook:
        _prev_thread_profile = threading.getprofile()
        threading.setprofile(_thread_start_hook)


def stop(mode: MemscopeDispatchMode) -> None:
    """Tracking off: the mode leaves this thread's mode stack (when it is on top) and turns
    inert everywhere; storages already tracked still get their FREE rows."""
    mode.tracker.enabled = False
    if threading.getprofile() is _thread_start_hook:
        threading.setprofile(_prev_thread_profile)
    stack = _get_current_dispatch_mode_stack()
    if stack and stack[-1] is mode:
        # torch's __exit__ is unannotated
        mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]


def _thread_start_hook(frame: FrameType, event: str, arg: Any) -> None:
    """``threading.setprofile`` hook: the first profile event of a new thread enters the mode
    there, then hands the thread to the profile function that was registered before us."""
    sys.setprofile(_prev_thread_profile)
    try:
        mode = _mode
        if mode is not None and mode.tracker.enabled:
            _enter_on_this_thread(mode)
    except Exception as exc:
        if _mode is not None:
            _mode.tracker.report(exc)


def _enter_on_this_thread(mode: MemscopeDispatchMode) -> None:
    if any(m is mode for m in _get_current_dispatch_mode_stack()):
        return
    mode.__enter__()  # type: ignore[no-untyped-call]  # torch's __enter__ is unannotated
    if threading.current_thread() is not threading.main_thread():
        _thread_end.leaver = _LeaveOnThreadEnd(mode)


class _LeaveOnThreadEnd:
    """Takes the mode off its thread's mode stack when the thread ends.

    Left there, the mode would be released by the thread's C++ thread-local destructor, after the
    thread's Python state is gone; releasing a Python object needs the GIL, and when the main
    thread is finalizing the interpreter by then (it may be, once it has joined the thread),
    taking the GIL ends the thread inside that destructor and the process aborts ("terminate
    called without an active exception"). A ``threading.local`` value is released while the
    thread still holds the GIL, before its join returns.
    """

    def __init__(self, mode: MemscopeDispatchMode) -> None:
        self.mode = mode

    def __del__(self) -> None:
        try:
            stack = _get_current_dispatch_mode_stack()
            if stack and stack[-1] is self.mode:
                # torch's __exit__ is unannotated
                self.mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        except Exception:  # at thread end nothing may escape (it would print a warning)
            pass


_thread_end = threading.local()


if TYPE_CHECKING:

    def _conforms(t: DispatchTracker) -> Tracker:
        """mypy checks here that the fallback offers the :class:`.tracker.Tracker` interface."""
        return t
