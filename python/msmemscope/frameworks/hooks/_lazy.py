"""Post-import callbacks: run a function right after a module's code has executed, or at once
when the module is already imported. A ``sys.meta_path`` finder that finds nothing itself:
for a watched name it asks the finders after it and wraps the loader it gets. Until a watched
module is imported it costs one dictionary lookup per first import of any module."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from . import _label

if TYPE_CHECKING:
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec


class _Watcher:
    def __init__(self) -> None:
        # module name -> callbacks still to run
        self.callbacks: dict[str, list[Callable[[], object]]] = {}
        self.lock = threading.RLock()
        self.searching = threading.local()

    # --- the finder protocol -------------------------------------------------------------------
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
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
            _label.report(exc)
            return None
        finally:
            self.searching.on = False
        if spec is not None and spec.loader is not None:
            try:
                self._wrap_loader(spec, fullname)
            except Exception as exc:
                _label.report(exc)
        return spec

    def _wrap_loader(self, spec: ModuleSpec, fullname: str) -> None:
        # Any: whatever loader the other finders return; its exec_module is replaced on the
        # instance (a method assignment mypy would refuse on importlib.abc.Loader).
        loader: Any = spec.loader
        original = loader.exec_module
        watcher = self

        def exec_module(module: ModuleType) -> None:
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
            watcher.fire(fullname)

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            # The proxy stands for the loader (duck-typed, not an importlib.abc.Loader subclass).
            spec.loader = cast("Loader", _LoaderProxy(loader, exec_module))

    # --- registration --------------------------------------------------------------------------
    def fire(self, name: str) -> None:
        with self.lock:
            callbacks = self.callbacks.pop(name, [])
            self._update_meta_path()
        for callback in callbacks:
            try:
                callback()
            except Exception as exc:
                _label.report(exc)

    def watch(self, name: str, callback: Callable[[], object]) -> None:
        """Runs ``callback()`` once ``name`` is imported (now, if it already is)."""
        if name in sys.modules:
            callback()
            return
        with self.lock:
            self.callbacks.setdefault(name, []).append(callback)
            self._update_meta_path()

    def unwatch(self, callback: Callable[[], object]) -> None:
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

    def __init__(self, loader: Loader, exec_module: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self.exec_module = exec_module

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


watcher = _Watcher()
