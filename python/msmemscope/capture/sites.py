"""Allocation sites: which Python line made a tensor block.

Every MALLOC row carries the allocating thread's site in its Attr, whatever ``--call-stack``
says: ``site`` is the innermost frame of the user's own code (not the standard library,
site-packages, torch or msmemscope), ``frame`` the innermost frame outside torch and msmemscope
when that is another line (a library's, e.g. transformers'), both as ``file:line (function)``.
The native capture finds them in C++ (``native/pyframes.cpp``) from the same directory lists;
the dispatch-mode fallback uses :func:`site_of` here.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from types import CodeType, FrameType

__all__ = ["is_user_file", "library_dirs", "site_of"]


def library_dirs(own: tuple[str, ...]) -> tuple[str, ...]:
    """Directories (ending in a separator) whose files are not the user's code: ``own`` (torch
    and msmemscope), the interpreter's standard library and every site-packages directory."""
    dirs: set[str] = set(own)
    paths = sysconfig.get_paths()
    candidates = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    try:
        candidates += site.getsitepackages()
    except AttributeError:  # a virtualenv's site module without it
        pass
    user_site = getattr(site, "USER_SITE", None)
    candidates.append(user_site if isinstance(user_site, str) else None)
    candidates += [
        p for p in sys.path if p.rstrip(os.sep).endswith(("site-packages", "dist-packages"))
    ]
    for path in candidates:
        if not path:
            continue
        for resolve in (os.path.abspath, os.path.realpath):
            dirs.add(resolve(path).rstrip(os.sep) + os.sep)
    return tuple(sorted(dirs))


def is_user_file(file: str | None, library: tuple[str, ...]) -> bool:
    """Whether ``file`` is the user's own code: a real file outside ``library``."""
    return bool(file) and not file.startswith("<") and not file.startswith(library)  # type: ignore[union-attr]


def _text(frame: FrameType) -> str:
    co = frame.f_code
    return f"{co.co_filename}:{frame.f_lineno} ({co.co_name})"


class SiteFinder:
    """:meth:`site_of` with each code object's kind remembered (the fallback asks per block)."""

    def __init__(self, own: tuple[str, ...]):
        self.own = own
        self.library = library_dirs(own)
        self.kinds: dict[object, int] = {}

    def _kind(self, code: CodeType) -> int:
        kind = self.kinds.get(code)
        if kind is None:
            file = code.co_filename
            kind = 0
            if not file.startswith(self.own):
                kind = 3 if is_user_file(file, self.library) else 1
            if len(self.kinds) > 65536:
                self.kinds.clear()
            self.kinds[code] = kind
        return kind

    def site_of(self, frame: FrameType | None) -> tuple[str | None, str | None]:
        """(innermost frame outside torch/msmemscope, innermost frame of the user's code)."""
        inner = None
        budget = 256
        while frame is not None and budget > 0:
            kind = self._kind(frame.f_code)
            if kind & 1:
                if inner is None:
                    inner = _text(frame)
                if kind & 2:
                    return inner, _text(frame)
            frame = frame.f_back
            budget -= 1
        return inner, None


_FINDER: SiteFinder | None = None


def site_of(own: tuple[str, ...], frame: FrameType | None) -> tuple[str | None, str | None]:
    """The site of ``frame`` and its callers (see :class:`SiteFinder`)."""
    global _FINDER
    if _FINDER is None or _FINDER.own != own:
        _FINDER = SiteFinder(own)
    return _FINDER.site_of(frame)
