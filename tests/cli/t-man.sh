#!/usr/bin/env bash
# Description: the manual pages: each renders with man(1) without a single
# warning; every option the programs' --help texts name appears in its
# page (dgemmad, each dgemma-client command, each dgemma-eval command); every
# configuration key appears in dgemmad.yaml(5) (also checked against the
# option table by t-daemon-config); the protocol's ops, events and error
# codes appear in dgemmad(8).
set -u
BUILD=${BUILD:-build}
BIN=$BUILD/bin
. "${0%/*}/cli-lib.sh" t-man
if ! command -v man >/dev/null 2>&1; then
    echo "skip t-man: man(1) is not installed"
    exit 77
fi

# (man-db writes plain text, without overstrikes, when its output is not a terminal)
render() { LC_ALL=C MANWIDTH=100 man --warnings -l "$1" 2>"$tmp/warn" >"$tmp/$(basename "$1").txt"; }
for p in man/*.[0-9]; do
    render "$p"
    if [ -s "$tmp/warn" ] || [ ! -s "$tmp/$(basename "$p").txt" ]; then
        bad "renders_$(basename "$p")" "$(head -c 400 "$tmp/warn")"
    else
        ok "renders_$(basename "$p")"
    fi
done

# options named by a --help text, all present in the page's text
check_flags() {
    local name=$1 page=$2; shift 2
    local missing=""
    "$@" --help 2>&1 | grep -o -- '--[a-z][a-z-]*' | sort -u >"$tmp/flags"
    [ -s "$tmp/flags" ] || { bad "$name" "no options found in '$* --help'"; return; }
    while read -r f; do
        grep -q -- "$f\b" "$tmp/$page.txt" || missing="$missing $f"
    done <"$tmp/flags"
    if [ -z "$missing" ]; then ok "$name"; else bad "$name" "not in $page:$missing"; fi
}
check_flags flags_dgemmad dgemmad.8 "$BIN/dgemmad"
for c in generate chat batch status cancel stats; do
    check_flags "flags_client_$c" dgemma-client.1 "$BIN/dgemma-client" "$c"
done
for c in inspect mkmodel forward compare tokenize generate plan quantize accuracy; do
    check_flags "flags_eval_$c" dgemma-eval.1 "$BIN/dgemma-eval" "$c"
done

missing=""
for k in $(sed -n 's/^#* *\([a-z_][a-z_]*\):.*/\1/p' etc/dgemmad.yaml | sort -u); do
    grep -q "^ *$k\b" "$tmp/dgemmad.yaml.5.txt" || missing="$missing $k"
done
if [ -z "$missing" ]; then ok config_keys; else bad config_keys "not in dgemmad.yaml(5):$missing"; fi

missing=""
for w in generate cancel status shm_attach shm_attached accepted canvas done error cancelling \
         bad_json bad_request \
         unknown_op bad_version too_large busy not_found shutting_down internal; do
    grep -q "\b$w\b" "$tmp/dgemmad.8.txt" || missing="$missing $w"
done
if [ -z "$missing" ]; then ok protocol_words; else bad protocol_words "not in dgemmad(8):$missing"; fi

[ $fails -eq 0 ]
