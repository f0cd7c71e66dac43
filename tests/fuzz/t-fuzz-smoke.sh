#!/usr/bin/env bash
# Description: run every libFuzzer target in $FUZZ_DIR for $FUZZ_SECONDS
# seconds from its committed seed corpus (tests/fuzz/corpus/NAME; for
# fuzz-daemon-config also etc/dgemmad.yaml as it is now) with the JSON
# dictionary; one "ok"/"not ok" line per target, in the targets'
# order.  A crash, leak, sanitizer report or property abort fails the
# target; its log and the crashing input stay in $FUZZ_DIR.  FUZZ_JOBS
# targets (default: the CPU count) run at once: each fuzzes for its own
# wall-clock seconds on one core.
set -u
dir=${FUZZ_DIR:-build/fuzz}
secs=${FUZZ_SECONDS:-10}
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
fails=0
shopt -s nullglob
targets=()
for f in "$dir"/fuzz-*; do
    [ -x "$f" ] && [ -f "$f" ] && targets+=("$f")
done
if [ ${#targets[@]} -eq 0 ]; then
    echo "skip fuzz: no targets in $dir"
    exit 77
fi

# fuzz NAME: one target's run; its verdict (0 or the exit status) into
# $dir/NAME.rc
fuzz() {
    local name=$1 rc=0
    rm -rf "$dir/work-$name"; mkdir -p "$dir/work-$name"
    # the shipped configuration file seeds its parser's run as it is today
    [ "$name" = fuzz-daemon-config ] && cp "$src/etc/dgemmad.yaml" "$dir/work-$name/"
    (cd "$dir" && DG_SOURCE_DIR="$src" "./$name" -max_total_time="$secs" -timeout=10 \
        -rss_limit_mb=2048 -dict="$here/json.dict" -print_final_stats=1 "work-$name" \
        "$here/corpus/$name") >"$dir/$name.log" 2>&1 || rc=$?
    echo $rc >"$dir/$name.rc"
}

running=0
for f in "${targets[@]}"; do
    name=$(basename "$f")
    rm -f "$dir/$name.rc"
    if [ $running -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
    fuzz "$name" &
    running=$((running + 1))
done
wait
for f in "${targets[@]}"; do
    name=$(basename "$f")
    log=$dir/$name.log
    if [ "$(cat "$dir/$name.rc" 2>/dev/null)" = 0 ]; then
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        echo "ok fuzz/$name: ${runs:-?} inputs in ${secs}s, no finding"
    else
        echo "not ok fuzz/$name: finding or failure, log $log"
        grep -E 'ERROR|SUMMARY|==[0-9]+==|Test unit written' "$log" | head -n 8
        fails=$((fails + 1))
    fi
done
[ $fails -eq 0 ]
