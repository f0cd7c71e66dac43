#!/usr/bin/env bash
# Description: the embedded default model (build/model/default, trained by
# tools/train/train.py) answers the first N held-out problems of the
# synthetic task through dgemmad on the CPU backend (tests/eval/run-eval.sh,
# each problem seeded by its id, so the count is the same on every run of
# one build) with at least MIN of them exactly right.  A broken forward
# pass, sampler or tokenizer answers almost none (an untrained model of
# this shape: 1.4%).  N and MIN: EVAL_N (default 100), EVAL_MIN (default
# 0.95; the model shipped now gets 0.99: docs/notes.md, "Training the
# default model").  Backend and TP: EVAL_BACKEND (cpu), EVAL_TP (2: the
# CPU backend's two rank threads use two cores, and answer with exactly
# TP=1's texts, docs/notes.md).
# Exit 77 where dgemmad or the model is not built.
set -u
BUILD=${BUILD:-build}
n=${EVAL_N:-100} min=${EVAL_MIN:-0.95} backend=${EVAL_BACKEND:-cpu} tp=${EVAL_TP:-2}
name=t-eval-default/${backend}_tp${tp}
if [ ! -x "$BUILD/bin/dgemmad" ] || [ ! -x "$BUILD/bin/dgemma-eval" ] ||
   [ ! -e "$BUILD/model/default/config.json" ]; then
    echo "skip $name: dgemmad, dgemma-eval or the default model is not built"
    exit 77
fi
out=$(BUILD=$BUILD "${0%/*}/run-eval.sh" --backend "$backend" --tp "$tp" --limit "$n" \
      --min "$min" 2>&1)
st=$?
printf '%s\n' "$out" | sed 's/^/# /'
case $st in
0) echo "ok $name ($(printf '%s\n' "$out" | grep '^exact match'), at least $min)" ;;
1) echo "not ok $name: accuracy below $min" ;;
*) echo "not ok $name: run-eval.sh exit $st" ;;
esac
[ $st -eq 0 ]
