#!/usr/bin/env bash
# Description: bench/perf/run.sh (the performance harness) end to end on
# this machine, with stand-ins for the GPU's programs: an nvidia-smi that
# lists one H100 and prints a sample every 50 ms when asked to loop, and a
# bench-generate that writes the JSON the real one writes and runs for a
# moment.  The harness must write clocks.csv with a first line naming the
# fields it asked for (clock event reasons under their newer name, or the
# older where nvidia-smi refuses the newer, or none where it refuses
# both, and the samples' time first), the stand-in's samples after it,
# stop its sampler before it returns (no nvidia-smi left looping), and
# print the report with the GPU's line from those samples, its board's
# (VBIOS, InfoROM and driver; not recorded where nvidia-smi refuses the
# query), and a table of
# the samples within each run (the stand-in bench-generate says when it
# ran, as the real one does); where transformers cannot run here the
# table comes without its rows and the harness says so.  Skips (77)
# without python3.
set -u
command -v python3 >/dev/null 2>&1 || { echo "skip t-perf-run: no python3"; exit 77; }
. "${0%/*}/cli-lib.sh" t-perf-run
root=$(cd "${0%/*}/../.." && pwd)

mkdir -p "$tmp/bin" "$tmp/build/bench/gpu"
# the stand-in nvidia-smi; REFUSE names the reasons' fields it rejects
cat > "$tmp/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in
*-L*) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"; exit 0 ;;
esac
for f in ${REFUSE:-}; do
    case "$*" in *"$f"*) echo "Field \"$f\" is not a valid field to query." >&2; exit 2 ;; esac
done
case "$*" in
*"-l 1"*)
    echo $$ > "$SMI_PID"
    n=0
    while :; do
        r=; case "$*" in *reasons*) r=", 0x0000000000000004" ;; esac
        t=; case "$*" in *timestamp*) t="$(date '+%Y/%m/%d %H:%M:%S.%3N'), " ;; esac
        echo "${t}0, $((n % 3 ? 97 : 12)), $((1980 - n % 4 * 15)), 2619, 650.5, $((50 + n % 7))$r"
        n=$((n + 1))
        sleep 0.05
    done ;;
*name,*) echo "NVIDIA H100 80GB HBM3, 1980 MHz, 2619 MHz, 70.1 W, 33" ;;
*vbios_version*) echo "0, 96.00.99.00.0D, G520.0202.00.03, 580.159.04" ;;
*) echo "0, 0, 1980, 2619, 70.1, 33, 0x0000000000000001" ;;
esac
EOF
# the stand-in bench-generate: --json FILE gets one batch-1 run, with the
# wall clock around its moment
cat > "$tmp/build/bench/gpu/bench-generate" <<'EOF'
#!/usr/bin/env bash
json=
while [ $# -gt 0 ]; do
    case "$1" in --json) json=$2; shift ;; esac
    shift
done
t0=$(date +%s.%N)
sleep 0.4
t1=$(date +%s.%N)
cat > "$json" <<J
{"ceilings": {"copy_gbps": 3000, "gemm_tflops": 790}, "runs": [{"batch": 1, "denoise_ms": 22.0,
 "roofline_denoise_ms": 17.7, "commit_ms": 3.0, "tokens_per_s": 700, "tokens_per_s_with_prefill": 690,
 "gpu_gib_per_rank": [48.5], "condition_ms": 0.7, "started_unix_s": $t0, "ended_unix_s": $t1,
 "profile_ms_per_step": {"sampler statistics": 0.4, "experts": 17.0}}]}
J
echo "| bench-generate stand-in |"
EOF
chmod +x "$tmp/bin/nvidia-smi" "$tmp/build/bench/gpu/bench-generate"

