#!/usr/bin/env bash
# Runs every test: formatting and lints, then unit and end-to-end tests (release build, since
# the end-to-end tests run real programs under the preloaded runtime library).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets --quiet -- -D warnings
cargo build --release --workspace
cargo test --release --workspace
