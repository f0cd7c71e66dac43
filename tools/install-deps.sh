#!/bin/sh
# tools/install-deps.sh - install the Debian/Ubuntu packages dgemma builds with.
#
# Installs only what is missing; runs apt-get through sudo when not root.
# The CUDA toolkit is not installed here: with nvcc absent the build is
# CPU-only (see README.md).
set -eu

PACKAGES="build-essential pkg-config clang libclang-rt-dev libjansson-dev libyaml-dev
liburing-dev libsqlite3-dev man-db groff-base python3 logrotate"

missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "deps: all present ($(echo $PACKAGES | wc -w) packages)"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "deps: missing:$missing; run this as root or install sudo" >&2
    exit 1
fi
echo "deps: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# shellcheck disable=SC2086
$SUDO apt-get install -y -q --no-install-recommends $missing
