#!/usr/bin/env bash
# Twenty-ninth session, run 1 (prepared in the twenty-eighth, no device time left). Three
# patches: jobs/s29_fp32_preprocess_float4.patch (the float32 preprocess at the read floor:
# measured in the twenty-eighth session's run 3, +0-0.6 %, the d64 preprocess 166 -> 137 us),
# jobs/s29_fp32_bwd_lazy_dq_accum.patch (float32 backwards call _C.bwd without the dQ
# accumulator first; the mma.sync float32 kernels answer -1, kBwdNeedsDqAccum, and run on the
# second call with it; the Hopper ones add into dq and never need it: the backward's peak
# memory less dq's bytes; CPU tests pass with a fake _C; C++ compiled here with g++
# -fsyntax-only, not run) -- both to land with this run's suite -- and
# jobs/s29_fp32_bwd_cta_probe.patch (clock stamps a CTA in the d64 float32 backward under
# -DFLASHATTN2_PROBE_TIMES; without it the SASS of all four backward units is byte-identical,
# cuobjdump here; ptxas 0 spills with it in both d64 units; not to land). First:
#   rm -rf .base && mkdir .base && git archive HEAD cpp python | tar -x -C .base
#   git apply jobs/s29_fp32_preprocess_float4.patch jobs/s29_fp32_bwd_lazy_dq_accum.patch \
#       jobs/s29_fp32_bwd_cta_probe.patch
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s29run1.sh
# Build (the preprocess patch; the probe inert), smoke, the probe side build's CTA stamps
# (scripts/bwd_cta_times.py: the fixed cost a CTA of the short backwards, split into prologue,
# fill, walk + epilogue, gaps between CTAs, the tail), an A/B of the backwards against HEAD,
# then the suite if it holds. Land the preprocess and the lazy dQ accumulator (not the probe).
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests power"
export SMOKE_TESTS="tests/test_fp32wg_bwd.py tests/test_fp32wg_bwd128.py tests/test_fp32_varlen.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export PROBE_FLAGS="-DFLASHATTN2_PROBE_TIMES" PROBE_HEAD_DIMS="64" PROBE_AB=0
export ENVAB_GROUPS="2 3" ENVAB_2="base=PYTHONPATH:/tmp/base new=" ENVAB_3="base=PYTHONPATH:/tmp/base new="
A="--no-summary --seqlens 1024,2048 --dtypes fp32 --impls flashattn2,sdpa_efficient --headdims 64,128 --modes bwd"
export ENVAB_2_ARGS="$A --fp32-precision ieee" ENVAB_3_ARGS="$A --fp32-precision tf32"
bash scripts/gpu_job.sh || exit 1
for prec in ieee tf32; do
    echo "=== $(date -Is) CTA stamps ($prec)"
    PYTHONPATH=/tmp/probe timeout 120 python3 scripts/bwd_cta_times.py --seqlens 1024,8192 \
        --causal 0,1 --fp32-precision $prec 2>&1 | tee "$O/cta_times_$prec.txt" | tail -n 20
done
AB_GROUP=2 WIN_GEOMEAN=0.998 WIN_MIN=0.98 bash scripts/suite_if_win.sh
echo "=== $(date -Is) done"
