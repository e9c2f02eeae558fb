#!/usr/bin/env bash
# Next session's first run (prepared in the thirtieth, CPU-checked only). The thirtieth
# session's stamps (jobs/s30run3.sh, on bb185ae) put the d64 float32 backward's fixed cost a CTA
# at 2.07 steps in 3xTF32 (causal 1k: 9.0 us; K / V in shared memory at 6.0 us) and 3.45 steps
# in TF32 (9.4 us; prologue 7.8 us). 64 KiB of K / V in 6 us is HBM's fair share an SM (~25
# GB/s) plus latency: only this CTA reads them, so they are never in L2. The patch
# (jobs/s31_fp32wg_l2_prefetch.patch): each CTA prefetches into L2 (prefetch.global.L2, each
# line of a row a thread) the rows only the CTA %nsmid linear indices ahead reads: the
# backward's K / V (d64 and d128 kernels), the forward's Q tile (both forward instances);
# fp32wg::grid_tile_ahead / prefetch_l2. Predicted: prologue 6 -> ~3 us, 3xTF32 d64 causal 1k
# +3-4 %, TF32 +5 %; the forward's Q tile (64 KiB at d128) the same kind of gain on short causal
# rows. (cp.async.bulk.prefetch was tried first: it takes uniform operands, and with a row a
# thread ptxas wrapped it in a 32-round loop over the lanes.)
# CPU (nvcc 13.0, sm_90a): the eight float32 wgmma units 0 spills, 168 registers, 3 (d64) / 5
# (d128) CCTL.E.PF2 each; their loops (first to last HGMMA) the same length as HEAD's but the
# forward d64 3xTF32 (842 -> 827 lines) and backward d128 3xTF32 (1326 -> 1330); the backward
# prologues 360-590 lines shorter (ptxas's choice; the fragment offsets' signed divisions gone),
# the forward ones ~110 longer. With -DFLASHATTN2_FP32WG_PREFETCH_WAVES=0 the SASS is HEAD's,
# byte for byte (checked: backward d64 3xTF32, forward d128 3xTF32).
#   rm -rf .base && mkdir .base && git archive HEAD cpp python | tar -x -C .base   (HEAD: e11dd80 or later)
#   git apply jobs/s31_fp32wg_l2_prefetch.patch
#   WAIT=575 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s31run1.sh   (carry .base, .xdist)
#   then at once: WAIT=... OUT=$OUT bash scripts/gpu_detach.sh wait
# Builds: main (this tree), base (HEAD, d64 / d128), probe (stamps, d64 / d128), probe2
# (-DFLASHATTN2_FP32WG_PREFETCH_WAVES=2, d64 / d128). A/B: groups 2 / 3 backward 3xTF32 / TF32,
# 4 / 5 forward, d64 and d128, 1k-4k, full and causal (p2 in the 3xTF32 groups). Stamps of the
# probe. The suite if every (group, head dim, causal) line's new / base >= 0.985 and their
# geomean >= 1.003 (~1100 s of device time with the machine's start: two or three calls).
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite ptests fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power"
export SMOKE_TESTS="tests/test_fp32wg.py tests/test_fp32wg_bwd.py tests/test_fp32wg_bwd128.py tests/test_fp32_tf32.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export PROBE_FLAGS="-DFLASHATTN2_PROBE_TIMES" PROBE_HEAD_DIMS="64;128" PROBE_AB=0
export PROBE2_FLAGS="-DFLASHATTN2_FP32WG_PREFETCH_WAVES=2"
export ENVAB_GROUPS="2 3 4 5"
P3="base=PYTHONPATH:/tmp/base new= p2=PYTHONPATH:/tmp/probe2" P2="base=PYTHONPATH:/tmp/base new="
export ENVAB_2="$P3" ENVAB_3="$P2" ENVAB_4="$P3" ENVAB_5="$P2"
A="--no-summary --seqlens 1024,2048,4096 --dtypes fp32 --impls flashattn2,sdpa_efficient --headdims 64,128"
export ENVAB_2_ARGS="$A --modes bwd --fp32-precision ieee" ENVAB_3_ARGS="$A --modes bwd --fp32-precision tf32"
export ENVAB_4_ARGS="$A --modes fwd --fp32-precision ieee" ENVAB_5_ARGS="$A --modes fwd --fp32-precision tf32"
bash scripts/gpu_job.sh || exit 1
for prec in ieee tf32; do
    echo "=== $(date -Is) CTA stamps (probe, $prec)"
    PYTHONPATH=/tmp/probe timeout 90 python3 scripts/bwd_cta_times.py --seqlens 1024,4096 \
        --causal 0,1 --fp32-precision $prec 2>&1 | tee "$O/cta_times_probe_$prec.txt"
done
for g in 2 3 4 5; do
    python3 scripts/ab_compare.py "$O" --group $g --specs base,new > "$O/ab$g.txt" 2>&1
    echo "group $g"; sed -n '/^geomean/,$p' "$O/ab$g.txt"
done
echo "=== $(date -Is) decode sweep (H200 baseline, the default sweep)"
timeout 400 python3 benchmarks/bench_decode.py --out "$O/decode" > "$O/decode_log.txt" 2>&1
tail -n 60 "$O/decode_log.txt"
if python3 - "$O"/ab[2-5].txt <<'PY'
import math, re, sys
r = [float(x) for f in sys.argv[1:]
     for x in re.findall(r"^\s*.+: new ([0-9.]+)$", open(f).read(), re.M)]
geo = math.prod(r) ** (1 / len(r)) if r else 0
ok = len(r) == 16 and geo >= 1.003 and min(r) >= 0.985
print("lines", r, "geomean %.4f" % geo, "win" if ok else "no win")
sys.exit(0 if ok else 1)
PY
then
    AB_GROUP=2 WIN_GEOMEAN=0 bash scripts/suite_if_win.sh
else
    echo "=== $(date -Is) no win: no suite"
fi
echo "=== $(date -Is) done"
