#!/usr/bin/env bash
# tools/train/from-scratch.sh - train the default model from scratch on one
# H200 in three calls of under ten minutes each (a device call's limit),
# the recipe of runs 67-69 (docs/notes.md, "From scratch in one device
# session, third try"), which made model/default:
#
#   tools/train/from-scratch.sh OUTDIR 1    6.5 minutes from scratch
#   tools/train/from-scratch.sh OUTDIR 2    7 minutes more (--resume)
#   tools/train/from-scratch.sh OUTDIR 3    5.5 minutes more, then dgemmad
#                                           (cuda) and transformers' generate
#                                           over the 500 held-out problems
#
# One cosine schedule of 19 minutes over the three calls, fp32 (TF32
# products), batch 512 of 32 draws, add and get at double odds
# (tools/train/train.py's defaults).  Calls 2 and 3 continue from
# /tmp/dgemma-train/model-resume.pt, which only the machine that ran the
# call before holds.  Each call's files (log, loss curve, model.tgz) land in
# OUTDIR; call 3 also writes loss-all.png, the three logs joined.  dgemma
# is built beforehand (build/bin, build/model); nothing is compiled here.
# (Run 67 itself ran its 6.5 minutes on a 22-minute schedule and spent 116
# s on a torch.compile check that refused; the schedule was 19 minutes from
# call 2 on.)
set -u -o pipefail
out=${1:?usage: tools/train/from-scratch.sh OUTDIR 1|2|3}
phase=${2:?usage: tools/train/from-scratch.sh OUTDIR 1|2|3}
here=${0%/*}
work=/tmp/dgemma-train
resume=()
case $phase in
1) minutes=6.5 eval_s=0 ;;
2) minutes=7 eval_s=0 ;;
3) minutes=5.5 eval_s=${EVAL_S:-100} ;;
*) echo "from-scratch.sh: phase $phase: 1, 2 or 3" >&2; exit 2 ;;
esac
if [ "$phase" != 1 ]; then
    # (run-gpu.sh's training overwrites the resume state as it saves)
    cp "$work/model-resume.pt" "$work/prev-resume.pt" ||
        { echo "from-scratch.sh: no resume state: call $((phase - 1)) ran elsewhere" >&2; exit 1; }
    resume=(--resume "$work/prev-resume.pt")
fi
EVAL_S=$eval_s HF_N=${HF_N:-500} "$here/run-gpu.sh" "$out" --minutes "$minutes" \
    --schedule-minutes 19 --seed 1 --print-every 1000 "${resume[@]}" || exit 1
cp "$out/train-log.csv" "$work/log-phase$phase.csv" || exit 1
if [ "$phase" = 3 ]; then
    python3 "$here/train.py" plot --log "$work/log-phase1.csv,$work/log-phase2.csv,$work/log-phase3.csv" \
        --png "$out/loss-all.png" || echo "from-scratch.sh: no joined plot"
fi
