"""Framework hooks: patches of vLLM, PyTorch FSDP1/FSDP2, Megatron-Core and verl functions that
label memory (decompose) or take snapshots at the framework's key points (snapshot).

Two ways in:

- :func:`init_framework_hooks` (``msmemscope.init_framework_hooks``): one combination of the
  table (:data:`SPECS`), applied now; :func:`cleanup_framework_hooks` restores every function
  patched by either way (the very objects that were there before);
- :func:`auto_register` (the PyTorch tracker has it called, through
  ``msmemscope.capture.extensions``, when the configuration has the decompose analysis): every
  framework's decompose hooks, each activated only when its framework module is imported (at
  once if it already is; :mod:`msmemscope._import_hook` waits for the import). PyTorch imports
  FSDP on its own in any training program, so FSDP's hooks wait one step more: importing FSDP
  patches its constructor only (``FSDPParamGroup.__init__``,
  ``FullyShardedDataParallel.__init__``), whose first call activates them. A manual decompose
  ``init_framework_hooks`` for the same framework component takes precedence: the automatic one
  is removed and stays off.

A hook never raises into the program once applied: an internal error is reported once on stderr
(``msmemscope: framework hook error: ...``) and the framework's function runs as without it.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..._import_hook import PostImportHook
from . import _label
from ._patch import ORIGINAL_ATTR, Patcher
from ._registry import (
    DECOMPOSE,
    SNAPSHOT,
    SPECS,
    HookSpec,
    auto_specs,
    check_installed,
    installed_version,
    lookup,
)
from ._versions import VersionKey, release

__all__ = [
    "DECOMPOSE",
    "ORIGINAL_ATTR",
    "SNAPSHOT",
    "SPECS",
    "HookSpec",
    "activation_count",
    "active_hooks",
    "auto_register",
    "auto_registered",
    "auto_unregister",
    "cleanup_framework_hooks",
    "init_framework_hooks",
]


class _Applied:
    __slots__ = ("origin", "patcher", "spec")

    def __init__(self, spec: HookSpec, origin: str, patcher: Patcher):
        self.spec = spec
        self.origin = origin  # "manual" or "auto"
        self.patcher = patcher


_lock = threading.RLock()
_applied: list[_Applied] = []  # in the order applied (wrappers stack in this order)
_auto_on = False
# key -> its callback in the watcher
_auto_callbacks: dict[tuple[str, str], Callable[[], None]] = {}
_manual_decompose: set[tuple[str, str]] = set()  # keys the automatic hooks give way to
_armed: dict[tuple[str, str], Patcher] = {}  # key -> its first-use entry-point patches
_activations = 0
# Runs the automatic hooks' callbacks when their framework module is imported (the import hook
# the launcher's sitecustomize uses for torch too); its ``callbacks`` are the module names waited
# for.
_post_import = PostImportHook(_label.report)


def activation_count() -> int:
    """How many times a hook was applied (manually or automatically) in this process."""
    return _activations


def active_hooks() -> list[tuple[str, str, str, str, str]]:
    """(framework, version key, component, type, "manual"|"auto") of each applied hook."""
    with _lock:
        return [
            (a.spec.framework, a.spec.version, a.spec.component, a.spec.kind, a.origin)
            for a in _applied
        ]


def auto_registered() -> bool:
    return _auto_on


def armed() -> list[str]:
    """Components whose automatic hooks wait for their framework's first use (tests)."""
    with _lock:
        return sorted(component for _, component in _armed)


def _install(spec: HookSpec) -> Patcher:
    """Applies ``spec``'s patches; on failure restores what it did and re-raises."""
    global _activations
    patcher = Patcher()
    try:
        spec.installer()(patcher)
    except BaseException:
        patcher.restore()
        raise
    _activations += 1
    return patcher


def _remove(entry: _Applied) -> None:
    """Removes one applied hook. Hooks applied after it may wrap the same functions, so they
    are taken off first and put back on top afterwards."""
    index = _applied.index(entry)
    later = _applied[index + 1 :]
    for a in reversed(later):
        a.patcher.restore()
    entry.patcher.restore()
    del _applied[index:]
    for a in later:
        try:
            a.patcher = _install(a.spec)
            _applied.append(a)
        except Exception as exc:
            _label.report(exc)


