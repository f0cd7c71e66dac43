#!/usr/bin/env bash
# Description: dgemma-eval generate as a user drives it, on the default
# model: text streamed with a summary, --json with ids, statistics and the
# settings used; the same seed gives the same ids from flags or --settings;
# --max-tokens, --stop-id, --messages and --prompt-ids, --no-parse-special;
# --tp 2 and 4 give the same ids as one rank; bad settings, unknown
# options, a flag's value not of its form and a missing model fail with a
# message and exit 1 or 2.
set -u
BUILD=${BUILD:-build}
EVAL=$BUILD/bin/dgemma-eval
MODEL=$BUILD/model/default
. "${0%/*}/cli-lib.sh" t-eval-generate
ids_of() { grep -o '"ids":\[[^]]*\]' "$1"; }
fast=(--max-denoising-steps 4)

"$EVAL" generate --model "$MODEL" --prompt "Once upon a time" --seed 7 --max-tokens 40 \
    "${fast[@]}" >"$tmp/text.out" 2>"$tmp/text.err"
st=$?
if [ $st -eq 0 ] && [ -s "$tmp/text.out" ] &&
   grep -q '^dgemma-eval: generate: finish \(length\|stop\).* in [0-9]* canvas\(es\)\?, .*seed 7$' "$tmp/text.err"
then ok text; else bad text "exit $st: $(cat "$tmp/text.err")"; fi

"$EVAL" generate --model "$MODEL" --prompt "Once upon a time" --seed 7 --max-tokens 40 \
    "${fast[@]}" --json >"$tmp/a.json" 2>"$tmp/a.err"
st=$?
"$EVAL" generate --model "$MODEL" --prompt "Once upon a time" --json \
    --settings '{"seed": 7, "max_tokens": 40, "max_denoising_steps": 4}' >"$tmp/b.json" 2>&1
if [ $st -eq 0 ] && [ "$(wc -l <"$tmp/a.json")" -eq 1 ] &&
   grep -q '"finish_reason":"\(length\|stop\)"' "$tmp/a.json" &&
   grep -q '"prompt_tokens":[1-9]' "$tmp/a.json" && grep -q '"canvases":\[{"index":0,' "$tmp/a.json" &&
   grep -q '"settings":{.*"seed":7' "$tmp/a.json" && grep -q '"text":"' "$tmp/a.json" &&
   [ -n "$(ids_of "$tmp/a.json")" ] && [ "$(ids_of "$tmp/a.json")" = "$(ids_of "$tmp/b.json")" ]
then ok json_and_seed; else bad json_and_seed "exit $st: $(cat "$tmp/a.json" "$tmp/a.err" "$tmp/b.json")"; fi

# max_tokens not a multiple of the canvas (32): never more tokens than asked
"$EVAL" generate --model "$MODEL" --prompt "x" --seed 3 --max-tokens 37 "${fast[@]}" --json \
    --settings '{"stop_token_ids": []}' >"$tmp/m.json" 2>&1
n=$(ids_of "$tmp/m.json" | tr -cd ',' | wc -c)
if { grep -q '"completion_tokens":37' "$tmp/m.json" && [ "$n" -eq 36 ] &&
     grep -q '"canvas_count":2' "$tmp/m.json"; } ||
   { grep -q '"finish_reason":"stop"' "$tmp/m.json" && [ "$n" -lt 36 ]; }
then ok max_tokens; else bad max_tokens "$(cat "$tmp/m.json")"; fi

# a stop id: the output ends right before its first occurrence
third=$(ids_of "$tmp/a.json" | sed 's/.*\[//; s/\]//' | cut -d, -f3)
first_two=$(ids_of "$tmp/a.json" | sed 's/.*\[//; s/\]//' | cut -d, -f1-2)
if [ -n "$third" ] && ! echo ",$first_two," | grep -q ",$third,"; then
    "$EVAL" generate --model "$MODEL" --prompt "Once upon a time" --seed 7 --max-tokens 40 \
        "${fast[@]}" --stop-id "$third" --json >"$tmp/s.json" 2>&1
    if grep -q '"finish_reason":"stop"' "$tmp/s.json" && grep -q "\"stop_id\":$third" "$tmp/s.json" &&
       [ "$(ids_of "$tmp/s.json")" = "\"ids\":[$first_two]" ]
    then ok stop_id; else bad stop_id "third id $third: $(cat "$tmp/s.json")"; fi
