# cli-lib.sh - what the command-line tests share.  A test sources it with
# its own name:
#     . "${0%/*}/cli-lib.sh" t-eval-quantize
# and gets:
#   tmp                       a scratch folder, removed at exit (a test that
#                             starts a process sets its own EXIT trap, which
#                             must remove it too)
#   fails                     the count of failed cases
#   ok NAME / bad NAME WHY    a case's result line; bad counts a failure
#   run NAME WANT CMD...      CMD's stdout and stderr kept in $tmp/NAME.out
#                             and .err; a bad line, and status 1, when it
#                             exits with another status than WANT
#   has NAME out|err TEXT     the kept output holds TEXT
#   need_daemon               D, C, M, ROOT_OK for the daemon tests (below)
#   skip_sanitizer_build WHY  exits 77 with a skip line when $BUILD is a
#                             sanitizer build (its name has asan or tsan)
# (sourced, not run: no t- prefix, so the runner does not take it for a test)
cli_name=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dgemma-$cli_name-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0

ok() { echo "ok $cli_name/$1"; }
bad() { echo "not ok $cli_name/$1: $2"; fails=$((fails + 1)); }

run() {
    local name=$1 want=$2; shift 2
    "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
    local st=$?
    [ $st -eq "$want" ] && return 0
    bad "$name" "exit $st, want $want; stderr: $(head -c 400 "$tmp/$name.err")"
    return 1
}

has() { grep -qF -- "$3" "$tmp/$1.$2"; }

skip_sanitizer_build() {
    case "$BUILD" in *asan*|*tsan*)
        echo "skip $cli_name: $1"
        exit 77 ;;
    esac
}

# need_daemon: D, C and M set to the build's dgemmad, dgemma-client and
# random test model, ROOT_OK to the option that lets dgemmad run as root
# when we are root (as CI is); exits 77 with a skip line if one is missing.
need_daemon() {
    D=$BUILD/bin/dgemmad C=$BUILD/bin/dgemma-client M=$BUILD/model/random
    ROOT_OK=; [ "$(id -u)" = 0 ] && ROOT_OK="-o allow_root=true"
    if [ ! -x "$D" ] || [ ! -x "$C" ] || [ ! -e "$M/config.json" ]; then
        echo "skip $cli_name: dgemmad, dgemma-client or $M is not built"
        exit 77
    fi
}
