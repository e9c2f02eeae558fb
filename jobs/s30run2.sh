#!/usr/bin/env bash
# Thirtieth session, run 2. Run 1 (jobs/s30run1.sh): jobs/s30_fp32_bwd_kv_fragments_3xtf32.patch
# against HEAD a520b00, 3xTF32 d64 1.0004 full / 1.0093 causal (1k causal +1.9 %), TF32 1.0004 /
# 0.9963, and its suite 7402 passed / 93 skipped; the machine went back before FORCE_SM80 and the
# sanitizers. Its p2 (the rows8 option with the CTA stamps) could not be A/B'd: a stamps build
# writes through dq_accum, which the float32 backward no longer allocates (illegal address in
# bench.py; the stamps script passes its own buffer). The stamps alone: rows8's prologue 1.1-1.4
# us shorter (3xTF32, 8.3 -> 6.9 us full, 7.1 -> 6.0 us causal).
# Here: this tree (the s30 patch, rows8 now the d64 kernel's only: bwd_store_kv's kRows8) A/B'd
# against a side build with -DFLASHATTN2_FP32WG_KV_ROWS8 (all head dims: the d128 units' SASS is
# the default's, checked on the CPU), 3 rounds, 3xTF32 and TF32, d64 1k-4k. If rows8 wins (3xTF32
# geomean >= 1.003, TF32 >= 0.995) its wheel replaces the main one and the whole suite runs on it
# (FORCE_SM80 and the sanitizers included); else FORCE_SM80 test_kvcache / test_bwd and the
# sanitizers on this tree (its suite passed in run 1).
#   WAIT=575 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s30run2.sh   (carry .xdist)
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="base suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power"
export SMOKE_TESTS="tests/test_fp32wg_bwd.py" SMOKE_STOP=1 SMOKE_TIMEOUT=200
export PROBE2_FLAGS="-DFLASHATTN2_FP32WG_KV_ROWS8" PROBE_HEAD_DIMS="16;32;64;96;128;192;256"
export PROBE_TESTS="tests/test_fp32wg_bwd.py tests/test_fp32_tf32.py" PTESTS_TIMEOUT=200
export ENVAB_GROUPS="2 3" ENVAB_REPS=3
export ENVAB_2="base= new=PYTHONPATH:/tmp/probe2" ENVAB_3="base= new=PYTHONPATH:/tmp/probe2"
A="--no-summary --seqlens 1024,2048,4096 --dtypes fp32 --impls flashattn2,sdpa_efficient --headdims 64 --modes bwd"
export ENVAB_2_ARGS="$A --fp32-precision ieee" ENVAB_3_ARGS="$A --fp32-precision tf32"
bash scripts/gpu_job.sh || exit 1
for g in 2 3; do
    python3 scripts/ab_compare.py "$O" --group $g --specs base,new > "$O/ab$g.txt" 2>&1
    sed -n '/^geomean/,$p' "$O/ab$g.txt"
done
if python3 - "$O/ab2.txt" "$O/ab3.txt" <<'PY'
import math, re, sys
gm = lambda f: [float(x) for x in re.findall(r"^\s*.+: new ([0-9.]+)$", open(f).read(), re.M)]
g2, g3 = gm(sys.argv[1]), gm(sys.argv[2])
geo = lambda g: math.prod(g) ** (1 / len(g)) if g else 0
ok = len(g2) == 2 and len(g3) == 2 and geo(g2) >= 1.003 and geo(g3) >= 0.995
print("3xTF32", g2, "TF32", g3, "rows8 wins" if ok else "rows8 does not win")
sys.exit(0 if ok else 1)
PY
then
    echo "=== $(date -Is) rows8 wins: its wheel, the whole suite"
    python3 -m pip install --no-deps --force-reinstall -q /tmp/probe2_whl/*.whl
    AB_GROUP=2 WIN_GEOMEAN=0 bash scripts/suite_if_win.sh
else
    echo "=== $(date -Is) FORCE_SM80 and the sanitizers on this tree"
    OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=200 TESTS=tests/test_fp32wg_bwd.py \
        SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh
fi
echo "=== $(date -Is) done"
