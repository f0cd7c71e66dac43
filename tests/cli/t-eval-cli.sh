#!/usr/bin/env bash
# Description: dgemma-eval's mkmodel and inspect as a user runs them: exit
# codes (0 ok, 1 a bad checkpoint with the reason on stderr, 2 usage), the
# report's contents, and --json output.
set -u
BUILD=${BUILD:-build}
EVAL=$BUILD/bin/dgemma-eval
. "${0%/*}/cli-lib.sh" t-eval-cli

if run mkmodel 0 "$EVAL" mkmodel --out "$tmp/m" --seed 7 &&
   has mkmodel out "wrote $tmp/m: 74 tensors in 1 file"; then ok mkmodel; else bad mkmodel "output: $(cat "$tmp/mkmodel.out")"; fi

if run inspect 0 "$EVAL" inspect "$tmp/m" &&
   has inspect out "layers        3 (2 sliding, 1 full), hidden 32, vocab 131" &&
   has inspect out "4 experts x 16, top 2 (packed banks)" &&
   has inspect out "bytes         F32 "; then ok inspect; else bad inspect "$(cat "$tmp/inspect.out")"; fi

if run sharded 0 "$EVAL" mkmodel --out "$tmp/s" --shards 4 --dtype bf16 --per-expert --vision &&
   run inspect_sharded 0 "$EVAL" inspect "$tmp/s" &&
   has inspect_sharded out "(index + 4 files)" && has inspect_sharded out "per-expert tensors" &&
   has inspect_sharded out "ignored       2 vision tensors"; then ok inspect_sharded
else bad inspect_sharded "$(cat "$tmp/inspect_sharded.out")"; fi

if run json 0 "$EVAL" inspect "$tmp/m" --json && has json out '"shards":1' &&
   has json out '"tensors":74' && has json out '"bytes_by_dtype":{"F32":'; then ok inspect_json
else bad inspect_json "$(cat "$tmp/json.out")"; fi

# written again into the same folder in the other layout: the earlier
# model's file goes (a single file would be loaded over the new shards)
if run reshard 0 "$EVAL" mkmodel --out "$tmp/m2" --seed 7 &&
   run reshard2 0 "$EVAL" mkmodel --out "$tmp/m2" --seed 8 --shards 3 &&
   [ ! -e "$tmp/m2/model.safetensors" ] && run reshardi 0 "$EVAL" inspect "$tmp/m2" &&
   has reshardi out "(index + 3 files)" && ! has reshardi err "using model.safetensors" &&
   run reshard3 0 "$EVAL" mkmodel --out "$tmp/m2" --seed 9 &&
   [ ! -e "$tmp/m2/model.safetensors.index.json" ] && run reshardj 0 "$EVAL" inspect "$tmp/m2" &&
   has reshardj out "(1 file)"
then ok rewritten_other_layout; else bad rewritten_other_layout "$(ls "$tmp/m2"; cat "$tmp/reshardi.out" "$tmp/reshardi.err")"; fi

rm -f "$tmp/m/generation_config.json"
if run nogen 0 "$EVAL" inspect "$tmp/m" && has nogen out "generation    defaults:"; then ok defaults_without_generation_config
else bad defaults_without_generation_config "$(cat "$tmp/nogen.out")"; fi

rm -f "$tmp/s/model-00002-of-00004.safetensors"
if run broken 1 "$EVAL" inspect "$tmp/s" &&
   has broken err "names shard 'model-00002-of-00004.safetensors'" && has broken err "[missing]" &&
   [ ! -s "$tmp/broken.out" ]; then ok broken_checkpoint_exit_1
else bad broken_checkpoint_exit_1 "stderr: $(cat "$tmp/broken.err")"; fi

if run noargs 2 "$EVAL" && run badcmd 2 "$EVAL" frobnicate && has badcmd err "unknown command 'frobnicate'" &&
   run badflag 2 "$EVAL" inspect "$tmp/m" --bogus && run nodir 2 "$EVAL" inspect &&
   run badseed 2 "$EVAL" mkmodel --out "$tmp/x" --seed -3 && has badseed err "--seed needs" &&
   run badshards 2 "$EVAL" mkmodel --out "$tmp/x" --shards 0 &&
   run badpreset 2 "$EVAL" mkmodel --out "$tmp/x" --preset huge && has badpreset err "unknown model preset" &&
   run noout 2 "$EVAL" mkmodel && run help 0 "$EVAL" --help && has help out "usage: dgemma-eval"; then
    ok usage_errors_exit_2
else bad usage_errors_exit_2 "see above"; fi

[ $fails -eq 0 ]