else
    ok "stop_id # the third id repeats an earlier one; skipped"
fi

"$EVAL" generate --model "$MODEL" --prompt "Once upon a time" --seed 7 --max-tokens 40 \
    "${fast[@]}" --json --tp 2 >"$tmp/tp2.json" 2>&1; t2=$?
"$EVAL" generate --model "$MODEL" --prompt "Once upon a time" --seed 7 --max-tokens 40 \
    "${fast[@]}" --json --tp 4 --experts width >"$tmp/tp4.json" 2>&1; t4=$?
if [ $t2 -eq 0 ] && [ $t4 -eq 0 ] && [ "$(ids_of "$tmp/tp2.json")" = "$(ids_of "$tmp/a.json")" ] &&
   [ "$(ids_of "$tmp/tp4.json")" = "$(ids_of "$tmp/a.json")" ] && grep -q '"tp":4' "$tmp/tp4.json"
then ok tensor_parallel; else bad tensor_parallel "$t2 $t4: $(cat "$tmp/tp2.json" "$tmp/tp4.json")"; fi

printf '[{"role": "user", "content": "Hi"}]' >"$tmp/msgs.json"
echo "2 10 11 12" >"$tmp/prompt.ids"
"$EVAL" generate --model "$MODEL" --messages "$tmp/msgs.json" --seed 1 --max-tokens 8 \
    "${fast[@]}" --json >"$tmp/c.json" 2>&1; a=$?
"$EVAL" generate --model "$MODEL" --prompt-ids "$tmp/prompt.ids" --seed 1 --max-tokens 8 \
    "${fast[@]}" --json >"$tmp/d.json" 2>&1; b=$?
if [ $a -eq 0 ] && [ $b -eq 0 ] && grep -q '"prompt_tokens":4,' "$tmp/d.json" &&
   grep -q '"prompt_tokens":[1-9][0-9],' "$tmp/c.json"
then ok prompt_sources; else bad prompt_sources "$a $b: $(cat "$tmp/c.json" "$tmp/d.json")"; fi

"$EVAL" generate --model "$MODEL" --prompt x --top-p 2 >/dev/null 2>"$tmp/e1"; e1=$?
"$EVAL" generate --model "$MODEL" --prompt x --settings '{"temperature": 0.7}' >/dev/null 2>"$tmp/e2"; e2=$?
"$EVAL" generate --model "$MODEL" --prompt x --settings '{"seed": ' >/dev/null 2>"$tmp/e3"; e3=$?
"$EVAL" generate --model "$MODEL" --prompt x --temperature 1 >/dev/null 2>"$tmp/e4"; e4=$?
"$EVAL" generate --model "$MODEL" --prompt x --prompt-ids "$tmp/prompt.ids" >/dev/null 2>&1; e5=$?
"$EVAL" generate --model "$tmp/nowhere" --prompt x >/dev/null 2>"$tmp/e6"; e6=$?
"$EVAL" generate --model "$MODEL" --prompt x --max-tokens 99999999 >/dev/null 2>"$tmp/e7"; e7=$?
echo "2 600" >"$tmp/bad.ids"
"$EVAL" generate --model "$MODEL" --prompt-ids "$tmp/bad.ids" >/dev/null 2>"$tmp/e8"; e8=$?
if [ $e1 -eq 1 ] && grep -q "top_p: 2 is outside (0, 1]" "$tmp/e1" &&
   [ $e2 -eq 1 ] && grep -q "temperature: not a setting of diffusion sampling" "$tmp/e2" &&
   [ $e3 -eq 1 ] && grep -q "malformed JSON" "$tmp/e3" &&
   [ $e4 -eq 2 ] && grep -q "unknown option '--temperature'" "$tmp/e4" &&
   [ $e5 -eq 2 ] && [ $e6 -eq 1 ] && grep -q "nowhere" "$tmp/e6" &&
   [ $e7 -eq 1 ] && grep -q "max_tokens" "$tmp/e7" &&
   [ $e8 -eq 1 ] && grep -q "600" "$tmp/e8"
then ok errors; else bad errors "$e1 $e2 $e3 $e4 $e5 $e6 $e7 $e8: $(cat "$tmp"/e[1-8])"; fi

