#!/usr/bin/env bash
# Description: bench/perf/step_kernels.py (one denoising step, kernel by
# kernel, from Nsight Compute's CSV) on a CSV written here the way ncu
# writes it (a preamble, quoted fields, thousands separators, names with
# template and argument lists): the step between the first and second
# sampler statistics kernels has the launches and the microseconds that
# awk sums from the same rows, each group the sum of its kernels (the
# statistics kernel that ends the step in it, the mma.sync and wgmma
# grouped GEMMs with the experts, the probabilities' kernel in either form
# with the sampler, a kernel no rule names in a group of its own), the
# kernels longest first with one kernel's launches on one row; --step 0
# and 2 bound their steps likewise; a step past the
# last statistics kernel and a file with none are exit 1 with a message.
# Skips (77) without python3.
set -u
command -v python3 >/dev/null 2>&1 || { echo "skip t-step-kernels: no python3"; exit 77; }
. "${0%/*}/cli-lib.sh" t-step-kernels
S=${0%/*}/../../bench/perf/step_kernels.py

# one launch a line: name|grid|nanoseconds
rows() {
    cat <<'EOF'
void fill_normal_rect_kernel(unsigned short *, long)|(4096, 1, 1)|6598848
void rmsnorm_rows_kernel<0, 0, 128, 4>(__nv_bfloat16 *, const __nv_bfloat16 *)|(256, 1, 1)|3370
stats_kernel(dg_row_stats *, float *, long)|(32, 256, 1)|657280
void grouped_gemm_kernel<2, 64, 4, 1, 1, __nv_bfloat16>(__nv_bfloat16 *, const __nv_bfloat16 *)|(22, 128, 1)|301750
void grouped_wgmma_kernel<32, 4, 0, float>(float *, const __nv_bfloat16 *)|(44, 128, 1)|149840
void attention_tc_kernel<256>(__nv_bfloat16 *, float *)|(8, 8, 4)|40080
attention_fold_kernel(__nv_bfloat16 *, const float *, long, int, int)|(4096, 1, 1)|9460
void rmsnorm_rows_kernel<1, 3, 128, 4>(__nv_bfloat16 *, const __nv_bfloat16 *)|(256, 1, 1)|5070
nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT|(2, 64, 1)|19140
void grouped_gemm_kernel<2, 64, 4, 1, 1, __nv_bfloat16>(__nv_bfloat16 *, const __nv_bfloat16 *)|(22, 128, 1)|302110
route_kernel(int *, int *, int *, void **)|(1, 1, 1)|4550
a_kernel_of_its_own(int)|(7, 1, 1)|1234
stats_kernel(dg_row_stats *, float *, long)|(32, 256, 1)|658010
void rmsnorm_rows_kernel<0, 0, 128, 4>(__nv_bfloat16 *, const __nv_bfloat16 *)|(256, 1, 1)|3380
probs_vec_kernel<__nv_bfloat16>(__nv_bfloat16 *, const float *)|(256, 128, 1)|100480
stats_kernel(dg_row_stats *, float *, long)|(32, 256, 1)|656000
void rmsnorm_rows_kernel<0, 0, 128, 4>(__nv_bfloat16 *, const __nv_bfloat16 *)|(256, 1, 1)|3390
EOF
}

# the CSV as ncu prints it (a comma in a value becomes a thousands separator)
{
    echo '==PROF== Connected to process 512 (build/bench/gpu/bench-generate)'
    echo 'tp 1, CUDA graphs off; preset 26b'
    echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
    i=0
    rows | while IFS='|' read -r name grid ns; do
        printf '"%d","512","bench-generate","127.0.0.1","%s","1","7","(128, 1, 1)","%s","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","%s"\n' \
            "$i" "$name" "$grid" "$(echo "$ns" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta')"
        i=$((i + 1))
    done
    echo '==PROF== Disconnected from process 512'
} > "$tmp/ncu.csv"

# step N (0-based) by awk from the rows: launches and microseconds
expect() {
    rows | awk -F'|' -v want="$1" '
        { if (step == want) { n++; us += $3 / 1000 } }
        /^stats_kernel/ { step++ }
        END { printf "%d %.1f\n", n, us }'
}
# the total line of the script's first table: launches and microseconds
total() { sed -n 's/^| \*\*total\*\* | \*\*\([0-9]*\)\*\* | \*\*\([0-9.,]*\)\*\* .*/\1 \2/p' "$1" | tr -d ,; }
group() { grep -F "| $2 |" "$1" | head -1 | awk -F'|' '{gsub(/[ ,]/, "", $3); gsub(/[ ,]/, "", $4); print $3, $4}'; }

for st in 0 1 2; do
    if run "step$st" 0 python3 "$S" "$tmp/ncu.csv" --step "$st"; then
        got=$(total "$tmp/step$st.out") want=$(expect "$st")
        [ "$got" = "$want" ] && ok "step${st}_total" ||
            bad "step${st}_total" "script '$got', awk '$want'"
    fi
done

# step 1's groups: the two expert GEMMs, attention and its fold, the row
# kernels, the statistics kernel that ends it, a kernel no rule names
o=$tmp/step1.out
[ "$(group "$o" "experts' grouped GEMMs")" = "3 753.7" ] && ok experts ||
    bad experts "$(group "$o" "experts' grouped GEMMs")"
[ "$(group "$o" "attention")" = "2 49.5" ] && ok attention || bad attention "$(group "$o" attention)"
[ "$(group "$o" "row kernels (RMSNorm, add, feed-forward combine)")" = "1 5.1" ] && ok rows ||
    bad rows "$(group "$o" "row kernels (RMSNorm, add, feed-forward combine)")"
[ "$(group "$o" "sampler (statistics, probabilities, fold)")" = "1 658.0" ] && ok sampler ||
    bad sampler "$(group "$o" "sampler (statistics, probabilities, fold)")"
[ "$(group "$o" "a_kernel_of_its_own")" = "1 1.2" ] && ok own_group ||
    bad own_group "$(group "$o" a_kernel_of_its_own)"
# step 2's sampler group: the probabilities' kernel (vector form) with the
# statistics kernel that ends the step
g=$(group "$tmp/step2.out" "sampler (statistics, probabilities, fold)")
[ "$g" = "2 756.5" ] && ok sampler_probs || bad sampler_probs "$g"
# the second table longest first: the statistics kernel, then the gate/up
# GEMM's two launches as one row, with the time a launch
k=$(grep '^| `' "$o" | head -2)
if [ "$(echo "$k" | head -1 | cut -d'|' -f2,5,6)" = ' `stats_kernel` | 1 | 658.0 ' ] &&
   [ "$(echo "$k" | tail -1)" = '| `grouped_gemm_kernel<2, 64, 4, 1, 1, __nv_bfloat16>` | (22, 128, 1) | (128, 1, 1) | 2 | 603.9 | 301.93 |' ]
then ok longest_first; else bad longest_first "$k"; fi

# past the last statistics kernel; no statistics kernel at all
run past 1 python3 "$S" "$tmp/ncu.csv" --step 3 && has past err "too few" && ok past_the_end ||
    bad past_the_end "$(cat "$tmp/past.err")"
grep -v stats_kernel "$tmp/ncu.csv" > "$tmp/none.csv"
run none 1 python3 "$S" "$tmp/none.csv" && has none err "0 sampler statistics kernels" &&
    ok no_statistics || bad no_statistics "$(cat "$tmp/none.err")"

[ $fails -eq 0 ]
