#!/usr/bin/env bash
# Description: `dgemmad --check-config` says whether the daemon could start
# and creates nothing: a usable configuration exits 0 and leaves no socket
# and no metrics file behind; a metrics file in a directory that does not
# exist, a metrics file that is not SQLite, a socket path where a regular
# file lies and a socket in a directory that does not exist each exit 1
# with what is wrong on standard error (also when the log goes to a file),
# and leave the file in the way as it was; a log file is not created (nor
# when the check fails), a log file in a directory that does not exist
# fails; beside a running daemon on the same socket the check passes with
# a note that the socket is in use.  What the backend would refuse (tp past
# the model's split, GPUs missing, one_gpu past 8 ranks or with --rank)
# fails the check; limits below the
# model's values lower the defaults, with a warning where a configured
# value gives way; a second -c is a usage error.
set -u
BUILD=${BUILD:-build}
. "${0%/*}/cli-lib.sh" t-check-config
need_daemon
pid=0
trap '[ $pid -gt 0 ] && kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
chk() { # NAME WANT OPTIONS...: dgemmad --check-config with the model and OPTIONS
    local name=$1 want=$2; shift 2
    run "$name" "$want" "$D" $ROOT_OK -o model="$M" "$@" --check-config
}

if chk usable 0 -o socket="$tmp/u.sock" -o metrics="$tmp/u.sqlite" &&
   has usable out "are usable" && [ ! -e "$tmp/u.sock" ] && [ ! -e "$tmp/u.sqlite" ]
then ok usable; else bad usable "$(cat "$tmp/usable.out" "$tmp/usable.err")"; fi

if chk logok 0 -o socket="$tmp/l.sock" -o log_file="$tmp/l.log" &&
   has logok out "are usable" && [ ! -e "$tmp/l.log" ] &&
   chk logbad 1 -o socket=/nonexistent-dgemma/l.sock -o log_file="$tmp/l2.log" &&
   [ ! -e "$tmp/l2.log" ] &&
   chk lognodir 1 -o socket="$tmp/l3.sock" -o log_file=/nonexistent-dgemma/d.log &&
   has lognodir err "log_file /nonexistent-dgemma/d.log: cannot create it in /nonexistent-dgemma"
then ok log_file_not_created
else bad log_file_not_created "$(cat "$tmp/logok.out" "$tmp/logbad.err" "$tmp/lognodir.err" 2>/dev/null)"; fi

if chk nodir 1 -o socket="$tmp/n.sock" -o metrics=/nonexistent-dgemma/m.sqlite &&
   has nodir err "the directory /nonexistent-dgemma does not exist"
then ok metrics_missing_directory; else bad metrics_missing_directory "$(cat "$tmp/nodir.err")"; fi

printf 'these bytes are not an SQLite database, however long the line gets\n' >"$tmp/j.sqlite"
cp "$tmp/j.sqlite" "$tmp/j.orig"
if chk junk 1 -o socket="$tmp/j.sock" -o metrics="$tmp/j.sqlite" -o log_file="$tmp/j.log" &&
   has junk err "not an SQLite database" && cmp -s "$tmp/j.sqlite" "$tmp/j.orig"
then ok metrics_not_sqlite; else bad metrics_not_sqlite "$(cat "$tmp/junk.err")"; fi

printf 'mine\n' >"$tmp/f.sock"
if chk file 1 -o socket="$tmp/f.sock" && has file err "exists and is not a socket" &&
   [ "$(cat "$tmp/f.sock")" = mine ]
then ok socket_path_taken; else bad socket_path_taken "$(cat "$tmp/file.err")"; fi

if chk sockdir 1 -o socket=/nonexistent-dgemma/d.sock &&
   has sockdir err "cannot create it in /nonexistent-dgemma"
then ok socket_missing_directory; else bad socket_missing_directory "$(cat "$tmp/sockdir.err")"; fi

# what the backend would refuse at start, found by the check (it said
# usable): more ranks than the model splits into; GPUs the machine lacks
# (where the build has CUDA: a devices entry past any machine's)
if chk tp 1 -o socket="$tmp/t.sock" -o backend=cpu -o tp=64 &&
   has tp err "backend: tensor parallel: 64 ranks for"
then ok tp_too_large; else bad tp_too_large "$(cat "$tmp/tp.out" "$tmp/tp.err")"; fi
if [ -e "$BUILD/libdgemma-cuda.a" ]; then
    if chk gpus 1 -o socket="$tmp/g.sock" -o backend=cuda -o "devices=[63]" &&
       has gpus err "backend: cuda: devices names GPU 63"
    then ok gpus_missing; else bad gpus_missing "$(cat "$tmp/gpus.out" "$tmp/gpus.err")"; fi
    # one_gpu: not in multi-process mode (its ranks meet through NCCL)
    if chk onegpu_rank 1 -o socket="$tmp/o.sock" -o tp=2 -o one_gpu=true --rank 1 &&
       has onegpu_rank err "multi-process mode joins its ranks through NCCL, one GPU each, not one_gpu"
    then ok one_gpu_not_with_rank; else
        bad one_gpu_not_with_rank "$(cat "$tmp/onegpu_rank.out" "$tmp/onegpu_rank.err")"; fi
fi
# one_gpu takes at most 8 ranks
if chk onegpu_tp 1 -o socket="$tmp/o.sock" -o tp=9 -o one_gpu=true &&
   has onegpu_tp err "one_gpu: tp 9; one GPU takes at most 8 ranks"
then ok one_gpu_tp_limit; else bad one_gpu_tp_limit "$(cat "$tmp/onegpu_tp.out" "$tmp/onegpu_tp.err")"; fi

# limits below the model's own values: the defaults give way, said where
# a configured value does (max_canvas_length below the model's canvas
# stopped the start)
if chk lim 0 -o socket="$tmp/m.sock" -o max_canvas_length=16 -o max_tokens=16 \
       -o default_max_tokens=100 -o max_context=16000000 &&
   has lim out "are usable" && has lim err "default_max_tokens 100 is above max_tokens 16" &&
   has lim err "max_context 16000000: the model holds"
then ok defaults_within_limits; else bad defaults_within_limits "$(cat "$tmp/lim.out" "$tmp/lim.err")"; fi

# one configuration file: a second -c is refused (it dropped the first)
printf 'max_batch: 3\n' >"$tmp/c1.yaml"
printf 'tp: 1\n' >"$tmp/c2.yaml"
if run twice 2 "$D" $ROOT_OK -c "$tmp/c1.yaml" -c "$tmp/c2.yaml" --check-config &&
   has twice err "-c given twice"
then ok config_twice; else bad config_twice "$(cat "$tmp/twice.err")"; fi

"$D" $ROOT_OK -o model="$M" -o socket="$tmp/live.sock" -o log_file="$tmp/live.log" &
pid=$!
if run wait 0 "$C" -s "$tmp/live.sock" --wait 30 status &&
   chk live 0 -o socket="$tmp/live.sock" && has live out "a daemon is serving $tmp/live.sock" &&
   has live out "are usable" && kill -0 $pid 2>/dev/null
then ok beside_running_daemon; else bad beside_running_daemon "$(cat "$tmp/live.out" "$tmp/live.err" 2>/dev/null)"; fi
kill $pid 2>/dev/null
wait $pid 2>/dev/null
pid=0
exit $((fails > 0))
