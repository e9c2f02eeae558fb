#!/usr/bin/env bash
# Twenty-seventh session, run 4: the submitted tree (b9c9ec4: tile-major causal grids in the
# forward d128 and backward d64 only; each float32 wgmma unit's SASS byte-identical to a build
# measured in run 3). Build, smoke, A/B of the causal rows against 0c8f254 (fwd and bwd, d64 /
# d128, 1k-4k, both precisions, SDPA-efficient in the same run: the fastest causal float32
# backend), then the suite as suite_if_win.sh runs it (pytest-xdist, FORCE_SM80 test_kvcache +
# test_bwd, sanitizers). First:
#   rm -rf .base && mkdir .base && git archive 0c8f254 cpp python | tar -x -C .base
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s27run4.sh
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest probe ptests power"
export SMOKE_TESTS="tests/test_fp32wg.py tests/test_fp32wg_bwd.py tests/test_fp32wg_bwd128.py tests/test_fp32_tf32.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="1 2"
export ENVAB_1="base=PYTHONPATH:/tmp/base new=" ENVAB_2="base=PYTHONPATH:/tmp/base new="
A="--no-summary --seqlens 1024,2048,4096 --dtypes fp32 --impls flashattn2,sdpa_efficient --headdims 64,128 --modes fwd,bwd --causal true"
export ENVAB_1_ARGS="$A --fp32-precision ieee" ENVAB_2_ARGS="$A --fp32-precision tf32"
bash scripts/gpu_job.sh || exit 1
PYTEST_XDIST="-n 4 --dist loadfile"
python3 -c "import xdist" || PYTEST_XDIST=""
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=500 \
    PYTEST_ARGS="--ignore=tests/test_distributed.py $PYTEST_XDIST" TESTS=tests \
    SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh
echo "=== $(date -Is) done"
