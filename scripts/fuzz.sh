#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang into build-fuzz and
# runs each for SECONDS_PER_TARGET (default 35: about 4 minutes for all six,
# plus the build), starting from a copy of its committed seed corpus
# (tests/fuzz/corpus/<target>/). Nothing is written into the repository: new
# inputs and crash reproducers go to a work directory under $TMPDIR, which is
# removed when every target passes and kept (its path printed) when one fails.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
#   FUZZ_TARGETS="fuzz_http_conn fuzz_tokenizer" scripts/fuzz.sh 600
#
# fuzz_tokenizer reads the model at $STREAMSINK_MODEL (else the cache path of
# scripts/fetch-model.sh, else a small fixture vocabulary). Exit status: 0, or
# 1 if any target crashed, leaked, timed out or ran out of memory.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET="${1:-35}"
BUILD_DIR="${FUZZ_BUILD_DIR:-build-fuzz}"
ALL_TARGETS="fuzz_gguf_parse fuzz_http_conn fuzz_api_request fuzz_chat_template"
ALL_TARGETS+=" fuzz_tokenizer fuzz_snapshot_decode"
read -r -a TARGETS <<<"${FUZZ_TARGETS:-$ALL_TARGETS}"

# Longest input per target: the GGUF parser takes whole small files; the HTTP
# target's inputs may overfill the connection's 16 KiB read buffer.
max_len() {
    case "$1" in
    fuzz_gguf_parse) echo 65536 ;;
    fuzz_http_conn) echo 20000 ;;
    fuzz_api_request) echo 16384 ;;
    fuzz_snapshot_decode) echo 4096 ;;
    *) echo 8192 ;;
    esac
}

echo "== fuzz: build ($BUILD_DIR)"
cmake -S . -B "$BUILD_DIR" -DCMAKE_C_COMPILER=clang -DSTREAMSINK_FUZZ=ON -DSTREAMSINK_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${TARGETS[@]}" >/dev/null

work="$(mktemp -d "${TMPDIR:-/tmp}/streamsink-fuzz.XXXXXX")"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
for t in "${TARGETS[@]}"; do
    mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
    if [ -d "tests/fuzz/corpus/$t" ]; then
        cp -r "tests/fuzz/corpus/$t/." "$work/corpus/$t/"
    fi
    log="$work/$t.log"
    echo "== fuzz: $t for ${SECONDS_PER_TARGET}s"
    rc=0
    "$BUILD_DIR/tests/fuzz/$t" "$work/corpus/$t" -max_total_time="$SECONDS_PER_TARGET" \
        -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$work/artifacts/$t/" >"$log" 2>&1 || rc=$?
    # the last status line: runs, coverage (cov: edges, ft: features), corpus
    grep -aE "^#[0-9]+[[:space:]]+(DONE|NEW|REDUCE|pulse|INITED)" "$log" | tail -n 1 || true
    grep -aE '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" |
        tr '\n' ' ' || true
    echo
    # one path a line: $TMPDIR (and so $work) may hold spaces
    mapfile -t found < <(find "$work/artifacts/$t" -type f ! -name 'slow-unit-*' | sort)
    if [ "$rc" -ne 0 ] || [ ${#found[@]} -gt 0 ]; then
        echo "!! $t failed (exit $rc); the end of its log ($log):"
        tail -n 60 "$log"
        for f in "${found[@]}"; do
            echo "!! reproducer: $f"
            printf '   rerun: %q %q\n' "$BUILD_DIR/tests/fuzz/$t" "$f"
        done
        failed+=("$t")
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "== fuzz: FAILED: ${failed[*]} (logs, corpora and reproducers kept in $work)"
    exit 1
fi
rm -rf "$work"
echo "== fuzz: ${#TARGETS[@]} targets, ${SECONDS_PER_TARGET}s each, no findings"
