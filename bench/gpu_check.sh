#!/bin/sh
# The CUDA backend on a real GPU, in one run of under 8 minutes (one H200): builds (or unpacks a
# build made elsewhere), then runs bench/gpu_check.py, which prints PASS/FAIL with figures for
#   1. a CUDA PyTorch training loop with a leak (leaks analysis, HAL + PTA rows, pool totals),
#      and the tracker's overhead on the GPU against no tool (op and kernel level);
#   2. a raw cudaMalloc leak from a ctypes program (libcudart);
#   3. a C program on the driver API (dlopen + dlsym and cuGetProcAddress, the virtual memory
#      API, an out-of-memory request);
#   4. a PyTorch out-of-memory under --analysis=oom (driver trigger, allocator observer, live
#      blocks);
#   5. --compare at --level=kernel of two runs of the training loop;
#   6. the sanitizer's race example on two CUDA streams, with and without the event between them.
#
# Usage:
#   bench/gpu_check.sh            on the GPU machine: takes the binaries packed into .gpu_carry/ by
#                                 --pack, else builds with cargo (the Python extension must then
#                                 be there already: scripts/setup.sh).
#   bench/gpu_check.sh --pack     here (no GPU needed): builds, strips and packs the CLI, the
#                                 runtime library and the Python extension into .gpu_carry/
#                                 (git-ignored through .git/info/exclude) to carry along.
# Environment: PYTHON (default: python3), GPU_CHECK_OUT (where the runs' dumps go; default
# bench/out/gpu_check). When $OUT is set, the printed results are also written to
# $OUT/gpu_check.txt.
set -eu

cd "$(dirname "$0")/.."
root=$(pwd)
carry="$root/.gpu_carry"

if [ "${1:-}" = "--pack" ]; then
    cargo build --release -p msmemscope-cli -p msmemscope-runtime
    if [ ! -f python/msmemscope/_native.abi3.so ]; then
        echo "python/msmemscope/_native.abi3.so is missing: run scripts/setup.sh first"
        exit 1
    fi
    rm -rf "$carry"
    mkdir -p "$carry"
    strip -o "$carry/msmemscope-cli" target/release/msmemscope-cli
    strip -o "$carry/libmsmemscope_runtime.so" target/release/libmsmemscope_runtime.so
    strip -o "$carry/_native.abi3.so" python/msmemscope/_native.abi3.so
    grep -qx '/.gpu_carry/' .git/info/exclude 2>/dev/null || echo '/.gpu_carry/' >>.git/info/exclude
    ls -la "$carry"
    echo "packed: carry .gpu_carry and run bench/gpu_check.sh on the GPU machine"
    exit 0
fi

start=$(date +%s)
if [ -d "$carry" ]; then
    echo "== build: the binaries packed in .gpu_carry (bench/gpu_check.sh --pack)"
    mkdir -p target/release
    cp "$carry/msmemscope-cli" "$carry/libmsmemscope_runtime.so" target/release/
    chmod +x target/release/msmemscope-cli
elif command -v cargo >/dev/null 2>&1; then
    echo "== build: cargo build --release"
    cargo build --release -p msmemscope-cli -p msmemscope-runtime
else
    echo "FAIL build: no .gpu_carry and no cargo (run bench/gpu_check.sh --pack where cargo is)"
    exit 1
fi
# The Python extension: the packed one when there is one (maturin is rarely on a GPU machine).
if [ -f "$carry/_native.abi3.so" ]; then
    cp "$carry/_native.abi3.so" python/msmemscope/
elif [ ! -f python/msmemscope/_native.abi3.so ]; then
    echo "FAIL build: python/msmemscope/_native.abi3.so is missing (scripts/setup.sh, or --pack)"
    exit 1
fi
mkdir -p python/msmemscope/lib
cp target/release/libmsmemscope_runtime.so python/msmemscope/lib/
echo "build: $(($(date +%s) - start)) s"

PYTHONUNBUFFERED=1 exec "${PYTHON:-python3}" bench/gpu_check.py
