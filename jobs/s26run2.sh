#!/usr/bin/env bash
# Twenty-sixth session, run 2: more wgmma groups in flight in the d128 3xTF32 forward's
# consumer chain (issue 21: fwd d128 1k 1.96x / causal 1.83x SDPA's fastest float32 backend,
# target 2x; ncu: consumer-bound, wgmma waits 14 % of the stall samples). The default build
# is the base (SASS identical to 7b9c414's); side builds:
#   probe:  -DFLASHATTN2_PROBE_FP32WG_SDEPTH=3 (S's k8 steps three groups deep, was two)
#   probe2: + -DFLASHATTN2_PROBE_FP32WG_PVQ=1 (P V as four 32-column chains, two in flight,
#           instead of two 64-column chains each drained before its FFMAs)
# Both 0 spills (ptxas), HGMMA 72 / 96. (Rejected: the probe switches were removed again; NOTES,
# twenty-sixth session, run 2, describes them.) Correctness of both side builds by test_fp32wg.py, then
# an interleaved A/B (2 rounds), fwd d128 full + causal 1k-8k, ieee, SDPA efficient / math.
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s26run2.sh
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="base suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power"
export HEAD_DIMS="128"
export SMOKE_TESTS="tests/test_fp32wg.py" SMOKE_STOP=1 SMOKE_TIMEOUT=300
export PROBE_FLAGS="-DFLASHATTN2_PROBE_FP32WG_SDEPTH=3"
export PROBE2_FLAGS="-DFLASHATTN2_PROBE_FP32WG_SDEPTH=3 -DFLASHATTN2_PROBE_FP32WG_PVQ=1"
export PROBE_HEAD_DIMS="128" PROBE_AB=0 PROBE_TESTS="tests/test_fp32wg.py"
export ENVAB_1="base= s3=PYTHONPATH:/tmp/probe s3pvq=PYTHONPATH:/tmp/probe2"
export ENVAB_1_ARGS="--no-summary --headdims 128 --seqlens 1024,2048,4096,8192 --dtypes fp32 --modes fwd --impls flashattn2,sdpa_efficient,sdpa_math --fp32-precision ieee"
bash scripts/gpu_job.sh
echo "=== $(date -Is) done"
