#!/usr/bin/env bash
# Thirty-seventh session, run 4 (~600 s, two calls, carry .xdist): the final commit's checks.
# This tree's decode kernel is SASS-identical to 1cc46f3's (the 4 chains back, the issue lambda
# kept). Full build; the suite (pytest-xdist), FORCE_SM80 test_kvcache + test_bwd +
# test_decode_kernel and the sanitizers (gpu_check.sh); issue 20's sweep on it (bf16 default
# with pages 16 / 64 / 256, fp16 decode, eager b1); then ncu of the 3xTF32 d128 backward
# (b4 s2048, sections and source counters: issue 21's next step) and the float32 bench.
#   WAIT=570 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s37run4.sh   (carry .xdist)
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="base fwdab bwdab decab chains bwdprof fncu bncu fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab power probe ptests race smoke xncu fp32"
export PYTEST_XDIST="-n 4 --dist loadfile"
export SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py tests/test_decode_kernel.py"
bash scripts/gpu_job.sh || exit 1
echo "=== $(date -Is) sweep bf16 (pages 16, 64, 256)"
timeout 600 python3 benchmarks/bench_decode.py --page-sizes 16,64,256 --out "$O/sweep_bf16" > "$O/sweep_bf16.txt" 2>&1
grep -A12 "Summary vs" "$O/sweep_bf16.txt"
echo "=== $(date -Is) sweep fp16 (decode)"
timeout 400 python3 benchmarks/bench_decode.py --dtype fp16 --parts decode --page-sizes 16,64,256 \
    --out "$O/sweep_fp16" > "$O/sweep_fp16.txt" 2>&1
grep -A8 "Summary vs" "$O/sweep_fp16.txt"
echo "=== $(date -Is) eager b1"
timeout 200 python3 benchmarks/bench_decode.py --no-graphs --parts decode --batches 1 --cache-lens 1k,8k \
    --page-sizes 16,64,256 --out "$O/sweep_eager" > "$O/sweep_eager.txt" 2>&1
grep -A3 "Summary vs" "$O/sweep_eager.txt"
XNCU="bwd:ours:128:2048:0:4:fp32:ieee" XNCU_SOURCE=1 \
    SKIP="base check suite fwdab bwdab decab chains bwdprof fncu bncu fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab power probe ptests race smoke" \
    bash scripts/gpu_job.sh
echo "=== $(date -Is) done"
