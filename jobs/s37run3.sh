#!/usr/bin/env bash
# Thirty-seventh session, run 3 (landing, ~1000 s, two calls; .base = 1cc46f3, the decode
# kernel with 4 Q K^T chains and the two copy paths written out). This tree: the review's
# tidy (jobs/s37_decode_tidy.patch: Q K^T back on warp_gemm_areg, one `issue` lambda for both
# copy paths) and bench_decode --dtype.
# Builds: main (every head dim: the suite runs on it), base (.base, d128). Smoke: the decode
# and KV-cache tests. A/B group 6 (2 rounds): d128 decode base / new. The suite if group 6's
# geomean >= 0.995 and each group >= 0.985 (a tidy: neutral is enough). Then issue 20's sweep on
# the main build: bf16 full default (pages 16, 64, 256), fp16 decode (sq 1 and 4, pages 16,
# 64, 256), eager (no graphs) b1 1k / 8k; and PC sampling of b1 8k / 1k without ncu's cache
# flush (--cache-control none: is run 1's cold prologue an artefact of the flush?).
#   rm -rf .base && mkdir .base && git archive 1cc46f3 cpp python | tar -x -C .base
#   WAIT=570 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s37run3.sh   (carry .base, .xdist)
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power probe ptests"
export SMOKE_TESTS="tests/test_decode_kernel.py tests/test_kvcache.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="128"
export ENVAB_GROUPS="6"
D="--no-summary --parts decode --sq 1 --page-sizes 256 --cache-lens 1k,8k,32k --batches 1,4,16,64 --warmup 5 --rep 30"
export ENVAB_6="base=PYTHONPATH:/tmp/base new="
export ENVAB_6_SCRIPT=benchmarks/bench_decode.py ENVAB_6_ARGS="$D --headdim 128 --impls flashattn2,sdpa_cudnn,read_floor"
bash scripts/gpu_job.sh || exit 1
if WIN_MIN=0.985 AB_GROUP=6 WIN_GEOMEAN=0.995 bash scripts/suite_if_win.sh; then :; fi
echo "=== $(date -Is) sweep bf16 (pages 16, 64, 256)"
timeout 600 python3 benchmarks/bench_decode.py --page-sizes 16,64,256 --out "$O/sweep_bf16" > "$O/sweep_bf16.txt" 2>&1
tail -n 30 "$O/sweep_bf16.txt"
echo "=== $(date -Is) sweep fp16 (decode)"
timeout 400 python3 benchmarks/bench_decode.py --dtype fp16 --parts decode --page-sizes 16,64,256 \
    --out "$O/sweep_fp16" > "$O/sweep_fp16.txt" 2>&1
tail -n 22 "$O/sweep_fp16.txt"
echo "=== $(date -Is) eager b1"
timeout 200 python3 benchmarks/bench_decode.py --no-graphs --parts decode --batches 1 --cache-lens 1k,8k \
    --page-sizes 16,64,256 --out "$O/sweep_eager" > "$O/sweep_eager.txt" 2>&1
tail -n 16 "$O/sweep_eager.txt"
echo "=== $(date -Is) PC sampling without the cache flush"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
for cfg in "1 8192" "1 1024"; do
    tag=${cfg// /_}
    timeout 120 "$NCU" --profile-from-start off --clock-control none --cache-control none \
        -k regex:decode_kernel --section SourceCounters --section WarpStateStats --import-source no \
        -f -o "$O/nf_$tag" python3 jobs/s34_ncu_decode.py ours $cfg > "$O/nf_ncu_$tag.txt" 2>&1
    "$NCU" -i "$O/nf_$tag.ncu-rep" --page source --csv --print-source sass > "$O/nf_sass_$tag.csv" 2>&1
    "$NCU" -i "$O/nf_$tag.ncu-rep" --page details --csv > "$O/nf_details_$tag.csv" 2>&1
    rm -f "$O/nf_$tag.ncu-rep"
    grep -E '"Duration"' "$O/nf_details_$tag.csv" | head -n 2
done
echo "=== $(date -Is) done"
