"""The ``module`` member of MALLOC rows: the ``nn.Module`` whose forward allocated the block.

While the torch capture tracks, a global forward pre-hook and forward hook (``always_call``: a
forward that raises pops too) keep a per-thread stack of the modules whose forward is running;
a block allocated on that thread gets the innermost one's qualified path in its Attr,
``"module":"model.layers.3.self_attn"``: the name ``named_modules()`` gives it, prefixed by its
root's name. A root (a module whose forward runs outside any other's) is named by the global
variable of the ``__main__`` module that holds it, looked up at its first forward, else by its
class name in lower snake case (``transformer_encoder``).

A module's path is found once, at its first forward: its attribute name in the ``_modules`` of
the module running around it; else its name in that module's ``named_modules()`` (a layer of a
``ModuleList``, whose own forward never runs), else in the root's; the modules met on that walk
are named at the same time. A module found in none of them (one made inside a forward) is named
``<path of the module around it>.<its class in snake case>``.

Blocks allocated outside any forward, in backward (autograd runs it without module forwards)
and on other threads have no ``module``. The native capture is told the innermost path once per
module enter and exit (an interned text per path, :func:`attach_native`); the fallback tracker
reads :func:`current` per allocation.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import ctypes

    from torch.utils.hooks import RemovableHandle

__all__ = ["attach_native", "current", "disable", "enable"]


class _Path:
    """A module's path, and its interned text in the native capture (or None)."""

    __slots__ = ("covered", "path", "ref", "text")

    def __init__(self, module: torch.nn.Module, path: str, text: int | None) -> None:
        # The callback holds what it needs: at exit, module globals may be gone already.
        self.ref = weakref.ref(module, functools.partial(_forget, _paths, id(module), self))
        self.path = path
        self.text = text
        self.covered = False  # a root whose named_modules() were all named


_paths: dict[int, _Path] = {}  # by id(module); an entry goes with its module
_local = threading.local()  # .stack: [(module, its _Path)], innermost last
_handles: list[RemovableHandle] = []
_native: ctypes.CDLL | None = None


def _forget(paths: dict[int, _Path], key: int, entry: _Path, _ref: object) -> None:
    if paths.get(key) is entry:
        del paths[key]


def attach_native(lib: ctypes.CDLL) -> None:
    """Tells the native capture library the modules' paths from now on."""
    global _native
    _native = lib
    for entry in _paths.values():
        entry.text = lib.msmemscope_torch_module_text(entry.path.encode())


def current() -> str | None:
    """The path of the innermost module whose forward runs on this thread, or None."""
    stack: list[tuple[torch.nn.Module, _Path]] | None = getattr(_local, "stack", None)
    return stack[-1][1].path if stack else None


def _snake(name: str) -> str:
    """``TransformerEncoder`` -> ``transformer_encoder``; ``MLPBlock`` -> ``mlp_block``."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def _remember(module: torch.nn.Module, path: str) -> _Path:
    native = _native
    text = native.msmemscope_torch_module_text(path.encode()) if native is not None else None
    entry = _paths[id(module)] = _Path(module, path, text)
    return entry


def _known(module: torch.nn.Module) -> _Path | None:
    entry = _paths.get(id(module))
    return entry if entry is not None and entry.ref() is module else None


def _name_subtree(top: torch.nn.Module, top_path: str) -> None:
    """Names every module under ``top`` not named yet (``named_modules()``'s names)."""
    for name, sub in top.named_modules():
        if name and _known(sub) is None:
            _remember(sub, f"{top_path}.{name}")


def _root_name(module: torch.nn.Module) -> str:
    main = sys.modules.get("__main__")
    if main is not None:
        for key, value in list(vars(main).items()):
            if value is module and not key.startswith("__"):
                return key
    return _snake(type(module).__name__)


def _path_of(module: torch.nn.Module, stack: list[tuple[torch.nn.Module, _Path]]) -> _Path:
    """``module``'s path at its first forward (see the module documentation)."""
    if not stack:
        return _remember(module, _root_name(module))
    parent, parent_path = stack[-1]
    for name, child in parent._modules.items():
        if child is module:
            return _remember(module, f"{parent_path.path}.{name}")
    _name_subtree(parent, parent_path.path)
    found = _known(module)
    if found is not None:
        return found
    root, root_path = stack[0]
    if root is not parent and not root_path.covered:
        _name_subtree(root, root_path.path)
        root_path.covered = True
        found = _known(module)
        if found is not None:
            return found
    return _remember(module, f"{parent_path.path}.{_snake(type(module).__name__)}")


def _pre_forward(module: torch.nn.Module, args: Any) -> None:
    # Inside a region torch.compile traces, the hook is traced too: it must then do nothing
    # (the check is True while tracing, so the compiled graph holds none of this).
    if _compiling():
        return
    try:
        try:
            stack = _local.stack
        except AttributeError:
            stack = _local.stack = []
        entry = _paths.get(id(module))
        if entry is None or entry.ref() is not module:
            entry = _path_of(module, stack)
        stack.append((module, entry))
        native = _native
        if native is not None:
            native.msmemscope_torch_set_module(entry.text)
    except Exception as exc:
        _report(exc)


def _post_forward(module: torch.nn.Module, args: Any, output: Any) -> None:
    if _compiling():
        return
    try:
        stack: list[tuple[torch.nn.Module, _Path]] | None = getattr(_local, "stack", None)
        if not stack:
            return
        if stack[-1][0] is module:
            stack.pop()
        else:
            # A forward that began before the hooks were installed has no entry.
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] is module:
                    del stack[i:]
                    break
            else:
                return
        native = _native
        if native is not None:
            native.msmemscope_torch_set_module(stack[-1][1].text if stack else None)
    except Exception as exc:
        _report(exc)


def _report(exc: BaseException) -> None:
    from . import torch_tracker

    tracker = torch_tracker._tracker
    if tracker is not None:
        tracker.report(exc)


def _compiling() -> bool:
    check = getattr(torch.compiler, "is_compiling", None)
    return bool(check()) if check is not None else False


_original_compile: Any = None
# torch.compile was given a module: the hooks stay off for the rest of the process.
_compiled_a_module = False


def _compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
    """``torch.compile``, which first removes the module hooks when it is given a module: with
    any global module hook, every call of the module it returns warns that the hooks fire an
    extra time, which the program would not print without msmemscope. Blocks allocated from then
    on carry no ``module``."""
    global _compiled_a_module
    if isinstance(model, torch.nn.Module):
        _compiled_a_module = True
        disable()
    return _original_compile(model, *args, **kwargs)


def enable() -> None:
    """Installs the global forward hooks (idempotent), unless torch.compile was given a module."""
    global _original_compile
    if _handles or _compiled_a_module:
        return
    if _original_compile is None and callable(getattr(torch, "compile", None)):
        _original_compile = torch.compile
        functools.update_wrapper(_compile, _original_compile)
        torch.compile = _compile
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    _handles.append(register_module_forward_pre_hook(_pre_forward))
    try:
        _handles.append(register_module_forward_hook(_post_forward, always_call=True))
    except TypeError:  # PyTorch before 2.1: no always_call
        _handles.append(register_module_forward_hook(_post_forward))


def disable() -> None:
    """Removes the hooks; forwards running now keep their entries until they end on this
    thread's stack (their post hooks are gone: the stack is cleared)."""
    for handle in _handles:
        handle.remove()
    _handles.clear()
    _local.stack = []
    if _native is not None:
        _native.msmemscope_torch_set_module(None)
