#!/usr/bin/env bash
# Twenty-sixth session, run 5: the suite on the submitted tree (the cp.async Q prologue in the
# single-TF32 d128 forward only: its SASS byte-identical to run 4's measured build; the other
# float32 forward units byte-identical to 7b9c414's). Build, smoke, then the suite as
# suite_if_win.sh runs it (pytest-xdist, FORCE_SM80 test_kvcache + test_bwd, sanitizers).
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s26run5.sh
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="base suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab probe ptests power"
export SMOKE_TESTS="tests/test_fp32wg.py tests/test_fp32_tf32.py" SMOKE_STOP=1 SMOKE_TIMEOUT=300
bash scripts/gpu_job.sh || exit 1
PYTEST_XDIST="-n 4 --dist loadfile"
python3 -c "import xdist" || PYTEST_XDIST=""
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=500 \
    PYTEST_ARGS="--ignore=tests/test_distributed.py $PYTEST_XDIST" TESTS=tests \
    SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh
echo "=== $(date -Is) done"
