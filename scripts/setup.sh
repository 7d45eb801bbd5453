#!/usr/bin/env bash
# Sets up everything the tests and the demo need, idempotently: a virtual environment in .venv
# with the Python tools (maturin, pytest, pytest-xdist, ruff, mypy, numpy, torch, nvtx, and
# nbclient, nbformat, ipykernel for the notebook test), CPython 3.10 and 3.13 for the install
# tests (uv's builds, where the machine has neither), the release build of the workspace,
# and the msmemscope Python package installed in .venv in
# development mode (its Python files are used from python/msmemscope/, the extension is built
# into it) with a copy of the runtime library in python/msmemscope/lib/.
# Needs Rust, Python 3.11 with pip, gcc, and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup: $*"; }

PYTHON=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
    say "creating .venv with $PYTHON"
    "$PYTHON" -m venv .venv
fi
VPY=.venv/bin/python

# The tools whose absence a plain import (or a --version) shows; installed only when missing.
missing=()
$VPY -c "import maturin" 2>/dev/null || missing+=(maturin)
$VPY -c "import pytest" 2>/dev/null || missing+=(pytest)
$VPY -m ruff --version >/dev/null 2>&1 || missing+=(ruff)
$VPY -c "import mypy" 2>/dev/null || missing+=(mypy)
$VPY -c "import numpy" 2>/dev/null || missing+=(numpy)
$VPY -c "import nvtx" 2>/dev/null || missing+=(nvtx)
$VPY -c "import xdist" 2>/dev/null || missing+=(pytest-xdist)
# The Parquet tests read the dumps with pyarrow and DuckDB; `msmemscope ranks` runs its SQL on
# DuckDB and Spark (Spark also needs Java: scripts/test.sh installs it).
$VPY -c "import pyarrow" 2>/dev/null || missing+=(pyarrow)
$VPY -c "import duckdb" 2>/dev/null || missing+=(duckdb)
$VPY -c "import pyspark" 2>/dev/null || missing+=(pyspark)
# The notebook test runs a notebook on a kernel of .venv's Python (%%msmemscope).
$VPY -c "import nbclient" 2>/dev/null || missing+=(nbclient)
$VPY -c "import nbformat" 2>/dev/null || missing+=(nbformat)
$VPY -c "import ipykernel" 2>/dev/null || missing+=(ipykernel)
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    $VPY -m pip install --quiet --disable-pip-version-check "${missing[@]}"
fi
# torch separately: the PyPI wheel is large (about 70 s to install).
if ! $VPY -c "import torch" 2>/dev/null; then
    say "installing torch (about a minute)"
    $VPY -m pip install --quiet --disable-pip-version-check torch
fi
# Lightning for the trainer-callback tests (tests/python/test_integrations.py); torch kept.
$VPY -c "import lightning" 2>/dev/null || $VPY -m pip install --quiet --disable-pip-version-check lightning
scripts/setup_frameworks.sh  # vLLM, verl, Megatron-Core for the framework-hook tests (torch kept)

# The install tests build user environments on CPython 3.10 and 3.13 (tests/python/test_install.py,
# whose conftest.interpreter() looks in pyenv, /usr/local/bin, /usr/bin, then uv's directory); a
# machine with neither gets uv's builds of them, in ~/.local/share/uv/python.
have_python() {
    compgen -G "${PYENV_ROOT:-$HOME/.pyenv}/versions/$1.*/bin/python$1" >/dev/null \
        || [ -x "/usr/local/bin/python$1" ] || [ -x "/usr/bin/python$1" ] \
        || compgen -G "$HOME/.local/share/uv/python/cpython-$1.*-linux-*/bin/python$1" >/dev/null
}
pythons=()
for version in 3.10 3.13; do
    have_python "$version" || pythons+=("$version")
done
if [ ${#pythons[@]} -gt 0 ]; then
    [ -x .venv/bin/uv ] || $VPY -m pip install --quiet --disable-pip-version-check uv || true
    say "installing CPython ${pythons[*]} (uv python install)"
    # uv fetches its builds from GitHub; a machine that cannot reach it still runs every other
    # test (those on the missing versions skip, naming the version and this step).
    UV_PYTHON_INSTALL_DIR="$HOME/.local/share/uv/python" .venv/bin/uv python install "${pythons[@]}" \
        || say "could not install CPython ${pythons[*]} (uv python install failed, see above);" \
            "the install tests on those versions will skip"
fi

say "cargo build --release"
cargo build --release --quiet

say "building the Python extension (maturin develop --release)"
# maturin installs into the environment named by VIRTUAL_ENV. Its own target directory: cargo
# fingerprints maturin's build of the extension apart from a plain `cargo build`, so sharing
# target/ would rebuild the extension at every switch between the two.
log=$(mktemp)
if ! VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" \
    .venv/bin/maturin develop --release --target-dir target/maturin >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    exit 1
fi
rm -f "$log"

mkdir -p python/msmemscope/lib
cp -f target/release/libmsmemscope_runtime.so python/msmemscope/lib/libmsmemscope_runtime.so

$VPY -c "import msmemscope" || { say "import msmemscope failed" >&2; exit 1; }
# The native PyTorch capture, compiled against the venv's torch and cached (~/.cache/msmemscope):
# the first traced program would otherwise build it.
say "native PyTorch capture"
$VPY -m msmemscope.capture.native_build >/dev/null
say "ready: .venv/bin/python -c 'import msmemscope'"
