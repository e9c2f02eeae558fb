#!/usr/bin/env bash
# Twenty-third session, run 4: a bulk L2 prefetch of each decode tile's whole address span.
#   Run 3: whole-line copies without the L2::256B hint lost 3-4 % against the same with it,
#   so the DRAM side gains from fetches larger than a line. Probe
#   -DFLASHATTN2_PROBE_DECODE_SPAN_PREFETCH (decode_kernel.cuh, dense caches): lane 0 of
#   each warp prefetches the next tile's 16-row span of K and V with cp.async.bulk.prefetch.L2
#   (bshd: 30 KiB covering every KV head's rows, which the other heads' CTAs read about then;
#   bhsd: 4 KiB, the head's own rows only).
#   - builds: this tree (d128) and the probe (d128); ptests test_decode_kernel + test_kvcache
#     on the probe;
#   - envab (bench_decode.py --bhsd, b1 / 16 / 64 x 1k / 8k / 32k, sq 1, SDPA-cuDNN and the
#     floor in each): plain vs probe, interleaved twice.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s23run4.sh   (then `wait`)
set -u
export SKIP="suite smoke base fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest power"
export HEAD_DIMS="128" PROBE_HEAD_DIMS="128" PROBE_AB=0
export PROBE_FLAGS="-DFLASHATTN2_PROBE_DECODE_SPAN_PREFETCH"
export PROBE_TESTS="tests/test_decode_kernel.py tests/test_kvcache.py"
export ENVAB_1="plain= span=PYTHONPATH:/tmp/probe"
export ENVAB_1_SCRIPT=benchmarks/bench_decode.py
export ENVAB_1_ARGS="--bhsd --batches 1,16,64 --cache-lens 1k,8k,32k --sq 1 --page-sizes= --impls flashattn2,sdpa_cudnn,read_floor --parts decode --no-summary"
bash scripts/gpu_job.sh
