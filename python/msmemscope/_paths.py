"""Where the runtime library (``libmsmemscope_runtime.so``) is looked for.

When the program was not started under ``msmemscope`` (nor after ``source msmemscope
--load-api-env``), the runtime library is not in the process yet and the package loads it itself,
from the first of these that exists:

1. the path in the environment variable ``MSMEMSCOPE_RUNTIME_LIB`` (when set, it is the only
   candidate: an explicit choice that does not exist is an error, not a reason to pick another);
2. ``<package dir>/lib/libmsmemscope_runtime.so`` (copied there by ``scripts/setup.sh``);
3. ``<repository>/target/release/libmsmemscope_runtime.so`` (a source checkout's build).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "MSMEMSCOPE_RUNTIME_LIB"
LIB_NAME = "libmsmemscope_runtime.so"


def package_dir() -> Path:
    """The directory of the ``msmemscope`` package."""
    return Path(__file__).resolve().parent


def repo_root() -> Path | None:
    """The source checkout the package lives in (``<repo>/python/msmemscope``), if any."""
    root = package_dir().parent.parent
    if (root / "Cargo.toml").is_file() and (root / "crates").is_dir():
        return root
    return None


def candidates() -> list[Path]:
    """The paths tried, in order."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return [Path(explicit)]
    paths = [package_dir() / "lib" / LIB_NAME]
    root = repo_root()
    if root is not None:
        paths.append(root / "target" / "release" / LIB_NAME)
    return paths


def find_runtime() -> Path:
    """The first candidate that exists; RuntimeError naming every path tried otherwise."""
    tried = candidates()
    for path in tried:
        if path.is_file():
            return path
    listed = ", ".join(str(p) for p in tried)
    hint = (
        f"set {ENV_VAR} to an existing file"
        if os.environ.get(ENV_VAR)
        else f"build it (scripts/setup.sh) or set {ENV_VAR}"
    )
    raise RuntimeError(f"msmemscope runtime library not found (tried {listed}): {hint}")
