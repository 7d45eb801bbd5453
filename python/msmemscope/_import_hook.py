"""Post-import callbacks: run a function right after a module's code has executed, or at once
when the module is already imported. A ``sys.meta_path`` finder that finds nothing itself: for
a watched name it asks the finders after it and wraps the loader it gets. Until a watched module
is imported it costs one dictionary lookup per first import of any module.

The one implementation of msmemscope's import hook, used twice:

- the launcher's ``sitecustomize`` (``_autostart/sitecustomize.py``) turns the PyTorch tracker
  on once ``torch`` is imported. It runs at interpreter start-up, before ``msmemscope`` may be
  imported (a program that never imports torch must never import msmemscope), so it loads this
  file by its path, beside its own directory, as the module ``_msmemscope_import_hook``;
- the frameworks' automatic decompose hooks (:mod:`msmemscope.frameworks.hooks`) activate when
  their framework is imported.

Each user makes its own :class:`PostImportHook` with its own error reporter. Because of the
start-up use, this module imports nothing but ``sys`` and ``_thread`` (both loaded in every
interpreter: no ``threading``, no ``typing``) and nothing of msmemscope.
"""

import _thread
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

__all__ = ["PostImportHook"]


class PostImportHook:
    """A ``sys.meta_path`` finder, at the front of it while some callback waits: runs each
    callback of :meth:`watch` once its module's code has executed. ``report`` gets every
    exception of the hook's own (finding or wrapping the loader) and of a callback."""

    def __init__(self, report: "Callable[[BaseException], None]") -> None:
        self.report = report
        # module name -> callbacks still to run
        self.callbacks: dict[str, list[Callable[[], object]]] = {}
        # threading.RLock and threading.local are these (the start-up use cannot import
        # threading).
        self.lock = _thread.RLock()
        self.searching = _thread._local()

    # --- the finder protocol -------------------------------------------------------------------
    def find_spec(
        self,
        fullname: str,
        path: "Sequence[str] | None" = None,
        target: "ModuleType | None" = None,
    ) -> "ModuleSpec | None":
        if fullname not in self.callbacks or getattr(self.searching, "on", False):
            return None
        self.searching.on = True
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
            self.report(exc)
            return None
        finally:
            self.searching.on = False
        if spec is not None and spec.loader is not None:
            try:
                self._wrap_loader(spec, fullname)
            except Exception as exc:
                self.report(exc)
        return spec

    def _wrap_loader(self, spec: "ModuleSpec", fullname: str) -> None:
        # Any: whatever loader the other finders return; its exec_module is replaced on the
        # instance (a method assignment mypy would refuse on importlib.abc.Loader).
        loader: Any = spec.loader
        original: Callable[[ModuleType], None] = loader.exec_module
        hook = self

        def exec_module(module: "ModuleType") -> None:
            try:
                original(module)
            finally:
                if isinstance(spec.loader, _LoaderProxy):
                    spec.loader = loader
                else:
                    try:
                        del loader.exec_module
                    except AttributeError:
                        pass
            hook.fire(fullname)

        try:
            # An instance attribute keeps the loader's type (code may check it); the loader of
            # one module file serves only that module.
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            # The import system only calls create_module/exec_module: the proxy stands for the
            # loader (duck-typed, not an importlib.abc.Loader subclass).
            spec.loader = _LoaderProxy(loader, exec_module)  # type: ignore[assignment]

    # --- registration --------------------------------------------------------------------------
    def fire(self, name: str) -> None:
        """Runs (once) the callbacks waiting for ``name``; the hook leaves ``sys.meta_path``
        when none waits any more."""
        with self.lock:
            callbacks = self.callbacks.pop(name, [])
            self._update_meta_path()
        for callback in callbacks:
            try:
                callback()
            except Exception as exc:
                self.report(exc)

    def watch(self, name: str, callback: "Callable[[], object]") -> None:
        """Runs ``callback()`` once ``name`` is imported (now, if it already is)."""
        if name in sys.modules:
            callback()
            return
        with self.lock:
            self.callbacks.setdefault(name, []).append(callback)
            self._update_meta_path()

    def unwatch(self, callback: "Callable[[], object]") -> None:
        with self.lock:
            for name in list(self.callbacks):
                left = [c for c in self.callbacks[name] if c is not callback]
                if left:
                    self.callbacks[name] = left
                else:
                    del self.callbacks[name]
            self._update_meta_path()

    def _update_meta_path(self) -> None:
        present = self in sys.meta_path
        if self.callbacks and not present:
            sys.meta_path.insert(0, self)
        elif not self.callbacks and present:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass


class _LoaderProxy:
    """Stands for a loader that takes no instance attributes."""

    def __init__(self, loader: "Loader", exec_module: "Callable[[ModuleType], None]") -> None:
        self._loader = loader
        self.exec_module = exec_module

    def create_module(self, spec: "ModuleSpec") -> "ModuleType | None":
        return self._loader.create_module(spec)

    def __getattr__(self, name: str) -> "Any":
        return getattr(self._loader, name)
