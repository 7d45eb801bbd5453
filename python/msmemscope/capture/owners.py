"""Owners of tracked tensor storages: the ``owner`` attribute of MALLOC rows
(docs/analyses.md#decompose).

An owner is labels joined with ``@``: the pool (``PTA``), then the framework category when the
decompose analysis is on (``weight``, ``gradient``, ``optimizer_state``, ``activation``,
``temporary``, ``buffer``, or a framework hook's own such as ``fsdp2@all_gather``), then the user's
labels from :mod:`msmemscope.describe`, outermost first: ``PTA@activation@encoder@attn``.

A storage's category is first decided when its MALLOC row is written, from where the program is:

- inside a framework hook's :func:`scope` (this thread): that scope's category;
- inside ``Optimizer.step``: ``optimizer_state``;
- inside the autograd engine (``torch._C._current_graph_task_id() != -1``): ``temporary``;
- otherwise: ``activation``.

Some owners are only known later — a tensor becomes a module's parameter or buffer, an autograd
result becomes a parameter's ``.grad``, a tensor made in ``step()`` is kept in the optimizer's
state — and rows are written in time order, so the tracker then writes a ``SYSTEM``/``OWNER`` row
(Ptr = the block, Attr ``allocation_id, addr, size, owner``) that moves the block to its new
owner. The points where that happens mirror PyTorch's ``MemTracker``, so that both tools agree on
what each byte is: a module's parameters, their gradients and its buffers are labelled when the
module first runs forward; gradients again when autograd produces or accumulates them (tensor
hooks on each parameter); optimizer states after each ``Optimizer.step``.

Tensors made before training starts and kept throughout — a dataset loaded at module level, a
lookup table — would count as ``activation`` for the whole run. So at the first step boundary
(the first ``msmemscope.step()``, ``step start`` range or ``Optimizer.step``, whichever comes
first) the tracker looks once at the heap (``gc.get_objects()``): modules' parameters and buffers
and optimizers' states get their categories as their hooks would give them, and of the live
blocks still labelled ``activation``, those holding a tensor that a ``torch.utils.data`` Dataset
or DataLoader keeps become ``data``, and the others made before the first module forward (or
before that boundary, if no forward ran yet) become ``other``. Tensors of a batch being used at
that moment are among them until they are freed: they were made before the first forward too.

These hooks exist only while the decompose analysis is configured: a run without it pays one
attribute check per allocation.
"""

from __future__ import annotations

import gc
import threading
import types
import weakref
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

if TYPE_CHECKING:
    import ctypes

    from torch.utils.hooks import RemovableHandle

    from .tracker import Tracker

__all__ = ["decompose_enabled", "first_step", "relabel", "scope", "storage_resized"]

# --- framework categories ---------------------------------------------------------------------
WEIGHT = "weight"
BUFFER = "buffer"
GRADIENT = "gradient"
OPTIMIZER_STATE = "optimizer_state"
ACTIVATION = "activation"
TEMPORARY = "temporary"
DATA = "data"  # held by a torch.utils.data Dataset or DataLoader, made before the first step
OTHER = "other"  # made before the first step, not module or optimizer state, not data

MAX_USER_LABELS = 3
MAX_LABEL_CHARS = 128

_graph_task_id = torch._C._current_graph_task_id


class _State:
    """Process-wide owner state (one tracker per process)."""

    def __init__(self) -> None:
        self.decompose = False
        self.in_optimizer = 0
        # The describer's labels, outermost first. Process-wide, not per thread: a labelled
        # region includes the autograd engine's worker threads that run its backward.
        self.user_labels: list[str] = []
        self.scopes = threading.local()  # .stack: framework categories entered on this thread
        self.handles: list[RemovableHandle] = []  # global hooks while decompose is on
        self.seen_modules: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        # Keyed by identity: a tensor's == is elementwise.
        self.hooked_params: MutableMapping[
            torch.Tensor, tuple[RemovableHandle, RemovableHandle]
        ] = WeakIdKeyDictionary()
        # The allocation id of the first block made once a module's forward ran: blocks with a
        # smaller one came from setting up, not from a forward pass.
        self.forward_from: int | None = None
        self.stepped = False  # the first step boundary has been handled


_state = _State()

# The native capture library (native_tracker), when it records the allocations: it decides each
# block's category at allocation, so it is told the context here, once per hook.
_native: ctypes.CDLL | None = None


def attach_native(lib: ctypes.CDLL) -> None:
    """Points the owner context at the native capture library."""
    global _native
    _native = lib
    _sync_labels()


