#!/usr/bin/env bash
# Description: run every libFuzzer target in $FUZZ_DIR for $FUZZ_SECONDS
# seconds from its committed seed corpus (tests/fuzz/corpus/NAME) with the
# JSON dictionary; one "ok"/"not ok" line per target.  A crash, leak,
# sanitizer report or property abort fails the target; its log and the
# crashing input stay in $FUZZ_DIR.
set -u
dir=${FUZZ_DIR:-build/fuzz}
secs=${FUZZ_SECONDS:-10}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
fails=0
shopt -s nullglob
targets=("$dir"/fuzz-*)
if [ ${#targets[@]} -eq 0 ]; then
    echo "skip fuzz: no targets in $dir"
    exit 77
fi
for f in "${targets[@]}"; do
    [ -x "$f" ] && [ -f "$f" ] || continue
    name=$(basename "$f")
    work=$dir/work-$name
    rm -rf "$work"; mkdir -p "$work"
    log=$dir/$name.log
    if (cd "$dir" && DG_SOURCE_DIR="$src" "./$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
            -dict="$here/json.dict" -print_final_stats=1 "work-$name" "$here/corpus/$name") \
            >"$log" 2>&1; then
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        echo "ok fuzz/$name: ${runs:-?} inputs in ${secs}s, no finding"
    else
        echo "not ok fuzz/$name: finding or failure, log $log"
        grep -E 'ERROR|SUMMARY|==[0-9]+==|Test unit written' "$log" | head -n 8
        fails=$((fails + 1))
    fi
done
[ $fails -eq 0 ]
