#!/usr/bin/env bash
# Description: `dgemma-client stats` on a metrics database the daemon wrote:
# dgemmad (the embedded default model, metrics on) serves a few requests
# (one of them refused), then stats --json parses, counts every request,
# and its parts add up; the text output has every section; -c CONFIG finds
# the file through its metrics: key; a summary while the daemon runs works;
# a window with nothing in it gives zeros; a file name that is not UTF-8
# and an infinite value in the file still give JSON (U+FFFD for the byte,
# null for the value); a missing file is exit 1 and is
# not created; a file that is not a database, a config without metrics:
# and a config that is missing are exit 1 with a clear message; a bad
# option, --hours 0 and an empty window are exit 2.
set -u
# (CI runs as root; dgemmad refuses root unless told)
ROOT_OK=; [ "$(id -u)" = 0 ] && ROOT_OK="-o allow_root=true"
BUILD=${BUILD:-build}
BIN=$BUILD/bin
if [ ! -x "$BIN/dgemmad" ] || [ ! -x "$BIN/dgemma-client" ] ||
   [ ! -e "$BUILD/model/default/config.json" ]; then
    echo "skip t-stats: $BIN/dgemmad, $BIN/dgemma-client or $BUILD/model/default missing"
    exit 77
fi
. "${0%/*}/cli-lib.sh" t-stats
d=0
trap '[ $d -gt 0 ] && kill $d 2>/dev/null; rm -rf "$tmp"' EXIT
C=$BIN/dgemma-client
db=$tmp/m.db
have_python=0
command -v python3 >/dev/null 2>&1 && have_python=1

# ---- a database written by the daemon ----------------------------------------------
"$BIN/dgemmad" $ROOT_OK -o socket="$tmp/d.sock" -o log_file="$tmp/d.log" -o metrics="$db" \
    -o metrics_flush=0.02 -o pin_workers=false &
d=$!
sent=0 gen_fail=""
for p in "one" "two words" "three little words"; do
    "$C" generate -s "$tmp/d.sock" --wait 15 --max-tokens 8 --max-denoising-steps 4 --seed 1 --quiet "$p" \
        >/dev/null 2>>"$tmp/gen.err" || gen_fail="$gen_fail [$p]"
    sent=$((sent + 1))
done
# refused by the daemon (top_p out of range): a 'rejected' row
"$C" generate -s "$tmp/d.sock" --top-p 5 --quiet "refused" >/dev/null 2>>"$tmp/gen.err"
rej=$?
sent=$((sent + 1))
if [ -z "$gen_fail" ] && [ $rej -eq 1 ]; then ok requests_sent
else bad requests_sent "failed:$gen_fail, refused one exit $rej: $(tail -3 "$tmp/gen.err")"; fi

# while the daemon runs (and may be writing): a summary still works
sleep 0.2
"$C" stats --db "$db" >"$tmp/live.txt" 2>"$tmp/live.err"; st=$?
if [ $st -eq 0 ] && grep -q '^totals' "$tmp/live.txt"
then ok while_running; else bad while_running "exit $st: $(cat "$tmp/live.err")"; fi

kill -TERM $d; wait $d; st=$?; d=0
[ $st -eq 0 ] && ok daemon_exit || bad daemon_exit "status $st: $(tail -3 "$tmp/d.log")"

# ---- JSON -----------------------------------------------------------------------------
"$C" stats --db "$db" --json >"$tmp/s.json" 2>"$tmp/s.err"; st=$?
if [ $st -ne 0 ]; then
    bad json "exit $st: $(cat "$tmp/s.err")"
elif [ $have_python -eq 1 ]; then
    if python3 - "$tmp/s.json" "$sent" "$db" "$(id -u)" >"$tmp/py.out" 2>&1 <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
sent, path, uid = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
keys = {"since", "until", "file", "totals", "hours", "tokens_per_s", "ttfc_ms",
        "steps_per_canvas", "errors", "sources", "uids"}
assert set(s) == keys, sorted(s)
assert s["file"] == path and s["since"] < s["until"]
assert abs(s["until"] - s["since"] - 24 * 3600) < 1e-3, (s["since"], s["until"])
t = s["totals"]
assert t["requests"] == sent, t
fin = t["finish"]
assert set(fin) == {"stop", "length", "cancelled", "error", "rejected", "other"}, fin
assert sum(fin.values()) == sent and fin["rejected"] == 1, fin
assert sum(h["requests"] for h in s["hours"]) == sent
assert sum(h["prompt_tokens"] for h in s["hours"]) == t["prompt_tokens"]
assert sum(h["completion_tokens"] for h in s["hours"]) == t["completion_tokens"]
assert all(h["start"] % 3600 == 0 for h in s["hours"])
assert 0 < t["completion_tokens"] <= 8 * (sent - 1), t
for k in ("tokens_per_s", "ttfc_ms", "steps_per_canvas"):
    d = s[k]
    assert {"n", "mean", "p50", "p95", "min", "max"} <= set(d), (k, d)
    assert d["min"] <= d["p50"] <= d["p95"] <= d["max"], (k, d)
    assert d["min"] <= d["mean"] <= d["max"], (k, d)
