#!/usr/bin/env bash
# Twenty-fifth session, run 5: the d64 single-TF32 backward without its lo tiles' room (225 ->
# 98 KiB, as the d128 cut) and with run 4's staged producer (56 / 224 registers); the d128
# single staging as committed. A/B against a4ad4d7 (.base), tf32 bwd d64 and d128, full and
# causal, 1k-8k, interleaved base new base new (group 8), against SDPA-efficient and -math;
# then the suite on this tree (the 3xTF32 instances' SASS is a4ad4d7's).
#   rm -rf .base && mkdir .base && git archive a4ad4d7 cpp python | tar -x -C .base
#   WAIT=540 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s25run5.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab ptests probe power"
export SMOKE_TESTS="tests/test_fp32_tf32.py tests/test_fp32wg_bwd.py tests/test_fp32wg_bwd128.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
bash scripts/gpu_job.sh || exit 1
for i in $(seq 60); do [ -d /tmp/base/flashattn2 ] && break; sleep 5; done
tail -n 2 "$O/base_build.txt"
[ -d /tmp/base/flashattn2 ] || { echo "=== no base build"; exit 1; }
for run in base_1 new_1 base_2 new_2; do
    pp=""; [[ $run == base* ]] && pp=/tmp/base
    echo "=== $(date -Is) tf32 $run"
    PYTHONPATH=$pp timeout 200 python3 benchmarks/bench.py --out "$O/envab8_$run" --no-summary \
        --headdims 64,128 --seqlens 1024,2048,4096,8192 --dtypes fp32 --modes bwd \
        --impls flashattn2,sdpa_efficient,sdpa_math --fp32-precision tf32 2>&1 | tail -n 1
done
python3 scripts/ab_compare.py "$O" --group 8 --specs base,new > "$O/ab8.txt" 2>&1
cat "$O/ab8.txt"
echo "=== $(date -Is) the suite"
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=500 \
    PYTEST_ARGS="--ignore=tests/test_distributed.py -n 4 --dist loadfile" TESTS=tests \
    SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh
echo "=== $(date -Is) done"
