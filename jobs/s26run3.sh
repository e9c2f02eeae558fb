#!/usr/bin/env bash
# Twenty-sixth session, run 3: the float32 forward's Q prologue by cp.async. The consumers
# split Q (d128 3xTF32: Q lo; the single-TF32 instances: Q hi) into shared memory with a
# rolled load-split-store loop whose volatile asm kept each 16-byte load behind the previous
# store: 16 global latencies per CTA at d128 (8 at d64 single) before the first tile, ~8 % of
# a 1k CTA by the 1k / 4k TFLOP/s gap. Now cp.async of the raw rows into place (in flight
# with the Q hi loads), one wait, the split in place. SASS: producer spill 24 bytes (d128
# 3xTF32) / 8 (d64 single) in its key loop, from ptxas's allocation of the unchanged producer.
# A/B against 7b9c414 (.base), interleaved, 2 rounds: ieee d128 fwd (group 1), tf32 d64 / d128
# fwd (group 2), full and causal 1k-8k, SDPA efficient / math in each.
#   rm -rf .base && mkdir .base && git archive 7b9c414 cpp python | tar -x -C .base
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s26run3.sh
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest probe ptests power"
export SMOKE_TESTS="tests/test_fp32wg.py tests/test_fp32_tf32.py" SMOKE_STOP=1 SMOKE_TIMEOUT=300
export BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="1 2"
export ENVAB_1="base=PYTHONPATH:/tmp/base new="
export ENVAB_2="base=PYTHONPATH:/tmp/base new="
A="--no-summary --seqlens 1024,2048,4096,8192 --dtypes fp32 --modes fwd --impls flashattn2,sdpa_efficient,sdpa_math"
export ENVAB_1_ARGS="$A --headdims 128 --fp32-precision ieee"
export ENVAB_2_ARGS="$A --headdims 64,128 --fp32-precision tf32"
bash scripts/gpu_job.sh
echo "=== $(date -Is) done"
