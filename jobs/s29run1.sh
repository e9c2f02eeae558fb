#!/usr/bin/env bash
# Twenty-ninth session, run 1 (prepared in the twenty-eighth, no device time left). Four
# patches, in this order:
# - jobs/s29_fp32_preprocess_float4.patch: the float32 preprocess at the read floor (run 3 of
#   the twenty-eighth session: +0-0.6 %, the d64 preprocess 166 -> 137 us);
# - jobs/s29_fp32_bwd_lazy_dq_accum.patch: float32 backwards call _C.bwd without the dQ
#   accumulator first; the mma.sync float32 kernels answer -1 (kBwdNeedsDqAccum) and run on
#   the second call with it; the Hopper ones never need it: the backward's peak memory less
#   dq's bytes (CPU tests pass with a fake _C; the C++ compiled here, not run);
# - jobs/s29_fp32_bwd_walks.patch: the d64 backward's roles each walk the CTA's tiles
#   (fp32wg::bwd_walks), persistent under -DFLASHATTN2_FP32WG_BWD_PERSISTENT (a grid of a CTA an
#   SM; the producer runs into the next tile's steps while the consumers store dK / dV: the
#   fixed cost a CTA, ~4 steps, twenty-seventh session); default build: one walk, 0 spills, the
#   d64 units' SASS not byte-identical (register allocation; 15 fewer instructions), the d128
#   units' identical; persistent 3xTF32: 40 bytes of spills (a few LDL a step), TF32 none;
# - jobs/s29_fp32_bwd_cta_probe.patch: clock stamps a CTA under -DFLASHATTN2_PROBE_TIMES
#   (scripts/bwd_cta_times.py); the default SASS identical with and without it; 0 spills with it.
# Main build: all four, default flags (the candidate to land: preprocess, lazy dq_accum and the
# walks restructure; not the stamps). Side builds: probe = stamps, probe2 = persistent. Steps:
# smoke; the float32 backward tests on both side builds (200 s cap each: a hang costs no
# more); A/B of the backwards base (HEAD) / new / p2 (persistent), 3xTF32 and TF32, d64 / d128,
# full and causal, 1k-4k; the stamps (d64 1k / 8k, full and causal, both precisions); the suite
# if new holds against base. First:
#   rm -rf .base && mkdir .base && git archive HEAD cpp python | tar -x -C .base
#   git apply jobs/s29_fp32_preprocess_float4.patch jobs/s29_fp32_bwd_lazy_dq_accum.patch \
#       jobs/s29_fp32_bwd_walks.patch jobs/s29_fp32_bwd_cta_probe.patch
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s29run1.sh
#   (carry .base and .xdist: gpu_job.sh installs the pytest-xdist wheels)
# (~830 s of device time: start 70, builds ~120, smoke 30, ptests 40, A/B ~240, stamps 30,
# suite ~300.) Land: the preprocess, the lazy dq_accum, and the walks patch if p2 wins (then
# persistent by default, the flag gone) or its new rows hold (else drop it); not the stamps.
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power"
export SMOKE_TESTS="tests/test_fp32wg_bwd.py tests/test_fp32wg_bwd128.py tests/test_fp32_varlen.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export PROBE_FLAGS="-DFLASHATTN2_PROBE_TIMES" PROBE2_FLAGS="-DFLASHATTN2_FP32WG_BWD_PERSISTENT"
export PROBE_HEAD_DIMS="64" PROBE_AB=0
export PROBE_TESTS="tests/test_fp32wg_bwd.py tests/test_fp32_tf32.py" PTESTS_TIMEOUT=200
export ENVAB_GROUPS="2 3"
export ENVAB_2="base=PYTHONPATH:/tmp/base new= p2=PYTHONPATH:/tmp/probe2"
export ENVAB_3="base=PYTHONPATH:/tmp/base new= p2=PYTHONPATH:/tmp/probe2"
A="--no-summary --seqlens 1024,2048,4096 --dtypes fp32 --impls flashattn2,sdpa_efficient --headdims 64,128 --modes bwd"
export ENVAB_2_ARGS="$A --fp32-precision ieee" ENVAB_3_ARGS="$A --fp32-precision tf32"
bash scripts/gpu_job.sh || exit 1
for prec in ieee tf32; do
    echo "=== $(date -Is) CTA stamps ($prec)"
    PYTHONPATH=/tmp/probe timeout 120 python3 scripts/bwd_cta_times.py --seqlens 1024,8192 \
        --causal 0,1 --fp32-precision $prec 2>&1 | tee "$O/cta_times_$prec.txt" | tail -n 20
done
AB_GROUP=2 WIN_GEOMEAN=0.998 WIN_MIN=0.98 bash scripts/suite_if_win.sh
echo "=== $(date -Is) done"
