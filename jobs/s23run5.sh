#!/usr/bin/env bash
# Twenty-third session, run 5: issue 20's host target (an eager flash_attn_with_kvcache call at
# most SDPA's host time; the nineteenth session's sweep: ours 73.0 us, SDPA-flash 56.8,
# cuDNN 126.4 on a fresh machine; the eighteenth's 37.8 vs 42.8). Build d128 only, then
# scripts/host_profile.py (per-call times and a cProfile of ours) and bench_decode.py's host
# part, twice each. (It ran a rewrite of scripts/host_profile.py, 2a5d597's, with --top;
# the original, with --mock, was restored afterwards with SDPA-flash added to its GPU rows.)
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s23run5.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}; mkdir -p "$O"
HEAD_DIMS="128" bash scripts/build_only.sh "$O/build" || exit 1
for r in 1 2; do
    python3 scripts/host_profile.py --calls 500 --top 40 > "$O/host_profile_$r.txt" 2>&1
    head -n 4 "$O/host_profile_$r.txt"
    python3 benchmarks/bench_decode.py --parts host --impls flashattn2,sdpa_flash,sdpa_cudnn \
        --no-summary --out "$O/host_$r" 2>&1 | tail -n 4
done
