#!/usr/bin/env bash
# Prepared in the thirty-third session (its device time ran out after measuring the patch), for
# the next one: land jobs/s33_decode_small_ctas.patch (2-warp decode CTAs where they make one
# wave and 4-warp ones do not; run 5: d128 b48 +8-15 %, b64 1k +3 %, b64 8k / 32k 0 to -1.3 %).
#   rm -rf .base && mkdir .base && git archive HEAD cpp python | tar -x -C .base
#   git apply jobs/s33_decode_small_ctas.patch && git commit -am "..."
#   WAIT=575 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s34run1.sh   (carry .base, .xdist)
# Builds: main (this tree, every head dim: the suite runs on it) and base (.base, d64 / d128).
# Smoke: the decode and KV-cache tests. A/B: group 6 d128 b32 / 48 / 64 / 96 (b96: 768 CTAs,
# past one wave of 2-warp CTAs: unchanged), group 7 d64 b48 / 64 / 96; contiguous and paged 256,
# sq 1 / 4, 1k-32k, 2 rounds. Then the suite if group 6's geomean >= 1.003, each >= 0.985.
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power probe"
export SMOKE_TESTS="tests/test_decode_kernel.py tests/test_kvcache.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="6 7" ENVAB_6="base=PYTHONPATH:/tmp/base new=" ENVAB_7="base=PYTHONPATH:/tmp/base new="
export ENVAB_6_SCRIPT=benchmarks/bench_decode.py ENVAB_7_SCRIPT=benchmarks/bench_decode.py
export ENVAB_6_ARGS="--no-summary --parts decode --headdim 128 --sq 1,4 --page-sizes 256 --cache-lens 1k,8k,32k --impls flashattn2,sdpa_cudnn,read_floor --batches 32,48,64,96"
export ENVAB_7_ARGS="--no-summary --parts decode --headdim 64 --sq 1,4 --page-sizes 256 --cache-lens 1k,8k,32k --impls flashattn2,sdpa_cudnn,read_floor --batches 48,64,96"
bash scripts/gpu_job.sh || exit 1
python3 scripts/ab_compare.py "$O" --group 7 --specs base,new > "$O/ab7.txt" 2>&1
sed -n '/^geomean/,$p' "$O/ab7.txt"
if WIN_MIN=0.985 AB_GROUP=6 WIN_GEOMEAN=1.003 bash scripts/suite_if_win.sh; then :; fi
echo "=== $(date -Is) done"
