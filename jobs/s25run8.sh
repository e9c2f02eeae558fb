#!/usr/bin/env bash
# Twenty-fifth session, run 8: the submitted tree (kernels as 231a10a, whose suite passed in run
# 5): build, smoke (the float32 test files), compute-sanitizer with sanitize_subset.py's float32
# cases at their final bounds, and the float32 standing numbers: bench.py d64 / d128 1k-8k,
# full and causal, fwd and bwd, flashattn2 against SDPA-efficient and -math, under ieee and tf32,
# two interleaved rounds.
#   WAIT=540 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s25run8.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab ptests probe power base"
export SMOKE_TESTS="tests/test_fp32_tf32.py tests/test_fp32wg.py tests/test_fp32wg_bwd.py tests/test_fp32wg_bwd128.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300
bash scripts/gpu_job.sh || exit 1
echo "=== $(date -Is) sanitizers"
OUT=$O/check SKIP_BUILD=1 SKIP_TESTS=1 SKIP_BENCH=1 SKIP_DECODE=1 bash scripts/gpu_check.sh | tail -n 12
for r in 1 2; do
    for prec in ieee tf32; do
        echo "=== $(date -Is) bench fp32 $prec round $r"
        timeout 200 python3 benchmarks/bench.py --out "$O/fp32_${prec}_$r" --no-summary \
            --headdims 64,128 --seqlens 1024,2048,4096,8192 --dtypes fp32 --modes fwd,bwd \
            --impls flashattn2,sdpa_efficient,sdpa_math --fp32-precision $prec 2>&1 | tail -n 1
    done
done
echo "=== $(date -Is) done"
