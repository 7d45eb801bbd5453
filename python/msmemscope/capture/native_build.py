"""Building and caching the native PyTorch capture (``native/*.cpp``).

The library is compiled against the PyTorch the program imports — its headers ship in the torch
wheel — with a plain C++ compiler call, once per (source, torch version, C++ ABI, Python
version), and cached under ``$MSMEMSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/msmemscope``, else
``~/.cache/msmemscope``. The first use prints one line while it builds; processes that start
at once (the ranks of a job) wait on one lock and one build. A compiler or headers that are
missing raise :class:`Unavailable` with what is missing; the tracker then falls back to the
Python dispatch mode.

Why not ``torch.utils.cpp_extension.load``, which also compiles sources against the imported
torch and caches the result (read in torch 2.15's ``torch/utils/cpp_extension.py``):

- it builds only through ninja (``_jit_compile`` -> ``_write_ninja_file_and_build_library`` ->
  ``verify_ninja_availability()``: "Ninja is required to load C++ extensions"), and torch does
  not depend on ninja: the project's own ``.venv`` (torch 2.15) has none
  (``cpp_extension.is_ninja_available()`` is False), so there the native capture would never
  be built and every run would fall back. Here the one compiler call needs only a C++ compiler;
- it keeps no record of a failed build: each process (every rank of a job) would compile again
  and fail again, where ``build.failed`` below makes later processes fall back at once, without
  a compiler run (``test_without_a_compiler_the_fallback_records_and_one_line_says_why``);
- it builds a Python extension (``-DTORCH_API_INCLUDE_EXTENSION_H``, linked with ``-ltorch`` and
  ``-ltorch_python`` besides ``c10`` and ``torch_cpu``) and loads it itself
  (``torch.ops.load_library``); the capture is a plain library that links ``c10`` and
  ``torch_cpu`` only and that :mod:`.native_tracker` loads with ctypes.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Unavailable", "cache_dir", "library"]

_NATIVE = Path(__file__).resolve().parent / "native"
# The PyTorch side, one part a file (capture.h lists them), and pyframes.cpp: Python frames
# (built with the interpreter's internal headers, kept apart so that the PyTorch side sees
# only the public C API).
SOURCES = tuple(
    _NATIVE / name
    for name in (
        "capture.cpp",
        "owners.cpp",
        "blocks.cpp",
        "ops.cpp",
        "allocators.cpp",
        "pyframes.cpp",
    )
)
# Included by the sources: a change to them is a change to the library.
HEADERS = (_NATIVE / "capture.h", _NATIVE / "blocks.h")
# The runtime's C ABI, msmemscope/runtime.h (generated from the Rust): a wheel ships it in the
# package's include/ (build_support/msmemscope_backend.py); a checkout, in the runtime's crate.
_PACKAGE = Path(__file__).resolve().parent.parent
_ABI_INCLUDES = (_PACKAGE / "include", _PACKAGE.parent.parent / "crates" / "runtime" / "include")
_BUILD_TIMEOUT_S = 600


class Unavailable(Exception):
    """The native capture cannot be built here; the message names what is missing."""


def cache_dir() -> Path:
    explicit = os.environ.get("MSMEMSCOPE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "msmemscope"


def abi_include() -> Path:
    """The folder that holds ``msmemscope/runtime.h``, the runtime's C ABI."""
    for folder in _ABI_INCLUDES:
        if (folder / "msmemscope" / "runtime.h").is_file():
            return folder
    raise Unavailable(f"the runtime's C header msmemscope/runtime.h is not in {_ABI_INCLUDES[0]}")


def _compiler() -> str:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    raise Unavailable("no C++ compiler (g++, c++ or clang++; or set CXX)")


def _key(torch: Any, cxx: str) -> str:
    """What the built library depends on: this source, the torch build, its C++ ABI, Python."""
    h = hashlib.sha256()
    for source in (*SOURCES, *HEADERS, abi_include() / "msmemscope" / "runtime.h"):
        h.update(source.read_bytes())
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    h.update(f"{torch.__version__}|{torch.__file__}|{abi}|{sys.version}|{cxx}".encode())
    return f"torch-{torch.__version__.replace('+', '_')}-abi{abi}-{h.hexdigest()[:16]}"


def _command(torch: Any, cxx: str, out: Path) -> list[str]:
    return compile_command(torch, cxx, SOURCES, out)


def compile_command(torch: Any, cxx: str, sources: Sequence[Path], out: Path) -> list[str]:
    """The one compiler call that builds ``sources`` into the shared library ``out`` against
    ``torch``'s C++ headers and libraries (raises ``Unavailable`` without the headers)."""
    root = Path(torch.__file__).resolve().parent
    include = root / "include"
    lib = root / "lib"
    if not (include / "ATen" / "record_function.h").is_file():
        raise Unavailable(f"PyTorch's C++ headers are not installed ({include} has no ATen/)")
    py_include = sysconfig.get_paths()["include"]
    if not (Path(py_include) / "Python.h").is_file():
        raise Unavailable(f"Python's C headers are not installed ({py_include}/Python.h)")
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    return [
        cxx,
        "-O2",
        # As PyTorch's own extension builds: its newer headers need C++20; older ones accept it.
        "-std=c++20",
        "-shared",
        "-fPIC",
        "-fvisibility=hidden",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-isystem",
        str(include),
        "-isystem",
        str(include / "torch" / "csrc" / "api" / "include"),
        "-isystem",
        py_include,
        f"-I{abi_include()}",
        *(str(source) for source in sources),
        "-o",
        str(out),
        f"-L{lib}",
        f"-Wl,-rpath,{lib}",
        "-lc10",
        "-ltorch_cpu",
    ]


def library(torch: Any, notice: Callable[[str], None] | None = None) -> Path:
    """The path of the built library for this torch, building it when it is not cached."""
    cxx = _compiler()
    directory = cache_dir() / _key(torch, cxx)
    target = directory / "libmsmemscope_torch.so"
    if target.is_file():
        return target
    failed = directory / "build.failed"
    if failed.is_file():  # one failed build per key: later processes do not compile again
        raise Unavailable(f"{failed.read_text().strip()} (delete {directory} to retry)")
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise Unavailable(f"cannot create the cache directory {directory}: {exc}") from None
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():  # another process built it meanwhile
            return target
        if notice is not None:
            notice(
                f"building the native PyTorch capture for torch {torch.__version__} "
                f"(one g++ run, about 15 s on 2 cores; once, cached in {directory})"
            )
        partial = directory / f".libmsmemscope_torch.{os.getpid()}.so"
        cmd = _command(torch, cxx, partial)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"the C++ compiler failed to run: {exc}") from None
        if proc.returncode != 0:
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), "")
            (directory / "build.log").write_text(" ".join(cmd) + "\n" + proc.stderr)
            why = first.strip() or f"exit {proc.returncode}"
            log = directory / "build.log"
            sources = f"{_NATIVE}/*.cpp"
            reason = f"compiling the native capture ({sources}) failed ({why}; full log in {log})"
            failed.write_text(reason + "\n")
            raise Unavailable(reason)
        os.replace(partial, target)
    return target


def main() -> int:
    """``python -m msmemscope.capture.native_build``: builds (or finds) the library."""
    import torch

    try:
        path = library(torch, notice=lambda m: print(f"msmemscope: {m}", file=sys.stderr))
    except Unavailable as exc:
        print(f"msmemscope: native PyTorch capture unavailable: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
