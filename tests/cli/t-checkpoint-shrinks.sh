#!/usr/bin/env bash
# Description: a checkpoint written over in place (here: truncated) under
# a running dgemmad on the CPU backend, which reads its weights through
# the file's mapping: the next request's access to the vanished pages
# ends the daemon with exit status 74 and a log line (the logger's usual
# prefix, level E) naming the file and what to do, its socket removed, and
# the client told the connection was lost (exit 3), where it used to die
# of SIGBUS with nothing said.  A daemon on an intact copy of the same
# model is unaffected beside it.  A daemon whose socket path another file
# has taken meanwhile (its own socket renamed away, a client reaching it
# there) leaves that file alone as it exits.
set -u
BUILD=${BUILD:-build}
. "${0%/*}/cli-lib.sh" t-checkpoint-shrinks
need_daemon
pa=0 pb=0 pc=0
trap 'for p in $pa $pb $pc; do [ $p -gt 0 ] && kill $p 2>/dev/null; done; rm -rf "$tmp"' EXIT
cp -r "$M" "$tmp/a"
cp -r "$M" "$tmp/b"
cp -r "$M" "$tmp/c"
# (the CPU backend: the one that reads weights from the mapping as it goes)
"$D" $ROOT_OK -o backend=cpu -o model="$tmp/a" -o socket="$tmp/a.sock" -o log_file="$tmp/a.log" &
pa=$!
"$D" $ROOT_OK -o backend=cpu -o model="$tmp/b" -o socket="$tmp/b.sock" -o log_file="$tmp/b.log" &
pb=$!
if run wait_a 0 "$C" -s "$tmp/a.sock" --wait 30 status && run wait_b 0 "$C" -s "$tmp/b.sock" --wait 30 status &&
   run before 0 "$C" -s "$tmp/a.sock" --seed 1 --max-tokens 8 "hello"
then ok serves_before; else bad serves_before "$(cat "$tmp/a.log")"; fi

truncate -s 4096 "$tmp/a/model.safetensors"
run after 3 "$C" -s "$tmp/a.sock" --seed 1 --max-tokens 8 "hello"
st_client=$?
wait $pa
st=$?
pa=0
if [ $st_client -eq 0 ] && [ $st -eq 74 ] &&
   grep -qE "^[0-9]+:. [0-9]{2} [A-Z][a-z]{2} [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} E fatal: $tmp/a/model.safetensors shrank under the running daemon" "$tmp/a.log" &&
   grep -qF "Restart dgemmad to load it again" "$tmp/a.log" && [ ! -e "$tmp/a.sock" ]
then ok exits_74_and_says_why
else bad exits_74_and_says_why "daemon exit $st; $(tail -c 600 "$tmp/a.log")"; fi

if run other 0 "$C" -s "$tmp/b.sock" --seed 1 --max-tokens 8 "hello" && kill -0 $pb 2>/dev/null
then ok other_daemon_unaffected; else bad other_daemon_unaffected "$(tail -c 400 "$tmp/b.log")"; fi
kill $pb 2>/dev/null
wait $pb 2>/dev/null
pb=0

"$D" $ROOT_OK -o backend=cpu -o model="$tmp/c" -o socket="$tmp/c.sock" -o log_file="$tmp/c.log" &
pc=$!
if run wait_c 0 "$C" -s "$tmp/c.sock" --wait 30 status; then
    # (a connect by path reaches the socket under its new name)
    mv "$tmp/c.sock" "$tmp/c-own.sock"
    echo "another's" >"$tmp/c.sock"
    truncate -s 4096 "$tmp/c/model.safetensors"
    run after_c 3 "$C" -s "$tmp/c-own.sock" --seed 1 --max-tokens 8 "hello"
    wait $pc
    st=$?
    pc=0
    if [ $st -eq 74 ] && [ "$(cat "$tmp/c.sock")" = "another's" ]
    then ok path_taken_left_alone
    else bad path_taken_left_alone "daemon exit $st; $(ls -l "$tmp"); $(tail -c 400 "$tmp/c.log")"; fi
else
    bad path_taken_left_alone "the daemon did not start: $(tail -c 400 "$tmp/c.log")"
fi
exit $((fails > 0))
