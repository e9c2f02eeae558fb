#!/usr/bin/env bash
# Thirty-first session, run 5: the submitted tree (whole-row decode copies, decode_full_rows)
# as a default build: build + selfcheck, issue 20's default decode sweep (first: it is what the
# session reports), then the suite as suite_if_win.sh runs it (pytest-xdist, FORCE_SM80
# test_kvcache + test_bwd, compute-sanitizer).
#   WAIT=570 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s31run5.sh   (carry .xdist)
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
mkdir -p "$O"
if [ -d .xdist ] && ! python3 -c "import xdist" 2> /dev/null; then
    python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
        python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
fi
echo "=== $(date -Is) build, selfcheck, decode sweep"
OUT=$O/build SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 DECODE_ARGS="--parts decode,host" \
    bash scripts/gpu_check.sh
echo "=== $(date -Is) the suite"
PYTEST_XDIST="-n 4 --dist loadfile"
python3 -c "import xdist" || PYTEST_XDIST=""
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=500 \
    PYTEST_ARGS="--ignore=tests/test_distributed.py $PYTEST_XDIST" TESTS=tests \
    SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh
echo "=== $(date -Is) done"
