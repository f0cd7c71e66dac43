#!/usr/bin/env bash
# tests/run.sh - run test programs and tally their cases.
#
# usage: tests/run.sh [-t SECONDS] TEST...
#
# A TEST is an executable (C test program or shell script).  Each prints one
# line per case: "ok NAME", "not ok NAME: why" or "skip NAME: why"; other
# lines are shown only when the test fails.  Exit status 77 with no case
# lines means "cannot run here" (counted as skipped).  A test that exits
# non-zero without reporting a failed case, or runs past the timeout, counts
# as one failure.  Each test's time is printed beside its previous run's.
# The last line is "N passed, N failed"; the exit status is 0 only when
# nothing failed.  With TALLY_FILE set, "passed failed skipped" is also
# appended there (tests/tally.sh adds several runs up).
set -u

timeout_s=${TEST_TIMEOUT:-300}
if [ "${1:-}" = "-t" ]; then timeout_s=$2; shift 2; fi
build=${BUILD:-build}
logdir=$build/tests/logs
times=$build/tests/.times
mkdir -p "$logdir"
touch "$times"

pass=0 fail=0 skip=0
failed_names=() timed_out=()

prev_time() { awk -v n="$1" '$1 == n { t = $2 } END { if (t != "") print t }' "$times"; }

for t in "$@"; do
    name=$(basename "$t")
    log=$logdir/$name.log
    start=$(date +%s.%N)
    timeout -k 5 "$timeout_s" "$t" >"$log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
    was=$(prev_time "$name")
    tp=0 tf=0 ts=0
    while IFS= read -r line; do
        case $line in
            "ok "*)     tp=$((tp + 1)); printf '  ok    %s\n' "${line#ok }" ;;
            "not ok "*) tf=$((tf + 1)); printf '  FAIL  %s\n' "${line#not ok }" ;;
            "skip "*)   ts=$((ts + 1)); printf '  skip  %s\n' "${line#skip }" ;;
        esac
    done <"$log"
    note=""
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        tf=$((tf + 1)); timed_out+=("$name"); note="TIMED OUT after ${timeout_s}s"
    elif [ $rc -eq 77 ] && [ $tp -eq 0 ] && [ $tf -eq 0 ]; then
        [ $ts -eq 0 ] && ts=1
        note="skipped (exit 77)"
    elif [ $rc -ne 0 ] && [ $tf -eq 0 ]; then
        tf=1; note="exit status $rc without a failed case"
    fi
    pass=$((pass + tp)); fail=$((fail + tf)); skip=$((skip + ts))
    if [ $tf -gt 0 ]; then
        failed_names+=("$name")
        printf '%s: %d passed, %d failed %s(%ss%s); log %s\n' "$name" $tp $tf \
            "${note:+$note }" "$secs" "${was:+, was ${was}s}" "$log"
        grep -v -E '^(ok |skip )' "$log" | tail -n 30 | sed 's/^/    | /'
    else
        printf '%s: %d passed%s (%ss%s)\n' "$name" $tp "${note:+, $note}" "$secs" \
            "${was:+, was ${was}s}"
    fi
    awk -v n="$name" '$1 != n' "$times" >"$times.new"; echo "$name $secs" >>"$times.new"
    mv "$times.new" "$times"
done

[ ${#timed_out[@]} -gt 0 ] && echo "timed out: ${timed_out[*]}"
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
[ $skip -gt 0 ] && echo "$skip skipped"
echo "$pass passed, $fail failed"
[ -n "${TALLY_FILE:-}" ] && echo "$pass $fail $skip" >>"$TALLY_FILE"
[ $fail -eq 0 ]
