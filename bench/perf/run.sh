#!/bin/bash
# bench/perf/run.sh - the performance harness, on the GPU machine, over
# binaries built beforehand (make bench-build): nothing is compiled here.
#
#   bench/perf/run.sh OUTDIR [BATCHES...]        (default batches 1 4 16 32)
#
# One run measures, in this order and on the same machine:
#   - the ceilings (device copy bandwidth, bf16 GEMM rate; beside them the
#     L2's read rate) and dgemma's
#     whole generations at TP=1 for every batch size (bench-generate:
#     prompt 512, 4 canvases of 256, 16 denoising steps each, CUDA graphs);
#   - the same with FP8 weights (W8A8: --fp8), TP=1;
#   - the same at TP=2 where two GPUs are visible, and at TP=4 where four are;
#   - a profiled run at batch 1 (each stage's time against its floor) at
#     TP=1, and at TP=2 and TP=4 where their GPUs are (rank 0's stages: the
#     sampler + self-conditioning share of a step at that TP);
#   - Hugging Face transformers on the same workload (bench/perf/hf_generate.py;
#     the best of 3 generates at batch 1 and 4, where its pace varies most;
#     where it fails, say out of GPU memory, the table goes without it);
# which GPUs ran it (board.csv: each one's VBIOS and InfoROM, and the
# driver); while dgemma runs, nvidia-smi samples every GPU's clocks, power,
# temperature, utilization and clock event reasons once a second, each
# sample timed (OUTDIR/clocks.csv: the same code reads apart on two starts
# of the same kind when those differ); then bench/perf/report.py prints the
# GPU's name and its conditions while busy, the table, with the ratios to
# Hugging Face, and the conditions within each dgemma run (bench-generate's
# rows say when each ran), and writes OUTDIR/perf.json and
# OUTDIR/tokens_per_s.png.
# Keep NCCL's NVLink multicast off (the lent machines require it).
set -o pipefail
out=${1:?usage: bench/perf/run.sh OUTDIR [BATCHES...]}
shift
batches=${*:-1 4 16 32}
build=${BUILD:-build}
bin=$build/bench/gpu/bench-generate
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$out" || exit 1
[ -x "$bin" ] || { echo "run.sh: $bin missing: make bench-build first" >&2; exit 1; }
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader \
    > "$out/gpu.txt" 2>&1
# which board each GPU is (its VBIOS and InfoROM) and the driver: H100s of
# two boards read the experts' stage 0.8 ms apart (docs/notes.md)
nvidia-smi --query-gpu=index,vbios_version,inforom.img,driver_version --format=csv,noheader \
    > "$out/board.csv" 2>&1
# the samples (clocks.csv's first line names its columns; the reasons'
# field has another name on older drivers, and none on the oldest)
q=timestamp,index,utilization.gpu,clocks.sm,clocks.mem,power.draw,temperature.gpu
for r in clocks_event_reasons.active clocks_throttle_reasons.active; do
    if nvidia-smi --query-gpu=$q,$r --format=csv,noheader,nounits >/dev/null 2>&1; then
        q=$q,$r
        break
    fi
done
echo "# $q" > "$out/clocks.csv"
nvidia-smi --query-gpu=$q --format=csv,noheader,nounits -l 1 >> "$out/clocks.csv" 2>&1 &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
"$bin" --json "$out/tp1.json" $batches 2>&1 | tee "$out/tp1.log" || exit 1
"$bin" --fp8 --json "$out/tp1-fp8.json" $batches 2>&1 | tee "$out/tp1-fp8.log" ||
    exit 1
for tp in 2 4; do
    [ "$ngpu" -ge $tp ] || continue
    "$bin" --tp $tp --json "$out/tp$tp.json" $batches 2>&1 | tee "$out/tp$tp.log" || exit 1
done
"$bin" --profile --json "$out/profile.json" 1 2>&1 | tee "$out/profile.log" || exit 1
for tp in 2 4; do
    [ "$ngpu" -ge $tp ] || continue
    "$bin" --tp $tp --profile --json "$out/profile-tp$tp.json" 1 2>&1 |
        tee "$out/profile-tp$tp.log" || exit 1
done
kill $smi 2>/dev/null
wait $smi 2>/dev/null
# (on an 80 GB H100 transformers holds the model but not batch 16's
# activations: hf_generate.py keeps the batches before the one that ran out
# of memory; if it fails outright the table is printed without its rows)
rm -f "$out/hf.json"
python3 bench/perf/hf_generate.py tests/fixtures/released-26b-config.json "$out/hf.json" \
    --batches $batches --best-of 3 > "$out/hf.log" 2>&1
hf=$?
cat "$out/hf.log"
[ $hf -eq 0 ] || echo "run.sh: transformers failed (exit $hf; last line of $out/hf.log:" \
    "$(tail -n 1 "$out/hf.log" | cut -c1-160)): the table has no transformers rows" >&2
python3 bench/perf/report.py "$out"
