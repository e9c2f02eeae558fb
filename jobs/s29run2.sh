#!/usr/bin/env bash
# Twenty-ninth session, run 2. Run 1 (jobs/s29run1.sh) measured the persistent d64 backward
# (probe2) at 0.86x in 3xTF32 and dropped it with the walks patch; its CTA stamps put the
# d64 prologue (entry -> K / V in smem) at 10.5-12.3 us in 3xTF32 and 7.9 us in TF32 (2.5-3.7
# steps a CTA). This tree: A = the float32 preprocess at the read floor + the lazy dQ accumulator
# (.base: 3a8e056 with the two patches, since landed as d698204 and 1af31a0),
# plus (jobs/s29_fp32_bwd_kv_fragments_smem.patch) the d64 consumers' K hi / V hi fragments read from shared memory (K^T hi, a V hi scratch)
# instead of 64 scalar global loads of 8 rows each a thread, plus the CTA stamps (compiled out
# by default: the default SASS is identical without them). Steps: builds (main, base = A with
# every head dim, probe = stamps); smoke; A/B base / new, 3xTF32 and TF32, d64, 1k-4k; stamps;
# then the suite on this tree if it wins (geomean of the four d64 groups >= 1.004, none below
# 0.99), else on A (the base wheel reinstalled): either way one candidate gets its suite.
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s29run2.sh
#   (carry .base and .xdist)
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power"
export SMOKE_TESTS="tests/test_fp32wg_bwd.py tests/test_fp32_tf32.py tests/test_fp32_varlen.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="16;32;64;96;128;192;256"
export PROBE_FLAGS="-DFLASHATTN2_PROBE_TIMES" PROBE_HEAD_DIMS="64" PROBE_AB=0
export PROBE_TESTS="tests/test_fp32wg_bwd.py" PTESTS_TIMEOUT=200
export ENVAB_GROUPS="2 3"
export ENVAB_2="base=PYTHONPATH:/tmp/base new=" ENVAB_3="base=PYTHONPATH:/tmp/base new="
A="--no-summary --seqlens 1024,2048,4096 --dtypes fp32 --impls flashattn2,sdpa_efficient --headdims 64 --modes bwd"
export ENVAB_2_ARGS="$A --fp32-precision ieee" ENVAB_3_ARGS="$A --fp32-precision tf32"
bash scripts/gpu_job.sh || exit 1
for prec in ieee tf32; do
    echo "=== $(date -Is) CTA stamps ($prec)"
    PYTHONPATH=/tmp/probe timeout 120 python3 scripts/bwd_cta_times.py --seqlens 1024,8192 \
        --causal 0,1 --fp32-precision $prec 2>&1 | tee "$O/cta_times_$prec.txt" | tail -n 20
done
for g in 2 3; do
    python3 scripts/ab_compare.py "$O" --group $g --specs base,new > "$O/ab$g.txt" 2>&1
    sed -n '/^geomean/,$p' "$O/ab$g.txt"
done
if python3 - "$O/ab2.txt" "$O/ab3.txt" <<'PY'
import math, re, sys
g = [float(x) for f in sys.argv[1:] for x in re.findall(r"^\s*.+: new ([0-9.]+)$", open(f).read(), re.M)]
ok = len(g) == 4 and math.prod(g) ** (1 / len(g)) >= 1.004 and min(g) >= 0.99
print("d64 groups", g, "win" if ok else "no win")
sys.exit(0 if ok else 1)
PY
then
    echo "=== $(date -Is) the suite on this tree"
else
    echo "=== $(date -Is) the suite on A (the base wheel)"
    python3 -m pip install --no-deps --force-reinstall -q /tmp/base_whl/*.whl ||
        python3 -m pip install --no-deps --force-reinstall -q --break-system-packages /tmp/base_whl/*.whl
fi
AB_GROUP=2 WIN_GEOMEAN=0 bash scripts/suite_if_win.sh
echo "=== $(date -Is) done"
