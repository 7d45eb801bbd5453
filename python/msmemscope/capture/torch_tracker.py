"""PyTorch tracking: tensor blocks, ATen ops and tensor accesses as msmemscope events.

:func:`install` (the autostart ``sitecustomize`` calls it right after ``import torch`` in a
program launched by ``msmemscope``; ``msmemscope.start()`` calls it too) picks the capture:

- ``native`` (default): :mod:`.native_tracker`, PyTorch's allocators and RecordFunction
  callbacks in C++ (every block, op-internal ones and compiled regions included; threads of any
  age; ``torch.compile`` compiles);
- ``python``: the process-lifetime :class:`~torch.utils._python_dispatch.TorchDispatchMode`
  below, used when ``MSMEMSCOPE_TORCH_CAPTURE=python`` or when the native library cannot be
  built here (one warning line says why).

The rest of this docstring describes the fallback. For every ATen op it sees, it emits:

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

import collections
import contextlib
import json
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable, Collection, Sequence
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from . import extensions, modules, owners, sites

if TYPE_CHECKING:
    from _typeshed import ProfileFunction
    from torch._ops import OpOverload

    from .native_tracker import NativeTracker
    from .tracker import OpWatch, Tracker

__all__ = ["install", "installed", "reload_config", "uninstall"]

_Tensor = torch.Tensor
_PLAIN_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
_TRACKED_DEVICE_TYPES = frozenset({"cpu", "cuda"})
_OpOverload = torch._ops.OpOverload
_NO_SCOPE = contextlib.nullcontext()

# Frames from these directories are skipped at the top (innermost end) of Python stacks.
_SKIP_DIRS = tuple(
    {
        # Both are packages loaded from files: their __file__ is never None.
        os.path.dirname(resolve(cast(str, m.__file__))) + os.sep
        for m in (torch, sys.modules[__package__.rpartition(".")[0]])
        for resolve in (os.path.abspath, os.path.realpath)
    }
)


class _Config:
    """The parts of the runtime's RunConfig the tracker acts on, read once per (re)load."""

    __slots__ = (
        "access",
        "alloc",
        "c_stack",
        "decompose",
        "free",
        "launch",
        "oom",
        "python_depth",
    )

    def __init__(self, config_json: str | None = None) -> None:
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
        self.decompose = "decompose" in (cfg.get("analysis") or ())
        analyses = cfg.get("analysis") or ()
        self.oom = any(a == "oom" or (isinstance(a, dict) and "oom" in a) for a in analyses)


_FREED_KEPT = 4096


