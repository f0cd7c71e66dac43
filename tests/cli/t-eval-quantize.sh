#!/usr/bin/env bash
# Description: dgemma-eval quantize, end to end on the CPU backend.  A
# one-layer model of the small preset's shapes in f32 (A) and its bf16
# rounding (B); A quantized with FP8 weights only (C) and W8A8 (D).  The
# decoder's logits of B, C and D against A's (max|d| / max|ref| from
# dgemma-eval compare): FP8 must differ more than bf16 does (the
# quantization happened) and within the bounds derived from the formats:
# an E4M3 step is 16 times a bf16 step (3 mantissa bits against 7), so
# weights alone move the logits at most 16 times as far as bf16 rounding,
# and weights plus per-token activations (two roundings of that size) at
# most 32 times; every argmax but two of 32 kept.  Then: inspect reports
# the quantization, a second quantization is refused, the default model
# quantized generates (at TP 1 and 2), with FP8 weights alone the same
# ids at TP 1 and 2; the trained default model's logits, quantized, stay
# within a stated bound of its bf16 logits on 8 held-out problems.  And
# what it must not do to files: quantize into the model's own folder
# (refused), write through symlinks to the model's files, leave a folder
# half-written when a weight is not finite (refused, naming it), give a row
# of tiny values a scale of 0 (NaN codes), keep another model's tokenizer
# in the output folder.  Usage errors exit 2.
set -u
BUILD=${BUILD:-build}
EVAL=$BUILD/bin/dgemma-eval
. "${0%/*}/cli-lib.sh" t-eval-quantize

# ratio and argmax agreement from a compare's output
ratio() { sed -n 's/.*ratio \([0-9.e+-]*\).*/\1/p' "$tmp/$1.out"; }
agree() { sed -n 's/.*argmax agree \([0-9]*\)\/.*/\1/p' "$tmp/$1.out"; }

echo "2 5 363 364 6 7 8 9 10 11" >"$tmp/p.ids"
seq 20 51 | tr '\n' ' ' >"$tmp/c.ids"
if run mkA 0 "$EVAL" mkmodel --out "$tmp/A" --preset small --layers 1 &&
   run mkB 0 "$EVAL" mkmodel --out "$tmp/B" --preset small --layers 1 --dtype bf16 &&
   run qC 0 "$EVAL" quantize --model "$tmp/A" --out "$tmp/C" --weights-only &&
   run qD 0 "$EVAL" quantize --model "$tmp/A" --out "$tmp/D" &&
   has qD out "of them FP8 E4M3 with per-channel scales; activations per token (W8A8)" &&
   has qC out "activations unquantized (weights only)"
then ok quantize; else bad quantize "see above"; fi

for m in A B C D; do
    run "fwd$m" 0 "$EVAL" forward --model "$tmp/$m" --prompt-ids "$tmp/p.ids" \
        --canvas-ids "$tmp/c.ids" --out "$tmp/$m.npy" || continue
done
for m in B C D; do
    run "cmp$m" 0 "$EVAL" compare "$tmp/$m.npy" "$tmp/A.npy" --tol 1
done
rB=$(ratio cmpB) rC=$(ratio cmpC) rD=$(ratio cmpD)
echo "# logits against f32, max|d| / max|ref|: bf16 $rB, FP8 weights $rC, FP8 W8A8 $rD;" \
     "argmax agree $(agree cmpC)/32 and $(agree cmpD)/32"
if [ -n "$rB" ] && [ -n "$rC" ] && [ -n "$rD" ] &&
   awk -v b="$rB" -v c="$rC" -v d="$rD" 'BEGIN { exit !(b > 0 && c > b && d > b && c <= 16 * b && d <= 32 * b) }' &&
   [ "$(agree cmpC)" -ge 30 ] && [ "$(agree cmpD)" -ge 30 ]
then ok logits_within_format_bounds; else bad logits_within_format_bounds "bf16 $rB, weights $rC, W8A8 $rD"; fi

