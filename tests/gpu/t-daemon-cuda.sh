#!/usr/bin/env bash
# Description: dgemmad on the GPU: with backend cuda (and with auto, which
# must pick the GPU where one is present) the daemon starts on the embedded
# default model, logs "backend cuda", answers status with backend "cuda",
# and serves generate requests (chat and plain, several at once) that end
# with "done"; with backend cpu the same build still serves on the CPU.
# Where two GPUs are present, the same at tp 2 (backend cuda), and where
# four are, at tp 4 too: the log names every rank's GPU and vocabulary
# slice, and the metrics file holds a row for every request (dgemma-client
# stats).  On any GPU, the same at tp 2 and 4 with one_gpu (every rank on
# GPU 0, collectives without NCCL, no graphs).  At tp above 1 the log says
# that the group formed with every rank joined (group_timeout's count).
# Exit 77 where there is no GPU or no daemon build.
set -u
# (CI runs as root; dgemmad refuses root unless told)
ROOT_OK=; [ "$(id -u)" = 0 ] && ROOT_OK="-o allow_root=true"
BUILD=${BUILD:-build}
BIN=$BUILD/bin
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "skip t-daemon-cuda: no GPU here"
    exit 77
fi
if [ ! -x "$BIN/dgemmad" ] || [ ! -x "$BIN/dgemma-client" ] ||
   [ ! -e "$BUILD/model/default/config.json" ]; then
    echo "skip t-daemon-cuda: $BIN/dgemmad, $BIN/dgemma-client or $BUILD/model/default missing"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dgemma-t-daemon-cuda-XXXXXX")
d=0
trap '[ $d -gt 0 ] && kill $d 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok t-daemon-cuda/$1"; }
bad() { echo "not ok t-daemon-cuda/$1: $2"; fails=$((fails + 1)); }
C=$BIN/dgemma-client

# serve BACKEND NAME TP [ONE_GPU]: start the daemon (with ONE_GPU 1, every
# rank on one GPU; its files $tmp/BACKEND.TP[.one].*), run requests, stop it
serve() {
    local backend=$1 want=$2 tp=$3 one=false tag=$1.$3 out
    [ "${4:-0}" = 1 ] && one=true tag=$1.$3.one
    local sock=$tmp/$tag.sock log=$tmp/$tag.log db=$tmp/$tag.sqlite
    "$BIN/dgemmad" $ROOT_OK -o socket="$sock" -o log_file="$log" -o backend="$backend" \
        -o pin_workers=true -o tp="$tp" -o metrics="$db" -o max_batch=4 -o one_gpu=$one &
    d=$!
    out=$("$C" status -s "$sock" --wait 60 --json 2>&1)
    if printf '%s' "$out" | grep -q "\"backend\": *\"$want\""; then
        ok "$tag/status"
    else
        bad "$tag/status" "status does not say backend $want: $out; log: $(tail -3 "$log")"
    fi
    if grep -q "backend $want" "$log"; then ok "$tag/log"; else
        bad "$tag/log" "no 'backend $want' in the log: $(tail -3 "$log")"; fi
    out=$("$C" generate -s "$sock" --wait 10 --json --max-tokens 48 --seed 7 "Once upon a time" 2>&1)
    if printf '%s' "$out" | grep -q '"done"'; then ok "$tag/generate"; else
        bad "$tag/generate" "no done event: $(printf '%s' "$out" | tail -c 300)"; fi
    local pids="" i
    for i in 1 2 3 4; do
        "$C" generate -s "$sock" --wait 10 --json --max-tokens 40 --seed $i --chat "Hello $i" \
            >"$tmp/$tag.par.$i" 2>&1 &
        pids="$pids $!"
    done
    local pf=0
    for p in $pids; do wait "$p" || pf=$((pf + 1)); done
    for i in 1 2 3 4; do grep -q '"done"' "$tmp/$tag.par.$i" || pf=$((pf + 1)); done
    if [ $pf -eq 0 ]; then ok "$tag/four-at-once"; else
        bad "$tag/four-at-once" "$pf failures: $(tail -c 300 "$tmp/$tag.par.1")"; fi
    kill "$d"
    wait "$d"
    local rc=$?
    d=0
    if [ $rc -eq 0 ]; then ok "$tag/stop"; else bad "$tag/stop" "exit $rc"; fi
    # one metrics row per request: 1 + 4
    out=$("$C" stats --db "$db" --json 2>&1)
    if printf '%s' "$out" | grep -Eq '"requests": 5,?$'; then ok "$tag/metrics"; else
        bad "$tag/metrics" "stats: $(printf '%s' "$out" | head -c 300)"; fi
}

serve cuda cuda 1
serve auto cuda 1
serve cpu cpu 1
# ranks_named TP LOG GPU...: the ranks of 0 .. TP-1 that LOG does not name
# on their GPU (the GPUs in rank order; the last stands for the ranks after it)
ranks_named() {
    local tp=$1 log=$2 missing="" r
    shift 2
    for ((r = 0; r < tp; r++)); do
        grep -q "rank $r of $tp on GPU $1" "$log" || missing="$missing $r"
        [ $# -gt 1 ] && shift
    done
    printf '%s' "$missing"
}

# every rank on GPU 0 (one_gpu): each serve's checks, and the log names it
for tp in 2 4; do
    serve cuda cuda $tp 1
    missing=$(ranks_named $tp "$tmp/cuda.$tp.one.log" 0)
    grep -q "group of $tp tensor-parallel ranks formed: $tp joined" "$tmp/cuda.$tp.one.log" ||
        missing="$missing (no line: the group of $tp formed)"
    if [ -z "$missing" ]; then
        ok "tp$tp-one-gpu/ranks"
        grep "rank [0-9] of $tp" "$tmp/cuda.$tp.one.log" | sed 's/^/# /'
    else
        bad "tp$tp-one-gpu/ranks" "the log does not name ranks$missing on GPU 0: $(grep -i rank "$tmp/cuda.$tp.one.log" | head -5)"
    fi
done
ngpu=$(nvidia-smi -L | wc -l)
for tp in 2 4; do
    if [ "$ngpu" -lt $tp ]; then
        echo "# $ngpu GPU(s): tp $tp not run"
        continue
    fi
    serve cuda cuda $tp
    log=$tmp/cuda.$tp.log
    missing=$(ranks_named $tp "$log" $(seq 0 $((tp - 1))))
    grep -q "group of $tp tensor-parallel ranks formed: $tp joined" "$log" ||
        missing="$missing (no line: the group of $tp formed)"
    if [ -z "$missing" ] && grep -q 'worker pinned' "$log"; then
        ok "tp$tp/ranks"
        grep "rank [0-9] of $tp\|pinned" "$log" | sed 's/^/# /'
    else
        bad "tp$tp/ranks" "the log does not name ranks$missing: $(grep -i rank "$log" | head -5)"
    fi
done
echo "# t-daemon-cuda: $fails failed"
[ $fails -eq 0 ]
