#!/usr/bin/env bash
# Thirty-third session, run 4. Run 3: d64 at b64 reads 76-81 % of the floor (0.77-0.84x cuDNN):
# 512 CTAs, 3 an SM, are 1.29 waves, the last 116 CTAs at 48 KiB in flight an SM. This tree
# launches the decode kernel with padded shared memory where a grid overruns the SMs and fewer
# CTAs an SM keep more bytes in flight through the last wave (flash_api_splits.cpp
# decode_launch_smem: d64 b64 -> 2 an SM, 1.94 waves); raise_smem_limit raises a kernel's limit
# whenever a launch needs more. base = .base (HEAD 6437ace).
# Builds: main (this tree, every head dim: the suite runs on it) and base (HEAD, d64 / d128).
# Smoke: the decode and KV-cache tests. A/B (group 6, d64; group 7, d128 b48 / b64: should not
# move): contiguous and paged 256, sq 1 / 4, 1k-32k, 2 rounds. Then issue 20's
# default sweep on main (d128), then the suite if group 6's geomean of new / base >= 1.003 with
# every (layout, batch, sq) >= 0.985.
#   WAIT=575 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s33run4.sh   (carry .base, .xdist)
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power probe"
export SMOKE_TESTS="tests/test_decode_kernel.py tests/test_kvcache.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="6 7" ENVAB_6="base=PYTHONPATH:/tmp/base new=" ENVAB_7="base=PYTHONPATH:/tmp/base new="
export ENVAB_6_SCRIPT=benchmarks/bench_decode.py ENVAB_7_SCRIPT=benchmarks/bench_decode.py
export ENVAB_6_ARGS="--no-summary --parts decode --headdim 64 --sq 1,4 --page-sizes 256 --cache-lens 1k,8k,32k --impls flashattn2,sdpa_cudnn,read_floor --batches 16,32,48,64"
export ENVAB_7_ARGS="--no-summary --parts decode --headdim 128 --sq 1 --page-sizes 256 --cache-lens 1k,8k,32k --impls flashattn2,sdpa_cudnn,read_floor --batches 48,64"
bash scripts/gpu_job.sh || exit 1
python3 scripts/ab_compare.py "$O" --group 7 --specs base,new > "$O/ab7.txt" 2>&1
sed -n '/^geomean/,$p' "$O/ab7.txt"
echo "=== $(date -Is) issue 20 sweep"
python3 benchmarks/bench_decode.py --out "$O/sweep" > "$O/sweep.txt" 2>&1
sed -n '/^Summary/,$p' "$O/sweep.txt"
if WIN_MIN=0.985 AB_GROUP=6 WIN_GEOMEAN=1.003 bash scripts/suite_if_win.sh; then :; fi
echo "=== $(date -Is) done"
