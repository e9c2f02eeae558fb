#!/usr/bin/env bash
# Prepared in the nineteenth session for the next one (NOTES next list, items 1-2). Before
# starting: `git am /work/helpers/bwd_lds_ahead.patch` (the LSE / dsum loads a tile ahead),
# `rm -rf .base && mkdir .base && git archive HEAD^ cpp python | tar -x -C .base` (carry
# [".base"]). Then: default build, the backward A/B (d64 / d128, bwd and fwd_bwd, interleaved
# base / new twice, SDPA-cuDNN in each; its fwd_bwd 512 causal rows are item 1's re-measure,
# with both builds), the full suite, FORCE_SM80 test_kvcache / test_bwd, compute-sanitizer.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s20run1.sh   (then `wait`)
set -u
export SKIP="fwdab decab chains bwdprof bncu fncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests probe envab power check"
export BASE_HEAD_DIMS="64;128"
O=${JOB_OUT:-gpu_logs}; mkdir -p "$O"
OUT=$O/build SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_DECODE=1 bash scripts/gpu_check.sh | tail -n 3
(cd /tmp && python3 -c "import flashattn2._C") || { echo "no module: stop"; exit 1; }
bash scripts/gpu_job.sh
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=900 \
    PYTEST_ARGS=--ignore=tests/test_distributed.py TESTS=tests \
    SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh | tail -n 14
