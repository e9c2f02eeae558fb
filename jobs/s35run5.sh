#!/usr/bin/env bash
# Thirty-fifth session, run 5 (the landing of 129226e, ~440 s): the query-rows epilogue
# (jobs/s34_decode_epilogue_rows.patch, measured in runs 1-4) and the NaN-cache test.
#   rm -rf .base && mkdir .base && git archive 0fc4b4d cpp python | tar -x -C .base
#   WAIT=575 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s35run5.sh   (carry .base, .xdist)
# Builds: main (this tree, every head dim: the suite runs on it) and base (.base, d64 / d128).
# Smoke: the decode and KV-cache tests. A/B: group 6 d128 b1 / 4 / 16 / 64 x 1k / 8k, sq 1 / 4,
# contiguous and paged 256, 2 rounds, for the record. The patch was measured four times
# already, so the suite runs unless the A/B shows a regression (geomean >= 0.997, each group
# >= 0.985).
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power probe"
export SMOKE_TESTS="tests/test_decode_kernel.py tests/test_kvcache.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="6" ENVAB_6="base=PYTHONPATH:/tmp/base new="
export ENVAB_6_SCRIPT=benchmarks/bench_decode.py
export ENVAB_6_ARGS="--no-summary --parts decode --headdim 128 --sq 1,4 --page-sizes 256 --cache-lens 1k,8k --impls flashattn2,sdpa_cudnn,read_floor --batches 1,4,16,64"
bash scripts/gpu_job.sh || exit 1
if WIN_MIN=0.985 AB_GROUP=6 WIN_GEOMEAN=0.997 bash scripts/suite_if_win.sh; then :; fi
echo "=== $(date -Is) done"