# a flag's value not of its form: exit 2, the flag and the value named (an
# infinite --top-p once ended with exit 2 and no message, an out-of-range
# --seed ran clamped to 2^63 - 1)
for v in "--top-p inf|'inf' is not a finite number" "--t-min nan|'nan' is not a finite number" \
         "--seed 99999999999999999999|'99999999999999999999' is out of range" \
         "--max-tokens 12x|'12x' is not an integer"; do
    set -- ${v%%|*}
    "$EVAL" generate --model "$MODEL" --prompt x "$@" >"$tmp/f.out" 2>"$tmp/f.err"; st=$?
    if [ $st -eq 2 ] && [ ! -s "$tmp/f.out" ] &&
       grep -qF -- "dgemma-eval: generate: $1: ${v#*|}" "$tmp/f.err"
    then ok "flag_${1#--}"; else bad "flag_${1#--}" "exit $st: $(cat "$tmp/f.err")"; fi
done

# an unknown option last is named as unknown (it once read "needs a
# value"); a known one last does need a value
"$EVAL" generate --model "$MODEL" --prompt x --bogus >/dev/null 2>"$tmp/u1"; u1=$?
"$EVAL" generate --model "$MODEL" --prompt x --top-k >/dev/null 2>"$tmp/u2"; u2=$?
"$EVAL" generate --model "$MODEL" --prompt >/dev/null 2>"$tmp/u3"; u3=$?
if [ $u1 -eq 2 ] && grep -q "generate: unknown option '--bogus'" "$tmp/u1" &&
   [ $u2 -eq 2 ] && grep -q "generate: --top-k needs a value" "$tmp/u2" &&
   [ $u3 -eq 2 ] && grep -q "generate: --prompt needs a value" "$tmp/u3"
then ok unknown_last; else bad unknown_last "$u1 $u2 $u3: $(cat "$tmp"/u[1-3])"; fi

# --no-parse-special: the prompt's typed markers are plain text; the
# prompt's length is the one `dgemma-eval tokenize` gives for the same
# text (with <bos>) or messages (with the generation prompt)
n_ids() { grep -o '"ids":\[[^]]*\]' | awk -F, '{print NF}'; }
ptok() { grep -o '"prompt_tokens":[0-9]*' "$1" | cut -d: -f2; }
printf '%s\n' '{"text": "a <|turn> b <mask>", "parse_special": false, "add_special_tokens": true}' \
    '{"text": "a <|turn> b <mask>", "add_special_tokens": true}' \
    '{"messages": [{"role": "user", "content": "x <turn|>"}], "parse_special": false, "add_generation_prompt": true}' \
    >"$tmp/ps.jsonl"
"$EVAL" tokenize --tokenizer "$MODEL/tokenizer.json" <"$tmp/ps.jsonl" >"$tmp/ps.out" 2>&1
want_plain=$(sed -n 1p "$tmp/ps.out" | n_ids); want_parsed=$(sed -n 2p "$tmp/ps.out" | n_ids)
want_msgs=$(sed -n 3p "$tmp/ps.out" | n_ids)
printf '[{"role": "user", "content": "x <turn|>"}]' >"$tmp/psm.json"
for v in plain parsed msgs; do
    case $v in
    plain) src=(--prompt "a <|turn> b <mask>" --no-parse-special) ;;
    parsed) src=(--prompt "a <|turn> b <mask>") ;;
    msgs) src=(--messages "$tmp/psm.json" --no-parse-special) ;;
    esac
    "$EVAL" generate --model "$MODEL" "${src[@]}" --seed 1 --max-tokens 8 "${fast[@]}" \
        --json >"$tmp/ps-$v.json" 2>&1 || echo "exit $? ($v)" >>"$tmp/ps-$v.json"
done
"$EVAL" generate --model "$MODEL" --prompt-ids "$tmp/prompt.ids" --no-parse-special \
    >/dev/null 2>"$tmp/ps-ids.err"; pi=$?
if [ -n "$want_plain" ] && [ "$want_plain" -gt "$want_parsed" ] &&
   [ "$(ptok "$tmp/ps-plain.json")" = "$want_plain" ] &&
   [ "$(ptok "$tmp/ps-parsed.json")" = "$want_parsed" ] &&
   [ "$(ptok "$tmp/ps-msgs.json")" = "$want_msgs" ] &&
   [ $pi -eq 2 ] && grep -q -- "--no-parse-special applies to --prompt and --messages" "$tmp/ps-ids.err"
then ok no_parse_special
else bad no_parse_special "want $want_plain/$want_parsed/$want_msgs: $(cat "$tmp"/ps-*.json "$tmp/ps-ids.err")"; fi

[ $fails -eq 0 ]
