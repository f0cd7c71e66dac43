#!/usr/bin/env bash
# Description: the default model's accuracy check (tests/eval/t-eval-default.sh:
# the first 100 held-out problems through dgemmad, at least the same
# fraction right) with backend cuda at TP=1, and at TP=2 where two GPUs
# are present.  Exit 77 where there is no GPU.
set -u
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "skip t-eval-cuda: no GPU here"
    exit 77
fi
here=${0%/*}/../eval
fails=0
EVAL_BACKEND=cuda EVAL_TP=1 "$here/t-eval-default.sh" || fails=$((fails + 1))
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    EVAL_BACKEND=cuda EVAL_TP=2 "$here/t-eval-default.sh" || fails=$((fails + 1))
else
    echo "skip t-eval-default/cuda_tp2: one GPU"
fi
[ $fails -eq 0 ]