def _sync_labels() -> None:
    if _native is not None:
        _native.msmemscope_torch_labels("@".join(current_user_labels()).encode())


def decompose_enabled() -> bool:
    """Whether the decompose analysis is configured (framework categories are recorded)."""
    return _state.decompose


# --- decided at allocation ----------------------------------------------------------------------
def category_for_new() -> str | None:
    """The framework category of a storage allocated now, or ``None`` without decompose."""
    stack: list[str] | None = getattr(_state.scopes, "stack", None)
    if stack:
        return stack[-1]
    if not _state.decompose:
        return None
    if _state.in_optimizer:
        return OPTIMIZER_STATE
    if _graph_task_id() != -1:
        return TEMPORARY
    return ACTIVATION


def current_user_labels() -> tuple[str, ...]:
    """The active labels, outermost first, each once (a region nested in one with the same
    label adds nothing)."""
    labels = _state.user_labels
    # The common case, on every allocation: no describer active, nothing to build.
    return tuple(dict.fromkeys(labels)) if labels else ()


def owner_text(pool: str, category: str | None, labels: tuple[str, ...] | None) -> str:
    """``PTA``, ``PTA@weight``, ``PTA@weight@mine``..."""
    parts = [pool]
    if category:
        parts.append(category)
    if labels:
        parts.extend(labels)
    return "@".join(parts)


@contextmanager
def scope(category: str) -> Iterator[None]:
    """Tensors allocated inside (on this thread) get framework ``category`` (for framework hooks:
    ``scope("fsdp2@all_gather")``); it overrides the automatic classification."""
    _check_category(category)
    stack: list[str] | None = getattr(_state.scopes, "stack", None)
    if stack is None:
        stack = _state.scopes.stack = []
    stack.append(category)
    native = _native
    if native is not None:
        native.msmemscope_torch_scope_push(category.encode())
    try:
        yield
    finally:
        stack.pop()
        if native is not None:
            native.msmemscope_torch_scope_pop()


def relabel(tensor: object, category: str) -> None:
    """Gives ``tensor``'s storage framework ``category`` (an OWNER row when it changes). A storage
    the tracker has not seen (made before tracking started) is adopted: it gets its MALLOC row
    now, with that owner."""
    _check_category(category)
    tracker = _tracker()
    if tracker is not None and isinstance(tensor, torch.Tensor):
        tracker.set_owner(tensor, category=category)


def storage_resized(tensor: object) -> None:
    """``tensor``'s storage was resized outside the dispatcher (``UntypedStorage.resize_``, which
    FSDP uses to free and re-allocate unsharded parameters and no dispatch mode sees): the
    tracker writes the FREE of the old block and the MALLOC of the new one, keeping the owner."""
    tracker = _tracker()
    if tracker is not None and tracker.enabled and tracker.nat.tracing():
        if isinstance(tensor, torch.Tensor):
            tracker.written_storage(tensor)


def add_user_label(tensor: torch.Tensor, label: str) -> None:
    """Appends a user label to ``tensor``'s storage owner (``describer(t, owner=...)``)."""
    tracker = _tracker()
    if tracker is not None:
        tracker.set_owner(tensor, label=label)


def push_user_label(label: str) -> None:
    labels = _state.user_labels
    if label not in labels and len(set(labels)) >= MAX_USER_LABELS:
        raise ValueError(
            f"describer: at most {MAX_USER_LABELS} distinct owner labels can be active at once "
            f"(active: {', '.join(dict.fromkeys(labels))}); cannot add {label!r}"
        )
    labels.append(label)
    _sync_labels()


def pop_user_label(label: str) -> None:
    """Ends the innermost region labelled ``label`` (``__exit__`` may come from another describer
    object than ``__enter__``, as in the original msMemScope's explicit-call form)."""
    labels = _state.user_labels
    for i in range(len(labels) - 1, -1, -1):
        if labels[i] == label:
            del labels[i]
            _sync_labels()
            return
    raise ValueError(f"describer: no active region is labelled {label!r}")


def check_label(label: object) -> str:
    if not isinstance(label, str):
        raise TypeError(f"describer: owner must be a str, not {type(label).__name__}")
    if not label or len(label) > MAX_LABEL_CHARS:
        raise ValueError(
            f"describer: owner must have 1 to {MAX_LABEL_CHARS} characters, got {len(label)}"
        )
    bad = next((c for c in label if c in '@"\\' or not c.isprintable()), None)
    if bad is not None:
        raise ValueError(
            f"describer: owner {label!r} contains {bad!r}; '@' separates labels and quotes, "
            "backslashes and control characters are not accepted"
        )
    return label


