"""msmemscope's ``sitecustomize`` for Python programs started by the ``msmemscope`` launcher.

The launcher puts this directory (and, in a source tree, the directory holding the
``msmemscope`` package) on the program's ``PYTHONPATH``, so Python's ``site`` module imports this
file at start-up. It:

1. installs a lazy import hook: once ``torch`` has been fully imported, it calls
   ``msmemscope.capture.torch_tracker.install()``. Until then it costs one dictionary lookup
   per first import of a module; a program that never imports torch never imports msmemscope
   nor torch because of it. The hook is the package's own (``msmemscope/_import_hook.py``,
   which the frameworks' hooks use too), loaded by its path, not imported from the package;
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
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    from msmemscope._import_hook import PostImportHook

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
    try:
        _make_package_importable()
        from msmemscope.capture import torch_tracker

        torch_tracker.install()
    except Exception as exc:
        _report("PyTorch tracking is off", exc)


def _load_import_hook() -> "ModuleType":
    """The package's ``_import_hook.py``, the import hook the frameworks' hooks use too, loaded
    by its path from the package directory this one is in, without importing ``msmemscope``
    (its ``__init__`` loads the extension; a program that never imports torch must not load
    it), as the module ``_msmemscope_import_hook``. The package's own import of the file, if
    the program later uses msmemscope, is another module object with finders of its own."""
    # importlib.util (what importlib.util.spec_from_file_location needs) is not imported at
    # start-up; importlib.machinery is (_chain below imports it anyway).
    from importlib.machinery import ModuleSpec, SourceFileLoader

    name = "_msmemscope_import_hook"
    here = os.path.dirname(os.path.realpath(__file__))
    path = os.path.join(os.path.dirname(here), "_import_hook.py")
    loader = SourceFileLoader(name, path)
    spec = ModuleSpec(name, loader, origin=path)
    spec.has_location = True
    module = type(sys)(name)  # types.ModuleType, without importing types
    module.__spec__ = spec
    module.__file__ = path
    module.__loader__ = loader
    loader.exec_module(module)
    sys.modules[name] = module
    return module


# The finder that waits for torch (PostImportHook of _import_hook.py); it leaves sys.meta_path
# once torch is imported.
_hook: "PostImportHook | None" = None


def _install_hook() -> None:
    global _hook
    if "torch" in sys.modules:
        _on_torch_imported()
        return

    def report(exc: BaseException) -> None:
        _report("cannot watch the import of torch", exc)

    hook: PostImportHook = _load_import_hook().PostImportHook(report)
    _hook = hook
    hook.watch("torch", _on_torch_imported)


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
