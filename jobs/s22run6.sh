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
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests envab power probe"
export BASE_HEAD_DIMS="64;128" BWDAB_DIMS=64,128 BWDAB_ARGS="--modes bwd"
export SMOKE_TESTS="tests/test_bwd_convert.py" SMOKE_STOP=1 SMOKE_TIMEOUT=240
bash scripts/gpu_job.sh || exit 1
WIN_GEOMEAN=1.003 WIN_MIN=0.99 bash scripts/suite_if_win.sh