assert s["tokens_per_s"]["n"] == sent - 1 and s["ttfc_ms"]["n"] == sent - 1
sp = s["steps_per_canvas"]
assert sp["n"] >= sent - 1 and sum(b["count"] for b in sp["histogram"]) == sp["n"]
assert all(b["lo"] <= b["hi"] for b in sp["histogram"]) and sp["histogram"][0]["lo"] == 1
assert any(e["finish"] == "rejected" and e["code"] == "bad_request" and e["count"] == 1
           for e in s["errors"]), s["errors"]
assert s["sources"] == [{"source": "socket", "requests": sent}], s["sources"]
assert s["uids"] == [{"uid": uid, "requests": sent, "prompt_tokens": t["prompt_tokens"],
                      "completion_tokens": t["completion_tokens"]}], s["uids"]
EOF
    then ok json; else bad json "$(tail -5 "$tmp/py.out")"; fi
else
    echo "# python3 not found: JSON structure checks reduced to grep"
    if grep -q '"totals"' "$tmp/s.json" && grep -q "\"requests\": $sent\b" "$tmp/s.json" &&
       grep -q '"steps_per_canvas"' "$tmp/s.json"
    then ok json; else bad json "$(head -c 400 "$tmp/s.json")"; fi
fi

# ---- text -----------------------------------------------------------------------------
"$C" stats --db "$db" >"$tmp/s.txt" 2>"$tmp/s.err"; st=$?
missing=""
for w in "^metrics  $db\$" '^window ' '^totals' "^  requests  *$sent\$" '^  finish  *.*rejected 1' \
         '^per hour (UTC)' '^distributions' '^  tokens/s ' '^  ttfc_ms ' '^  steps per canvas ' \
         '^steps per canvas' '^errors (finish, code)' '^  rejected  *bad_request  *1$' \
         '^by source' "^  socket  *$sent\$" '^by uid' "^  $(id -u)  *$sent "; do
    grep -q -- "$w" "$tmp/s.txt" || missing="$missing [$w]"
done
if [ $st -eq 0 ] && [ -z "$missing" ]; then ok text
else bad text "exit $st, missing:$missing: $(cat "$tmp/s.err" "$tmp/s.txt" | head -40)"; fi

