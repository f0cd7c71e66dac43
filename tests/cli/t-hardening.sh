#!/usr/bin/env bash
# Description: the plain build is hardened (Makefile, "flags"): dgemmad,
# dgemma-client and dgemma-eval are linked with full RELRO (a GNU_RELRO
# segment and BIND_NOW), and the project's own objects in lib/, daemon/
# and client/ were compiled with stack canaries: each directory's objects
# call __stack_chk_fail.  The objects are read, not the binaries, since
# the libraries linked in statically bring such calls of their own.
# A sanitizer build, which is not hardened this way, is skipped.
set -u
BUILD=${BUILD:-build}
. "${0%/*}/cli-lib.sh" t-hardening
skip_sanitizer_build "a sanitizer build is not hardened this way"
for t in readelf nm; do
    command -v $t >/dev/null 2>&1 || { echo "skip t-hardening: $t (binutils) missing"; exit 77; }
done
for b in dgemmad dgemma-client dgemma-eval; do
    f=$BUILD/bin/$b
    if [ -x "$f" ] && readelf -lW "$f" | grep -q GNU_RELRO && readelf -dW "$f" | grep -q 'BIND_NOW\|FLAGS_1.*NOW'
    then ok "relro_$b"; else bad "relro_$b" "$f: no GNU_RELRO segment or no BIND_NOW"; fi
done
for d in lib daemon client; do
    objs=("$BUILD/$d"/*.o)
    if [ ! -e "${objs[0]}" ]; then
        bad "compiled_$d" "no objects in $BUILD/$d"
        continue
    fi
    nm -u "${objs[@]}" 2>/dev/null | awk '{print $NF}' >"$tmp/$d.syms"
    canary=$(grep -cx '__stack_chk_fail' "$tmp/$d.syms")
    if [ "$canary" -gt 0 ]
    then ok "compiled_$d"
    else bad "compiled_$d" "no object calls __stack_chk_fail"; fi
done
[ $fails -eq 0 ]