harness() { # name REFUSE: runs the harness; its output in $tmp/name.out
    local name=$1
    (cd "$root" && PATH="$tmp/bin:$PATH" REFUSE="$2" SMI_PID="$tmp/$name.smi" \
        BUILD="$tmp/build" bash bench/perf/run.sh "$tmp/$name" 1 >"$tmp/$name.out" 2>"$tmp/$name.err")
}
base=timestamp,index,utilization.gpu,clocks.sm,clocks.mem,power.draw,temperature.gpu
for c in "new|" "old|clocks_event_reasons" "none|clocks_event_reasons clocks_throttle_reasons vbios_version"; do
    name=${c%%|*} refuse=${c#*|}
    harness "$name" "$refuse"
    st=$?
    d=$tmp/$name
    case $name in
    new) want="# $base,clocks_event_reasons.active" ;;
    old) want="# $base,clocks_throttle_reasons.active" ;;
    none) want="# $base" ;;
    esac
    head1=$(head -n 1 "$d/clocks.csv" 2>/dev/null)
    ns=$(grep -c '^[0-9/]* [0-9:.]*, 0, ' "$d/clocks.csv" 2>/dev/null)
    if [ $st -eq 0 ] && [ "$head1" = "$want" ] && [ "${ns:-0}" -ge 3 ]; then
        ok "$name/clocks_csv"
    else
        bad "$name/clocks_csv" "exit $st, first line '$head1' want '$want', ${ns:-0} samples"
    fi
    # the sampler stopped: its pid no longer a process once the harness is back
    pid=$(cat "$tmp/$name.smi" 2>/dev/null)
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
        ok "$name/sampler_stopped"
    else
        bad "$name/sampler_stopped" "pid '${pid}' $( [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo still running)"
        [ -n "$pid" ] && kill "$pid" 2>/dev/null
    fi
    # the report's GPU line counts the busy samples clocks.csv holds
    nb=$(awk -F', ' 'NR > 1 && $3 >= 50' "$d/clocks.csv" | wc -l)
    line=$(grep '^GPU:' "$tmp/$name.out")
    case $line in
    "GPU: NVIDIA H100 80GB HBM3 x 1; while busy ($nb samples at >= 50% utilization): SM clock median"*)
        ok "$name/gpu_line" ;;
    *) bad "$name/gpu_line" "'$line' ($nb busy samples in clocks.csv)" ;;
    esac
    case "$name:$line" in
    new:*"clock event reasons: SW power cap ($nb)"|old:*"clock event reasons: SW power cap ($nb)") ok "$name/reasons" ;;
    none:*"clock event reasons"*) bad "$name/reasons" "'$line': none were recorded" ;;
    none:*) ok "$name/reasons" ;;
    *) bad "$name/reasons" "'$line'" ;;
    esac
    # the board line from board.csv (none where nvidia-smi refused its query)
    line=$(grep '^board:' "$tmp/$name.out")
    case "$name:$line" in
    new:"board: VBIOS 96.00.99.00.0D, InfoROM G520.0202.00.03; driver 580.159.04"|\
    old:"board: VBIOS 96.00.99.00.0D, InfoROM G520.0202.00.03; driver 580.159.04"|\
    none:"board: not recorded"*) ok "$name/board" ;;
    *) bad "$name/board" "'$line'" ;;
    esac
done
# the clocks within each run: each row of the second table counts the busy
# samples timed within its run's start and end and gives their median SM
# clock, as python finds them in clocks.csv and the runs' JSON
for name in new none; do
    if want=$(python3 - "$tmp/$name" <<'PY'
import json, os, statistics, sys, time
d = sys.argv[1]
lines = open(os.path.join(d, "clocks.csv")).read().splitlines()[1:]
s = []
for ln in lines:
    c = ln.split(", ")
    w, _, f = c[0].partition(".")
    s.append((time.mktime(time.strptime(w, "%Y/%m/%d %H:%M:%S")) + float("0." + f), int(c[2]),
              int(c[3])))
for label, fn in (("bf16", "tp1.json"), ("fp8", "tp1-fp8.json"), ("bf16, profiled", "profile.json")):
    r = json.load(open(os.path.join(d, fn)))["runs"][0]
    v = [sm for t, u, sm in s if u >= 50 and r["started_unix_s"] <= t <= r["ended_unix_s"]]
    assert v, (label, "no samples within the run")
    print(f"| {label} | 1 | 1 | {len(v)} | {statistics.median(v):.0f} ")
PY
    ) && got=$(grep -e '^| bf16 | 1 | 1 |' -e '^| fp8 | 1 | 1 |' -e '^| bf16, profiled | 1 | 1 |' "$tmp/$name.out" |
                   cut -d'(' -f1) && [ "$got" = "$want" ]; then
        ok "$name/clocks_per_run"
    else
        bad "$name/clocks_per_run" "got '$got' want '$want'"
    fi
done

# the table's one dgemma row, and no transformers rows where it cannot run
if grep -q '^| dgemma | bf16 | 1 | 1 | 22.70 |' "$tmp/new.out" && ! grep -q '^| transformers' "$tmp/new.out" &&
   has new err "the table has no transformers rows"; then
    ok table
else
    bad table "$(grep '^|' "$tmp/new.out" | head -5); stderr: $(head -c 300 "$tmp/new.err")"
fi

[ $fails -eq 0 ]
