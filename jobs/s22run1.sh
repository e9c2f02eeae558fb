#!/usr/bin/env bash
# Prepared in the twenty-first session for the next one (NOTES next list, items 1 and 2).
# Before starting: `rm -rf .base && mkdir .base && git archive HEAD cpp python | tar -x -C .base
# && (cd .base && patch -p1 < ../jobs/s22_probe_no_dq_bytes.patch)` (carry [".base"]; the
# patch: in .base/cpp/sm90/bwd_dq.cuh, dq_reduce_staged's `if (row < rows && tiles > 0)`
# becomes `if (false && ...)`, so warp 2 issues no dQ reduce or store and every barrier,
# ticket and flag stays; SASS of the d128 first-store instance: UBLKRED / UBLKCP 8 -> 0,
# HGMMA unchanged). Measurement only: that build's dQ is wrong.
#   - the default build (d64, d128: nothing else is measured), then the probe build (d128);
#   - bwdab: the probe ("bbase") vs this tree ("bnew"), d128 bwd, interleaved twice, SDPA-cuDNN
#     in each: what the dQ bytes cost the step (the 2k full wait at kBarDqEmpty, 7.9 % of the
#     stall samples, that two staging buffers did not remove);
#   - xncu: the d128 forward at 2k full (b8, its one length under cuDNN in every round of the
#     twenty-first session's run 2) and the d64 forward at 512 full (b32: where the per-tile
#     fixed cost weighs most, scripts/tile_overhead.py), ours and cuDNN, and cuDNN at 4k too
#     (is its 2k kernel another one? cuDNN runs 2k above its own length fit, forward and
#     backward, NOTES twenty-first session), ours and cuDNN: kernel names, grid,
#     duration, tensor pipe, L2 hit rate, and source counters (ours: map them with
#     scripts/ncu_lines.py on a local compile, as the twentieth session did).
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s22run1.sh   (then `wait`)
set -u
export SKIP="check fwdab decab chains bwdprof fncu bncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests probe envab power smoke"
export BASE_HEAD_DIMS="128" BWDAB_DIMS=128 BWDAB_ARGS="--modes bwd"
export XNCU="fwd:ours:128:2048:0:8 fwd:cudnn:128:2048:0:8 fwd:cudnn:128:4096:0:4 fwd:ours:64:512:0:32 fwd:cudnn:64:512:0:32"
export XNCU_SOURCE=1
O=${JOB_OUT:-gpu_logs}; mkdir -p "$O"
OUT=$O/build HEAD_DIMS="64;128" SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_DECODE=1 \
    bash scripts/gpu_check.sh | tail -n 3
(cd /tmp && python3 -c "import flashattn2._C") || { echo "no module: stop"; exit 1; }
bash scripts/gpu_job.sh
