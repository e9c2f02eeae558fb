#!/usr/bin/env bash
# Twenty-fifth session, run 4: the d128 float32 backward's producer stages the next step's Q,
# dO, lse and dsum by cp.async (fp32wg::bwd_stage_natural; run 3's ncu: the consumers waited
# for full_nat, the producer for its global loads). A/B against a4ad4d7 (.base), d128 bwd full
# and causal 1k-8k, interleaved base new base new, under ieee (group 7) and tf32 (group 8),
# flashattn2 against SDPA-efficient and -math; the suite if the geomean of both groups >= 1.01
# and neither < 0.99.
#   rm -rf .base && mkdir .base && git archive a4ad4d7 cpp python | tar -x -C .base
#   WAIT=540 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s25run4.sh   (then `wait`)
set -u
O=${JOB_OUT:-gpu_logs}
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab ptests probe power"
export SMOKE_TESTS="tests/test_fp32_tf32.py tests/test_fp32wg_bwd128.py tests/test_fp32wg_bwd.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="128"
bash scripts/gpu_job.sh || exit 1
for i in $(seq 60); do [ -d /tmp/base/flashattn2 ] && break; sleep 5; done
tail -n 2 "$O/base_build.txt"
[ -d /tmp/base/flashattn2 ] || { echo "=== no base build"; exit 1; }
for prec in ieee tf32; do
    g=7; [ $prec = tf32 ] && g=8
    for run in base_1 new_1 base_2 new_2; do
        pp=""; [[ $run == base* ]] && pp=/tmp/base
        echo "=== $(date -Is) $prec $run"
        PYTHONPATH=$pp timeout 200 python3 benchmarks/bench.py --out "$O/envab${g}_$run" --no-summary \
            --headdims 128 --seqlens 1024,2048,4096,8192 --dtypes fp32 --modes bwd \
            --impls flashattn2,sdpa_efficient,sdpa_math --fp32-precision $prec 2>&1 | tail -n 1
    done
    python3 scripts/ab_compare.py "$O" --group $g --specs base,new > "$O/ab$g.txt" 2>&1
    cat "$O/ab$g.txt"
done
if python3 - "$O" <<'PY'
import math, re, sys
g = [float(x) for n in (7, 8) for x in
     re.findall(r"^\s*.+: new ([0-9.]+)$", open(f"{sys.argv[1]}/ab{n}.txt").read(), re.M)]
ok = len(g) == 4 and math.prod(g) ** 0.25 >= 1.01 and min(g) >= 0.99
print("groups", g, "win" if ok else "no win")
sys.exit(0 if ok else 1)
PY
then
    echo "=== $(date -Is) the suite"
    OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=500 \
        PYTEST_ARGS="--ignore=tests/test_distributed.py -n 4 --dist loadfile" TESTS=tests \
        SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh
fi
echo "=== $(date -Is) done"
