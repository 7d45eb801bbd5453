"""PyTorch tracking: tensor storages, ATen ops and tensor accesses as msmemscope events.

:func:`install` enters a process-lifetime :class:`~torch.utils._python_dispatch.TorchDispatchMode`
(the autostart ``sitecustomize`` calls it right after ``import torch`` in a program launched by
``msmemscope``; ``msmemscope.start()`` calls it too). For every ATen op it sees, it emits:

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

- storages created before :func:`install` (or while tracing is off), zero-byte storages (no
  memory; they get a ``MALLOC`` when an op later gives them bytes), memory of tensor subclasses
  (FakeTensor, DTensor wrappers, meta tensors);
- allocations internal to one op's kernel (temporaries that are never an op's output);
- ops run by threads that existed before :func:`install`: dispatch modes are thread-local. New
  ``threading`` threads enter the mode through a ``threading.setprofile`` hook; the autograd
  engine copies the caller's mode to its worker threads, so backward ops are seen;
- ``torch.compile``: Dynamo does not compile while a user dispatch mode is active, so compiled
  functions run eagerly under msmemscope (the same results; every op is visible);
- higher-order operators (``torch.cond``...) run untracked inside.

Nothing here raises into the program: an internal error is reported once on stderr
(``msmemscope: tracker error: ...``) and the op runs as without msmemscope.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

__all__ = ["install", "installed", "reload_config", "uninstall"]

_Tensor = torch.Tensor
_PLAIN_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
_TRACKED_DEVICE_TYPES = frozenset({"cpu", "cuda"})
_OpOverload = torch._ops.OpOverload

# Frames from these directories are skipped at the top (innermost end) of Python stacks.
_SKIP_DIRS = tuple(
    os.path.dirname(os.path.realpath(m.__file__)) + os.sep
    for m in (torch, sys.modules[__package__.rpartition(".")[0]])
)


class _Config:
    """The parts of the runtime's RunConfig the tracker acts on, read once per (re)load."""

    __slots__ = ("access", "alloc", "c_stack", "free", "launch", "python_depth")

    def __init__(self, config_json: str | None = None):
        cfg = json.loads(config_json) if config_json else {}
        events = set(cfg.get("events", ("alloc", "free", "launch")))
        level = cfg.get("level", "op")
        levels = {level} if isinstance(level, str) else set(level or ())
        self.access = "access" in events
        # access implies alloc and free (the CLI resolves that too).
        self.alloc = "alloc" in events or self.access
        self.free = "free" in events or self.access
        self.launch = "launch" in events and "op" in levels
        stacks = cfg.get("call_stack") or {}
        self.python_depth = stacks.get("python") or 0
        self.c_stack = stacks.get("c") is not None


class _StorageRef(weakref.ref):
    """A weak reference to a tracked storage, carrying its block (the FREE needs it after the
    storage is gone)."""

    __slots__ = ("aid", "device", "key", "ptr", "size")


