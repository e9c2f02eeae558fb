#!/usr/bin/env bash
# Twenty-fourth session, run 1: decode loop unrolled by two with two page arrays, each read two
# steps after its load (jobs/s24_decode_page_lead2.patch applied, uncommitted) against HEAD 3a6c1c0.
# Before starting: `rm -rf .base && mkdir .base && git archive HEAD cpp python | tar -x -C .base`
# (carry [".base", ".xdist"]).
#   - builds: this tree (default, every head dim: the suite's) and the base (d128);
#   - smoke test_decode_kernel + test_kvcache (stop on a failure);
#   - envab (bench_decode.py, b1 / 4 / 16 / 64 x 1k / 8k / 32k, sq 1, contiguous and pages 16 /
#     64 / 256 shuffled, the floor in each): base vs new, interleaved twice;
#   - only on a win (geomean >= 1.003, no group under 0.985): the suite, FORCE_SM80,
#     sanitizers.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s24run1.sh   (then `wait`)
set -u
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests probe power"
export BASE_HEAD_DIMS="128"
export SMOKE_TESTS="tests/test_decode_kernel.py tests/test_kvcache.py" SMOKE_STOP=1 SMOKE_TIMEOUT=300
export ENVAB_1="base=PYTHONPATH:/tmp/base new="
export ENVAB_1_SCRIPT=benchmarks/bench_decode.py
export ENVAB_1_ARGS="--batches 1,4,16,64 --cache-lens 1k,8k,32k --sq 1 --page-sizes 16,64,256 --impls flashattn2,read_floor --parts decode --no-summary"
bash scripts/gpu_job.sh || exit 1
AB_GROUP=1 WIN_GEOMEAN=1.003 WIN_MIN=0.985 bash scripts/suite_if_win.sh
