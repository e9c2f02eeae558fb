#!/usr/bin/env bash
# Twenty-third session, run 7: issue 20's decode sweep on the submitted decode kernel (unchanged
# since eea30b5), two rounds (the nineteenth session's was one, noisy at 1k), with the paged
# layouts the issue names (16, 64, 256); then split counts forced at batch 1 and 4 (does any
# count beat the heuristic's at b1 8k, 1.37x the floor?). d128 build only.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s23run7.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}; mkdir -p "$O"
HEAD_DIMS="128" bash scripts/build_only.sh "$O/build" || exit 1
for r in 1 2; do
    echo "=== $(date -Is) sweep round $r"
    python3 benchmarks/bench_decode.py --page-sizes 16,64,256 --parts decode,host \
        --out "$O/sweep_$r" 2>&1 | tail -n 14
done
for r in 1 2; do
    echo "=== $(date -Is) splits round $r"
    python3 benchmarks/bench_decode.py --batches 1,4 --cache-lens 1k,8k,32k --sq 1 --page-sizes= \
        --splits 8,16,24,48,64,96,128 --impls flashattn2,sdpa_cudnn,read_floor --parts decode \
        --no-summary --out "$O/splits_$r" 2>&1 | tail -n 3
done
