#!/usr/bin/env bash
# Prepared in the thirty-third session (its device time ran out; not run): a ~170 s probe on
# the tree with jobs/s33_decode_small_ctas.patch and jobs/s33_decode_fused_merge.patch applied, a d128 90a
# build; the fused merge's GPU test; jobs/s34_fused_probe.py (fused vs combine, same build).
#   git apply jobs/s33_decode_small_ctas.patch jobs/s33_decode_fused_merge.patch; bash jobs/s34_fused_probe.sh
set -u
O=${OUT:-gpu_logs}
mkdir -p "$O"
python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/w . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" -C build-dir=/tmp/b > "$O/build.txt" 2>&1 \
    && python3 -m zipfile -e /tmp/w/*.whl /tmp/m || { tail -20 "$O/build.txt"; exit 1; }
echo "=== $(date -Is) built"
PYTHONPATH=/tmp/m timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_decode_kernel.py \
    -k "split_counters or splits or grid_of_several or every_row" 2>&1 | tail -n 3
PYTHONPATH=/tmp/m timeout 100 python3 jobs/s34_fused_probe.py "$O" 2>&1 | tail -n 40
