#!/usr/bin/env bash
# Twentieth session, run 2. Working tree = HEAD + the d64 rotated backward loop (trial,
# uncommitted); `.base` = HEAD's cpp / python (carry [".base"]).
#   default build (+ the base build of d64, 90a, in the background)
#   -> backward A/B, d64 only, interleaved twice (bwd, fwd_bwd; SDPA-cuDNN in each)
#   -> ncu of the d128 backward at 2k full (its lowest point against cuDNN: 0.94x), sections
#      and source counters; the d128 forward at 4k full, ours and cuDNN (sections; ours'
#      source counters)
#   -> the full suite + FORCE_SM80 test_kvcache / test_bwd + compute-sanitizer.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s20run2.sh   (then `wait`)
set -u
export SKIP="fwdab decab chains bwdprof fncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests probe envab power check"
export BASE_HEAD_DIMS="64" BWDAB_DIMS=64 BNCU_DIM=128 BNCU_SEQLEN=2048 BNCU_CAUSAL=0
export XNCU="fwd:ours:128:4096:0:4 fwd:cudnn:128:4096:0:4" XNCU_SOURCE=1
O=${JOB_OUT:-gpu_logs}; mkdir -p "$O"
OUT=$O/build SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_DECODE=1 bash scripts/gpu_check.sh | tail -n 3
(cd /tmp && python3 -c "import flashattn2._C") || { echo "no module: stop"; exit 1; }
bash scripts/gpu_job.sh
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=900 \
    PYTEST_ARGS=--ignore=tests/test_distributed.py TESTS=tests \
    SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh | tail -n 14
