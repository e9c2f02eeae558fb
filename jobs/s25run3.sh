#!/usr/bin/env bash
# Twenty-fifth session, run 3: where the Hopper float32 kernels' time goes (run 2: skipping
# warpgroup 0's diagonal tiles in the forward changed nothing, so the consumers' wgmma are not
# what bounds it). ncu sections and source counters (scripts/ncu.sh DTYPE=fp32, new) of the
# forward d128 causal 1k (1.90x SDPA's best, target 2x) and full 4k, and the d128 backward at 4k
# under 3xTF32 and single TF32 (a4ad4d7's kernels).
#   WAIT=540 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s25run3.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite smoke fwdab bwdab decab chains bwdprof fncu bncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab ptests probe power base"
export HEAD_DIMS=128 XNCU_SOURCE=1 XNCU="fwd:ours:128:1024:1:16:fp32:ieee fwd:ours:128:4096:0:4:fp32:ieee bwd:ours:128:4096:0:4:fp32:ieee bwd:ours:128:4096:0:4:fp32:tf32"
bash scripts/gpu_job.sh
echo "=== $(date -Is) done"