def _check_category(category: object) -> None:
    if not isinstance(category, str) or not category or '"' in category or "\\" in category:
        raise ValueError(f"owner category must be a non-empty str without quotes, got {category!r}")


def _tracker() -> Tracker | None:
    from . import torch_tracker

    return torch_tracker._tracker


# --- learned later: the MemTracker points ---------------------------------------------------------
def _relabel_quietly(tensor: torch.Tensor, category: str) -> None:
    """An automatic relabel: it never replaces a framework hook's category (those contain an
    ``@``, as ``fsdp1@sharded_weight``), which knows better than a module or optimizer hook."""
    tracker = _tracker()
    if tracker is not None and tracker.enabled:
        try:
            # A DTensor's memory is its local shard.
            local = getattr(tensor, "_local_tensor", None)
            if isinstance(local, torch.Tensor):
                tensor = local
            tracker.set_owner(tensor, category=category, unless_framework=True)
        except Exception as exc:
            tracker.report(exc)


def _never_raises(hook: Callable[..., None]) -> Callable[..., None]:
    """Hooks run inside the program's forward, backward and step: an error of ours is reported
    once by the tracker and never reaches the program."""

    def guarded(*args: Any) -> None:
        try:
            hook(*args)
        except Exception as exc:
            tracker = _tracker()
            if tracker is not None:
                tracker.report(exc)

    guarded.__name__ = hook.__name__
    return guarded


@_never_raises
def _grad_hook(grad: torch.Tensor) -> None:
    if isinstance(grad, torch.Tensor):
        _relabel_quietly(grad, GRADIENT)


@_never_raises
def _post_accumulate_hook(param: torch.Tensor) -> None:
    if param.grad is not None:
        _relabel_quietly(param.grad, GRADIENT)


def _label_module(module: torch.nn.Module) -> None:
    for param in module.parameters():
        _relabel_quietly(param, WEIGHT)
        if param.grad is not None:
            _relabel_quietly(param.grad, GRADIENT)
        if param.requires_grad and param not in _state.hooked_params:
            # Tensor.register_hook and register_post_accumulate_grad_hook are unannotated.
            _state.hooked_params[param] = (
                param.register_hook(_grad_hook),  # type: ignore[no-untyped-call]
                param.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                    _post_accumulate_hook
                ),
            )
    for buf in module.buffers():
        _relabel_quietly(buf, BUFFER)


