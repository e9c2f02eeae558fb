#!/usr/bin/env bash
# Twenty-second session, run 2: the d128 backward in CTA pairs (bwd_kernel.cuh kPair: the pair
# adds its dQ in shared memory, one reduce per pair; run 1's probe said the dQ bytes cost the
# step 7.5 %). Before starting: `rm -rf .base && mkdir .base && git archive c3845a6 cpp python
# | tar -x -C .base` (the kernels before the pair; carry [".base", ".xdist"]).
#   - base build (d128) in the background, the default build;
#   - smoke, stopping the job on a failure or hang: the pair's own test, the d128 full
#     backward cases, the first-store tests;
#   - the suite (4 xdist processes), FORCE_SM80 test_kvcache + test_bwd, compute-sanitizer
#     (its subset has a pair case now);
#   - bwdab: base vs pairs, d128 bwd and fwd_bwd, interleaved twice, SDPA-cuDNN in each;
#   - ncu of the d128 backward at 2k full (the pair instance).
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s22run2.sh   (then `wait`)
set -u
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="fwdab decab chains bwdprof fncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests envab power probe"
export BASE_HEAD_DIMS="128" BWDAB_DIMS=128 BNCU_DIM=128 BNCU_SEQLEN=2048 BNCU_CAUSAL=0
export SMOKE_TESTS="tests/test_sm90_bwd.py::test_sm90_backward_cta_pairs tests/test_bwd_convert.py::test_dq_first_store_right"
export SMOKE_STOP=1 SMOKE_TIMEOUT=240 TEST_TIMEOUT=500
export SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py"
export PYTEST_XDIST="-n 4 --dist loadfile"
python3 -c "import xdist" || { echo "no pytest-xdist: the suite runs serially"; PYTEST_XDIST=""; }
bash scripts/gpu_job.sh
