#!/usr/bin/env bash
# tools/train/run-gpu.sh - train the default model on the GPU machine and
# score it, in one go (what docs/notes.md's training runs ran):
#
#   tools/train/run-gpu.sh OUTDIR [train.py train options...]
#
#   1. tools/train/train.py train --out /tmp/dgemma-train/model, the options
#      given (--minutes, --init or --resume, --schedule-minutes, --batch, ...),
#      its log in OUTDIR/train-log.csv and its output in OUTDIR/train.txt;
#   2. the model and its fp32 state into OUTDIR/model.tgz (this first, so
#      a later step that runs out of time loses nothing).  The state
#      --resume continues from, /tmp/dgemma-train/model-resume.pt (weights
#      and AdamW's two moments, 27 MB), stays on the machine for the next
#      call: files come back from a device call at 16 MiB at most;
#   3. the loss curve, OUTDIR/loss.png;
#   4. dgemmad with backend cuda over the held-out problems (EVAL_N, default
#      all 500; tests/eval/run-eval.sh), results in OUTDIR/cuda-eval.jsonl;
#   5. transformers' generate over the first HF_N (default 100) of them,
#      results in OUTDIR/hf-eval.jsonl.
# Steps 4 and 5 are cut at EVAL_S seconds each (default 90; 0 skips both,
# for a call whose training another call continues).  dgemma is
# built beforehand (build/bin); nothing is compiled here.  The shipped
# model's three calls and their options: docs/notes.md, "From scratch in
# one device session, third try (runs 67–69)".
set -u -o pipefail
out=${1:?usage: tools/train/run-gpu.sh OUTDIR [train.py train options...]}
shift
here=${0%/*}
work=/tmp/dgemma-train
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p "$out" "$work" || exit 1
start=$(date +%s)
python3 "$here/train.py" train --out "$work/model" --log "$out/train-log.csv" "$@" 2>&1 |
    tee "$out/train.txt" || exit 1
tar czf "$out/model.tgz" -C "$work" model model-state.pt || exit 1
echo "== trained and saved: $(( $(date +%s) - start )) s"
python3 "$here/train.py" plot --log "$out/train-log.csv" --png "$out/loss.png" ||
    echo "run-gpu.sh: no loss plot"
[ "${EVAL_S:-90}" = 0 ] && exit 0
timeout "${EVAL_S:-90}" tests/eval/run-eval.sh --model "$work/model" --backend cuda \
    --parallel 64 ${EVAL_N:+--limit "$EVAL_N"} --results "$out/cuda-eval.jsonl" 2>&1 | tail -8
echo "== dgemmad (cuda) scored: $(( $(date +%s) - start )) s"
timeout "${EVAL_S:-90}" python3 "$here/train.py" eval --model "$work/model" \
    --problems tests/eval/heldout.jsonl --limit "${HF_N:-100}" --out "$out/hf-eval.jsonl" 2>&1 |
    grep -v "Loading weights" | tail -6
echo "== transformers scored: $(( $(date +%s) - start )) s"
