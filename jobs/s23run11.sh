#!/usr/bin/env bash
# Twenty-third session, run 11: issue 20's decode sweep on the submitted decode kernel (d4e1c71:
# block-table entries clamped at their use), two rounds, pages 16 / 64 / 256 and the host part.
# d128 build only.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s23run11.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}; mkdir -p "$O"
HEAD_DIMS="128" bash scripts/build_only.sh "$O/build" || exit 1
for r in 1 2; do
    echo "=== $(date -Is) sweep round $r"
    python3 benchmarks/bench_decode.py --page-sizes 16,64,256 --parts decode,host \
        --out "$O/sweep_$r" 2>&1 | tail -n 12
done
