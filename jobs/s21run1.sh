#!/usr/bin/env bash
# Prepared in the twentieth session for the next one (NOTES next list, item 1). Before
# starting: `git am /work/helpers/bwd_rotate_walk.patch /work/helpers/bwd_spread_walk.patch`
# (the rotated walk for non-deterministic full attention, then its starts spread over the
# query tiles; if that folder is gone, NOTES' twentieth session describes both), then
# `rm -rf .base && mkdir .base && git archive HEAD~2 cpp python | tar -x -C .base` (carry
# [".base"]). gpu_job.sh:
#   - the default build (rotated + spread) with the base build (neither) at once;
#   - the full suite, FORCE_SM80 test_kvcache / test_bwd, compute-sanitizer;
#   - bwdab: base vs rotated + spread (d64 / d128, bwd and fwd_bwd, interleaved twice,
#     SDPA-cuDNN in each);
#   - probe: rotated only (-DFLASHATTN2_BWD_NO_SPREAD) vs rotated + spread (bwd);
#   - ncu of the d128 backward at 2k full (map it with scripts/ncu_lines.py: is warp 2's
#     ticket / flag handshake and the consumers' kBarDqEmpty wait gone?).
# Then keep the best of the three and remove the NO_SPREAD switch (or the spread).
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s21run1.sh   (then `wait`)
set -u
export SKIP="fwdab decab chains bwdprof fncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests envab power"
export BASE_HEAD_DIMS="64;128" BWDAB_DIMS=64,128 BNCU_DIM=128 BNCU_SEQLEN=2048 BNCU_CAUSAL=0
export PROBE_FLAGS="-DFLASHATTN2_BWD_NO_SPREAD" PROBE_HEAD_DIMS="64;128"
export PROBE_ARGS="--modes bwd --headdims 64,128 --dtypes bf16 --impls flashattn2,sdpa_cudnn"
export SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py"
bash scripts/gpu_job.sh
