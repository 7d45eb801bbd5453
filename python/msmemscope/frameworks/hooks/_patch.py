"""Reversible attribute patches: every replaced function is put back as the same object."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

# The attribute a wrapper carries pointing at the function it wraps (for tests and debugging).
ORIGINAL_ATTR = "__msmemscope_original__"

_MISSING = object()


class Patcher:
    """Records each ``setattr`` it makes on classes and modules, so :meth:`restore` can put back
    exactly what was there: the owner's own ``__dict__`` entry (a ``staticmethod``/``classmethod``
    object, a plain function) or, for an attribute the owner only inherited, nothing."""

    def __init__(self) -> None:
        self._saved: list[tuple[object, str, object]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._saved)

    def patched(self) -> list[tuple[object, str, object]]:
        """(owner, name, original ``__dict__`` entry or ``None`` when inherited) of each patch."""
        return [(o, n, None if v is _MISSING else v) for o, n, v in self._saved]

    def wrap(
        self,
        owner: object,
        name: str,
        make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]],
    ) -> None:
        """Replaces ``owner.name`` with ``make_wrapper(original)`` (a function taking the same
        arguments). A missing attribute is an error naming it: the framework version does not
        have the function this hook was written for."""
        own = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
        current = inspect.getattr_static(owner, name, _MISSING)
        if current is _MISSING:
            raise AttributeError(
                f"{_qualname(owner)} has no attribute {name!r}: this version of the framework "
                "does not have the function msmemscope hooks"
            )
        if isinstance(current, staticmethod):
            raise TypeError(f"{_qualname(owner)}.{name} is a staticmethod; not hooked")
        func = current.__func__ if isinstance(current, classmethod) else current
        wrapper = make_wrapper(func)
        functools.update_wrapper(wrapper, func)
        setattr(wrapper, ORIGINAL_ATTR, func)
        replacement = classmethod(wrapper) if isinstance(current, classmethod) else wrapper
        with self._lock:
            setattr(owner, name, replacement)
            self._saved.append((owner, name, own))

    def restore(self) -> None:
        """Puts every patched attribute back, newest first."""
        with self._lock:
            saved, self._saved = self._saved, []
        for owner, name, own in reversed(saved):
            if own is _MISSING:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, own)


def _qualname(owner: object) -> str:
    module = getattr(owner, "__module__", None)
    qualname = getattr(owner, "__qualname__", None)
    if qualname:
        name: str = qualname
    else:
        name = getattr(owner, "__name__", repr(owner))
    return f"{module}.{name}" if module and inspect.isclass(owner) else name
