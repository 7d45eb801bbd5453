#!/usr/bin/env bash
# Builds everything, then runs the two bundled examples under msmemscope:
#  1. the leaky C program under host-leak detection: its leak report is printed at the end;
#  2. a small PyTorch training loop: the event dump of every tensor allocation, free and
#     operator is written (the PyTorch tracker starts by itself when torch is imported), and the
#     leaks analysis names the tensors it keeps from step 2 on.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p target/demo
gcc -O2 -g -fomit-frame-pointer -pthread -o target/demo/leaky examples/leaky.c

echo "== PyTorch training loop (event dump and the default leaks analysis) =="
bin/msmemscope --output-path=target/demo/results .venv/bin/python examples/train.py

echo
echo "== Leaky C program (host heap leaks) =="
# The C program runs about 3 s: 200 ms beats (instead of the default 1 s) give its Leak
# Suspicion Index enough points after the 5 warm-up beats.
MSMEMSCOPE_HOST_BEAT_MS=200 exec bin/msmemscope --analysis=host-leaks \
    --output-path=target/demo/results target/demo/leaky
