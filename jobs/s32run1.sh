#!/usr/bin/env bash
# Next session's first run (prepared in the thirty-first, CPU-checked only).
# jobs/s32_decode_compile_time_switches.patch removes the decode kernel's two runtime switches
# (kv_l2_prefetch, kv_issue_early: on by default, kept for A/B since the tenth session), so the
# loop no longer issues every LDGSTS twice (once per value of the prefetch switch) nor carries
# the late-issue path: binding, FwdParams, _ext, _launch, bench_decode's two variants and their
# tests go; test_copy_variants_change_nothing becomes test_copy_layouts_agree (the whole-row
# and default copy layouts bitwise equal). On an H200 (run 4, `frfixed`: the same kernel as the
# patch's whole-row instance, SASS byte-identical) paged 256 at b16 8k ran 126.9 us against
# 137.3 with the switches (contiguous 124.7 / 125.2). The default-layout instance (183
# registers, was 187) is the part not yet measured.
#   rm -rf .base && mkdir .base && git archive HEAD cpp python | tar -x -C .base
#   git apply jobs/s32_decode_compile_time_switches.patch
#   WAIT=575 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s32run1.sh   (carry .base, .xdist)
#   then at once: WAIT=... OUT=$OUT bash scripts/gpu_detach.sh wait
# Builds: main (this tree, every head dim: the suite runs on it) and base (HEAD, d64 / d128).
# Smoke: the decode tests and the CPU tests the patch touches. A/B (group 6): bench_decode.py,
# contiguous and paged 16 / 256, sq 1 and 4, b 1-64, 1k-32k, d128, base / new interleaved
# twice; group 7 the same at d64 (b 1, 16, 64), with p1: a d64 side build whose copies read
# whole 128-byte rows too (-DFLASHATTN2_PROBE_DECODE_ROWS_D64, 8 lanes a row, 130 registers,
# no spills; its decode tests run first, where test_copy_layouts_agree's d64 case compares the
# two layouts). The suite if every (layout, batch, query tokens) line of group 6 has new / base
# >= 0.98 and their geomean >= 1.003 (~500 s of device time with the builds). If p1 wins group
# 7, whole rows at d64 is a one-line change to decode_full_rows (and another suite).
# If an H100 is lent: make .base from 4161e73 instead (before the whole-row layout) to measure
# the layout there too (NOTES, thirty-first session's list, item 2), and judge by group 6.
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power"
export SMOKE_TESTS="tests/test_decode_kernel.py tests/test_kvcache.py tests/test_api.py tests/test_bench.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export PROBE_FLAGS="-DFLASHATTN2_PROBE_DECODE_ROWS_D64" PROBE_HEAD_DIMS="64" PROBE_AB=0
export PROBE_TESTS="tests/test_decode_kernel.py"
export ENVAB_GROUPS="6 7" ENVAB_6="base=PYTHONPATH:/tmp/base new="
export ENVAB_7="base=PYTHONPATH:/tmp/base new= p1=PYTHONPATH:/tmp/probe"
export ENVAB_6_SCRIPT=benchmarks/bench_decode.py ENVAB_7_SCRIPT=benchmarks/bench_decode.py
A="--no-summary --parts decode --sq 1,4 --page-sizes 16,256 --cache-lens 1k,8k,32k --impls flashattn2,sdpa_cudnn,read_floor"
export ENVAB_6_ARGS="$A --batches 1,4,16,64" ENVAB_7_ARGS="$A --batches 1,16,64 --headdim 64"
bash scripts/gpu_job.sh || exit 1
for g in 6 7; do
    python3 scripts/ab_compare.py "$O" --group $g --specs base,new > "$O/ab$g.txt" 2>&1
    echo "group $g"; sed -n '/^geomean/,$p' "$O/ab$g.txt"
done
if WIN_MIN=0.98 AB_GROUP=6 WIN_GEOMEAN=1.003 bash scripts/suite_if_win.sh; then :; fi
echo "=== $(date -Is) done"
