#!/usr/bin/env bash
# Prepared in the thirty-second session for the first session that is lent an H100 (the
# thirty-first and thirty-second had H200s only): the decode kernel's H200 changes measured on
# the GPU issue 20 names. base = 4161e73 (before them); new = this tree, which has
#   - whole-row K / V copies at d128 where a CTA reads >= 512 keys (2b0f3a5; on the H200 b16 8k
#     148.9 -> 125.2 us; the twenty-third session's 4 x 128-byte rows lost 1-5 % on an H100),
#   - the copy switches at compile time (6534eaa),
#   - block-table entries read 32 steps ahead (a1e5991; H200 paged 16 b16 +5-8 %).
#   rm -rf .base && mkdir .base && git archive 4161e73 cpp python | tar -x -C .base
#   WAIT=575 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s33_h100_decode_ab.sh   (kind
#   nvidia-h100-x1 or what status names; carry .base, .xdist), then `... gpu_detach.sh wait`.
# A/B (group 6, two rounds interleaved): contiguous and shuffled pages 16 / 64 / 256, sq 1 / 4,
# b 1-64, 1k-32k, d128, SDPA-cuDNN and the read floor in the same run. The suite runs either
# way (the tree is main's): a loss in some (layout, batch) says where decode_full_rows needs
# the device's bandwidth (NOTES, thirty-second session's list, item 2).
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power probe"
export SMOKE_TESTS="tests/test_decode_kernel.py tests/test_kvcache.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="6" ENVAB_6="base=PYTHONPATH:/tmp/base new="
export ENVAB_6_SCRIPT=benchmarks/bench_decode.py
export ENVAB_6_ARGS="--no-summary --parts decode --sq 1,4 --page-sizes 16,64,256 --cache-lens 1k,8k,32k --impls flashattn2,sdpa_cudnn,read_floor --batches 1,4,16,64"
bash scripts/gpu_job.sh || exit 1
if WIN_MIN=0 AB_GROUP=6 WIN_GEOMEAN=0 bash scripts/suite_if_win.sh; then :; fi
echo "=== $(date -Is) done"
