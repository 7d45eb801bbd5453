#!/usr/bin/env bash
# Builds the distributable wheel into dist/: msmemscope-<version>-cp39-abi3-manylinux_2_28_x86_64.whl
# (the command, the runtime library and the extension linked against glibc 2.28 with zig, so it
# installs with pip on any x86_64 Linux with glibc 2.28 or later, where no Rust toolchain is).
# Needs what the quick start needs (Rust, Python 3.11 with pip, gcc); the build pulls maturin and
# ziglang and cargo-zigbuild from PyPI into pip's isolated build environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi
mkdir -p dist
"$PYTHON" -m pip wheel . --no-deps -w dist -C manylinux=2_28
ls -1 dist/msmemscope-*manylinux_2_28*.whl