if run insp 0 "$EVAL" inspect "$tmp/D" &&
   has insp out "quantized     FP8 E4M3 weights with per-channel scales; activations per token at run time (W8A8)" &&
   has insp out "F8_E4M3" &&
   run inspj 0 "$EVAL" inspect "$tmp/C" --json && has inspj out '"quantization":"fp8-weights"'
then ok inspect; else bad inspect "$(cat "$tmp/insp.out")"; fi

if run again 1 "$EVAL" quantize --model "$tmp/D" --out "$tmp/E" && has again err "already quantized"
then ok refuses_twice; else bad refuses_twice "$(cat "$tmp/again.err")"; fi

# The default model quantized generates; with FP8 weights alone the ids do
# not depend on the tensor-parallel split (dequantized weights, the CPU's
# exact split sums); with W8A8 they may (a rank quantizes the activation
# columns it holds), so there only the run is checked.
M=$BUILD/model/default
ids() { sed 's/.*"ids":\(\[[^]]*\]\).*/\1/' "$tmp/$1.out"; }
if [ -f "$M/config.json" ] &&
   run qdef 0 "$EVAL" quantize --model "$M" --out "$tmp/Q" &&
   run qdefw 0 "$EVAL" quantize --model "$M" --out "$tmp/W" --weights-only &&
   run gen1 0 "$EVAL" generate --model "$tmp/Q" --prompt "hello" --seed 3 --max-tokens 64 --max-denoising-steps 8 --json &&
   run gen2 0 "$EVAL" generate --model "$tmp/Q" --prompt "hello" --seed 3 --max-tokens 64 --max-denoising-steps 8 --json --tp 2 &&
   has gen1 out '"finish_reason":' && has gen2 out '"finish_reason":' &&
   run genw1 0 "$EVAL" generate --model "$tmp/W" --prompt "hello" --seed 3 --max-tokens 64 --max-denoising-steps 8 --json &&
   run genw2 0 "$EVAL" generate --model "$tmp/W" --prompt "hello" --seed 3 --max-tokens 64 --max-denoising-steps 8 --json --tp 2 &&
   [ "$(ids genw1)" = "$(ids genw2)" ]
then ok default_model_generates; else bad default_model_generates "$(head -c 300 "$tmp/genw1.out" "$tmp/genw2.out" "$tmp/gen1.err" "$tmp/gen2.err")"; fi

# The trained default model quantized, end to end, against itself in bf16:
# the decoder's logits on the first 8 held-out problems, over the answer's
# canvas and over a random one (the first denoising step's input).  One
# W8A8 product is 2-3.4% from the unquantized one (t-fp8, K 130-2816); a
# trained stack carries that error to its logits without amplifying it
# (unlike the random models above), so the bound is: the median over
# problems of max|d| / max|ref| at most 0.05, none above 0.25, and the
# argmax kept on at least 97% of the canvas rows.  (Measured, 40 problems,
# run 54's checkpoint: median 0.023-0.041, largest 0.24 (a random canvas;
# weights alone 0.23), argmax 99.8-100%.  Run 50's: median 0.024-0.028,
# largest 0.12.)
# (Under the sanitizers, BUILD=build-asan, this case is left out: it runs
# the forward passes the cases above run, 48 more times.)
if [ "${BUILD##*/}" = build-asan ]; then
    echo "skip t-eval-quantize/trained_model_end_to_end: not under the sanitizers"
elif [ -f "$M/config.json" ] && [ -d "$tmp/Q" ] && [ -d "$tmp/W" ] &&
   python3 - "$EVAL" "$M" "$tmp" "${0%/*}/../eval/heldout.jsonl" "${0%/*}/../../tools/task" \
       >"$tmp/e2e.out" 2>&1 <<'EOF'
