#!/usr/bin/env bash
# Twenty-sixth session, run 4: the submitted tree (the single-TF32 forward's Q prologue by
# cp.async; the 3xTF32 instances' SASS byte-identical to 7b9c414's). Smoke, the TF32 forward
# A/B against 7b9c414 (.base) once more on the final (spill-free) code, then the suite if it
# still wins (suite_if_win.sh: pytest-xdist, FORCE_SM80 test_kvcache + test_bwd, sanitizers).
#   rm -rf .base && mkdir .base && git archive 7b9c414 cpp python | tar -x -C .base
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s26run4.sh
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest probe ptests power"
export SMOKE_TESTS="tests/test_fp32wg.py tests/test_fp32_tf32.py" SMOKE_STOP=1 SMOKE_TIMEOUT=300
export BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="2"
export ENVAB_2="base=PYTHONPATH:/tmp/base new="
export ENVAB_2_ARGS="--no-summary --seqlens 1024,2048,4096,8192 --dtypes fp32 --modes fwd --impls flashattn2,sdpa_efficient,sdpa_math --headdims 64,128 --fp32-precision tf32"
bash scripts/gpu_job.sh || exit 1
AB_GROUP=2 WIN_GEOMEAN=1.01 WIN_MIN=0.99 bash scripts/suite_if_win.sh
echo "=== $(date -Is) done"
