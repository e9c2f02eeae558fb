#!/usr/bin/env bash
# Twentieth session, run 3 (the last ~580 s of device time: both builds at once). Working
# tree = HEAD + the rotated walk for non-deterministic full attention
# (cpp/sm90/bwd_kernel.cuh: DqOrder's may_rotate true); `.base` = HEAD's cpp / python
# (carry [".base"]).
#   the default build and, at the same time, the base build (d64 / d128, 90a; gpu_job.sh's
#   base step, inlined here to overlap the two)
#   -> backward A/B, d64 / d128, bwd only, interleaved twice (SDPA-cuDNN in each)
#   -> the full suite + compute-sanitizer (no FORCE_SM80 step: no mma.sync code changed;
#      run 2 ran it on the same python).
#   WAIT=480 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s20run3.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}; mkdir -p "$O"
stamp() { echo "=== $(date -Is) $*"; }
rm -rf /tmp/base_src && mkdir -p /tmp/base_src
tar --exclude=./build --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/base_src
for d in cpp python; do rm -rf "/tmp/base_src/$d" && cp -r ".base/$d" "/tmp/base_src/$d"; done
stamp builds
( cd /tmp/base_src && python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/base_whl . \
    -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=64;128" \
    -C build-dir=/tmp/build-base && rm -rf /tmp/base && python3 -m zipfile -e /tmp/base_whl/*.whl /tmp/base ) \
    > "$O/base_build.txt" 2>&1 &
BASE_PID=$!
OUT=$O/build SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_DECODE=1 bash scripts/gpu_check.sh | tail -n 3
(cd /tmp && python3 -c "import flashattn2._C") || { echo "no module: stop"; exit 1; }
wait $BASE_PID; tail -n 1 "$O/base_build.txt"
stamp "backward A/B"
for run in bbase bnew bbase2 bnew2; do
    pp=""; [[ $run == bbase* ]] && pp=/tmp/base
    PYTHONPATH=$pp python3 benchmarks/bench.py --no-summary --out "$O/base_$run" --modes bwd \
        --headdims 64,128 --dtypes bf16 --impls flashattn2,sdpa_cudnn 2> /dev/null | tail -n 12
done
stamp suite
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 SKIP_SM80_TESTS=1 TEST_TIMEOUT=900 \
    PYTEST_ARGS=--ignore=tests/test_distributed.py TESTS=tests bash scripts/gpu_check.sh | tail -n 14
stamp done
