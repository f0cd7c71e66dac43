#!/usr/bin/env bash
# Description: --version of dgemmad, dgemma-client and dgemma-eval: each
# prints one line, its own name and the version lib/version.h defines (read
# here from the header's text), exits 0 and writes nothing to standard
# error; each one's manual page and --help name the option.
set -u
BUILD=${BUILD:-build}
. "${0%/*}/cli-lib.sh" t-version
want=$(sed -n 's/^#define DGEMMA_VERSION "\([^"]*\)"$/\1/p' lib/version.h)
if [ -z "$want" ]; then
    bad header "no DGEMMA_VERSION in lib/version.h"
    exit 1
fi
for p in dgemmad:8 dgemma-client:1 dgemma-eval:1; do
    b=${p%%:*} sec=${p##*:}
    "$BUILD/bin/$b" --version >"$tmp/$b.out" 2>"$tmp/$b.err"
    st=$?
    if [ $st -eq 0 ] && [ "$(cat "$tmp/$b.out")" = "$b $want" ] && [ ! -s "$tmp/$b.err" ]
    then ok "$b"
    else bad "$b" "exit $st, printed '$(cat "$tmp/$b.out")', want '$b $want'; stderr: $(head -c 200 "$tmp/$b.err")"
    fi
    if grep -q -- '\\-\\-version' "man/$b.$sec" && "$BUILD/bin/$b" --help 2>&1 | grep -q -- '--version'
    then ok "${b}_documented"; else bad "${b}_documented" "man/$b.$sec or --help does not name --version"; fi
done
[ $fails -eq 0 ]
