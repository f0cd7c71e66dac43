#!/bin/sh
# tests/tally.sh FILE - add up the "passed failed skipped" lines that
# tests/run.sh appended to FILE (one per suite run) and print the total as
# the last line: "N passed, N failed".  Exit status 1 if anything failed.
set -eu
awk '{ p += $1; f += $2; s += $3; n++ }
     END {
         printf "%d suite run(s)%s\n", n, s ? sprintf(", %d skipped", s) : ""
         printf "%d passed, %d failed\n", p, f
         exit f ? 1 : 0
     }' "$1"