@_never_raises
def _module_pre_forward(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
    if not _state.decompose:
        return
    if _state.forward_from is None:
        tracker = _tracker()
        if tracker is not None:
            _state.forward_from = tracker.next_aid()
    if module in _state.seen_modules:
        return
    _state.seen_modules.add(module)
    _label_module(module)


@_never_raises
def _optimizer_pre_step(
    optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    _state.in_optimizer += 1
    if _native is not None:
        _native.msmemscope_torch_optimizer(1)


@_never_raises
def _optimizer_post_step(
    optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    _state.in_optimizer = max(0, _state.in_optimizer - 1)
    if _native is not None:
        _native.msmemscope_torch_optimizer(-1)
    _label_optimizer(optimizer)
    if not _state.stepped:
        first_step()


def _label_optimizer(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            _relabel_quietly(param, WEIGHT)
            if param.grad is not None:
                _relabel_quietly(param.grad, GRADIENT)
    for states in optimizer.state.values():
        for value in states.values():
            if isinstance(value, torch.Tensor):
                _relabel_quietly(value, OPTIMIZER_STATE)


# --- at the first step: what was made before training ----------------------------------------
def first_step() -> None:
    """A step boundary is about to be recorded (``msmemscope.step()``, a ``step start`` range,
    the end of an ``Optimizer.step``). The first one, while tracing, gives the blocks made before
    training that are still labelled ``activation`` their owners (see the module documentation);
    later calls return at once."""
    if _state.stepped or not _state.decompose:
        return
    tracker = _tracker()
    if tracker is None or not tracker.enabled or not tracker.nat.tracing():
        return
    _state.stepped = True
    try:
        _label_made_before_training(tracker)
    except Exception as exc:
        tracker.report(exc)


def _label_made_before_training(tracker: Tracker) -> None:
    before = _state.forward_from
    if before is None:
        before = tracker.next_aid()
    modules, optimizers, inputs = _heap_roots()
    # Module and optimizer state first: it is not `other`, even where no forward or step ran yet.
    # Each module found is labelled on its own (its submodules are found too).
    for module in modules:
        for param in module.parameters(recurse=False):
            _relabel_quietly(param, WEIGHT)
            if param.grad is not None:
                _relabel_quietly(param.grad, GRADIENT)
        for buf in module.buffers(recurse=False):
            _relabel_quietly(buf, BUFFER)
    for optimizer in optimizers:
        _label_optimizer(optimizer)
    tracker.relabel_activations(_input_blocks(inputs), before, DATA, OTHER)


def _heap_roots() -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer], list[object]]:
    """The live modules, optimizers, and Datasets and DataLoaders: one pass over the objects the
    garbage collector tracks, each type classified once."""
    from torch.utils.data import DataLoader, Dataset

    found: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
    wanted: tuple[type | tuple[type, ...], ...] = (
        torch.nn.Module,
        torch.optim.Optimizer,
        (Dataset, DataLoader),
    )
    kinds: dict[type, int] = {}
    for obj in gc.get_objects():
        # type(), not isinstance(): a proxy's __class__ could run the program's code.
        cls = type(obj)
        kind = kinds.get(cls)
        if kind is None:
            kind = kinds[cls] = next((i for i, w in enumerate(wanted) if issubclass(cls, w)), -1)
        if kind >= 0:
            found[kind].append(obj)
    return found


# How far the search for a Dataset's tensors goes: attributes of attributes, through containers
# (a Dataset or DataLoader met on the way starts over), and how many objects it looks at in all.
_INPUT_DEPTH = 6
_INPUT_VISITS = 1_000_000
_CONTAINERS = (list, tuple, set, frozenset)
_NOT_DATA = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    torch.nn.Module,
    torch.optim.Optimizer,
)
_ATOMS = (str, bytes, int, float, complex, bool, type(None))


def _input_blocks(roots: list[object]) -> set[int]:
    """The block addresses of the tensors that ``roots`` (Datasets, DataLoaders) hold in their
    attributes: a bounded walk through containers and plain objects' ``__dict__``."""
    from torch.utils.data import DataLoader, Dataset

    ptrs: set[int] = set()
    seen: set[int] = set()
    stack: list[tuple[object, int]] = [(root, 0) for root in roots]
    visits = _INPUT_VISITS
    while stack and visits > 0:
        obj, depth = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        cls = type(obj)
        children: Any
        if issubclass(cls, dict):
            children = dict.values(obj)  # type: ignore[arg-type]
        elif issubclass(cls, _CONTAINERS):
            children = obj
        elif issubclass(cls, _NOT_DATA):
            continue
        else:
            try:
                attrs = object.__getattribute__(obj, "__dict__")
            except Exception:
                continue
            if type(attrs) is not dict:
                continue
            children = attrs.values()
        depth = 0 if issubclass(cls, (Dataset, DataLoader)) else depth + 1
        for child in children:
            visits -= 1
            if visits <= 0:
                break
            kind = type(child)
            if issubclass(kind, torch.Tensor):
                try:
                    # The block starts where the storage does. Arithmetic, not
                    # untyped_storage(): that makes a Python object per storage, several times
                    # slower for a dataset of many small tensors.
                    ptr = child.data_ptr() - child.storage_offset() * child.element_size()
                except Exception:
                    continue
                if ptr:
                    ptrs.add(ptr)
            elif depth < _INPUT_DEPTH and not issubclass(kind, _ATOMS):
                stack.append((child, depth))
    return ptrs


def enable_decompose() -> None:
    """Installs the global module and optimizer hooks (idempotent)."""
    if _state.decompose:
        return
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    _state.handles = [
        register_module_forward_pre_hook(_module_pre_forward),
        register_optimizer_step_pre_hook(_optimizer_pre_step),
        register_optimizer_step_post_hook(_optimizer_post_step),
    ]
    _state.decompose = True


def disable_decompose() -> None:
    """Removes every hook :func:`enable_decompose` and the module labelling installed."""
    if not _state.decompose:
        return
    _state.decompose = False
    for handle in _state.handles:
        handle.remove()
    _state.handles = []
    for pair in list(_state.hooked_params.values()):
        for handle in pair:
            handle.remove()
    _state.hooked_params = WeakIdKeyDictionary()
    _state.seen_modules = weakref.WeakSet()
    _state.forward_from = None
    if _native is not None and _state.in_optimizer:
        _native.msmemscope_torch_optimizer(-_state.in_optimizer)
    _state.in_optimizer = 0
