#!/usr/bin/env bash
# Every reader under libFuzzer for a while: each target of fuzz/ (one per reader: csv,
# original_csv, sqlite, parquet, step_summary, step_part, control_frame) runs for SECONDS,
# from the starting inputs the stable test makes (real dumps and the project's writers' files) and the
# regression corpus (crates/core/tests/fuzz_corpus/<target>/). Prints the executions and the
# crashes of each target; exits 1 when one crashed (its input is in fuzz/artifacts/<target>/:
# add it to the regression corpus once the reader is fixed).
#
# Needs nightly and cargo-fuzz (`cargo install cargo-fuzz`). The CI runs the same checks on
# stable, a few seconds' worth: cargo test -p msmemscope-core --test fuzz_readers.
#
# Usage: bench/fuzz_readers.sh [SECONDS per target, default 60] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(csv original_csv sqlite parquet step_summary step_part control_frame)
fi
out=bench/out/fuzz_readers
mkdir -p "$out"

MSMEMSCOPE_FUZZ_SEEDS_OUT="$PWD/fuzz/corpus" \
    cargo test --release -q -p msmemscope-core --test fuzz_readers write_seeds >/dev/null
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t"
    if [ -d "crates/core/tests/fuzz_corpus/$t" ]; then
        find "crates/core/tests/fuzz_corpus/$t" -type f ! -name '*.md' \
            -exec cp {} "fuzz/corpus/$t/" \;
    fi
done
(cd fuzz && cargo +nightly fuzz build -O)
# The built targets are run as they are: `cargo fuzz run` would build again whenever the
# sources changed meanwhile.
bin="fuzz/target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release"

failed=0
printf '%-14s %12s %10s %8s\n' target executions exec/s crashes
for t in "${targets[@]}"; do
    log="$out/$t.log"
    mkdir -p "fuzz/artifacts/$t"
    before=$(find "fuzz/artifacts/$t" -type f | wc -l)
    # -rss_limit_mb: a reader that allocates what a file claims is a crash, not a slow run.
    "$bin/$t" "fuzz/corpus/$t" -artifact_prefix="fuzz/artifacts/$t/" \
        -max_total_time="$seconds" -max_len=65536 -timeout=20 -rss_limit_mb=2048 \
        -print_final_stats=1 >"$log" 2>&1 || true
    after=$(find "fuzz/artifacts/$t" -type f | wc -l)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    crashes=$((after - before))
    [ "$crashes" -eq 0 ] || failed=1
    printf '%-14s %12s %10s %8s\n' "$t" "${runs:-?}" "${rate:-?}" "$crashes"
done
echo "logs: $out/; crashing inputs: fuzz/artifacts/<target>/"
exit $failed
