#!/bin/bash
# bench/perf/step-kernels.sh - one denoising step of the random 26B-A4B,
# kernel by kernel, on the GPU machine, over binaries built beforehand
# (make bench-build):
#
#   bench/perf/step-kernels.sh OUTDIR [BATCH] [-- BENCH-GENERATE OPTIONS]
#
# Runs bench-generate eagerly (one canvas of 3 steps, batch BATCH, default
# 1) under Nsight Compute with one metric, each launch's device time
# (--clock-control none: the clocks as they are; each launch runs alone and
# ncu flushes the caches before it, so small kernels read a little slow),
# then bench/perf/step_kernels.py prints the second step's launches in
# groups and its longest kernels.  Writes OUTDIR/ncu.csv and
# OUTDIR/step-kernels.md.  The first SKIP launches (default 8250: the
# random 26B-A4B's weights made on the GPU, as counted in run 74) are not
# profiled, which saves about two minutes; set SKIP=0 for another preset.
# COUNT launches are profiled after them (default 6000).  FP8's weights
# take about 7,000 launches more: SKIP=15500 COUNT=9000 (run 265).
set -o pipefail
out=${1:?usage: bench/perf/step-kernels.sh OUTDIR [BATCH] [-- BENCH-GENERATE OPTIONS]}
shift
batch=1
if [ $# -gt 0 ] && [ "$1" != "--" ]; then batch=$1; shift; fi
[ "${1:-}" = "--" ] && shift
build=${BUILD:-build}
bin=$build/bench/gpu/bench-generate
export NCCL_NVLS_ENABLE=0
mkdir -p "$out" || exit 1
[ -x "$bin" ] || { echo "step-kernels.sh: $bin missing: make bench-build first" >&2; exit 1; }
command -v ncu >/dev/null || { echo "step-kernels.sh: ncu (Nsight Compute) not found" >&2; exit 1; }
ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --launch-skip "${SKIP:-8250}" --launch-count "${COUNT:-6000}" \
    "$bin" --eager --no-ceilings --canvases 1 --steps 3 "$@" "$batch" \
    > "$out/ncu.csv" 2> "$out/ncu.err" || { tail -5 "$out/ncu.err" >&2; exit 1; }
python3 "$(dirname "$0")/step_kernels.py" "$out/ncu.csv" | tee "$out/step-kernels.md"
