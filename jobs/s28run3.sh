#!/usr/bin/env bash
# Twenty-eighth session, run 3 (the session's last ~430 s of device time; measurement only, not
# a submission: the suite did not fit): the float32 preprocess (dsum, zeroed dq / dq_accum)
# with a row's float4s over 16 (d64) / 32 (d128) lanes and four passes' loads in flight (was a
# warp a row, scalar loads, half the lanes idle at d64), against 3821a8f. Smoke (the float32
# backward tests, sm80 path and varlen / deterministic included), the torch profiler's kernel
# times of the 3xTF32 backward (new, then base) at d64 / d128, 1k causal, then an A/B of the
# 3xTF32 backwards at 1k / 2k (2 rounds). First:
#   rm -rf .base && mkdir .base && git archive 3821a8f cpp python | tar -x -C .base
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s28run3.sh
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest probe ptests power"
export HEAD_DIMS="32;64;128" BASE_HEAD_DIMS="64;128"
export SMOKE_TESTS="tests/test_fp32wg_bwd.py tests/test_fp32wg_bwd128.py tests/test_fp32_varlen.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=200
export ENVAB_GROUPS="2" ENVAB_2="base=PYTHONPATH:/tmp/base new="
export ENVAB_2_ARGS="--no-summary --seqlens 1024,2048 --dtypes fp32 --impls flashattn2,sdpa_efficient --headdims 64,128 --modes bwd --fp32-precision ieee"
export ENVAB_2_REPS=2
bash scripts/gpu_job.sh || exit 1
for b in new base; do
    echo "=== $(date -Is) bwd_profile fp32 ($b)"
    pp=""; [ "$b" = base ] && pp=/tmp/base
    PYTHONPATH=$pp timeout 60 python3 scripts/bwd_profile.py --dtype fp32 --headdims 64,128 \
        --seqlens 1024 --causal true 2>&1 | tail -n 4
done
echo "=== $(date -Is) done"
