#!/usr/bin/env bash
# Prepared in the twentieth session for the next one (NOTES next list, item 1). Before
# starting: `git am /work/helpers/bwd_rotate_walk.patch` (the rotated walk for
# non-deterministic full attention; if that folder is gone: in cpp/sm90/bwd_kernel.cuh, the
# last argument of `DqOrder order(...)` p.deterministic -> true), then
# `rm -rf .base && mkdir .base && git archive HEAD^ cpp python | tar -x -C .base` (carry
# [".base"]). Both builds at once; the backward A/B (d64 / d128, bwd and fwd_bwd, interleaved
# twice, SDPA-cuDNN in each); ncu of the d128 backward at 2k full again (did warp 2's ticket
# handshake leave the profile?); the full suite, FORCE_SM80 test_kvcache / test_bwd,
# compute-sanitizer.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s21run1.sh   (then `wait`)
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
    PYTHONPATH=$pp python3 benchmarks/bench.py --no-summary --out "$O/base_$run" \
        --modes bwd,fwd_bwd --headdims 64,128 --dtypes bf16 --impls flashattn2,sdpa_cudnn \
        2> /dev/null | tail -n 12
done
stamp "ncu: d128 bwd 2k full"
SOURCE="$O/src_bwd_d128_s2048_c0.csv" PASS=bwd HEAD_DIM=128 SEQLEN=2048 CAUSAL=0 \
    timeout 300 bash scripts/ncu.sh > /dev/null 2>&1
python3 scripts/sass_stalls.py "$O/src_bwd_d128_s2048_c0.csv" 2>&1 | tail -n 3
stamp suite
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=900 \
    PYTEST_ARGS=--ignore=tests/test_distributed.py TESTS=tests \
    SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh | tail -n 14
stamp done
