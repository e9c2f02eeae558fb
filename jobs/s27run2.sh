#!/usr/bin/env bash
# Twenty-seventh session, run 2 (prepared in the twenty-sixth, not run): the float32 backward
# producers' transposes with four row offsets a call (bwd_transpose_natural: row q_col +
# kColStep i + e of a transposed tile has row q_col + e's swizzle phase, so each store's row is
# an immediate) instead of the swizzle math per scalar store (ncu, run 6 of the twenty-fifth
# session: 10 % of the TF32 d128 backward's stall samples, 948 M instructions). SASS (CPU):
# producer instructions 652 -> 552 (3xTF32 d128), 650 -> 549 (d64), 1034 -> 826 (TF32 d128),
# 682 -> 594 (TF32 d64); 0 spills in all four units; HGMMA and STS counts unchanged. First:
#   rm -rf .base && mkdir .base && git archive HEAD cpp python | tar -x -C .base
#   git apply jobs/s27_fp32_bwd_transpose_offsets.patch
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s27run2.sh
# A/B against HEAD, bwd d64 / d128, full and causal, 1k-8k, ieee (group 1) and tf32 (group 2),
# then the suite if both groups win (suite_if_win.sh reads one group: group 2, the TF32 one,
# where the transposes were the top stall; check group 1's summary by eye).
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest probe ptests power"
export SMOKE_TESTS="tests/test_fp32wg_bwd.py tests/test_fp32wg_bwd128.py tests/test_fp32_tf32.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="1 2"
export ENVAB_1="base=PYTHONPATH:/tmp/base new=" ENVAB_2="base=PYTHONPATH:/tmp/base new="
A="--no-summary --seqlens 1024,2048,4096,8192 --dtypes fp32 --modes bwd --impls flashattn2,sdpa_efficient,sdpa_math --headdims 64,128"
export ENVAB_1_ARGS="$A --fp32-precision ieee" ENVAB_2_ARGS="$A --fp32-precision tf32"
bash scripts/gpu_job.sh || exit 1
AB_GROUP=2 WIN_GEOMEAN=1.01 WIN_MIN=0.99 bash scripts/suite_if_win.sh
echo "=== $(date -Is) done"
