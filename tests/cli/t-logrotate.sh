#!/usr/bin/env bash
# Description: etc/dgemma.logrotate against a running dgemmad.  logrotate
# reads the shipped file as it is but for its path pattern, pointed at the
# test's folder, and is forced to rotate the daemon's log file twice, a
# request served before, between and after.  A `systemctl` first in PATH
# stands in for systemd: it records its arguments and, asked to reload
# dgemmad.service, sends the daemon SIGHUP, as the unit's ExecReload does
# (checked).  The shipped file must parse with no error (logrotate -d);
# each rotation must ask for that reload once; and each request's lines
# (accepted and done) must be in exactly one file, the one current when it ran: the
# first in dgemmad.log.2.gz (compressed at the second rotation), the
# second in dgemmad.log.1 (left uncompressed: delaycompress), the third in
# the new dgemmad.log, each file after the first opening with the
# daemon's "log reopened" line, none lost or repeated.  The unit must give
# the daemon /var/log/dgemma, the directory the shipped file rotates.
set -u
BUILD=${BUILD:-build}
. "${0%/*}/cli-lib.sh" t-logrotate
need_daemon
if ! command -v logrotate >/dev/null 2>&1; then
    echo "skip t-logrotate: logrotate is not installed (tools/install-deps.sh installs it)"
    exit 77
fi
d=0
trap '[ $d -gt 0 ] && kill $d 2>/dev/null; rm -rf "$tmp"' EXIT
shipped=etc/dgemma.logrotate unit=etc/dgemmad.service
log=$tmp/log/dgemmad.log
mkdir -p "$tmp/log" "$tmp/bin"

# ---- the shipped files ----------------------------------------------------------------
if run parse 0 logrotate -d -s "$tmp/parse.state" "$shipped" &&
   ! grep -qi 'error' "$tmp/parse.out" "$tmp/parse.err"
then ok parses; else bad parses "$(grep -i error "$tmp/parse.out" "$tmp/parse.err" | head -3)"; fi
if grep -q '^LogsDirectory=dgemma$' "$unit" && grep -q '^/var/log/dgemma/\*\.log {$' "$shipped" &&
   grep -q '^ExecReload=/bin/kill -HUP \$MAINPID$' "$unit" &&
   grep -q '^        systemctl reload dgemmad.service ' "$shipped"
then ok unit_matches; else bad unit_matches "LogsDirectory, the pattern, ExecReload or postrotate differ"; fi

# the shipped file with its pattern alone changed
sed "s|^/var/log/dgemma/\*\.log {$|$tmp/log/*.log {|" "$shipped" >"$tmp/dgemma.logrotate"
if [ "$(diff "$shipped" "$tmp/dgemma.logrotate" | grep -c '^[<>]')" -ne 2 ]; then
    bad pattern "the path pattern was not replaced once"
    echo "# t-logrotate: $fails failed"
    exit 1
fi
cat >"$tmp/bin/systemctl" <<EOF
#!/bin/sh
echo "\$*" >>"$tmp/systemctl.log"
[ "\$*" = "reload dgemmad.service" ] && kill -HUP "\$(cat "$tmp/d.pid")"
exit 0
EOF
chmod +x "$tmp/bin/systemctl"

# ---- a daemon whose log is rotated twice ----------------------------------------------------
"$D" $ROOT_OK -o socket="$tmp/d.sock" -o log_file="$log" -o model="$M" -o pin_workers=false &
d=$!
echo $d >"$tmp/d.pid"

# one request, waited for: the daemon's Nth, req=N in its log lines
ask() {
    "$C" generate -s "$tmp/d.sock" --wait 15 --max-tokens 8 --max-denoising-steps 2 --seed 1 \
        --quiet "$1" >/dev/null 2>>"$tmp/gen.err"
}
# rotation N: logrotate forced, then the new file must hold the reopening
rotate() {
    PATH=$tmp/bin:$PATH logrotate -f -s "$tmp/state" "$tmp/dgemma.logrotate" \
        >>"$tmp/rotate.out" 2>&1 || return 1
    for _ in $(seq 100); do
        grep -q 'SIGHUP: log reopened' "$log" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "no 'log reopened' line in a new $log within 10 s" >>"$tmp/rotate.out"
    return 1
}
if ask first && rotate && ask second && rotate && ask third; then ok rotated
else bad rotated "$(tail -3 "$tmp/gen.err" "$tmp/rotate.out" 2>/dev/null)"; fi
kill -TERM $d; wait $d; st=$?; d=0
[ $st -eq 0 ] && ok daemon_exit || bad daemon_exit "status $st: $(tail -3 "$log")"

want="reload dgemmad.service
reload dgemmad.service"
got=$(cat "$tmp/systemctl.log" 2>/dev/null)
[ "$got" = "$want" ] && ok reloads || bad reloads "systemctl was called as: $got"

# each request's lines (accepted and done, at the info level) in one file
# only: the one current when it ran
zcat "$log.2.gz" >"$tmp/f1" 2>/dev/null
cp "$log.1" "$tmp/f2" 2>/dev/null
cp "$log" "$tmp/f3" 2>/dev/null
where=""
for n in 1 2 3; do
    for f in f1 f2 f3; do
        where="$where $n:$f:$(grep -c " req=$n \(conn .* accepted: \|uid=.* done \)" "$tmp/$f")"
    done
done
if [ "$where" = " 1:f1:2 1:f2:0 1:f3:0 2:f1:0 2:f2:2 2:f3:0 3:f1:0 3:f2:0 3:f3:2" ] &&
   [ -e "$log.2.gz" ] && [ ! -e "$log.1.gz" ] && [ ! -e "$log.3.gz" ]
then ok lines_placed; else bad lines_placed "request:file:lines$where; $(ls "$tmp/log")"; fi
if head -1 "$tmp/f2" | grep -q 'SIGHUP: log reopened' && head -1 "$tmp/f3" | grep -q 'SIGHUP: log reopened' &&
   ! grep -q 'SIGHUP' "$tmp/f1" && grep -q 'dgemmad stopped' "$tmp/f3"
then ok reopened_first; else bad reopened_first "$(head -1 "$tmp/f2"); $(head -1 "$tmp/f3")"; fi

echo "# t-logrotate: $fails failed"
[ $fails -eq 0 ]
