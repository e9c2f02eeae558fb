#!/usr/bin/env bash
# Twenty-third session, run 8: why paged 16 costs b16 +11 % at 1k (run 7: +6.5 % at 8k, +3-4 %
# at 32k-128k; b64 / b4 / b1 +1-3 %; pages 64 / 256 within 3 % everywhere). The block table in
# order (--page-order sequential: the contiguous cache's addresses, read through the table)
# against the shuffled one: equal -> the kernel's per-tile page handling; sequential at the
# contiguous speed -> the pages' placement (DRAM / TLB locality). d128 build only; b4 / 16 / 64
# x 1k / 8k / 32k, sq 1, pages 16 / 64 / 256, each order twice, interleaved.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s23run8.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}; mkdir -p "$O"
HEAD_DIMS="128" bash scripts/build_only.sh "$O/build" || exit 1
for r in 1 2; do
    for order in shuffled sequential; do
        echo "=== $(date -Is) $order round $r"
        python3 benchmarks/bench_decode.py --batches 4,16,64 --cache-lens 1k,8k,32k --sq 1 \
            --page-sizes 16,64,256 --page-order $order --impls flashattn2,read_floor \
            --parts decode --no-summary --out "$O/pages_${order}_$r" 2>&1 | grep -E "paged16|contiguous" | head -n 12
    done
done
