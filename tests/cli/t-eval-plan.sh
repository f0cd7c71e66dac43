#!/usr/bin/env bash
# Description: dgemma-eval plan: the 26B-A4B split over 1, 2, 4 and 8 ranks
# (per-rank totals shrink with T; T = 1 carries no collectives; a step's
# collectives are 2 per layer + 1 all-reduces and 1 all-gather), the dense
# MLP's width split in units of 32 as the CUDA backend splits it (the
# largest rank's MiB from its columns, worked out here), the same
# from a checkpoint directory, an impossible degree reported in its row,
# and usage errors (exit 2), an unknown option named as unknown.
set -u
BUILD=${BUILD:-build}
EVAL=$BUILD/bin/dgemma-eval
. "${0%/*}/cli-lib.sh" t-eval-plan

"$EVAL" plan --preset 26b >"$tmp/p.out" 2>&1; st=$?
total() { awk -v t="$1" '$1 == t && NF == 9 { print $7; exit }' "$tmp/p.out"; }
ar() { awk -v t="$1" '$1 == t && NF == 7 { print $2; exit }' "$tmp/p.out"; }
if [ $st -eq 0 ] && [ -n "$(total 1)" ] &&
   awk -v a="$(total 1)" -v b="$(total 2)" -v c="$(total 4)" -v d="$(total 8)" \
       'BEGIN { exit !(a > b && b > c && c > d && b < 0.51 * a) }' &&
   [ "$(ar 1)" = 0 ] && [ "$(ar 2)" = 61 ] && [ "$(ar 8)" = 61 ]
then ok preset_26b; else bad preset_26b "exit $st: $(cat "$tmp/p.out")"; fi

# the largest rank's dense MLP: 3 w H layers 2 bytes, w its columns of
# 2,112: ceil(2112 / T) element by element, 32 ceil(66 / T) in units of 32
mlp() { awk -v t="$1" '$1 == t && NF == 9 { print $4; exit }' "$2"; }
want() { awk -v w="$1" 'BEGIN { printf "%.1f", 3 * w * 2816 * 30 * 2 / 1048576 }'; }
"$EVAL" plan --preset 26b --width-align 32 >"$tmp/a.out" 2>&1; st=$?
if [ $st -eq 0 ] && grep -q "in units of 32 column" "$tmp/a.out" &&
   [ "$(mlp 2 "$tmp/a.out")" = "$(want 1056)" ] && [ "$(mlp 2 "$tmp/p.out")" = "$(want 1056)" ] &&
   [ "$(mlp 4 "$tmp/a.out")" = "$(want 544)" ] && [ "$(mlp 4 "$tmp/p.out")" = "$(want 528)" ] &&
   [ "$(mlp 8 "$tmp/a.out")" = "$(want 288)" ] && [ "$(mlp 8 "$tmp/p.out")" = "$(want 264)" ]
then ok width_align; else bad width_align "exit $st: $(cat "$tmp/a.out")"; fi

"$EVAL" plan --model "$BUILD/model/default" --tp 2 --tp 3 --experts width >"$tmp/d.out" 2>&1; st=$?
if [ $st -eq 0 ] && grep -q "^2 " "$tmp/d.out" && grep -q "^3 .*3 ranks for 4 query heads\|^3 " "$tmp/d.out" &&
   grep -q "along their width" "$tmp/d.out"
then ok model_dir; else bad model_dir "exit $st: $(cat "$tmp/d.out")"; fi

"$EVAL" plan --preset 26b --tp 32 >"$tmp/big.out" 2>&1; st=$?
if [ $st -eq 0 ] && grep -q "32 ranks for 16 query heads" "$tmp/big.out"
then ok impossible_degree; else bad impossible_degree "$(cat "$tmp/big.out")"; fi

"$EVAL" plan >/dev/null 2>&1; a=$?
"$EVAL" plan --preset 26b --tp 0 >/dev/null 2>&1; b=$?
"$EVAL" plan --preset nosuch >/dev/null 2>&1; c=$?
"$EVAL" plan --preset 26b --act-bytes 3 >/dev/null 2>&1; d=$?
"$EVAL" plan --preset 26b --width-align 0 >/dev/null 2>&1; e=$?
"$EVAL" plan --preset 26b --width-align 4097 >/dev/null 2>&1; f=$?
if [ $a -eq 2 ] && [ $b -eq 2 ] && [ $c -eq 2 ] && [ $d -eq 2 ] && [ $e -eq 2 ] && [ $f -eq 2 ]
then ok usage_errors; else bad usage_errors "$a $b $c $d $e $f"; fi

# an unknown option is named as unknown, last or not (it once read "needs
# a value", or took the next word for a number); a known one last needs a
# value; a bad byte count names its values
"$EVAL" plan --preset 26b --bogus >/dev/null 2>"$tmp/u1"; u1=$?
"$EVAL" plan --bogus x --preset 26b >/dev/null 2>"$tmp/u2"; u2=$?
"$EVAL" plan --preset 26b --tp >/dev/null 2>"$tmp/u3"; u3=$?
"$EVAL" plan --preset 26b --weight-bytes 3 >/dev/null 2>"$tmp/u4"; u4=$?
if [ $u1 -eq 2 ] && grep -q "plan: unknown option '--bogus'" "$tmp/u1" &&
   [ $u2 -eq 2 ] && grep -q "plan: unknown option '--bogus'" "$tmp/u2" &&
   [ $u3 -eq 2 ] && grep -q "plan: --tp needs a value" "$tmp/u3" &&
   [ $u4 -eq 2 ] && grep -q "plan: --weight-bytes must be 1, 2 or 4, not '3'" "$tmp/u4"
then ok unknown_options; else bad unknown_options "$u1 $u2 $u3 $u4: $(cat "$tmp"/u[1-4])"; fi

[ $fails -eq 0 ]
