#!/usr/bin/env bash
# Description: dgemmad in multi-process mode on two GPUs: rank 1 started
# first (--rank 1), then rank 0 (--rank 0) with the socket, both joined by
# NCCL's bootstrap at NCCL_COMM_ID.  A seeded request's text equals the
# one-process tp 2 daemon's (same seed, same model); four requests at once
# end with "done"; the metrics file has a row for each; SIGTERM to rank 0
# stops it (exit 0) and rank 1 follows (exit 0, "rank 0 ended the group"
# in its log).  Exit 77 without two GPUs or a daemon build.
set -u
# (CI runs as root; dgemmad refuses root unless told)
ROOT_OK=; [ "$(id -u)" = 0 ] && ROOT_OK="-o allow_root=true"
BUILD=${BUILD:-build}
BIN=$BUILD/bin
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt 2 ]; then
    echo "skip t-daemon-mp: fewer than two GPUs"
    exit 77
fi
if [ ! -x "$BIN/dgemmad" ] || [ ! -x "$BIN/dgemma-client" ]; then
    echo "skip t-daemon-mp: $BIN/dgemmad or $BIN/dgemma-client missing"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dgemma-t-daemon-mp-XXXXXX")
pids=""
trap 'for p in $pids; do kill -9 $p 2>/dev/null; done; rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok t-daemon-mp/$1"; }
bad() { echo "not ok t-daemon-mp/$1: $2"; fails=$((fails + 1)); }
C=$BIN/dgemma-client
OPTS=(-o tp=2 -o max_batch=4 -o gpu_timeout=60 $ROOT_OK)
PROMPT="Once upon a time"

# the one-process tp 2 daemon's answer to the seeded request
"$BIN/dgemmad" "${OPTS[@]}" -o socket="$tmp/one.sock" -o log_file="$tmp/one.log" &
one=$!
pids="$one"
if "$C" generate -s "$tmp/one.sock" --wait 120 --seed 7 --max-tokens 64 "$PROMPT" \
    >"$tmp/one.txt" 2>"$tmp/one.err"; then ok "one-process"; else
    bad "one-process" "$(tail -c 300 "$tmp/one.err"); log: $(tail -3 "$tmp/one.log")"; fi
kill "$one"
wait "$one"
pids=""

export NCCL_COMM_ID=127.0.0.1:$((29500 + RANDOM % 2000))
"$BIN/dgemmad" "${OPTS[@]}" --rank 1 -o log_file="$tmp/r1.log" &
r1=$!
"$BIN/dgemmad" "${OPTS[@]}" --rank 0 -o socket="$tmp/mp.sock" -o log_file="$tmp/r0.log" \
    -o metrics="$tmp/m.sqlite" &
r0=$!
pids="$r0 $r1"
if "$C" generate -s "$tmp/mp.sock" --wait 120 --seed 7 --max-tokens 64 "$PROMPT" \
    >"$tmp/mp.txt" 2>"$tmp/mp.err"; then ok "generate"; else
    bad "generate" "$(tail -c 300 "$tmp/mp.err"); rank 0: $(tail -3 "$tmp/r0.log"); rank 1: $(tail -3 "$tmp/r1.log")"; fi
if [ -s "$tmp/mp.txt" ] && cmp -s "$tmp/one.txt" "$tmp/mp.txt"; then
    ok "same-text"
else
    bad "same-text" "one process: $(head -c 200 "$tmp/one.txt") / two: $(head -c 200 "$tmp/mp.txt")"
fi
pf=0
ps=""
for i in 1 2 3 4; do
    "$C" generate -s "$tmp/mp.sock" --json --max-tokens 40 --seed $i "Hello $i" \
        >"$tmp/par.$i" 2>&1 &
    ps="$ps $!"
done
for p in $ps; do wait "$p" || pf=$((pf + 1)); done
for i in 1 2 3 4; do grep -q '"done"' "$tmp/par.$i" || pf=$((pf + 1)); done
if [ $pf -eq 0 ]; then ok "four-at-once"; else
    bad "four-at-once" "$pf failures: $(tail -c 300 "$tmp/par.1")"; fi
if grep -q 'rank 1 of 2: serving' "$tmp/r1.log" && grep -q 'rank 0 of 2 on GPU' "$tmp/r0.log"
then ok "logs"; else bad "logs" "rank 0: $(grep -i rank "$tmp/r0.log" | head -3); rank 1: $(tail -3 "$tmp/r1.log")"; fi
kill "$r0"
wait "$r0"
rc0=$?
if [ $rc0 -eq 0 ]; then ok "rank0-stop"; else bad "rank0-stop" "exit $rc0: $(tail -3 "$tmp/r0.log")"; fi
for _ in $(seq 1 300); do kill -0 "$r1" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$r1" 2>/dev/null; then
    bad "rank1-stop" "still running 30 s after rank 0 stopped: $(tail -3 "$tmp/r1.log")"
else
    wait "$r1"
    rc1=$?
    if [ $rc1 -eq 0 ] && grep -q 'rank 0 ended the group' "$tmp/r1.log"; then ok "rank1-stop"
    else bad "rank1-stop" "exit $rc1: $(tail -3 "$tmp/r1.log")"; fi
fi
pids=""
out=$("$C" stats --db "$tmp/m.sqlite" --json 2>&1)
if printf '%s' "$out" | grep -Eq '"requests": 5,?$'; then ok "metrics"; else
    bad "metrics" "stats: $(printf '%s' "$out" | head -c 300)"; fi
echo "# t-daemon-mp: $fails failed"
[ $fails -eq 0 ]
