#!/usr/bin/env bash
# Thirty-second session, run 3. Run 2: with 16-key pages at b16 the decode kernel waits on its
# block-table entries (read one step before a tile's copies, from DRAM under the copies' load):
# two steps ahead gave paged 16 b16 +5-9 % (8k: 141.1 -> 132.5 us shuffled, 128.4 sequential,
# contiguous 127.2), but the loop unrolled by 2 cost b1 / b4 2-5 %. This tree: each lane reads
# the 2 entries (a 16-key tile's first and last rows: at most 2 pages) of one of the next 32
# steps' tiles, 32 steps before, and a step shuffles its tile's from that lane; no unroll
# (187-190 / 222-224 registers at d128, no spills). base = .base (HEAD).
# Builds: main (this tree, every head dim: the suite runs on it) and base (HEAD, d64 / d128).
# Smoke: the decode and KV-cache tests. A/B (group 6): bench_decode.py contiguous and paged
# 16 / 64 / 256, sq 1 and 4, b 1-64, 1k-32k, d128, base / new interleaved twice. The suite if
# every (layout, batch, query tokens) geomean of new / base >= 0.985 and theirs >= 1.001.
#   WAIT=575 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s32run3.sh   (carry .base, .xdist)
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power probe"
export SMOKE_TESTS="tests/test_decode_kernel.py tests/test_kvcache.py"
export SMOKE_STOP=1 SMOKE_TIMEOUT=300 BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="6" ENVAB_6="base=PYTHONPATH:/tmp/base new="
export ENVAB_6_SCRIPT=benchmarks/bench_decode.py
export ENVAB_6_ARGS="--no-summary --parts decode --sq 1,4 --page-sizes 16,64,256 --cache-lens 1k,8k,32k --impls flashattn2,sdpa_cudnn,read_floor --batches 1,4,16,64"
bash scripts/gpu_job.sh || exit 1
if WIN_MIN=0.985 AB_GROUP=6 WIN_GEOMEAN=1.001 bash scripts/suite_if_win.sh; then :; fi
echo "=== $(date -Is) done"
