#!/usr/bin/env bash
# Twenty-fifth session, run 1 (twenty-fourth session's run 3, which ran out of budget):
# the d128 single-TF32 backward at 32 queries a step (the lo
# tiles' shared memory freed; K^T hi in shared memory): `git apply jobs/s25_fp32_tf32_bwd128_m32.patch`
# on a4a72d4 first. Pass WAIT below the call's limit (budget_left_s), or nothing comes back.
#   - build (default), smoke (test_fp32_tf32, test_fp32wg_bwd128; stop on a failure);
#   - bench.py float32 d128 bwd, full and causal, 1k-8k, --fp32-precision tf32, flashattn2
#     against SDPA-math and -efficient, two rounds;
#   - only if flashattn2's d128 tf32 backward beats run 2's (geomean of the 8 points >= 1.05):
#     the suite (4 xdist processes), FORCE_SM80, sanitizers (in that order).
#   WAIT=540 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s24run3.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab ptests probe power"
export SMOKE_TESTS="tests/test_fp32_tf32.py tests/test_fp32wg_bwd128.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300
bash scripts/gpu_job.sh || exit 1
for r in 1 2; do
    echo "=== $(date -Is) bench fp32 tf32 d128 bwd round $r"
    timeout 200 python3 benchmarks/bench.py --out "$O/fp32_tf32_$r" --no-summary \
        --headdims 128 --seqlens 1024,2048,4096,8192 --dtypes fp32 --modes bwd \
        --impls flashattn2,sdpa_efficient,sdpa_math --fp32-precision tf32 > "$O/fp32_tf32_$r.txt" 2>&1
    tail -20 "$O/fp32_tf32_$r.txt"
done
# run 2's flashattn2 d128 tf32 bwd TFLOP/s (best of two), full then causal, 1k-8k
python3 - "$O" <<'PY' || { echo "=== no win: no suite"; exit 0; }
import json, math, sys
old = {(False, 1024): 66.1, (False, 2048): 73.9, (False, 4096): 73.7, (False, 8192): 70.6,
       (True, 1024): 62.3, (True, 2048): 72.4, (True, 4096): 79.1, (True, 8192): 82.9}
best = {}
for r in (1, 2):
    for x in json.load(open(f"{sys.argv[1]}/fp32_tf32_{r}/results.json"))["rows"]:
        if x["impl"] == "flashattn2" and x.get("tflops"):
            k = (x["causal"], x["seqlen_q"]); best[k] = max(best.get(k, 0), x["tflops"])
ratios = {k: best[k] / v for k, v in old.items() if k in best}
print("new / run 2:", {f"{'causal' if k[0] else 'full'} {k[1]}": round(v, 3) for k, v in ratios.items()})
g = math.prod(ratios.values()) ** (1 / len(ratios)) if ratios else 0
print("geomean", round(g, 3))
sys.exit(0 if len(ratios) == 8 and g >= 1.05 else 1)
PY
echo "=== $(date -Is) the suite"
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=500 \
    PYTEST_ARGS="--ignore=tests/test_distributed.py -n 4 --dist loadfile" TESTS=tests \
    SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh
echo "=== $(date -Is) done"
