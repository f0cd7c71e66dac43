#!/usr/bin/env bash
# Description: dgemma-eval's JSON output short of memory.  With
# tests/fault/failmalloc.so preloaded (every allocation counts, libc's
# too), `tokenize` of two lines runs once for each of its allocation calls
# with that call alone failing (DG_FAULT_MALLOC_NTH); `inspect --json` of
# the default model and `generate --json` on it, once for each of their
# last 400 and 300 calls (where their line is built).  Each run must give
# the clean run's output with exit 0 (generate's: the same keys, its
# timings differ), or say "out of memory" (tokenize: in the line's result;
# the others on standard error; exit 1): never exit 0 with other output,
# never a line short of a key.  Skipped in the ASan build: nothing can be
# preloaded over its malloc.
set -u
BUILD=${BUILD:-build}
EVAL=$BUILD/bin/dgemma-eval
SHIM=$BUILD/tests/fault/failmalloc.so
. "${0%/*}/cli-lib.sh" t-eval-nomem

# (an ASan build has the shim too, for t-faults' sake, but cannot take it)
if [ ! -f "$SHIM" ] || ldd "$EVAL" 2>/dev/null | grep -q libasan; then
    echo "skip $cli_name: the shim cannot be preloaded into this build (not built, or ASan's)"
    exit 77
fi
SHIM=$(cd "${SHIM%/*}" && pwd)/${SHIM##*/}
touch "$tmp/trigger"

# faulty NTH OUT ERR CMD...: CMD with allocation call NTH failing (a NTH
# past the last: none fails, the calls counted into $tmp/stats)
faulty() {
    local nth=$1 out=$2 err=$3; shift 3
    LD_PRELOAD=$SHIM DG_FAULT_MALLOC_TRIGGER=$tmp/trigger DG_FAULT_MALLOC_NTH=$nth \
        DG_FAULT_STATS=$tmp/stats "$@" >"$out" 2>"$err"
}

# What a run's output is compared by: its bytes, or (KEYS=1: a line with
# timings in it) the keys it holds, each with its count.
canon() {
    if [ "${KEYS:-0}" = 1 ]; then grep -o '"[a-z_]*":' "$1" | sort | uniq -c; else cat "$1"; fi
}

# sweep NAME FROM_END CMD...: the clean run, then each call (or the last
# FROM_END) failing in turn; stdin from $tmp/NAME.in
sweep() {
    local name=$1 from_end=$2; shift 2
    local calls first k st n_same=0 n_nomem=0
    faulty 1000000000 "$tmp/$name.want" "$tmp/$name.err" "$@" <"$tmp/$name.in"
    st=$?
    calls=$(sed -n 's/.*malloc_calls \([0-9]*\).*/\1/p' "$tmp/stats")
    if [ $st -ne 0 ] || [ -z "$calls" ] || [ "$calls" -lt 10 ]; then
        bad "$name" "the clean run: exit $st, ${calls:-no} calls counted: $(head -c 300 "$tmp/$name.err")"
        return
    fi
    first=0
    [ "$from_end" -gt 0 ] && [ "$calls" -gt "$from_end" ] && first=$((calls - from_end))
    for ((k = first; k < calls; k++)); do
        faulty $k "$tmp/$name.out" "$tmp/$name.err" "$@" <"$tmp/$name.in"
        st=$?
        if [ $st -eq 0 ] && [ "$(canon "$tmp/$name.out")" = "$(canon "$tmp/$name.want")" ]; then
            n_same=$((n_same + 1))
        elif [ $st -eq 1 ] && grep -q "out of memory" "$tmp/$name.out" "$tmp/$name.err"; then
            n_nomem=$((n_nomem + 1))
        else
            bad "$name" "call $k failing: exit $st: $(head -c 300 "$tmp/$name.out") $(head -c 300 "$tmp/$name.err")"
            return
        fi
    done
    echo "# $name: calls $first to $((calls - 1)) of $calls failed in turn: $n_same runs as the clean one, $n_nomem said out of memory"
    if [ $n_nomem -gt 0 ]; then ok "$name"; else bad "$name" "no run said out of memory"; fi
}

printf '%s\n' '{"text": "the cat sat", "add_special_tokens": true}' \
    '{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true}' \
    >"$tmp/tokenize.in"
sweep tokenize 0 "$EVAL" tokenize --tokenizer "$BUILD/model/default/tokenizer.json"

: >"$tmp/inspect.in"
sweep inspect 400 "$EVAL" inspect --json "$BUILD/model/default"

: >"$tmp/generate.in"
KEYS=1 sweep generate 300 "$EVAL" generate --model "$BUILD/model/default" --prompt "Once" \
    --seed 7 --max-tokens 8 --max-denoising-steps 2 --json

[ $fails -eq 0 ]
