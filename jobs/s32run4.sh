#!/usr/bin/env bash
# Prepared in the thirty-second session (its device time ran out), for the next one's first
# device call (~230 s): `bash jobs/s32run4.sh`.
# 1. test_decode_kernel.py + test_kvcache.py on a d64 / d128 90a build of this tree, among them
#    test_long_paged_cache_in_one_split (new, not yet run on a GPU): one split over 5119 keys
#    in shuffled 16-key pages, so each warp's block-table entries come in three batches of
#    32 steps (a1e5991's mechanism; the suite that passed on a1e5991 had no paged case with
#    more than 32 steps a warp, the benchmark's long paged runs are not checked).
# 2. issue 20's default decode sweep (bench_decode.py, no flags but --out): with 64k / 128k,
#    SDPA-flash, paged 16 / 64 / 256 and the host time.
set -u
O=${OUT:-gpu_logs}
mkdir -p "$O"
python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/w . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=64;128" -C build-dir=/tmp/b > "$O/build.txt" 2>&1 \
    && python3 -m zipfile -e /tmp/w/*.whl /tmp/m || { tail -20 "$O/build.txt"; exit 1; }
echo "=== $(date -Is) built"
PYTHONPATH=/tmp/m timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_decode_kernel.py \
    tests/test_kvcache.py > "$O/tests.txt" 2>&1
grep -E "FAILED|passed|failed" "$O/tests.txt" | tail -n 12
PYTHONPATH=/tmp/m python3 benchmarks/bench_decode.py --out "$O/sweep" 2>&1 | tail -n 60
