#!/usr/bin/env bash
# Twenty-fifth session, run 2: skip steps in the Hopper float32 kernels. The forward's
# warpgroup 0 skips the key tiles right of its last row (causal: the diagonal's right half), the
# d64 backward's warpgroup 1 the query tiles left of its first key, as sm90/fwd_kernel.cuh does
# for bf16: the stage is waited for and released, no wgmma. A/B against a4ad4d7 (.base), causal
# d64 / d128 1k-8k fwd and bwd, interleaved base new base new, under ieee (group 7: 3xTF32
# against SDPA-efficient) and tf32 (group 8: + SDPA-math); the suite only on an ieee win.
#   rm -rf .base && mkdir .base && git archive a4ad4d7 cpp python | tar -x -C .base
#   WAIT=540 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s25run2.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab ptests probe power"
export SMOKE_TESTS="tests/test_fp32_tf32.py tests/test_fp32wg.py tests/test_fp32wg_bwd.py tests/test_fp32wg_bwd128.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
bash scripts/gpu_job.sh || exit 1
for i in $(seq 60); do [ -d /tmp/base/flashattn2 ] && break; sleep 5; done
tail -n 2 "$O/base_build.txt"
[ -d /tmp/base/flashattn2 ] || { echo "=== no base build"; exit 1; }
for prec in ieee tf32; do
    g=7; impls=flashattn2,sdpa_efficient
    [ $prec = tf32 ] && { g=8; impls=flashattn2,sdpa_efficient,sdpa_math; }
    for run in base_1 new_1 base_2 new_2; do
        pp=""; [[ $run == base* ]] && pp=/tmp/base
        echo "=== $(date -Is) $prec $run"
        PYTHONPATH=$pp timeout 200 python3 benchmarks/bench.py --out "$O/envab${g}_$run" --no-summary \
            --headdims 64,128 --seqlens 1024,2048,4096,8192 --causal true --dtypes fp32 \
            --modes fwd,bwd --impls $impls --fp32-precision $prec 2>&1 | tail -n 3
    done
done
python3 scripts/ab_compare.py "$O" --group 8 --specs base,new > "$O/ab8.txt" 2>&1
sed -n '/^geomean/,$p' "$O/ab8.txt"
AB_GROUP=7 WIN_GEOMEAN=1.01 bash scripts/suite_if_win.sh
echo "=== $(date -Is) done"
