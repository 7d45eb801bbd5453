"""How decompose hooks label memory, over :mod:`msmemscope.capture.owners`: a region whose
new tensors get a category, an already allocated tensor that gets one, and regions that open in
one framework callback and close in another (forward pre/post hooks)."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_open = threading.local()  # .stack: (category, context manager) opened by `enter`, per thread
_reported = False


def _owners() -> ModuleType | None:
    """The owners module once the PyTorch tracker can use it, else ``None`` (hooks then only
    pass through)."""
    return sys.modules.get("msmemscope.capture.owners") or _import_owners()


def _import_owners() -> ModuleType | None:
    if "torch" not in sys.modules:
        return None
    try:
        from ...capture import owners
    except Exception as exc:  # an owners module that cannot load must not break the program
        report(exc)
        return None
    return owners


def report(exc: BaseException) -> None:
    """One line on stderr for the first internal error of a hook; the framework goes on."""
    global _reported
    if _reported:
        return
    _reported = True
    try:
        sys.stderr.write(f"msmemscope: framework hook error: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
    except Exception:
        pass


def scope(category: str) -> contextlib.AbstractContextManager[object]:
    """A context manager: tensors allocated inside on this thread get ``category``."""
    owners = _owners()
    if owners is None:
        return contextlib.nullcontext()
    try:
        cm: contextlib.AbstractContextManager[object] = owners.scope(category)
        return cm
    except Exception as exc:
        report(exc)
        return contextlib.nullcontext()


def plain(tensor: object) -> torch.Tensor | None:
    """The plain tensor holding ``tensor``'s memory: a DTensor's local shard, a Parameter
    subclass's data (the tracker follows plain tensors and Parameters only)."""
    import torch

    if tensor is None or not isinstance(tensor, torch.Tensor):
        return None
    local = getattr(tensor, "_local_tensor", None)
    if isinstance(local, torch.Tensor):
        tensor = local
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        tensor = tensor.data
        if type(tensor) is not torch.Tensor:
            return None
    return tensor


def relabel(tensor: object, category: str) -> None:
    """Gives ``tensor``'s storage ``category`` (no-op for ``None`` and storage-less tensors)."""
    owners = _owners()
    if owners is None:
        return
    try:
        t = plain(tensor)
        if t is not None and t.untyped_storage().nbytes():
            owners.relabel(t, category)
    except Exception as exc:
        report(exc)


def enter(category: str) -> None:
    """Opens a ``category`` region on this thread that a later :func:`leave` closes."""
    cm = scope(category)
    cm.__enter__()
    stack = getattr(_open, "stack", None)
    if stack is None:
        stack = _open.stack = []
    stack.append((category, cm))


def leave(category: str) -> None:
    """Closes the innermost open ``category`` region on this thread (and any region opened
    after it that was never closed, e.g. by a forward pass that raised)."""
    stack = getattr(_open, "stack", None)
    if not stack:
        return
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][0] == category:
            while len(stack) > i:
                _, cm = stack.pop()
                try:
                    cm.__exit__(None, None, None)
                except Exception as exc:
                    report(exc)
            return


def open_regions() -> list[str]:
    """Categories of the regions open on this thread, outermost first (tests)."""
    return [c for c, _ in getattr(_open, "stack", None) or ()]


def resized(tensor: object) -> None:
    """``tensor``'s storage was resized outside PyTorch's dispatcher (FSDP frees and re-allocates
    unsharded parameters with ``storage.resize_``, which no dispatch mode sees): the tracker
    writes the FREE of the old block and the MALLOC of the new one, keeping the owner."""
    owners = _owners()
    if owners is None:
        return
    try:
        t = plain(tensor)
        if t is not None:
            owners.storage_resized(t)
    except Exception as exc:
        report(exc)


def after_resize(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrapper maker for a framework's ``alloc_storage(tensor)``/``free_storage(tensor)``."""

    def wrapper(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(tensor, *args, **kwargs)
        resized(tensor)
        return out

    return wrapper