def report_once(tracker: Tracker, exc: BaseException) -> None:
    """Reports a tracker's first internal error on stderr; later ones are dropped."""
    if tracker.reported:
        return
    tracker.reported = True
    try:
        sys.stderr.write(f"msmemscope: tracker error: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
    except Exception:
        pass


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


# Ops that may give an argument they write a new block (out= arguments are keyword-only).
_RESIZING_OPS = frozenset(
    {"aten::resize_", "aten::resize_as_", "aten::set_", "aten::_resize_output_", "aten::resize"}
)


def _is_tensor_type(ty: torch._C.JitType) -> bool:
    """Whether a schema argument type holds Tensors (Tensor, Tensor?, Tensor[], Tensor?[])."""
    text = str(ty)
    return (
        text.startswith("Tensor")
        or text.startswith("Optional[Tensor]")
        or (text.startswith("List[") and "Tensor" in text)
    )


class _OpInfo:
    """What the tracker needs to know about one op overload, computed once from its schema."""

    __slots__ = ("access_args", "fresh", "name", "op", "resize_args", "single")

    def __init__(self, func: OpOverload) -> None:
        s = func._schema
        self.name = f"{s.name}.{func._overloadname}"
        self.op = s.name  # `aten::addmm`: the op an allocation site names
        # (positional index or None, name, is_write) of Tensor arguments
        access_args: list[tuple[int | None, str, bool]] = []
        # (positional index or None, name) of written args that may get a block
        resize_args: list[tuple[int | None, str]] = []
        for i, a in enumerate(s.arguments):
            if not _is_tensor_type(a.type):
                continue
            ai = a.alias_info
            write = bool(ai is not None and ai.is_write)
            pos = None if a.kwarg_only else i
            access_args.append((pos, a.name, write))
            if write and (a.kwarg_only or s.name in _RESIZING_OPS):
                resize_args.append((pos, a.name))
        self.access_args = tuple(access_args)
        self.resize_args = tuple(resize_args)
        # Indices of the returns that are new tensors (no alias annotation) holding Tensors.
        self.fresh = tuple(
            i for i, r in enumerate(s.returns) if r.alias_info is None and _is_tensor_type(r.type)
        )
        self.single = len(s.returns) == 1


def _arg(args: Sequence[Any], kwargs: dict[str, Any], pos: int | None, name: str) -> Any:
    if pos is not None and pos < len(args):
        return args[pos]
    return kwargs.get(name)


def _device_of(t: torch.Tensor) -> str | None:
    if t.is_cpu:
        return "cpu"
    if t.is_cuda:
        return f"cuda:{t.get_device()}"
    return None


class _Tracker:
    def __init__(self, nat: ModuleType) -> None:
        self.nat = nat
        self.cfg = _Config()
        self.enabled = False
        self.live: dict[int, _StorageRef] = {}  # id(storage) -> its ref (zero-byte ones too)
        # The newest freed blocks, address -> (size, device): watch() refuses an address in
        # one (its bytes are the allocator's now, not a tensor's).
        self.freed: collections.OrderedDict[int, tuple[int, str]] = collections.OrderedDict()
        self.used: dict[str, int] = {}  # device -> live tracked bytes
        self.last_aid = 0  # the newest block's allocation_id (read and bumped under the lock)
        self.lock = threading.RLock()
        self.reported = False
        self.ops: dict[OpOverload, _OpInfo] = {}
        self.op: str | None = None  # the op whose outputs get their MALLOC rows now
        self.free_cb = self._on_storage_dead
        self.E = nat.EVENT_MALLOC, nat.EVENT_FREE, nat.EVENT_ACCESS, nat.EVENT_OP_LAUNCH
        self.T = nat.TYPE_PTA, nat.TYPE_READ, nat.TYPE_WRITE, nat.TYPE_ATEN_START, nat.TYPE_ATEN_END
        # Memory block watch (msmemscope.watch): None unless a block or an op range is watched.
        attach_watch = extensions.attach_watch
        self.watch: OpWatch | None = attach_watch(self) if attach_watch is not None else None

    def report(self, exc: BaseException) -> None:
        report_once(self, exc)

    def op_info(self, func: OpOverload) -> _OpInfo:
        info = self.ops.get(func)
        if info is None:
            info = self.ops[func] = _OpInfo(func)
        return info

    # --- Python stacks --------------------------------------------------------------------------
    def python_stack(self) -> str:
        depth = self.cfg.python_depth
        if not depth:
            return ""
        f: FrameType | None = sys._getframe(1)
        skip = _SKIP_DIRS
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
            inner, user = sites.site_of(_SKIP_DIRS, sys._getframe(1))
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
        if type(t) not in _PLAIN_TENSOR_TYPES or t.device.type not in _TRACKED_DEVICE_TYPES:
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
        _, user = sites.site_of(_SKIP_DIRS, sys._getframe(1))
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
        if type(t) not in _PLAIN_TENSOR_TYPES:
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

    def accesses(
        self, info: _OpInfo, args: Sequence[Any], kwargs: dict[str, Any], out: Any
    ) -> None:
        name = info.name
        for pos, kw, write in info.access_args:
            a = _arg(args, kwargs, pos, kw)
            if isinstance(a, _Tensor):
                self.access(name, a, write)
            elif isinstance(a, (list, tuple)):
                for t in a:
                    if isinstance(t, _Tensor):
                        self.access(name, t, write)
        for t in _fresh_outputs(info, out):
            self.access(name, t, True)

    # --- one op ---------------------------------------------------------------------------------
    def after(self, info: _OpInfo, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> None:
        self.op = info.op
        try:
            for pos, kw in info.resize_args:
                a = _arg(args, kwargs, pos, kw)
                if type(a) in _PLAIN_TENSOR_TYPES:
                    self.written_storage(a)
            if info.fresh:
                plain = _PLAIN_TENSOR_TYPES
                for t in _fresh_outputs(info, out):
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


def _fresh_outputs(info: _OpInfo, out: Any) -> Sequence[torch.Tensor]:
    """The tensors among ``out`` that the schema says are new."""
    if not info.fresh:
        return ()
    if info.single:
        if isinstance(out, _Tensor):
            return (out,)
        if isinstance(out, (list, tuple)):
            return [t for t in out if isinstance(t, _Tensor)]
        return ()
    found: list[torch.Tensor] = []
    for i in info.fresh:
        o = out[i]
        if isinstance(o, _Tensor):
            found.append(o)
        elif isinstance(o, (list, tuple)):
            found.extend(t for t in o if isinstance(t, _Tensor))
    return found


_dtensor_type: type | None = None


def _dtensor_in(types: Sequence[type]) -> bool:
    """Whether a DTensor takes part in the op (DTensor is looked up once PyTorch loaded it)."""
    global _dtensor_type
    dt = _dtensor_type
    if dt is None:
        api = sys.modules.get("torch.distributed.tensor._api")
        if api is None:
            return False
        dt = _dtensor_type = api.DTensor
    return dt in types


def _cuda_reserved(dev: str) -> int:
    try:
        return int(torch.cuda.memory_reserved(torch.device(dev)))
    except Exception:
        return 0


# torch's TorchDispatchMode.__init_subclass__ is unannotated.
class MemscopeDispatchMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """msmemscope's process-lifetime dispatch mode; see the module documentation."""

    supports_higher_order_operators = True

    def __init__(self, tracker: _Tracker) -> None:
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
        if _dtensor_in(types):
            # As MemTracker does: DTensor runs its local ops, which come back here as plain
            # tensors (its shards, FSDP2's optimizer states); run under the mode, DTensor's
            # own dispatch would allocate them unseen.
            return NotImplemented
        info = tr.ops.get(func)
        if info is None and type(func) is not _OpOverload:
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


_install_lock = threading.Lock()
_tracker: _Tracker | NativeTracker | None = None
_mode: MemscopeDispatchMode | None = None
_prev_thread_profile: ProfileFunction | None = None


def _thread_start_hook(frame: FrameType, event: str, arg: Any) -> None:
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


def installed() -> bool:
    """Whether the mode is installed (and tracking)."""
    return _tracker is not None and _tracker.enabled


def reload_config() -> None:
    """Re-reads the runtime's configuration (call after ``msmemscope.config()``); turns the
    decompose hooks on or off with the decompose analysis."""
    if _tracker is None:
        return
    _tracker.cfg = cfg = _Config(_tracker.nat.current_config())
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


def _make_tracker(nat: ModuleType) -> _Tracker | NativeTracker:
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
    return _Tracker(nat)


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
    global _tracker, _mode, _prev_thread_profile
    with _install_lock:
        if _tracker is None:
            from .._runtime import native

            _tracker = _make_tracker(native())
            if isinstance(_tracker, _Tracker):  # capture() == "python"
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
        _tracker.enabled = True
        _enter_on_this_thread(_mode)
        if threading.getprofile() is not _thread_start_hook:
            _prev_thread_profile = threading.getprofile()
            threading.setprofile(_thread_start_hook)


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
        _tracker.enabled = False
        if threading.getprofile() is _thread_start_hook:
            threading.setprofile(_prev_thread_profile)
        stack = _get_current_dispatch_mode_stack()
        if stack and stack[-1] is _mode:
            # torch's __exit__ is unannotated
            _mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]


if TYPE_CHECKING:

    def _conforms(t: _Tracker) -> Tracker:
        """mypy checks here that the fallback offers the :class:`.tracker.Tracker` interface."""
        return t
