#!/usr/bin/env bash
# Twenty-third session, run 6: the decode kernel walking its keys in ascending order.
#   Every warp walks its tiles from the top of its range down (warp w: n_max - 1 - w - 4 j, so
#   the masked last tile comes first, as FA2's kernels do): every CTA reads addresses in
#   descending order. cuDNN's kernel (97.5-98.8 % of the read floor at large batch, ours
#   95.5-97 %) and the read floor read ascending. Probe -DFLASHATTN2_PROBE_DECODE_ASCENDING:
#   warp w takes n_min + w + 4 j (the masked tile, if any, last; the online softmax does not
#   depend on the order).
#   - builds: this tree (d128) and the probe (d128); ptests test_decode_kernel + test_kvcache
#     on the probe;
#   - envab (bench_decode.py, b1 / 16 / 64 x 1k / 8k / 32k, sq 1, contiguous and paged 256,
#     SDPA-cuDNN and the floor in each): plain vs probe, interleaved twice.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s23run6.sh   (then `wait`)
set -u
export SKIP="suite smoke base fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power"
export HEAD_DIMS="128" PROBE_HEAD_DIMS="128" PROBE_AB=0
export PROBE_FLAGS="-DFLASHATTN2_PROBE_DECODE_ASCENDING"
export PROBE_TESTS="tests/test_decode_kernel.py tests/test_kvcache.py"
export ENVAB_1="plain= asc=PYTHONPATH:/tmp/probe"
export ENVAB_1_SCRIPT=benchmarks/bench_decode.py
export ENVAB_1_ARGS="--batches 1,16,64 --cache-lens 1k,8k,32k --sq 1 --page-sizes 256 --impls flashattn2,sdpa_cudnn,read_floor --parts decode --no-summary"
bash scripts/gpu_job.sh
