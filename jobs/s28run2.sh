#!/usr/bin/env bash
# Twenty-eighth session, run 2: the Hopper float32 backwards add dQ * scale straight into dq
# (BwdParams::fp32_dq_direct: the preprocess zeroes dq, no dq_accum, no convert kernel; at
# bench.py's 16k tokens d64 the convert kernel moves ~268 MB, ~3 % of a causal 1k backward),
# on top of the K / V prologue helper (run 1: 0.996-1.004). Build, smoke (the float32 backward
# tests, strided gradients included), A/B against 62d18e9 (3xTF32 and TF32 backwards, full and
# causal, d64 / d128, 1k-4k, 2 rounds, SDPA-efficient in the same run), then the suite as
# suite_if_win.sh runs it (pytest-xdist, FORCE_SM80 test_kvcache + test_bwd, sanitizers) if the
# 3xTF32 group holds. First:
#   rm -rf .base && mkdir .base && git archive 62d18e9 cpp python | tar -x -C .base
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s28run2.sh
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest probe ptests power"
export SMOKE_TESTS="tests/test_fp32wg_bwd.py tests/test_fp32wg_bwd128.py tests/test_fp32_tf32.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="2 3"
export ENVAB_2="base=PYTHONPATH:/tmp/base new=" ENVAB_3="base=PYTHONPATH:/tmp/base new="
A="--no-summary --seqlens 1024,2048,4096 --dtypes fp32 --impls flashattn2,sdpa_efficient --headdims 64,128 --modes bwd"
export ENVAB_2_ARGS="$A --fp32-precision ieee" ENVAB_3_ARGS="$A --fp32-precision tf32"
bash scripts/gpu_job.sh || exit 1
AB_GROUP=2 WIN_GEOMEAN=1.0 WIN_MIN=0.98 bash scripts/suite_if_win.sh
echo "=== $(date -Is) done"
