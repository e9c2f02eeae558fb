#!/usr/bin/env bash
# Nineteenth session, run 5 (the rotated backward loop, commit "Hopper backward: step t-1's dQ
# GEMM issued at the top of step t"): default build, then the backward A/B first (base =
# .base, the parent; d64 / d128, bwd and fwd_bwd, the default seqlens, causal and not,
# interleaved base / new twice, SDPA-cuDNN in each), then the full suite, FORCE_SM80
# test_kvcache / test_bwd, compute-sanitizer.
set -u
O=${JOB_OUT:-gpu_logs}; mkdir -p "$O"
export SKIP="fwdab decab chains bwdprof bncu fncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests probe envab power check"
export BASE_HEAD_DIMS="64;128"
echo "=== $(date -Is) build"
OUT=$O/build SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_DECODE=1 bash scripts/gpu_check.sh | tail -n 3
(cd /tmp && python3 -c "import flashattn2._C") || { echo "no module: stop"; exit 1; }
bash scripts/gpu_job.sh
echo "=== $(date -Is) tests"
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=900 \
    PYTEST_ARGS=--ignore=tests/test_distributed.py TESTS=tests \
    SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh | tail -n 14
echo "=== $(date -Is) done"
