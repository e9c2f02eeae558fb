#!/usr/bin/env bash
# Twenty-sixth session, run 1 (prepared in the twenty-fifth, not run: its device budget was
# spent): the d128 single-TF32 backward's warpgroup 1 computes P^T itself (S^T = K Q^T, K hi
# from shared memory by SS, issued with its dP^T), no P^T hand-off from warpgroup 0 (whose
# named barrier was 11 % of the stall samples, run 6 of the twenty-fifth session); 169.5 KiB,
# 0 spills, HGMMA 48 -> 64, the 3xTF32 instance's SASS unchanged. First:
#   git apply jobs/s26_fp32_tf32_bwd128_own_pt.patch   (against 3068fb1; applies to later commits too)
#   rm -rf .base && mkdir .base && git archive 3068fb1 cpp python | tar -x -C .base
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s26run1.sh
# A/B against 3068fb1, tf32 bwd d128 full and causal 1k-8k (group 8), interleaved base new base
# new, against SDPA-efficient and -math; the suite if both groups' geomeans >= 1.01.
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab ptests probe power"
export SMOKE_TESTS="tests/test_fp32_tf32.py tests/test_fp32wg_bwd128.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="128"
bash scripts/gpu_job.sh || exit 1
for i in $(seq 60); do [ -d /tmp/base/flashattn2 ] && break; sleep 5; done
[ -d /tmp/base/flashattn2 ] || { echo "=== no base build"; exit 1; }
for run in base_1 new_1 base_2 new_2; do
    pp=""; [[ $run == base* ]] && pp=/tmp/base
    echo "=== $(date -Is) tf32 $run"
    PYTHONPATH=$pp timeout 200 python3 benchmarks/bench.py --out "$O/envab8_$run" --no-summary \
        --headdims 128 --seqlens 1024,2048,4096,8192 --dtypes fp32 --modes bwd \
        --impls flashattn2,sdpa_efficient,sdpa_math --fp32-precision tf32 2>&1 | tail -n 1
done
AB_GROUP=8 WIN_GEOMEAN=1.01 WIN_MIN=1.0 bash scripts/suite_if_win.sh
echo "=== $(date -Is) done"