# ---- the file through a configuration --------------------------------------------
printf '# dgemmad.yaml for t-stats\nmax_batch: 2\nmetrics: %s\n' "$db" >"$tmp/c.yaml"
"$C" stats -c "$tmp/c.yaml" --json >"$tmp/c.json" 2>"$tmp/c.err"; st=$?
if [ $st -eq 0 ] && grep -q "\"file\": \"$db\"" "$tmp/c.json" &&
   { [ $have_python -eq 0 ] ||
     python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["totals"]["requests"] == int(sys.argv[2])' \
         "$tmp/c.json" "$sent"; }
then ok config; else bad config "exit $st: $(cat "$tmp/c.err")"; fi

printf 'max_batch: 2\n' >"$tmp/off.yaml"
"$C" stats --config "$tmp/off.yaml" >/dev/null 2>"$tmp/off.err"; st=$?
if [ $st -eq 1 ] && grep -q "$tmp/off.yaml names no metrics file" "$tmp/off.err" &&
   grep -q -- "--db FILE" "$tmp/off.err"
then ok config_without_metrics; else bad config_without_metrics "exit $st: $(cat "$tmp/off.err")"; fi

"$C" stats -c "$tmp/none.yaml" >/dev/null 2>"$tmp/none.err"; st=$?
if [ $st -eq 1 ] && grep -q "$tmp/none.yaml" "$tmp/none.err"
then ok config_missing; else bad config_missing "exit $st: $(cat "$tmp/none.err")"; fi

# ---- windows ----------------------------------------------------------------------------
"$C" stats --db "$db" --since 0 --until 3600 --json >"$tmp/w.json" 2>"$tmp/w.err"; st=$?
if [ $st -eq 0 ] && grep -q '"hours": \[\]' "$tmp/w.json" && grep -q '"uids": \[\]' "$tmp/w.json" &&
   grep -q '"since": 0' "$tmp/w.json"
then ok empty_window; else bad empty_window "exit $st: $(cat "$tmp/w.err")"; fi

now=$(date +%s)
"$C" stats --db "$db" --until $((now + 60)) --hours 1 --json >"$tmp/h.json" 2>"$tmp/h.err"; st=$?
if [ $st -eq 0 ] && { [ $have_python -eq 0 ] ||
     python3 -c 'import json,sys; s = json.load(open(sys.argv[1])); assert s["totals"]["requests"] == int(sys.argv[2]) and s["until"] - s["since"] == 3600' \
         "$tmp/h.json" "$sent"; }
then ok until_hours; else bad until_hours "exit $st: $(cat "$tmp/h.err")"; fi

# ---- file errors: exit 1 ---------------------------------------------------------------
"$C" stats --db "$tmp/missing.db" >/dev/null 2>"$tmp/m.err"; st=$?
if [ $st -eq 1 ] && [ ! -e "$tmp/missing.db" ] && grep -q "$tmp/missing.db" "$tmp/m.err" &&
   grep -qi "no such file" "$tmp/m.err"
then ok missing_file; else bad missing_file "exit $st: $(cat "$tmp/m.err"); $(ls "$tmp")"; fi

for i in $(seq 20); do echo "this is not a database, only a line of text"; done >"$tmp/junk.db"
cp "$tmp/junk.db" "$tmp/junk.orig"
"$C" stats --db "$tmp/junk.db" >/dev/null 2>"$tmp/j.err"; st=$?
if [ $st -eq 1 ] && grep -q "$tmp/junk.db: not an SQLite database" "$tmp/j.err" &&
   cmp -s "$tmp/junk.db" "$tmp/junk.orig"
then ok not_a_database; else bad not_a_database "exit $st: $(cat "$tmp/j.err")"; fi

# ---- what JSON cannot hold as it is: a file name that is not UTF-8, an
# infinite value written by hand (dgemmad writes neither) --------------------------------
odd=$tmp/$'m\xff.db'
cp "$db" "$odd"
if [ $have_python -eq 1 ]; then
    python3 -c 'import sqlite3,sys; c = sqlite3.connect(sys.argv[1]); c.execute("UPDATE requests SET tokens_per_s = 9e999 WHERE id = (SELECT min(id) FROM requests WHERE tokens_per_s IS NOT NULL)"); c.execute("UPDATE canvases SET steps = 0 WHERE (request, idx) = (SELECT request, idx FROM canvases ORDER BY request, idx LIMIT 1)"); c.commit()' \
        "$odd" 2>"$tmp/odd.py" || bad odd_values "cannot set up: $(cat "$tmp/odd.py")"
fi
"$C" stats --db "$odd" --json >"$tmp/odd.json" 2>"$tmp/odd.err"; st=$?
if [ $st -ne 0 ]; then
    bad odd_values "exit $st: $(cat "$tmp/odd.err")"
elif [ $have_python -eq 1 ]; then
    if python3 - "$tmp/odd.json" "$tmp" >"$tmp/odd.out" 2>&1 <<'EOF2'
import json, sys
s = json.load(open(sys.argv[1], encoding="utf-8"))
assert s["file"] == sys.argv[2] + "/m\ufffd.db", s["file"]
d = s["tokens_per_s"]
assert d["max"] is None and d["mean"] is None, d
assert isinstance(d["min"], float), d
h = s["steps_per_canvas"]["histogram"]
assert h[0] == {"lo": 0, "hi": 0, "count": 1} and h[1]["lo"] == 1, h
EOF2
    then ok odd_values; else bad odd_values "$(tail -3 "$tmp/odd.out")"; fi
else
    grep -q '"max": null' "$tmp/odd.json" && ok odd_values ||
        bad odd_values "$(head -c 300 "$tmp/odd.json")"
fi

# ---- usage: exit 2 ------------------------------------------------------------------------
usage_fails=""
check_usage() {
    "$C" stats "$@" >/dev/null 2>"$tmp/u.err"
    local st=$?
    [ $st -eq 2 ] || usage_fails="$usage_fails [$* -> $st]"
}
check_usage --db "$db" --bogus
check_usage --db "$db" --hours 0
check_usage --db "$db" --hours -3
check_usage --db "$db" --hours many
check_usage --db "$db" --since 100 --until 100
check_usage --db "$db" --since 100 --hours 2
check_usage --db "$db" -c "$tmp/c.yaml"
check_usage --db
check_usage --db "$db" extra
if [ -z "$usage_fails" ]; then ok usage; else bad usage "$usage_fails"; fi

"$C" stats --help >"$tmp/help" 2>&1; st=$?
if [ $st -eq 0 ] && grep -q -- '--hours' "$tmp/help" && "$C" --help | grep -q 'dgemma-client stats'
then ok help; else bad help "exit $st"; fi

[ $fails -eq 0 ]