class _Tracker:
    def __init__(self, nat):
        self.nat = nat
        self.cfg = _Config()
        self.enabled = False
        self.live: dict[int, _StorageRef] = {}  # id(storage) -> its ref (zero-byte ones too)
        self.used: dict[str, int] = {}  # device -> live tracked bytes
        self.ids = itertools.count(1)
        self.lock = threading.RLock()
        self.reported = False
        self.schemas: dict = {}  # OpOverload -> (name, arg plan, fresh-return flags)
        self.free_cb = self._on_storage_dead
        self.E = nat.EVENT_MALLOC, nat.EVENT_FREE, nat.EVENT_ACCESS, nat.EVENT_OP_LAUNCH
        self.T = (
            nat.TYPE_PTA,
            nat.TYPE_READ,
            nat.TYPE_WRITE,
            nat.TYPE_ATEN_START,
            nat.TYPE_ATEN_END,
        )

    # --- errors -------------------------------------------------------------------------------
    def report(self, exc: BaseException) -> None:
        if self.reported:
            return
        self.reported = True
        try:
            sys.stderr.write(f"msmemscope: tracker error: {type(exc).__name__}: {exc}\n")
            sys.stderr.flush()
        except Exception:
            pass

    # --- per-op schema facts --------------------------------------------------------------------
    def schema(self, func):
        info = self.schemas.get(func)
        if info is None:
            s = func._schema
            name = f"{s.name}.{func._overloadname}"
            plan = []  # (positional index or None, kwarg name, is_write)
            for i, a in enumerate(s.arguments):
                ai = a.alias_info
                plan.append(
                    (None if a.kwarg_only else i, a.name, bool(ai is not None and ai.is_write))
                )
            fresh = tuple(r.alias_info is None for r in s.returns)
            info = (name, tuple(plan), fresh)
            self.schemas[func] = info
        return info

    # --- Python stacks --------------------------------------------------------------------------
    def python_stack(self) -> str:
        depth = self.cfg.python_depth
        if not depth:
            return ""
        f = sys._getframe(1)
        skip = _SKIP_DIRS
        while f is not None and f.f_code.co_filename.startswith(skip):
            f = f.f_back
        lines = []
        while f is not None and len(lines) < depth:
            co = f.f_code
            lines.append(f"{co.co_filename}({f.f_lineno}): {co.co_name}")
            f = f.f_back
        return "\n".join(lines)

    # --- storages -------------------------------------------------------------------------------
    def _malloc(self, ref: _StorageRef, dev: str, ptr: int, size: int, stack: str) -> None:
        nat = self.nat
        with self.lock:
            aid = next(self.ids)
            used = self.used.get(dev, 0) + size
            self.used[dev] = used
            ref.aid, ref.device, ref.ptr, ref.size = aid, dev, ptr, size
            if not self.cfg.alloc:
                return
            attrs = {"allocation_id": aid, "addr": f"0x{ptr:016x}", "size": size, "used": used}
            if dev != "cpu":
                attrs["total"] = _cuda_reserved(dev)
            attrs["owner"] = "PTA"
            nat.emit(self.E[0], self.T[0], "N/A", dev, ptr, attrs, stack, self.cfg.c_stack)

    def _free(self, ref: _StorageRef, stack: str = "") -> None:
        size = ref.size
        if not size:
            return
        dev = ref.device
        with self.lock:
            used = self.used.get(dev, 0) - size
            self.used[dev] = used
            ref.size = 0
            if not self.cfg.free:
                return
            attrs = {
                "allocation_id": ref.aid,
                "addr": f"0x{ref.ptr:016x}",
                "size": size,
                "used": used,
            }
            if dev != "cpu":
                attrs["total"] = _cuda_reserved(dev)
            self.nat.emit(self.E[1], self.T[0], "N/A", dev, ref.ptr, attrs, stack, False)

    def _on_storage_dead(self, ref: _StorageRef) -> None:
        try:
            if self.live.get(ref.key) is ref:
                del self.live[ref.key]
            self._free(ref)
        except Exception as exc:
            self.report(exc)

    def see_storage(self, t, stack_box: list, written: bool = False) -> None:
        """Registers the storage of a tensor an op returned (``written``: one it wrote in place),
        emitting a MALLOC when it is new or was resized. A storage first seen being written in
        place predates tracking and stays untracked."""
        st = t.untyped_storage()
        key = id(st)
        ref = self.live.get(key)
        if ref is not None:
            if ref.size == st.nbytes() and (not ref.size or ref.ptr == st.data_ptr()):
                return
            # Resized (or first given bytes): the old block is gone, a new one exists.
            self._free(ref)
        elif written:
            return
        else:
            dev_type = t.device.type
            if dev_type not in _TRACKED_DEVICE_TYPES:
                return
            ref = _StorageRef(st, self.free_cb)
            ref.key, ref.size, ref.aid, ref.ptr = key, 0, 0, 0
            ref.device = "cpu" if dev_type == "cpu" else f"cuda:{t.device.index or 0}"
            self.live[key] = ref
        size = st.nbytes()
        if size:
            if stack_box[0] is None:
                stack_box[0] = self.python_stack()
            self._malloc(ref, ref.device, st.data_ptr(), size, stack_box[0])

    # --- access rows ----------------------------------------------------------------------------
    def access(self, name: str, t, write: bool) -> None:
        if type(t) not in _PLAIN_TENSOR_TYPES or t.device.type not in _TRACKED_DEVICE_TYPES:
            return
        st = t.untyped_storage()
        d = t.device
        dev = "cpu" if d.type == "cpu" else f"cuda:{d.index or 0}"
        attrs = {"dtype": str(t.dtype)[6:], "shape": list(t.shape)}
        self.nat.emit(
            self.E[2], self.T[2] if write else self.T[1], name, dev, st.data_ptr(), attrs, "", False
        )

    # --- one op ---------------------------------------------------------------------------------
    def before(self, func, args, kwargs):
        info = self.schema(func)
        cfg = self.cfg
        if cfg.launch:
            self.nat.emit(self.E[3], self.T[3], info[0], None, None, None, "", False)
        return info

    def after(self, func, info, args, kwargs, out) -> None:
        cfg = self.cfg
        name, plan, fresh = info
        stack_box = [None]
        written = None
        # Arguments: reads, writes (in-place and out=), and storages an op resized.
        for pos, kw, is_write in plan:
            if pos is not None and pos < len(args):
                a = args[pos]
            elif kw in kwargs:
                a = kwargs[kw]
            else:
                continue
            if isinstance(a, _Tensor):
                items = (a,)
            elif isinstance(a, (list, tuple)) and a and isinstance(a[0], _Tensor):
                items = a
            else:
                continue
            for t in items:
                if not isinstance(t, _Tensor):
                    continue
                if is_write:
                    if written is None:
                        written = set()
                    written.add(id(t))
                    if type(t) in _PLAIN_TENSOR_TYPES:
                        self.see_storage(t, stack_box, True)
                if cfg.access:
                    self.access(name, t, is_write)
        # Fresh outputs: new storages, and WRITE rows.
        if isinstance(out, _Tensor):
            outs = ((out, fresh[0] if fresh else True),)
        elif isinstance(out, (tuple, list)):
            if len(fresh) == len(out):
                outs = tuple(zip(out, fresh, strict=True))
            else:  # one Tensor[] return
                f = fresh[0] if fresh else True
                outs = tuple((o, f) for o in out)
        else:
            outs = ()
        for o, is_fresh in outs:
            if not is_fresh:
                continue
            if isinstance(o, (list, tuple)):
                items = o
            else:
                items = (o,)
            for t in items:
                if type(t) not in _PLAIN_TENSOR_TYPES:
                    continue
                if written is not None and id(t) in written:
                    continue
                self.see_storage(t, stack_box)
                if cfg.access:
                    self.access(name, t, True)

    def end(self, info) -> None:
        if self.cfg.launch:
            self.nat.emit(self.E[3], self.T[4], info[0], None, None, None, "", False)


