#!/usr/bin/env bash
# Prepared in the twentieth session for the next one (NOTES next list, item 1). Before
# starting: `git am /work/helpers/bwd_rotate_walk.patch` (the rotated walk for
# non-deterministic full attention; if that folder is gone: in cpp/sm90/bwd_kernel.cuh, the
# last argument of `DqOrder order(...)` p.deterministic -> true), then
# `rm -rf .base && mkdir .base && git archive HEAD^ cpp python | tar -x -C .base` (carry
# [".base"]). gpu_job.sh: both builds at once; the full suite, FORCE_SM80 test_kvcache /
# test_bwd, compute-sanitizer; the backward A/B (d64 / d128, bwd and fwd_bwd, interleaved
# twice, SDPA-cuDNN in each); ncu of the d128 backward at 2k full again (did warp 2's ticket
# handshake leave the profile? map it with scripts/ncu_lines.py).
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s21run1.sh   (then `wait`)
set -u
export SKIP="fwdab decab chains bwdprof fncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests probe envab power"
export BASE_HEAD_DIMS="64;128" BWDAB_DIMS=64,128 BNCU_DIM=128 BNCU_SEQLEN=2048 BNCU_CAUSAL=0
export SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py"
bash scripts/gpu_job.sh
