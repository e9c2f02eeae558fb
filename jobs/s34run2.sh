#!/usr/bin/env bash
# Prepared in the thirty-third session (not measured: no device time left), for after
# jobs/s34run1.sh has landed the 2-warp CTAs: jobs/s33_decode_fused_merge.patch, the decode
# kernel's split-KV partials merged by the last split CTA of each (batch, head group) through
# a split counter (decode_kernel.cuh merge_splits; FwdParams::tile_counter, kept per stream by
# _launch._tile_counter and zeroed again by the kernel), instead of the combine kernel after
# the grid. Aim: the split calls (b <= 8), whose graph call costs ~2.4-2.6 us past the decode
# kernel for the combine (run 1's probe: b1 1k 12.3 us = ~3.9 launch + 5.9 kernel + 2.4; b1 8k
# 18.8 = 3.5 + 12.7 + 2.6); cuDNN 11.2 / 18.7. CPU-checked: no spills (d128 188-222, d64
# 124-136 registers), the CPU suite 1206 passed; its new GPU test
# (test_split_counters_are_kept_per_stream_and_left_zeroed) has not run.
#   rm -rf .base && mkdir .base && git archive HEAD cpp python | tar -x -C .base
#   git apply jobs/s33_decode_fused_merge.patch && git commit -am "..."
#   WAIT=575 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s34run2.sh   (carry .base, .xdist)
# A/B: group 6 d128 b1 / 2 / 4 / 8 x 1k-128k, sq 1 / 4, contiguous and paged 256; group 7 d64
# b1 / 4, 2 rounds; then issue 20's default sweep; the suite if group 6's geomean >= 1.003.
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power probe"
export SMOKE_TESTS="tests/test_decode_kernel.py tests/test_kvcache.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="6 7" ENVAB_6="base=PYTHONPATH:/tmp/base new=" ENVAB_7="base=PYTHONPATH:/tmp/base new="
export ENVAB_6_SCRIPT=benchmarks/bench_decode.py ENVAB_7_SCRIPT=benchmarks/bench_decode.py
export ENVAB_6_ARGS="--no-summary --parts decode --headdim 128 --sq 1,4 --page-sizes 256 --cache-lens 1k,8k,32k,128k --impls flashattn2,sdpa_cudnn,read_floor --batches 1,2,4,8"
export ENVAB_7_ARGS="--no-summary --parts decode --headdim 64 --sq 1 --page-sizes 256 --cache-lens 1k,8k,32k --impls flashattn2,sdpa_cudnn,read_floor --batches 1,4"
bash scripts/gpu_job.sh || exit 1
python3 scripts/ab_compare.py "$O" --group 7 --specs base,new > "$O/ab7.txt" 2>&1
sed -n '/^geomean/,$p' "$O/ab7.txt"
python3 benchmarks/bench_decode.py --out "$O/sweep" > "$O/sweep.txt" 2>&1
sed -n '/^Summary/,$p' "$O/sweep.txt"
if WIN_MIN=0.985 AB_GROUP=6 WIN_GEOMEAN=1.003 bash scripts/suite_if_win.sh; then :; fi
echo "=== $(date -Is) done"