import json, random, re, statistics, subprocess, sys
ev, model, tmp, heldout, taskdir = sys.argv[1:6]
sys.path.insert(0, taskdir)
import task
rng = random.Random(3)
probs = [json.loads(l) for l in open(heldout)][:8]
stats, bad = {}, []
def fwd(m, out):
    subprocess.run([ev, "forward", "--model", m, "--prompt-ids", tmp + "/e2e-p.ids",
                    "--canvas-ids", tmp + "/e2e-c.ids", "--out", out], check=True,
                   capture_output=True)
for p in probs:
    ans = [task.char_id(c) for c in p["answer"]][:31] + [task.EOS]
    canvases = {"answer": (ans + [task.PAD] * 32)[:32],
                "random": [rng.randrange(task.VOCAB) for _ in range(32)]}
    open(tmp + "/e2e-p.ids", "w").write(" ".join(map(str, task.encode(p["prompt"]))))
    for name, canvas in canvases.items():
        open(tmp + "/e2e-c.ids", "w").write(" ".join(map(str, canvas)))
        fwd(model, tmp + "/e2e-ref.npy")
        for q in ("Q", "W"):
            fwd(tmp + "/" + q, tmp + "/e2e-q.npy")
            out = subprocess.run([ev, "compare", tmp + "/e2e-q.npy", tmp + "/e2e-ref.npy",
                                  "--tol", "1"], capture_output=True, text=True).stdout
            r = float(re.search(r"ratio ([0-9.e+-]+)", out).group(1))
            a, n = map(int, re.search(r"argmax agree (\d+)/(\d+)", out).groups())
            s = stats.setdefault(q, [[], 0, 0])
            s[0].append(r)
            s[1] += a
            s[2] += n
for q, label in (("Q", "W8A8"), ("W", "weights only")):
    rs, a, n = stats[q]
    med, top = statistics.median(rs), max(rs)
    print("%s: ratio median %.4f, largest %.4f; argmax %d/%d" % (label, med, top, a, n))
    if med > 0.05 or top > 0.25 or a < 0.97 * n:
        bad.append(label)
sys.exit(1 if bad else 0)
EOF
then sed 's/^/# /' "$tmp/e2e.out"; ok trained_model_end_to_end
else bad trained_model_end_to_end "$(cat "$tmp/e2e.out")"; fi

# ---- what quantize must not do to the files it reads and writes ----------------
# poke FILE TENSOR ROW VALUE...: set the first values of an F32 tensor's row
poke() {
    python3 - "$@" <<'EOF2'
import json, struct, sys
path, name, row, vals = sys.argv[1], sys.argv[2], int(sys.argv[3]), [float(v) for v in sys.argv[4:]]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    t = json.loads(f.read(n))[name]
    assert t["dtype"] == "F32"
    f.seek(8 + n + t["data_offsets"][0] + 4 * row * t["shape"][1])
    f.write(struct.pack("<%df" % len(vals), *vals))
EOF2
}
Q0=model.decoder.layers.0.self_attn.q_proj.weight
cp -r "$tmp/A" "$tmp/A2"
ln -s A2 "$tmp/A2link"
if run self 1 "$EVAL" quantize --model "$tmp/A2" --out "$tmp/A2" && has self err "is the model's own" &&
   run selflink 1 "$EVAL" quantize --model "$tmp/A2" --out "$tmp/A2link" &&
   diff -r "$tmp/A" "$tmp/A2" >/dev/null
then ok refuses_its_own_folder; else bad refuses_its_own_folder "$(cat "$tmp/self.err"; diff -r "$tmp/A" "$tmp/A2" | head -5)"; fi

# an output folder whose files are symlinks to the model's: replaced, the
# model's files untouched
mkdir "$tmp/L"
for f in "$tmp/A2"/*; do ln -s "$f" "$tmp/L/${f##*/}"; done
if run links 0 "$EVAL" quantize --model "$tmp/A2" --out "$tmp/L" &&
   diff -r "$tmp/A" "$tmp/A2" >/dev/null && [ ! -L "$tmp/L/model.safetensors" ] &&
   [ ! -L "$tmp/L/config.json" ] && run linksi 0 "$EVAL" inspect "$tmp/L" &&
   has linksi out "F8_E4M3"
