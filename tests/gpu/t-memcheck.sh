#!/usr/bin/env bash
# Description: every GPU test program again under compute-sanitizer's
# memcheck (out-of-bounds and misaligned device accesses, leaks of device
# memory at exit, CUDA API errors): each must pass with 0 errors reported.
# (t-gpu-env without API-error reports: NCCL's start-up probes kernels it
# has no image for and handles the errors itself.  DG_MEMCHECK=1 tells the
# programs to leave out the cases that provoke an API error on purpose.)
# Exit 77 where there is no GPU or no compute-sanitizer.
set -u
BUILD=${BUILD:-build}
CS=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "skip t-memcheck: no GPU here"
    exit 77
fi
if [ ! -x "$CS" ]; then
    echo "skip t-memcheck: no compute-sanitizer ($CS)"
    exit 77
fi
export DG_MEMCHECK=1
fails=0 n=0
for t in "$BUILD"/tests/gpu/t-*; do
    case $t in *.o|*.d) continue ;; esac
    [ -x "$t" ] || continue
    name=${t##*/}
    n=$((n + 1))
    log=$(mktemp "${TMPDIR:-/tmp}/dgemma-t-memcheck-XXXXXX")
    start=$(date +%s)
    api=()
    [ "$name" = t-gpu-env ] && api=(--report-api-errors no)
    "$CS" --tool memcheck --leak-check full "${api[@]}" --error-exitcode 9 "$t" >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    summary=$(grep "ERROR SUMMARY" "$log" | tail -1)
    if [ $rc -eq 77 ] && printf '%s' "$summary" | grep -q "0 errors"; then
        # (a program that skips itself here, for want of what it needs)
        echo "ok t-memcheck/$name (skipped itself; $summary)"
    elif [ $rc -eq 0 ] && printf '%s' "$summary" | grep -q "0 errors"; then
        echo "ok t-memcheck/$name ($summary, ${secs} s)"
    else
        echo "not ok t-memcheck/$name: exit $rc, ${summary:-no summary}"
        grep -m 5 -E "=========  *(Invalid|Program hit|Leaked)|not ok" "$log" | sed 's/^/    /'
        fails=$((fails + 1))
    fi
    rm -f "$log"
done
echo "# t-memcheck: $n programs, $fails failed"
[ $n -gt 0 ] && [ $fails -eq 0 ]
