#!/usr/bin/env bash
# Description: bench/perf/report.py (the performance harness's table) on
# inputs written here the way bench-generate and hf_generate.py write
# them: bf16 at TP=1, 2 and 4, FP8 at TP=1, profiles at TP=1 and 2.  Each
# dgemma row's step (the denoise call and the condition call), % of
# roofline (of that step), ratio to transformers at its batch, FP8's
# to bf16 and TP=N's to TP=1 (same weights, same batch) are what awk
# computes from the same numbers; rows at TP=1 have no TP=1 ratio and bf16
# rows no bf16 ratio; the sampler + self-conditioning share is printed
# for each TP profiled and no other, and perf.json holds the same values.
# Where hf.json says transformers stopped at a batch (out of memory) the
# report says where, and not otherwise.  The GPU's line: its name and
# count from gpu.txt, and from clocks.csv the busy samples' (utilization
# >= 50%) count, SM clock, memory clock and power (median, least, most),
# the hottest temperature and how many busy samples had each clock event
# reason, as sort and awk find them in the same samples (lines that do not
# parse passed over); without clocks.csv it says there are no samples,
# without gpu.txt that the GPU was not recorded; with samples and runs
# not timed, no table of the clocks within each run.  The board line: one
# VBIOS and InfoROM for GPUs alike, each GPU's where they differ, "not
# recorded" where board.csv holds nvidia-smi's refusal.  The ceilings'
# line with the L2's read rate where the JSON has it.  Skips (77) without
# python3.
set -u
command -v python3 >/dev/null 2>&1 || { echo "skip t-perf-report: no python3"; exit 77; }
. "${0%/*}/cli-lib.sh" t-perf-report
S=${0%/*}/../../bench/perf/report.py

# one dgemma run a line: tp weights batch denoise_ms roofline_ms commit_ms tok/s
# condition_ms
runs() {
    cat <<'EOF'
1 bf16 1 17.4 12.5 4.8 868 0.69
1 bf16 16 95.2 51.9 59.0 2366 4.1
2 bf16 1 10.1 6.4 3.1 1561 0.41
2 bf16 16 52.3 26.0 33.3 4410 2.3
4 bf16 1 7.3 3.4 2.5 2207 0.27
1 fp8 1 11.7 6.8 3.3 1253 0.7
1 fp8 16 93.5 52.1 71.6 2386 4.2
EOF
}
# transformers: batch tok/s
hf() { printf '1 176\n16 834\n'; }

mk() { # tp weights: bench-generate's JSON
    runs | awk -v tp="$1" -v w="$2" '
        BEGIN { printf "{\"ceilings\": {\"copy_gbps\": 4228, \"gemm_tflops\": 772}, \"runs\": [" }
        $1 == tp && $2 == w {
            printf "%s{\"batch\": %d, \"denoise_ms\": %s, \"roofline_denoise_ms\": %s, " \
                   "\"commit_ms\": %s, \"tokens_per_s\": %s, \"tokens_per_s_with_prefill\": %s, " \
                   "\"gpu_gib_per_rank\": [%s, %s], \"condition_ms\": %s}", sep, $3, $4, $5, $6,
                   $7, $7 - 10, 20 + tp, 19 + tp, $8
            sep = ", "
        }
        END { print "]}" }'
}
mk 1 bf16 > "$tmp/tp1.json"
mk 2 bf16 > "$tmp/tp2.json"
mk 4 bf16 > "$tmp/tp4.json"
mk 1 fp8 > "$tmp/tp1-fp8.json"
hf | awk 'BEGIN { printf "{\"runs\": [" }
          { printf "%s{\"batch\": %d, \"denoise_ms\": 80, \"commit_ms\": 80, \"tokens_per_s\": %s, " \
                   "\"tokens_per_s_with_prefill\": %s, \"gpu_gib\": 50}", sep, $1, $2, $2 - 2; sep = ", " }
          END { print "]}" }' > "$tmp/hf.json"
# profiles: stage ms; the sampler's and the self-conditioning product's
# stages are the share
prof() { # sampler_stats sampler_probs sc_pe experts attention
    printf '{"runs": [{"batch": 1, "profile_ms_per_step": {"sampler statistics": %s, "sampler probabilities": %s, "self-conditioning P.E": %s, "experts": %s, "attention": %s}}]}\n' "$@"
}
prof 0.62 0.11 0.34 11.9 1.3 > "$tmp/profile.json"
prof 0.40 0.07 0.21 6.1 0.8 > "$tmp/profile-tp2.json"

# the GPU: four, and a sample a GPU a second, with the clock event reasons
# drawn from masks whose bits the test names itself (0x4 SW power cap, 0x8
# HW slowdown, 0x40 HW thermal slowdown; 0x1 idle is not a reason)
for i in 0 1 2 3; do echo "NVIDIA H100 80GB HBM3, 1980 MHz, 2619 MHz, 71.20 W, 33"; done \
    > "$tmp/gpu.txt"
for i in 0 1 2 3; do echo "$i, 96.00.99.00.0D, G520.0202.00.03, 580.159.04"; done > "$tmp/board.csv"
F=index,utilization.gpu,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
samples() { # index util sm mem power temp mask, a line a GPU a second
    awk 'BEGIN {
        split("0x0000000000000000 0x0000000000000004 0x000000000000000C 0x0000000000000001 0x0000000000000044", m, " ")
        for (s = 0; s < 15; s++) for (i = 0; i < 4; i++) {
            u = (s < 3 || (s == 13 && i == 3)) ? 0 : 60 + 9 * i
            if (s == 14) u = 49
            pw = (s == 7 && i == 1) ? "[N/A]" : sprintf("%.2f", 300 + 23 * ((s * 5 + i) % 17) + 0.25)
            printf "%d, %d, %d, %d, %s, %d, %s\n", i, u, 1980 - 15 * ((s * 7 + i * 3) % 11),
                   (s == 9 && i == 2) ? 1593 : 2619, pw, 40 + s + 2 * i, m[(s + i) % 5 + 1]
        }
    }'
}
{ echo "# $F"; samples | sed '17a\
Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error'; } > "$tmp/clocks.csv"

run report 0 python3 "$S" "$tmp" || { [ $fails -eq 0 ]; exit; }
o=$tmp/report.out

# a dgemma row's cell (1-based after the leading "|"): tp weights batch col
cell() {
    awk -F'|' -v tp="$1" -v w="$2" -v b="$3" -v c="$4" '
        $2 ~ /dgemma/ && $3 ~ w && $4 + 0 == tp && $5 + 0 == b {
            gsub(/ /, "", $(c + 1)); print $(c + 1) }' "$o"
}
# columns: 1 engine 2 weights 3 TP 4 B 5 step 6 roofline 7 % 8 commit 9 tok/s
# 10 with prefill 11 GiB 12 x HF 13 x bf16 14 x TP=1
n=$(grep -c '^| dgemma |' "$o")
[ "$n" = "$(runs | wc -l)" ] && ok rows || bad rows "$n dgemma rows"
err=""
while read -r tp w b dn rf cm tps cond; do
    step=$(awk -v a="$dn" -v b="$cond" 'BEGIN { printf "%.2f", a + b }')
    pct=$(awk -v a="$rf" -v b="$dn" -v c="$cond" 'BEGIN { printf "%.0f%%", 100 * a / (b + c) }')
    xhf=$(hf | awk -v b="$b" -v t="$tps" '$1 == b { printf "%.2f", t / $2 }')
    xbf=""
    [ "$w" = fp8 ] && xbf=$(runs | awk -v tp="$tp" -v b="$b" -v t="$tps" \
        '$1 == tp && $2 == "bf16" && $3 == b { printf "%.2f", t / $7 }')
    xtp=""
    [ "$tp" -gt 1 ] && xtp=$(runs | awk -v w="$w" -v b="$b" -v t="$tps" \
        '$1 == 1 && $2 == w && $3 == b { printf "%.2f", t / $7 }')
    got="$(cell "$tp" "$w" "$b" 5) $(cell "$tp" "$w" "$b" 7) $(cell "$tp" "$w" "$b" 12) [$(cell "$tp" "$w" "$b" 13)] [$(cell "$tp" "$w" "$b" 14)]"
    want="$step $pct $xhf [$xbf] [$xtp]"
    [ "$got" = "$want" ] || err="$err TP=$tp $w B=$b: '$got' want '$want';"
done < <(runs)
[ -z "$err" ] && ok ratios || bad ratios "$err"

# the share at TP=1 and TP=2, none at TP=4 (not profiled)
share() { # file: the share in percent, as report.py rounds it
    python3 -c 'import json,sys
p = json.load(open(sys.argv[1]))["runs"][0]["profile_ms_per_step"]
part = p["sampler statistics"] + p["sampler probabilities"] + p["self-conditioning P.E"]
print("%.1f%%" % (100 * part / sum(p.values())))' "$1"
}
s1=$(sed -n 's/.*denoising step at TP=1 (profiled.*: \([0-9.]*%\)$/\1/p' "$o")
s2=$(sed -n 's/.*denoising step at TP=2 (profiled.*: \([0-9.]*%\)$/\1/p' "$o")
if [ "$s1" = "$(share "$tmp/profile.json")" ] && [ "$s2" = "$(share "$tmp/profile-tp2.json")" ] &&
   ! grep -q "at TP=4 (profiled" "$o"; then
    ok shares
else
    bad shares "TP=1 '$s1', TP=2 '$s2'; $(grep -c 'profiled' "$o") share lines"
fi

# the GPU's line, from the same samples
busy() { samples | awk -F', ' '$2 >= 50'; }
stat() { # column: median (middle of an odd count, else the two's mean), least, most
    busy | awk -F', ' -v c="$1" '$c ~ /^[0-9.]+$/ { print $c }' | sort -n |
        awk '{ v[NR] = $1 } END {
            md = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%.0f %.0f %.0f", md, v[1], v[NR] }'
}
read -r sm_md sm_lo sm_hi < <(stat 3)
read -r mem_md mem_lo mem_hi < <(stat 4)
read -r pw_md _ pw_hi < <(stat 5)
read -r _ _ hot < <(stat 6)
nb=$(busy | wc -l)
sw=$(busy | grep -c -e '0x0000000000000004$' -e '0x000000000000000C$')
hw=$(busy | grep -c '0x000000000000000C$')
th=$(busy | grep -c '0x0000000000000044$')
sw=$((sw + th))
want="GPU: NVIDIA H100 80GB HBM3 x 4; while busy ($nb samples at >= 50% utilization): SM clock median $sm_md MHz ($sm_lo-$sm_hi), memory $mem_md MHz ($mem_lo-$mem_hi), power median $pw_md W (most $pw_hi), hottest $hot C, clock event reasons: SW power cap ($sw), HW slowdown ($hw), HW thermal slowdown ($th)"
got=$(grep '^GPU:' "$o")
[ "$got" = "$want" ] && ok gpu_line || bad gpu_line "'$got' want '$want'"

# perf.json: the same ratios and shares
if python3 - "$tmp" "$nb $sm_md $sm_lo $sm_hi $hot $sw" <<'PY'
import json, os, sys
d = json.load(open(os.path.join(sys.argv[1], "perf.json")))
g, want = d["gpu"], [float(x) for x in sys.argv[2].split()]
assert (g["name"], g["count"]) == ("NVIDIA H100 80GB HBM3", 4), g
got = [g["busy_samples"], round(g["sm_mhz"]["median"]), g["sm_mhz"]["min"], g["sm_mhz"]["max"],
       g["temp_c_max"], g["reasons"]["SW power cap"]]
assert got == want, (got, want)
rows = {(r["tp"], r["weights"], r["batch"]): r for r in d["rows"] if r["engine"] == "dgemma"}
r2, r1 = rows[(2, "bf16", 16)], rows[(1, "bf16", 16)]
assert abs(r1["step_ms"] - (95.2 + 4.1)) < 1e-9 and r1["denoise_ms"] == 95.2, r1
assert abs(r1["pct_roofline"] - 100 * 51.9 / (95.2 + 4.1)) < 1e-9, r1
assert abs(r2["ratio_tp1"] - r2["tokens_per_s"] / r1["tokens_per_s"]) < 1e-9, r2
assert r1["ratio_tp1"] is None and rows[(1, "fp8", 1)]["ratio_tp1"] is None
assert set(d["sampler_share_pct_b1"]) == {"1", "2"}, d["sampler_share_pct_b1"]
assert d["sampler_share_pct_tp1_b1"] == d["sampler_share_pct_b1"]["1"]
assert set(d["profiles"]) == {"1", "2"}
PY
then ok perf_json; else bad perf_json "see above"; fi

# untimed samples (no timestamp field) and untimed runs: no table of the
# clocks within each run
! grep -q "clocks while each" "$o" && ok untimed_no_per_run ||
    bad untimed_no_per_run "$(grep -A3 "clocks while each" "$o")"

# transformers stopped at batch 16 (hf_generate.py's "stopped"), batch 1 kept
python3 - "$tmp/hf.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["runs"] = d["runs"][:1]
d["stopped"] = {"batch": 16, "why": "out of GPU memory: CUDA out of memory"}
json.dump(d, open(sys.argv[1], "w"))
PY
if run stopped 0 python3 "$S" "$tmp"; then
    ! grep -q "transformers stopped" "$o" &&
        has stopped out "(transformers stopped at batch 16: out of GPU memory: CUDA out of memory)" &&
        [ "$(grep -c '^| transformers' "$tmp/stopped.out")" = 1 ] && ok hf_stopped_said ||
        bad hf_stopped_said "$(grep -e stopped -e '^| transformers' "$tmp/stopped.out" "$o")"
fi

# the board line: one board for four alike; each GPU's where they differ
# (perf.json's boards as board.csv has them); none where the file holds
# only nvidia-smi's refusal
want="board: VBIOS 96.00.99.00.0D, InfoROM G520.0202.00.03 (all 4 GPUs); driver 580.159.04"
[ "$(grep '^board:' "$o")" = "$want" ] && ok board_alike || bad board_alike "$(grep '^board:' "$o")"
sed -i '3s/.*/2, 96.00.DA.00.0C, G520.0200.00.05, 580.159.04/' "$tmp/board.csv"
if run boards 0 python3 "$S" "$tmp"; then
    want="board: GPU 0: VBIOS 96.00.99.00.0D, InfoROM G520.0202.00.03; GPU 1: VBIOS 96.00.99.00.0D, InfoROM G520.0202.00.03; GPU 2: VBIOS 96.00.DA.00.0C, InfoROM G520.0200.00.05; GPU 3: VBIOS 96.00.99.00.0D, InfoROM G520.0202.00.03; driver 580.159.04"
    [ "$(grep '^board:' "$tmp/boards.out")" = "$want" ] &&
        python3 -c 'import json,sys; b = json.load(open(sys.argv[1]))["boards"]; assert [x["vbios"] for x in b] == ["96.00.99.00.0D"] * 2 + ["96.00.DA.00.0C", "96.00.99.00.0D"] and b[2] == dict(index=2, vbios="96.00.DA.00.0C", inforom="G520.0200.00.05", driver="580.159.04"), b' \
            "$tmp/perf.json" && ok board_differs || bad board_differs "$(grep '^board:' "$tmp/boards.out")"
fi
echo 'Field "vbios_version" is not a valid field to query.' > "$tmp/board.csv"
if run noboard 0 python3 "$S" "$tmp"; then
    [ "$(grep '^board:' "$tmp/noboard.out")" = "board: not recorded (no board.csv, or nvidia-smi refused its query)" ] &&
        python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["boards"] is None' "$tmp/perf.json" &&
        ok board_refused || bad board_refused "$(grep '^board:' "$tmp/noboard.out")"
fi

# the ceilings' line: the L2's read rate where bench-generate measured it
# (since it does), none where its JSON has none
want="ceilings: copy 4228 GB/s, bf16 GEMM 772 TFLOP/s; prompt 512, 4 canvases of 256, 16 steps"
[ "$(grep '^ceilings:' "$o")" = "$want" ] && ok ceilings_no_l2 ||
    bad ceilings_no_l2 "$(grep '^ceilings:' "$o")"
for f in tp1 tp2 tp4 tp1-fp8; do
    python3 - "$tmp/$f.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["ceilings"]["l2_read_gbps"] = 9876.4
json.dump(d, open(sys.argv[1], "w"))
PY
done
if run l2 0 python3 "$S" "$tmp"; then
    want="ceilings: copy 4228 GB/s, bf16 GEMM 772 TFLOP/s, L2 read 9876 GB/s; prompt 512, 4 canvases of 256, 16 steps"
    [ "$(grep '^ceilings:' "$tmp/l2.out")" = "$want" ] &&
        python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["ceilings"]["l2_read_gbps"] == 9876.4' \
            "$tmp/perf.json" && ok ceilings_l2 || bad ceilings_l2 "$(grep '^ceilings:' "$tmp/l2.out")"
fi

# no samples, then no GPU recorded
rm "$tmp/clocks.csv"
run noclocks 0 python3 "$S" "$tmp" &&
    { [ "$(grep '^GPU:' "$tmp/noclocks.out")" = "GPU: NVIDIA H100 80GB HBM3 x 4; no clock samples while busy" ] &&
          ok gpu_no_samples || bad gpu_no_samples "$(grep '^GPU:' "$tmp/noclocks.out")"; }
rm "$tmp/gpu.txt"
run nogpu 0 python3 "$S" "$tmp" &&
    { [ "$(grep '^GPU:' "$tmp/nogpu.out")" = "GPU: not recorded (no gpu.txt)" ] &&
          python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["gpu"] is None' \
              "$tmp/perf.json" && ok gpu_not_recorded ||
          bad gpu_not_recorded "$(grep '^GPU:' "$tmp/nogpu.out")"; }

[ $fails -eq 0 ]
