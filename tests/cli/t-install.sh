#!/usr/bin/env bash
# Description: `make install DESTDIR=... PREFIX=/usr` puts every file in
# place (binaries, libdgemma shared and static, dgemma.h, dgemma.pc, manual
# pages, dgemmad.yaml, the systemd unit (Type=notify, a start of up to 15
# minutes, the socket families NCCL's bootstrap needs, /var/log/dgemma),
# the sysusers file, the cron example, the logrotate file); a program written against the installed header,
# built and linked through pkg-config (shared, then static), runs against
# the installed daemon serving the installed default model; the shared
# library exports only dgemma_* symbols; a second install keeps an edited
# dgemmad.yaml and logrotate file; uninstall removes what install put
# there but those and the cron file.
set -u
# (CI runs as root; dgemmad refuses root unless told)
ROOT_OK=; [ "$(id -u)" = 0 ] && ROOT_OK="-o allow_root=true"
BUILD=${BUILD:-build}
. "${0%/*}/cli-lib.sh" t-install
skip_sanitizer_build "a sanitizer build is not installed (its libraries need the runtime)"
d=0
trap '[ $d -gt 0 ] && kill $d 2>/dev/null; rm -rf "$tmp"' EXIT
root=$tmp/root
mk() { make -s --no-print-directory BUILD="$BUILD" DESTDIR="$root" PREFIX=/usr "$@" 2>&1 | grep -v '^dgemma:'; }

mk install >"$tmp/install.log"
missing=""
for f in usr/bin/dgemmad usr/bin/dgemma-client usr/bin/dgemma-eval usr/include/dgemma.h \
         usr/lib/libdgemma.a usr/lib/libdgemma.so usr/lib/libdgemma.so.0 \
         usr/lib/pkgconfig/dgemma.pc usr/share/man/man8/dgemmad.8 \
         usr/share/man/man1/dgemma-client.1 usr/share/man/man5/dgemmad.yaml.5 \
         usr/share/man/man3/libdgemma.3 usr/share/dgemma/model/default/config.json \
         etc/dgemma/dgemmad.yaml etc/systemd/system/dgemmad.service \
         usr/lib/sysusers.d/dgemma.conf etc/cron.d/dgemma-batch etc/logrotate.d/dgemma; do
    [ -e "$root/$f" ] || missing="$missing $f"
done
if [ -z "$missing" ] && grep -q '^ExecStart=/usr/bin/dgemmad -c /etc/dgemma/dgemmad.yaml' \
       "$root/etc/systemd/system/dgemmad.service" &&
   grep -q '^Type=notify' "$root/etc/systemd/system/dgemmad.service" &&
   grep -q '^StateDirectory=dgemma' "$root/etc/systemd/system/dgemmad.service" &&
   grep -q '^LogsDirectory=dgemma$' "$root/etc/systemd/system/dgemmad.service" &&
   cmp -s etc/dgemma.logrotate "$root/etc/logrotate.d/dgemma" &&
   [ "$(stat -c %a "$root/etc/logrotate.d/dgemma")" = 644 ] &&
   grep -q '^TimeoutStartSec=15min' "$root/etc/systemd/system/dgemmad.service" &&
   grep -q '^RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6$' \
       "$root/etc/systemd/system/dgemmad.service"
then ok files; else bad files "missing:$missing $(cat "$tmp/install.log")"; fi

extra=$(nm -D --defined-only "$root/usr/lib/libdgemma.so" | awk '{print $3}' | grep -v '^dgemma_' | grep -v '^DGEMMA_0$')
if [ -z "$extra" ] && nm -D --defined-only "$root/usr/lib/libdgemma.so" | grep -q ' dgemma_submit'
then ok exports; else bad exports "exported besides dgemma_*: $extra"; fi

export PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_PATH=$root/usr/lib/pkgconfig
cflags=$(pkg-config --cflags dgemma) && libs=$(pkg-config --libs dgemma) &&
    slibs=$(pkg-config --static --libs dgemma)
if cc -std=c11 -Wall -Wextra -Werror $cflags tests/fixtures/libdgemma/example.c $libs \
       -o "$tmp/example" 2>"$tmp/cc.log" &&
   cc -std=c11 -Wall -Wextra -Werror $cflags tests/fixtures/libdgemma/example.c \
       -Wl,-Bstatic $slibs -Wl,-Bdynamic -o "$tmp/example-static" 2>>"$tmp/cc.log"
then ok builds; else bad builds "$(cat "$tmp/cc.log")"; fi

"$root/usr/bin/dgemmad" $ROOT_OK -o socket="$tmp/d.sock" -o log_file="$tmp/d.log" \
    -o model="$root/usr/share/dgemma/model/default" -o pin_workers=false &
d=$!
LD_LIBRARY_PATH=$root/usr/lib "$tmp/example" "$tmp/d.sock" >"$tmp/run.out" 2>&1; a=$?
"$tmp/example-static" "$tmp/d.sock" >"$tmp/run2.out" 2>&1; b=$?
if [ $a -eq 0 ] && [ $b -eq 0 ] && grep -Eq '^\[(stop|length), ([1-9]|1[0-9]|2[0-4]) tokens\]$' "$tmp/run.out" &&
   cmp -s "$tmp/run.out" "$tmp/run2.out" &&
   LD_LIBRARY_PATH=$root/usr/lib ldd "$tmp/example" | grep -q "libdgemma.so.0 => $root/usr/lib"
then ok runs; else bad runs "$a $b: $(cat "$tmp/run.out" "$tmp/run2.out"; tail -3 "$tmp/d.log")"; fi
kill $d; wait $d; st=$?; d=0
[ $st -eq 0 ] && ok daemon_exit || bad daemon_exit "status $st"

echo "max_batch: 3" >>"$root/etc/dgemma/dgemmad.yaml"
sed -i 's/^    rotate 8$/    rotate 30/' "$root/etc/logrotate.d/dgemma"
mk install >/dev/null
mk uninstall >"$tmp/uninstall.log"
left=$(cd "$root" && find . -type f | sort | tr '\n' ' ')
if grep -q '^max_batch: 3' "$root/etc/dgemma/dgemmad.yaml" &&
   grep -q '^    rotate 30$' "$root/etc/logrotate.d/dgemma" &&
   [ "$left" = "./etc/cron.d/dgemma-batch ./etc/dgemma/dgemmad.yaml ./etc/logrotate.d/dgemma " ]
then ok reinstall_uninstall; else bad reinstall_uninstall "left: $left"; fi

[ $fails -eq 0 ]
