#!/usr/bin/env bash
# Twenty-second session, run 5 (diagnostic, no suite): where do the CTA pairs lose 9-10 %? Runs
# 2 and 4 (pairs without / with a step of slack) both ran ~0.90-0.91x, so it is not the
# same-step wait. Builds (d128 only): this tree (the pairs, run 4's version), base (.base =
# c3845a6: `rm -rf .base && mkdir .base && git archive c3845a6 cpp python | tar -x -C .base`,
# carry [".base"]), probe = -DFLASHATTN2_PAIR_PROBE=1 (no pairs; the first-store instance
# launched in clusters of 2: the cluster launch alone), probe2 = -DFLASHATTN2_PAIR_PROBE=2
# (no pairs, no clusters; the walk of a pair: both CTAs of a pair on one query tile per step).
# envab: the four interleaved twice, d128 full bwd, SDPA-cuDNN in each; ncu of the pairs at 2k.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s22run5.sh
set -u
export SKIP="suite smoke fwdab bwdab decab chains bwdprof fncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests power"
export HEAD_DIMS="128" BASE_HEAD_DIMS="128" PROBE_HEAD_DIMS="128"
export PROBE_FLAGS="-DFLASHATTN2_PAIR_PROBE=1" PROBE2_FLAGS="-DFLASHATTN2_PAIR_PROBE=2"
export ENVAB_1="base=PYTHONPATH:/tmp/base cluster=PYTHONPATH:/tmp/probe walk=PYTHONPATH:/tmp/probe2 pair="
export ENVAB_1_ARGS="--no-summary --modes bwd --headdims 128 --dtypes bf16 --causal false --impls flashattn2,sdpa_cudnn"
export BNCU_DIM=128 BNCU_SEQLEN=2048 BNCU_CAUSAL=0 PROBE_AB=0
bash scripts/gpu_job.sh
