#!/usr/bin/env bash
# Builds everything and runs the bundled leaky C program under host-leak detection; the report
# is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --quiet
mkdir -p target/demo
gcc -O2 -g -fomit-frame-pointer -pthread -o target/demo/leaky examples/leaky.c
# The demo runs about 3 s: 200 ms beats (instead of the default 1 s) give its Leak Suspicion
# Index enough points after the 5 warm-up beats.
MSMEMSCOPE_HOST_BEAT_MS=200 exec bin/msmemscope --analysis=host-leaks \
    --output-path=target/demo/results target/demo/leaky
