"""msmemscope's ``sitecustomize`` for Python programs started by the ``msmemscope`` launcher.

The launcher puts this directory (and, in a source tree, the directory holding the
``msmemscope`` package) on the program's ``PYTHONPATH``, so Python's ``site`` module imports this
file at start-up. It:

1. installs a lazy import hook: once ``torch`` has been fully imported, it calls
   ``msmemscope.frameworks.torch_tracker.install()``. Until then it costs one string comparison
   per first import of a module; a program that never imports torch never imports msmemscope
   nor torch because of it;
   in a host-leak run (``MSMEMSCOPE_PYTHON_OBJECTS`` set) it instead asks the preloaded runtime
   to wrap CPython's own allocators (``msmemscope_track_python_objects``, through ctypes'
   ``PyDLL`` so that the GIL stays held), so that Python objects are accounted too;
2. runs the next ``sitecustomize`` on ``sys.path`` (the user's or the distribution's), which
   this file shadows, and leaves that module as ``sys.modules["sitecustomize"]``.

Nothing here raises into the program: a failure of msmemscope's own part is reported once on
stderr, prefixed ``msmemscope: ``, and the program goes on untracked. (An error raised by the
chained ``sitecustomize`` itself is the user's, and ``site`` reports it as it would without us.)
"""

import os
import sys

# typing is not imported at start-up, and this file must not import it: the constant is the one
# that type checkers treat as true (as typing.TYPE_CHECKING).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

_reported = False


def _report(what: str, exc: BaseException) -> None:
    """One line on stderr, the first time anything fails."""
    global _reported
    if _reported:
        return
    _reported = True
    try:
        sys.stderr.write(f"msmemscope: {what}: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
    except Exception:
        pass


def _make_package_importable() -> None:
    """Lets an interpreter that has no ``msmemscope`` of its own use the one this file belongs
    to (the launcher was installed into another environment than the program's). Its
    ``site-packages`` goes last on ``sys.path``, so the program's own packages win."""
    import importlib.util

    if importlib.util.find_spec("msmemscope") is None:
        here = os.path.dirname(os.path.realpath(__file__))
        sys.path.append(os.path.dirname(os.path.dirname(here)))


def _on_torch_imported() -> None:
    """Turns the PyTorch tracker on, once, right after ``import torch`` completed."""
    _remove_hook()
    try:
        _make_package_importable()
        from msmemscope.frameworks import torch_tracker

        torch_tracker.install()
    except Exception as exc:
        _report("PyTorch tracking is off", exc)


class _TorchImportHook:
    """A ``sys.meta_path`` finder that finds nothing itself: for ``torch`` it asks the finders
    after it, and wraps the found loader so that :func:`_on_torch_imported` runs after the
    module's code."""

    def __init__(self) -> None:
        self._searching = False

    def find_spec(
        self,
        fullname: str,
        path: "Sequence[str] | None" = None,
        target: "ModuleType | None" = None,
    ) -> "ModuleSpec | None":
        # The import system holds torch's module lock around this call, so two threads never
        # get here for torch at once; `_searching` only stops the recursion below.
        if fullname != "torch" or self._searching:
            return None
        self._searching = True
        try:
            spec: ModuleSpec | None = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        except Exception as exc:
            _report("cannot watch the import of torch", exc)
            return None
        finally:
            self._searching = False
        if spec is not None and spec.loader is not None:
            try:
                _wrap_loader(spec)
            except Exception as exc:
                _report("cannot watch the import of torch", exc)
        return spec


def _wrap_loader(spec: "ModuleSpec") -> None:
    # Any: the loader of whichever finder found torch, whose method is replaced below.
    loader: Any = spec.loader
    original: Callable[[ModuleType], None] = loader.exec_module

    def exec_module(module: "ModuleType") -> None:
        try:
            original(module)
        finally:
            _unwrap(loader, spec, original)
        _on_torch_imported()

    try:
        # An instance attribute keeps the loader's type (code may check it); the loader of one
        # module file serves only that module.
        loader.exec_module = exec_module
    except (AttributeError, TypeError):
        # The import system only calls create_module/exec_module: no Loader subclass needed.
        spec.loader = _LoaderProxy(loader, exec_module)  # type: ignore[assignment]


def _unwrap(loader: "Loader", spec: "ModuleSpec", original: "Callable[[ModuleType], None]") -> None:
    if isinstance(spec.loader, _LoaderProxy):
        spec.loader = loader
    else:
        try:
            del loader.exec_module
        except AttributeError:
            pass


class _LoaderProxy:
    """Stands for a loader that takes no instance attributes."""

    def __init__(self, loader: "Loader", exec_module: "Callable[[ModuleType], None]") -> None:
        self._loader = loader
        self.exec_module = exec_module

    def create_module(self, spec: "ModuleSpec") -> "ModuleType | None":
        return self._loader.create_module(spec)

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)


_hook: "_TorchImportHook | None" = None


def _install_hook() -> None:
    global _hook
    if "torch" in sys.modules:
        _on_torch_imported()
        return
    _hook = _TorchImportHook()
    sys.meta_path.insert(0, _hook)


def _remove_hook() -> None:
    global _hook
    if _hook is not None:
        try:
            sys.meta_path.remove(_hook)
        except ValueError:
            pass
        _hook = None


def _next_sitecustomize_spec() -> "ModuleSpec | None":
    """The spec of the ``sitecustomize`` that this file shadows: the first one on
    ``sys.path`` outside this directory."""
    from importlib.machinery import PathFinder

    here = os.path.dirname(os.path.realpath(__file__))
    others = []
    for entry in sys.path:
        try:
            if os.path.realpath(entry or os.curdir) == here:
                continue
        except (TypeError, ValueError, OSError):
            continue
        others.append(entry)
    return PathFinder.find_spec("sitecustomize", others)


def _chain() -> None:
    try:
        spec = _next_sitecustomize_spec()
    except Exception as exc:
        _report("cannot look for another sitecustomize", exc)
        return
    if spec is None or spec.loader is None:
        return
    import importlib.util

    module = importlib.util.module_from_spec(spec)
    # Keep this module reachable, then let the chained one be "sitecustomize": the import
    # system re-reads sys.modules when our import finishes, so `import sitecustomize` in the
    # program gives the user's module, as it would without msmemscope.
    # This module is being imported, so it is in sys.modules (typeshed's get allows None).
    sys.modules["_msmemscope_sitecustomize"] = sys.modules.get(__name__)  # type: ignore[assignment]
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _track_python_objects() -> None:
    """Host-leak runs: the runtime wraps the interpreter's allocators (it needs the GIL, which
    a ``PyDLL`` call keeps held)."""
    import ctypes

    try:
        track = ctypes.PyDLL(None).msmemscope_track_python_objects
    except AttributeError:
        return  # the runtime is not in this process (the program replaced LD_PRELOAD)
    track.restype = ctypes.c_int
    track.argtypes = []
    track()


if os.environ.get("MSMEMSCOPE_PYTHON_OBJECTS") == "1":
    try:
        _track_python_objects()
    except Exception as _exc:
        _report("Python objects are not tracked", _exc)
else:
    try:
        _install_hook()
    except Exception as _exc:
        _report("cannot install the torch import hook", _exc)

_chain()
