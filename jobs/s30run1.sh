#!/usr/bin/env bash
# Thirtieth session, run 1 (prepared in the twenty-ninth, CPU-checked only). The twenty-ninth
# session's run 2 read the d64 backward's K hi / V hi fragments back from shared memory: the
# prologue -3 us a CTA, 3xTF32 +0.4 % (1k causal +2 %), TF32 -2 % (its V hi scratch needed 32 KiB
# more shared memory). jobs/s30_fp32_bwd_kv_fragments_3xtf32.patch keeps that for 3xTF32 only
# (the scratch in sdS hi + lo, no more shared memory) and TF32's global fragment loads as they
# are (its unit's SASS still differs from HEAD's: 3976 lines against 4080, the producer's q_pos
# recomputed a step, as the 3xTF32 unit needs to stay at 0 spills), and carries the CTA
# stamps (-DFLASHATTN2_PROBE_TIMES; slot 3: the fragments in registers) and the host model's
# mirror (scripts/fp32wg_bwd_model.py reads the fragments back from its smem image: passes).
# CPU: 3xTF32 unit 0 spills, LDG 90 -> 26; TF32 0 spills. The patch also has a probe option,
# -DFLASHATTN2_FP32WG_KV_ROWS8 (fp32wg::kKvRows8): bwd_store_kv's warp instructions read 8 rows x
# 64 bytes (8 lines) instead of 32 rows x 16 bytes (32 lines), K^T stores 2-way; the host model
# passes with it (--kv-rows8); d64 units 0 spills (the d128 3xTF32 unit spills 52 bytes with it:
# not built here); without the flag every float32 backward unit's SASS is identical to the
# patch's without the option. Side build probe2 = that + the stamps, A/B'd as p2.
#   rm -rf .base && mkdir .base && git archive HEAD cpp python | tar -x -C .base
#   git apply jobs/s30_fp32_bwd_kv_fragments_3xtf32.patch
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s30run1.sh
#   (carry .base and .xdist; call `gpu_detach.sh wait` at once when the first call returns:
#   the machine goes back 30 s after a call)
# Steps: builds (main, base = HEAD with d64 / d128, probe = stamps, probe2 = rows8 + stamps,
# d64); smoke; A/B base / new / p2, 3xTF32 and TF32, d64, 1k-4k; stamps of both probes; the
# suite on this tree if it wins (the two 3xTF32 groups' geomean >= 1.003, TF32's >= 0.995),
# else none (~530 s of device time: start 70, builds ~150, smoke 50, A/B 90, stamps 20, suite
# ~300 with xdist). If p2 beats new: rows8 becomes the default (remove the option, update the
# model's default) and needs its own suite.
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power"
export SMOKE_TESTS="tests/test_fp32wg_bwd.py tests/test_fp32_tf32.py tests/test_fp32_varlen.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export PROBE_FLAGS="-DFLASHATTN2_PROBE_TIMES" PROBE_HEAD_DIMS="64" PROBE_AB=0
export PROBE2_FLAGS="-DFLASHATTN2_FP32WG_KV_ROWS8 -DFLASHATTN2_PROBE_TIMES"
export PROBE_TESTS="tests/test_fp32wg_bwd.py" PTESTS_TIMEOUT=200
export ENVAB_GROUPS="2 3"
export ENVAB_2="base=PYTHONPATH:/tmp/base new= p2=PYTHONPATH:/tmp/probe2"
export ENVAB_3="base=PYTHONPATH:/tmp/base new= p2=PYTHONPATH:/tmp/probe2"
A="--no-summary --seqlens 1024,2048,4096 --dtypes fp32 --impls flashattn2,sdpa_efficient --headdims 64 --modes bwd"
export ENVAB_2_ARGS="$A --fp32-precision ieee" ENVAB_3_ARGS="$A --fp32-precision tf32"
bash scripts/gpu_job.sh || exit 1
for b in probe probe2; do
    for prec in ieee tf32; do
        echo "=== $(date -Is) CTA stamps ($b, $prec)"
        PYTHONPATH=/tmp/$b timeout 120 python3 scripts/bwd_cta_times.py --seqlens 1024,8192 \
            --causal 0,1 --fp32-precision $prec 2>&1 | tee "$O/cta_times_${b}_$prec.txt" | tail -n 20
    done
done
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
print("3xTF32", g2, "TF32", g3, "win" if ok else "no win")
sys.exit(0 if ok else 1)
PY
then
    AB_GROUP=2 WIN_GEOMEAN=0 bash scripts/suite_if_win.sh
else
    echo "=== $(date -Is) no win: no suite"
fi
echo "=== $(date -Is) done"
