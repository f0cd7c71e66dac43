#!/usr/bin/env bash
# Description: dgemma-eval forward and compare from the command line: the
# golden ladder reproduced through the CLI (encoder, decoder with and
# without self-conditioning, a commit), ids from standard input, the
# default model built by make (with its tokenizer), tensor-parallel runs
# (--tp 3, experts along their width) that match the single-rank logits,
# and clear failures for bad inputs (exit 1) and bad usage (exit 2).
set -u
BUILD=${BUILD:-build}
EVAL=$BUILD/bin/dgemma-eval
G=tests/golden/golden-a
. "${0%/*}/cli-lib.sh" t-eval-forward

if run enc 0 "$EVAL" forward --model $G/checkpoint --prompt-ids $G/prompt.ids --out "$tmp/h.npy" &&
   has enc out "hidden states [21, 64]" &&
   run cmp_enc 0 "$EVAL" compare "$tmp/h.npy" $G/encoder_hidden.npy && has cmp_enc out " ok (tol 0.0001)"
then ok golden_encoder; else bad golden_encoder "$(cat "$tmp/cmp_enc.out" 2>/dev/null)"; fi

if run dec1 0 "$EVAL" forward --model $G/checkpoint --prompt-ids $G/prompt.ids \
       --canvas-ids $G/canvas1.ids --out "$tmp/l1.npy" &&
   run cmp1 0 "$EVAL" compare "$tmp/l1.npy" $G/logits1.npy && has cmp1 out "argmax agree 16/16"
then ok golden_decoder_no_sc; else bad golden_decoder_no_sc "$(cat "$tmp/cmp1.out" 2>/dev/null)"; fi

if run dec2 0 "$EVAL" forward --model $G/checkpoint --prompt-ids $G/prompt.ids \
       --canvas-ids $G/canvas2.ids --sc-logits $G/sc2.npy --out "$tmp/l2.npy" &&
   run cmp2 0 "$EVAL" compare "$tmp/l2.npy" $G/logits2.npy
then ok golden_decoder_sc; else bad golden_decoder_sc "$(cat "$tmp/cmp2.out" 2>/dev/null)"; fi

if run dec3 0 "$EVAL" forward --model $G/checkpoint --prompt-ids - --commit-ids $G/commit.ids \
       --canvas-ids $G/canvas3.ids --sc-logits $G/sc3.npy --out "$tmp/l3.npy" <$G/prompt.ids &&
   has dec3 out "after 37 cached tokens" &&
   run cmp3 0 "$EVAL" compare "$tmp/l3.npy" $G/logits3.npy
then ok golden_after_commit_from_stdin; else bad golden_after_commit_from_stdin "$(cat "$tmp/cmp3.out" 2>/dev/null)"; fi

# compare itself must fail on different data
if run cmpbad 1 "$EVAL" compare "$tmp/l1.npy" $G/logits2.npy && has cmpbad out "EXCEEDS"
then ok compare_detects_difference; else bad compare_detects_difference "$(cat "$tmp/cmpbad.out")"; fi

M=$BUILD/model/default
if [ -f $M/tokenizer.json ] && run inspect_default 0 "$EVAL" inspect $M &&
   has inspect_default out "layers        6 (4 sliding, 2 full), hidden 128, vocab 384" &&
   echo "2 5 363 364 6" | run fwd_default 0 "$EVAL" forward --model $M --prompt-ids - --out "$tmp/d.npy"
then ok default_model; else bad default_model "$(cat "$tmp/inspect_default.err" "$tmp/fwd_default.err" 2>/dev/null)"; fi

echo "1 2 999" > "$tmp/bad.ids"
echo "1 x" > "$tmp/nan.ids"
if run badid 1 "$EVAL" forward --model $G/checkpoint --prompt-ids "$tmp/bad.ids" --out "$tmp/x.npy" &&
   has badid err "bad.ids:1:5: id 999 is outside the vocabulary [0, 301)" &&
   run notnum 1 "$EVAL" forward --model $G/checkpoint --prompt-ids "$tmp/nan.ids" --out "$tmp/x.npy" &&
   has notnum err "'x' is not a token id" &&
   run scshape 1 "$EVAL" forward --model $G/checkpoint --prompt-ids $G/prompt.ids \
       --canvas-ids $G/canvas1.ids --sc-logits $G/encoder_hidden.npy --out "$tmp/x.npy" &&
   has scshape err "shape [21, 64], but the canvas needs [16, 301]" &&
   run nomodel 1 "$EVAL" forward --model "$tmp/none" --prompt-ids $G/prompt.ids --out "$tmp/x.npy" &&
   has nomodel err "config.json: no such file" && [ ! -e "$tmp/x.npy" ]
then ok bad_inputs_exit_1; else bad bad_inputs_exit_1 "see above"; fi

if run u1 2 "$EVAL" forward --model $G/checkpoint --out "$tmp/x.npy" &&
   run u2 2 "$EVAL" forward --model $G/checkpoint --prompt-ids $G/prompt.ids --mode decoder --out "$tmp/x.npy" &&
   has u2 err "decoder mode needs --canvas-ids" &&
   run u3 2 "$EVAL" forward --model $G/checkpoint --prompt-ids $G/prompt.ids --mode both --out "$tmp/x.npy" &&
   run u4 2 "$EVAL" forward --model $G/checkpoint --prompt-ids $G/prompt.ids --sc-logits $G/sc2.npy --out "$tmp/x.npy" &&
   run u5 2 "$EVAL" compare "$tmp/l1.npy" &&
   run u6 2 "$EVAL" compare "$tmp/l1.npy" "$tmp/l2.npy" --tol -1
then ok usage_errors_exit_2; else bad usage_errors_exit_2 "see above"; fi

# tensor parallel: 3 ranks (V = 301 is not a multiple of 3), after a commit, with SC
if run tp1 0 "$EVAL" forward --model $G/checkpoint --prompt-ids $G/prompt.ids \
       --commit-ids $G/commit.ids --canvas-ids $G/canvas3.ids --sc-logits $G/sc3.npy \
       --out "$tmp/tp1.npy" &&
   run tp3 0 "$EVAL" forward --model $G/checkpoint --prompt-ids $G/prompt.ids \
       --commit-ids $G/commit.ids --canvas-ids $G/canvas3.ids --sc-logits $G/sc3.npy \
       --tp 3 --experts width --out "$tmp/tp3.npy" && has tp3 out "(tensor parallel)" &&
   run cmp_tp 0 "$EVAL" compare "$tmp/tp3.npy" "$tmp/tp1.npy" --tol 1e-6 &&
   run tp_bad 2 "$EVAL" forward --model $G/checkpoint --prompt-ids $G/prompt.ids --tp 0 \
       --out "$tmp/x.npy" &&
   run tp_many 1 "$EVAL" forward --model $G/checkpoint --prompt-ids $G/prompt.ids --tp 5 \
       --out "$tmp/x.npy" && has tp_many err "5 ranks for 4 query heads"
then ok tensor_parallel; else bad tensor_parallel "$(cat "$tmp/cmp_tp.out" "$tmp/tp_many.err" 2>/dev/null)"; fi

[ $fails -eq 0 ]
