#!/usr/bin/env bash
# Twenty-second session, run 6: the dQ staging in the accumulator's order (bwd_dq.cuh dq_slot),
# so that warp 2 adds (or first-stores) a whole query tile with one 32 KiB bulk op instead of
# eight of 4 KiB (run 1's probe: the dQ bytes cost the d128 step 7-8 %; the pairs that halved
# them lost more in the exchange). Before starting: `rm -rf .base && mkdir .base && git archive
# c3845a6 cpp python | tar -x -C .base` (carry [".base", ".xdist"]).
#   - base build (d64, d128) in the background, the default build; smoke (test_bwd_convert.py:
#     first stores on NaN workspaces, deterministic orders; stops the job on a failure);
#   - bwdab: base vs new, d64 and d128 bwd, interleaved twice, SDPA-cuDNN in each;
#   - only if new wins (geomean of the four groups >= 1.003, none under 0.99): the suite
#     (4 xdist processes), FORCE_SM80 test_kvcache + test_bwd, compute-sanitizer.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s22run6.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests envab power probe"
export BASE_HEAD_DIMS="64;128" BWDAB_DIMS=64,128 BWDAB_ARGS="--modes bwd"
export SMOKE_TESTS="tests/test_bwd_convert.py" SMOKE_STOP=1 SMOKE_TIMEOUT=240
bash scripts/gpu_job.sh || exit 1
(cd "$O" && ln -sfn base_bbase envab9_base_1 && ln -sfn base_bbase2 envab9_base_2 &&
    ln -sfn base_bnew envab9_new_1 && ln -sfn base_bnew2 envab9_new_2)
python3 scripts/ab_compare.py "$O" --group 9 --specs base,new > "$O/ab.txt" 2>&1
sed -n '/^geomean/,$p' "$O/ab.txt"
if python3 - "$O/ab.txt" <<'PY'
import math, re, sys
g = [float(x) for x in re.findall(r": new ([0-9.]+)", open(sys.argv[1]).read())]
ok = len(g) == 4 and math.prod(g) ** (1 / len(g)) >= 1.003 and min(g) >= 0.99
print("groups", g, "win" if ok else "no win")
sys.exit(0 if ok else 1)
PY
then
    echo "=== $(date -Is) new wins: the suite"
    PYTEST_XDIST="-n 4 --dist loadfile"
    python3 -c "import xdist" || PYTEST_XDIST=""
    OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=500 \
        PYTEST_ARGS="--ignore=tests/test_distributed.py $PYTEST_XDIST" TESTS=tests \
        SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh
else
    echo "=== $(date -Is) no win: no suite"
fi
