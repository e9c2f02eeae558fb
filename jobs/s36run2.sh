#!/usr/bin/env bash
# Prepared in the thirty-fifth session (CPU-checked; ~800 s with the suite: two calls, the second
# `bash scripts/gpu_detach.sh wait`): issue 21's rows8 for
# the d128 float32 backward units (the thirtieth session's list, item 2).
# jobs/s36_fp32_bwd_rows8_d128.patch: bwd_store_kv's kRows8 forms its kR / 4 row addresses once
# (unit w + 4 u's key block is w + 4 (u % (kR / 4)), its column block u / (kR / 4): compile-time
# column offsets) instead of recomputing row and column a float4, and the d128 kernel takes
# kRows8 (its K / V prologue 8 rows x 64 bytes a warp instruction, 8 L1 lines, not 32). ptxas
# sm_90a: the d128 3xTF32 and TF32 units 0 spills with it (52 / 12 bytes with the old
# addressing); the d64 units stay at 0 but their SASS changed (shorter: the 3xTF32 unit 5192 ->
# 4880 cuobjdump lines, fewer IMAD.WIDE), so both head dims are measured.
# scripts/fp32wg_bwd128_model.py follows the new setup order and passes; fp32wg_bwd_model.py
# (d64, the same mapping) passes.
#   rm -rf .base && mkdir .base && git archive HEAD cpp python | tar -x -C .base
#   git apply jobs/s36_fp32_bwd_rows8_d128.patch && git commit -am "..."
#   WAIT=575 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s36run2.sh   (carry .base, .xdist)
# A/B against .base, 2 rounds: group 2 3xTF32, group 3 TF32, d64 / d128 backward, 1k-4k, full
# and causal, SDPA memory-efficient in the same run. The suite if 3xTF32 d128's geomean >= 1.003
# and no group of either precision below 0.99.
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power probe"
export SMOKE_TESTS="tests/test_fp32wg_bwd.py tests/test_fp32_tf32.py" SMOKE_STOP=1 SMOKE_TIMEOUT=300
export BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="2 3"
export ENVAB_2="base=PYTHONPATH:/tmp/base new=" ENVAB_3="base=PYTHONPATH:/tmp/base new="
A="--no-summary --seqlens 1024,2048,4096 --dtypes fp32 --impls flashattn2,sdpa_efficient --headdims 64,128 --modes bwd"
export ENVAB_2_ARGS="$A --fp32-precision ieee" ENVAB_3_ARGS="$A --fp32-precision tf32"
bash scripts/gpu_job.sh || exit 1
for g in 2 3; do
    python3 scripts/ab_compare.py "$O" --group $g --specs base,new > "$O/ab$g.txt" 2>&1
    sed -n '/^geomean/,$p' "$O/ab$g.txt"
done
if python3 - "$O/ab2.txt" "$O/ab3.txt" <<'PY'
import math, re, sys
def groups(f):
    return {n.strip(): float(x) for n, x in re.findall(r"^\s*(.+): new ([0-9.]+)$", open(f).read(), re.M)}
g2, g3 = groups(sys.argv[1]), groups(sys.argv[2])
d128 = [x for n, x in g2.items() if " 128 " in f" {n} "]
geo = math.prod(d128) ** (1 / len(d128)) if d128 else 0
ok = geo >= 1.003 and min(list(g2.values()) + list(g3.values()) or [0]) >= 0.99
print("3xTF32", g2, "TF32", g3, "d128 3xTF32 geomean", round(geo, 4), "win" if ok else "no win")
sys.exit(0 if ok else 1)
PY
then
    AB_GROUP=2 WIN_GEOMEAN=0 bash scripts/suite_if_win.sh
else
    echo "=== $(date -Is) no win: no suite"
fi
echo "=== $(date -Is) done"
