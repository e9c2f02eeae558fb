#!/usr/bin/env bash
# Twenty-second session, run 4: the CTA pairs, third version (bwd_dq.cuh dq_pair_merge): the
# senders' blocks into a two-slot receive ring of the partner's shared memory, the owning
# consumer warps add the partner's block of step t - 1 into their staged one after staging
# step t (a step of slack both ways), warp 2 reduces the sums. Run 2's first version (no
# slack) ran 0.90x, run 3's second (the merge in warp 2) 0.66x. Before starting: `rm -rf .base
# && mkdir .base && git archive c3845a6 cpp python | tar -x -C .base` (carry [".base",
# ".xdist"]).
#   - base build (d128) in the background, the default build; smoke (stops the job on a
#     failure or hang); bwdab: base vs pairs, d128 bwd and fwd_bwd, interleaved twice;
#   - only if the pairs win (full attention geomean >= 1.005): the suite (4 xdist
#     processes), FORCE_SM80 test_kvcache + test_bwd, compute-sanitizer.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s22run4.sh   (then `wait`)
set -u
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests envab power probe"
export BASE_HEAD_DIMS="128" BWDAB_DIMS=128
export SMOKE_TESTS="tests/test_sm90_bwd.py::test_sm90_backward_cta_pairs tests/test_bwd_convert.py::test_dq_first_store_right"
export SMOKE_STOP=1 SMOKE_TIMEOUT=240
bash scripts/gpu_job.sh || exit 1
WIN_GROUPS="bf16 128 False" WIN_GEOMEAN=1.005 bash scripts/suite_if_win.sh
