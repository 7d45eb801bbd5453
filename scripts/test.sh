#!/usr/bin/env bash
# Runs every test: formatting and lints, then unit and end-to-end tests (release build, since
# the end-to-end tests run real programs under the preloaded runtime library).
set -euo pipefail
cd "$(dirname "$0")/.."
# The virtual environment, the release build and the Python package (idempotent).
scripts/setup.sh
# The shell-wrapper tests run bash and zsh.
if ! command -v zsh >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq zsh >/dev/null
    else
        echo "zsh is needed by the tests: sudo apt-get install zsh" >&2
        exit 1
    fi
fi
# The report tests open pages in headless Chromium (Debian's chromium + chromium-driver) through
# selenium.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
    else
        echo "chromium is needed by the tests: sudo apt-get install chromium chromium-driver" >&2
        exit 1
    fi
fi
# The host-leak tests check that libc's local functions are named from its detached debug
# symbols (Debian's libc6-dbg).
if ! dpkg-query -W -f='${Status}' libc6-dbg 2>/dev/null | grep -q 'install ok installed'; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq libc6-dbg >/dev/null
    else
        echo "libc6-dbg is needed by the tests: sudo apt-get install libc6-dbg" >&2
        exit 1
    fi
fi
# The hostile-process tests preload other allocators (Debian's jemalloc and tcmalloc).
if [ ! -e /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ] \
    || [ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq libjemalloc2 libtcmalloc-minimal4 >/dev/null
    else
        echo "jemalloc and tcmalloc are needed by the tests: sudo apt-get install libjemalloc2 libtcmalloc-minimal4" >&2
        exit 1
    fi
fi
# `msmemscope ranks --engine spark` runs pyspark, which needs a Java runtime (Debian's default).
if ! command -v java >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq default-jre-headless >/dev/null
    else
        echo "java is needed by the tests: sudo apt-get install default-jre-headless" >&2
        exit 1
    fi
fi
.venv/bin/python -c "import selenium" 2>/dev/null || .venv/bin/pip install -q selenium
cargo fmt --all -- --check
# Every declared dependency is used (scripts/check_unused_deps.py says how it looks).
.venv/bin/python scripts/check_unused_deps.py
cargo clippy --release --workspace --all-targets --quiet -- -D warnings
cargo build --release --workspace
cargo test --release --workspace
.venv/bin/ruff format --check --quiet python tests/python build_support
.venv/bin/ruff check --quiet python tests/python build_support
# Type-checks python/msmemscope, strictly ([tool.mypy] in pyproject.toml: strict = true).
.venv/bin/python -m mypy
# Two workers, a module to each at a time (module fixtures are built once): most tests wait on
# programs they start, and the slowest modules run beside the rest (tests/python/conftest.py).
PYTEST=(.venv/bin/python -m pytest -q -n 2 --dist loadfile)
"${PYTEST[@]}" tests/python
# The PyTorch tests again on the dispatch-mode fallback (used where the native capture cannot be
# built).
MSMEMSCOPE_TORCH_CAPTURE=python "${PYTEST[@]}" tests/python/test_torch_tracker.py \
    tests/python/test_decompose.py tests/python/test_oom.py tests/python/test_watch.py \
    tests/python/test_snapshot.py tests/python/test_framework_hooks_fsdp.py \
    tests/python/test_leak_findings.py