then ok symlinks_replaced; else bad symlinks_replaced "$(cat "$tmp/links.err"; diff -r "$tmp/A" "$tmp/A2" | head -5)"; fi

# a weight that is not finite: refused with its tensor and row, and a folder
# that held another model (B, bf16) left as it was, nothing half-written
cp -r "$tmp/A" "$tmp/Inf"
poke "$tmp/Inf/model.safetensors" $Q0 3 inf
cp -r "$tmp/B" "$tmp/Old"
if run inf 1 "$EVAL" quantize --model "$tmp/Inf" --out "$tmp/Old" &&
   has inf err "'$Q0' row 3 holds a value that is not finite" &&
   diff -r "$tmp/B" "$tmp/Old" >/dev/null
then ok not_finite_refused; else bad not_finite_refused "$(cat "$tmp/inf.err"; diff -r "$tmp/B" "$tmp/Old" | head -5)"; fi

# a row of values too small for max/448 in fp32: a scale all the same (at
# least FLT_MIN), no NaN code; the model it makes loads and runs
cp -r "$tmp/A" "$tmp/Tiny"
poke "$tmp/Tiny/model.safetensors" $Q0 2 1e-43 0 0 0
if run tiny 0 "$EVAL" quantize --model "$tmp/Tiny" --out "$tmp/TinyQ" &&
   python3 - "$tmp/TinyQ/model.safetensors" $Q0 >"$tmp/tinyq.out" 2>&1 <<'EOF2' &&
import json, struct, sys
path, name = sys.argv[1:3]
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    data = f.read()
t, s = h[name], h[name + "_scale"]
cols = t["shape"][1]
scale = struct.unpack("<f", data[s["data_offsets"][0] + 4 * 2:][:4])[0]
codes = data[t["data_offsets"][0] + 2 * cols:][:cols]
assert scale >= 2.0 ** -126, scale
assert not any(c in (0x7F, 0xFF) for c in codes), list(codes)
EOF2
   run tinyf 0 "$EVAL" forward --model "$tmp/TinyQ" --prompt-ids "$tmp/p.ids" \
       --canvas-ids "$tmp/c.ids" --out "$tmp/tiny.npy" &&
   run tinyc 0 "$EVAL" compare "$tmp/tiny.npy" "$tmp/D.npy" --tol 1
then ok tiny_row; else bad tiny_row "$(cat "$tmp/tiny.err" "$tmp/tinyq.out" "$tmp/tinyc.out" | head -8)"; fi

# quantized into a folder that held a model with a tokenizer, from one
# without: the old tokenizer goes (it is another model's)
cp -r "$BUILD/model/random" "$tmp/Stale"
cp -r "$tmp/A" "$tmp/NoTok"
rm -f "$tmp/NoTok/tokenizer.json" "$tmp/NoTok/tokenizer_config.json"
if [ -f "$tmp/Stale/tokenizer.json" ] &&
   run stale 0 "$EVAL" quantize --model "$tmp/NoTok" --out "$tmp/Stale" &&
   [ ! -e "$tmp/Stale/tokenizer.json" ] && [ ! -e "$tmp/Stale/tokenizer_config.json" ] &&
   cmp -s "$tmp/NoTok/generation_config.json" "$tmp/Stale/generation_config.json"
then ok stale_files_removed; else bad stale_files_removed "$(ls "$tmp/Stale" "$tmp/NoTok")"; fi

if run usage1 2 "$EVAL" quantize --model "$tmp/A" && run usage2 2 "$EVAL" quantize --out "$tmp/F" --bogus &&
   run help 0 "$EVAL" quantize --help && has help out "usage: dgemma-eval quantize"
then ok usage; else bad usage "see above"; fi

if run missing 1 "$EVAL" quantize --model "$tmp/nonexistent" --out "$tmp/G"
then ok missing_model; else bad missing_model "$(cat "$tmp/missing.err")"; fi

exit $((fails > 0))
