"""The PEP 517 build backend: maturin's, after building the two parts maturin does not build.

maturin builds one crate, the ``msmemscope._native`` extension. A wheel also needs the
``msmemscope`` command (the ``msmemscope-cli`` binary and its ``bin/msmemscope`` wrapper) and
the runtime library that the command preloads into the program it runs. Before maturin writes
the wheel, this backend builds both with cargo and stages them in the wheel's data directory
(``wheel-data/`` beside this file):

- ``platlib/msmemscope/bin/msmemscope-cli`` and ``platlib/msmemscope/lib/libmsmemscope_runtime.so``
  land inside the installed package (the binary finds the library at ``../lib``). Staged there
  only while the wheel is built, and not in ``python/msmemscope/``, so that a wheel built for
  another glibc never replaces the source tree's own copy of the library, which the checkout's
  tests use (an editable install, which runs the source tree, gets them in
  ``python/msmemscope/`` instead);
- ``platlib/msmemscope/include/msmemscope/*.h``: the runtime's C headers, for C producers and
  for the native PyTorch capture, which is compiled on first use against ``runtime.h`` (a
  checkout's capture reads them from ``crates/runtime/include``);
- ``scripts/msmemscope`` (``bin/msmemscope`` of the checkout links to it) lands on the
  environment's ``PATH`` as it is, its ``#!/bin/sh`` line kept, so that it can be both run and
  sourced.

The platform tag: a plain build (``pip install .``, ``pip wheel .``) links against the build
machine's glibc and takes the lowest manylinux tag that its symbols allow. A wheel for other
machines is built for a fixed glibc baseline with zig, chosen by the config setting
``manylinux`` (``pip wheel . -C manylinux=2_28``) or the environment variable
``MSMEMSCOPE_MANYLINUX``; every binary in it is then linked against that glibc and checked.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import maturin

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "msmemscope"
# Installers move the wheel's platlib files into site-packages, beside the Python package.
STAGED = Path(__file__).resolve().parent / "wheel-data" / "platlib"
TRIPLE = "x86_64-unknown-linux-gnu"
BASELINE_ENV = "MSMEMSCOPE_MANYLINUX"
#: The parts built here, as (cargo package, file cargo writes, its path inside the package).
PARTS = (
    ("msmemscope-cli", "msmemscope-cli", Path("bin") / "msmemscope-cli"),
    ("msmemscope-runtime", "libmsmemscope_runtime.so", Path("lib") / "libmsmemscope_runtime.so"),
)


def _say(message: str) -> None:
    print(f"msmemscope build: {message}", file=sys.stderr, flush=True)


def _baseline(config_settings: Mapping[str, Any] | None) -> str | None:
    """The glibc baseline asked for (``2_28``), or None for the build machine's own."""
    value = (config_settings or {}).get("manylinux") or os.environ.get(BASELINE_ENV) or ""
    value = str(value).strip().removeprefix("manylinux_")
    if not value:
        return None
    if not re.fullmatch(r"2_(1[7-9]|[2-9][0-9])", value):
        raise SystemExit(
            f"msmemscope build: invalid manylinux baseline {value!r}: "
            "accepted values are glibc versions written 2_17 … 2_99 (for example 2_28)"
        )
    return value


def _cargo() -> str:
    cargo = os.environ.get("CARGO") or shutil.which("cargo")
    if cargo is None:
        raise SystemExit(
            "msmemscope build: cargo not found: building msmemscope from source needs a Rust "
            "toolchain (https://rustup.rs), or install a prebuilt wheel"
        )
    return cargo


def _target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")


def _build_parts(baseline: str | None, package: Path) -> None:
    """Builds the command and the runtime library and copies them into ``package``."""
    packages = [arg for name, _, _ in PARTS for arg in ("-p", name)]
    if baseline is None:
        command = [_cargo(), "build", "--release", *packages]
        out = _target_dir() / "release"
    else:
        zigbuild = shutil.which("cargo-zigbuild")
        if zigbuild is None:
            raise SystemExit(
                "msmemscope build: a manylinux baseline needs cargo-zigbuild and ziglang "
                "(pip install cargo-zigbuild ziglang, or build with build isolation)"
            )
        glibc = baseline.replace("_", ".")
        command = [zigbuild, "zigbuild", "--release", "--target", f"{TRIPLE}.{glibc}", *packages]
        out = _target_dir() / TRIPLE / "release"
    _say(" ".join(command))
    subprocess.run(command, cwd=ROOT, check=True)
    for _, built, inside in PARTS:
        placed = package / inside
        placed.parent.mkdir(parents=True, exist_ok=True)
        # Replaced, never written through: the old file may be in use by a running program.
        partial = placed.with_name(f".{placed.name}.{os.getpid()}")
        shutil.copy2(out / built, partial)
        os.replace(partial, placed)


def _stage_headers(package: Path) -> None:
    """Copies the runtime's C headers into ``package/include/msmemscope``."""
    placed = package / "include" / "msmemscope"
    placed.mkdir(parents=True, exist_ok=True)
    for header in sorted((ROOT / "crates" / "runtime" / "include" / "msmemscope").glob("*.h")):
        shutil.copy2(header, placed / header.name)


def _maturin_settings(
    config_settings: Mapping[str, Any] | None, baseline: str | None
) -> dict[str, Any]:
    """maturin's own settings: the platform tag (and zig for a baseline) added to the user's."""
    settings = dict(config_settings or {})
    settings.pop("manylinux", None)
    args = maturin.get_maturin_pep517_args(config_settings)
    if "--compatibility" not in args and "--manylinux" not in args:
        if baseline is None:
            args += ["--compatibility", "pypi"]  # the lowest manylinux tag the symbols allow
        else:
            args += ["--zig", "--compatibility", f"manylinux_{baseline}"]
    settings["maturin.build-args"] = args
    return settings


def get_requires_for_build_wheel(config_settings: Mapping[str, Any] | None = None) -> list[str]:
    extra = ["ziglang", "cargo-zigbuild"] if _baseline(config_settings) else []
    return [*maturin.get_requires_for_build_wheel(config_settings), *extra]


def get_requires_for_build_editable(config_settings: Mapping[str, Any] | None = None) -> list[str]:
    return get_requires_for_build_wheel(config_settings)


def build_wheel(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    baseline = _baseline(config_settings)
    settings = _maturin_settings(config_settings, baseline)
    try:
        _build_parts(baseline, STAGED / "msmemscope")
        _stage_headers(STAGED / "msmemscope")
        return maturin.build_wheel(wheel_directory, settings, metadata_directory)
    finally:
        # Staged only for this wheel: `maturin develop` would install what it finds there.
        shutil.rmtree(STAGED, ignore_errors=True)


def build_editable(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    # An editable install runs the package from python/msmemscope/: the parts go there.
    baseline = _baseline(config_settings)
    _build_parts(baseline, PACKAGE)
    settings = _maturin_settings(config_settings, baseline)
    return maturin.build_editable(wheel_directory, settings, metadata_directory)


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Mapping[str, Any] | None = None
) -> str:
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: Mapping[str, Any] | None = None
) -> str:
    return maturin.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_sdist(sdist_directory: str, config_settings: Mapping[str, Any] | None = None) -> str:
    return maturin.build_sdist(sdist_directory, config_settings)


def get_requires_for_build_sdist(config_settings: Mapping[str, Any] | None = None) -> list[str]:
    return maturin.get_requires_for_build_sdist(config_settings)
