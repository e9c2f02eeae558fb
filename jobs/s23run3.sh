#!/usr/bin/env bash
# Twenty-third session, run 3: the decode kernel's K/V copies as whole L2 lines. Before
# starting: `rm -rf .base && mkdir .base && git archive 4c2c42b cpp python | tar -x -C .base`
# (carry [".base", ".xdist"]).
#   Hypothesis: each warp-wide cp.async of the decode kernel covered 8 rows x 64 bytes (8
#   half lines; ncu: 4x the L2 requests the DRAM bytes need, L2 hit rate 45 % against
#   cuDNN's 1.5 %, Mem Busy 61 vs 53 %), the one measured difference to cuDNN left at large
#   batch (run 2: not the (b, s, h_k, d) read pattern). Now 4 rows x 128 bytes (DecodeRows),
#   conflict-free 8-lane phases, 4 row slots instead of 2.
#   - builds: this tree and 4c2c42b (d64, d128); smoke test_decode_kernel + test_kvcache (stop
#     on a failure);
#   - envab (bench_decode.py, b1 / 16 / 64 x 1k / 8k / 32k, sq 1 and 4, contiguous and paged 256,
#     SDPA-cuDNN and the floor in each): base, new, and new without the L2::256B prefetch hint
#     (whole lines may make it unneeded), interleaved twice.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s23run3.sh   (then `wait`)
set -u
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests probe power"
export HEAD_DIMS="64;128" BASE_HEAD_DIMS="64;128"
export SMOKE_TESTS="tests/test_decode_kernel.py tests/test_kvcache.py" SMOKE_STOP=1 SMOKE_TIMEOUT=300
export ENVAB_1="base=PYTHONPATH:/tmp/base new= nopf=FLASHATTN2_DECODE_L2_PREFETCH:0"
export ENVAB_1_SCRIPT=benchmarks/bench_decode.py
export ENVAB_1_ARGS="--batches 1,16,64 --cache-lens 1k,8k,32k --sq 1,4 --page-sizes 256 --impls flashattn2,sdpa_cudnn,read_floor --parts decode --no-summary"
bash scripts/gpu_job.sh