def _cuda_reserved(dev: str) -> int:
    try:
        return int(torch.cuda.memory_reserved(torch.device(dev)))
    except Exception:
        return 0


class MemscopeDispatchMode(TorchDispatchMode):
    """msmemscope's process-lifetime dispatch mode; see the module documentation."""

    supports_higher_order_operators = True

    def __init__(self, tracker: _Tracker):
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        tr = self.tracker
        if not tr.enabled or type(func) is not _OpOverload or not tr.nat.tracing():
            return func(*args, **kwargs)
        info = None
        try:
            info = tr.before(func, args, kwargs)
        except Exception as exc:
            tr.report(exc)
        try:
            out = func(*args, **kwargs)
        except BaseException:
            if info is not None:
                try:
                    tr.end(info)
                except Exception as exc:
                    tr.report(exc)
            raise
        if info is not None:
            try:
                tr.after(func, info, args, kwargs, out)
                tr.end(info)
            except Exception as exc:
                tr.report(exc)
        return out


_install_lock = threading.Lock()
_tracker: _Tracker | None = None
_mode: MemscopeDispatchMode | None = None
_prev_thread_profile = None


def _thread_start_hook(frame, event, arg):
    """``threading.setprofile`` hook: the first profile event of a new thread enters the mode
    there, then hands the thread to the profile function that was registered before us."""
    sys.setprofile(_prev_thread_profile)
    try:
        mode = _mode
        if mode is not None and mode.tracker.enabled:
            _enter_on_this_thread(mode)
    except Exception as exc:
        if _tracker is not None:
            _tracker.report(exc)


def _enter_on_this_thread(mode: MemscopeDispatchMode) -> None:
    if any(m is mode for m in _get_current_dispatch_mode_stack()):
        return
    mode.__enter__()


def installed() -> bool:
    """Whether the mode is installed (and tracking)."""
    return _tracker is not None and _tracker.enabled


def reload_config() -> None:
    """Re-reads the runtime's configuration (call after ``msmemscope.config()``)."""
    if _tracker is not None:
        _tracker.cfg = _Config(_tracker.nat.current_config())


def install() -> None:
    """Starts PyTorch tracking on this thread and on threads started from now on. Idempotent:
    a second call only re-reads the configuration and makes sure this thread has the mode."""
    global _tracker, _mode, _prev_thread_profile
    with _install_lock:
        if _tracker is None:
            from .._runtime import native

            _tracker = _Tracker(native())
            _mode = MemscopeDispatchMode(_tracker)
        reload_config()
        _tracker.enabled = True
        _enter_on_this_thread(_mode)
        if threading.getprofile() is not _thread_start_hook:
            _prev_thread_profile = threading.getprofile()
            threading.setprofile(_thread_start_hook)


def uninstall() -> None:
    """Stops PyTorch tracking: the mode leaves this thread's mode stack (when it is on top) and
    turns inert everywhere; storages already tracked still get their FREE rows."""
    with _install_lock:
        if _tracker is None or _mode is None:
            return
        _tracker.enabled = False
        if threading.getprofile() is _thread_start_hook:
            threading.setprofile(_prev_thread_profile)
        stack = _get_current_dispatch_mode_stack()
        if stack and stack[-1] is _mode:
            _mode.__exit__(None, None, None)
