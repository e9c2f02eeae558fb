#!/usr/bin/env bash
# Twenty-fifth session, run 6: compute-sanitizer (memcheck, racecheck, synccheck) with
# scripts/sanitize_subset.py's new float32 cases (3xTF32 and single-TF32 instances, forward +
# backward, ragged tails: the staged producers' zero-filled cp.async), then ncu of the staged
# single-TF32 d128 backward (full 4k) for the next cut.
#   WAIT=540 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s25run6.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite smoke fwdab bwdab decab chains bwdprof fncu bncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab ptests probe power base"
export XNCU_SOURCE=1 XNCU="bwd:ours:128:4096:0:4:fp32:tf32"
bash scripts/gpu_job.sh || exit 1
echo "=== $(date -Is) sanitizers"
OUT=$O/check SKIP_BUILD=1 SKIP_TESTS=1 SKIP_BENCH=1 SKIP_DECODE=1 bash scripts/gpu_check.sh
grep -h "float32\|cases ok\|SUMMARY" "$O"/check/*.txt 2>/dev/null | head -40
echo "=== $(date -Is) done"
