#!/usr/bin/env bash
# Description: dgemmad in multi-process mode with its peer never started
# (one GPU is enough): ncclCommInitRank would wait for the peer for good,
# so group_timeout ends the process.  Rank 0 alone at tp 2 with
# group_timeout 4 exits 1, not before 4 s and within 120 s, its log
# saying the group did not form and naming NCCL_COMM_ID, and no socket
# left; rank 1 alone (nobody listening at NCCL_COMM_ID) exits 1 within
# 120 s; rank 0 alone with group_timeout 0 is still waiting after 8 s.
# Exit 77 without a GPU or a daemon build.
set -u
# (CI runs as root; dgemmad refuses root unless told)
ROOT_OK=; [ "$(id -u)" = 0 ] && ROOT_OK="-o allow_root=true"
BUILD=${BUILD:-build}
BIN=$BUILD/bin
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt 1 ]; then
    echo "skip t-daemon-mp-alone: no GPU"
    exit 77
fi
if [ ! -x "$BIN/dgemmad" ]; then
    echo "skip t-daemon-mp-alone: $BIN/dgemmad missing"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dgemma-t-daemon-mp-alone-XXXXXX")
pids=""
trap 'for p in $pids; do kill -9 $p 2>/dev/null; done; rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok t-daemon-mp-alone/$1"; }
bad() { echo "not ok t-daemon-mp-alone/$1: $2"; fails=$((fails + 1)); }
OPTS=(-o tp=2 -o backend=cuda $ROOT_OK)
port() { echo $((29500 + RANDOM % 2000)); }
LIMIT=${ALONE_LIMIT:-120} # (seconds a rank alone may take to exit)

# Start one rank; wait up to $3 s for it.  Sets rc (124: still running,
# then killed) and took (whole seconds).
run_alone() {
    local name=$1 rank=$2 limit=$3
    shift 3
    local t0=$SECONDS p
    "$BIN/dgemmad" "${OPTS[@]}" --rank "$rank" -o socket="$tmp/$name.sock" \
        -o log_file="$tmp/$name.log" "$@" &
    p=$!
    pids="$p"
    rc=124
    while [ $((SECONDS - t0)) -lt "$limit" ]; do
        if ! kill -0 "$p" 2>/dev/null; then
            wait "$p"
            rc=$?
            break
        fi
        sleep 0.2
    done
    took=$((SECONDS - t0))
    if [ $rc -eq 124 ]; then kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; fi
    pids=""
}

export NCCL_COMM_ID=127.0.0.1:$(port)
run_alone r0 0 "$LIMIT" -o group_timeout=4
grep 'group\|NCCL' "$tmp/r0.log" | tail -2 | sed 's/^/# rank 0: /'
if [ $rc -eq 1 ] && [ $took -ge 4 ] && grep -q 'did not form within 4 s (group_timeout)' \
    "$tmp/r0.log" && grep -q "NCCL_COMM_ID (here $NCCL_COMM_ID)" "$tmp/r0.log"; then
    ok "rank0-alone"
else
    bad "rank0-alone" "exit $rc after $took s: $(tail -3 "$tmp/r0.log")"
fi
if [ -e "$tmp/r0.sock" ]; then bad "no-socket" "$tmp/r0.sock exists"; else ok "no-socket"; fi

export NCCL_COMM_ID=127.0.0.1:$(port)
run_alone r1 1 "$LIMIT" -o group_timeout=4
grep 'group\|NCCL' "$tmp/r1.log" | tail -2 | sed 's/^/# rank 1: /'
if [ $rc -eq 1 ] && grep -qi 'group\|nccl' "$tmp/r1.log"; then
    ok "rank1-alone"
else
    bad "rank1-alone" "exit $rc after $took s: $(tail -3 "$tmp/r1.log")"
fi

export NCCL_COMM_ID=127.0.0.1:$(port)
run_alone w0 0 8 -o group_timeout=0
if [ $rc -eq 124 ] && ! grep -q 'did not form' "$tmp/w0.log"; then
    ok "no-bound"
else
    bad "no-bound" "exit $rc after $took s: $(tail -3 "$tmp/w0.log")"
fi
echo "# t-daemon-mp-alone: $fails failed"
[ $fails -eq 0 ]
