#!/usr/bin/env bash
# Twenty-fourth session, run 2: the float32 single-TF32 instances (FwdParams / BwdParams
# fp32_tf32, taken where PyTorch allows TF32 for float32 matmuls), uncommitted on 3a6c1c0.
#   - build (default, every head dim: the suite's);
#   - smoke: the float32 wgmma test files and the new tests/test_fp32_tf32.py (stop on a failure);
#   - bench.py float32 d64 / d128, 1k-8k, full and causal, fwd and bwd, flashattn2 against
#     SDPA-efficient and SDPA-math, under --fp32-precision ieee and tf32 (SDPA's backends under
#     the same setting), two interleaved rounds;
#   - the suite (4 xdist processes), FORCE_SM80 test_kvcache + test_bwd, sanitizers.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s24run2.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab ptests probe power"
export SMOKE_TESTS="tests/test_fp32_tf32.py tests/test_fp32wg.py tests/test_fp32wg_bwd.py tests/test_fp32wg_bwd128.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=400
bash scripts/gpu_job.sh || exit 1
for r in 1 2; do
    for prec in ieee tf32; do
        echo "=== $(date -Is) bench fp32 $prec round $r"
        timeout 300 python3 benchmarks/bench.py --out "$O/fp32_${prec}_$r" --no-summary \
            --headdims 64,128 --seqlens 1024,2048,4096,8192 --dtypes fp32 --modes fwd,bwd \
            --impls flashattn2,sdpa_efficient,sdpa_math --fp32-precision "$prec" \
            > "$O/fp32_${prec}_$r.txt" 2>&1
        tail -40 "$O/fp32_${prec}_$r.txt"
    done
done
echo "=== $(date -Is) the suite"
PYTEST_XDIST="-n 4 --dist loadfile"
python3 -c "import xdist" || PYTEST_XDIST=""
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=500 \
    PYTEST_ARGS="--ignore=tests/test_distributed.py $PYTEST_XDIST" TESTS=tests \
    SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh
echo "=== $(date -Is) done"
