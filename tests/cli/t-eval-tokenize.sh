#!/usr/bin/env bash
# Description: dgemma-eval tokenize as a user drives it: JSON lines of text
# and chat messages in, ids and decodes out, on the default model's
# tokenizer; malformed JSON, invalid UTF-8, bad fields and unknown roles get
# an error line naming the line and processing continues; "parse_special":
# false keeps typed markers as text; exit status 1
# when any line failed, 2 for bad usage.
set -u
BUILD=${BUILD:-build}
EVAL=$BUILD/bin/dgemma-eval
TOK=$BUILD/model/default/tokenizer.json
. "${0%/*}/cli-lib.sh" t-eval-tokenize

printf '%s\n' '{"text": "the cat", "add_special_tokens": true}' \
    '{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true}' \
    >"$tmp/good.jsonl"
"$EVAL" tokenize --tokenizer "$TOK" <"$tmp/good.jsonl" >"$tmp/good.out" 2>"$tmp/good.err"
st=$?
if [ $st -eq 0 ] && [ "$(wc -l <"$tmp/good.out")" -eq 2 ] &&
   grep -q '^{"ids":\[2,' "$tmp/good.out" && grep -q '"decoded":"<bos>the cat"' "$tmp/good.out" &&
   grep -qF '"text":"<bos><|turn>user\nhi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"' "$tmp/good.out"
then ok text_and_chat; else bad text_and_chat "exit $st: $(cat "$tmp/good.out" "$tmp/good.err")"; fi

{
    echo '{"text": "before"}'
    echo '{"text": "unterminated'
    printf '{"text": "bad \xff byte"}\n'
    echo '{"text": 5}'
    echo '{"text": "a", "messages": []}'
    echo '[1, 2]'
    echo '{"messages": [{"role": "tool", "content": "x"}]}'
    echo '{"messages": [{"role": "user", "content": [{"type": "image"}]}]}'
    echo '{"text": "after", "add_special_tokens": "yes"}'
    echo '{"text": "after"}'
} >"$tmp/mixed.jsonl"
"$EVAL" tokenize --tokenizer "$TOK" <"$tmp/mixed.jsonl" >"$tmp/mixed.out" 2>"$tmp/mixed.err"
st=$?
n_err=$(grep -c '"error"' "$tmp/mixed.out")
if [ $st -eq 1 ] && [ "$(wc -l <"$tmp/mixed.out")" -eq 10 ] && [ "$n_err" -eq 8 ] &&
   grep -q '"line":2,"error":"malformed JSON at column 23: unterminated string"' "$tmp/mixed.out" &&
   grep -q '"line":3,"error":"malformed JSON at column 15: invalid UTF-8' "$tmp/mixed.out" &&
   grep -q '"line":7,"error":"chat: message 0 has role' "$tmp/mixed.out" &&
   grep -q '"line":8,"error":"messages\[0\].content\[0\]: not' "$tmp/mixed.out" &&
   grep -q '"line":9,"error":"add_special_tokens must be a boolean"' "$tmp/mixed.out" &&
   [ "$(tail -n 1 "$tmp/mixed.out" | grep -c '"ids"')" -eq 1 ]
then ok errors_continue; else bad errors_continue "exit $st, $n_err errors: $(cat "$tmp/mixed.out")"; fi

# parse_special false: typed markers are text (the round trip keeps them,
# and no <|turn> (5), <turn|> (6) or <mask> (4) id comes from them); the
# chat format's own markers stay tokens
printf '%s\n' '{"text": "a <|turn> b <mask>", "parse_special": false}' \
    '{"messages": [{"role": "user", "content": "x <turn|>"}], "parse_special": false}' \
    '{"text": "a <|turn> b <mask>"}' '{"text": "a", "parse_special": 1}' >"$tmp/plain.jsonl"
"$EVAL" tokenize --tokenizer "$TOK" <"$tmp/plain.jsonl" >"$tmp/plain.out" 2>&1
st=$?
l1=$(sed -n 1p "$tmp/plain.out"); l2=$(sed -n 2p "$tmp/plain.out"); l3=$(sed -n 3p "$tmp/plain.out")
if [ $st -eq 1 ] && ! echo "$l1" | grep -qE '[[,](4|5)[],]' &&
   echo "$l1" | grep -qF '"decoded_skip_special":"a <|turn> b <mask>"' &&
   echo "$l2" | grep -qE '^\{"text":"<bos><\|turn>user\\nx <turn\|><turn\|>' &&
   [ "$(echo "$l2" | grep -o '"ids":\[[^]]*\]' | grep -oE '[[,]6[],]' | wc -l)" -eq 1 ] &&
   echo "$l3" | grep -qE '[[,]5[],]' && echo "$l3" | grep -qE '[[,]4[]]' &&
   grep -q '"line":4,"error":"parse_special must be a boolean"' "$tmp/plain.out"
then ok parse_special; else bad parse_special "exit $st: $(cat "$tmp/plain.out")"; fi

"$EVAL" tokenize </dev/null >/dev/null 2>&1; a=$?
"$EVAL" tokenize --tokenizer "$tmp/none.json" </dev/null >/dev/null 2>"$tmp/none.err"; b=$?
if [ $a -eq 2 ] && [ $b -eq 1 ] && grep -q "none.json: no such file" "$tmp/none.err"
then ok exit_codes; else bad exit_codes "usage $a, missing file $b"; fi

[ $fails -eq 0 ]
