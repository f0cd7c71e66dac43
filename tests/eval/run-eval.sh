#!/usr/bin/env bash
# run-eval.sh - exact-match accuracy of a model over the held-out problems,
# through a daemon of its own: start dgemmad on MODEL (a private socket,
# log and metrics file in a scratch folder), run `dgemma-eval accuracy`,
# stop the daemon, and exit with accuracy's status (0 at or above --min,
# 1 below, 2 bad input, 3 the daemon unreachable or gone) or 4 when the
# daemon did not exit cleanly.
#
# usage: tests/eval/run-eval.sh [--model DIR] [--backend cpu|cuda|auto] [--tp N]
#                               [--problems FILE] [--limit N] [--min FRACTION]
#                               [--results FILE] [--parallel N]
# BUILD (default build) says where bin/ and model/default are.
set -u
BUILD=${BUILD:-build}
BIN=$BUILD/bin
here=${0%/*}
model=$BUILD/model/default backend=cpu tp=1 problems=$here/heldout.jsonl
parallel=16
acc=()
while [ $# -gt 0 ]; do
    case $1 in
    --model) model=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --tp) tp=$2; shift 2 ;;
    --problems) problems=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    --limit|--min|--results) acc+=("$1" "$2"); shift 2 ;;
    *) echo "run-eval.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
for f in "$BIN/dgemmad" "$BIN/dgemma-eval" "$model/config.json" "$problems"; do
    [ -e "$f" ] || { echo "run-eval.sh: $f is missing (make first?)" >&2; exit 2; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dgemma-eval-XXXXXX")
d=0
trap '[ $d -gt 0 ] && kill $d 2>/dev/null; rm -rf "$tmp"' EXIT
# (dgemmad refuses to serve as root unless told)
root_ok=; [ "$(id -u)" = 0 ] && root_ok="-o allow_root=true"
"$BIN/dgemmad" $root_ok -o model="$model" -o backend="$backend" -o tp="$tp" \
    -o socket="$tmp/d.sock" -o log_file="$tmp/d.log" -o metrics="$tmp/m.db" \
    -o max_batch="$parallel" -o pin_workers=false &
d=$!
echo "model $model, backend $backend, tp $tp, problems $problems"
"$BIN/dgemma-eval" accuracy --problems "$problems" -s "$tmp/d.sock" --wait 120 \
    --parallel "$parallel" "${acc[@]}"
st=$?
kill -TERM $d
wait $d || { echo "run-eval.sh: dgemmad did not exit cleanly; its log:" >&2
             tail -5 "$tmp/d.log" >&2; [ $st -eq 0 ] && st=4; }
d=0
[ $st -eq 3 ] && tail -5 "$tmp/d.log" >&2
exit $st
