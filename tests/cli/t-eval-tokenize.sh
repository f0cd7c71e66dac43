#!/usr/bin/env bash
# Description: dgemma-eval tokenize as a user drives it: JSON lines of text
# and chat messages in, ids and decodes out, on the default model's
# tokenizer; malformed JSON, invalid UTF-8, bad fields and unknown roles get
# an error line naming the line and processing continues; exit status 1
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
   grep -q '"line":2,"error":"malformed JSON' "$tmp/mixed.out" &&
   grep -q '"line":3,"error":"malformed JSON (or invalid UTF-8)' "$tmp/mixed.out" &&
   grep -q '"line":7,"error":"chat: message 0 has role' "$tmp/mixed.out" &&
   grep -q '"line":8,"error":"messages\[0\].content\[0\]: not' "$tmp/mixed.out" &&
   grep -q '"line":9,"error":"add_special_tokens must be a boolean"' "$tmp/mixed.out" &&
   [ "$(tail -n 1 "$tmp/mixed.out" | grep -c '"ids"')" -eq 1 ]
then ok errors_continue; else bad errors_continue "exit $st, $n_err errors: $(cat "$tmp/mixed.out")"; fi

"$EVAL" tokenize </dev/null >/dev/null 2>&1; a=$?
"$EVAL" tokenize --tokenizer "$tmp/none.json" </dev/null >/dev/null 2>"$tmp/none.err"; b=$?
if [ $a -eq 2 ] && [ $b -eq 1 ] && grep -q "none.json: no such file" "$tmp/none.err"
then ok exit_codes; else bad exit_codes "usage $a, missing file $b"; fi

[ $fails -eq 0 ]