def init_framework_hooks(framework: str, version: str, component: str, type: str) -> None:
    """Applies the hooks of one (framework, version, component, type) combination of the
    table; see :data:`SPECS`, e.g. ``init_framework_hooks("pytorch", "2.10+", "fsdp2",
    "decompose")``. ``version`` is a version key of the table or a release inside one
    (``"2.7.1"``); the installed framework must be covered by the key. Calling it again for the
    same combination re-applies it. Imports the framework module it patches."""
    spec = lookup(framework, version, component, type)
    check_installed(spec)
    try:
        importlib.import_module(spec.trigger)
    except Exception as exc:
        raise ValueError(
            f"init_framework_hooks: cannot import {spec.trigger} to hook it: "
            f"{exc.__class__.__name__}: {exc}"
        ) from exc
    with _lock:
        for a in list(_applied):
            same_slot = a.spec.key == spec.key and a.spec.kind == spec.kind
            if same_slot and (a.origin == "manual" or spec.kind == DECOMPOSE):
                _remove(a)
        if spec.kind == DECOMPOSE:
            _manual_decompose.add(spec.key)
            armed_patcher = _armed.pop(spec.key, None)
            if armed_patcher is not None:
                armed_patcher.restore()
        try:
            patcher = _install(spec)
        except (AttributeError, TypeError) as exc:
            raise ValueError(
                f"init_framework_hooks: {spec.describe()} cannot hook the installed "
                f"{spec.distribution} {installed_version(spec)}: {exc}"
            ) from exc
        _applied.append(_Applied(spec, "manual", patcher))


def cleanup_framework_hooks() -> None:
    """Restores every function patched by framework hooks, manual and automatic, and turns the
    automatic registration off (the next ``msmemscope.config()`` with the decompose analysis,
    or :func:`auto_register`, turns it on again). Stops the CUDA allocation history that
    snapshot hooks started."""
    with _lock:
        _disarm()
        for a in reversed(_applied):
            a.patcher.restore()
        _applied.clear()
        _manual_decompose.clear()
        if "msmemscope.snapshot.pickles" in sys.modules:
            sys.modules["msmemscope.snapshot.pickles"].stop_history(_label.report)


# --- automatic (lazy) decompose hooks -------------------------------------------------------------
def _auto_spec_for(key: tuple[str, str]) -> HookSpec | None:
    """The decompose spec of ``key`` whose version key covers the installed framework."""
    for spec in auto_specs():
        if spec.key != key:
            continue
        rel = release(installed_version(spec) or "")
        if rel is not None and VersionKey(spec.version).contains(rel):
            return spec
    return None


def _activate(key: tuple[str, str], first_use: bool = False) -> None:
    """Runs when the framework module of ``key`` has been imported (``first_use``: when one of
    its entry points is first called)."""
    with _lock:
        armed_patcher = _armed.pop(key, None)
        if armed_patcher is not None:
            armed_patcher.restore()
        if not _auto_on or key in _manual_decompose:
            return
        if any(a.spec.key == key and a.spec.kind == DECOMPOSE for a in _applied):
            return
        spec = _auto_spec_for(key)
        if spec is None:
            return  # a framework version no hook is written for: silently off
        try:
            if spec.first_use and not first_use:
                _armed[key] = _arm(key, spec)
                return
            patcher = _install(spec)
        except Exception as exc:
            _label.report(exc)
            return
        _applied.append(_Applied(spec, "auto", patcher))


def _arm(key: tuple[str, str], spec: HookSpec) -> Patcher:
    """Patches ``spec``'s entry points so that their first call activates the hook (before the
    call proceeds, so the object being built is covered)."""

    def on_first_call(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if key in _armed:
                _activate(key, first_use=True)
            return original(*args, **kwargs)

        return wrapper

    patcher = Patcher()
    try:
        for entry in spec.first_use:
            module_name, _, path = entry.partition(":")
            owner_path, _, name = path.rpartition(".")
            owner = importlib.import_module(module_name)
            for part in owner_path.split(".") if owner_path else ():
                owner = getattr(owner, part)
            patcher.wrap(owner, name, on_first_call)
    except BaseException:
        patcher.restore()
        raise
    return patcher


def auto_register() -> None:
    """Registers every framework's decompose hooks lazily (idempotent): each activates when
    its framework module is imported, at once if it already is; frameworks never imported cost
    nothing but a dictionary lookup per first import of a module."""
    global _auto_on
    with _lock:
        if _auto_on:
            return
        _auto_on = True
        keys: dict[tuple[str, str], str] = {}  # a hook key -> the module that activates it
        for spec in auto_specs():
            keys.setdefault(spec.key, spec.trigger)
        for key, trigger in keys.items():

            def callback(key: tuple[str, str] = key) -> None:
                _activate(key)

            _auto_callbacks[key] = callback
            _post_import.watch(trigger, callback)


def _disarm() -> None:
    global _auto_on
    _auto_on = False
    for callback in _auto_callbacks.values():
        _post_import.unwatch(callback)
    _auto_callbacks.clear()
    for patcher in _armed.values():
        patcher.restore()
    _armed.clear()


def auto_unregister() -> None:
    """Undoes :func:`auto_register`: automatic hooks not activated yet never will be, those
    active are removed (manual hooks stay)."""
    with _lock:
        _disarm()
        for a in [a for a in _applied if a.origin == "auto"]:
            _remove(a)
