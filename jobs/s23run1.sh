#!/usr/bin/env bash
# Twenty-third session, run 1 (NOTES twenty-second session's list, items 1 and 2). Before
# starting: `rm -rf .base && mkdir .base && git archive c3845a6 cpp python | tar -x -C .base`
# (carry [".base", ".xdist"]).
#   - builds: this tree (d64, d128, d256), c3845a6 (base, d64 / d128) and a probe of this tree
#     with -DFLASHATTN2_PROBE_DQ_EVICT_LAST (warp 2's dQ reduces with an L2 evict-last policy,
#     d64 / d128) and -DFLASHATTN2_PROBE_D256_DQ_WARP_BULK (d256: one 8 KiB op per warp);
#   - ptests: test_bwd_convert + test_sm90_bwd on the probe (it changes the dQ path);
#   - bwdab: c3845a6 vs this tree, d64 / d128 bwd, interleaved twice, SDPA-cuDNN in each: the
#     H100 re-measure of 5d573c4 (one bulk op per query tile; its A/B ran on an H200 only);
#   - probe: the probe vs this tree, d64 / d128 / d256 bwd, interleaved twice.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s23run1.sh   (then `wait`)
set -u
export SKIP="suite smoke fwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab power"
export HEAD_DIMS="64;128;256" BASE_HEAD_DIMS="64;128" BWDAB_DIMS=64,128 BWDAB_ARGS="--modes bwd"
export PROBE_FLAGS="-DFLASHATTN2_PROBE_DQ_EVICT_LAST -DFLASHATTN2_PROBE_D256_DQ_WARP_BULK"
export PROBE_HEAD_DIMS="64;128;256"
export PROBE_TESTS="tests/test_bwd_convert.py tests/test_sm90_bwd.py"
export PROBE_ARGS="--modes bwd --headdims 64,128,256 --dtypes bf16 --impls flashattn2,sdpa_cudnn"
bash scripts/gpu_job.sh
