#!/usr/bin/env bash
# The LSI fixture (about 4 s: steady leak, slow leak, one-off table, bounded ring) under
# msmemscope and under heaptrack, side by side: what each calls a leak.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v heaptrack >/dev/null || { echo "needs heaptrack: apt-get install heaptrack" >&2; exit 1; }
cargo build --release --quiet
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -g -fomit-frame-pointer -pthread tests/fixtures/host_leaks.c -o "$tmp/host_leaks" -ldl

MSMEMSCOPE_HOST_BEAT_MS=100 target/release/msmemscope-cli -q --analysis=host-leaks -o "$tmp/ms" \
    "$tmp/host_leaks" lsi >/dev/null 2>&1
overview=$(ls "$tmp"/ms/*/host_leak/leak_overview_1.txt)
heaptrack -o "$tmp/ht" "$tmp/host_leaks" lsi >/dev/null 2>&1
heaptrack_print -f "$tmp/ht.zst" --print-leaks 1 --print-peaks 0 --print-allocators 0 \
    --print-temporary 0 --print-histogram 0 >"$tmp/ht.txt" 2>/dev/null

echo "msmemscope (ranked by LSI; resident sites listed apart):"
awk '/^--- TOP|^--- Resident/ {print; next}
     /^#/ {site=$0; getline cls; getline frame; sub(/^ +/, "", frame); sub(/^ +/, "", cls);
           split(frame, f, " "); printf "  %-22s %s\n", f[1], cls}' "$overview"
echo
echo "heaptrack (everything alive at exit is 'leaked', ranked by size):"
awk '/leaked over .* calls from$/ {amount=$1; calls=$4; getline fn; printf "  %-22s %s leaked over %s calls\n", fn, amount, calls}' "$tmp/ht.txt"
